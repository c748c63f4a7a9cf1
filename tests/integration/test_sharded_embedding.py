"""tfdist.layers.ShardedEmbedding: a table that lives on the parameter servers, trained like a local one.

Single process (the in-process PS): the same model and data trained with a
local embedding and with a PS-resident table end with the same weights and
table. The local reference looks rows up with a one-hot product, so its
gradient is dense (each row's gradient summed over the batch): Keras 3
applies an ``Embedding``'s sparse gradient to Adagrad's accumulator one
occurrence at a time (the sum of squares, not the square of the sum), which
is neither its own dense arithmetic nor TF's sparse Adagrad; the PS follows
the dense arithmetic, like TF1's sparse optimizers.
"""

import numpy as np
import pytest

keras = pytest.importorskip("keras")

import tfdist  # noqa: E402

pytestmark = pytest.mark.timeout(300)

VOCAB, DIM, LEN, BATCH, STEPS = 50, 4, 6, 16, 12


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


def _model(embedding):
    keras.utils.set_random_seed(1)
    inp = keras.Input((LEN,), dtype="int64")
    x = embedding(inp)
    x = keras.layers.GlobalAveragePooling1D()(x)
    out = keras.layers.Dense(1, activation="sigmoid")(x)
    return keras.Model(inp, out)


@pytest.mark.parametrize("make_optimizer", [
    lambda: keras.optimizers.SGD(0.5), lambda: keras.optimizers.Adagrad(0.3),
    lambda: keras.optimizers.Ftrl(0.2, l1_regularization_strength=0.001),
], ids=["sgd", "adagrad", "ftrl"])
def test_a_ps_resident_table_trains_like_a_local_embedding(make_optimizer):
    ids, y = _data()
    keras.backend.clear_session()
    plain = _model(DenseGradientEmbedding())
    plain.compile(optimizer=make_optimizer(), loss="binary_crossentropy")
    plain.fit(ids, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)

    keras.backend.clear_session()
    strategy = tfdist.ParameterServerStrategy()
    try:
        with strategy.scope():
            layer = tfdist.layers.ShardedEmbedding(VOCAB, DIM, embeddings_initializer="zeros")
            model = _model(layer)
            model.compile(optimizer=make_optimizer(), loss="binary_crossentropy")
        assert layer.resident and len(layer.weights) == 1 and layer.weights[0].shape == ()  # no table here
        model.fit(ids, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
        strategy.pull()
        runtime = strategy._runtime
        table = runtime.lookup_rows(layer._table_key, np.arange(VOCAB, dtype=np.int64))
        np.testing.assert_allclose(table, plain.layers[1].embeddings.numpy(), rtol=1e-4, atol=1e-6)
        np.testing.assert_allclose(model.layers[-1].kernel.numpy(), plain.layers[-1].kernel.numpy(),
                                   rtol=1e-4, atol=1e-6)
        np.testing.assert_allclose(model.predict(ids[:32], verbose=0), plain.predict(ids[:32], verbose=0),
                                   rtol=1e-4, atol=1e-6)
        status = strategy.ps_status()[0]
        assert status["tables"][layer._table_key]["rows"] == VOCAB
        assert status["tables"][layer._table_key]["updates"] == STEPS
    finally:
        strategy.shutdown()


def _wide_and_deep(deep, wide):
    keras.utils.set_random_seed(1)
    inp = keras.Input((LEN,), dtype="int64")
    x = keras.layers.Concatenate()([keras.layers.GlobalAveragePooling1D()(deep(inp)),
                                    keras.layers.GlobalAveragePooling1D()(wide(inp))])
    return keras.Model(inp, keras.layers.Dense(1, activation="sigmoid")(x))


def _twin_tables(strategy):
    """A deep and a wide ShardedEmbedding read by the same ids, and the compiled model (under ``strategy``)."""
    with strategy.scope():
        deep = tfdist.layers.ShardedEmbedding(VOCAB, DIM, embeddings_initializer="zeros", name="deep")
        wide = tfdist.layers.ShardedEmbedding(VOCAB, 1, embeddings_initializer="zeros", name="wide")
        model = _wide_and_deep(deep, wide)
        model.compile(optimizer=keras.optimizers.Adagrad(0.3), loss="binary_crossentropy")
    return deep, wide, model


def _record_tables(monkeypatch, session, method: str, calls: list) -> None:
    """Records the table keys of every ``session.<method>(keys, ...)`` call in ``calls``."""
    original = getattr(session, method)
    monkeypatch.setattr(session, method, lambda keys, *a, **k: (calls.append(list(keys)), original(keys, *a, **k))[1])


def test_tables_looked_up_by_the_same_ids_share_one_request_and_train_as_before(monkeypatch):
    """A wide and a deep table of the same ids: after the first step, one lookup request reads both."""
    ids, y = _data()

    class Wide(DenseGradientEmbedding):
        def build(self, input_shape):
            self.embeddings = self.add_weight(shape=(VOCAB, 1), initializer="zeros", name="embeddings")

    keras.backend.clear_session()
    plain = _wide_and_deep(DenseGradientEmbedding(), Wide())
    plain.compile(optimizer=keras.optimizers.Adagrad(0.3), loss="binary_crossentropy")
    plain.fit(ids, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)

    keras.backend.clear_session()
    strategy = tfdist.ParameterServerStrategy()
    runtime = strategy._runtime
    requests = []
    try:
        deep, wide, model = _twin_tables(strategy)
        _record_tables(monkeypatch, runtime.ensure_session(), "lookup_tables", requests)
        model.fit(ids, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
        # the first step asks for each table; every later step reads both with one request
        first, second = requests[0], requests[1]  # in the order the model reads them
        assert sorted(first + second) == sorted([deep._table_key, wide._table_key]), requests[:4]
        assert requests[2:] == [first + second] * (STEPS - 1), requests[:6]
        np.testing.assert_allclose(model.predict(ids[:32], verbose=0), plain.predict(ids[:32], verbose=0),
                                   rtol=1e-4, atol=1e-6)
        for layer, reference in ((deep, plain.layers[1]), (wide, plain.layers[2])):
            table = runtime.read_rows(layer._table_key, np.arange(VOCAB, dtype=np.int64))
            np.testing.assert_allclose(table, reference.embeddings.numpy(), rtol=1e-4, atol=1e-6)
        # a step where the second table's ids differ: it asks for its own rows; the companionship is forgotten,
        # and learnt again at the next step with the same ids (rows read ahead never outlive their step)
        x, z = np.arange(5, dtype=np.int64), np.arange(5, 10, dtype=np.int64)
        expected = runtime.read_rows(second[0], z)
        requests.clear()
        runtime._new_step_for_lookups()
        runtime.lookup_rows(first[0], x)
        np.testing.assert_array_equal(runtime.lookup_rows(second[0], z), expected)
        runtime._new_step_for_lookups()
        runtime.lookup_rows(first[0], x)
        runtime.lookup_rows(second[0], x)
        assert requests == [first + second, second, first, second], requests
        assert runtime._companions == {first[0]: second}
    finally:
        strategy.shutdown()


def test_outside_a_strategy_it_is_an_ordinary_embedding():
    keras.backend.clear_session()
    layer = tfdist.layers.ShardedEmbedding(VOCAB, DIM)
    model = _model(layer)
    assert not layer.resident and layer.embeddings.shape == (VOCAB, DIM)
    assert model.predict(_data()[0][:4], verbose=0).shape == (4, 1)
    clone = tfdist.layers.ShardedEmbedding.from_config(layer.get_config())
    assert clone.input_dim == VOCAB and clone.output_dim == DIM


def test_adam_moves_only_the_rows_a_batch_touches_and_learns():
    """Lazy Adam (and momentum): rows never looked up keep their values; dense Adam would move them by momentum."""
    ids, y = _data()
    ids[:, 0] = 3  # row 3 in every example; rows >= 45 never appear
    ids = np.where(ids >= 45, 3, ids)
    keras.backend.clear_session()
    strategy = tfdist.ParameterServerStrategy()
    try:
        with strategy.scope():
            layer = tfdist.layers.ShardedEmbedding(VOCAB, DIM, seed=7)
            model = _model(layer)
            model.compile(optimizer=keras.optimizers.Adam(0.05), loss="binary_crossentropy")
        runtime = strategy._runtime
        hist = model.fit(ids, y, batch_size=BATCH, epochs=3, shuffle=False, verbose=0)
        assert hist.history["loss"][-1] < hist.history["loss"][0]
        table = runtime.lookup_rows(layer._table_key, np.arange(VOCAB, dtype=np.int64))
        spec = runtime.session.tables[layer._table_key]
        from tfdist.ps.sparse import Table

        initial = Table(spec, 0, 1).values
        np.testing.assert_array_equal(table[45:], initial[45:])
        assert not np.allclose(table[3], initial[3])
        assert spec.optimizer["kind"] == "adam" and spec.optimizer["learning_rate"] == pytest.approx(0.05)
    finally:
        strategy.shutdown()


def test_a_saved_model_loads_into_plain_keras_with_the_table_gathered_from_the_ps(tmp_path):
    ids, y = _data()
    keras.backend.clear_session()
    strategy = tfdist.ParameterServerStrategy()
    try:
        with strategy.scope():
            layer = tfdist.layers.ShardedEmbedding(VOCAB, DIM, seed=3)
            model = _model(layer)
            model.compile(optimizer=keras.optimizers.Adagrad(0.3), loss="binary_crossentropy")
        model.fit(ids, y, batch_size=BATCH, epochs=1, verbose=0)
        strategy.pull()
        expected = model.predict(ids[:64], verbose=0)
        table = layer.table_values(chunk_rows=7)  # several requests
        assert table.shape == (VOCAB, DIM)
        placement = strategy.placement_table()
        assert (layer._table_key, 0, "rows i with i % 1 == 0") in placement
        [listing] = strategy.tables()
        assert listing["rows"] == VOCAB and listing["rows_per_task"] == [VOCAB]
        assert listing["optimizer"]["kind"] == "adagrad"
        model.save(tmp_path / "m.keras")
    finally:
        strategy.shutdown()
    keras.backend.clear_session()
    # plain Keras: no strategy, no PS. compile=False: the saved optimizer state belongs to the job's variables
    # (a scalar for the table), not to a local table's (documented; recompile to fine-tune)
    loaded = keras.saving.load_model(tmp_path / "m.keras", compile=False)
    [plain_layer] = [lay for lay in loaded.layers if isinstance(lay, tfdist.layers.ShardedEmbedding)]
    assert not plain_layer.resident
    np.testing.assert_array_equal(plain_layer.embeddings.numpy(), table)
    np.testing.assert_allclose(loaded.predict(ids[:64], verbose=0), expected, rtol=1e-5, atol=1e-6)

    # Back into a job (a new in-process PS): load_weights writes the table to the PS before the first step.
    keras.backend.clear_session()
    again = tfdist.ParameterServerStrategy()
    try:
        with again.scope():
            layer = tfdist.layers.ShardedEmbedding(VOCAB, DIM, seed=11)  # other initial rows
            model = _model(layer)
            model.compile(optimizer=keras.optimizers.Adagrad(0.3), loss="binary_crossentropy")
        model.load_weights(tmp_path / "m.keras")
        np.testing.assert_allclose(model.predict(ids[:64], verbose=0), expected, rtol=1e-5, atol=1e-6)
        np.testing.assert_array_equal(layer.table_values(), table)
        with pytest.raises(ValueError, match="50 x 4; the weights loaded into it are 3 x 4"):
            again._runtime.write_table(layer._table_key, np.zeros((3, DIM), np.float32))
    finally:
        again.shutdown()


def test_bsp_over_two_workers_and_two_ps_equals_one_process_on_the_global_batch(tmp_path, scripts_dir):
    """Sparse aggregation by row: the tables (split over 2 PS) and weights equal the single-process run."""
    import json
    import os
    import sys

    from tfdist.testing import LocalCluster

    sys.path.insert(0, scripts_dir)
    import sparse_worker as sw  # noqa: E402

    steps, batch, vocab = 10, 8, 50
    with LocalCluster(workers=2, ps=2, log_dir=str(tmp_path / "logs")) as cluster:
        cluster.start(os.path.join(scripts_dir, "sparse_worker.py"),
                      ["--out", str(tmp_path), "--mode", "bsp", "--steps", str(steps), "--batch", str(batch),
                       "--vocab", str(vocab)])
        cluster.wait(240)
    results = [json.load(open(tmp_path / f"worker-{w}.json")) for w in (0, 1)]
    keras.backend.clear_session()
    ids, y = sw.data(steps, 2 * batch, vocab)

    class Zeros(DenseGradientEmbedding):
        def build(self, input_shape):
            self.embeddings = self.add_weight(shape=(vocab, sw.DIM), initializer="zeros", name="embeddings")

        def call(self, x):
            return keras.ops.matmul(keras.ops.one_hot(x, vocab), self.embeddings)

    reference = sw.build(Zeros())
    reference.compile(optimizer=keras.optimizers.SGD(0.5), loss="binary_crossentropy")
    reference.fit(ids, y, batch_size=2 * batch, epochs=1, shuffle=False, verbose=0)
    for r in results:
        np.testing.assert_allclose(r["table"], reference.layers[1].embeddings.numpy(), rtol=1e-4, atol=1e-6)
        np.testing.assert_allclose(r["kernel"], reference.layers[-1].kernel.numpy(), rtol=1e-4, atol=1e-6)
    assert results[0]["predictions"] == results[1]["predictions"]
    assert [t["rows"] for t in results[0]["ps_tables"][0].values()] == [25]  # rows 0, 2, ... on ps:0
    assert results[0]["tables"][0]["rows_per_task"] == [25, 25]


@pytest.mark.slow  # CI runs it (.ci/run); the PS-kill recovery it shares is in the default run (test_ps_durability)
@pytest.mark.parametrize("mode", ["async", "ssp", "bsp"])
def test_tables_survive_a_killed_ps(tmp_path, scripts_dir, mode):
    """2 workers, 2 PS with checkpoints; ps:1 is SIGKILLed mid-fit and restarted by the launcher.

    Both workers recover and finish. Async and SSP (update path): ps:1 restores
    its own newest checkpoint, tables included (async: with row pushes in
    flight in the background when it dies). BSP (gradient path): the chief rolls
    every task back to the step ps:1 restored (table rows exist only on the
    PS, so a reset to the chief's state cannot bring them back), and every
    worker ends with the same table.
    """
    import json
    import os
    import sys

    sys.path.insert(0, scripts_dir)
    import sparse_worker as sw

    from tfdist.config import JobConfig
    from tfdist.testing import LocalCluster

    config = JobConfig(name="tables")
    config.ps.checkpoint_dir = str(tmp_path / "ckpt")
    config.ps.checkpoint_every_steps, config.ps.checkpoint_every_s = 4, None
    out = tmp_path / "out"
    out.mkdir()
    with LocalCluster(workers=2, ps=2, config=config, log_dir=str(tmp_path / "logs")) as cluster:
        cluster.start(os.path.join(scripts_dir, "sparse_worker.py"),
                      ["--out", str(out), "--mode", mode, "--steps", "40", "--batch", "8", "--vocab", "50",
                       "--pause-at", "20"])
        sw.wait_until_paused(cluster, str(out), workers=2)
        cluster.kill("ps:1")
        (out / "resume").touch()
        cluster.wait(240)
        assert cluster.job.restarts == {"ps:1": 1}
        chief_log, ps_log = cluster.log("worker:0"), cluster.log("ps:1")
    results = [json.load(open(out / f"worker-{w}.json")) for w in (0, 1)]
    assert "restarted from the checkpoint of step" in ps_log
    assert all(r["recoveries"] >= 1 for r in results), chief_log[-3000:]
    assert all(np.isfinite(r["loss"]).all() for r in results)
    assert [t["updates"] > 0 for t in results[0]["ps_tables"][1].values()] == [True]
    if mode == "bsp":
        assert "rolled every parameter server back to its checkpoint of step" in chief_log
        np.testing.assert_array_equal(results[0]["table"], results[1]["table"])
        assert results[0]["predictions"] == results[1]["predictions"]


def test_a_replicated_embedding_sends_only_the_rows_a_step_changed():
    """An ordinary keras.layers.Embedding under the strategy (update path, SGD): each push carries the changed
    rows, not the whole table; the result equals plain Keras."""
    vocab = 1000
    ids, y = _data()
    ids = (ids * 17) % vocab
    keras.backend.clear_session()

    def model():
        keras.utils.set_random_seed(1)
        inp = keras.Input((LEN,), dtype="int64")
        x = keras.layers.GlobalAveragePooling1D()(keras.layers.Embedding(vocab, DIM)(inp))
        m = keras.Model(inp, keras.layers.Dense(1, activation="sigmoid")(x))
        m.compile(optimizer=keras.optimizers.SGD(0.5), loss="binary_crossentropy")
        return m

    plain = model()
    plain.fit(ids, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
    keras.backend.clear_session()
    strategy = tfdist.ParameterServerStrategy()
    try:
        with strategy.scope():
            replicated = model()
        replicated.fit(ids, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
        strategy.pull()
        np.testing.assert_allclose(replicated.layers[1].embeddings.numpy(), plain.layers[1].embeddings.numpy(),
                                   rtol=1e-5, atol=1e-7)
        table_bytes = vocab * DIM * 4
        pushed = strategy.sync_stats["bytes_pushed"]
        assert pushed < 0.25 * STEPS * table_bytes, (pushed, STEPS * table_bytes)
    finally:
        strategy.shutdown()


@pytest.fixture
def cluster_strategy(no_cluster):
    """Worker 0 of a 2-worker async job whose PS task runs in this process (real gRPC): row pushes go in the
    background, as in a cluster."""
    from tfdist.ps.server import PSServer

    server = PSServer(None, token="a-token-123", num_workers=2).start()
    keras.backend.clear_session()
    strategy = tfdist.ParameterServerStrategy(cluster={"worker": ["127.0.0.1:1", "127.0.0.1:2"],
                                                       "ps": [server.address]}, task="worker:0", token="a-token-123")
    yield strategy
    strategy.shutdown()
    server.stop(0)


def test_async_row_pushes_travel_in_the_background_and_none_is_lost(cluster_strategy, monkeypatch):
    """A cluster's async worker sends a step's row gradients from a background thread (its next lookups do
    not wait); every push reaches the PS before a read of it (ps_status, pull, save)."""
    ids, y = _data()
    strategy = cluster_strategy
    runtime = strategy._runtime
    assert runtime.background_row_pushes
    threads = set()
    with strategy.scope():
        layer = tfdist.layers.ShardedEmbedding(VOCAB, DIM, embeddings_initializer="zeros")
        model = _model(layer)
        model.compile(optimizer=keras.optimizers.SGD(0.5), loss="binary_crossentropy")
    model.fit(ids[:BATCH], y[:BATCH], batch_size=BATCH, epochs=1, verbose=0)  # the session exists now
    push = runtime.session.push_tables

    def recording(*args, **kwargs):
        import threading

        threads.add(threading.current_thread().name)
        return push(*args, **kwargs)

    monkeypatch.setattr(runtime.session, "push_tables", recording)
    model.fit(ids, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
    assert threads and all(name.startswith("tfdist-row-push") for name in threads), threads
    status = strategy.ps_status()[0]  # waits for the pushes in flight
    assert not runtime._row_pushes
    assert status["tables"][layer._table_key]["updates"] == STEPS + 1  # every step's push applied once
    assert np.abs(layer.table_values()).sum() > 0


def test_tables_read_together_push_together_in_the_background(cluster_strategy, monkeypatch):
    """Async in a cluster: a wide and a deep table of the same ids send one PushRows per PS task a step."""
    ids, y = _data()
    strategy = cluster_strategy
    pushes = []
    runtime = strategy._runtime
    deep, wide, model = _twin_tables(strategy)
    _record_tables(monkeypatch, runtime.ensure_session(), "push_tables", pushes)
    model.fit(ids, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
    status = strategy.ps_status()[0]  # waits for the pushes in flight (and any held one)
    assert not runtime._row_pushes and not runtime._held_pushes
    # the first step's lookups already paired the tables (both are read before the backward pass)
    assert pushes == [pushes[0]] * STEPS and sorted(pushes[0]) == sorted([deep._table_key, wide._table_key])
    for layer in (deep, wide):  # every step's gradients applied once per table
        assert status["tables"][layer._table_key]["updates"] == STEPS


def test_a_table_read_twice_in_a_step_is_never_grouped_and_loses_no_gradient(cluster_strategy, monkeypatch):
    """Async in a cluster: the deep table is read by two id sets, the wide one by the first: no push is lost."""
    ids, y = _data()
    strategy = cluster_strategy
    with strategy.scope():
        deep = tfdist.layers.ShardedEmbedding(VOCAB, DIM, embeddings_initializer="zeros", name="deep")
        wide = tfdist.layers.ShardedEmbedding(VOCAB, 1, embeddings_initializer="zeros", name="wide")
        keras.utils.set_random_seed(1)
        inp = keras.Input((LEN,), dtype="int64")
        shifted = keras.ops.mod(inp + 7, VOCAB)
        parts = [keras.layers.GlobalAveragePooling1D()(t) for t in (deep(inp), wide(inp), deep(shifted))]
        model = keras.Model(inp, keras.layers.Dense(1, activation="sigmoid")(keras.layers.Concatenate()(parts)))
        model.compile(optimizer=keras.optimizers.Adagrad(0.3), loss="binary_crossentropy")
    model.fit(ids, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
    status = strategy.ps_status()[0]
    runtime = strategy._runtime
    assert deep._table_key in runtime._solo and not runtime._held_pushes
    assert status["tables"][deep._table_key]["updates"] == 2 * STEPS  # both reads' gradients, every step
    assert status["tables"][wide._table_key]["updates"] == STEPS
