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
