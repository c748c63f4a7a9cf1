"""``ElasticCallback``: lets a worker of an elastic job stop when the job asks it to."""

from __future__ import annotations

import logging

import keras

__all__ = ["ElasticCallback"]

logger = logging.getLogger(__name__)


class ElasticCallback(keras.callbacks.Callback):
    """Stops ``fit`` when the autoscaling engine drains this worker or the job's work is done.

    In an elastic job (``elastic:`` in the config) workers come and go while
    ``model.fit`` runs. After every training batch this callback asks the
    strategy (``strategy.stop_reason``) whether the parameter servers said
    this worker should leave (scale-down, or its replacement has joined) or
    that the job's ``elastic.total_batches`` are applied; then it sets
    ``model.stop_training`` and, when ``fit`` returns, leaves the job
    gracefully so the others stop waiting for it. Evaluate and predict keep
    working afterwards.

    Example:

    ```python
    model.fit(train_ds, epochs=100, callbacks=[tfdist.callbacks.ElasticCallback()])
    ```

    Outside an elastic job (or under a strategy without ``stop_reason``) it
    does nothing.

    Attributes:
        reason: ``"leave"``, ``"job_done"`` or ``None`` after ``fit``.
    """

    def __init__(self):
        super().__init__()
        self.reason: str | None = None

    def _strategy(self):
        strategy = getattr(self.model, "distribute_strategy", None)
        return strategy if hasattr(strategy, "stop_reason") else None

    def on_train_batch_end(self, batch, logs=None):
        strategy = self._strategy()
        if strategy is None or self.reason is not None:
            return
        reason = strategy.stop_reason
        if reason is not None:
            self.reason = reason
            logger.info("stopping training: %s", "asked to leave the job" if reason == "leave"
                        else "the job's batches are done")
            self.model.stop_training = True

    def on_train_end(self, logs=None):
        strategy = self._strategy()
        if strategy is not None and self.reason is not None:
            strategy.leave()
