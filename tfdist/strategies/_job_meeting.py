"""``strategy.barrier`` and the gradient path's ``strategy.reduce`` for the parameter-server strategies.

Both meet the job's workers on PS task 0 (``tfdist.ps._rendezvous``): every
worker's ``n``-th call is rendezvous ``n`` (barriers and reductions share
the count, as collectives do under MultiWorkerMirroredStrategy). The meeting
has a connection of its own: the worker's session fixes the variable
placement when it starts, and a barrier may come before the model exists.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from tfdist.strategies._contract import barrier_code

__all__ = ["JobMeeting"]


class JobMeeting:
    """A worker's rendezvous with the other workers of its job, on PS task 0."""

    def __init__(self, runtime):
        self._runtime = runtime
        self._seq = 0
        self._client = None

    def meet(self, name: str, values=(), timeout_s: float | None = None):
        """This worker's next rendezvous: ``(the element-wise sums of every worker's values, the workers)``."""
        from tfdist.ps.protocol import RendezvousRequest

        runtime = self._runtime
        if runtime.config.cluster.num_workers <= 1:
            return tuple(values), (max(runtime.worker_id, 0),)
        seq, self._seq = self._seq, self._seq + 1
        if self._client is None:
            from tfdist.ps.client import PSClient

            config = runtime.config
            self._client = PSClient(config.cluster.ps[:1], runtime.token, rpc_timeout_s=config.ps.rpc_timeout_s,
                                    tls_ca=config.security.tls_ca)
        reply = self._client.request(0, RendezvousRequest(runtime.worker_id, seq, name, tuple(values)),
                                     timeout=timeout_s)
        return reply.sums, reply.workers

    def barrier(self, name: str, timeout_s: float | None = None) -> None:
        """Waits until every live worker reached barrier ``name`` (an evaluator does not take part)."""
        barrier_code(name)  # validates the name
        if self._runtime.worker_id >= 0:
            self.meet(f"barrier:{name}", (), timeout_s)

    def reduce_across(self, reduce_op, value):
        """``value`` summed (MEAN: averaged) over the job's workers on the gradient path; else this worker's."""
        runtime = self._runtime
        value = tf.convert_to_tensor(value)
        if runtime.num_replicas <= 1 or runtime.worker_id < 0:
            return value
        if not (value.dtype.is_floating or value.dtype.is_integer):
            raise TypeError(f"reduce reduces numbers. Received: a tensor of dtype {value.dtype.name}. Cast it "
                            "first (e.g. tf.cast(value, tf.float32)).")
        mean = reduce_op == tf.distribute.ReduceOp.MEAN

        def meet(flat):
            sums, workers = self.meet("reduce", [float(v) for v in np.ravel(flat.numpy())])
            out = np.asarray(sums, dtype=np.float64) / (len(workers) if mean else 1)
            return out.astype(flat.dtype.as_numpy_dtype)

        out = tf.py_function(meet, [tf.reshape(value, [-1])], value.dtype, name="tfdist_reduce")
        return tf.ensure_shape(tf.reshape(out, tf.shape(value)), value.shape)

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None
