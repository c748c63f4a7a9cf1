"""Experiment configs: every configs/fl_*.yaml loads; dataclasses validate and round-trip."""

import glob
import os

import pytest

from tfdist.errors import ConfigError
from tfdist.federated import ClientConfig
from tfdist.federated.config import ExperimentConfig, load_experiment

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
FILES = sorted(glob.glob(os.path.join(ROOT, "configs", "fl_*.yaml")))


def test_there_are_federated_configs():
    assert len(FILES) >= 4


@pytest.mark.parametrize("path", FILES, ids=os.path.basename)
def test_every_config_loads_and_round_trips(path):
    cfg = load_experiment(path)
    again = ExperimentConfig.from_dict(cfg.to_dict())
    assert again.to_dict() == cfg.to_dict()


def test_unknown_keys_are_named():
    with pytest.raises(ConfigError, match="Unknown top-level"):
        ExperimentConfig.from_dict({"strategyy": {}})
    with pytest.raises(ConfigError, match=r"Unknown keys in simulation"):
        ExperimentConfig.from_dict({"simulation": {"round": 3}})
    with pytest.raises(ConfigError, match="num_workers"):
        ExperimentConfig.from_dict({"simulation": {"num_workers": -1}})
    with pytest.raises(ConfigError, match="Unknown strategy"):
        ExperimentConfig.from_dict({"strategy": {"name": "nope"}})
    with pytest.raises(ConfigError, match="Cannot read"):
        load_experiment("/nonexistent/fl.yaml")


def test_client_config_per_client_values():
    cfg = ClientConfig(local_epochs=[1, 2, 3], batch_size=8)
    assert [cfg.epochs_of(c) for c in range(3)] == [1, 2, 3]
    assert cfg.batch_size_of(2) == 8
    with pytest.raises(ConfigError, match="one value per client"):
        cfg.epochs_of(3)
    for bad in ({"batch_size": 0}, {"local_epochs": [1, 0]}, {"optimizer": "rmsprop"}, {"learning_rate": 0}):
        with pytest.raises(ConfigError, match="Received"):
            ClientConfig(**bad)
