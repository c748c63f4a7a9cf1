"""The strategy extension point: who trains each round and how updates combine."""

from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np

from tfdist.errors import ConfigError
from tfdist.federated.client import ClientConfig, ClientUpdate, KerasClientUpdate

__all__ = ["ClientResult", "Strategy"]


@dataclasses.dataclass
class ClientResult:
    """One client update as the server sees it when it arrives.

    Attributes:
        client_id: the client.
        num_examples: its number of local examples.
        delta: trained weights minus the weights it started from (after any
            byzantine attack), one array per model variable.
        round_dispatched: round in which it was sent out.
        arrival_time: simulated arrival time (seconds).
        staleness: rounds between dispatch and aggregation (0 = fresh).
        metrics: what the client reported (``loss``, ``steps``).
    """

    client_id: int
    num_examples: int
    delta: list
    round_dispatched: int
    arrival_time: float
    staleness: int = 0
    metrics: dict = dataclasses.field(default_factory=dict)


class Strategy:
    """Base class of federated strategies.

    A strategy decides which clients train in a round (:meth:`sample_clients`),
    what runs on them (:meth:`client_update`) and how the updates that arrived
    become the next global weights (:meth:`aggregate`). To add a method, write
    one module with a subclass that overrides the methods it changes; see
    :class:`tfdist.federated.FedMedian` for a five-line example.

    Args:
        clients_per_round: clients sampled each round (at most the clients not
            still busy with an earlier, delayed update). ``None`` = all.
    """

    #: ``"client_server"`` (one global model) or ``"ring"`` (one model per node).
    topology = "client_server"

    def __init__(self, clients_per_round: int | None = 10):
        if clients_per_round is not None and (not isinstance(clients_per_round, (int, np.integer)) or clients_per_round < 1):
            raise ConfigError(
                f"clients_per_round must be a positive int or None (all clients). Received: clients_per_round={clients_per_round!r}"
            )
        self.clients_per_round = clients_per_round

    def initialize(self, weights: Sequence[np.ndarray], num_clients: int) -> None:
        """Called once with the initial global weights (set up server state here)."""
        if self.clients_per_round is not None and self.clients_per_round > num_clients:
            raise ConfigError(
                f"clients_per_round={self.clients_per_round} exceeds the number of clients ({num_clients}). "
                "Lower clients_per_round or partition into more clients."
            )

    def sample_clients(self, available: np.ndarray, round_num: int, rng: np.random.Generator) -> np.ndarray:
        """Returns the sorted client ids that train this round.

        Args:
            available: ids of clients not busy with an earlier update.
            round_num: 1-based round.
            rng: generator seeded from (run seed, round).
        """
        k = len(available) if self.clients_per_round is None else min(self.clients_per_round, len(available))
        return np.sort(rng.choice(available, size=k, replace=False)) if k else np.zeros(0, np.int64)

    def client_update(self, config: ClientConfig) -> ClientUpdate:
        """The local training method the train workers run. Defaults to plain local SGD/Adam."""
        return KerasClientUpdate()

    def aggregate(self, round_num: int, weights: list, results: list) -> list:
        """Returns the new global weights from the updates that arrived this round.

        Args:
            round_num: the round being closed.
            weights: the current global weights.
            results: :class:`ClientResult` s in simulated-arrival order.
        """
        raise NotImplementedError

    def to_dict(self) -> dict:
        out = {"name": type(self).__name__}
        out.update({k: v for k, v in vars(self).items() if not k.startswith("_") and isinstance(v, (int, float, str, type(None)))})
        return out
