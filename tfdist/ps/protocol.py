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
Replies are typed too (:mod:`tfdist.ps.replies`).

Importing this module does not import TensorFlow or gRPC.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import numpy as np

from tfdist.ps.placement import VariableSpec
from tfdist.ps._protocol_fields import (  # noqa: F401  (re-exported: the protocol's names live here)
    SERVICE,
    MAX_WORKER_ID,
    MAX_WORKERS,
    MAX_STEPS_PER_PUSH,
    MAX_LOSS,
    MAX_COUNT,
    MAX_KEY_CHARS,
    MAX_LOOKUP_TABLES,
    MAX_ITEMS,
    MAX_WAIT_S,
    NONFINITE_POLICIES,
    RequestError,
    ProtocolError,
    short,
    _MISSING,
    _Fields,
    TableShard,
    _TABLE_FIELDS,
    _table_shard,
    _row_ids,
    _also_tables,
    _check_key,
    _spec,
    check_policy_spec,
    _no_tensors,
    _tensor_keys,
    ROWS_SUFFIX,
    MAX_INCARNATION,
    _with_incarnation,
)
from tfdist.ps._member_protocol import (  # noqa: F401
    SetExcludedRequest,
    _WorkerRequest,
    HeartbeatRequest,
    StatusRequest,
    DoneRequest,
    LeaveRequest,
    ShutdownRequest,
    CheckpointRequest,
    RestoreRequest,
    ControlRequest,
)
from tfdist.ps._table_protocol import LookupRequest, PushRowsRequest, WriteRowsRequest  # noqa: F401

__all__ = [
    "SERVICE",
    "METHODS",
    "ProtocolError",
    "RequestError",
    "NONFINITE_POLICIES",
    "InitRequest",
    "ExtendRequest",
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

    ``joined``: the keys among ``specs`` of variables that joined the job
    after its first step (:class:`ExtendRequest`); a worker that starts
    again may leave them out until it creates them.
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
    joined: tuple[str, ...] = ()

    def to_wire(self):
        meta = {"worker": self.worker, "specs": [s.to_dict() for s in self.specs], "step": self.step,
                "nonfinite": self.nonfinite}
        if self.reset:
            meta["reset"] = True
        if self.joined:
            meta["joined"] = list(self.joined)
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
        joined = f.keys("joined") or ()
        if not set(joined) <= keys:
            raise ProtocolError(f"Init: `joined` names variables that are not in `specs`: "
                                f"{short(sorted(set(joined) - keys)[:4])}.")
        return cls(f.worker(), specs, tensors, f.policy(num_workers), num_workers, f.int("step", 0, MAX_COUNT, 0),
                   f.choice("nonfinite", NONFINITE_POLICIES, "refuse"), f.flag("reset", False), f.tables(), joined)


@dataclass(frozen=True)
class ExtendRequest:
    """Variables created after the job's first step join it (a new head, a fresh optimizer, a second model).

    ``specs``: the new variables (or pieces) this task holds, in creation
    order, with ``values`` (the sender's initial values, one per spec). The
    first worker to send a key adds it; a later one with the same spec gets
    the job's values; a different spec is refused. Reply
    (:class:`~tfdist.ps.replies.ExtendReply`): the job's ``values`` of every
    key sent, the keys ``added`` by this call, ``version``, ``incarnation``.
    """

    worker: int
    specs: tuple[VariableSpec, ...]
    values: Mapping[str, np.ndarray] = field(repr=False)
    incarnation: int | None = None

    def to_wire(self):
        return (_with_incarnation({"worker": self.worker, "specs": [s.to_dict() for s in self.specs]},
                                  self.incarnation), dict(self.values))

    @classmethod
    def parse(cls, f: _Fields, tensors):
        specs = f.specs()
        if not specs:
            raise ProtocolError("Extend: `specs` is empty; name at least one variable.")
        keys = {s.key for s in specs}
        if keys != set(tensors):
            raise ProtocolError(
                f"Extend: values do not match specs: missing {short(sorted(keys - set(tensors))[:4])}, "
                f"unexpected {short(sorted(set(tensors) - keys)[:4])}.")
        for s in specs:
            v = tensors[s.key]
            if v.dtype.name != s.dtype or tuple(v.shape) != s.shape:
                raise ProtocolError(f"Extend: value of {short(s.key)} is {v.dtype.name}{list(v.shape)}, its spec "
                                    f"says {s.dtype}{list(s.shape)}.")
        return cls(f.worker(), specs, tensors, f.int("incarnation", 0, MAX_INCARNATION, None))


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
    "Extend": ExtendRequest.parse,
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

#: The data plane: the methods a worker sends every step, carried by the lean transport
#: (:mod:`tfdist.stream_service`) where the PS offers it; the others always travel over gRPC.
STREAM_METHODS = ("Pull", "Push", "PushPull", "PushGradients", "PutState", "Lookup", "PushRows", "WriteRows")

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
