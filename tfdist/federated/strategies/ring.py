"""Decentralised P2P ring with knowledge distillation from the two neighbours.

The scenario of the seed paper (Yu, Park and Moon): every node keeps its own
model, trains on its own data and learns from its ring neighbours ``i - 1`` and
``i + 1`` by distilling their predictions on its data (Hinton et al., 2015).
No server and no weight averaging (unless ``gossip > 0``).
"""

from __future__ import annotations

import numpy as np

from tfdist.errors import ConfigError
from tfdist.federated.client import DistillationClientUpdate
from tfdist.federated.strategies.base import Strategy

__all__ = ["RingDistillation"]


class RingDistillation(Strategy):
    """P2P ring: local training + distillation from the 2 neighbours.

    Args:
        clients_per_round: nodes that train each round. Defaults to ``None`` (all).
        temperature: distillation temperature. Defaults to 2.
        kd_weight: weight of the distillation loss in ``[0, 1]``. Defaults to 0.5.
        gossip: before training, a node starts from
            ``(1 - gossip) * own + gossip * mean(neighbours)``; ``0`` (default)
            is pure distillation as in the paper.
    """

    topology = "ring"

    def __init__(self, clients_per_round: int | None = None, temperature: float = 2.0, kd_weight: float = 0.5, gossip: float = 0.0):
        super().__init__(clients_per_round)
        DistillationClientUpdate(temperature, kd_weight)  # validates
        if not 0.0 <= gossip <= 1.0:
            raise ConfigError(f"gossip must be in [0, 1]. Received: gossip={gossip}")
        self.temperature = float(temperature)
        self.kd_weight = float(kd_weight)
        self.gossip = float(gossip)

    @staticmethod
    def neighbours(node: int, num_nodes: int) -> tuple[int, int]:
        """The two ring neighbours of ``node``."""
        if num_nodes < 3:
            raise ConfigError(f"A ring needs at least 3 nodes. Received: num_nodes={num_nodes}")
        return (node - 1) % num_nodes, (node + 1) % num_nodes

    def start_weights(self, own: list, neighbour_weights: list) -> list:
        """Weights a node starts its local training from."""
        if self.gossip == 0.0:
            return own
        return [
            ((1 - self.gossip) * o + self.gossip * np.mean([n[i] for n in neighbour_weights], axis=0)).astype(o.dtype)
            for i, o in enumerate(own)
        ]

    def client_update(self, config):
        return DistillationClientUpdate(self.temperature, self.kd_weight)

    def aggregate(self, round_num, weights, results):
        raise TypeError("RingDistillation has no server; the simulator applies node updates directly.")
