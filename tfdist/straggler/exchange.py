"""What the workers exchange to reach the same verdicts: one float row per worker, packed and checked.

Every worker packs ``[epoch, count, t_1, ..., t_k]`` (``k`` = iterations per
exchange, unused slots NaN); a collective gather stacks the rows; every
worker unpacks the table into per-iteration rows of times, one entry per
worker (``None`` for a worker that took no part). Pure numpy: the gather
itself is the worker group's (:mod:`tfdist.collective`), or
:class:`LocalTimingGroup`'s in a single process.

>>> table = np.stack([pack_times(0, [0.1, 0.2], 2), pack_times(0, [0.3, 0.4], 2)])
>>> unpack_times(table, epoch=0, num_workers=2)
[[0.1, 0.3], [0.2, 0.4]]
>>> unpack_times(table[1:], epoch=0, num_workers=3, members=[2])
[[None, None, 0.3], [None, None, 0.4]]
"""

from __future__ import annotations

import math
from typing import Iterable, Sequence

import numpy as np

__all__ = ["LocalTimingGroup", "TimingsOutOfStep", "pack_times", "unpack_times"]


class TimingsOutOfStep(ValueError):
    """The gathered rows disagree on the epoch or on the iterations per exchange."""


class LocalTimingGroup:
    """The worker group of a single process: a gather returns the process's own row."""

    size = 1
    worker_id = 0
    timeout_s = None

    def all_gather(self, values, timeout_s=None):
        return np.asarray(values, dtype=np.float64)[None, :]


def pack_times(epoch: int, times: Sequence[float], slots: int) -> np.ndarray:
    """This worker's row: ``[epoch, len(times), times..., NaN...]`` of length ``2 + slots``."""
    if len(times) > slots:
        raise ValueError(f"{len(times)} times do not fit in {slots} slots.")
    row = np.full(2 + slots, np.nan)
    row[0], row[1] = epoch, len(times)
    row[2:2 + len(times)] = times
    return row


def unpack_times(
    table: np.ndarray, epoch: int, num_workers: int, members: Iterable[int] | None = None
) -> list[list[float | None]]:
    """Per-iteration times of every worker from the gathered rows (of ``members``, in id order, if given).

    Raises:
        TimingsOutOfStep: a row is of another epoch, or rows carry different numbers of iterations.
    """
    table = np.asarray(table, dtype=np.float64)
    epochs, counts = table[:, 0], table[:, 1]
    if not (np.all(epochs == epoch) and np.all(counts == counts[0])):
        raise TimingsOutOfStep(
            f"Workers are out of step: epochs {epochs.tolist()}, iterations per exchange {counts.tolist()}. "
            "Every worker must run the same number of iterations per epoch (give fit() steps_per_epoch, or "
            "shard the data equally)."
        )
    rows = table[:, 2:2 + int(counts[0])].T  # [iterations, rows]
    if members is not None:
        full = np.full((rows.shape[0], num_workers), np.nan)
        full[:, sorted(members)] = rows
        rows = full
    return [[None if math.isnan(t) else float(t) for t in row] for row in rows]
