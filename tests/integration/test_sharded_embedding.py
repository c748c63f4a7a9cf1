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
