"""The parameter-server protocol's membership, liveness and administration requests (part of :mod:`tfdist.ps.protocol`).

``SetExcluded``, ``Heartbeat``, ``Status``, ``Done``, ``Leave``, ``Shutdown``,
``Checkpoint``, ``Restore`` and ``Control`` (the elastic engine's): parsed and
validated whole like every request. Import them from :mod:`tfdist.ps.protocol`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tfdist.ps._protocol_fields import (
    MAX_COUNT,
    _MISSING,
    _Fields,
    _no_tensors,
)


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
