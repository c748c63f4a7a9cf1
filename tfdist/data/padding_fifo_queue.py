"""FIFO queue that pads variable-size components in a batch (TF1 ``PaddingFIFOQueue``)."""

from __future__ import annotations

import numpy as np

from tfdist.data.fifo_queue import FIFOQueue
from tfdist.errors import ConfigError

__all__ = ["PaddingFIFOQueue"]


class PaddingFIFOQueue(FIFOQueue):
    """A FIFO queue whose ``dequeue_many``/``dequeue_up_to`` pad to the batch maximum.

    Shapes must be declared (rank fixed); a ``None`` dimension may vary per
    element and is padded with zeros (empty bytes for strings) to the
    largest size in the batch, as TF1's ``PaddingFIFOQueue`` did.

    Args:
        capacity: the most elements held.
        dtypes: one dtype or a list.
        shapes: per-example shapes with ``None`` for variable dimensions;
            required.
        names: component names (dict elements). Defaults to ``None``.
        name: for messages. Defaults to "PaddingFIFOQueue".

    Example:
        >>> q = PaddingFIFOQueue(8, ["int32"], shapes=[[None]])
        >>> q.enqueue(([1, 2, 3],)); q.enqueue(([4],))
        >>> q.dequeue_many(2)[0].tolist()
        [[1, 2, 3], [4, 0, 0]]
    """

    _block_batches = 1  # pads per dequeue: as_dataset takes one batch at a time

    def __init__(self, capacity, dtypes=None, shapes=None, names=None, name=None):
        super().__init__(capacity, dtypes, shapes, names, name)
        if self._spec is None or any(s is None for s in self._spec.shapes):
            raise ConfigError(
                "PaddingFIFOQueue needs a shape (rank) for every component; use "
                f"None for the dimensions that vary. Received: dtypes={dtypes!r}, shapes={shapes!r}."
            )

    def _stack(self, rows: list) -> list:
        out = []
        for j, dtype in enumerate(self._spec.dtypes):
            parts = [row[j] for row in rows]
            target = tuple(np.max([p.shape for p in parts], axis=0)) if parts[0].ndim else ()
            fill = b"" if dtype == object else 0
            batch = np.full((len(parts),) + target, fill, dtype=dtype)
            for i, p in enumerate(parts):
                batch[(i,) + tuple(slice(0, d) for d in p.shape)] = p
            out.append(batch)
        return out
