"""Byzantine-robust FedAvg variants: coordinate-wise median, trimmed mean, Krum.

References:
    Yin et al., "Byzantine-Robust Distributed Learning: Towards Optimal
    Statistical Rates", ICML 2018. Blanchard et al., NeurIPS 2017 (Krum).
"""

from __future__ import annotations

from tfdist.federated import aggregate as agg
from tfdist.federated.strategies.fedavg import FedAvg

__all__ = ["FedMedian", "FedTrimmedMean", "FedKrum"]


class FedMedian(FedAvg):
    """FedAvg with the coordinate-wise median of the deltas (ignores example counts)."""

    def combine(self, deltas, weights):
        return agg.coordinate_median(deltas)


class FedTrimmedMean(FedAvg):
    """FedAvg with the coordinate-wise ``beta``-trimmed mean of the deltas.

    Args:
        clients_per_round: clients per round. Defaults to 10.
        beta: fraction trimmed at each end. Defaults to 0.2.
        **kwargs: the other :class:`FedAvg` arguments.
    """

    def __init__(self, clients_per_round=10, beta: float = 0.2, **kwargs):
        super().__init__(clients_per_round, **kwargs)
        agg.trimmed_mean([[agg.np.zeros(1)]], beta)  # validates beta
        self.beta = float(beta)

    def combine(self, deltas, weights):
        return agg.trimmed_mean(deltas, self.beta)


class FedKrum(FedAvg):
    """FedAvg with (multi-)Krum selection of the deltas.

    Args:
        clients_per_round: clients per round. Defaults to 10.
        num_byzantine: assumed byzantine updates per round. Defaults to 2.
        num_selected: updates averaged after selection. Defaults to 1.
        **kwargs: the other :class:`FedAvg` arguments.
    """

    def __init__(self, clients_per_round=10, num_byzantine: int = 2, num_selected: int = 1, **kwargs):
        super().__init__(clients_per_round, **kwargs)
        self.num_byzantine = int(num_byzantine)
        self.num_selected = int(num_selected)

    def combine(self, deltas, weights):
        f = min(self.num_byzantine, max((len(deltas) - 3) // 2, 0))
        return agg.krum(deltas, f, min(self.num_selected, len(deltas) - f)) if len(deltas) > 2 else agg.coordinate_median(deltas)
