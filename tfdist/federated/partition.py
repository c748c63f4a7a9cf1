"""Seeded client partitioners: IID, Dirichlet non-IID over labels, by group (writer).

References:
    Hsu, Qi and Brown, "Measuring the Effects of Non-Identical Data
    Distribution for Federated Visual Classification", 2019 (Dirichlet split).
    Caldas et al., "LEAF: A Benchmark for Federated Settings", 2018 (by-writer split).
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np

from tfdist.errors import ConfigError

__all__ = ["ClientDataset", "FederatedData", "partition", "SCHEMES"]

SCHEMES = ("iid", "dirichlet", "group")


@dataclasses.dataclass(frozen=True)
class ClientDataset:
    """The local data of one simulated client.

    Attributes:
        client_id: index of the client, ``0 .. num_clients-1``.
        x: features, first axis = examples.
        y: integer labels, shape ``(n,)``.
        group: the group key(s) this client holds (``"by group"`` scheme), else ``None``.
    """

    client_id: int
    x: np.ndarray
    y: np.ndarray
    group: object = None

    @property
    def num_examples(self) -> int:
        return int(self.y.shape[0])


@dataclasses.dataclass(frozen=True)
class FederatedData:
    """All clients' datasets plus how they were made.

    Attributes:
        clients: one :class:`ClientDataset` per client, indexed by ``client_id``.
        scheme: the partition scheme used.
        seed: the seed used.
        alpha: Dirichlet concentration (``"dirichlet"`` only).
    """

    clients: tuple
    scheme: str = "custom"
    seed: int | None = None
    alpha: float | None = None

    def __len__(self) -> int:
        return len(self.clients)

    def __getitem__(self, i: int) -> ClientDataset:
        return self.clients[i]

    def __iter__(self):
        return iter(self.clients)

    @property
    def num_clients(self) -> int:
        return len(self.clients)

    @property
    def sizes(self) -> np.ndarray:
        """Number of examples per client."""
        return np.array([c.num_examples for c in self.clients], dtype=np.int64)

    def label_histogram(self, num_classes: int | None = None) -> np.ndarray:
        """Array ``(num_clients, num_classes)`` of label counts per client."""
        if num_classes is None:
            num_classes = int(max((c.y.max() for c in self.clients if c.num_examples), default=-1)) + 1
        return np.stack([np.bincount(c.y, minlength=num_classes) for c in self.clients])

    @classmethod
    def from_arrays(cls, xs: Sequence[np.ndarray], ys: Sequence[np.ndarray]) -> "FederatedData":
        """Wrap ready-made per-client arrays (your own partition)."""
        if len(xs) != len(ys):
            raise ConfigError(f"Need one label array per feature array. Received: {len(xs)} x and {len(ys)} y")
        clients = tuple(
            ClientDataset(i, np.asarray(x), np.asarray(y).astype(np.int64)) for i, (x, y) in enumerate(zip(xs, ys))
        )
        return cls(clients=clients)


def partition(
    x: np.ndarray,
    y: np.ndarray,
    num_clients: int | None = None,
    scheme: str = "iid",
    alpha: float = 0.5,
    groups: np.ndarray | None = None,
    seed: int = 0,
    min_examples: int = 1,
    max_tries: int = 1000,
) -> FederatedData:
    """Split ``(x, y)`` over simulated clients, reproducibly.

    Args:
        x: features, first axis = examples.
        y: integer class labels, shape ``(n,)``.
        num_clients: number of clients. Required for ``"iid"`` and
            ``"dirichlet"``; for ``"group"`` defaults to one client per group.
        scheme: ``"iid"`` (shuffle, equal shares), ``"dirichlet"`` (for every
            class, shares drawn from ``Dirichlet(alpha)`` over clients) or
            ``"group"`` (every group, e.g. a writer, lives on one client).
            Defaults to ``"iid"``.
        alpha: Dirichlet concentration; smaller is more skewed. Defaults to 0.5.
        groups: one group key per example (``"group"`` only).
        seed: the same seed gives the same partition. Defaults to 0.
        min_examples: every client gets at least this many examples; the
            Dirichlet draw is repeated until it does. Defaults to 1.
        max_tries: Dirichlet re-draws before giving up. Defaults to 1000.

    Returns:
        A :class:`FederatedData`.

    Example:
        >>> from sklearn.datasets import load_digits
        >>> d = load_digits()
        >>> data = partition(d.data, d.target, num_clients=100, scheme="dirichlet", alpha=0.5)
        >>> len(data), int(data.sizes.sum())
        (100, 1797)
    """
    x = np.asarray(x)
    y = np.asarray(y)
    if y.ndim != 1 or x.shape[0] != y.shape[0]:
        raise ConfigError(
            "x and y must have the same number of examples and y must be 1-D integer labels. "
            f"Received: x.shape={x.shape}, y.shape={y.shape}"
        )
    if not np.issubdtype(y.dtype, np.integer):
        raise ConfigError(f"y must hold integer class labels. Received: y.dtype={y.dtype}. Convert with y.astype(int).")
    y = y.astype(np.int64)
    if scheme not in SCHEMES:
        raise ConfigError(f"Unknown partition scheme. Received: scheme={scheme!r}. Use one of {SCHEMES}.")
    rng = np.random.default_rng(seed)
    n = y.shape[0]

    if scheme == "group":
        if groups is None:
            raise ConfigError(
                "scheme='group' needs one group key per example. Received: groups=None. "
                "Pass groups=writer_ids, or use scheme='dirichlet'."
            )
        groups = np.asarray(groups)
        if groups.shape != (n,):
            raise ConfigError(f"groups must have shape ({n},). Received: groups.shape={groups.shape}")
        keys = np.unique(groups)
        if num_clients is None:
            num_clients = len(keys)
        if not 1 <= num_clients <= len(keys):
            raise ConfigError(
                f"scheme='group' needs 1 <= num_clients <= number of groups ({len(keys)}). "
                f"Received: num_clients={num_clients}."
            )
        order = rng.permutation(len(keys))
        owner = {keys[g]: i % num_clients for i, g in enumerate(order)}
        client_of_example = np.array([owner[g] for g in groups])
        clients = []
        for c in range(num_clients):
            idx = np.flatnonzero(client_of_example == c)
            held = tuple(sorted(keys[order[i]] for i in range(c, len(keys), num_clients)))
            clients.append(ClientDataset(c, x[idx], y[idx], group=held if len(held) > 1 else held[0]))
        return FederatedData(tuple(clients), scheme=scheme, seed=seed)

    if num_clients is None or num_clients < 1:
        raise ConfigError(f"num_clients must be a positive integer. Received: num_clients={num_clients}")
    if num_clients * min_examples > n:
        raise ConfigError(
            f"Cannot give {num_clients} clients {min_examples} examples each from {n} examples. "
            f"Received: num_clients={num_clients}, min_examples={min_examples}. Lower one of them."
        )

    if scheme == "iid":
        parts = np.array_split(rng.permutation(n), num_clients)
    else:
        if not alpha > 0:
            raise ConfigError(f"alpha must be > 0. Received: alpha={alpha}. Typical values: 0.1 (skewed) .. 100 (near IID).")
        classes = np.unique(y)
        for _ in range(max_tries):
            buckets: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
            for k in classes:
                idx = rng.permutation(np.flatnonzero(y == k))
                shares = rng.dirichlet(np.full(num_clients, alpha))
                cuts = (np.cumsum(shares) * len(idx)).astype(np.int64)[:-1]
                for c, chunk in enumerate(np.split(idx, cuts)):
                    buckets[c].append(chunk)
            parts = [np.sort(np.concatenate(b)) for b in buckets]
            if min(len(p) for p in parts) >= min_examples:
                break
        else:
            raise ConfigError(
                f"No Dirichlet draw in {max_tries} tries gave every client >= {min_examples} examples. "
                f"Received: alpha={alpha}, num_clients={num_clients}. Raise alpha or lower num_clients/min_examples."
            )
    clients = tuple(ClientDataset(c, x[p], y[p]) for c, p in enumerate(parts))
    return FederatedData(clients, scheme=scheme, seed=seed, alpha=alpha if scheme == "dirichlet" else None)
