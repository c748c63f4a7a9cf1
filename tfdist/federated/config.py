"""Experiment configs: YAML <-> dataclasses <-> :class:`Simulation` (``configs/fl_*.yaml``)."""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

from tfdist.errors import ConfigError
from tfdist.federated.attacks import ByzantineConfig
from tfdist.federated.client import ClientConfig
from tfdist.federated.datasets import DATASETS, make_mlp
from tfdist.federated.delays import make_delay_model
from tfdist.federated.partition import SCHEMES, partition
from tfdist.federated.strategies import make_strategy

__all__ = [
    "DatasetConfig",
    "ModelConfig",
    "PartitionConfig",
    "RunConfig",
    "ExperimentConfig",
    "load_experiment",
]


def _from_dict(cls, data: Any, where: str):
    if data is None:
        return cls()
    if not isinstance(data, dict):
        raise ConfigError(f"{where} must be a mapping. Received: {where}={data!r}")
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - names)
    if unknown:
        raise ConfigError(f"Unknown keys in {where}. Received: {unknown}. Allowed: {sorted(names)}.")
    return cls(**data)


@dataclasses.dataclass
class DatasetConfig:
    """Which built-in dataset to load (``digits``: scikit-learn's bundled 8x8 digits)."""

    name: str = "digits"
    test_fraction: float = 0.2
    seed: int = 0

    def __post_init__(self):
        if self.name not in DATASETS:
            raise ConfigError(f"Unknown dataset. Received: dataset.name={self.name!r}. Use one of {sorted(DATASETS)}.")


@dataclasses.dataclass
class ModelConfig:
    """A built-in model: ``mlp`` with the given hidden layer sizes."""

    name: str = "mlp"
    hidden: list = dataclasses.field(default_factory=lambda: [64])
    seed: int = 0

    def __post_init__(self):
        if self.name != "mlp":
            raise ConfigError(f"Unknown model. Received: model.name={self.name!r}. Use 'mlp'.")
        if not all(isinstance(h, int) and h > 0 for h in self.hidden):
            raise ConfigError(f"model.hidden must be positive ints. Received: hidden={self.hidden!r}")


@dataclasses.dataclass
class PartitionConfig:
    """Arguments of :func:`tfdist.federated.partition`."""

    scheme: str = "dirichlet"
    num_clients: int = 100
    alpha: float = 0.5
    seed: int = 0
    min_examples: int = 1

    def __post_init__(self):
        if self.scheme not in SCHEMES or self.scheme == "group":
            raise ConfigError(
                f"partition.scheme must be 'iid' or 'dirichlet' for built-in datasets (they have no group key). "
                f"Received: scheme={self.scheme!r}"
            )
        if not isinstance(self.num_clients, int) or self.num_clients < 1:
            raise ConfigError(f"partition.num_clients must be a positive int. Received: {self.num_clients!r}")


@dataclasses.dataclass
class RunConfig:
    """Execution settings of :class:`tfdist.federated.Simulation`."""

    rounds: int = 30
    num_workers: int = 2
    seed: int = 0
    round_deadline_s: float | None = None
    eval_every: int = 1
    threads_per_worker: int = 1
    progress: bool = True

    def __post_init__(self):
        for name in ("rounds", "eval_every", "threads_per_worker"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ConfigError(f"simulation.{name} must be an int >= 1. Received: {name}={getattr(self, name)!r}")
        if not isinstance(self.num_workers, int) or self.num_workers < 0:
            raise ConfigError(f"simulation.num_workers must be an int >= 0. Received: {self.num_workers!r}")


@dataclasses.dataclass
class ExperimentConfig:
    """A whole experiment, one to one with a ``configs/fl_*.yaml`` file.

    Example:
        >>> cfg = ExperimentConfig.from_dict({"strategy": {"name": "fedavg", "clients_per_round": 20}})
        >>> cfg.to_dict()["strategy"]
        {'name': 'fedavg', 'clients_per_round': 20}
    """

    dataset: DatasetConfig = dataclasses.field(default_factory=DatasetConfig)
    model: ModelConfig = dataclasses.field(default_factory=ModelConfig)
    partition: PartitionConfig = dataclasses.field(default_factory=PartitionConfig)
    strategy: dict = dataclasses.field(default_factory=lambda: {"name": "fedavg", "clients_per_round": 20})
    client: ClientConfig = dataclasses.field(default_factory=ClientConfig)
    delays: dict | None = None
    byzantine: dict | None = None
    simulation: RunConfig = dataclasses.field(default_factory=RunConfig)
    output: str | None = None

    def __post_init__(self):
        make_strategy(self.strategy)  # fail fast on a bad strategy
        make_delay_model(self.delays)
        ByzantineConfig.from_spec(self.byzantine)

    @classmethod
    def from_dict(cls, data: dict) -> "ExperimentConfig":
        if not isinstance(data, dict):
            raise ConfigError(f"An experiment config must be a mapping. Received: {type(data).__name__}")
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - names)
        if unknown:
            raise ConfigError(f"Unknown top-level keys. Received: {unknown}. Allowed: {sorted(names)}.")
        return cls(
            dataset=_from_dict(DatasetConfig, data.get("dataset"), "dataset"),
            model=_from_dict(ModelConfig, data.get("model"), "model"),
            partition=_from_dict(PartitionConfig, data.get("partition"), "partition"),
            strategy=data.get("strategy") or {"name": "fedavg"},
            client=_from_dict(ClientConfig, data.get("client"), "client"),
            delays=data.get("delays"),
            byzantine=data.get("byzantine"),
            simulation=_from_dict(RunConfig, data.get("simulation"), "simulation"),
            output=data.get("output"),
        )

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def build(self):
        """Loads the data and returns the :class:`~tfdist.federated.Simulation`."""
        from tfdist.federated.simulation import Simulation

        (x, y), test = DATASETS[self.dataset.name](self.dataset.test_fraction, self.dataset.seed)
        p = self.partition
        data = partition(x, y, num_clients=p.num_clients, scheme=p.scheme, alpha=p.alpha, seed=p.seed,
                         min_examples=p.min_examples)
        model_fn = functools.partial(make_mlp, int(x.shape[1]), int(y.max()) + 1, tuple(self.model.hidden), self.model.seed)
        s = self.simulation
        return Simulation(
            model_fn, data, strategy=make_strategy(self.strategy), test_data=test, num_workers=s.num_workers,
            rounds=s.rounds, client=self.client, delays=self.delays, byzantine=self.byzantine,
            round_deadline_s=s.round_deadline_s, seed=s.seed, eval_every=s.eval_every, progress=s.progress,
            threads_per_worker=s.threads_per_worker,
        )


def load_experiment(path: str) -> ExperimentConfig:
    """Reads a YAML experiment file into an :class:`ExperimentConfig`."""
    import yaml

    try:
        with open(path, encoding="utf-8") as f:
            data = yaml.safe_load(f)
    except OSError as e:
        raise ConfigError(f"Cannot read the config file. Received: path={path!r} ({e.strerror}).") from None
    return ExperimentConfig.from_dict(data or {})
