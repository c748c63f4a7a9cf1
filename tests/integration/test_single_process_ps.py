"""One process, no cluster (README "Single process"): async training is Keras's own step (issue #15 item 10).

The steps exchange nothing (no py_function runs during ``fit``); the
in-process PS learns of them when something reads it, and a local write
never travels in one update with held training steps.
"""

import os
import sys

import numpy as np
import pytest

from tfdist.datasets import load_digits

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "scripts"))
from digits_mlp import sgd_mlp as _model  # noqa: E402  (shared with test_lone_worker.py)

pytestmark = pytest.mark.timeout(240)


def test_async_training_exchanges_nothing_and_equals_plain_keras(no_cluster, monkeypatch):
    import tfdist

    data = load_digits()
    x, y = data.x_train.reshape(-1, 64), data.y_train
    plain = _model()
    plain.fit(x, y, batch_size=32, epochs=2, shuffle=False, verbose=0)

    strategy = tfdist.ParameterServerStrategy()
    runtime = strategy._runtime
    calls = []
    for name in ("begin_step", "end_step"):  # the per-step exchange of a cluster job
        original = getattr(runtime, name)
        monkeypatch.setattr(runtime, name, lambda *a, _o=original, _n=name, **k: (calls.append(_n), _o(*a, **k))[1])
    try:
        with strategy.scope():
            model = _model()
        history = model.fit(x, y, batch_size=32, epochs=2, shuffle=False, verbose=0)
        steps = 2 * int(np.ceil(len(x) / 32))
        assert calls == [], calls[:5]
        assert history.history["ps_step"][-1] == steps  # the job's step count is this process's
        for got, want in zip(model.get_weights(), plain.get_weights()):
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
        model.evaluate(x, y, verbose=0)
        assert calls == []

        status = strategy.ps_status()[0]  # a read: the held steps reach the PS first
        assert status["worker_batches"] == {"0": steps}
        trained = model.get_weights()
        strategy.pull(keep_local_writes=False)  # the PS holds exactly the local state
        for got, want in zip(model.get_weights(), trained):
            np.testing.assert_allclose(got, want, rtol=1e-6)
    finally:
        strategy.shutdown()


def test_a_write_after_held_steps_can_be_discarded_without_losing_the_steps(no_cluster):
    import tfdist

    data = load_digits()
    x, y = data.x_train.reshape(-1, 64), data.y_train
    strategy = tfdist.ParameterServerStrategy()
    try:
        with strategy.scope():
            model = _model()
        model.fit(x, y, batch_size=32, epochs=1, verbose=0)  # held steps: the PS has not seen them
        trained = model.get_weights()
        model.set_weights([np.zeros_like(w) for w in trained])  # the held steps are sent before the write
        strategy.pull()  # keeps the write
        assert all(not w.any() for w in model.get_weights())
        strategy.pull(keep_local_writes=False)  # the job's state: the trained steps, not the initial values
        for got, want in zip(model.get_weights(), trained):
            np.testing.assert_allclose(got, want, rtol=1e-6)

        # A write followed by training: the next read sends both (the write reached the job with the step).
        model.set_weights([w * 0.5 for w in trained])
        model.fit(x[:32], y[:32], batch_size=32, epochs=1, verbose=0)
        after = model.get_weights()
        strategy.pull(keep_local_writes=False)
        for got, want in zip(model.get_weights(), after):
            np.testing.assert_allclose(got, want, rtol=1e-6)
        assert strategy.ps_status()[0]["worker_batches"] == {"0": int(np.ceil(len(x) / 32)) + 1}
    finally:
        strategy.shutdown()


def test_run_eagerly_steps_are_training_not_local_writes(no_cluster, monkeypatch):
    """Under run_eagerly the optimizer's writes are eager: they must not count as local writes (no flush)."""
    import keras

    import tfdist

    data = load_digits()
    x, y = data.x_train.reshape(-1, 64)[:320], data.y_train[:320]
    strategy = tfdist.ParameterServerStrategy()
    runtime = strategy._runtime
    flushes = []
    original = runtime.flush_local_steps
    monkeypatch.setattr(runtime, "flush_local_steps", lambda: (flushes.append(1), original())[1])
    try:
        with strategy.scope():
            model = _model()
            model.compile(keras.optimizers.SGD(0.05), "sparse_categorical_crossentropy", run_eagerly=True)
        model.fit(x, y, batch_size=32, epochs=1, verbose=0)
        assert flushes == [] and not runtime.registry.written
        assert strategy.ps_status()[0]["worker_batches"] == {"0": 10}
    finally:
        strategy.shutdown()


def test_train_on_batch_returns_what_plain_keras_returns(no_cluster):
    """The ps_* statistics join fit's logs and return_dict=True, not train_on_batch's list (or its lone loss)."""
    import keras

    import tfdist

    x, y = np.ones((16, 4), np.float32), np.zeros((16,), np.int64)

    def build(metrics):
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, activation="softmax")])
        model.compile("sgd", "sparse_categorical_crossentropy", metrics=metrics)
        return model

    plain = [build([]).train_on_batch(x, y), build(["accuracy"]).train_on_batch(x, y)]
    strategy = tfdist.ParameterServerStrategy()
    try:
        with strategy.scope():
            bare, with_accuracy = build([]), build(["accuracy"])
        got = [bare.train_on_batch(x, y), with_accuracy.train_on_batch(x, y)]
        as_dict = with_accuracy.train_on_batch(x, y, return_dict=True)
    finally:
        strategy.shutdown()
    assert isinstance(plain[0], float) and isinstance(got[0], float), (plain, got)  # a lone loss stays a number
    assert len(plain[1]) == len(got[1]) == 2, (plain, got)  # [loss, accuracy]
    assert {"loss", "accuracy", "ps_step", "ps_dropped", "ps_waits", "ps_staleness", "ps_refreshes"} == set(as_dict)


@pytest.mark.parametrize("make", ["async", "bsp"])
def test_a_custom_loop_whose_optimizer_is_built_by_its_first_step(no_cluster, make):
    """strategy.run + apply_gradients, the optimizer unbuilt before the job's first step (its slots are
    created while the step traces). BSP keeps optimizer slots on the PS: it initialised the PS from slots
    TF had not initialised yet ("value ... is float32[0]") and failed the first step."""
    import keras
    import tensorflow as tf

    import tfdist

    strategy = tfdist.ParameterServerStrategy() if make == "async" else tfdist.BSPStrategy()
    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 8)).astype(np.float32)
    y = (x @ rng.normal(size=(8, 4))).astype(np.float32)
    try:
        with strategy.scope():
            model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(4)])
            optimizer = keras.optimizers.Adam(0.05)

        @tf.function
        def step(xb, yb):
            def replica(xb, yb):
                with tf.GradientTape() as tape:
                    loss = tf.reduce_mean((model(xb, training=True) - yb) ** 2)
                grads = tape.gradient(loss, model.trainable_variables)
                optimizer.apply_gradients(zip(grads, model.trainable_variables))
                return loss

            return strategy.reduce(tf.distribute.ReduceOp.SUM, strategy.run(replica, args=(xb, yb)), axis=None)

        losses = [float(step(x, y)) for _ in range(20)]
        assert losses[-1] < 0.5 * losses[0], losses
        assert int(keras.ops.convert_to_numpy(optimizer.iterations)) == 20
        local = [np.array(w) for w in model.get_weights()]
        strategy.pull(keep_local_writes=False)  # the job's values are the ones the loop trained
        for got, want in zip(model.get_weights(), local):
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    finally:
        strategy.shutdown()


def test_a_local_step_is_counted_after_it_wrote_its_variables(no_cluster):
    """The step counter a local-only step adds comes after the step's variable writes in its graph.

    A reader that sees the count must see the step's values: a lone worker's background exchange reads the
    count, then the values, and a flush that finds no step unsent sends nothing. With the count free to run
    before the optimizer's writes, an exchange sent part of the last step and counted all of it; the PS then
    missed the rest for good (test_lone_worker's fit-after-leaving test failed so, under load).
    """
    import keras
    import tensorflow as tf

    import tfdist

    strategy = tfdist.ParameterServerStrategy()
    try:
        with strategy.scope():
            model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16), keras.layers.Dense(4)])
            optimizer = keras.optimizers.SGD(0.05)

        @tf.function
        def step(xb, yb):
            def replica(xb, yb):
                with tf.GradientTape() as tape:
                    loss = tf.reduce_mean((model(xb, training=True) - yb) ** 2)
                optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables),
                                              model.trainable_variables))
                return loss

            return strategy.run(replica, args=(xb, yb))

        x, y = np.ones((4, 8), np.float32), np.zeros((4, 4), np.float32)
        step(x, y)
        runtime = strategy._runtime
        assert runtime.local_only()
        graph = step.get_concrete_function(x, y).graph
        # the placeholder each variable's resource handle is captured as
        inner = {id(outer): ph.op.name for outer, ph in graph.captures}
        counter = inner[id(runtime._local_steps.handle)]
        kernels = {inner[id(v.handle)] for v in model.trainable_variables}
    finally:
        strategy.shutdown()

    writes = {}  # captured variable -> the ops of the step that write it
    for op in graph.get_operations():
        if op.type.startswith(("AssignAdd", "AssignSub", "AssignVariable", "ResourceApply")):
            writes.setdefault(op.inputs[0].op.name, []).append(op)
    assert kernels <= set(writes) and len(writes[counter]) == 1, {k: [o.type for o in v] for k, v in writes.items()}

    def ancestors(op):
        seen, todo = set(), [op]
        while todo:
            o = todo.pop()
            for parent in [t.op for t in o.inputs] + list(o.control_inputs):
                if parent.name not in seen:
                    seen.add(parent.name)
                    todo.append(parent)
        return seen

    before = ancestors(writes[counter][0])
    missing = [op.name for k in kernels for op in writes[k] if op.name not in before]
    assert not missing, missing
