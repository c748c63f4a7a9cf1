"""What one worker knows of its exchange with the parameter servers: each fact once, with one meaning.

A :class:`~tfdist.ps.session.WorkerSession` owns one :class:`ExchangeState`
and is the only writer of it (from the replies it reads, and the steps it
sends); the runtime, the strategies' statistics and the tests read it. The
PS side has its own owners (docs/architecture.md): the policy's clocks, the
gradient barrier's global step.

Two step counts that used to share the name ``global_step``:

* ``step`` — gradient path: the global step this worker computes next, i.e.
  the step its state is at (after a state reload, the snapshot's step);
* ``job_step`` — gradient path: the newest global step the job is known to
  have reached (from any reply); a worker with ``step < job_step`` has fallen
  behind and reloads the state snapshot before its next step.

No I/O, no TensorFlow.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from typing import Iterable

__all__ = ["ExchangeState"]

logger = logging.getLogger(__name__)


@dataclass
class ExchangeState:
    """A worker's view of its exchange (see the module's docstring).

    Attributes:
        num_ps: PS tasks of the job.
        clock: Exchanges this worker has completed (the update path's SSP
            clock; adopted from the PS when the worker joins a running job).
        min_clock: The slowest live worker's clock, as the last reply said.
        cache_min_clock: The min clock the local values are guaranteed to
            include (SSP's read guarantee: refresh when it would break).
        staleness: The SSP bound (DTSSP moves it); ``inf`` for ASP.
        step: Gradient path: the global step this worker computes next.
        job_step: Gradient path: the newest global step the job has reached.
        versions: Each PS task's version the worker's snapshot holds.
        incarnations: Each PS task's incarnation the worker's state comes
            from (``None``: not heard yet, or to be learnt again).
        leave_requested: A reply said the elastic engine drains this worker.
        job_done: A reply said the job's ``total_batches`` are done.
    """

    num_ps: int
    clock: int = 0
    min_clock: int = 0
    cache_min_clock: int = 0
    staleness: float = math.inf
    step: int = 0
    job_step: int = 0
    versions: list[int] = field(default_factory=list)
    incarnations: list[int | None] = field(default_factory=list)
    leave_requested: bool = False
    job_done: bool = False

    def __post_init__(self):
        self.versions = self.versions or [0] * self.num_ps
        self.incarnations = self.incarnations or [None] * self.num_ps

    def forget_incarnations(self) -> None:
        """The tasks were reset, rolled back or restarted: their incarnations are learnt again from replies."""
        self.incarnations = [None] * self.num_ps

    def note_membership(self, replies: Iterable, worker: int) -> None:
        """Reads the elastic engine's requests (leave, job done) from replies."""
        for reply in replies:
            if reply.leave and not self.leave_requested:
                self.leave_requested = True
                logger.info("worker %d: asked to leave the job", worker)
            if reply.job_done and not self.job_done:
                self.job_done = True
                logger.info("worker %d: the job's batches are done", worker)
