"""FedAvg (McMahan et al., AISTATS 2017) with optional staleness discounting."""

from __future__ import annotations

from tfdist.errors import ConfigError
from tfdist.federated import aggregate as agg
from tfdist.federated.strategies.base import Strategy

__all__ = ["FedAvg"]


class FedAvg(Strategy):
    """Federated averaging of client deltas, weighted by example counts.

    ``w <- w + server_learning_rate * sum_i n_i d_i delta_i / sum_i n_i d_i``
    where ``d_i = (1 + staleness_i) ** -staleness_exponent`` discounts late
    updates (FedAsync's polynomial rule; ``0`` = no discount). Updates older than
    ``max_staleness`` rounds are dropped. With no delays every update is fresh
    and this is exactly McMahan et al.'s FedAvg.

    Subclasses that only change the robust combination override
    :meth:`combine`.

    Args:
        clients_per_round: clients per round. Defaults to 10.
        server_learning_rate: step applied to the averaged delta. Defaults to 1.
        staleness_exponent: discount exponent for stale updates. Defaults to 0.
        max_staleness: drop updates older than this many rounds. Defaults to ``None`` (keep all).
    """

    def __init__(
        self,
        clients_per_round: int | None = 10,
        server_learning_rate: float = 1.0,
        staleness_exponent: float = 0.0,
        max_staleness: int | None = None,
    ):
        super().__init__(clients_per_round)
        if not server_learning_rate > 0:
            raise ConfigError(f"server_learning_rate must be > 0. Received: server_learning_rate={server_learning_rate}")
        if staleness_exponent < 0:
            raise ConfigError(f"staleness_exponent must be >= 0. Received: staleness_exponent={staleness_exponent}")
        if max_staleness is not None and max_staleness < 0:
            raise ConfigError(f"max_staleness must be >= 0 or None. Received: max_staleness={max_staleness}")
        self.server_learning_rate = float(server_learning_rate)
        self.staleness_exponent = float(staleness_exponent)
        self.max_staleness = max_staleness

    def combine(self, deltas: list, weights: list) -> list:
        """Combines the client deltas into one (weighted mean here)."""
        return agg.weighted_average(deltas, weights)

    def aggregate(self, round_num, weights, results):
        kept = [r for r in results if self.max_staleness is None or r.staleness <= self.max_staleness]
        if not kept:
            return weights
        w = [r.num_examples * agg.staleness_discount(r.staleness, self.staleness_exponent) for r in kept]
        delta = self.combine([r.delta for r in kept], w)
        return self.apply_delta(weights, delta)

    def apply_delta(self, weights: list, delta: list) -> list:
        """Server update from the combined delta (plain step here; FedAdam overrides)."""
        return agg.add(weights, agg.scale(delta, self.server_learning_rate))
