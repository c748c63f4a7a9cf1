"""The only module of tfdist that imports ``tensorflow.python.*``.

TensorFlow upgrades touch this file alone. Checked on TF 2.21 / Keras 3.15:
a ``tf.distribute.Strategy`` over a subclass of ``OneDeviceExtended`` works
with Keras 3 ``fit``/``evaluate``/``predict``, and its hooks
(``_create_variable``, ``_call_for_each_replica``, ``_batch_reduce_to``,
``_update``) see every variable and every step (DESIGN.md §1).
"""

from tensorflow.python.distribute import distribute_lib, one_device_strategy

OneDeviceExtended = one_device_strategy.OneDeviceExtended
StrategyBase = distribute_lib.Strategy

__all__ = ["OneDeviceExtended", "StrategyBase"]
