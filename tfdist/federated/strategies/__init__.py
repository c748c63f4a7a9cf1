"""Federated strategies: one module per algorithm, one small base class."""

from tfdist.federated.strategies.base import ClientResult, Strategy
from tfdist.federated.strategies.fedadam import FedAdam
from tfdist.federated.strategies.fedavg import FedAvg
from tfdist.federated.strategies.fedprox import FedProx
from tfdist.federated.strategies.ring import RingDistillation
from tfdist.federated.strategies.robust import FedKrum, FedMedian, FedTrimmedMean

__all__ = [
    "ClientResult",
    "Strategy",
    "FedAvg",
    "FedProx",
    "FedAdam",
    "FedMedian",
    "FedTrimmedMean",
    "FedKrum",
    "RingDistillation",
    "make_strategy",
]

_BY_NAME = {
    "fedavg": FedAvg,
    "fedprox": FedProx,
    "fedadam": FedAdam,
    "fedmedian": FedMedian,
    "median": FedMedian,
    "fedtrimmedmean": FedTrimmedMean,
    "trimmed_mean": FedTrimmedMean,
    "fedkrum": FedKrum,
    "krum": FedKrum,
    "ring": RingDistillation,
    "ring_distillation": RingDistillation,
}


def make_strategy(spec) -> Strategy:
    """Builds a strategy from an instance, a name or ``{"name": ..., **kwargs}``."""
    from tfdist.errors import ConfigError

    if isinstance(spec, Strategy):
        return spec
    if isinstance(spec, str):
        spec = {"name": spec}
    if isinstance(spec, dict):
        kwargs = dict(spec)
        name = str(kwargs.pop("name", "fedavg")).lower()
        if name not in _BY_NAME:
            raise ConfigError(f"Unknown strategy. Received: strategy.name={name!r}. Use one of {sorted(_BY_NAME)}.")
        try:
            return _BY_NAME[name](**kwargs)
        except TypeError as e:
            raise ConfigError(f"Bad arguments for strategy {name!r}: {e}. Received: {kwargs}") from None
    raise ConfigError(f"strategy must be a Strategy, a name or a dict. Received: strategy={spec!r}")
