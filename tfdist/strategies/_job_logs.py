"""Under BSP and SyncReplicas the epoch logs every callback sees are the job's, as under MultiWorkerMirroredStrategy.

Every worker of a synchronous job applies the same aggregate with its own
optimizer, so a callback that acts on the epoch logs — ``ReduceLROnPlateau``
(``monitor="loss"``), ``EarlyStopping``, a ``LearningRateScheduler`` that
reads them — must decide alike on every worker. Keras passes each worker
its own logs; under MultiWorkerMirroredStrategy its metrics are reduced
across workers, so every worker sees the same numbers. Here
:func:`install_job_epoch_logs` wraps ``keras.callbacks.CallbackList.on_epoch_end``:
before any callback runs, a gradient-path strategy of a multi-worker job
replaces each numeric entry by its mean over the job's workers (PS task 0
collects them: :mod:`tfdist.ps._epoch_logs`); the ``ps_*`` statistics stay
the worker's own. Other strategies, and a lone worker, are left as they are.

If the exchange fails (a wait that ran out, a lost PS task), the worker goes
on with its own logs and a warning says so.
"""

from __future__ import annotations

import logging
import math
from typing import Any, Mapping

import keras

from tfdist.errors import PSUnavailableError, PSWaitTimeoutError

__all__ = ["install_job_epoch_logs", "job_epoch_logs"]

logger = logging.getLogger(__name__)

_original_on_epoch_end = None


def job_epoch_logs(runtime, logs: Mapping[str, Any], own: tuple[str, ...]) -> dict[str, Any]:
    """``logs`` with every numeric entry not in ``own`` replaced by the job's mean (the runtime's session)."""
    session = runtime.session
    if session is None or runtime.config.starting_workers <= 1 or runtime.lifecycle.reader:
        return dict(logs)
    shared = {}
    for name, value in logs.items():
        try:
            number = float(value)
        except (TypeError, ValueError):
            continue
        if name not in own and math.isfinite(number):
            shared[name] = number
    epoch = runtime.epochs_ended
    runtime.epochs_ended += 1
    try:
        counted, job = session.job_epoch_logs(epoch, shared)
        runtime.epochs_ended = counted + 1  # a restarted worker counts on from the job's epoch
    except (PSWaitTimeoutError, PSUnavailableError) as e:
        logger.warning("worker %d: epoch %d's logs stay this worker's own (the job's could not be gathered: %s); "
                       "callbacks that act on them may decide differently on other workers", runtime.worker_id,
                       epoch, e)
        return dict(logs)
    return {**logs, **job}


def install_job_epoch_logs() -> None:
    """Wraps ``CallbackList.on_epoch_end`` once (idempotent): the strategy's hook first, then the callbacks."""
    global _original_on_epoch_end
    if _original_on_epoch_end is not None:
        return
    _original_on_epoch_end = keras.callbacks.CallbackList.on_epoch_end

    def on_epoch_end(self, epoch, logs=None):
        model = getattr(self, "model", None)
        strategy = getattr(model, "distribute_strategy", None) if model is not None else None
        hook = getattr(getattr(getattr(strategy, "extended", None), "_runtime", None), "job_epoch_logs", None)
        if hook is not None and logs:
            logs = hook(logs)
        return _original_on_epoch_end(self, epoch, logs)

    keras.callbacks.CallbackList.on_epoch_end = on_epoch_end
