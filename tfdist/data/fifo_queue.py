"""First-in first-out queue (TF1 ``tf.queue.FIFOQueue`` semantics)."""

from __future__ import annotations

import collections

from tfdist.data.queue_base import QueueBase

__all__ = ["FIFOQueue"]


class FIFOQueue(QueueBase):
    """A bounded queue that dequeues elements in the order they were enqueued.

    See :class:`~tfdist.data.QueueBase` for the arguments and methods.

    Example:
        >>> q = FIFOQueue(capacity=8, dtypes=["float32", "int64"], shapes=[[2], []])
        >>> q.enqueue(([1.0, 2.0], 7))
        >>> q.enqueue_many(([[3.0, 4.0], [5.0, 6.0]], [8, 9]))
        >>> x, y = q.dequeue_many(2)
        >>> y.tolist()
        [7, 8]
    """

    def __init__(self, capacity, dtypes=None, shapes=None, names=None, name=None):
        super().__init__(capacity, dtypes, shapes, names, name)
        self._rows: collections.deque = collections.deque()

    def _fresh_copy(self, seed_offset: int) -> "FIFOQueue":
        spec = self._spec
        if spec is None:
            return type(self)(self._capacity, name=self._name)
        return type(self)(self._capacity, *spec.declaration(), name=self._name)

    def _store_len(self) -> int:
        return len(self._rows)

    def _store_put(self, rows: list) -> None:
        self._rows.extend(rows)

    def _store_take(self, n: int) -> list:
        popleft = self._rows.popleft
        return [popleft() for _ in range(n)]
