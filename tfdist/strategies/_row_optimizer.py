"""A Keras optimizer as the row optimizer the parameter servers run on embedding-table rows.

Used by the PS runtime (the model's optimizer, for tables given none) and by
:class:`tfdist.layers.ShardedEmbedding` (which re-exports :func:`row_optimizer_spec`).
"""

from __future__ import annotations

import logging
from typing import Any, Mapping

import keras

from tfdist.errors import ConfigError
from tfdist.ps.sparse import OPTIMIZERS, make_row_optimizer

__all__ = ["row_optimizer_spec"]

logger = logging.getLogger(__name__)

#: Keras optimizer class name → row optimizer kind, and the hyper-parameters that carry over.
_KERAS_TO_ROW = {
    "SGD": ("sgd", ("momentum", "nesterov")),
    "Adagrad": ("adagrad", ("initial_accumulator_value", "epsilon")),
    "Adam": ("adam", ("beta_1", "beta_2", "epsilon")),
    "Ftrl": ("ftrl", ("learning_rate_power", "initial_accumulator_value", "l1_regularization_strength",
                      "l2_regularization_strength", "l2_shrinkage_regularization_strength", "beta")),
}
#: Options of Keras optimizers the PS does not apply to table rows.
_NOT_APPLIED = ("weight_decay", "clipnorm", "clipvalue", "global_clipnorm", "use_ema", "amsgrad")


def row_optimizer_spec(optimizer: Any) -> dict[str, Any]:
    """The row optimizer (``{"kind": ..., hyper-parameters}``) for a Keras optimizer, or a spec as given.

    Raises:
        ConfigError: an optimizer the PS cannot run on rows (e.g. RMSprop,
            AdamW): pass ``optimizer={"kind": "adam", ...}`` to the layer.
    """
    if isinstance(optimizer, Mapping):
        make_row_optimizer(optimizer)
        return dict(optimizer)
    if isinstance(optimizer, str):
        optimizer = keras.optimizers.get(optimizer)
    name = type(optimizer).__name__
    if name not in _KERAS_TO_ROW:
        raise ConfigError(
            f"ShardedEmbedding: the parameter servers cannot apply {name} to table rows. Pass the layer a row "
            f"optimizer, e.g. optimizer={{'kind': 'adam', 'learning_rate': 1e-3}} (kinds: {sorted(OPTIMIZERS)}).")
    kind, params = _KERAS_TO_ROW[name]
    config = optimizer.get_config()
    spec: dict[str, Any] = {"kind": kind}
    lr = config.get("learning_rate")
    if isinstance(lr, (int, float)):
        spec["learning_rate"] = float(lr)
    for p in params:
        if p in config:
            spec[p] = bool(config[p]) if isinstance(OPTIMIZERS[kind][p], bool) else float(config[p])
    ignored = [o for o in _NOT_APPLIED if config.get(o)]
    if ignored:
        logger.warning("ShardedEmbedding: %s options %s are not applied to the table's rows on the parameter servers",
                       name, ignored)
    make_row_optimizer(spec)
    return spec
