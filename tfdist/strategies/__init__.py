"""tf.distribute strategies for Keras 3.

Imported lazily (as ``tfdist`` itself): a process that needs one of the
TensorFlow-free modules here (``_stuck``'s exit watchdog) does not import
TensorFlow through this package.
"""

from __future__ import annotations

from tfdist._lazy import lazy_names

_LAZY = {
    "AllReduceStrategy": "tfdist.strategies.all_reduce",
    "BSPStrategy": "tfdist.strategies.parameter_server",
    "DTSSPStrategy": "tfdist.strategies.parameter_server",
    "ParameterServerStrategy": "tfdist.strategies.parameter_server",
    "SSPStrategy": "tfdist.strategies.parameter_server",
    "SyncReplicasStrategy": "tfdist.strategies.parameter_server",
    "default_variable_filter": "tfdist.strategies.parameter_server",
}

__all__ = sorted(_LAZY)
__getattr__, __dir__ = lazy_names(__name__, _LAZY, globals())
