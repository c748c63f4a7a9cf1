"""``StepExtended``: what one training (or evaluation) step is, for tfdist's ``tf.distribute`` extendeds.

Keras runs a step with ``strategy.run`` → ``extended.call_for_each_replica``;
the extendeds wrap that call with their begin/end of step. Calls made from
*inside* a step are part of it, not steps of their own: checked on Keras
3.15, ``LossScaleOptimizer`` (``mixed_float16``) calls
``call_for_each_replica`` for its overflow check and its apply from within
the optimizer's merge call.

The job-wide facts of the ``tf.distribute`` contract (this replica's id in
the job, whether this task is the chief, the cluster resolver) are set by the
strategy on the extended (:meth:`StepExtended.set_job`), as
``CollectiveAllReduceExtended`` keeps them for MultiWorkerMirroredStrategy.
"""

from __future__ import annotations

from tensorflow import device as _device

from tfdist._tf_compat import OneDeviceExtended, replica_context

__all__ = ["StepExtended"]


class StepExtended(OneDeviceExtended):
    """One outermost ``call_for_each_replica`` is one step (:meth:`_step`); nested calls go to :meth:`_inside_step`."""

    def __init__(self, container_strategy, device: str = "/cpu:0"):
        super().__init__(container_strategy, device)
        self._in_step = False  # a step is being traced (or run eagerly)
        self._replica_id = 0  # this worker's replica in the job's sync group (tf.distribute's replica_id_in_sync_group)
        self._chief = True
        #: ``tf.distribute.Strategy.cluster_resolver`` reads this attribute.
        self._cluster_resolver = None

    def set_job(self, replica_id: int, chief: bool, cluster_resolver) -> None:
        """This worker's place in the job: its replica id, whether it is the chief, the job's cluster resolver."""
        self._replica_id = int(replica_id)
        self._chief = bool(chief)
        self._cluster_resolver = cluster_resolver

    @property
    def should_checkpoint(self) -> bool:
        """Whether this task should save checkpoints (the chief), as under MultiWorkerMirroredStrategy."""
        return self._chief

    @property
    def should_save_summary(self) -> bool:
        """Whether this task should write summaries (the chief), as under MultiWorkerMirroredStrategy."""
        return self._chief

    def _call_for_each_replica(self, fn, args, kwargs):
        if self._in_step:
            return self._inside_step(fn, args, kwargs)
        self._in_step = True
        try:
            return self._step(fn, args, kwargs)
        finally:
            self._in_step = False

    def _on_replica(self, fn, args, kwargs):
        """``fn`` on this worker's one replica, as TF's one-device strategy runs it (with the job-wide replica id)."""
        with _device(self._device), replica_context(self._container_strategy(), self._replica_id):
            return fn(*args, **kwargs)

    def _inside_step(self, fn, args, kwargs):
        """A call from inside the step: runs as part of it."""
        return self._on_replica(fn, args, kwargs)

    def _step(self, fn, args, kwargs):
        raise NotImplementedError
