"""The parameter-server protocol's replies: one dataclass per method, as requests are.

The store builds these; the server sends them with :meth:`to_wire`; the
client reads them back with :func:`parse_reply`, which checks every field's
type (a reply from a PS of another version, or a corrupted one, is a
:class:`~tfdist.ps.protocol.ProtocolError`, never a ``KeyError`` deep in a
worker). Nobody outside the protocol reads a reply as a raw mapping.

Fields every training reply carries (``incarnation``, ``leave``,
``job_done``) are in :class:`MemberFields`; SSP's clock information
(``min_clock``, ``staleness``) in :class:`ClockFields`.

Importing this module does not import TensorFlow or gRPC.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np

from tfdist.ps.protocol import ProtocolError, short

__all__ = [
    "InitReply", "ExtendReply", "WaitInitReply", "PullReply", "PushReply", "PushPullReply", "GradientsReply", "PutStateReply",
    "SetExcludedReply", "LiveWorkersReply", "StatusReply", "DoneReply", "ShutdownReply", "ControlReply",
    "CheckpointReply", "RestoreReply", "LookupReply", "PushRowsReply", "WriteRowsReply", "EpochLogsReply", "RendezvousReply",
    "REPLIES",
    "parse_reply",
]

_NO_TENSORS: Mapping[str, np.ndarray] = {}
logger = logging.getLogger(__name__)


#: Each field kind's type check (built once: a reply is parsed for every call of every step).
_CHECKS = {
    "int": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "opt_int": lambda v: v is None or (isinstance(v, int) and not isinstance(v, bool)),
    "bool": lambda v: isinstance(v, bool),
    "opt_str": lambda v: v is None or isinstance(v, str),
    "ints": lambda v: isinstance(v, (list, tuple)) and all(isinstance(x, int) and not isinstance(x, bool)
                                                            for x in v),
    "floats": lambda v: isinstance(v, (list, tuple)) and all(isinstance(x, (int, float)) and not isinstance(x, bool)
                                                             for x in v),
    "strs": lambda v: isinstance(v, (list, tuple)) and all(isinstance(x, str) for x in v),
    "numbers": lambda v: isinstance(v, Mapping) and all(
        isinstance(k, str) and isinstance(x, (int, float)) and not isinstance(x, bool) for k, x in v.items()),
}


#: The most CPU seconds one ``server_cpu_s`` report may hold (more is not a report: it is ignored).
MAX_REPORTED_CPU_S = 3600.0


def _reported_seconds(value: Any) -> float | None:
    """A PS task's CPU report (``server_cpu_s``): a number in [0, :data:`MAX_REPORTED_CPU_S`], or None.

    The report only steers ``exchange_every: auto``, and it comes with a
    push the PS applied already: a value that is not a plausible report
    (a string, NaN, a negative, a huge integer) is dropped (logged once),
    not a failed exchange.
    """
    if value is None:
        return None
    try:
        seconds = float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else math.nan
    except OverflowError:  # (an integer past a float's range)
        seconds = math.nan
    if 0.0 <= seconds <= MAX_REPORTED_CPU_S:
        return seconds
    global _warned_report
    if not _warned_report:
        _warned_report = True
        logger.warning("a parameter server reported server_cpu_s=%s, not a CPU time: reports like it are ignored "
                       "(is the server the same tfdist version?)", short(value))
    return None


_warned_report = False


def _check(cls_name: str, name: str, value: Any, kind: str) -> Any:
    ok = _CHECKS[kind](value)
    if not ok:
        raise ProtocolError(f"{cls_name}: reply field `{name}` is {short(value)}; expected {kind}. Are client and "
                            "server the same tfdist version?")
    if kind == "numbers":
        return {k: float(x) for k, x in value.items()}
    if kind == "floats":
        return tuple(float(x) for x in value)
    return tuple(value) if kind in ("ints", "strs") else value


class _Reply:
    """Shared ``to_wire``/``parse`` over the dataclass's fields and their declared kinds (``_KINDS``)."""

    _KINDS: dict[str, str] = {}
    #: Fields left out of the wire form while they hold their default (flags, optional numbers).
    _SPARSE: frozenset[str] = frozenset()

    def to_wire(self) -> tuple[dict[str, Any], Mapping[str, np.ndarray]]:
        meta = {}
        for name in self._KINDS:
            value = getattr(self, name)
            if name in self._SPARSE and (value is None or value is False):  # (0 is a value: `0 in (None, False)`)
                continue
            meta[name] = list(value) if isinstance(value, tuple) else value
        return meta, getattr(self, "values", _NO_TENSORS)

    @classmethod
    def parse(cls, meta: Mapping[str, Any], tensors: Mapping[str, np.ndarray] = _NO_TENSORS):
        if not isinstance(meta, Mapping):
            raise ProtocolError(f"{cls.__name__}: a reply's meta must be an object. Received: {short(meta)}.")
        kwargs = {}
        for name, kind in cls._KINDS.items():
            if name in meta:
                kwargs[name] = _check(cls.__name__, name, meta[name], kind)
            elif name not in cls._SPARSE:
                raise ProtocolError(f"{cls.__name__}: reply field `{name}` is missing. Are client and server the "
                                    "same tfdist version?")
        if _has_values(cls):
            kwargs["values"] = dict(tensors)
        return cls(**kwargs)


@functools.lru_cache(maxsize=None)
def _has_values(cls) -> bool:
    """Whether a reply class carries tensors (a ``values`` field)."""
    return "values" in {f.name for f in dataclasses.fields(cls)}


def _kinds(**kinds: str) -> dict[str, str]:
    return kinds


#: ``incarnation`` of the PS task's state; ``leave`` (the elastic engine drains this worker);
#: ``job_done`` (the job's ``total_batches`` are done).
_MEMBER = _kinds(incarnation="int", leave="bool", job_done="bool")
#: SSP's clock information: the slowest live worker's clock, the bound.
_CLOCK = _kinds(global_step="int", min_clock="opt_int", staleness="opt_int")


@dataclass(frozen=True)
class InitReply(_Reply):
    """``Init``: whether this call initialised the task (False: it already held values; the caller pulls)."""

    initialized_here: bool
    version: int
    global_step: int
    incarnation: int
    state_step: int
    _KINDS = _kinds(initialized_here="bool", version="int", global_step="int", incarnation="int", state_step="int")


@dataclass(frozen=True)
class ExtendReply(_Reply):
    """``Extend``: the job's ``values`` of every key sent; ``added``: the keys this call added (the others existed)."""

    version: int
    incarnation: int
    added: tuple[str, ...]
    values: Mapping[str, np.ndarray] = field(default_factory=dict, repr=False)
    _KINDS = _kinds(version="int", incarnation="int", added="strs")


@dataclass(frozen=True)
class WaitInitReply(_Reply):
    """``WaitInit``: ``initialized`` False when the bounded wait ran out."""

    initialized: bool
    version: int
    global_step: int
    incarnation: int
    state_step: int | None = None
    _KINDS = _kinds(initialized="bool", version="int", global_step="int", incarnation="int", state_step="opt_int")
    _SPARSE = frozenset({"state_step"})


@dataclass(frozen=True)
class PullReply(_Reply):
    """``Pull``: the values (tensors) and where the task is: ``version``, steps, clocks, membership."""

    version: int
    state_step: int
    global_step: int
    incarnation: int
    min_clock: int | None = None
    staleness: int | None = None
    clock: int | None = None
    leave: bool = False
    job_done: bool = False
    values: Mapping[str, np.ndarray] = field(default_factory=dict, repr=False)
    _KINDS = _kinds(version="int", state_step="int", clock="opt_int", **_CLOCK, **_MEMBER)
    _SPARSE = frozenset({"min_clock", "staleness", "clock", "leave", "job_done"})


@dataclass(frozen=True)
class PushReply(_Reply):
    """``Push``: ``applied`` or ``dropped`` (``reason``); the new ``version`` and the one it landed on."""

    applied: bool
    dropped: bool
    version: int
    incarnation: int
    previous_version: int | None = None
    reason: str | None = None
    global_step: int | None = None
    min_clock: int | None = None
    staleness: int | None = None
    leave: bool = False
    job_done: bool = False
    _KINDS = _kinds(applied="bool", dropped="bool", version="int", previous_version="opt_int", reason="opt_str",
                    global_step="opt_int", min_clock="opt_int", staleness="opt_int", incarnation="int",
                    leave="bool", job_done="bool")
    _SPARSE = frozenset({"previous_version", "reason", "global_step", "min_clock", "staleness", "leave",
                         "job_done"})


@dataclass(frozen=True)
class PushPullReply(_Reply):
    """``PushPull``: the read after the push (as :class:`PullReply`) and the push's own reply.

    ``unchanged``: the push landed right on the worker's snapshot and nothing
    after it, so no values travel (the worker knows them: snapshot + delta).
    ``server_cpu_s``: CPU seconds serving this connection's ``PushPull``
    requests cost the PS task since its previous such report (see
    :meth:`~tfdist.ps.server.ParameterService.handle`); ``None`` where the
    transport cannot tell (gRPC, in-process calls) or the value is not a
    plausible report (:func:`_reported_seconds`).
    """

    read: PullReply
    push: PushReply
    unchanged: bool = False
    server_cpu_s: float | None = None

    def to_wire(self):
        meta, values = self.read.to_wire()
        meta = {**meta, "push": self.push.to_wire()[0]}
        if self.server_cpu_s is not None:
            meta["server_cpu_s"] = self.server_cpu_s
        if self.unchanged:
            return {**meta, "unchanged": True}, _NO_TENSORS
        return meta, values

    @classmethod
    def parse(cls, meta, tensors=_NO_TENSORS):
        if not isinstance(meta, Mapping) or not isinstance(meta.get("push"), Mapping):
            raise ProtocolError(f"PushPullReply: `push` is missing or not an object. Received: {short(meta)}.")
        unchanged = _check("PushPullReply", "unchanged", meta.get("unchanged", False), "bool")
        cpu = _reported_seconds(meta.get("server_cpu_s"))
        read = PullReply.parse({k: v for k, v in meta.items() if k not in ("push", "unchanged", "server_cpu_s")},
                               tensors)
        return cls(read, PushReply.parse(meta["push"]), unchanged, cpu)

    # the read's fields, for callers that treat a PushPull like a Pull
    version = property(lambda self: self.read.version)
    incarnation = property(lambda self: self.read.incarnation)
    global_step = property(lambda self: self.read.global_step)
    min_clock = property(lambda self: self.read.min_clock)
    staleness = property(lambda self: self.read.staleness)
    clock = property(lambda self: self.read.clock)
    values = property(lambda self: self.read.values)
    # membership: said by the read or by the push
    leave = property(lambda self: self.read.leave or self.push.leave)
    job_done = property(lambda self: self.read.job_done or self.push.job_done)


@dataclass(frozen=True)
class GradientsReply(_Reply):
    """``PushGradients``: the step's aggregate (tensors), or ``resync`` when it is no longer kept.

    ``dropped``: the gradient came after the step completed; ``waited``: the
    worker waited for others; ``write_state``: this worker completed the step
    and uploads the state after applying it.
    """

    dropped: bool
    global_step: int
    step: int
    waited: bool
    resync: bool
    write_state: bool
    incarnation: int
    reason: str | None = None
    leave: bool = False
    job_done: bool = False
    values: Mapping[str, np.ndarray] = field(default_factory=dict, repr=False)
    _KINDS = _kinds(dropped="bool", global_step="int", step="int", reason="opt_str", waited="bool", resync="bool",
                    write_state="bool", **_MEMBER)
    _SPARSE = frozenset({"reason", "leave", "job_done"})


@dataclass(frozen=True)
class PutStateReply(_Reply):
    """``PutState``: ``stored`` False when the task already holds a newer snapshot."""

    stored: bool
    state_step: int
    _KINDS = _kinds(stored="bool", state_step="int")


@dataclass(frozen=True)
class SetExcludedReply(_Reply):
    excluded: tuple[int, ...]
    _KINDS = _kinds(excluded="ints")


@dataclass(frozen=True)
class LiveWorkersReply(_Reply):
    """``Heartbeat`` and ``Leave``: the workers the task counts as live now."""

    live_workers: tuple[int, ...]
    _KINDS = _kinds(live_workers="ints")


@dataclass(frozen=True)
class DoneReply(_Reply):
    done_workers: tuple[int, ...]
    _KINDS = _kinds(done_workers="ints")


@dataclass(frozen=True)
class ShutdownReply(_Reply):
    stopping: bool
    _KINDS = _kinds(stopping="bool")


@dataclass(frozen=True)
class ControlReply(_Reply):
    """``Control`` (the elastic engine): who is asked to leave, the job's work and progress."""

    draining: tuple[int, ...]
    progress: int
    job_done: bool
    total_batches: int | None = None
    _KINDS = _kinds(draining="ints", total_batches="opt_int", progress="int", job_done="bool")


@dataclass(frozen=True)
class CheckpointReply(_Reply):
    """``Checkpoint``: now (``step``, ``path``; ``None`` without ``ps.checkpoint_dir``) or ``scheduled``."""

    step: int | None = None
    path: str | None = None
    scheduled: bool = False
    _KINDS = _kinds(step="opt_int", path="opt_str", scheduled="bool")
    _SPARSE = frozenset({"step", "path", "scheduled"})


@dataclass(frozen=True)
class RestoreReply(_Reply):
    step: int
    incarnation: int
    _KINDS = _kinds(step="int", incarnation="int")


@dataclass(frozen=True)
class LookupReply(_Reply):
    """``Lookup``: tensor ``values`` (and ``values.<i>`` for ``also``), one row per requested index."""

    version: int
    incarnation: int
    values: Mapping[str, np.ndarray] = field(default_factory=dict, repr=False)
    _KINDS = _kinds(version="int", incarnation="int")


@dataclass(frozen=True)
class PushRowsReply(_Reply):
    applied: bool
    dropped: bool
    _KINDS = _kinds(applied="bool", dropped="bool")


@dataclass(frozen=True)
class WriteRowsReply(_Reply):
    written: int
    _KINDS = _kinds(written="int")


@dataclass(frozen=True)
class EpochLogsReply(_Reply):
    """``EpochLogs``: the job's logs of the epoch (each entry's mean over ``workers``, those that reported it)."""

    logs: Mapping[str, float]
    workers: tuple[int, ...]
    #: The epoch the report counted for (the worker counts on from it: see ``tfdist.ps._epoch_logs``).
    epoch: int
    _KINDS = _kinds(logs="numbers", workers="ints", epoch="int")

    def to_wire(self):
        return {"logs": dict(self.logs), "workers": list(self.workers), "epoch": self.epoch}, _NO_TENSORS


@dataclass(frozen=True)
class RendezvousReply(_Reply):
    """``Rendezvous``: the element-wise sums of the values of ``workers`` (see ``tfdist.ps._rendezvous``)."""

    sums: tuple[float, ...]
    workers: tuple[int, ...]
    _KINDS = _kinds(sums="floats", workers="ints")


@dataclass(frozen=True)
class StatusReply:
    """``Status``: a PS task's counters, membership, policy and checkpoints (JSON-able, shown to users as is).

    The fields the library itself reads are typed attributes; :attr:`fields`
    is the whole status (what ``strategy.ps_status()`` returns).
    """

    fields: Mapping[str, Any]

    def to_wire(self):
        return dict(self.fields), _NO_TENSORS

    @classmethod
    def parse(cls, meta, tensors=_NO_TENSORS):
        if not isinstance(meta, Mapping):
            raise ProtocolError(f"StatusReply: a reply's meta must be an object. Received: {short(meta)}.")
        for name, kind in (("initialized", "bool"), ("incarnation", "int"), ("done_workers", "ints"),
                           ("live_workers", "ints"), ("progress", "int"), ("global_step", "int"),
                           ("state_step", "int"), ("restored_from", "opt_int"), ("stream_port", "opt_int")):
            _check("StatusReply", name, meta.get(name), kind)
        return cls(dict(meta))

    def to_dict(self) -> dict[str, Any]:
        return dict(self.fields)

    initialized = property(lambda self: self.fields["initialized"])
    incarnation = property(lambda self: self.fields["incarnation"])
    done_workers = property(lambda self: tuple(self.fields["done_workers"]))
    live_workers = property(lambda self: tuple(self.fields["live_workers"]))
    progress = property(lambda self: self.fields["progress"])
    global_step = property(lambda self: self.fields["global_step"])
    state_step = property(lambda self: self.fields["state_step"])
    restored_from = property(lambda self: self.fields["restored_from"])
    job_done = property(lambda self: bool(self.fields.get("job_done")))
    worker_batches = property(lambda self: {int(w): n for w, n in (self.fields.get("worker_batches") or {}).items()})


#: The reply type of each method of :data:`~tfdist.ps.protocol.METHODS`.
REPLIES = {
    "Init": InitReply, "Extend": ExtendReply, "WaitInit": WaitInitReply, "Pull": PullReply, "Push": PushReply, "PushPull": PushPullReply,
    "PushGradients": GradientsReply, "PutState": PutStateReply, "SetExcluded": SetExcludedReply,
    "Heartbeat": LiveWorkersReply, "Status": StatusReply, "Done": DoneReply, "Leave": LiveWorkersReply,
    "Shutdown": ShutdownReply, "Control": ControlReply, "Checkpoint": CheckpointReply, "Restore": RestoreReply,
    "Lookup": LookupReply, "PushRows": PushRowsReply, "WriteRows": WriteRowsReply, "EpochLogs": EpochLogsReply,
    "Rendezvous": RendezvousReply,
}


def parse_reply(method: str, meta: Any, tensors: Mapping[str, np.ndarray] = _NO_TENSORS):
    """The typed reply of ``method`` (raises :class:`ProtocolError` on a malformed one)."""
    return REPLIES[method].parse(meta, tensors)
