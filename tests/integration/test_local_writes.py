"""Weights a worker writes itself are kept by reads and reach the job by a documented rule (issue #15 item 1).

README "Local writes": a worker's ``set_weights``/``load_weights``/
``EarlyStopping(restore_best_weights=True)`` survive its ``evaluate``,
``predict`` and ``strategy.pull()``; under async/SSP/DTSSP its next training
step sends them to the job (as part of its update); ``pull(keep_local_writes
=False)`` discards them.
"""

import numpy as np
import pytest

from tfdist.datasets import load_digits

pytestmark = pytest.mark.timeout(300)

TOKEN = "a-token-123"


def _mlp(strategy, lr=1e-2, optimizer=None):
    import keras

    keras.utils.set_random_seed(0)
    with strategy.scope():  # fixed names: both workers of one process must build the same variables
        model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(32, activation="relu", name="hidden"),
                                  keras.layers.Dense(10, activation="softmax", name="out")], name="model")
        model.compile(optimizer() if optimizer else keras.optimizers.SGD(lr, name="sgd"),
                      "sparse_categorical_crossentropy",
                      metrics=["accuracy"])
    return model


@pytest.mark.parametrize("consistency", ["async", "bsp"])
def test_early_stopping_restores_the_best_weights_and_evaluate_keeps_them(monkeypatch, consistency):
    """One process (in-process PS): epochs after the first diverge (learning rate 10); ES restores epoch 1."""
    import keras

    import tfdist

    monkeypatch.delenv("TF_CONFIG", raising=False)
    monkeypatch.delenv("TFDIST_CONFIG", raising=False)
    data = load_digits()
    x, y = data.x_train.reshape(-1, 64), data.y_train
    xv, yv = data.x_test.reshape(-1, 64), data.y_test
    strategy = tfdist.ParameterServerStrategy(consistency=consistency)
    try:
        model = _mlp(strategy, optimizer=lambda: keras.optimizers.Adam(1e-2, name="adam"))
        stop = keras.callbacks.EarlyStopping("val_accuracy", patience=1, restore_best_weights=True)
        schedule = keras.callbacks.LearningRateScheduler(lambda epoch, lr: 1e-2 if epoch == 0 else 10.0)
        history = model.fit(x, y, batch_size=32, epochs=3, validation_data=(xv, yv), verbose=0,
                            callbacks=[schedule, stop])
        accuracies = history.history["val_accuracy"]
        assert stop.best_epoch == 0 and accuracies[0] > 0.8 and min(accuracies[1:]) < 0.5, accuracies
        _, accuracy = model.evaluate(xv, yv, verbose=0)  # without the rule: the PS's diverged values (0.1)
        assert accuracy == pytest.approx(accuracies[0], abs=1e-6)
        strategy.pull()  # README: pull, then save; the restored weights stay
        _, accuracy = model.evaluate(xv, yv, verbose=0)
        assert accuracy == pytest.approx(accuracies[0], abs=1e-6)
        if consistency == "async":  # the job still holds the diverged values: discarding the writes loads them
            strategy.pull(keep_local_writes=False)
            _, accuracy = model.evaluate(xv, yv, verbose=0)
            assert accuracy < 0.5
    finally:
        strategy.shutdown()


@pytest.mark.parametrize("consistency", ["async", "ssp"])
def test_a_write_reaches_the_job_with_the_next_training_step(monkeypatch, consistency):
    """Two workers in one process around an in-process PS: the chief sets weights after training."""
    import tfdist
    from tfdist.ps.server import PSServer

    monkeypatch.delenv("TF_CONFIG", raising=False)
    monkeypatch.delenv("TFDIST_CONFIG", raising=False)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 64)).astype("float32")
    y = rng.integers(0, 10, size=64)
    server = PSServer(None, token=TOKEN, num_workers=2).start()
    cluster = {"worker": ["127.0.0.1:1", "127.0.0.1:2"], "ps": [server.address]}
    strategies = []
    try:
        def make(task):  # SSP with a bound the idle other worker never reaches
            if consistency == "ssp":
                return tfdist.SSPStrategy(staleness=100, cluster=cluster, task=task, token=TOKEN)
            # every step exchanged (exchange_every: auto, the default, may hold the next step; held steps are sent
            # before a local write and at the next exchange or read: test_single_process_ps.py)
            return tfdist.ParameterServerStrategy(cluster=cluster, task=task, token=TOKEN, exchange_every=1)

        chief = make("worker:0")
        strategies.append(chief)
        chief_model = _mlp(chief)
        chief_model.fit(x, y, batch_size=16, epochs=1, verbose=0)
        other = make("worker:1")
        strategies.append(other)
        other_model = _mlp(other)
        job = other_model.predict(x[:8], verbose=0)  # its first step pulls the job's values

        written = [w * 0.5 + 0.01 for w in chief_model.get_weights()]
        chief_model.set_weights(written)  # a local write after training
        mine = chief_model.predict(x[:8], verbose=0)  # a read: the write is kept
        assert not np.allclose(mine, job, atol=1e-4)
        for got, want in zip(chief_model.get_weights(), written):
            np.testing.assert_allclose(got, want, rtol=1e-6)
        np.testing.assert_allclose(other_model.predict(x[:8], verbose=0), job, rtol=1e-5, atol=1e-6)  # not sent

        # The chief's next training step (learning rate 0: the update is exactly the write) sends it.
        chief_model.optimizer.learning_rate.assign(0.0)
        chief_model.fit(x[:16], y[:16], batch_size=16, epochs=1, verbose=0)
        np.testing.assert_allclose(other_model.predict(x[:8], verbose=0), mine, rtol=1e-5, atol=1e-5)
        for got, want in zip(other_model.get_weights(), written):
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    finally:
        for s in strategies:
            s.shutdown()
        server.stop(0)


def test_writes_before_the_first_step_follow_the_chief_and_an_evaluator_mirrors_the_job(monkeypatch):
    """A non-chief's write before it joins is replaced by the job's values (the chief's are the job's)."""
    import tfdist
    from tfdist.ps.server import PSServer

    monkeypatch.delenv("TF_CONFIG", raising=False)
    monkeypatch.delenv("TFDIST_CONFIG", raising=False)
    x = np.random.default_rng(1).normal(size=(16, 64)).astype("float32")
    server = PSServer(None, token=TOKEN, num_workers=2).start()
    cluster = {"worker": ["127.0.0.1:1", "127.0.0.1:2"], "ps": [server.address]}
    strategies = []
    try:
        chief = tfdist.ParameterServerStrategy(cluster=cluster, task="worker:0", token=TOKEN)
        strategies.append(chief)
        chief_model = _mlp(chief)
        chief_model.set_weights([w + 1.0 for w in chief_model.get_weights()])  # before the job starts
        expected = chief_model.predict(x, verbose=0)  # initialises the PS with the chief's values
        other = tfdist.ParameterServerStrategy(cluster=cluster, task="worker:1", token=TOKEN)
        strategies.append(other)
        other_model = _mlp(other)
        other_model.set_weights([w - 1.0 for w in other_model.get_weights()])  # before it joins: not the job's
        np.testing.assert_allclose(other_model.predict(x, verbose=0), expected, rtol=1e-5, atol=1e-6)
        assert not other.extended._runtime.registry.written
    finally:
        for s in strategies:
            s.shutdown()
        server.stop(0)
