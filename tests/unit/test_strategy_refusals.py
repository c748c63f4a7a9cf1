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
def test_a_tf_keras_model_is_refused_clearly(how):
    """tfdist supports Keras 3 only (#15 item 9): a tf-keras model is refused when it creates a variable."""
    import os
    import subprocess
    import sys

    import importlib.util

    if importlib.util.find_spec("tf_keras") is None:  # a test dependency (setup.py "test" extras)
        pytest.skip("tf-keras is not installed (pip install -e .[test])")
    env = {k: v for k, v in os.environ.items() if k not in ("TF_CONFIG", "TFDIST_CONFIG", "TF_USE_LEGACY_KERAS")}
    if how.startswith("TF_USE"):
        env["TF_USE_LEGACY_KERAS"] = "1"
    proc = subprocess.run([sys.executable, "-c", _LEGACY], env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    for name in ("ParameterServerStrategy", "AllReduceStrategy"):
        line = next((ln for ln in lines if ln.startswith(name + " ")), "")
        assert "REFUSED" in line and "supports Keras 3" in line, proc.stdout + proc.stderr[-2000:]
        assert ("TF_USE_LEGACY_KERAS=1" if how.startswith("TF_USE") else "import tf_keras") in line
