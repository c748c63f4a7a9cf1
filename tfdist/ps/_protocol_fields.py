"""The parameter-server protocol's limits, errors and field readers (one part of :mod:`tfdist.ps.protocol`).

Every range a request's field must fit (:data:`MAX_WORKER_ID`, :data:`MAX_COUNT`,
...), :class:`RequestError`/:class:`ProtocolError`, and the readers that
parse a request's ``meta`` field by field (:class:`_Fields`) and check keys,
variable and table specs and the policy spec. Import the names from
:mod:`tfdist.ps.protocol`, which re-exports them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from tfdist.errors import PSRejectedError
from tfdist.ps.placement import VariableSpec
from tfdist.ps.sparse import TableSpec
from tfdist.wire import ALLOWED_DTYPES

#: gRPC service name of a parameter-server task.
SERVICE = "tfdist.ParameterServer"

#: Largest worker id (ids are ``0 .. num_workers - 1``; -1 is an evaluator's read-only id).
MAX_WORKER_ID = 2**31 - 1
#: Most workers a job may have (``Init``'s ``num_workers``): a real job's range, so no request can
#: make a PS count millions of phantom workers.
MAX_WORKERS = 2**16
#: Most local steps one ``Push`` may sum (``steps``): counters stay far from the range of exact integers.
MAX_STEPS_PER_PUSH = 10**7
#: Largest loss a push may report (any finite float; an integer beyond it is refused, not an OverflowError).
MAX_LOSS = 1.7976931348623157e308
#: Largest clock, step, version or count a request may carry (exact in a float64 and in JSON).
MAX_COUNT = 2**53
#: Longest variable key.
MAX_KEY_CHARS = 512
#: Tables one ``Lookup`` may read at the same rows (``also``).
MAX_LOOKUP_TABLES = 64
#: Most variables (or worker ids) one request may name.
MAX_ITEMS = 1_000_000
#: Longest wait a request may ask for, in seconds (the server bounds it further).
MAX_WAIT_S = 24 * 3600.0

#: ``"refuse"``: a push or initial value with NaN/Inf is refused (default); ``"allow"``: stored as sent.
NONFINITE_POLICIES = ("refuse", "allow")


class RequestError(PSRejectedError):
    """A request a parameter server refuses; nothing was changed.

    ``grpc_code`` names the gRPC status the server answers with.
    """

    grpc_code = "INVALID_ARGUMENT"

    def __init__(self, message: str, grpc_code: str | None = None):
        super().__init__(message)
        if grpc_code:
            self.grpc_code = grpc_code


class ProtocolError(RequestError):
    """A malformed request: a field of the wrong type or range, unknown or missing."""


def short(value: Any, limit: int = 80) -> str:
    """``repr(value)`` cut to ``limit`` characters: error messages never echo a whole request."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


# ------------------------------------------------------------------ field readers
_MISSING = object()


class _Fields:
    """Reads a request's ``meta``; every field read is remembered so unknown ones can be refused."""

    def __init__(self, method: str, meta: Any):
        if not isinstance(meta, dict):
            raise ProtocolError(f"{method}: the request's meta must be an object. Received: {short(meta)}.")
        self.method = method
        self.meta = meta
        self.read: set[str] = set()

    def _fail(self, name: str, value: Any, want: str) -> ProtocolError:
        return ProtocolError(f"{self.method}: field `{name}` must be {want}. Received: {name}={short(value)}.")

    def get(self, name: str, default: Any = _MISSING) -> Any:
        self.read.add(name)
        if name not in self.meta:
            if default is _MISSING:
                raise ProtocolError(f"{self.method}: required field `{name}` is missing.")
            return default
        return self.meta[name]

    def int(self, name: str, low: int, high: int, default: Any = _MISSING) -> Any:
        value = self.get(name, default)
        if value is None and default is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise self._fail(name, value, f"an integer in [{low}, {high}]")
        return value

    def number(self, name: str, low: float, high: float, default: Any = _MISSING) -> Any:
        value = self.get(name, default)
        if value is None and default is None:
            return None
        # Range first: an integer too large for a float (10**400) is refused, not an OverflowError.
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high \
                or not math.isfinite(value):
            raise self._fail(name, value, f"a finite number in [{low:g}, {high:g}]")
        return float(value)

    def flag(self, name: str, default: bool) -> bool:
        value = self.get(name, default)
        if not isinstance(value, bool):
            raise self._fail(name, value, "true or false")
        return value

    def choice(self, name: str, options: tuple[str, ...], default: str) -> str:
        value = self.get(name, default)
        if not isinstance(value, str) or value not in options:
            raise self._fail(name, value, f"one of {list(options)}")
        return value

    def worker(self, name: str = "worker", allow_reader: bool = False, default: Any = _MISSING) -> Any:
        low = -1 if allow_reader else 0
        return self.int(name, low, MAX_WORKER_ID, default)

    def workers(self, name: str, default: Any = None) -> frozenset[int] | None:
        value = self.get(name, default)
        if value is None and default is None:
            return None
        if not isinstance(value, list) or len(value) > MAX_ITEMS:
            raise self._fail(name, value, "a list of worker ids")
        for w in value:
            if isinstance(w, bool) or not isinstance(w, int) or not 0 <= w <= MAX_WORKER_ID:
                raise self._fail(name, value, f"a list of worker ids (integers in [0, {MAX_WORKER_ID}])")
        return frozenset(value)

    def keys(self, name: str = "keys") -> tuple[str, ...] | None:
        value = self.get(name, None)
        if value is None:
            return None
        if not isinstance(value, list) or len(value) > MAX_ITEMS:
            raise self._fail(name, value, "a list of variable keys")
        for k in value:
            _check_key(self.method, k)
        if len(set(value)) != len(value):
            dup = sorted({k for k in value if value.count(k) > 1})[:4]
            raise ProtocolError(f"{self.method}: `{name}` names a variable twice: {short(dup)}. Name each once.")
        return tuple(value)

    def policy(self, num_workers: int | None) -> dict | None:
        spec = self.get("policy", None)
        if spec is None:
            return None
        return check_policy_spec(self.method, spec, num_workers)

    def specs(self, name: str = "specs", default: Any = _MISSING) -> tuple[VariableSpec, ...] | None:
        value = self.get(name, default)
        if value is None and default is None:
            return None
        if not isinstance(value, list) or len(value) > MAX_ITEMS:
            raise self._fail(name, value, "a list of variable specs")
        specs = tuple(_spec(self.method, d) for d in value)
        keys = [s.key for s in specs]
        if len(set(keys)) != len(keys):
            dup = sorted({k for k in keys if keys.count(k) > 1})[:4]
            raise ProtocolError(f"{self.method}: duplicate variable keys in `{name}`: {short(dup)}.")
        return specs

    def tables(self, name: str = "tables") -> tuple[TableShard, ...]:
        value = self.get(name, [])
        if not isinstance(value, list) or len(value) > MAX_ITEMS:
            raise self._fail(name, value, "a list of table specs")
        shards = tuple(_table_shard(self.method, d) for d in value)
        keys = [t.spec.key for t in shards]
        if len(set(keys)) != len(keys):
            raise ProtocolError(f"{self.method}: a table is named twice in `{name}`: {short(sorted(keys))}.")
        return shards

    def finish(self) -> None:
        unknown = sorted(set(self.meta) - self.read)
        if unknown:
            raise ProtocolError(
                f"{self.method}: unknown field(s) {short(unknown)}. Are client and server the same tfdist version?"
            )


@dataclass(frozen=True)
class TableShard:
    """A PS-resident table (:class:`~tfdist.ps.sparse.TableSpec`) and which of its mod shards this task holds."""

    spec: TableSpec
    shard: int
    num_shards: int

    def to_dict(self) -> dict[str, Any]:
        return {**self.spec.to_dict(), "shard": self.shard, "num_shards": self.num_shards}


_TABLE_FIELDS = {"key", "rows", "dim", "dtype", "initializer", "optimizer", "seed", "shard", "num_shards", "dynamic"}


def _table_shard(method: str, d: Any) -> TableShard:
    if not isinstance(d, dict) or set(d) - _TABLE_FIELDS or not {"key", "rows", "dim", "shard", "num_shards"} <= set(d):
        raise ProtocolError(f"{method}: a table spec is an object with fields {sorted(_TABLE_FIELDS)} (key, rows, dim, "
                            f"shard and num_shards required). Received: {short(d)}.")
    _check_key(method, d["key"])
    for name in ("shard", "num_shards", "seed"):
        v = d.get(name, 0)
        if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= MAX_COUNT:
            raise ProtocolError(f"{method}: table {short(d['key'])}: `{name}` must be an integer >= 0. "
                                f"Received: {short(v)}.")
    if not 0 <= d["shard"] < d["num_shards"]:
        raise ProtocolError(f"{method}: table {short(d['key'])}: shard {d['shard']} is not one of "
                            f"{d['num_shards']} shards.")
    if isinstance(d["rows"], int) and not isinstance(d["rows"], bool) and d["rows"] > MAX_COUNT:
        raise ProtocolError(f"{method}: table {short(d['key'])}: too many rows ({short(d['rows'])}).")
    if isinstance(d["dim"], int) and not isinstance(d["dim"], bool) and d["dim"] > MAX_COUNT:
        raise ProtocolError(f"{method}: table {short(d['key'])}: too wide a row (dim {short(d['dim'])}).")
    try:
        spec = TableSpec.from_dict(d)
    except (ValueError, TypeError, OverflowError) as e:
        raise ProtocolError(f"{method}: {short(str(e), 300)}") from None
    return TableShard(spec, d["shard"], d["num_shards"])


def _row_ids(method: str, tensors: Mapping[str, np.ndarray], name: str = "rows") -> np.ndarray:
    rows = tensors.get(name)
    if rows is None or rows.dtype != np.int64 or rows.ndim != 1:
        raise ProtocolError(f"{method}: tensor `{name}` must be a 1-D int64 array of row indices. Received: "
                            f"{None if rows is None else f'{rows.dtype.name}{list(rows.shape)}'}.")
    return rows


def _also_tables(method: str, f: _Fields, key: str) -> tuple[str, ...]:
    """A row request's ``also``: more table keys, distinct and not ``key`` (at most MAX_LOOKUP_TABLES)."""
    also = f.get("also", [])
    if not isinstance(also, list) or len(also) > MAX_LOOKUP_TABLES:
        raise ProtocolError(f"{method}: `also` is a list of at most {MAX_LOOKUP_TABLES} table keys. "
                            f"Received: {short(also)}.")
    also = tuple(_check_key(method, k) for k in also)
    if len(set(also)) != len(also) or key in also:
        raise ProtocolError(f"{method}: a table is named twice (`key` {short(key)}, `also` {short(list(also))}).")
    return also


def _check_key(method: str, key: Any) -> str:
    if not isinstance(key, str) or not 0 < len(key) <= MAX_KEY_CHARS:
        raise ProtocolError(
            f"{method}: a variable key must be a string of 1 to {MAX_KEY_CHARS} characters. Received: {short(key)}."
        )
    return key


def _spec(method: str, d: Any) -> VariableSpec:
    if not isinstance(d, dict) or set(d) - {"key", "dtype", "shape", "trainable"}:
        raise ProtocolError(
            f"{method}: a variable spec is an object with key, dtype, shape and trainable. Received: {short(d)}."
        )
    key = _check_key(method, d.get("key"))
    dtype = d.get("dtype")
    if not isinstance(dtype, str) or dtype not in ALLOWED_DTYPES:
        raise ProtocolError(f"{method}: spec {short(key)} has dtype {short(dtype)}; allowed: {sorted(ALLOWED_DTYPES)}.")
    shape = d.get("shape")
    if not isinstance(shape, list) or len(shape) > 32 or any(
            isinstance(x, bool) or not isinstance(x, int) or not 0 <= x <= MAX_COUNT for x in shape):
        raise ProtocolError(f"{method}: spec {short(key)} has a bad shape {short(shape)} (non-negative integers).")
    if math.prod(shape) > MAX_COUNT:
        raise ProtocolError(f"{method}: spec {short(key)} has {math.prod(shape)} elements; too many.")
    trainable = d.get("trainable", True)
    if not isinstance(trainable, bool):
        raise ProtocolError(f"{method}: spec {short(key)} has trainable={short(trainable)}; expected true or false.")
    return VariableSpec(key, dtype, tuple(shape), trainable)


def check_policy_spec(method: str, spec: Any, num_workers: int | None) -> dict:
    """Validates a consistency-policy spec by building the policy (the one codec: ``policy_from_spec``)."""
    from tfdist.consistency import policy_from_spec
    from tfdist.errors import ConfigError

    if not isinstance(spec, dict):
        raise ProtocolError(f"{method}: `policy` must be an object. Received: policy={short(spec)}.")
    try:
        policy = policy_from_spec(spec, num_workers or 1)
    except (ConfigError, TypeError, ValueError, OverflowError) as e:
        raise ProtocolError(f"{method}: bad consistency policy {short(spec)}: {short(str(e), 300)}") from None
    if policy.spec() != {**policy.spec(), **spec}:
        extra = {k: v for k, v in spec.items() if policy.spec().get(k, _MISSING) != v}
        raise ProtocolError(
            f"{method}: consistency policy fields {short(extra)} are unknown or not in canonical form; "
            f"send policy.spec() ({short(policy.spec())})."
        )
    return policy.spec()


def _no_tensors(method: str, tensors: Mapping[str, np.ndarray]) -> None:
    if tensors:
        raise ProtocolError(f"{method} carries no tensors. Received {len(tensors)}: {short(sorted(tensors)[:4])}.")


def _tensor_keys(method: str, tensors: Mapping[str, np.ndarray]) -> Mapping[str, np.ndarray]:
    if len(tensors) > MAX_ITEMS:
        raise ProtocolError(f"{method}: {len(tensors)} tensors in one request; at most {MAX_ITEMS}.")
    for key in tensors:
        _check_key(method, key)
    return tensors


#: Suffix of the tensor holding a row-sparse delta's row indices (``Push``/``PushPull`` with ``sparse``).
ROWS_SUFFIX = "@rows"

#: Incarnations are random 48-bit numbers (one per start, reset or roll-back of a PS task).
MAX_INCARNATION = 2**48 - 1


def _with_incarnation(meta: dict[str, Any], incarnation: int | None) -> dict[str, Any]:
    if incarnation is not None:
        meta["incarnation"] = incarnation
    return meta
