"""FedProx (Li et al., "Federated Optimization in Heterogeneous Networks", MLSys 2020)."""

from __future__ import annotations

from tfdist.federated.client import ProximalClientUpdate
from tfdist.federated.strategies.fedavg import FedAvg

__all__ = ["FedProx"]


class FedProx(FedAvg):
    """FedAvg whose clients add a proximal term ``mu/2 ||w - w_global||^2``.

    Args:
        clients_per_round: clients per round. Defaults to 10.
        mu: proximal coefficient. Defaults to 0.01.
        **kwargs: the other :class:`FedAvg` arguments.
    """

    def __init__(self, clients_per_round: int | None = 10, mu: float = 0.01, **kwargs):
        super().__init__(clients_per_round, **kwargs)
        self.mu = float(mu)
        ProximalClientUpdate(self.mu)  # validates mu now, not in a worker

    def client_update(self, config):
        return ProximalClientUpdate(self.mu)
