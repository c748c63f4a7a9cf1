"""tf.distribute strategies for Keras 3."""

from tfdist.strategies.parameter_server import (
    BSPStrategy,
    DTSSPStrategy,
    ParameterServerStrategy,
    SSPStrategy,
    SyncReplicasStrategy,
    default_variable_filter,
)

__all__ = [
    "BSPStrategy",
    "DTSSPStrategy",
    "ParameterServerStrategy",
    "SSPStrategy",
    "SyncReplicasStrategy",
    "default_variable_filter",
]
