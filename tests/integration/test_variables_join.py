"""Variables created after the job's first step join the job (issue #21 item 8).

A new head for fine-tuning after a first ``fit`` (new layers and a fresh
optimizer), and a second model built in the same process, used to stay local
to each worker with a warning. Now they join: placed after the others, the
first worker's initial values become the job's, the other workers load them,
checkpoints hold them, and a synchronous job aggregates their gradients.

Two kinds of test: in one process (two workers' strategies around a real PS
task on 127.0.0.1, quick, each mode) and with real processes (launcher,
``scripts/join_worker.py``, two PS tasks per mode): fit, add a head, fit
again, a second model, save, and the saved model loaded into plain Keras. The
processes run async (the update path) and BSP (the gradient path) by default;
SSP, DTSSP and SyncReplicas with RUN_SLOW=1 (.ci/run's slow command): the
in-process test covers each of them in the default run (issue #22).
"""

import json
import os

import numpy as np
import pytest

pytestmark = pytest.mark.timeout(300)

TOKEN = "a-token-123"
MODES = ["async", "ssp", "dtssp", "bsp", "sync_replicas"]


def _strategy(mode, cluster, task):
    import tfdist

    kwargs = dict(cluster=cluster, task=task, token=TOKEN)
    if mode == "bsp":
        return tfdist.BSPStrategy(**kwargs)
    if mode == "sync_replicas":
        return tfdist.SyncReplicasStrategy(replicas_to_aggregate=2, **kwargs)
    if mode == "ssp":
        return tfdist.SSPStrategy(staleness=2, **kwargs)
    if mode == "dtssp":
        return tfdist.DTSSPStrategy(**kwargs)
    return tfdist.ParameterServerStrategy(**kwargs)


def _base(strategy, seed):
    import keras

    keras.utils.set_random_seed(seed)  # each worker initialises differently: the job's values must win
    with strategy.scope():
        base = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu", name="hidden")],
                                name="base")
        model = keras.Sequential([base, keras.layers.Dense(3, name="out")], name="model")
        model.compile(keras.optimizers.SGD(0.05), "mse")
    return base, model


def _head(strategy, base, seed):
    import keras

    keras.utils.set_random_seed(seed)
    with strategy.scope():
        head = keras.Sequential([base, keras.layers.Dense(8, activation="relu", name="head_hidden"),
                                 keras.layers.Dense(2, name="head_out")], name="finetune")
        head.compile(keras.optimizers.Adam(0.01), "mse")
    return head


def _fit_together(models, x, y, mode):
    """Both workers fit one epoch at once (threads: a synchronous mode needs both in every step)."""
    import threading

    errors = []

    def fit(model):
        try:
            model.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0)
        except BaseException as e:  # noqa: BLE001 (reported below)
            errors.append(e)

    threads = [threading.Thread(target=fit, args=(m,)) for m in models]
    for t in threads:
        t.start()
    for t in threads:
        t.join(240)
    assert not any(t.is_alive() for t in threads), f"{mode}: a fit did not end"
    if errors:
        raise errors[0]


def _second_model(strategy, seed):
    import keras

    keras.utils.set_random_seed(seed)
    with strategy.scope():
        model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(4, name="other_hidden"),
                                  keras.layers.Dense(1, name="other_out")], name="other")
        model.compile(keras.optimizers.SGD(0.05), "mse")
    return model


@pytest.mark.parametrize("mode", MODES)
def test_a_head_added_after_the_first_fit_joins_the_job(no_cluster, tmp_path, mode):
    """Fit, add a head (new layers, a fresh optimizer), fit again, build a second model and fit it; the new
    variables are the job's (one value on both workers), in the checkpoint, and load into plain Keras."""
    import keras

    import tfdist
    from tfdist.ps.server import PSServer

    rng = np.random.default_rng(0)
    x = rng.normal(size=(32, 8)).astype("float32")
    y3 = rng.normal(size=(32, 3)).astype("float32")
    y2 = rng.normal(size=(32, 2)).astype("float32")
    y1 = rng.normal(size=(32, 1)).astype("float32")
    servers = [PSServer(None, token=TOKEN, num_workers=2, checkpoint_dir=str(tmp_path), task_index=i, num_ps=2).start()
               for i in range(2)]
    cluster = {"worker": ["127.0.0.1:1", "127.0.0.1:2"], "ps": [s.address for s in servers]}
    strategies = []
    try:
        strategies = [_strategy(mode, cluster, f"worker:{i}") for i in (0, 1)]
        built = [_base(s, seed=i) for i, s in enumerate(strategies)]
        _fit_together([m for _, m in built], x, y3, mode)
        keys_before = [k for k, _, _ in strategies[0].placement_table()]

        heads = [_head(s, base, seed=10 + i) for i, (s, (base, _)) in enumerate(zip(strategies, built))]
        _fit_together(heads, x, y2, mode)

        tables = [[row for row in s.placement_table()] for s in strategies]
        assert tables[0] == tables[1]  # the same placement on both workers
        keys = [k for k, _, _ in tables[0]]
        assert keys[: len(keys_before)] == keys_before  # placement continued after the first variables
        new = keys[len(keys_before):]
        assert any("head_hidden/kernel" in k for k in new) and any("head_out/bias" in k for k in new), new
        assert {ps for k, ps, _ in tables[0] if k in new} == {0, 1}  # round robin over both PS tasks
        status = [st for s in (servers[0], servers[1]) for st in [s.store.status(brief=False)]]
        on_ps = {spec["key"] for st in status for spec in st["specs"]}
        assert set(new) <= on_ps
        assert sum(st["joined_variables"] for st in status) == len(new)
        for _ in range(2):  # the first lands each worker's last update (async: it may still travel), the second reads
            for s in strategies:
                s.pull()
        for a, b in zip(heads[0].weights, heads[1].weights):
            if strategies[0]._runtime.key_of(a) is not None:  # a shared variable: one value in the job
                np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-5, atol=1e-6, err_msg=a.path)
        # the head trained (it is not the first worker's initial value any more)
        head_kernel = strategies[0]._runtime.registry.values()[next(k for k in new if "head_out/kernel" in k)]
        assert np.isfinite(head_kernel).all()
        np.testing.assert_allclose(heads[0].predict(x, verbose=0), heads[1].predict(x, verbose=0),
                                   rtol=1e-4, atol=1e-5)

        # a second model in the same process joins too
        others = [_second_model(s, seed=20 + i) for i, s in enumerate(strategies)]
        _fit_together(others, x, y1, mode)
        for _ in range(2):  # the first lands each worker's last update (async: it may still travel), the second reads
            for s in strategies:
                s.pull()
        keys = [k for k, _, _ in strategies[0].placement_table()]
        assert any("other_out/kernel" in k for k in keys), keys
        np.testing.assert_allclose(others[0].predict(x, verbose=0), others[1].predict(x, verbose=0),
                                   rtol=1e-4, atol=1e-5)

        # the checkpoint holds the joined variables: the head loads into plain Keras, outside any strategy
        strategies[0].checkpoint()
        keras.utils.set_random_seed(99)
        plain_base = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu", name="hidden")],
                                      name="base")
        plain = keras.Sequential([plain_base, keras.layers.Dense(8, activation="relu", name="head_hidden"),
                                  keras.layers.Dense(2, name="head_out")], name="finetune")
        tfdist.checkpoint.load_into(plain, str(tmp_path))
        np.testing.assert_allclose(plain.predict(x, verbose=0), heads[0].predict(x, verbose=0), rtol=1e-4, atol=1e-5)
    finally:
        for s in strategies:
            s.shutdown()
        for s in servers:
            s.stop(0)


def test_a_step_traced_before_a_join_still_takes_the_joined_variables_fresh_values(no_cluster, tmp_path):
    """Async (overlapped exchange, corrections added in the step's graph): worker 0 runs the step of a model
    traced before a second model joined, while worker 1 trains the second model. Worker 0's exchanges bring
    the second model's fresh values, which its traced step has no output for: they are added anyway."""
    import threading

    from tfdist.ps.server import PSServer

    rng = np.random.default_rng(1)
    x = rng.normal(size=(64, 8)).astype("float32")
    y3, y1 = rng.normal(size=(64, 3)).astype("float32"), rng.normal(size=(64, 1)).astype("float32")
    servers = [PSServer(None, token=TOKEN, num_workers=2, task_index=i, num_ps=2).start() for i in range(2)]
    cluster = {"worker": ["127.0.0.1:1", "127.0.0.1:2"], "ps": [s.address for s in servers]}
    strategies = []
    try:
        strategies = [_strategy("async", cluster, f"worker:{i}") for i in (0, 1)]
        built = [_base(s, seed=i) for i, s in enumerate(strategies)]
        _fit_together([m for _, m in built], x, y3, "async")  # worker 0's step is traced here
        others = [_second_model(s, seed=20 + i) for i, s in enumerate(strategies)]
        _fit_together(others, x, y1, "async")  # the second model joins
        before = strategies[0]._runtime.registry.values()
        errors = []

        def fit(model, y, epochs):
            try:
                model.fit(x, y, batch_size=8, epochs=epochs, shuffle=False, verbose=0)
            except BaseException as e:  # noqa: BLE001 (reported below)
                errors.append(e)

        threads = [threading.Thread(target=fit, args=(built[0][1], y3, 3)),  # the step traced before the join
                   threading.Thread(target=fit, args=(others[1], y1, 3))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(240)
        assert not any(t.is_alive() for t in threads) and not errors, errors
        assert strategies[0]._runtime.schedule.overlapped
        for _ in range(2):
            for s in strategies:
                s.pull()
        after = strategies[0]._runtime.registry.values()
        other_keys = [k for k in after if "other_" in k]
        assert other_keys and any(not np.array_equal(before[k], after[k]) for k in other_keys)
        for a, b in zip(others[0].weights, others[1].weights):
            np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-5, atol=1e-6, err_msg=a.path)
        for a, b in zip(built[0][1].weights, built[1][1].weights):
            if strategies[0]._runtime.key_of(a) is not None:
                np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-5, atol=1e-6, err_msg=a.path)
    finally:
        for s in strategies:
            s.shutdown()
        for s in servers:
            s.stop(0)


#: Every mode, each a job of its own on two PS tasks of one cluster; those not in DEFAULT_PROCESS_MODES are slow
#: (test_a_head_added_after_the_first_fit_joins_the_job covers them in the default run).
PROCESS_MODES = MODES
DEFAULT_PROCESS_MODES = ("async", "bsp")


def _run_slow():
    return os.environ.get("RUN_SLOW") == "1"


@pytest.fixture(scope="module")
def joined_jobs(tmp_path_factory):
    """Two worker processes; each mode a job of its own on two PS tasks (``scripts/join_worker.py``): the
    default modes, or all with RUN_SLOW=1."""
    from tfdist.testing import LocalCluster

    modes = [m for m in PROCESS_MODES if m in DEFAULT_PROCESS_MODES or _run_slow()]
    root = tmp_path_factory.mktemp("join")
    out = root / "out"
    out.mkdir()
    here = os.path.dirname(os.path.abspath(__file__))
    with LocalCluster(workers=2, ps=2 * len(modes), log_dir=str(root / "logs")) as cluster:
        cluster.start(os.path.join(here, "scripts", "join_worker.py"), ["--out", str(out), "--modes", ",".join(modes)])
        try:
            cluster.wait(240)
        finally:
            logs = {t: cluster.log(t)[-3000:] for t in ("worker:0", "worker:1")}
    results = {}
    for mode in modes:
        for me in (0, 1):
            path = out / f"{mode}-worker-{me}.json"
            results[mode, me] = json.loads(path.read_text()) if path.exists() else {"error": "no result", **logs}
    return results


@pytest.mark.parametrize("mode", [m if m in DEFAULT_PROCESS_MODES else pytest.param(m, marks=pytest.mark.slow)
                                  for m in PROCESS_MODES])
def test_real_processes_fit_add_a_head_fit_save_and_plain_keras_loads_it(joined_jobs, mode):
    import keras

    r0, r1 = joined_jobs[mode, 0], joined_jobs[mode, 1]
    for r in (r0, r1):
        assert "error" not in r, f"{mode} worker {r.get('worker')}: {r.get('error')}\n{r.get('traceback', '')}"
    assert r0["placement"] == r1["placement"]  # one map on both workers
    keys = [k for k, _ in r0["placement"]]
    assert keys[: len(r0["keys_first"])] == r0["keys_first"]
    new = keys[len(r0["keys_first"]):]
    assert any("head_out/kernel" in k for k in new) and any("other_out/kernel" in k for k in new), new
    assert {ps for k, ps in r0["placement"] if k in new} == {0, 1}
    assert sum(st["joined_variables"] for st in r0["status"]) == len(new)
    assert r0["head_loss"][-1] < r0["head_loss"][0]  # the head trained
    np.testing.assert_allclose(r0["head_predictions"], r1["head_predictions"], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(r0["other_predictions"], r1["other_predictions"], rtol=1e-4, atol=1e-5)
    plain = keras.models.load_model(r0["saved"])  # outside any strategy
    from tfdist.datasets import load_digits

    batch = load_digits().x_train[:16].reshape(-1, 64)
    np.testing.assert_allclose(plain.predict(batch, verbose=0), r0["head_predictions"], rtol=1e-4, atol=1e-5)


def test_a_ps_task_restored_from_a_checkpoint_written_before_a_join_gets_the_joined_variables_again(
        no_cluster, tmp_path, caplog):
    """A PS task killed after a head joined restores a checkpoint from before the join: the workers' recovery
    sends the head's variables again (before: every later request naming them was NOT_FOUND and training died)."""
    import logging

    from tfdist.cluster.local import free_ports
    from tfdist.ps.server import PSServer

    rng = np.random.default_rng(0)
    x = rng.normal(size=(32, 8)).astype("float32")
    y3 = rng.normal(size=(32, 3)).astype("float32")
    y2 = rng.normal(size=(32, 2)).astype("float32")
    ports = free_ports(2)

    def serve(i):
        return PSServer(None, port=ports[i], token=TOKEN, num_workers=2, checkpoint_dir=str(tmp_path), task_index=i,
                        num_ps=2, heartbeat_timeout_s=60).start()

    servers = [serve(0), serve(1)]
    cluster = {"worker": ["127.0.0.1:1", "127.0.0.1:2"], "ps": [s.address for s in servers]}
    strategy = None
    try:
        strategy = _strategy("async", cluster, "worker:0")
        strategy._runtime.config.ps.reconnect_timeout_s = 30
        base, model = _base(strategy, seed=0)
        model.fit(x, y3, batch_size=8, epochs=1, verbose=0)
        before_join = strategy.checkpoint()[1]["step"]  # ps:1's checkpoint, written before the head joins
        head = _head(strategy, base, seed=1)
        head.fit(x, y2, batch_size=8, epochs=1, verbose=0)
        head_keys = [k for k, ps, _ in strategy.placement_table() if "head" in k and ps == 1]
        assert head_keys and set(head_keys) <= set(servers[1].store.state()["values"])

        servers[1].stop(0)  # killed: what it wrote since the join is lost; it restores the one from before the join
        from tfdist.ps import checkpoint as ckpt

        for step in ckpt.list_steps(str(tmp_path), 1):
            if step > before_join:
                for path in ckpt._paths(str(tmp_path), 1, step):
                    os.remove(path)
        servers[1] = serve(1)
        assert not set(head_keys) & set(servers[1].store.state()["values"])
        with caplog.at_level(logging.WARNING):
            history = head.fit(x, y2, batch_size=8, epochs=1, verbose=0)
        assert np.isfinite(history.history["loss"]).all()
        assert set(head_keys) <= set(servers[1].store.state()["values"])
        assert "had lost variables that joined" in caplog.text
        strategy.pull()
        np.testing.assert_allclose(head.predict(x, verbose=0), head.predict(x, verbose=0))
    finally:
        if strategy is not None:
            strategy.shutdown()
        for s in servers:
            s.stop(0)


def test_a_ps_task_lost_while_variables_join_is_recovered_from_and_they_join_at_the_next_step(no_cluster, tmp_path):
    """ps:1 restarts between the first fit and the head's first step: the join meets the lost task, the worker
    recovers (the head, not in the job yet, is left alone: before, the recovery's load raised KeyError for it) and
    the head joins at the next step."""
    from tfdist.cluster.local import free_ports
    from tfdist.ps.server import PSServer

    rng = np.random.default_rng(0)
    x = rng.normal(size=(32, 8)).astype("float32")
    y3 = rng.normal(size=(32, 3)).astype("float32")
    y2 = rng.normal(size=(32, 2)).astype("float32")
    ports = free_ports(2)

    def serve(i):
        return PSServer(None, port=ports[i], token=TOKEN, num_workers=2, checkpoint_dir=str(tmp_path), task_index=i,
                        num_ps=2, heartbeat_timeout_s=60).start()

    servers = [serve(0), serve(1)]
    cluster = {"worker": ["127.0.0.1:1", "127.0.0.1:2"], "ps": [s.address for s in servers]}
    strategy = None
    try:
        strategy = _strategy("async", cluster, "worker:0")
        strategy._runtime.config.ps.reconnect_timeout_s = 30
        base, model = _base(strategy, seed=0)
        model.fit(x, y3, batch_size=8, epochs=1, verbose=0)
        head = _head(strategy, base, seed=1)
        servers[1].stop(0)
        servers[1] = serve(1)  # a new incarnation: the join's first request to it is refused
        history = head.fit(x, y2, batch_size=8, epochs=2, verbose=0)
        assert np.isfinite(history.history["loss"]).all()
        assert not strategy._runtime.registry.pending
        joined = [(k, ps) for k, ps, _ in strategy.placement_table() if "head" in k]
        assert {ps for _, ps in joined} == {0, 1}
        for k, ps in joined:
            assert k in servers[ps].store.state()["values"]
    finally:
        if strategy is not None:
            strategy.shutdown()
        for s in servers:
            s.stop(0)
