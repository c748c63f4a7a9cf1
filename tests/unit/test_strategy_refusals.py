"""What tfdist strategies refuse clearly instead of failing deep inside TF (single process)."""

import numpy as np
import pytest


@pytest.mark.parametrize("make", ["ps", "all_reduce"])
def test_jit_compile_is_refused_with_the_fix(make):
    import keras

    import tfdist
    from tfdist.errors import ConfigError

    strategy = tfdist.ParameterServerStrategy() if make == "ps" else tfdist.AllReduceStrategy()
    try:
        with strategy.scope():
            model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])
            model.compile("sgd", "mse", jit_compile=True)
        with pytest.raises(ConfigError, match=r"XLA.*jit_compile=True.*jit_compile=False"):
            model.fit(np.zeros((8, 4), np.float32), np.zeros((8, 3), np.float32), verbose=0)
    finally:
        if make == "ps":
            strategy.shutdown()


@pytest.mark.parametrize("make", ["bsp", "sync_replicas"])
def test_dynamic_loss_scaling_is_refused_by_the_synchronous_ps_modes(make):
    """mixed_float16 on the gradient path: each worker would decide alone to skip an overflowing step.

    The job is described, never contacted: the refusal comes while the first step traces.
    """
    import keras

    import tfdist
    from tfdist.errors import ConfigError

    cluster = {"worker": ["127.0.0.1:1", "127.0.0.1:2"], "ps": ["127.0.0.1:3"]}
    kwargs = dict(cluster=cluster, task="worker:0", token="t")
    strategy = (tfdist.BSPStrategy(**kwargs) if make == "bsp"
                else tfdist.SyncReplicasStrategy(replicas_to_aggregate=1, **kwargs))
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        with strategy.scope():
            model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])
            model.compile(keras.optimizers.SGD(0.1), "mse")
        with pytest.raises(ConfigError, match=r"dynamic loss scaling.*mixed_bfloat16"):
            model.fit(np.zeros((8, 4), np.float32), np.zeros((8, 3), np.float32), verbose=0)
    finally:
        keras.mixed_precision.set_global_policy("float32")
        strategy.shutdown()


def test_mixed_float16_counts_each_step_once_in_a_single_process():
    """LossScaleOptimizer calls call_for_each_replica from inside the step: part of the step, not a second one."""
    import keras

    import tfdist

    keras.mixed_precision.set_global_policy("mixed_float16")
    strategy = tfdist.ParameterServerStrategy()
    try:
        with strategy.scope():
            model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])
            model.compile(keras.optimizers.SGD(0.1), "mse")
        history = model.fit(np.ones((64, 4), np.float32), np.ones((64, 3), np.float32), batch_size=8, verbose=0)
        assert history.history["ps_step"] == [8.0]
        assert strategy.ps_status()[0]["worker_batches"] == {"0": 8}  # the PS heard of 8 batches, not 16
    finally:
        keras.mixed_precision.set_global_policy("float32")
        strategy.shutdown()


_LEGACY = """
import os
import tfdist
from tfdist.errors import ConfigError
if os.environ.get("TF_USE_LEGACY_KERAS"):
    import tensorflow as tf
    keras = tf.keras
else:
    import tf_keras as keras
assert keras.__name__.startswith("tf_keras"), keras.__name__
for make in (tfdist.ParameterServerStrategy, tfdist.AllReduceStrategy):
    strategy = make()
    try:
        with strategy.scope():
            model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])
    except ConfigError as e:
        print(make.__name__, "REFUSED", e)
    else:
        print(make.__name__, "ACCEPTED")
    if hasattr(strategy, "shutdown"):
        strategy.shutdown()
"""


@pytest.mark.parametrize("how", ["TF_USE_LEGACY_KERAS=1", "import tf_keras"])
def test_a_tf_keras_model_is_refused_clearly(how, tmp_path):
    """tfdist supports Keras 3 only (#15 item 9): a tf-keras model is refused when it creates a variable.

    A process of its own per case (``import tf_keras`` forked from the zygote under fast start; the variable,
    read at import time, needs a fresh interpreter)."""
    import os
    import sys

    import importlib.util

    from tfdist.testing import run_python

    if importlib.util.find_spec("tf_keras") is None:  # a test dependency (setup.py "test" extras)
        pytest.skip("tf-keras is not installed (pip install -e .[test])")
    env = {k: v for k, v in os.environ.items() if k not in ("TF_CONFIG", "TFDIST_CONFIG", "TF_USE_LEGACY_KERAS")}
    if how.startswith("TF_USE"):
        env["TF_USE_LEGACY_KERAS"] = "1"
    script = tmp_path / "legacy.py"
    script.write_text(_LEGACY)
    proc = run_python([sys.executable, str(script)], env, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    for name in ("ParameterServerStrategy", "AllReduceStrategy"):
        line = next((ln for ln in lines if ln.startswith(name + " ")), "")
        assert "REFUSED" in line and "supports Keras 3" in line, proc.stdout + proc.stderr[-2000:]
        assert ("TF_USE_LEGACY_KERAS=1" if how.startswith("TF_USE") else "import tf_keras") in line
