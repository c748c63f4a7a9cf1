"""Queue that dequeues in random order (TF1 ``tf.queue.RandomShuffleQueue`` semantics)."""

from __future__ import annotations

import numpy as np

from tfdist.data.queue_base import QueueBase
from tfdist.errors import ConfigError

__all__ = ["RandomShuffleQueue"]


class RandomShuffleQueue(QueueBase):
    """A bounded queue that dequeues a uniformly random element each time.

    While the queue is open, a dequeue waits until ``min_after_dequeue``
    elements would remain after it, which guarantees a minimum level of
    mixing; once closed, the rest drains. Each dequeued element is drawn
    uniformly from those held, so the order depends on ``seed`` and on the
    order elements were enqueued (with several producer threads, that order
    is not deterministic).

    Args:
        capacity: the most elements held.
        min_after_dequeue: elements kept back while open; less than
            ``capacity``. Defaults to 0.
        dtypes: one dtype or a list. Defaults to ``None`` (from the first element).
        shapes: per-example shapes. Defaults to ``None`` (from the first element).
        names: component names (dict elements). Defaults to ``None``.
        seed: seed of the shuffle. Defaults to ``None`` (fresh entropy).
        name: for messages. Defaults to "RandomShuffleQueue".

    Example:
        >>> q = RandomShuffleQueue(capacity=100, min_after_dequeue=10,
        ...                        dtypes=["int64"], shapes=[[]], seed=0)
        >>> q.enqueue_many((np.arange(50),)); q.close()
        >>> sorted(q.dequeue_up_to(100)[0].tolist()) == list(range(50))
        True
    """

    def __init__(
        self,
        capacity,
        min_after_dequeue=0,
        dtypes=None,
        shapes=None,
        names=None,
        seed=None,
        name=None,
    ):
        super().__init__(capacity, dtypes, shapes, names, name)
        if not isinstance(min_after_dequeue, (int, np.integer)) or not 0 <= min_after_dequeue < capacity:
            raise ConfigError(
                "min_after_dequeue must be an integer in [0, capacity). Received: "
                f"min_after_dequeue={min_after_dequeue!r}, capacity={capacity!r}."
            )
        self._min_after_dequeue = int(min_after_dequeue)
        self._seed = seed
        self._rng = np.random.default_rng(seed)
        self._rows: list = []

    def _fresh_copy(self, seed_offset: int) -> "RandomShuffleQueue":
        spec = self._spec
        seed = None if self._seed is None else self._seed + seed_offset
        if spec is None:
            return type(self)(self._capacity, self._min_after_dequeue, seed=seed, name=self._name)
        return type(self)(
            self._capacity, self._min_after_dequeue, *spec.declaration(), seed=seed, name=self._name
        )

    @property
    def min_after_dequeue(self) -> int:
        return self._min_after_dequeue

    def _store_len(self) -> int:
        return len(self._rows)

    def _available(self) -> int:
        if self._closed:
            return len(self._rows)
        return max(0, len(self._rows) - self._min_after_dequeue)

    def _store_put(self, rows: list) -> None:
        self._rows.extend(rows)

    def _store_take(self, n: int) -> list:
        rows = self._rows
        out = []
        # Swap a uniformly drawn element with the last one and pop it: O(1) each.
        for u in self._rng.random(n):
            i = int(u * len(rows))
            rows[i], rows[-1] = rows[-1], rows[i]
            out.append(rows.pop())
        return out
