"""``LeaveOnTrainEnd``: a worker whose ``fit`` is over stops holding the others back."""

from __future__ import annotations

import keras

__all__ = ["LeaveOnTrainEnd"]


class LeaveOnTrainEnd(keras.callbacks.Callback):
    """Takes this worker out of the job's barriers when its ``fit`` ends.

    Keras 3 tells a ``tf.distribute`` strategy nothing when ``fit`` returns,
    so by default a worker stays a member of the job until its process ends
    (then it says ``Done``). That is right when every worker trains the same
    number of steps. A worker that stops early — ``EarlyStopping``, a step
    budget, an exception handled by the script — and then keeps its process
    alive would make BSP, SyncReplicas and SSP barriers wait for it until
    their calls time out. With this callback, ``fit``'s end calls
    ``strategy.leave()``: the other workers stop waiting for it at once (the
    PS tasks get a ``Leave``, or ``Done`` in an elastic job), this worker can
    still evaluate and predict, and a later ``fit`` takes it back into the job.

    Example:

    ```python
    model.fit(ds, epochs=50, callbacks=[
        keras.callbacks.EarlyStopping(patience=3),
        tfdist.callbacks.LeaveOnTrainEnd(),
    ])
    ```

    Under a strategy without ``leave`` (not a tfdist parameter-server
    strategy) it does nothing.
    """

    def on_train_end(self, logs=None):
        strategy = getattr(self.model, "distribute_strategy", None)
        leave = getattr(strategy, "leave", None)
        if callable(leave):
            leave()
