"""The job-wide answers of the ``tf.distribute`` contract that every tfdist strategy gives as MultiWorkerMirroredStrategy.

Under MultiWorkerMirroredStrategy a script written from TensorFlow's
tutorials reads ``strategy.cluster_resolver`` (task type, id, cluster spec)
to decide where to write, reduces values with ``strategy.reduce`` across
the job, and reads ``replica_id_in_sync_group``. tfdist's strategies are
between-graph too (one replica per worker process); these helpers give them
the same answers.
"""

from __future__ import annotations

import zlib
from typing import Mapping, Sequence

import tensorflow as tf

__all__ = ["cluster_resolver", "is_chief_task", "reduce_over_axis", "barrier_code"]


def cluster_resolver(jobs: Mapping[str, Sequence[str]], task_type: str, task_id: int):
    """A ``tf.distribute.cluster_resolver.SimpleClusterResolver`` of ``jobs`` for task ``task_type:task_id``."""
    spec = tf.train.ClusterSpec({job: list(addrs) for job, addrs in jobs.items() if addrs})
    return tf.distribute.cluster_resolver.SimpleClusterResolver(spec, task_type=task_type, task_id=int(task_id),
                                                                rpc_layer="grpc")


def is_chief_task(jobs: Mapping[str, Sequence[str]], task_type: str, task_id: int) -> bool:
    """TF's rule: the ``chief`` task, or ``worker:0`` when the job has no chief."""
    if task_type == "chief":
        return True
    return task_type == "worker" and int(task_id) == 0 and not jobs.get("chief")


def reduce_over_axis(reduce_across, reduce_op, value, axis):
    """``Strategy.reduce(reduce_op, value, axis)``: this worker's ``value`` reduced over ``axis``, then across workers.

    ``reduce_across(op, tensor)`` reduces a tensor across the job's workers.
    TF's ``Strategy.reduce`` with an ``axis`` runs a ``strategy.run`` of the
    local reduction, which in tfdist is a step (with its exchange); this
    computes the same without one: a SUM sums over ``axis`` and then across
    the job; a MEAN divides the job's sum by the job's count of elements
    along ``axis`` (the correct denominator when workers' batches differ).
    """
    if isinstance(reduce_op, str):
        reduce_op = tf.distribute.ReduceOp(reduce_op.upper())
    if axis is None:
        return reduce_across(reduce_op, value)
    value = tf.convert_to_tensor(value)
    total = tf.reduce_sum(value, axis=axis)
    if reduce_op == tf.distribute.ReduceOp.SUM:
        return reduce_across(reduce_op, total)
    if reduce_op != tf.distribute.ReduceOp.MEAN:
        raise TypeError(f"Expected `reduce_op` to be a `tf.distribute.ReduceOp`. Received: reduce_op={reduce_op!r}.")
    axes = [axis] if isinstance(axis, int) else list(axis)
    shape = tf.shape(value, out_type=tf.int64)
    count = tf.reduce_prod(tf.gather(shape, [a % value.shape.rank if value.shape.rank else a for a in axes]))
    total = reduce_across(tf.distribute.ReduceOp.SUM, total)
    count = reduce_across(tf.distribute.ReduceOp.SUM, count)
    return total / tf.cast(count, total.dtype)


def barrier_code(name: str) -> int:
    """A number naming a barrier (its CRC-32), exact in a float64, so workers can check they wait at the same one."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"A barrier needs a non-empty name. Received: name={name!r}.")
    return zlib.crc32(name.encode("utf-8"))
