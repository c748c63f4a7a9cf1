"""Identity and semantics of what the parameter servers share (issue #21 item 7).

(a) A variable's identity in the job does not depend on Keras's auto-name
counters of objects created outside the model (README "What behaves
differently": Variable identity). Two workers built in one process around a
real PS on 127.0.0.1 show it best: the second model's auto names are
``sequential_1``/``dense_2``… there, and the chief additionally builds an
optimizer and a layer before its model.
"""

import numpy as np
import pytest

pytestmark = pytest.mark.timeout(300)

TOKEN = "a-token-123"


def _auto_named_model(strategy, optimizer="adam"):
    """A model with Keras's auto names (no name= anywhere), compiled; its optimizer built."""
    import keras

    keras.utils.set_random_seed(0)
    with strategy.scope():
        model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"),
                                  keras.layers.BatchNormalization(), keras.layers.Dense(3)])
        model.compile(optimizer, "mse")
        model.optimizer.build(model.trainable_variables)
    return model


@pytest.mark.parametrize("consistency", ["async", "sync_replicas"])
def test_objects_the_chief_alone_creates_before_its_model_do_not_change_the_job_s_variables(no_cluster, consistency):
    """Before: the other worker was refused ("variables differ": adam vs adam_1, dense vs dense_1) and exited."""
    import keras

    import tfdist
    from tfdist.ps.server import PSServer

    x = np.random.default_rng(0).normal(size=(32, 8)).astype("float32")
    y = np.random.default_rng(1).normal(size=(32, 3)).astype("float32")
    server = PSServer(None, token=TOKEN, num_workers=2).start()
    cluster = {"worker": ["127.0.0.1:1", "127.0.0.1:2"], "ps": [server.address]}
    strategies = []
    try:
        def make(task):
            if consistency == "sync_replicas":  # one gradient per step: the workers may train one after the other
                return tfdist.SyncReplicasStrategy(replicas_to_aggregate=1, cluster=cluster, task=task, token=TOKEN)
            return tfdist.ParameterServerStrategy(cluster=cluster, task=task, token=TOKEN)

        keras.optimizers.Adam()  # the chief's script alone creates these first: adam, dense
        keras.layers.Dense(4)
        chief = make("worker:0")
        strategies.append(chief)
        chief_model = _auto_named_model(chief)
        chief_model.fit(x, y, batch_size=8, epochs=1, verbose=0)
        other = make("worker:1")
        strategies.append(other)
        other_model = _auto_named_model(other)
        assert [w.path for w in chief_model.weights] != [w.path for w in other_model.weights]  # Keras's names differ
        other_model.fit(x, y, batch_size=8, epochs=1, verbose=0)  # before the fix: FAILED_PRECONDITION

        assert [k for k, _, _ in chief.placement_table()] == [k for k, _, _ in other.placement_table()]
        assert "0000/sequential/dense/kernel" in [k for k, _, _ in chief.placement_table()]
        batches = chief.ps_status()[0]["worker_batches"]
        assert set(batches) == {"0", "1"} and all(n > 0 for n in batches.values()), batches
        other.pull()
        chief.pull()
        np.testing.assert_allclose(other_model.predict(x, verbose=0), chief_model.predict(x, verbose=0),
                                   rtol=1e-5, atol=1e-5)
    finally:
        for s in strategies:
            s.shutdown()
        server.stop(0)


def _tracking_model(strategy):
    """A custom layer keeping four kinds of non-trainable state, then a Dense (fixed names: item (c) alone)."""
    import keras

    class Tracker(keras.layers.Layer):
        def build(self, input_shape):
            zeros = {"shape": (), "initializer": "zeros", "trainable": False}
            self.running_max = self.add_weight(name="running_max", **zeros)
            self.steps = self.add_weight(name="steps", **zeros)
            self.job_steps = self.add_weight(name="job_steps", aggregation="sum", **zeros)
            self.int_steps = self.add_weight(name="int_steps", dtype="int32", **zeros)

        def call(self, x, training=False):
            if training:
                self.running_max.assign(keras.ops.maximum(self.running_max, keras.ops.max(x)))
                self.steps.assign_add(1.0)
                self.job_steps.assign_add(1.0)
                self.int_steps.assign_add(1)
            return x

    keras.utils.set_random_seed(0)
    with strategy.scope():
        tracker = Tracker(name="tracker")
        model = keras.Sequential([keras.Input((8,)), tracker, keras.layers.Dense(3, name="out")], name="model")
        model.compile(keras.optimizers.SGD(0.01), "mse")
    return model, tracker


def test_non_trainable_state_of_a_custom_layer_is_local_unless_marked_with_aggregation_sum(no_cluster):
    """Async, two workers: before, a running max of data whose max is 1.0 became 2.0 and a float counter counted
    the job's steps (an int32 one the worker's); now unmarked state is each worker's own, ``aggregation="sum"``
    state is the job's (every worker's change added), and BatchNormalization's statistics stay shared."""
    import tfdist
    from tfdist.ps.server import PSServer

    rng = np.random.default_rng(0)
    x = rng.uniform(0.0, 1.0, size=(32, 8)).astype("float32")
    x[0, 0] = 1.0  # the data's max
    y = rng.normal(size=(32, 3)).astype("float32")
    server = PSServer(None, token=TOKEN, num_workers=2).start()
    cluster = {"worker": ["127.0.0.1:1", "127.0.0.1:2"], "ps": [server.address]}
    strategies = []
    try:
        models = []
        for task in ("worker:0", "worker:1"):
            strategy = tfdist.ParameterServerStrategy(cluster=cluster, task=task, token=TOKEN)
            strategies.append(strategy)
            models.append(_tracking_model(strategy))
            models[-1][0].predict(x[:8], verbose=0)  # joins the job: both start from the initial values
        steps = {0: 4, 1: 2}
        for i, (model, _) in enumerate(models):
            model.fit(x[: 8 * steps[i]], y[: 8 * steps[i]], batch_size=8, epochs=1, shuffle=False, verbose=0)
        for i, (strategy, (_, tracker)) in enumerate(zip(strategies, models)):
            strategy.pull()
            assert float(tracker.running_max.numpy()) == 1.0  # before: 2.0 on worker 1
            assert float(tracker.steps.numpy()) == steps[i]  # before: the job's 6 on worker 1
            assert int(tracker.int_steps.numpy()) == steps[i]
            assert float(tracker.job_steps.numpy()) == sum(steps.values())
        keys = [k for k, _, _ in strategies[0].placement_table()]
        assert any(k.endswith("/job_steps") for k in keys) and not any(
            k.endswith(("/running_max", "/steps", "/int_steps")) for k in keys), keys
    finally:
        for s in strategies:
            s.shutdown()
        server.stop(0)


def test_a_callback_that_reads_the_epoch_logs_decides_alike_on_every_bsp_worker(tmp_path, scripts_dir):
    """Two BSP worker processes whose own losses straddle a callback's bound: the job's logs make it decide alike.

    Observed: worker 0 lowers its learning rate and worker 1 does not; both apply the shared gradient with their
    own rate and end with different weights after ``pull()``.
    """
    import json
    import os

    from tfdist.config import JobConfig
    from tfdist.testing import LocalCluster

    out = tmp_path / "out"
    out.mkdir()
    config = JobConfig.from_dict({"ps": {"heartbeat_interval_s": 0.5, "heartbeat_timeout_s": 3}})
    with LocalCluster(workers=2, ps=1, config=config, log_dir=str(tmp_path / "logs")) as cluster:
        cluster.start(os.path.join(scripts_dir, "log_decision_worker.py"), ["--out", str(out)])
        cluster.wait(240)
    results = [json.loads((out / f"worker-{i}.json").read_text()) for i in range(2)]
    w0, w1 = (np.load(out / f"weights-{i}.npz") for i in range(2))
    gap = max(float(np.abs(w0[key] - w1[key]).max()) for key in w0.files)
    assert results[0]["learning_rate"] == results[1]["learning_rate"] and gap == 0.0, (results, gap)
    assert results[0]["losses"] == results[1]["losses"], results
