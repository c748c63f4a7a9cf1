"""What a job does when a training worker dies: one pure decision per death (``launch.on_worker_failure``).

(:func:`decide_chief_restart` decides, before that, whether a dead chief is
started again: ``launch.restart_chief``.)

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

__all__ = ["ENDED_BY_ITSELF_EXIT_CODES", "FailureAction", "FailureDecision", "RestartDecision", "decide_chief_restart",
           "decide_worker_failure"]

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


@dataclass(frozen=True)
class RestartDecision:
    """Whether a dead chief is started again, and why (the reason ends up in the log or the error)."""

    restart: bool
    reason: str


#: Exit codes from 128 up are how a shell (or a container runtime) reports a process killed by signal code-128.
_SIGNAL_EXIT_CODES = range(128, 256)

#: Exit codes of a process that ended by itself with an error (a Python exception: 1; ``sys.exit(n)``,
#: ``os._exit(n)``; a ``ConfigError``: 78). A chief that exits with one is not started again
#: (:func:`decide_chief_restart`); the Kubernetes manifests fail the chief's Job on them (``podFailurePolicy``).
ENDED_BY_ITSELF_EXIT_CODES = range(1, 128)


def decide_chief_restart(config: JobConfig, exit_code: int, said_done: bool, restarts: int) -> RestartDecision:
    """Decides whether the launcher starts a chief that exited non-zero again (``launch.restart_chief``).

    The rule (close to Kubeflow's ``restartPolicy: ExitCode``, which restarts
    only exit codes 130, 137, 138 and 143 and counts every other one, e.g.
    SIGSEGV's 139, as permanent) is: a chief that was *killed* (a signal: SIGKILL, the OOM killer, a crash such as
    SIGSEGV or SIGABRT; a negative exit code, or 128 + the signal from a shell)
    is started again; its script runs from the start and joins the running
    job. A chief that *ended by itself* with an error (a Python exception
    reaching the top — exit 1 —, ``sys.exit(n)``, ``os._exit(n)``: codes 1 to
    127) is not: its script ran into that error and would run into it again
    (with ``launch.max_restarts`` tries, a bug would cost that many re-runs
    before the job reports it); its error is the job's result. Neither is a
    chief that said it was done (it finished training and failed on its way
    out, e.g. the exit watchdog), nor one past ``launch.max_restarts``.

    Args:
        config: The job (``launch.restart_chief``, ``launch.max_restarts``,
            ``cluster.ps``, ``elastic``).
        exit_code: The process's exit status (negative: killed by that signal).
        said_done: Whether the parameter servers report the chief done.
        restarts: Restarts of the chief so far.

    Returns:
        A :class:`RestartDecision`; pure: same arguments, same answer.

    Example:

    >>> cfg = JobConfig.from_dict({"cluster": {"ps": 1, "worker": 2}})
    >>> decide_chief_restart(cfg, -9, said_done=False, restarts=0).restart
    True
    >>> decide_chief_restart(cfg, 1, said_done=False, restarts=0).restart
    False
    """
    launch = config.launch
    if not launch.restart_chief:
        return RestartDecision(False, "launch.restart_chief is false")
    if not config.cluster.ps:
        return RestartDecision(False, "a job without parameter servers has no running job a new chief could join")
    if config.elastic.enabled:
        return RestartDecision(False, "the elastic engine handles an elastic job's workers")
    if said_done:
        return RestartDecision(False, "it had finished its training (the parameter servers report it done) and "
                                      "failed on its way out")
    killed = exit_code < 0 or exit_code in _SIGNAL_EXIT_CODES
    if not killed:
        return RestartDecision(False, f"it ended by itself with exit code {exit_code} (a Python exception, "
                                      "sys.exit or os._exit): its script would run into the same error again. "
                                      "launch.restart_chief restarts a chief that was killed (a signal: SIGKILL, "
                                      "the OOM killer, a crash); fix the error and launch again")
    if restarts >= launch.max_restarts:
        return RestartDecision(False, f"it was restarted {restarts} time(s) already (launch.max_restarts="
                                      f"{launch.max_restarts})")
    return RestartDecision(True, "it was killed; it runs the script again and joins the running job with the "
                                 "parameter servers' values")
