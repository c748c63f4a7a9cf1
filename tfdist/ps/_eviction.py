"""Which rows of a dynamic table eviction frees, and choosing them ahead on a thread (:mod:`tfdist.ps.dynamic`)."""

from __future__ import annotations

import threading

import numpy as np

__all__ = ["Ahead", "eviction_order"]


def eviction_order(last: np.ndarray, count: np.ndarray, live: np.ndarray, updates: int, eviction: str,
                   k: int) -> np.ndarray:
    """The ``k`` slots (of ``live`` ones) first to go, in order: least recently (``lru``) or least often
    (``lfu``, ties by recency) updated. Slots whose score is set to inf beforehand never go."""
    score = last.astype(np.float64)
    if eviction == "lfu":  # ties broken by recency: last / (updates + 1) < 1
        score = count + score / (updates + 1)
    score[~live] = np.inf
    k = min(k, int(np.isfinite(score).sum()))
    if k <= 0:
        return np.zeros(0, np.int64)
    part = np.argpartition(score, k - 1)[:k]
    return part[np.argsort(score[part], kind="stable")].astype(np.int64)


class Ahead:
    """Eviction victims chosen on a thread from a copy of a table's row metadata (see :mod:`tfdist.ps.dynamic`).

    ``slots`` (first to go first) and the recency ``last`` each had in the copy are set once ``ready``.
    """

    def __init__(self, last, count, live, updates: int, eviction: str, k: int):
        self.slots = self.last = np.zeros(0, np.int64)
        self.ready = threading.Event()
        self._thread = threading.Thread(target=self._choose, args=(last, count, live, updates, eviction, k),
                                        name="tfdist-evict-ahead", daemon=True)
        self._thread.start()

    def _choose(self, last, count, live, updates, eviction, k) -> None:
        try:
            slots = eviction_order(last, count, live, updates, eviction, k)
            self.slots, self.last = slots, last[slots]
        finally:
            self.ready.set()

    def wait(self, timeout: float | None = None) -> bool:
        return self.ready.wait(timeout)
