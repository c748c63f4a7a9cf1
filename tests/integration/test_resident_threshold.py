"""``ps.resident_threshold_bytes``: an unchanged model's large ``keras.layers.Embedding`` lives on the PS (#14).

Single process (in-process PS): the large table becomes a PS-resident table
(no full-size variable on the worker) and trains exactly as the same model
with ``tfdist.layers.ShardedEmbedding``; a small one stays replicated; the
saved model loads into plain Keras with the same predictions.
"""

import numpy as np
import pytest

keras = pytest.importorskip("keras")

import tfdist  # noqa: E402

pytestmark = pytest.mark.timeout(300)

BIG, SMALL, DIM, LEN, BATCH = 500, 20, 8, 6, 16  # the big table: 500 x 8 x 4 = 16,000 bytes


def _data():
    rng = np.random.default_rng(0)
    ids = (rng.zipf(1.5, size=(BATCH * 10, LEN)) % BIG).astype(np.int64)
    y = (ids.sum(axis=1) % 2).astype(np.float32)
    return ids, y


def _model(big_layer):
    keras.utils.set_random_seed(1)
    inp = keras.Input((LEN,), dtype="int64")
    x = keras.layers.GlobalAveragePooling1D()(big_layer(inp))
    side = keras.layers.GlobalAveragePooling1D()(keras.layers.Embedding(SMALL, 4, name="small")(inp % SMALL))
    out = keras.layers.Dense(1, activation="sigmoid", name="out")(keras.layers.Concatenate()([x, side]))
    model = keras.Model(inp, out)
    model.compile(optimizer=keras.optimizers.SGD(0.5), loss="binary_crossentropy")
    return model


def test_a_large_embedding_lives_on_the_ps_and_trains_like_a_sharded_embedding(no_cluster, tmp_path):
    ids, y = _data()
    keras.backend.clear_session()
    reference = tfdist.ParameterServerStrategy()
    try:
        with reference.scope():
            sharded = _model(tfdist.layers.ShardedEmbedding(BIG, DIM, embeddings_initializer="zeros", name="big"))
        sharded.fit(ids, y, batch_size=BATCH, epochs=2, shuffle=False, verbose=0)
        want = sharded.predict(ids[:32], verbose=0)
    finally:
        reference.shutdown()

    keras.backend.clear_session()
    strategy = tfdist.ParameterServerStrategy(config={"ps": {"resident_threshold_bytes": 10_000}})
    try:
        with strategy.scope():
            model = _model(keras.layers.Embedding(BIG, DIM, embeddings_initializer="zeros", name="big"))
        shapes = sorted(tuple(w.shape) for w in model.weights)
        assert (BIG, DIM) not in shapes and (SMALL, 4) in shapes, shapes  # the big table is not on the worker
        tables = strategy.tables()
        assert [(t["rows"], t["dim"]) for t in tables] == [(BIG, DIM)], tables
        assert any(str(entry[2]).startswith("rows i with") for entry in strategy.placement_table())
        model.fit(ids, y, batch_size=BATCH, epochs=2, shuffle=False, verbose=0)
        got = model.predict(ids[:32], verbose=0)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
        assert strategy.ps_status()[0]["stats"]["row_pushes"] > 0

        path = str(tmp_path / "model.keras")
        model.save(path)  # the table gathered from the PS, saved as an Embedding saves itself
    finally:
        strategy.shutdown()

    # Loaded back under a tfdist strategy: the table is written to the (new) PS, the predictions come back.
    for how in ("load_weights", "load_model"):
        keras.backend.clear_session()
        again = tfdist.ParameterServerStrategy(config={"ps": {"resident_threshold_bytes": 10_000}})
        try:
            with again.scope():
                if how == "load_weights":
                    loaded = _model(keras.layers.Embedding(BIG, DIM, name="big"))  # default (random) initializer
                    loaded.load_weights(path)
                else:
                    loaded = keras.saving.load_model(path)
            assert [(t["rows"], t["dim"]) for t in again.tables()] == [(BIG, DIM)], how
            np.testing.assert_allclose(loaded.predict(ids[:32], verbose=0), got, rtol=1e-5, atol=1e-6, err_msg=how)
            assert again.ps_status()[0]["stats"]["row_writes"] >= 1
        finally:
            again.shutdown()

    keras.backend.clear_session()
    plain = keras.saving.load_model(path)  # no strategy: an ordinary Embedding
    assert isinstance(plain.get_layer("big"), keras.layers.Embedding)
    assert plain.get_layer("big").embeddings.shape == (BIG, DIM)
    np.testing.assert_allclose(plain.predict(ids[:32], verbose=0), got, rtol=1e-5, atol=1e-6)


def test_below_the_threshold_or_without_it_embeddings_stay_replicated(no_cluster):
    keras.backend.clear_session()
    strategy = tfdist.ParameterServerStrategy(config={"ps": {"resident_threshold_bytes": 1_000_000}})
    try:
        with strategy.scope():
            model = _model(keras.layers.Embedding(BIG, DIM, name="big"))
        assert strategy.tables() == []
        assert (BIG, DIM) in [tuple(w.shape) for w in model.weights]
    finally:
        strategy.shutdown()
