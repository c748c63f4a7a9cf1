"""Which variables the parameter servers share (README "What lives where"): the default variable filter.

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

__all__ = ["default_variable_filter", "layer_state_is_shared"]

#: Aggregations of variables the parameter servers hold (metric accumulators are ``SUM``).
_PS_AGGREGATIONS = (tf.VariableAggregation.NONE, tf.VariableAggregation.MEAN)
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


def default_variable_filter(name: str, kwargs: Mapping[str, Any], owner: Any = None) -> bool:
    """True for model variables, which belong on the parameter servers.

    Model weights and the statistics of Keras's layers (BatchNorm moving
    statistics, Normalization's mean/variance) go to the PS; a custom layer's
    non-trainable state only when marked with ``aggregation="sum"``/``"mean"``
    (``_shared_state.py``). Optimizer slots (created with ``colocate_with``),
    optimizer counters and learning rates (``ONLY_FIRST_REPLICA``), metric
    accumulators (``SUM``), random-seed state and integer variables are not
    model variables (on the gradient path the optimizer's variables also go to
    the PS, as part of the state snapshot: ``_variable_registry.is_optimizer_variable``).
    ``owner``: the object creating the variable, when known.
    """
    if kwargs.get("colocate_with") is not None or "seed_generator" in name:
        return False
    layer_state = layer_state_is_shared(kwargs, owner)
    if layer_state is not None:
        return layer_state
    return kwargs.get("aggregation", tf.VariableAggregation.NONE) in _PS_AGGREGATIONS
