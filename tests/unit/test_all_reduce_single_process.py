"""tfdist.AllReduceStrategy in one process (no cluster): predict and evaluate over several batches."""

import numpy as np


def test_predict_over_several_batches_matches_the_model_without_a_strategy():
    import keras

    import tfdist

    strategy = tfdist.AllReduceStrategy()
    with strategy.scope():
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(10)])
        model.compile("sgd", "mse")
    x = np.random.default_rng(0).random((100, 4), dtype=np.float32)
    got = model.predict(x, batch_size=32, verbose=0)  # 4 batches, the last one partial
    assert got.shape == (100, 10)
    np.testing.assert_allclose(got, x @ model.get_weights()[0] + model.get_weights()[1], rtol=1e-5, atol=1e-6)
    loss = model.evaluate(x, np.zeros((100, 10), np.float32), batch_size=32, verbose=0)
    np.testing.assert_allclose(loss, np.mean(got ** 2), rtol=1e-4)
