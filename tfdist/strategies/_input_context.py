"""The ``tf.distribute.InputContext`` that tfdist strategies give ``distribute_datasets_from_function``."""

from __future__ import annotations

from typing import Callable

import tensorflow as tf

__all__ = ["worker_input_context", "with_input_context"]


def worker_input_context(num_workers: int, worker_id: int, num_replicas_in_sync: int) -> tf.distribute.InputContext:
    """One input pipeline per training worker, as under ``MultiWorkerMirroredStrategy``.

    Every training worker is a process of its own and reads its own
    pipeline: ``num_input_pipelines`` is the number of training workers
    (the chief included) and ``input_pipeline_id`` this worker's id, so
    ``ds.shard(ctx.num_input_pipelines, ctx.input_pipeline_id)`` gives each
    worker a distinct shard. ``num_replicas_in_sync`` is the strategy's, the
    number Keras divides each loss by, so
    ``ctx.get_per_replica_batch_size(global_batch)`` is the batch one replica
    computes a gradient on. A task that does not train (``worker_id < 0``,
    an evaluator) reads everything: one pipeline.

    Args:
        num_workers: Training workers of the job (worker slots in an elastic job).
        worker_id: This worker's id (the chief is 0); negative on an evaluator.
        num_replicas_in_sync: ``strategy.num_replicas_in_sync``.
    """
    if worker_id < 0:
        return tf.distribute.InputContext(1, 0, num_replicas_in_sync)
    return tf.distribute.InputContext(num_workers, worker_id, num_replicas_in_sync)


def with_input_context(dataset_fn: Callable, context: tf.distribute.InputContext) -> Callable:
    """``dataset_fn`` called with ``context`` whatever context TF passes (OneDeviceExtended's says 1 of 1)."""

    def dataset_fn_for_this_worker(_):
        return dataset_fn(context)

    return dataset_fn_for_this_worker
