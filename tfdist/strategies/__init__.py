"""tf.distribute strategies for Keras 3.

Imported lazily (as ``tfdist`` itself): a process that needs one of the
TensorFlow-free modules here (``_stuck``'s exit watchdog, the variable
registry's files) does not import TensorFlow through this package.
"""

from __future__ import annotations

import importlib
from typing import Any

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


def __getattr__(name: str) -> Any:
    module_name = _LAZY.get(name)
    if module_name is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module_name), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
