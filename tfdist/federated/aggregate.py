"""Aggregation rules as pure numpy functions over lists of layer arrays.

Every function takes ``updates``: one entry per client, each a list of numpy
arrays (one per model variable, all clients with the same shapes), and returns
one list of arrays. They never modify their inputs.

References:
    McMahan et al., "Communication-Efficient Learning of Deep Networks from
    Decentralized Data", AISTATS 2017 (weighted average, FedAvg).
    Yin et al., "Byzantine-Robust Distributed Learning: Towards Optimal
    Statistical Rates", ICML 2018 (coordinate-wise median and trimmed mean).
    Blanchard et al., "Machine Learning with Adversaries: Byzantine Tolerant
    Gradient Descent", NeurIPS 2017 (Krum).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from tfdist.errors import ConfigError

__all__ = [
    "Weights",
    "weighted_average",
    "coordinate_median",
    "trimmed_mean",
    "krum",
    "add",
    "subtract",
    "scale",
    "flatten",
    "unflatten",
    "staleness_discount",
]

Weights = list  # list[np.ndarray]: one array per model variable


def _check_updates(updates: Sequence[Sequence[np.ndarray]]) -> None:
    if len(updates) == 0:
        raise ValueError("Cannot aggregate an empty list of updates. Received: updates=[]")
    n_layers = len(updates[0])
    for i, update in enumerate(updates):
        if len(update) != n_layers:
            raise ValueError(
                "All updates must have the same number of arrays. "
                f"Received: len(updates[0])={n_layers}, len(updates[{i}])={len(update)}"
            )


def weighted_average(
    updates: Sequence[Sequence[np.ndarray]], weights: Sequence[float] | None = None
) -> Weights:
    """Weighted mean of the updates, layer by layer (FedAvg's rule).

    Args:
        updates: one list of arrays per client.
        weights: one non-negative weight per client (FedAvg uses the number of
            training examples). Defaults to equal weights.

    Returns:
        One list of arrays, ``sum_i w_i u_i / sum_i w_i``.

    Example:
        >>> weighted_average([[np.array([1.0])], [np.array([3.0])]], [1, 3])
        [array([2.5])]
    """
    _check_updates(updates)
    if weights is None:
        w = np.ones(len(updates), dtype=np.float64)
    else:
        w = np.asarray(weights, dtype=np.float64)
        if w.shape != (len(updates),) or np.any(w < 0) or not np.isfinite(w).all():
            raise ValueError(
                "weights must be one finite non-negative number per update. "
                f"Received: weights={list(weights)} for {len(updates)} updates"
            )
    total = w.sum()
    if total <= 0:
        raise ValueError(f"The weights sum to zero; nothing to average. Received: weights={w.tolist()}")
    out = []
    for layer in zip(*updates):
        acc = np.zeros(layer[0].shape, dtype=np.float64)
        for wi, arr in zip(w, layer):
            acc += wi * arr
        out.append((acc / total).astype(layer[0].dtype, copy=False))
    return out


def coordinate_median(updates: Sequence[Sequence[np.ndarray]]) -> Weights:
    """Coordinate-wise median of the updates (Yin et al., 2018).

    Robust while fewer than half of the updates are byzantine.

    Example:
        >>> coordinate_median([[np.array([1.0])], [np.array([2.0])], [np.array([100.0])]])
        [array([2.])]
    """
    _check_updates(updates)
    return [
        np.median(np.stack(layer, axis=0), axis=0).astype(layer[0].dtype, copy=False)
        for layer in zip(*updates)
    ]


def trimmed_mean(updates: Sequence[Sequence[np.ndarray]], beta: float = 0.1) -> Weights:
    """Coordinate-wise trimmed mean (Yin et al., 2018).

    For every coordinate the ``k = floor(beta * n)`` largest and ``k`` smallest
    values are dropped and the rest averaged.

    Args:
        updates: one list of arrays per client.
        beta: fraction trimmed at each end, in ``[0, 0.5)``. Defaults to 0.1.

    Example:
        >>> trimmed_mean([[np.array([v])] for v in (0.0, 1.0, 2.0, 3.0, 100.0)], beta=0.2)
        [array([2.])]
    """
    _check_updates(updates)
    if not 0.0 <= beta < 0.5:
        raise ConfigError(f"beta must be in [0, 0.5). Received: beta={beta}. Use e.g. beta=0.1.")
    n = len(updates)
    k = int(np.floor(beta * n))
    out = []
    for layer in zip(*updates):
        stacked = np.sort(np.stack(layer, axis=0), axis=0)
        kept = stacked[k : n - k] if k > 0 else stacked
        out.append(kept.mean(axis=0).astype(layer[0].dtype, copy=False))
    return out


def krum(updates: Sequence[Sequence[np.ndarray]], num_byzantine: int, num_selected: int = 1) -> Weights:
    """(Multi-)Krum (Blanchard et al., 2017): average of the updates closest to their neighbours.

    Each update is scored by the sum of squared distances to its
    ``n - num_byzantine - 2`` nearest other updates; the ``num_selected`` best
    are averaged.

    Args:
        updates: one list of arrays per client.
        num_byzantine: assumed number of byzantine updates ``f``; needs ``n > 2f + 2``.
        num_selected: how many best-scored updates to average. Defaults to 1 (Krum).
    """
    _check_updates(updates)
    n = len(updates)
    if num_byzantine < 0 or n <= 2 * num_byzantine + 2:
        raise ConfigError(
            "Krum needs more than 2f + 2 updates. "
            f"Received: {n} updates with num_byzantine={num_byzantine}. "
            "Sample more clients per round or lower num_byzantine."
        )
    if not 1 <= num_selected <= n:
        raise ConfigError(f"num_selected must be in [1, {n}]. Received: num_selected={num_selected}")
    flat = np.stack([flatten(u) for u in updates]).astype(np.float64)
    sq = np.sum(flat**2, axis=1)
    dist = np.maximum(sq[:, None] + sq[None, :] - 2.0 * flat @ flat.T, 0.0)
    m = n - num_byzantine - 2
    scores = np.array([np.sort(np.delete(dist[i], i))[:m].sum() for i in range(n)])
    chosen = np.argsort(scores, kind="stable")[:num_selected]
    return weighted_average([updates[i] for i in chosen])


def add(a: Sequence[np.ndarray], b: Sequence[np.ndarray]) -> Weights:
    """Layer-wise ``a + b``."""
    return [x + y for x, y in zip(a, b)]


def subtract(a: Sequence[np.ndarray], b: Sequence[np.ndarray]) -> Weights:
    """Layer-wise ``a - b``."""
    return [x - y for x, y in zip(a, b)]


def scale(a: Sequence[np.ndarray], factor: float) -> Weights:
    """Layer-wise ``factor * a`` (keeps each array's dtype)."""
    return [(x * factor).astype(x.dtype, copy=False) for x in a]


def flatten(weights: Sequence[np.ndarray]) -> np.ndarray:
    """Concatenate all arrays into one 1-D vector."""
    return np.concatenate([np.ravel(w) for w in weights]) if len(weights) else np.zeros(0)


def unflatten(vector: np.ndarray, like: Sequence[np.ndarray]) -> Weights:
    """Split a 1-D vector back into arrays shaped (and typed) like ``like``."""
    out, pos = [], 0
    for w in like:
        size = int(np.prod(w.shape))
        out.append(np.asarray(vector[pos : pos + size], dtype=w.dtype).reshape(w.shape))
        pos += size
    if pos != vector.size:
        raise ValueError(f"Vector has {vector.size} values but the arrays hold {pos}.")
    return out


def staleness_discount(staleness: int | np.ndarray, exponent: float = 0.5) -> np.ndarray | float:
    """Polynomial staleness weight ``(1 + s) ** -exponent`` (FedAsync, Xie et al. 2019).

    ``exponent=0`` weighs stale updates like fresh ones.
    """
    s = np.asarray(staleness, dtype=np.float64)
    if np.any(s < 0):
        raise ValueError(f"staleness must be >= 0. Received: staleness={staleness}")
    out = (1.0 + s) ** (-float(exponent))
    return float(out) if out.ndim == 0 else out
