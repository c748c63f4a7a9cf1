"""The dense variables of one PS task: specs, values, version, and how updates reach them.

Owns (PS side): the set of variables this task holds and their specs (the
store schema of the job's variable registry), their values, the version
(bumped by every change), the job's non-finite policy and who initialised
the task. Checks a request's tensors against the specs (known keys, dtypes,
shapes, finite values) before anything changes, and applies an update
all-or-nothing: under ``nonfinite: refuse`` a sum that would overflow to
Inf is refused as a NaN in the request is, with nothing applied.

Every method but :func:`all_finite` and :meth:`DenseVariables.check_finite`
runs with the store's lock held. No sockets, no TensorFlow.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from tfdist.ps import _schema as schema
from tfdist.ps._schema import Field, SchemaError
from tfdist.ps._waits import StoreError
from tfdist.ps.placement import VariableSpec
from tfdist.ps.protocol import NONFINITE_POLICIES, short
from tfdist.wire import dtype_name

__all__ = ["DenseVariables", "all_finite"]


def all_finite(value: np.ndarray) -> bool:
    """Whether every element of ``value`` is finite (integers always are).

    A float sum is finite only if every element is (NaN and Inf propagate),
    so one reduction decides the usual case; only a sum that overflowed
    needs the element-wise check.
    """
    if value.dtype.kind in "iub" or value.size == 0:
        return True
    if value.dtype.kind != "f":  # bfloat16 (ml_dtypes)
        value = value.astype(np.float32)
    with np.errstate(all="ignore"):
        if math.isfinite(float(np.add.reduce(value, axis=None))):
            return True
    return bool(np.isfinite(value).all())


def _nonfinite_error(what: str, key: str, worker: int) -> StoreError:
    return StoreError(
        f"Non-finite {what} (NaN or Inf) for {short(key)} from worker {worker}: refused, so it cannot "
        "poison the other workers. The worker's training has diverged (lower the learning rate, "
        "clip gradients), or set ps.nonfinite: allow to store such values.")


class DenseVariables:
    """The task's dense variables (its shard of every replicated variable)."""

    FIELDS = (
        Field("version", schema.COUNT),
        Field("nonfinite", schema.Choice(NONFINITE_POLICIES), default="refuse"),
        Field("initialized_by", schema.OPTIONAL_WORKER),
    )

    def __init__(self):
        self.specs: dict[str, VariableSpec] = {}
        self.values: dict[str, np.ndarray] = {}
        self.version = 0
        self.nonfinite = "refuse"
        self.initialized_by: int | None = None
        #: Keys of variables that joined the job after its first step (``Extend``), in the order they joined.
        self.joined: list[str] = []
        #: Spare arrays an update is computed into before it replaces the values (all-or-nothing).
        self._spare: dict[str, np.ndarray] = {}

    @property
    def initialized(self) -> bool:
        return self.initialized_by is not None

    # ------------------------------------------------------------------ checks
    def check_finite(self, tensors: Mapping[str, np.ndarray], worker: int, what: str,
                     policy: str | None = None) -> None:
        """Refuses NaN/Inf unless the job allows them (needs no lock: it reads only the arrays)."""
        if (policy or self.nonfinite) == "allow":
            return
        for key, value in tensors.items():
            if not all_finite(value):
                raise _nonfinite_error(what, key, worker)

    def check_same_specs(self, specs: Iterable[VariableSpec]) -> None:
        """A starting worker's variables are the job's: every one the job started with, the same specs.

        Variables that joined later (:attr:`joined`) may be missing (a worker
        started again creates them later, and joins them then) or present.
        """
        theirs = {s.key: s for s in specs}
        joined = set(self.joined)
        base = {k: s for k, s in self.specs.items() if k not in joined}
        if not (base.items() <= theirs.items() <= self.specs.items()):
            diff = sorted(
                (k, f"{s.dtype}{list(s.shape)}") for k, s in set(theirs.items()) ^ set(base.items())
                if not (k in joined and self.specs.get(k) == s)
            )[:4]
            raise StoreError(
                "This worker's variables differ from the ones the parameter servers "
                f"were initialised with (first differences: {short(diff, 300)}). Every worker must "
                "build the same model, creating variables in the same order.",
                grpc_code="FAILED_PRECONDITION",
            )

    def check_join(self, specs: Iterable[VariableSpec], worker: int) -> list[VariableSpec]:
        """The specs of a join (``Extend``) that are new here; refuses one whose key exists with another spec."""
        new, clash = [], []
        for spec in specs:
            mine = self.specs.get(spec.key)
            if mine is None:
                new.append(spec)
            elif mine != spec:
                clash.append(f"{spec.key}: worker {worker} has {spec.dtype}{list(spec.shape)}, the job "
                             f"{mine.dtype}{list(mine.shape)}")
        if clash:
            raise StoreError(
                f"Variables created after the job's first step differ from the job's ({short(clash[:3], 400)}). Every "
                "worker must create the same variables in the same order.", grpc_code="FAILED_PRECONDITION")
        return new

    def check_keys(self, keys: Iterable[str]) -> None:
        unknown = [k for k in keys if k not in self.values]
        if unknown:
            known = list(self.values)[:4]
            raise StoreError(
                f"Unknown variable(s) {short(unknown[:4], 200)} on this parameter server. "
                f"It holds {len(self.values)} variables, e.g. {short(known, 200)}.",
                grpc_code="NOT_FOUND",
            )

    def check_tensors(self, tensors: Mapping[str, np.ndarray], trainable_only: bool = False) -> None:
        self.check_keys(tensors)
        for key, value in tensors.items():
            spec = self.specs[key]
            if trainable_only and not spec.trainable:
                raise StoreError(f"{short(key)} is not trainable: gradients cannot be pushed for it.")
            if dtype_name(value.dtype) != spec.dtype:
                raise StoreError(
                    f"Wrong dtype for {short(key)}: received {value.dtype.name}, the variable is {spec.dtype}."
                )
            if tuple(value.shape) != tuple(spec.shape):
                raise StoreError(
                    f"Wrong shape for {short(key)}: received {list(value.shape)}, the variable is {list(spec.shape)}."
                )

    def check_rows(self, deltas: Mapping[str, np.ndarray], rows: Mapping[str, np.ndarray]) -> None:
        """Row-sparse deltas: known keys, each delta one row per index of the variable's rows, in range."""
        self.check_keys(rows)
        for key, r in rows.items():
            spec, value = self.specs[key], deltas[key]
            if dtype_name(value.dtype) != spec.dtype or len(spec.shape) < 1 or tuple(value.shape[1:]) != tuple(spec.shape[1:]):
                raise StoreError(f"Wrong rows for {short(key)}: received {value.dtype.name}{list(value.shape)}, the "
                                 f"variable is {spec.dtype}{list(spec.shape)}.")
            if r.size and (int(r.min()) < 0 or int(r.max()) >= spec.shape[0]):
                raise StoreError(f"Rows of {short(key)} outside 0..{spec.shape[0] - 1}.", grpc_code="OUT_OF_RANGE")

    # ------------------------------------------------------------------ changes
    def initialize(self, specs: Iterable[VariableSpec], values: Mapping[str, np.ndarray], worker: int,
                   nonfinite: str, joined: Iterable[str] = ()) -> None:
        self.nonfinite = nonfinite
        self.specs = {s.key: s for s in specs}
        self.joined = [k for k in joined if k in self.specs]
        self.values = {s.key: np.array(values[s.key], copy=True) for s in self.specs.values()}
        self._spare = {}
        self.version = 1
        self.initialized_by = worker

    def join(self, new: Iterable[VariableSpec], values: Mapping[str, np.ndarray]) -> None:
        """Adds checked new variables with their (copied) values; bumps the version."""
        arrays = {spec.key: np.array(values[spec.key], copy=True) for spec in new}  # may fail: nothing changed yet
        for spec in new:
            self.specs[spec.key] = spec
            self.values[spec.key] = arrays[spec.key]
            self.joined.append(spec.key)
        self.version += 1

    def add(self, deltas: Mapping[str, np.ndarray], rows: Mapping[str, np.ndarray], worker: int) -> int:
        """Adds checked deltas (dense, or at ``rows``) and bumps the version; returns the bytes received.

        Under ``nonfinite: refuse`` every sum is computed and checked before
        any replaces a value: one that overflowed refuses the whole update.
        """
        check = self.nonfinite != "allow"
        staged: list[tuple[str, np.ndarray | None, np.ndarray]] = []
        nbytes = 0
        for key, delta in deltas.items():
            r = rows.get(key)
            current = self.values[key]
            if r is None:
                if not check:
                    current += delta
                else:
                    spare = self._spare.get(key)
                    if spare is None:
                        spare = np.empty_like(current)
                    with np.errstate(over="ignore", invalid="ignore"):  # checked below
                        np.add(current, delta, out=spare)
                    staged.append((key, None, spare))
            else:
                if not check:
                    current[r] += delta  # distinct rows (checked when parsed)
                else:
                    with np.errstate(over="ignore", invalid="ignore"):
                        staged.append((key, r, current[r] + delta))
                nbytes += r.nbytes
            nbytes += delta.nbytes
        for key, _, new in staged:
            if not all_finite(new):
                raise _nonfinite_error("result of an update", key, worker)
        for key, r, new in staged:  # -- every sum is finite: apply
            if r is None:
                self._spare[key], self.values[key] = self.values[key], new
            else:
                self.values[key][r] = new
        self.version += 1
        return nbytes

    def write(self, tensors: Mapping[str, np.ndarray]) -> None:
        """Replaces values (a reset, a state snapshot); bumps the version."""
        for key, value in tensors.items():
            np.copyto(self.values[key], value)
        self.version += 1

    # ------------------------------------------------------------------ schema
    def state(self) -> dict[str, Any]:
        return {"values": {k: v.copy() for k, v in self.values.items()},
                "specs": [s.to_dict() for s in self.specs.values()], "joined": list(self.joined),
                **schema.snapshot(self, self.FIELDS)}

    def checkpoint(self) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        return ({"specs": [s.to_dict() for s in self.specs.values()], "joined": list(self.joined),
                 **schema.dump(self, self.FIELDS, "checkpoint")},
                {k: v.copy() for k, v in self.values.items()})

    @classmethod
    def parse_checkpoint(cls, meta: Mapping[str, Any], arrays: Mapping[str, np.ndarray],
                         limits: schema.Limits) -> dict[str, Any]:
        """A checkpoint's variables, validated whole (specs, every value's dtype, shape and finiteness)."""
        raw_specs = meta.get("specs")
        if not isinstance(raw_specs, list):
            raise SchemaError(f"`specs` must be a list of variable specs; it holds {short(raw_specs)}")
        try:
            specs = [VariableSpec.from_dict(d) for d in raw_specs]
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise SchemaError(f"a variable spec is malformed ({short(str(e))})") from None
        if len({s.key for s in specs}) != len(specs):
            raise SchemaError("a variable is listed twice in `specs`")
        joined = meta.get("joined", [])  # (checkpoints written before variables could join have none)
        if not isinstance(joined, list) or not all(isinstance(k, str) for k in joined) \
                or not set(joined) <= {s.key for s in specs} or len(set(joined)) != len(joined):
            raise SchemaError(f"`joined` must list keys of `specs`, each once; it holds {short(joined)}")
        fields = schema.parse(cls.FIELDS, meta, limits)
        if fields["initialized_by"] is None:
            raise SchemaError("`initialized_by` is missing")
        missing = [sp.key for sp in specs if sp.key not in arrays]
        wrong = [sp.key for sp in specs if sp.key in arrays and (
            arrays[sp.key].dtype.name != sp.dtype or tuple(arrays[sp.key].shape) != tuple(sp.shape))]
        if missing or wrong:
            raise SchemaError(f"the checkpoint does not match its own variable list (missing: "
                              f"{short(missing[:4])}, wrong dtype/shape: {short(wrong[:4])})")
        if fields["nonfinite"] == "refuse":
            bad = [sp.key for sp in specs if not all_finite(arrays[sp.key])]
            if bad:
                raise SchemaError(f"values of {short(bad[:4])} are not finite, and the job refuses such values")
        return {"specs": {sp.key: sp for sp in specs}, "joined": list(joined),
                "values": {sp.key: np.array(arrays[sp.key], copy=True) for sp in specs}, **fields}

    def load(self, parsed: Mapping[str, Any]) -> None:
        self.specs, self.values, self._spare = parsed["specs"], parsed["values"], {}
        self.joined = list(parsed["joined"])
        schema.assign(self, {f.name: parsed[f.name] for f in self.FIELDS})

    def status(self, brief: bool) -> dict[str, Any]:
        status = {**schema.dump(self, self.FIELDS, "status"), "initialized": self.initialized,
                  "num_variables": len(self.values), "joined_variables": len(self.joined),
                  "bytes": int(sum(v.nbytes for v in self.values.values()))}
        if not brief:
            status["specs"] = [s.to_dict() for s in self.specs.values()]
        return status
