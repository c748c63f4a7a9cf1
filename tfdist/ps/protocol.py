"""The parameter-server protocol: one typed request per RPC, parsed and validated whole.

:func:`parse` turns a decoded wire message (``meta``, ``tensors``; see
:mod:`tfdist.wire`) into one of the request dataclasses below, or raises
:class:`ProtocolError` (gRPC ``INVALID_ARGUMENT``). Everything that can be
checked without the store's state is checked here: field types and ranges
(booleans are not numbers, numbers are finite, ids and counters fit their
ranges), unknown or missing fields, tensors where none belong, duplicate
keys, variable specs and the consistency-policy spec. The store checks the
rest (known workers, known variables, dtypes and shapes, non-finite values,
the policy's verdict) before it changes anything, and applies each request
all-or-nothing (:mod:`tfdist.ps.store`).

Requests go the other way with :meth:`to_wire` (the client builds the same
dataclasses), so client and server share one definition of every message.
Replies are plain ``meta`` mappings whose fields each request documents.

Importing this module does not import TensorFlow or gRPC.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import numpy as np

from tfdist.errors import PSRejectedError
from tfdist.ps.placement import VariableSpec
from tfdist.ps.sparse import TableSpec
from tfdist.wire import ALLOWED_DTYPES

__all__ = [
    "SERVICE",
    "METHODS",
    "ProtocolError",
    "RequestError",
    "NONFINITE_POLICIES",
    "InitRequest",
    "WaitInitRequest",
    "PullRequest",
    "PushRequest",
    "PushPullRequest",
    "PushGradientsRequest",
    "PutStateRequest",
    "SetExcludedRequest",
    "HeartbeatRequest",
    "StatusRequest",
    "DoneRequest",
    "LeaveRequest",
    "ShutdownRequest",
    "ControlRequest",
    "CheckpointRequest",
    "RestoreRequest",
    "LookupRequest",
    "PushRowsRequest",
    "EpochLogsRequest",
    "RendezvousRequest",
    "TableShard",
    "method_of",
    "parse",
    "short",
]

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


_TABLE_FIELDS = {"key", "rows", "dim", "dtype", "initializer", "optimizer", "seed", "shard", "num_shards"}


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


def _also_tables(method: str, f: "_Fields", key: str) -> tuple[str, ...]:
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


# ------------------------------------------------------------------------ requests
@dataclass(frozen=True)
class InitRequest:
    """The chief stores its values, the consistency policy and the non-finite policy.

    Reply: ``initialized_here`` (False: the store already held values; specs
    and policy were checked), ``version``, ``global_step``, ``incarnation``.

    ``tables``: the PS-resident tables and the shard of each this task holds
    (it initialises their rows itself; see :mod:`tfdist.ps.sparse`).

    ``reset`` (the chief only, gradient path recovery without checkpoints):
    replace the values of an initialised store too, and restart its global
    step at ``step``; the store takes a new incarnation, so every worker
    re-syncs.
    """

    worker: int
    specs: tuple[VariableSpec, ...]
    values: Mapping[str, np.ndarray] = field(repr=False)
    policy: dict | None = None
    num_workers: int | None = None
    step: int = 0
    nonfinite: str = "refuse"
    reset: bool = False
    tables: tuple[TableShard, ...] = ()

    def to_wire(self):
        meta = {"worker": self.worker, "specs": [s.to_dict() for s in self.specs], "step": self.step,
                "nonfinite": self.nonfinite}
        if self.reset:
            meta["reset"] = True
        if self.tables:
            meta["tables"] = [t.to_dict() for t in self.tables]
        if self.policy is not None:
            meta["policy"] = self.policy
        if self.num_workers is not None:
            meta["num_workers"] = self.num_workers
        return meta, dict(self.values)

    @classmethod
    def parse(cls, f: _Fields, tensors):
        num_workers = f.int("num_workers", 1, MAX_WORKERS, None)
        specs = f.specs()
        keys = {s.key for s in specs}
        if keys != set(tensors):
            raise ProtocolError(
                f"Init: values do not match specs: missing {short(sorted(keys - set(tensors))[:4])}, "
                f"unexpected {short(sorted(set(tensors) - keys)[:4])}."
            )
        for s in specs:
            v = tensors[s.key]
            if v.dtype.name != s.dtype or tuple(v.shape) != s.shape:
                raise ProtocolError(
                    f"Init: value of {short(s.key)} is {v.dtype.name}{list(v.shape)}, its spec says "
                    f"{s.dtype}{list(s.shape)}."
                )
        return cls(f.worker(), specs, tensors, f.policy(num_workers), num_workers, f.int("step", 0, MAX_COUNT, 0),
                   f.choice("nonfinite", NONFINITE_POLICIES, "refuse"), f.flag("reset", False), f.tables())


@dataclass(frozen=True)
class WaitInitRequest:
    """A worker (or an evaluator, ``worker`` -1/None) waits, bounded, for the chief's Init.

    With ``specs``/``policy`` the store checks them against its own once
    initialised. Reply: ``initialized``, ``version``, ``global_step``.
    """

    worker: int | None = None
    timeout_s: float = 0.0
    specs: tuple[VariableSpec, ...] | None = None
    policy: dict | None = None
    num_workers: int | None = None

    def to_wire(self):
        meta: dict[str, Any] = {"timeout_s": self.timeout_s}
        for name in ("worker", "policy", "num_workers"):
            if getattr(self, name) is not None:
                meta[name] = getattr(self, name)
        if self.specs is not None:
            meta["specs"] = [s.to_dict() for s in self.specs]
        return meta, {}

    @classmethod
    def parse(cls, f: _Fields, tensors):
        _no_tensors("WaitInit", tensors)
        num_workers = f.int("num_workers", 1, MAX_WORKERS, None)
        worker = f.worker(allow_reader=True, default=None)
        return cls(None if worker == -1 else worker, f.number("timeout_s", 0.0, MAX_WAIT_S, 0.0),
                   f.specs(default=None), f.policy(num_workers), num_workers)


@dataclass(frozen=True)
class PullRequest:
    """Read values. ``worker`` -1 is a read-only client (evaluator).

    ``clock``: the clock the reader is about to start (SSP may make it wait);
    ``keys``: the variables wanted (``None``: all); ``min_state_step``
    (gradient path): wait for a state snapshot at least this recent.
    Reply meta: ``version``, ``state_step``, ``global_step``, clock fields, and
    the values as tensors.
    """

    worker: int
    clock: int = 0
    keys: tuple[str, ...] | None = None
    min_state_step: int | None = None

    def to_wire(self):
        meta: dict[str, Any] = {"worker": self.worker, "clock": self.clock}
        if self.keys is not None:
            meta["keys"] = list(self.keys)
        if self.min_state_step is not None:
            meta["min_state_step"] = self.min_state_step
        return meta, {}

    @classmethod
    def parse(cls, f: _Fields, tensors):
        _no_tensors("Pull", tensors)
        return cls(f.worker(allow_reader=True), f.int("clock", 0, MAX_COUNT, 0), f.keys(),
                   f.int("min_state_step", 0, MAX_COUNT, None))


@dataclass(frozen=True)
class PushRequest:
    """Add ``deltas`` (update path). ``clock``: the worker's completed steps with
    this push; ``steps``: local steps the deltas sum (``strategy.exchange_every``);
    ``sparse``: keys whose delta is row-sparse (tensor ``<key>`` holds the
    changed rows, ``<key>@rows`` their distinct int64 indices: an embedding
    sends the rows a step changed, not the whole table);
    ``loss``: the step's training loss (DTSSP); ``incarnation``: the PS task's
    incarnation the deltas were computed against (refused with ``UNAVAILABLE``
    when the task has another: it restarted, was reset or rolled back). Reply:
    ``applied``, ``dropped``, ``version``, ``previous_version``, clock and
    membership fields."""

    worker: int
    clock: int
    deltas: Mapping[str, np.ndarray] = field(repr=False)
    loss: float | None = None
    steps: int = 1
    incarnation: int | None = None
    #: Row-sparse deltas: variable key → the rows (int64, distinct) that ``deltas[key]`` holds, in order.
    rows: Mapping[str, np.ndarray] = field(default_factory=dict, repr=False)

    def _meta(self) -> dict[str, Any]:
        meta: dict[str, Any] = {"worker": self.worker, "clock": self.clock}
        if self.loss is not None:
            meta["loss"] = self.loss
        if self.steps != 1:
            meta["steps"] = self.steps
        if self.incarnation is not None:
            meta["incarnation"] = self.incarnation
        if self.rows:
            meta["sparse"] = sorted(self.rows)
        return meta

    def _tensors(self) -> dict[str, np.ndarray]:
        return {**self.deltas, **{k + ROWS_SUFFIX: r for k, r in self.rows.items()}}

    def to_wire(self):
        return self._meta(), self._tensors()

    @classmethod
    def parse(cls, f: _Fields, tensors):
        deltas = dict(_tensor_keys(f.method, tensors))
        sparse = f.keys("sparse") or ()
        rows = {}
        for key in sparse:
            r, values = deltas.pop(key + ROWS_SUFFIX, None), deltas.get(key)
            if r is None or values is None or r.dtype != np.int64 or r.ndim != 1 or values.ndim < 1 \
                    or values.shape[0] != r.shape[0]:
                raise ProtocolError(f"{f.method}: sparse delta {short(key)} needs tensors {short(key)} (one row per "
                                    f"index) and {short(key + ROWS_SUFFIX)} (1-D int64 row indices).")
            if r.size > 1 and np.unique(r).size != r.size:
                raise ProtocolError(f"{f.method}: sparse delta {short(key)} names a row twice.")
            rows[key] = r
        stray = [k for k in deltas if k.endswith(ROWS_SUFFIX)]
        if stray:
            raise ProtocolError(f"{f.method}: row indices {short(stray[:4])} without their key in `sparse`.")
        return cls(f.worker(), f.int("clock", 0, MAX_COUNT, 0), deltas,
                   f.number("loss", -MAX_LOSS, MAX_LOSS, None), f.int("steps", 1, MAX_STEPS_PER_PUSH, 1),
                   f.int("incarnation", 0, MAX_INCARNATION, None), rows)


@dataclass(frozen=True)
class PushPullRequest:
    """A push and a read of ``keys`` in one round trip (ASP, whose reads never wait).

    ``base_version``: the version the worker's snapshot holds; when the push
    landed right on it and nothing after it, the reply says ``unchanged``
    instead of carrying the values. Reply: the read's meta plus ``push``.
    """

    push: PushRequest
    keys: tuple[str, ...] | None = None
    base_version: int | None = None

    def to_wire(self):
        meta = self.push._meta()
        if self.keys is not None:
            meta["keys"] = list(self.keys)
        if self.base_version is not None:
            meta["base_version"] = self.base_version
        return meta, self.push._tensors()

    @classmethod
    def parse(cls, f: _Fields, tensors):
        return cls(PushRequest.parse(f, tensors), f.keys(), f.int("base_version", 0, MAX_COUNT, None))


@dataclass(frozen=True)
class PushGradientsRequest:
    """Contribute gradients to global step ``step`` (gradient path); blocks until the step completes.

    Reply: ``dropped``, ``resync``, ``global_step``, ``step``, ``write_state``,
    and the step's aggregate as tensors.
    """

    worker: int
    step: int
    grads: Mapping[str, np.ndarray] = field(repr=False)
    incarnation: int | None = None

    def to_wire(self):
        return _with_incarnation({"worker": self.worker, "step": self.step}, self.incarnation), dict(self.grads)

    @classmethod
    def parse(cls, f: _Fields, tensors):
        return cls(f.worker(), f.int("step", 0, MAX_COUNT), _tensor_keys(f.method, tensors),
                   f.int("incarnation", 0, MAX_INCARNATION, None))


@dataclass(frozen=True)
class PutStateRequest:
    """Replace the state snapshot with a worker's after ``step`` steps. Reply: ``stored``, ``state_step``."""

    worker: int
    step: int
    tensors: Mapping[str, np.ndarray] = field(repr=False)
    incarnation: int | None = None

    def to_wire(self):
        return _with_incarnation({"worker": self.worker, "step": self.step}, self.incarnation), dict(self.tensors)

    @classmethod
    def parse(cls, f: _Fields, tensors):
        return cls(f.worker(), f.int("step", 0, MAX_COUNT), _tensor_keys(f.method, tensors),
                   f.int("incarnation", 0, MAX_INCARNATION, None))


@dataclass(frozen=True)
class SetExcludedRequest:
    """Replace the set of detected stragglers barriers do not wait for. Reply: ``excluded``."""

    worker: int
    excluded: frozenset[int]

    def to_wire(self):
        return {"worker": self.worker, "excluded": sorted(self.excluded)}, {}

    @classmethod
    def parse(cls, f: _Fields, tensors):
        _no_tensors("SetExcluded", tensors)
        excluded = f.workers("excluded", _MISSING)
        return cls(f.worker(), excluded)


@dataclass(frozen=True)
class _WorkerRequest:
    """A request that carries only the sending worker's id."""

    worker: int

    def to_wire(self):
        return {"worker": self.worker}, {}

    @classmethod
    def parse(cls, f: _Fields, tensors):
        _no_tensors(f.method, tensors)
        return cls(f.worker())


@dataclass(frozen=True)
class HeartbeatRequest(_WorkerRequest):
    """A worker is alive. Reply: ``live_workers``."""


@dataclass(frozen=True)
class StatusRequest:
    """Counters, membership and policy; ``brief`` leaves out the per-variable specs."""

    brief: bool = False

    def to_wire(self):
        return ({"brief": True} if self.brief else {}), {}

    @classmethod
    def parse(cls, f: _Fields, tensors):
        _no_tensors("Status", tensors)
        return cls(f.flag("brief", False))


@dataclass(frozen=True)
class DoneRequest(_WorkerRequest):
    """A worker of the job has finished (it counts towards the PS task's exit). Reply: ``done_workers``."""


@dataclass(frozen=True)
class LeaveRequest(_WorkerRequest):
    """A worker stops taking part in barriers now (it may still read, and train again later).

    Unlike ``Done`` it does not count towards the PS task's exit. Reply:
    ``live_workers``.
    """


@dataclass(frozen=True)
class ShutdownRequest(_WorkerRequest):
    """A worker of the job asks the PS task to stop now. Reply: ``stopping``."""


@dataclass(frozen=True)
class CheckpointRequest:
    """A worker of the job asks for a checkpoint of this PS task's shard.

    Without ``at_step``: now (``strategy.checkpoint()``), answered once it is
    written; reply ``step``, ``path`` (``None`` for both when the task has no
    ``ps.checkpoint_dir``). With ``at_step`` (gradient path, the chief's
    time-based checkpoints): when the state snapshot reaches that step, so
    every task checkpoints the same step; reply ``scheduled`` (False when the
    task is already past it).
    """

    worker: int
    at_step: int | None = None

    def to_wire(self):
        meta: dict[str, Any] = {"worker": self.worker}
        if self.at_step is not None:
            meta["at_step"] = self.at_step
        return meta, {}

    @classmethod
    def parse(cls, f: _Fields, tensors):
        _no_tensors("Checkpoint", tensors)
        return cls(f.worker(), f.int("at_step", 0, MAX_COUNT, None))


@dataclass(frozen=True)
class LookupRequest:
    """Rows of a PS-resident table (this task's shard; ``rows`` are local row indices, int64).

    ``clock`` (update path): the step the worker is about to start, as for a
    ``Pull`` (SSP may make it wait). ``worker`` -1: an evaluator's read.
    ``also``: more tables read at the same rows in the same request (a wide
    and a deep table looked up by the same ids), distinct, not ``key``.
    Reply: ``version``; tensor ``values`` (one row per requested index, in
    order) and ``values.<i>`` for ``also[i - 1]``.
    """

    worker: int
    key: str
    rows: np.ndarray = field(repr=False)
    clock: int | None = None
    also: tuple[str, ...] = ()

    def to_wire(self):
        meta: dict[str, Any] = {"worker": self.worker, "key": self.key}
        if self.clock is not None:
            meta["clock"] = self.clock
        if self.also:
            meta["also"] = list(self.also)
        return meta, {"rows": self.rows}

    @classmethod
    def parse(cls, f: _Fields, tensors):
        if set(tensors) != {"rows"}:
            raise ProtocolError(f"Lookup: exactly one tensor, `rows`. Received: {short(sorted(tensors))}.")
        key = _check_key("Lookup", f.get("key"))
        also = _also_tables("Lookup", f, key)
        return cls(f.worker(allow_reader=True), key, _row_ids("Lookup", tensors),
                   f.int("clock", 0, MAX_COUNT, None), also)

    @staticmethod
    def values_name(i: int) -> str:
        """The reply tensor of the ``i``-th table read (0: ``key``; ``i``: ``also[i - 1]``)."""
        return "values" if i == 0 else f"values.{i}"


@dataclass(frozen=True)
class PushRowsRequest:
    """Row gradients of a PS-resident table (``rows`` local int64, ``grads`` one row each; repeats add up).

    Update path: applied at once with the table's optimizer. Gradient path:
    counted towards global step ``step`` (required) with this worker's dense
    gradient, and applied when that step completes. ``learning_rate``: the
    worker's optimizer's current value (schedules); ``None``: the table's.
    ``incarnation`` as for ``Push``. ``also``: more tables' gradients at the
    same rows (tensor ``grads.<i>`` for ``also[i - 1]``), all checked before
    any is applied. Reply: ``applied``, ``dropped``.
    """

    worker: int
    key: str
    rows: np.ndarray = field(repr=False)
    grads: np.ndarray = field(repr=False)
    learning_rate: float | None = None
    step: int | None = None
    incarnation: int | None = None
    also: tuple[str, ...] = ()
    also_grads: tuple[np.ndarray, ...] = field(default=(), repr=False)

    def to_wire(self):
        meta: dict[str, Any] = {"worker": self.worker, "key": self.key}
        for name in ("learning_rate", "step", "incarnation"):
            if getattr(self, name) is not None:
                meta[name] = getattr(self, name)
        tensors = {"rows": self.rows, "grads": self.grads}
        if self.also:
            meta["also"] = list(self.also)
            tensors.update({self.grads_name(i + 1): g for i, g in enumerate(self.also_grads)})
        return meta, tensors

    @staticmethod
    def grads_name(i: int) -> str:
        """The tensor of the ``i``-th table's gradients (0: ``key``; ``i``: ``also[i - 1]``)."""
        return "grads" if i == 0 else f"grads.{i}"

    def tables(self) -> list[tuple[str, np.ndarray]]:
        """(key, gradients) of every table the request names, ``key`` first."""
        return [(self.key, self.grads), *zip(self.also, self.also_grads)]

    @classmethod
    def parse(cls, f: _Fields, tensors):
        key = _check_key("PushRows", f.get("key"))
        also = _also_tables("PushRows", f, key)
        names = [cls.grads_name(i) for i in range(len(also) + 1)]
        if set(tensors) != {"rows", *names}:
            raise ProtocolError(f"PushRows: exactly the tensors `rows` and {', '.join(f'`{n}`' for n in names)}. "
                                f"Received: {short(sorted(tensors))}.")
        rows = _row_ids("PushRows", tensors)
        for name in names:
            grads = tensors[name]
            if grads.ndim != 2 or grads.shape[0] != rows.shape[0]:
                raise ProtocolError(f"PushRows: `{name}` must be 2-D with one row per index: {list(grads.shape)} "
                                    f"for {rows.shape[0]} rows.")
        return cls(f.worker(), key, rows, tensors["grads"],
                   f.number("learning_rate", 0.0, 1e6, None), f.int("step", 0, MAX_COUNT, None),
                   f.int("incarnation", 0, MAX_INCARNATION, None), also,
                   tuple(tensors[name] for name in names[1:]))


@dataclass(frozen=True)
class WriteRowsRequest:
    """Sets rows of a PS-resident table (``rows`` local int64, distinct; ``values`` one float32 row each).

    Loading weights into a table (``load_weights``, ``load_model`` under the
    strategy): the rows take the values, the optimizer's slots are kept.
    ``incarnation`` as for ``Push``. Reply: ``written`` (rows set).
    """

    worker: int
    key: str
    rows: np.ndarray = field(repr=False)
    values: np.ndarray = field(repr=False)
    incarnation: int | None = None

    def to_wire(self):
        meta: dict[str, Any] = {"worker": self.worker, "key": self.key}
        if self.incarnation is not None:
            meta["incarnation"] = self.incarnation
        return meta, {"rows": self.rows, "values": self.values}

    @classmethod
    def parse(cls, f: _Fields, tensors):
        if set(tensors) != {"rows", "values"}:
            raise ProtocolError(f"WriteRows: exactly two tensors, `rows` and `values`. Received: "
                                f"{short(sorted(tensors))}.")
        rows, values = _row_ids("WriteRows", tensors), tensors["values"]
        if values.ndim != 2 or values.shape[0] != rows.shape[0]:
            raise ProtocolError(f"WriteRows: `values` must be 2-D with one row per index: {list(values.shape)} for "
                                f"{rows.shape[0]} rows.")
        if len(np.unique(rows)) != len(rows):
            raise ProtocolError("WriteRows: a row is named twice (which value would it keep?).")
        return cls(f.worker(), _check_key("WriteRows", f.get("key")), rows, values,
                   f.int("incarnation", 0, MAX_INCARNATION, None))


@dataclass(frozen=True)
class RestoreRequest:
    """A worker of the job rolls this PS task back to its checkpoint of ``step`` (a consistent cut).

    The gradient path's recovery: when one task restarted from the
    checkpoint of step S, the chief rolls every other task back to S. The
    task takes a new incarnation. Reply: ``step``, ``incarnation``.
    """

    worker: int
    step: int

    def to_wire(self):
        return {"worker": self.worker, "step": self.step}, {}

    @classmethod
    def parse(cls, f: _Fields, tensors):
        _no_tensors("Restore", tensors)
        return cls(f.worker(), f.int("step", 0, MAX_COUNT))


@dataclass(frozen=True)
class ControlRequest:
    """The elastic engine: ask workers to leave (``drain``), take it back (``undrain``),
    report ended processes (``gone``), set the job's ``total_batches``.

    Reply: ``draining``, ``total_batches``, ``progress``, ``job_done``.
    """

    drain: frozenset[int] | None = None
    undrain: frozenset[int] | None = None
    gone: frozenset[int] | None = None
    total_batches: int | None = None

    def to_wire(self):
        meta: dict[str, Any] = {}
        for name in ("drain", "undrain", "gone"):
            if getattr(self, name) is not None:
                meta[name] = sorted(getattr(self, name))
        if self.total_batches is not None:
            meta["total_batches"] = self.total_batches
        return meta, {}

    @classmethod
    def parse(cls, f: _Fields, tensors):
        _no_tensors("Control", tensors)
        return cls(f.workers("drain"), f.workers("undrain"), f.workers("gone"),
                   f.int("total_batches", 1, MAX_COUNT, None))


#: Most entries an epoch's logs may have.
MAX_LOG_ENTRIES = 1024


@dataclass(frozen=True)
class EpochLogsRequest:
    """A worker's logs at the end of its ``epoch``-th epoch (gradient path): answered with the job's.

    ``epoch`` counts the worker's epoch ends from its session's start (every
    worker of a synchronous job runs the same epochs). ``logs``: name →
    finite number. Waits (bounded) until every live worker reported that
    epoch; reply: the mean of each entry over the workers that reported it.
    """

    worker: int
    epoch: int
    logs: Mapping[str, float]
    #: The worker joined a running job (its first report counts for the job's epoch).
    joined: bool = False

    def to_wire(self):
        meta = {"worker": self.worker, "epoch": self.epoch, "logs": dict(self.logs)}
        if self.joined:
            meta["joined"] = True
        return meta, {}

    @classmethod
    def parse(cls, f: _Fields, tensors):
        _no_tensors("EpochLogs", tensors)
        logs = f.get("logs")
        if not isinstance(logs, dict) or len(logs) > MAX_LOG_ENTRIES:
            raise f._fail("logs", logs, f"an object of at most {MAX_LOG_ENTRIES} name: number entries")
        for name, value in logs.items():
            _check_key("EpochLogs", name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) \
                    or not -MAX_LOSS <= value <= MAX_LOSS or not math.isfinite(value):
                raise f._fail(f"logs.{name}", value, "a finite number")
        return cls(f.worker(), f.int("epoch", 0, MAX_COUNT), {k: float(v) for k, v in logs.items()},
                   f.flag("joined", False))


@dataclass(frozen=True)
class RendezvousRequest:
    """A worker's ``seq``-th ``strategy.barrier``/``strategy.reduce`` (PS task 0; ``tfdist.ps._rendezvous``).

    ``values``: the numbers to sum over the workers (none for a barrier).
    Waits (bounded) until every live worker arrived; reply: the sums.
    """

    worker: int
    seq: int
    name: str
    values: tuple[float, ...] = ()

    def to_wire(self):
        return {"worker": self.worker, "seq": self.seq, "name": self.name, "values": list(self.values)}, {}

    @classmethod
    def parse(cls, f: _Fields, tensors):
        _no_tensors("Rendezvous", tensors)
        name, values = f.get("name"), f.get("values", [])
        if not isinstance(name, str) or not 0 < len(name) <= 256:
            raise f._fail("name", name, "a name of 1 to 256 characters")
        if not isinstance(values, list) or len(values) > MAX_LOG_ENTRIES or not all(
                not isinstance(v, bool) and isinstance(v, (int, float)) and math.isfinite(v)
                and -MAX_LOSS <= v <= MAX_LOSS for v in values):
            raise f._fail("values", values, f"a list of at most {MAX_LOG_ENTRIES} finite numbers")
        return cls(f.worker(), f.int("seq", 0, MAX_COUNT), name, tuple(float(v) for v in values))


_REQUESTS: dict[str, Callable[[_Fields, Mapping[str, np.ndarray]], Any]] = {
    "Init": InitRequest.parse,
    "WaitInit": WaitInitRequest.parse,
    "Pull": PullRequest.parse,
    "Push": PushRequest.parse,
    "PushPull": PushPullRequest.parse,
    "PushGradients": PushGradientsRequest.parse,
    "PutState": PutStateRequest.parse,
    "SetExcluded": SetExcludedRequest.parse,
    "Heartbeat": HeartbeatRequest.parse,
    "Status": StatusRequest.parse,
    "Done": DoneRequest.parse,
    "Leave": LeaveRequest.parse,
    "Shutdown": ShutdownRequest.parse,
    "Control": ControlRequest.parse,
    "Checkpoint": CheckpointRequest.parse,
    "Restore": RestoreRequest.parse,
    "Lookup": LookupRequest.parse,
    "PushRows": PushRowsRequest.parse,
    "WriteRows": WriteRowsRequest.parse,
    "EpochLogs": EpochLogsRequest.parse,
    "Rendezvous": RendezvousRequest.parse,
}

#: Methods of :data:`SERVICE` (every request and reply is a :mod:`tfdist.wire` message).
METHODS = tuple(_REQUESTS)

_METHOD_OF = {parser.__self__: name for name, parser in _REQUESTS.items()}


def method_of(request: Any) -> str:
    """The RPC method a request dataclass is sent with (``PushRequest`` → ``"Push"``)."""
    return _METHOD_OF[type(request)]


def parse(method: str, meta: Any, tensors: Mapping[str, np.ndarray]):
    """Parses and validates one request of ``method``.

    Returns:
        The request dataclass (``InitRequest``, ``PushRequest``, ...).

    Raises:
        ProtocolError: the request is malformed; the message names the field.
    """
    parser = _REQUESTS.get(method)
    if parser is None:
        raise ProtocolError(f"Unknown method {short(method)}. Methods: {list(METHODS)}.", grpc_code="UNIMPLEMENTED")
    fields = _Fields(method, meta)
    request = parser(fields, tensors)
    fields.finish()
    return request
