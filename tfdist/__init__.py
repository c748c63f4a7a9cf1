"""tfdist: distributed Keras 3 training for workers that are not equal.

Public names are imported lazily so that processes which need no TensorFlow
(a parameter server, the launcher) start fast and small.
"""

from __future__ import annotations

from tfdist import exit_status as _exit_status
from tfdist._lazy import lazy_names

# Records a script's uncaught exception, so a task that died never tells the parameter servers it is done,
# and gives a ConfigError its own exit code (78) that the launcher never restarts (tfdist/exit_status.py).
_exit_status.install()

__version__ = "0.1.0"

_LAZY = {
    "ParameterServerStrategy": "tfdist.strategies.parameter_server",
    "SyncReplicasStrategy": "tfdist.strategies.parameter_server",
    "BSPStrategy": "tfdist.strategies.parameter_server",
    "SSPStrategy": "tfdist.strategies.parameter_server",
    "DTSSPStrategy": "tfdist.strategies.parameter_server",
    "AllReduceStrategy": "tfdist.strategies.all_reduce",
    "consistency": "tfdist.consistency",
    "JobConfig": "tfdist.config",
    "ClusterConfig": "tfdist.config",
    "load_config": "tfdist.config",
    "errors": "tfdist.errors",
    "callbacks": "tfdist.callbacks",
    "collective": "tfdist.collective",
    "straggler": "tfdist.straggler",
    "data": "tfdist.data",
    "federated": "tfdist.federated",
    "elastic": "tfdist.elastic",
    "testing": "tfdist.testing",
    "ps": "tfdist.ps",
    "checkpoint": "tfdist.checkpoint",
    "layers": "tfdist.layers",
}

__all__ = sorted(_LAZY) + ["__version__"]


__getattr__, __dir__ = lazy_names(__name__, _LAZY, globals())
