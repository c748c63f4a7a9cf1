"""Which non-trainable state of a layer the parameter servers share (README "What lives where").

A layer's trainable weights are the model and always shared. Its
non-trainable state is of two kinds:

* **layer statistics** of Keras's own layers (``BatchNormalization``'s moving
  mean and variance, ``Normalization``'s adapted mean, variance and count,
  and those of any subclass): shared, as the model's weights are;
* **custom state** of your own layers (a counter, a running maximum, a
  cache): *local to each worker*, unless marked with
  ``add_weight(..., aggregation="sum")`` (or ``"mean"``), which shares it:
  under async, SSP and DTSSP every worker's change is added to the job's
  value (a ``"sum"`` counter counts the job's steps); under BSP and
  SyncReplicas it is part of the state snapshot a lagging worker reloads.

Local by default because the update path exchanges *additive* changes: a
shared running maximum of data whose maximum is 1.0 would become 2.0 with
two workers. Integer state is always local (the parameter servers hold
floating-point values).
"""

from __future__ import annotations

from typing import Any, Mapping

import keras
import tensorflow as tf

__all__ = ["layer_state_is_shared"]

#: Aggregations that mark a custom layer's non-trainable state as shared.
SHARED_MARKS = (tf.VariableAggregation.SUM, tf.VariableAggregation.MEAN)


def _is_keras_layer_class(cls: type) -> bool:
    """A concrete layer of Keras itself (not the generic ``Layer``/model bases every custom layer has)."""
    module = getattr(cls, "__module__", "") or ""
    return module.startswith("keras.src.layers.") and module != "keras.src.layers.layer"


def layer_state_is_shared(kwargs: Mapping[str, Any], owner: Any) -> bool | None:
    """Whether a layer's non-trainable variable being created goes to the parameter servers.

    Args:
        kwargs: The variable's creation arguments (``trainable``, ``aggregation``).
        owner: The object creating it (:func:`tfdist._tf_compat.keras_variable_owner`).

    Returns:
        ``None`` when the variable is not a layer's non-trainable state (the
        general rule decides), else ``True`` for a Keras layer statistic or a
        marked variable and ``False`` for unmarked custom state.
    """
    if kwargs.get("trainable") is not False or not isinstance(owner, keras.layers.Layer):
        return None
    if isinstance(owner, keras.Model):  # a model's own variables (rare): the general rule
        return None
    if any(_is_keras_layer_class(cls) for cls in type(owner).__mro__):
        return True
    return kwargs.get("aggregation", tf.VariableAggregation.NONE) in SHARED_MARKS
