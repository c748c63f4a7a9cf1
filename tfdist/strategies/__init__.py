"""tf.distribute strategies for Keras 3."""

from tfdist.strategies.all_reduce import AllReduceStrategy
from tfdist.strategies.parameter_server import (
    BSPStrategy,
    DTSSPStrategy,
    ParameterServerStrategy,
    SSPStrategy,
    SyncReplicasStrategy,
    default_variable_filter,
)

__all__ = [
    "AllReduceStrategy",
    "BSPStrategy",
    "DTSSPStrategy",
    "ParameterServerStrategy",
    "SSPStrategy",
    "SyncReplicasStrategy",
    "default_variable_filter",
]
