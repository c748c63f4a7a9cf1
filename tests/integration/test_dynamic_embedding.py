"""tfdist.layers.DynamicEmbedding: rows keyed by any int64 id (or string), created on the PS as ids arrive.

Single process (the in-process PS): a dynamic table whose ids are huge and
negative renamings of a small vocabulary trains exactly like a local
embedding of that vocabulary (the reference's gradient is dense, summed per
row, as the PS applies it; see test_sharded_embedding.py). Real processes,
2 workers and 2 PS tasks: BSP equals one process on the global batch; async
with ps:1 killed mid-fit and restored from its checkpoint (rows spread over
both tasks by the id's hash). The other modes, and async without a kill,
under RUN_SLOW.
"""

import json
import logging
import os
import sys

import numpy as np
import pytest

keras = pytest.importorskip("keras")

import tfdist
from tfdist.errors import ConfigError

pytestmark = pytest.mark.timeout(300)

VOCAB, DIM, LEN, BATCH, STEPS = 50, 4, 6, 16, 12


def big(ids):
    return np.asarray(ids, np.int64) * 1_000_003 - 2**62


def _data():
    rng = np.random.default_rng(0)
    ids = (rng.zipf(1.5, size=(BATCH * STEPS, LEN)) % VOCAB).astype(np.int64)
    y = (ids.sum(axis=1) % 2).astype(np.float32)
    return ids, y


class DenseGradientEmbedding(keras.layers.Layer):
    """Rows by a one-hot product: the table's gradient is dense (summed per row), as a PS applies it."""

    def build(self, input_shape):
        self.embeddings = self.add_weight(shape=(VOCAB, DIM), initializer="zeros", name="embeddings")

    def call(self, ids):
        return keras.ops.matmul(keras.ops.one_hot(ids, VOCAB), self.embeddings)


def _model(embedding, dtype="int64"):
    keras.utils.set_random_seed(1)
    inp = keras.Input((LEN,), dtype=dtype)
    x = keras.layers.GlobalAveragePooling1D()(embedding(inp))
    return keras.Model(inp, keras.layers.Dense(1, activation="sigmoid")(x))


@pytest.mark.parametrize("make_optimizer", [
    pytest.param(lambda: keras.optimizers.SGD(0.5), marks=pytest.mark.slow),  # Adagrad (slots too) runs by default
    lambda: keras.optimizers.Adagrad(0.3)], ids=["sgd", "adagrad"])
def test_a_dynamic_table_trains_like_a_local_embedding(make_optimizer):
    ids, y = _data()
    keras.backend.clear_session()
    plain = _model(DenseGradientEmbedding())
    plain.compile(optimizer=make_optimizer(), loss="binary_crossentropy")
    plain.fit(ids, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)

    keras.backend.clear_session()
    strategy = tfdist.ParameterServerStrategy()
    try:
        with strategy.scope():
            layer = tfdist.layers.DynamicEmbedding(DIM, embeddings_initializer="zeros")
            model = _model(layer)
            model.compile(optimizer=make_optimizer(), loss="binary_crossentropy")
        assert len(layer.weights) == 1 and layer.weights[0].shape == ()  # no table on the worker
        model.predict(big(ids[:32]), verbose=0)
        assert strategy.ps_status()[0]["tables"][layer.table_key]["rows"] == 0  # reads create no row
        model.fit(big(ids), y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
        strategy.pull()
        rows = strategy._runtime.read_rows(layer.table_key, big(np.arange(VOCAB)))
        np.testing.assert_allclose(rows, plain.layers[1].embeddings.numpy(), rtol=1e-4, atol=1e-6)
        np.testing.assert_allclose(model.predict(big(ids[:32]), verbose=0), plain.predict(ids[:32], verbose=0),
                                   rtol=1e-4, atol=1e-6)
        status = strategy.ps_status()[0]["tables"][layer.table_key]
        assert status["rows"] == status["created"] == len(np.unique(ids)) and status["updates"] == STEPS
        assert strategy.tables()[0]["dynamic"]["capacity"] == 0
    finally:
        strategy.shutdown()


def test_string_ids_are_hashed_and_get_a_row_each():
    ids, y = _data()
    words = np.array([f"user-{i}" for i in range(VOCAB)], dtype=object)[ids]
    keras.backend.clear_session()
    strategy = tfdist.ParameterServerStrategy()
    try:
        with strategy.scope():
            layer = tfdist.layers.DynamicEmbedding(DIM, optimizer={"kind": "adagrad", "learning_rate": 0.3})
            model = _model(layer, dtype="string")
            model.compile(optimizer="sgd", loss="binary_crossentropy")
        import tensorflow as tf

        model.fit(tf.data.Dataset.from_tensor_slices((words.astype(str), y)).batch(BATCH), epochs=1, verbose=0)
        assert strategy.ps_status()[0]["tables"][layer.table_key]["rows"] == len(np.unique(ids))
        hashed = tfdist.layers.hash_strings(np.array([f"user-{i}" for i in np.unique(ids)])).numpy()
        assert hashed.dtype == np.int64 and (hashed >= 0).all()
        rows = strategy._runtime.read_rows(layer.table_key, hashed)
        from tfdist.ps.dynamic import initial_rows

        initial = initial_rows({"kind": "uniform", "minval": -0.05, "maxval": 0.05}, 0, hashed, DIM)
        assert (np.abs(rows - initial).sum(axis=1) > 0).all()  # every seen string's own row trained
    finally:
        strategy.shutdown()


def test_admission_and_eviction_through_the_layer_are_counted_on_the_ps(tmp_path, caplog):
    ids, y = _data()
    keras.backend.clear_session()
    strategy = tfdist.ParameterServerStrategy()
    try:
        with strategy.scope():
            admitted = tfdist.layers.DynamicEmbedding(DIM, min_count=3, name="admitted")
            bounded = tfdist.layers.DynamicEmbedding(DIM, capacity=16, eviction="lfu", name="bounded")
            keras.utils.set_random_seed(1)
            inp = keras.Input((LEN,), dtype="int64")
            x = keras.layers.Concatenate()([keras.layers.GlobalAveragePooling1D()(admitted(inp)),
                                            keras.layers.GlobalAveragePooling1D()(bounded(inp))])
            model = keras.Model(inp, keras.layers.Dense(1, activation="sigmoid")(x))
            model.compile(optimizer=keras.optimizers.SGD(0.5), loss="binary_crossentropy")
        history = model.fit(big(ids), y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0,
                            callbacks=[tfdist.callbacks.DynamicTableLogs()])
        tables = strategy.ps_status()[0]["tables"]
        for layer in (admitted, bounded):  # the same counters in the Keras logs
            for counter in ("rows", "created", "evicted", "not_admitted"):
                assert history.history[f"{layer.name}/{counter}"] == [tables[layer.table_key][counter]]
        pushes = {}  # in how many batches each id appeared
        for b in range(STEPS):
            for i in np.unique(ids[b * BATCH:(b + 1) * BATCH]):
                pushes[i] = pushes.get(i, 0) + 1
        assert tables[admitted.table_key]["rows"] == sum(c >= 3 for c in pushes.values())
        assert tables[admitted.table_key]["not_admitted"] == sum(min(c, 2) for c in pushes.values())
        assert tables[bounded.table_key]["rows"] <= 16 and tables[bounded.table_key]["evicted"] > 0
        assert tables[bounded.table_key]["created"] - tables[bounded.table_key]["evicted"] == \
            tables[bounded.table_key]["rows"]
        with caplog.at_level(logging.WARNING, logger="tfdist.layers"):
            model.save(tmp_path / "model.keras")  # the rows are not in the file: it says so, per layer
        for layer in (admitted, bounded):
            assert f"holds no rows of DynamicEmbedding {layer.name!r}" in caplog.text
    finally:
        strategy.shutdown()


def test_outside_a_ps_strategy_the_layer_reads_its_default_and_bad_options_are_refused(caplog):
    keras.backend.clear_session()
    model = _model(tfdist.layers.DynamicEmbedding(DIM, default_value=0.5))
    assert "outside a tfdist parameter-server strategy" in caplog.text
    np.testing.assert_array_equal(model.layers[1](big([[1, 2]])).numpy(), np.full((1, 2, DIM), 0.5, np.float32))
    with pytest.raises(ConfigError, match="eviction"):
        tfdist.layers.DynamicEmbedding(DIM, eviction="random")


@pytest.mark.parametrize("layer", ["ShardedEmbedding", "DynamicEmbedding"])
def test_an_initializer_the_ps_cannot_run_is_refused_naming_the_layer(layer):
    keras.backend.clear_session()
    strategy = tfdist.ParameterServerStrategy()
    try:
        with strategy.scope():
            make = (lambda: tfdist.layers.ShardedEmbedding(VOCAB, DIM, embeddings_initializer="orthogonal",
                                                          name="t")) if layer == "ShardedEmbedding" else \
                (lambda: tfdist.layers.DynamicEmbedding(DIM, embeddings_initializer="orthogonal", name="t"))
            with pytest.raises(ConfigError, match=f"{layer} 't': the parameter servers cannot run the initializer "
                                                  "Orthogonal"):
                _model(make())
    finally:
        strategy.shutdown()


def _run_cluster(tmp_path, scripts_dir, mode, steps=10, batch=8):
    from tfdist.testing import LocalCluster

    with LocalCluster(workers=2, ps=2, log_dir=str(tmp_path / "logs")) as cluster:
        cluster.start(os.path.join(scripts_dir, "dynamic_worker.py"),
                      ["--out", str(tmp_path), "--mode", mode, "--steps", str(steps), "--batch", str(batch),
                       "--vocab", str(VOCAB)])
        cluster.wait(240)
    return [json.loads((tmp_path / f"worker-{w}.json").read_text()) for w in (0, 1)]


def _check_spread(results):
    """Every id the job trained has a row on exactly one of the two PS tasks, and both hold some.

    Each worker reads the tables right after its own ``fit``; under async the other may still be training, so the
    read that saw every row is the later one, by the worker that finished last (rows only ever get added): the
    one with the most rows (s16slow2, 2026-11-29: the chief's read saw 43 of 49 while worker 1 still trained).
    """
    per_worker = [[next(iter(t.values())) for t in r["ps_tables"]] for r in results]
    counts = max(per_worker, key=lambda cs: sum(c["rows"] for c in cs))
    assert all(c["rows"] > 0 for c in counts) and sum(c["rows"] for c in counts) == results[0]["distinct_ids"]
    assert results[0]["tables"][0]["dynamic"] is not None


@pytest.mark.parametrize("mode", [
    pytest.param("async", marks=pytest.mark.slow),  # async 2 x 2 runs by default in the killed-PS test below
    "bsp"])
def test_two_workers_and_two_ps(tmp_path, scripts_dir, mode):
    """Async: both workers train the table (rows spread over both PS tasks by hash). BSP: the table's rows and
    the weights equal one process on the global batch (row gradients summed per id across workers)."""
    sys.path.insert(0, scripts_dir)
    import sparse_worker as sw

    steps, batch = 10, 8
    results = _run_cluster(tmp_path, scripts_dir, mode, steps, batch)
    _check_spread(results)
    assert all(np.isfinite(r["loss"]).all() for r in results)
    if mode == "async":
        assert sum(next(iter(t.values()))["updates"] for t in results[0]["ps_tables"]) >= 2 * steps
        return
    keras.backend.clear_session()
    ids, y = sw.data(steps, 2 * batch, VOCAB)
    reference = sw.build(DenseGradientEmbedding())
    reference.compile(optimizer=keras.optimizers.SGD(0.5), loss="binary_crossentropy")
    reference.fit(ids, y, batch_size=2 * batch, epochs=1, shuffle=False, verbose=0)
    for r in results:
        np.testing.assert_allclose(r["table"], reference.layers[1].embeddings.numpy(), rtol=1e-4, atol=1e-6)
        np.testing.assert_allclose(r["kernel"], reference.layers[-1].kernel.numpy(), rtol=1e-4, atol=1e-6)
    assert results[0]["predictions"] == results[1]["predictions"]


@pytest.mark.slow  # the update path (async) and the gradient path (BSP) run in the default run above
@pytest.mark.parametrize("mode", ["ssp", "dtssp", "sync_replicas"])
def test_two_workers_and_two_ps_in_the_other_modes(tmp_path, scripts_dir, mode):
    results = _run_cluster(tmp_path, scripts_dir, mode)
    _check_spread(results)
    assert all(np.isfinite(r["loss"]).all() for r in results)
    if mode == "sync_replicas":  # M = N = 2: every step aggregates both workers, as BSP
        assert results[0]["predictions"] == results[1]["predictions"]


@pytest.mark.parametrize("mode", ["async", pytest.param("bsp", marks=pytest.mark.slow)])
def test_a_dynamic_table_survives_a_killed_ps(tmp_path, scripts_dir, mode):
    """2 workers, 2 PS with checkpoints every 4 steps; ps:1 is SIGKILLed mid-fit and restarted by the launcher.

    It restores its newest checkpoint, the dynamic table's rows, slots, counters and index included (async:
    with row pushes in flight when it dies); both workers recover and finish, and the rows of ps:1 in the
    checkpoint it restored are in its table at the end (no eviction here) with the trained values.
    BSP: the chief rolls every task back to the step ps:1 restored, and the workers end alike.
    """
    sys.path.insert(0, scripts_dir)
    import sparse_worker as sw

    from tfdist.config import JobConfig
    from tfdist.ps import checkpoint as files
    from tfdist.testing import LocalCluster

    config = JobConfig(name="dynamic")
    config.ps.checkpoint_dir = str(tmp_path / "ckpt")
    config.ps.checkpoint_every_steps, config.ps.checkpoint_every_s = 4, None
    config.ps.checkpoint_keep = 100  # the one ps:1 restored is read at the end
    out = tmp_path / "out"
    out.mkdir()
    with LocalCluster(workers=2, ps=2, config=config, log_dir=str(tmp_path / "logs")) as cluster:
        cluster.start(os.path.join(scripts_dir, "dynamic_worker.py"),
                      ["--out", str(out), "--mode", mode, "--steps", "30", "--batch", "8", "--vocab", "400",
                       "--pause-at", "16"])
        sw.wait_until_paused(cluster, str(out), workers=2)
        cluster.kill("ps:1")
        (out / "resume").touch()
        cluster.wait(240)
        assert cluster.job.restarts == {"ps:1": 1}
        chief_log, ps_log = cluster.log("worker:0"), cluster.log("ps:1")
    results = [json.loads((out / f"worker-{w}.json").read_text()) for w in (0, 1)]
    assert "restarted from the checkpoint of step" in ps_log
    assert all(r["recoveries"] >= 1 for r in results), chief_log[-3000:]
    assert all(np.isfinite(r["loss"]).all() for r in results)
    restored_step = int(ps_log.split("restarted from the checkpoint of step ")[1].split()[0])
    shard = files.read_shard(str(tmp_path / "ckpt"), 1, restored_step)
    key = results[0]["tables"][0]["key"]
    restored_ids = shard.values[f"table/{key}/ids"]
    assert len(restored_ids) > 0
    assert all(next(iter(t.values()))["rows"] > 0 for t in results[0]["ps_tables"])  # rows on both tasks
    final = next(iter(results[0]["ps_tables"][1].values()))
    assert final["rows"] >= len(restored_ids) and final["created"] >= len(restored_ids)
    vocab_ids = (np.arange(400, dtype=np.int64) * 1_000_003 - 2**62)
    table = np.array(results[0]["table"])
    held = np.isin(vocab_ids, restored_ids)
    assert held.any() and (np.abs(table[held]).sum(axis=1) > 0).all()  # trained rows, not their zero init
    if mode == "bsp":
        assert "rolled every parameter server back to its checkpoint of step" in chief_log
        np.testing.assert_array_equal(results[0]["table"], results[1]["table"])
        assert results[0]["predictions"] == results[1]["predictions"]


def test_a_delta_export_serves_like_the_trained_model(tmp_path, scripts_dir):
    """1 worker, 2 PS (real processes), a capacity that evicts: a full export at mid-training, a delta at the end.

    The delta holds only the rows created or changed since the full export and the ids evicted since; the
    full export with the delta applied is the final table, and a plain Keras model made from it (IntegerLookup
    + Embedding, dense weights by load_into) predicts as the trained model did on every exported id, also
    after a save and load in Keras alone.
    """
    from tfdist.config import JobConfig
    from tfdist.testing import LocalCluster

    sys.path.insert(0, scripts_dir)
    import sparse_worker as sw

    vocab = 400
    config = JobConfig(name="export")
    config.ps.checkpoint_dir = str(tmp_path / "ckpt")
    config.ps.checkpoint_every_steps, config.ps.checkpoint_every_s = None, None
    with LocalCluster(workers=1, ps=2, config=config, log_dir=str(tmp_path / "logs")) as cluster:
        cluster.start(os.path.join(scripts_dir, "dynamic_worker.py"),
                      ["--out", str(tmp_path), "--mode", "async", "--steps", "16", "--batch", "16", "--vocab",
                       str(vocab), "--capacity", "40", "--export"])
        cluster.wait(240)
    result = json.loads((tmp_path / "worker-0.json").read_text())
    full = tfdist.checkpoint.read_export(str(tmp_path / "full.npz"))
    served = tfdist.checkpoint.read_export(str(tmp_path / "delta.npz"))
    assert served.kind == "delta" and full.kind == "full"
    final = sum(next(iter(t.values()))["rows"] for t in result["ps_tables"])
    assert len(served.ids) == final and len(set(served.ids.tolist())) == final
    assert 0 < served.upserts < final + served.deleted and served.deleted > 0  # changed rows and evicted ids only
    assert served.deleted == len(set(full.ids.tolist()) - set(served.ids.tolist()))

    keras.backend.clear_session()
    model = sw.build(tfdist.layers.DynamicEmbedding(DIM, embeddings_initializer="zeros"))
    tfdist.checkpoint.load_into(model, str(tmp_path / "ckpt"))
    serving = tfdist.checkpoint.serving_model(model, str(tmp_path / "delta.npz"))
    assert not any(getattr(layer, "_tfdist_dynamic_table", False) for layer in serving._flatten_layers())
    vocab_ids = big(np.arange(vocab))
    exported = np.isin(vocab_ids, served.ids)
    x = vocab_ids[:, None].repeat(sw.LEN, axis=1)
    trained = np.array(result["export_predictions"])
    np.testing.assert_allclose(serving.predict(x, verbose=0)[exported], trained[exported], rtol=1e-5, atol=1e-6)
    serving.save(tmp_path / "serving.keras")
    again = keras.saving.load_model(tmp_path / "serving.keras")
    np.testing.assert_allclose(again.predict(x, verbose=0)[exported], trained[exported], rtol=1e-5, atol=1e-6)
