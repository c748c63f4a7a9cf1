"""tf.distribute strategies for Keras 3."""

from tfdist.strategies.parameter_server import ParameterServerStrategy, default_variable_filter

__all__ = ["ParameterServerStrategy", "default_variable_filter"]
