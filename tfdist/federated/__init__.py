"""Federated-learning simulator on multiprocessing (``tfdist.federated``).

A main process owns the global state and a simulated clock, a pool of
train-worker processes keeps one built Keras model each and trains the
sampled clients with a compiled train step, and a test process evaluates the
models as rounds complete. See ``docs/federated.md``.

Example:
    >>> import tfdist
    >>> (x, y), test = tfdist.federated.load_digits_split()
    >>> sim = tfdist.federated.Simulation(
    ...     model_fn=tfdist.federated.make_mlp,
    ...     client_data=tfdist.federated.partition(x, y, num_clients=100, scheme="dirichlet", alpha=0.5),
    ...     strategy=tfdist.federated.FedAvg(clients_per_round=20), test_data=test,
    ...     num_workers=2, rounds=30)
    >>> history = sim.run()
"""

from tfdist.federated import aggregate
from tfdist.federated.attacks import Attack, ByzantineConfig, RandomNoise, ScaledUpdate, SignFlip
from tfdist.federated.client import (
    ClientConfig,
    ClientTask,
    ClientUpdate,
    DistillationClientUpdate,
    KerasClientUpdate,
    ProximalClientUpdate,
)
from tfdist.federated.datasets import load_digits_split, make_mlp
from tfdist.federated.delays import ConstantDelay, Delay, DelayModel, LogNormalDelay, NoDelay
from tfdist.federated.errors import FederatedError, SimulationTimeoutError, WorkerCrashedError
from tfdist.federated.history import AppliedUpdate, History, RoundRecord
from tfdist.federated.partition import ClientDataset, FederatedData, partition
from tfdist.federated.simulation import Simulation
from tfdist.federated.strategies import (
    ClientResult,
    FedAdam,
    FedAvg,
    FedKrum,
    FedMedian,
    FedProx,
    FedTrimmedMean,
    RingDistillation,
    Strategy,
    make_strategy,
)

__all__ = [
    "Simulation",
    "History",
    "RoundRecord",
    "AppliedUpdate",
    # data
    "partition",
    "FederatedData",
    "ClientDataset",
    "load_digits_split",
    "make_mlp",
    # strategies (server side)
    "Strategy",
    "ClientResult",
    "FedAvg",
    "FedProx",
    "FedAdam",
    "FedMedian",
    "FedTrimmedMean",
    "FedKrum",
    "RingDistillation",
    "make_strategy",
    "aggregate",
    # client side
    "ClientConfig",
    "ClientTask",
    "ClientUpdate",
    "KerasClientUpdate",
    "ProximalClientUpdate",
    "DistillationClientUpdate",
    # delays
    "DelayModel",
    "Delay",
    "NoDelay",
    "ConstantDelay",
    "LogNormalDelay",
    # byzantine
    "Attack",
    "SignFlip",
    "RandomNoise",
    "ScaledUpdate",
    "ByzantineConfig",
    # errors
    "FederatedError",
    "WorkerCrashedError",
    "SimulationTimeoutError",
]
