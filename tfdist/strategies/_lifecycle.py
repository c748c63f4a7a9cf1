"""A worker's part in its job, as one explicit state machine (the runtime's flags were several booleans).

States (:class:`Role`):

* ``READER`` — a task that does not train (an evaluator): it reads the
  job's values, never counts as a worker, never leaves or rejoins;
* ``WARMING_UP`` — a worker joining a running elastic job trains its first
  batches locally (build, trace, warm caches) before it counts;
* ``TRAINING`` — a worker of the job: its steps are exchanged and barriers
  wait for it;
* ``LEFT`` — it left the barriers (``LeaveOnTrainEnd``, ``strategy.leave()``):
  it may still evaluate and predict (reading as a reader does), and a later
  training step takes it back;
* ``CLOSED`` — it said ``Done`` (or its process ends): nothing more is sent.

Transitions, the only ones:

* ``WARMING_UP → TRAINING`` when its warm-up batches are done (:meth:`WorkerLifecycle.warmup_step`);
* ``TRAINING`` or ``WARMING_UP → LEFT`` (:meth:`WorkerLifecycle.leave`) and ``LEFT → TRAINING``
  (:meth:`WorkerLifecycle.rejoin`);
* any state but ``CLOSED`` ``→ CLOSED`` (:meth:`WorkerLifecycle.close`).

No TensorFlow, no I/O: the runtime carries the transitions out (it tells
the PS, stops heart-beating, ...).
"""

from __future__ import annotations

import enum

__all__ = ["Role", "WorkerLifecycle"]


class Role(enum.Enum):
    READER = "reader"
    WARMING_UP = "warming up"
    TRAINING = "training"
    LEFT = "left"
    CLOSED = "closed"


class WorkerLifecycle:
    """The role of one task's runtime, and the transitions it may make.

    Args:
        worker_id: The task's worker id (< 0: a reader).
        warmup_batches: Local batches before a joining worker counts (0: none).
    """

    def __init__(self, worker_id: int, warmup_batches: int = 0):
        self.role = Role.READER if worker_id < 0 else Role.WARMING_UP if warmup_batches > 0 else Role.TRAINING
        #: Warm-up batches still to train locally.
        self.warmup_left = warmup_batches if self.role is Role.WARMING_UP else 0
        #: Whether the step now running is a warm-up step (set by :meth:`warmup_step`).
        self.in_warmup_step = False

    # ------------------------------------------------------------------ questions
    @property
    def reader(self) -> bool:
        """A task that does not train."""
        return self.role is Role.READER

    @property
    def left(self) -> bool:
        return self.role is Role.LEFT

    @property
    def closed(self) -> bool:
        return self.role is Role.CLOSED

    @property
    def reads_as_reader(self) -> bool:
        """Reads neither wait for other workers nor count as a sign of life: a reader, a worker that left, or
        one in a warm-up step (it is not part of the job yet)."""
        return self.role in (Role.READER, Role.LEFT) or self.in_warmup_step

    # ------------------------------------------------------------------ transitions
    def warmup_step(self, may_warm_up: bool) -> bool:
        """A training step begins: True when it is a warm-up step (``may_warm_up``: the worker has not joined
        yet); the last one done, the worker trains."""
        self.in_warmup_step = False
        if self.role is Role.WARMING_UP and self.warmup_left > 0 and may_warm_up:
            self.warmup_left -= 1
            self.in_warmup_step = True
            return True
        if self.role is Role.WARMING_UP:
            self.role = Role.TRAINING
        return False

    def end_warmup_step(self) -> None:
        """Between steps the worker is not in a warm-up step."""
        self.in_warmup_step = False

    def leave(self) -> bool:
        """``TRAINING``/``WARMING_UP → LEFT``; False (nothing to do) in any other state."""
        if self.role not in (Role.TRAINING, Role.WARMING_UP):
            return False
        self.role = Role.LEFT
        return True

    def rejoin(self) -> bool:
        """``LEFT → TRAINING``; False in any other state."""
        if self.role is not Role.LEFT:
            return False
        self.role = Role.TRAINING
        return True

    def close(self) -> bool:
        """``→ CLOSED``; False when already closed."""
        if self.role is Role.CLOSED:
            return False
        self.role = Role.CLOSED
        return True
