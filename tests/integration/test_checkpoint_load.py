"""PS checkpoints outside the job: load_into a plain Keras model, and resume a single-process job.

One process with the in-process parameter server (``ps.checkpoint_dir`` set):
train, ``strategy.checkpoint()``, then a model built with no strategy gets the
same predictions; a second strategy on the same directory starts from the
checkpoint instead of fresh weights.
"""

import numpy as np
import pytest

keras = pytest.importorskip("keras")

import tfdist  # noqa: E402
from tfdist.config import JobConfig  # noqa: E402
from tfdist.datasets import load_digits  # noqa: E402
from tfdist.errors import TfdistError  # noqa: E402

pytestmark = pytest.mark.timeout(300)


def _build():
    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(16, activation="relu"),
                              keras.layers.Dense(10, activation="softmax")])
    model.compile(optimizer=keras.optimizers.Adam(1e-2), loss="sparse_categorical_crossentropy")
    return model


def _config(directory):
    config = JobConfig(name="ckpt")
    config.ps.checkpoint_dir = str(directory)
    return config


@pytest.mark.parametrize("consistency", ["async", "bsp"])
def test_a_checkpoint_loads_into_a_plain_model_and_resumes_a_job(tmp_path, consistency):
    data = load_digits()
    x, y = data.x_train.reshape(-1, 64), data.y_train
    xt = data.x_test.reshape(-1, 64)
    keras.backend.clear_session()
    keras.utils.set_random_seed(0)
    strategy = tfdist.ParameterServerStrategy(config=_config(tmp_path), consistency=consistency)
    try:
        with strategy.scope():
            trained = _build()
        trained.fit(x, y, batch_size=32, epochs=1, verbose=0)
        [written] = strategy.checkpoint()
        assert written["step"] > 0 and written["path"].endswith(".json")
        strategy.pull()
        expected = trained.predict(xt, verbose=0)
    finally:
        strategy.shutdown()

    keras.backend.clear_session()  # layer names as in a fresh process (a serving job)
    plain = _build()  # no strategy
    assert [w.path for w in plain.weights] == [w.path for w in trained.weights]
    before = plain.predict(xt, verbose=0)
    info = tfdist.checkpoint.load_into(plain, str(tmp_path))
    assert info.num_ps == 1 and info.path == ("gradient" if consistency == "bsp" else "update")
    assert info.steps[0] >= written["step"]  # (the PS also wrote a last one when the strategy shut down)
    np.testing.assert_allclose(plain.predict(xt, verbose=0), expected, rtol=1e-5, atol=1e-6)
    assert not np.allclose(before, expected)
    if consistency == "bsp":  # the gradient path keeps the optimizer's state on the PS too
        plain.optimizer.build(plain.trainable_variables)
        tfdist.checkpoint.load_into(plain, str(tmp_path))
        assert int(plain.optimizer.iterations.numpy()) == written["step"]

    # resume: a new job (a fresh process: the same layer names) on the same directory starts where the last
    # one ended
    keras.backend.clear_session()
    strategy = tfdist.ParameterServerStrategy(config=_config(tmp_path), consistency=consistency)
    try:
        with strategy.scope():
            resumed = _build()
            # the gradient path keeps the optimizer's variables on the PS: they must exist before the first
            # step of any kind (fit builds them; a predict first needs them built)
            resumed.optimizer.build(resumed.trainable_variables)
        np.testing.assert_allclose(resumed.predict(xt, verbose=0), expected, rtol=1e-5, atol=1e-6)
    finally:
        strategy.shutdown()


def test_layer_names_that_differ_are_matched_by_position_and_wrong_models_are_refused(tmp_path):
    data = load_digits()
    keras.backend.clear_session()
    strategy = tfdist.ParameterServerStrategy(config=_config(tmp_path))
    try:
        with strategy.scope():
            trained = _build()
        trained.fit(data.x_train.reshape(-1, 64)[:256], data.y_train[:256], batch_size=32, epochs=1, verbose=0)
        strategy.pull()
        expected = trained.predict(data.x_test.reshape(-1, 64), verbose=0)
    finally:
        strategy.shutdown()
    _build()  # takes the default names: the next model's layers are dense_2, dense_3 ...
    renamed = _build()
    assert renamed.weights[0].path != trained.weights[0].path
    tfdist.checkpoint.load_into(renamed, str(tmp_path))
    np.testing.assert_allclose(renamed.predict(data.x_test.reshape(-1, 64), verbose=0), expected,
                               rtol=1e-5, atol=1e-6)
    other = keras.Sequential([keras.Input((64,)), keras.layers.Dense(8), keras.layers.Dense(10)])
    with pytest.raises(TfdistError, match="do not match the checkpoint"):
        tfdist.checkpoint.load_into(other, str(tmp_path))
    with pytest.raises(TfdistError, match="No parameter-server checkpoints"):
        tfdist.checkpoint.load_into(renamed, str(tmp_path / "nothing"))
