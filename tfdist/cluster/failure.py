"""What a job does when a training worker dies: one pure decision per death (``launch.on_worker_failure``).

The launcher's watch loop (:meth:`tfdist.cluster.local.LocalJob.wait`) and the
elastic engine (:class:`tfdist.elastic.ElasticEngine`) both ask
:func:`decide_worker_failure` and carry the answer out: on ``CONTINUE`` they
log a warning and tell the parameter servers the worker is gone (barriers
stop waiting for it at once, not after ``ps.heartbeat_timeout_s``); on
``STOP`` they stop every task and name the worker and the reason.

The rule under ``"auto"`` (the default), by consistency mode:

* ``async``, ``ssp``, ``dtssp``: any worker but the chief may go. ASP never
  waits for another worker; SSP's bound counts only live workers.
* ``bsp``: any worker but the chief may go: the barrier shrinks to the live
  workers (``tfdist.consistency.BSPPolicy``).
* ``sync_replicas``: a worker may go while at least ``replicas_to_aggregate``
  (M) workers remain; with fewer, a step could no longer aggregate the M
  gradients the job asked for, so the job stops.
* an elastic job (``elastic:`` section): any worker, worker 0 included: the
  engine replaces it or goes on with fewer.
* a job without parameter servers (all-reduce): none may go; every
  collective needs every worker.

The chief (worker 0: the ``chief`` task, else ``worker:0``) initialises the
parameter servers and its exit is the job's result, so outside elastic jobs
its death always stops the job. ``"continue"`` lets any other worker go
whatever the mode; ``"stop"`` stops the job for any failed worker.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Iterable

from tfdist.config import JobConfig

__all__ = ["FailureAction", "FailureDecision", "decide_worker_failure"]

class FailureAction(str, enum.Enum):
    """What to do about a worker that died."""

    CONTINUE = "continue"  # log it, tell the parameter servers, go on without it
    STOP = "stop"  # stop every task; the job fails naming the worker


@dataclass(frozen=True)
class FailureDecision:
    """The verdict on one worker's death and why (the reason ends up in the log or the error)."""

    action: FailureAction
    reason: str

    @property
    def stop(self) -> bool:
        return self.action is FailureAction.STOP


def decide_worker_failure(config: JobConfig, worker: int, failed: Iterable[int] = ()) -> FailureDecision:
    """Decides whether the job goes on without training worker ``worker``.

    Args:
        config: The job (``launch.on_worker_failure``, ``strategy``, ``cluster``, ``elastic``).
        worker: Global worker id of the task that exited non-zero (the chief is 0).
        failed: Worker ids that already failed and were left out.

    Returns:
        A :class:`FailureDecision`; pure: same arguments, same answer.

    Example:

    >>> cfg = JobConfig.from_dict({"cluster": {"ps": 1, "worker": 3}, "strategy": {"consistency": "async"}})
    >>> decide_worker_failure(cfg, 2).action.value
    'continue'
    >>> decide_worker_failure(cfg, 0).action.value
    'stop'
    """
    policy = config.launch.on_worker_failure
    setting = f"launch.on_worker_failure={policy}"
    elastic = config.elastic.enabled and policy != "stop"
    if worker == 0 and not elastic:
        return FailureDecision(FailureAction.STOP, f"it is the chief (worker 0), which initialises the parameter "
                                                   f"servers and whose result is the job's ({setting})")
    if policy == "stop":
        return FailureDecision(FailureAction.STOP, f"{setting}: any failed task stops the job")
    if elastic:
        return FailureDecision(FailureAction.CONTINUE,
                               f"{setting}: the elastic engine replaces the worker or goes on with fewer")
    if policy == "continue":
        return FailureDecision(FailureAction.CONTINUE, f"{setting}: the job goes on without any worker but the chief")
    if not config.cluster.ps:
        return FailureDecision(FailureAction.STOP, f"the cluster has no parameter server (an all-reduce job: every "
                                                   f"collective needs every worker; {setting})")
    from tfdist.consistency import MODES

    mode = MODES[config.strategy.consistency]
    total = config.cluster.num_workers
    remaining = total - len(set(failed) | {worker})
    ok, why = mode.can_lose({"replicas_to_aggregate": config.strategy.replicas_to_aggregate}, total, remaining)
    if ok:
        return FailureDecision(FailureAction.CONTINUE, f"{setting}: {why}")
    return FailureDecision(
        FailureAction.STOP,
        f"{why} ({setting}; lower strategy.replicas_to_aggregate to keep going with fewer workers)",
    )
