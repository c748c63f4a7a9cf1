"""FedAdam (Reddi et al., "Adaptive Federated Optimization", ICLR 2021)."""

from __future__ import annotations

import numpy as np

from tfdist.errors import ConfigError
from tfdist.federated.strategies.fedavg import FedAvg

__all__ = ["FedAdam"]


class FedAdam(FedAvg):
    """FedAvg whose server applies the averaged delta with Adam.

    ``m <- b1 m + (1 - b1) D``, ``v <- b2 v + (1 - b2) D^2``,
    ``w <- w + eta * m / (sqrt(v) + tau)`` with ``D`` the averaged client delta.

    Args:
        clients_per_round: clients per round. Defaults to 10.
        server_learning_rate: ``eta``. Defaults to 0.01.
        beta_1: Defaults to 0.9.
        beta_2: Defaults to 0.99.
        tau: adaptivity ``tau``. Defaults to 1e-3.
        **kwargs: the other :class:`FedAvg` arguments.
    """

    def __init__(self, clients_per_round=10, server_learning_rate=0.01, beta_1=0.9, beta_2=0.99, tau=1e-3, **kwargs):
        super().__init__(clients_per_round, server_learning_rate=server_learning_rate, **kwargs)
        if not (0 <= beta_1 < 1 and 0 <= beta_2 < 1 and tau > 0):
            raise ConfigError(
                f"FedAdam needs 0 <= beta_1, beta_2 < 1 and tau > 0. Received: beta_1={beta_1}, beta_2={beta_2}, tau={tau}"
            )
        self.beta_1, self.beta_2, self.tau = float(beta_1), float(beta_2), float(tau)
        self._m = self._v = None

    def initialize(self, weights, num_clients):
        super().initialize(weights, num_clients)
        self._m = [np.zeros_like(w, dtype=np.float64) for w in weights]
        self._v = [np.zeros_like(w, dtype=np.float64) for w in weights]

    def apply_delta(self, weights, delta):
        out = []
        for i, (w, d) in enumerate(zip(weights, delta)):
            self._m[i] = self.beta_1 * self._m[i] + (1 - self.beta_1) * d
            self._v[i] = self.beta_2 * self._v[i] + (1 - self.beta_2) * np.square(d, dtype=np.float64)
            out.append((w + self.server_learning_rate * self._m[i] / (np.sqrt(self._v[i]) + self.tau)).astype(w.dtype))
        return out
