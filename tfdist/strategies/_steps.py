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

import tensorflow as tf

from tfdist._tf_compat import (OneDeviceExtended, called_from_keras_trainer, host_distributed_dataset,
                               host_distributed_datasets_from_function, replica_context,
                               sharded_distributed_dataset)

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
        self._input_pipelines = (1, 0)  # (training workers, this worker's pipeline)

    def set_job(self, replica_id: int, chief: bool, cluster_resolver, input_pipelines: tuple[int, int] = (1, 0)) -> None:
        """This worker's place in the job: its replica id, whether it is the chief, the job's cluster resolver,
        and ``(number of input pipelines, this worker's)`` (one per training worker)."""
        self._replica_id = int(replica_id)
        self._chief = bool(chief)
        self._cluster_resolver = cluster_resolver
        self._input_pipelines = (int(input_pipelines[0]), int(input_pipelines[1]))

    def _experimental_distribute_dataset(self, dataset, options):
        """``dataset`` as the script built it; sharded and rebatched as MultiWorkerMirroredStrategy does when the
        script calls this itself on a dataset whose ``auto_shard_policy`` it set (not ``AUTO``).

        tfdist's workers feed their own data (the PS modes let fast workers
        run more batches, so a job's input is not one global batch split N
        ways): with the default policy (``AUTO``), and whenever Keras's
        ``fit``/``evaluate``/``predict`` call this (Keras marks numpy input
        ``DATA``), nothing is sharded. A script that calls
        ``strategy.experimental_distribute_dataset(ds)`` with ``FILE``,
        ``DATA`` or ``OFF`` set in
        ``ds.options().experimental_distribute.auto_shard_policy`` gets what
        MultiWorkerMirroredStrategy would give this worker: its share of each
        global batch (``batch / num_replicas_in_sync`` per replica) and its
        shard by file or by data (none with ``OFF``); it may pass the result
        to ``fit``.
        """
        pipelines, pipeline = self._input_pipelines
        policy = dataset.options().experimental_distribute.auto_shard_policy
        if pipelines <= 1 or policy == tf.data.experimental.AutoShardPolicy.AUTO or called_from_keras_trainer():
            return host_distributed_dataset(self, dataset, options)
        replicas = self._num_replicas_in_sync
        if replicas > 1 and replicas % pipelines:
            raise ValueError(
                f"{type(self._container_strategy()).__name__} cannot split a global batch across {pipelines} "
                f"workers into {replicas} replicas' batches (num_replicas_in_sync must be a multiple of the "
                f"workers). Received: auto_shard_policy={policy.name}. Leave the policy at AUTO and shard "
                "with distribute_datasets_from_function instead.")
        context = tf.distribute.InputContext(pipelines, pipeline, replicas)
        return sharded_distributed_dataset(self, dataset, options, context)

    def _distribute_datasets_from_function(self, dataset_fn, options):
        """As TF's one-device strategy, iterated with a plain ``tf.data`` iterator on a CPU worker
        (``_tf_compat.host_distributed_datasets_from_function``: ~2 ms per epoch's iterator, not ~80)."""
        return host_distributed_datasets_from_function(self, dataset_fn, options)

    def _experimental_distribute_values_from_function(self, value_fn):
        """``value_fn`` of this worker's one replica, with its job-wide ``replica_id_in_sync_group``.

        As under MultiWorkerMirroredStrategy, the ``ValueContext`` says which
        replica of the job's sync group this is (TF's one-device base would say
        0 of 1 on every worker).
        """
        from tensorflow.python.distribute import distribute_lib

        return value_fn(distribute_lib.ValueContext(self._replica_id, self._num_replicas_in_sync))

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
        with tf.device(self._device), replica_context(self._container_strategy(), self._replica_id):
            return fn(*args, **kwargs)

    def _inside_step(self, fn, args, kwargs):
        """A call from inside the step: runs as part of it."""
        return self._on_replica(fn, args, kwargs)

    def _step(self, fn, args, kwargs):
        raise NotImplementedError
