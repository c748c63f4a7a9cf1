"""tfdist.data: queue-fed input pipelines (TF1 queue semantics on tf.data).

Local: ``FIFOQueue``, ``RandomShuffleQueue``, ``PaddingFIFOQueue`` filled by a
``QueueRunner`` under a ``Coordinator``; ``queue.as_dataset(batch_size)`` is a
``tf.data.Dataset``. Across workers: a ``SharedQueueServer`` hosted by one task
and a ``SharedQueue`` client per worker.

Names are imported lazily: importing ``tfdist.data`` loads neither TensorFlow
nor gRPC (the shared-queue server runs without TensorFlow).
"""

from __future__ import annotations

from tfdist._lazy import lazy_names

_LAZY = {
    "QueueBase": "tfdist.data.queue_base",
    "FIFOQueue": "tfdist.data.fifo_queue",
    "RandomShuffleQueue": "tfdist.data.random_shuffle_queue",
    "PaddingFIFOQueue": "tfdist.data.padding_fifo_queue",
    "ElementSpec": "tfdist.data.element_spec",
    "Coordinator": "tfdist.data.coordinator",
    "QueueRunner": "tfdist.data.queue_runner",
    "ProducerProcessError": "tfdist.data.queue_runner",
    "SharedQueue": "tfdist.data.shared_queue",
    "SharedQueueServer": "tfdist.data.queue_service",
    "QueueClosedError": "tfdist.data.errors",
    "QueueTimeoutError": "tfdist.data.errors",
    "SharedQueueError": "tfdist.data.errors",
    "SharedQueueUnavailableError": "tfdist.data.errors",
}

__all__ = sorted(_LAZY)
__getattr__, __dir__ = lazy_names(__name__, _LAZY, globals())
