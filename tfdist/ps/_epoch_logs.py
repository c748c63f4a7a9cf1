"""The job's epoch logs on the gradient path: every worker's logs of an epoch, reduced to their mean.

Under BSP and SyncReplicas every worker applies the same aggregate, so a
callback that acts on the epoch logs (``ReduceLROnPlateau(monitor="loss")``,
``EarlyStopping``) must decide alike on every worker, or the workers apply
the shared gradient with different rates and drift apart. Keras reduces the
logs across workers under MultiWorkerMirroredStrategy; here PS task 0 does:
each worker reports its logs at the end of its ``n``-th epoch and gets back
the mean of every entry over the workers that reported it, once as many
workers reported as a step of the mode aggregates (the policy's
``required``: BSP every live worker, SyncReplicas the first ``M``, so a slow
backup never holds the others at an epoch end). A worker that reports after
that (a backup, a straggler) gets the same answer (kept for the last
:data:`EPOCHS_KEPT` epochs), so callbacks decide alike on every worker.

While a worker waits here it sends no gradient: the gradient barrier does not
wait for it (:meth:`EpochLogBarrier.waiting`), so a worker with more batches
in its epoch finishes them instead of waiting for workers that wait for it.

Epochs are counted by each worker from its session's start. A worker whose
count goes back (its process restarted and runs its script again) is told
the epoch the job is at: its report counts for the epoch after its last one
(or, for a worker that joined a running job, the oldest epoch still
collecting reports), and the reply names that epoch so it counts on from
there.

Owns (PS side): the reports of epochs in progress and the answers of the
last epochs; neither is checkpointed (a restarted task gets the reports
again). Every method runs with the store's lock held.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

from tfdist.ps._waits import Wait

__all__ = ["EpochLogBarrier", "EPOCHS_KEPT"]

#: Epochs whose job-wide logs are kept for workers that report late.
EPOCHS_KEPT = 8


class EpochLogBarrier:
    """Collects each epoch's logs from the workers; answers with their mean once every live worker reported."""

    def __init__(self):
        #: epoch -> {worker: logs}
        self.reports: dict[int, dict[int, dict[str, float]]] = {}
        #: epoch -> (the mean logs, the workers they came from)
        self.answers: dict[int, tuple[dict[str, float], tuple[int, ...]]] = {}
        #: worker -> the last epoch it reported
        self.last_reported: dict[int, int] = {}

    def report(self, worker: int, epoch: int, logs: Mapping[str, float], joined: bool = False) -> int:
        """Records a report; returns the epoch it counts for (see the module's docstring).

        ``joined``: the worker joined a running job (it counts its epochs from
        0, the job does not): its first report counts for the epoch the job is at.
        """
        last = self.last_reported.get(worker)
        if last is not None and epoch <= last:  # a new session of this worker: it counts again from 0
            epoch = last + 1
        elif last is None and joined and (self.answers or self.reports):  # new to a running job
            epoch = min(self.reports) if self.reports else max(self.answers) + 1
        self.last_reported[worker] = epoch
        if epoch not in self.answers:
            self.reports.setdefault(epoch, {})[worker] = dict(logs)
        return epoch

    def waiting(self) -> frozenset[int]:
        """Workers waiting for an epoch's answer (they send no gradient meanwhile)."""
        return frozenset(w for reports in self.reports.values() for w in reports)

    def decide(self, epoch: int, required: Callable[[frozenset[int]], int]) -> Wait:
        """Go once the epoch has its answer (completing it once ``required(reporters)`` workers reported)."""
        if epoch in self.answers:
            return Wait(False, "")
        reported = self.reports.get(epoch, {})
        need = required(frozenset(reported))
        if len(reported) < need:
            return Wait(True, f"epoch {epoch}'s logs have come from workers {sorted(reported)}; the job's logs "
                              f"need {need} worker(s)")
        self.answers[epoch] = (_mean(reported), tuple(sorted(reported)))
        del self.reports[epoch]
        for old in [e for e in self.answers if e <= epoch - EPOCHS_KEPT]:
            del self.answers[old]
        for old in [e for e in self.reports if e <= epoch - EPOCHS_KEPT]:
            del self.reports[old]
        return Wait(False, "")

    def answer(self, epoch: int) -> tuple[dict[str, float], tuple[int, ...]]:
        return self.answers[epoch]

    def state(self) -> dict[str, Any]:
        return {"epoch_reports": {e: {w: dict(logs) for w, logs in r.items()} for e, r in self.reports.items()},
                "epoch_answers": {e: (dict(logs), workers) for e, (logs, workers) in self.answers.items()},
                "epoch_last_reported": dict(self.last_reported)}


def _mean(reported: Mapping[int, Mapping[str, float]]) -> dict[str, float]:
    """Each entry's mean over the workers that reported it (workers in id order: the same float sums everywhere)."""
    sums: dict[str, float] = {}
    counts: dict[str, int] = {}
    for worker in sorted(reported):
        for name, value in reported[worker].items():
            sums[name] = sums.get(name, 0.0) + value
            counts[name] = counts.get(name, 0) + 1
    return {name: sums[name] / counts[name] for name in sums}
