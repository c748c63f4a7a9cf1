"""Experiment configs: YAML <-> dataclasses <-> :class:`Simulation` (``configs/fl_*.yaml``)."""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, Callable

from tfdist.config import MAX_SECONDS, read_config_file
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


def _fail(path: str, value: Any, fix: str) -> ConfigError:
    return ConfigError(f"Invalid config field `{path}`. Received: {path}={value!r}. {fix}")


def _integer(path: str, value: Any, low: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise _fail(path, value, f"Give an integer >= {low}.")


def _number(path: str, value: Any, low: float, high: float | None = None, low_open: bool = False) -> None:
    ok = (not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)
          and (value > low if low_open else value >= low) and (high is None or value < high))
    if not ok:
        bounds = f"{'>' if low_open else '>='} {low:g}" + (f" and < {high:g}" if high is not None else "")
        raise _fail(path, value, f"Give a finite number {bounds}.")


def _section(where: str, build: Callable[[], Any]) -> Any:
    """Builds one section, making sure an error names it (``Invalid config field `strategy...`"``)."""
    try:
        return build()
    except ConfigError as e:
        if f"`{where}" in str(e):
            raise
        raise ConfigError(f"Invalid config field `{where}`: {e}") from None
    except (TypeError, ValueError) as e:  # e.g. float("fast") for a number
        raise ConfigError(f"Invalid config field `{where}`: {e}.") from None


def _from_dict(cls, data: Any, where: str):
    if data is None:
        return cls()
    if not isinstance(data, dict):
        raise _fail(where, data, "Write this section as a mapping of fields.")
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - names, key=str)
    if unknown:
        raise ConfigError(f"Unknown keys in {where}: `{where}.{unknown[0]}`. Received: {unknown}. "
                          f"Allowed: {sorted(names)}.")
    return _section(where, lambda: cls(**data))


@dataclasses.dataclass
class DatasetConfig:
    """Which built-in dataset to load (``digits``: scikit-learn's bundled 8x8 digits)."""

    name: str = "digits"
    test_fraction: float = 0.2
    seed: int = 0

    def __post_init__(self):
        if not isinstance(self.name, str) or self.name not in DATASETS:
            raise _fail("dataset.name", self.name, f"Unknown dataset: use one of {sorted(DATASETS)}.")
        _number("dataset.test_fraction", self.test_fraction, 0.0, 1.0, low_open=True)
        _integer("dataset.seed", self.seed, 0)


@dataclasses.dataclass
class ModelConfig:
    """A built-in model: ``mlp`` with the given hidden layer sizes."""

    name: str = "mlp"
    hidden: list = dataclasses.field(default_factory=lambda: [64])
    seed: int = 0

    def __post_init__(self):
        if self.name != "mlp":
            raise _fail("model.name", self.name, "Unknown model: use 'mlp'.")
        if not isinstance(self.hidden, list) or not all(
                isinstance(h, int) and not isinstance(h, bool) and h > 0 for h in self.hidden):
            raise _fail("model.hidden", self.hidden, "Give a list of positive layer sizes, e.g. [64].")
        _integer("model.seed", self.seed, 0)


@dataclasses.dataclass
class PartitionConfig:
    """Arguments of :func:`tfdist.federated.partition`."""

    scheme: str = "dirichlet"
    num_clients: int = 100
    alpha: float = 0.5
    seed: int = 0
    min_examples: int = 1

    def __post_init__(self):
        if not isinstance(self.scheme, str) or self.scheme not in SCHEMES or self.scheme == "group":
            raise _fail("partition.scheme", self.scheme,
                        "Use 'iid' or 'dirichlet' for built-in datasets (they have no group key).")
        _integer("partition.num_clients", self.num_clients, 1)
        _number("partition.alpha", self.alpha, 0.0, low_open=True)
        _integer("partition.seed", self.seed, 0)
        _integer("partition.min_examples", self.min_examples, 0)


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
            _integer(f"simulation.{name}", getattr(self, name), 1)
        _integer("simulation.num_workers", self.num_workers, 0)
        _integer("simulation.seed", self.seed, 0)
        d = self.round_deadline_s
        if d is not None and (isinstance(d, bool) or not isinstance(d, (int, float)) or not math.isfinite(d)
                              or not 0 < d <= MAX_SECONDS):
            raise _fail("simulation.round_deadline_s", d,
                        "Give a number of simulated seconds above 0 (and at most one year), or null for rounds "
                        "that wait for every sampled client.")
        if not isinstance(self.progress, bool):
            raise _fail("simulation.progress", self.progress, "Give true or false.")


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
        strategy = _section("strategy", lambda: make_strategy(self.strategy))  # fail fast on a bad strategy
        _section("delays", lambda: make_delay_model(self.delays))
        _section("byzantine", lambda: ByzantineConfig.from_spec(self.byzantine))
        per_round = getattr(strategy, "clients_per_round", None)
        if isinstance(per_round, int) and per_round > self.partition.num_clients:
            raise _fail("strategy.clients_per_round", per_round,
                        f"It exceeds partition.num_clients={self.partition.num_clients}: a round cannot sample more "
                        "clients than there are. Lower strategy.clients_per_round or raise partition.num_clients.")
        if self.output is not None and (not isinstance(self.output, str) or not self.output):
            raise _fail("output", self.output, "Give a file path for the history JSON, or null.")

    @classmethod
    def from_dict(cls, data: dict) -> "ExperimentConfig":
        if not isinstance(data, dict):
            name = type(data).__name__
            raise ConfigError(f"An experiment config must be a mapping of sections (dataset, model, strategy, ...). "
                              f"Received: {'an' if name[:1] in 'aeiou' else 'a'} {name}. "
                              "Write e.g. `strategy: {name: fedavg}`.")
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - names, key=str)
        if unknown:
            raise ConfigError(f"Unknown top-level keys: `{unknown[0]}`. Received: {unknown}. "
                              f"Allowed: {sorted(names)}.")
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
    """Reads a YAML experiment file into an :class:`ExperimentConfig`.

    Raises:
        ConfigError: the file cannot be read, is not UTF-8 YAML (see
            :func:`tfdist.config.read_config_file`) or has a bad field.
    """
    data = read_config_file(path)
    try:
        return ExperimentConfig.from_dict({} if data is None else data)
    except ConfigError as e:
        raise ConfigError(f"{path}: {e}") from None
