"""PS-resident tables in numpy: mod sharding, initialisation, and per-row optimizers against Keras's own."""

import numpy as np
import pytest

from tfdist.ps import sparse

keras = pytest.importorskip("keras")

ROWS, DIM, STEPS = 7, 3, 6

KERAS_OPTIMIZERS = {
    "sgd": lambda: keras.optimizers.SGD(0.1),
    "sgd_momentum": lambda: keras.optimizers.SGD(0.1, momentum=0.9),
    "sgd_nesterov": lambda: keras.optimizers.SGD(0.1, momentum=0.9, nesterov=True),
    "adagrad": lambda: keras.optimizers.Adagrad(0.1),
    "adam": lambda: keras.optimizers.Adam(0.05),
    "ftrl": lambda: keras.optimizers.Ftrl(0.1, l1_regularization_strength=0.01, l2_regularization_strength=0.02,
                                          l2_shrinkage_regularization_strength=0.01, beta=0.1),
}
ROW_SPECS = {
    "sgd": {"kind": "sgd", "learning_rate": 0.1},
    "sgd_momentum": {"kind": "sgd", "learning_rate": 0.1, "momentum": 0.9},
    "sgd_nesterov": {"kind": "sgd", "learning_rate": 0.1, "momentum": 0.9, "nesterov": True},
    "adagrad": {"kind": "adagrad", "learning_rate": 0.1},
    "adam": {"kind": "adam", "learning_rate": 0.05},
    "ftrl": {"kind": "ftrl", "learning_rate": 0.1, "l1_regularization_strength": 0.01,
             "l2_regularization_strength": 0.02, "l2_shrinkage_regularization_strength": 0.01, "beta": 0.1},
}


def test_mod_sharding_covers_every_row_once():
    for rows, n in ((10, 3), (2, 4), (1, 1), (1000, 7)):
        ids = np.arange(rows)
        shard, local = sparse.shard_of(ids, n)
        assert [sparse.shard_rows(rows, s, n) for s in range(n)] == [int((shard == s).sum()) for s in range(n)]
        for s in range(n):
            assert sorted(local[shard == s]) == list(range(sparse.shard_rows(rows, s, n)))
        assert np.array_equal(local * n + shard, ids)  # the inverse


@pytest.mark.parametrize("name", sorted(ROW_SPECS))
def test_rows_touched_every_step_follow_the_keras_optimizer_exactly(name):
    rng = np.random.default_rng(0)
    init = rng.normal(size=(ROWS, DIM)).astype(np.float32)
    grads = rng.normal(size=(STEPS, ROWS, DIM)).astype(np.float32)
    var = keras.Variable(init.copy())
    opt = KERAS_OPTIMIZERS[name]()
    table = sparse.Table(sparse.TableSpec("t", ROWS, DIM, optimizer=ROW_SPECS[name]), 0, 1)
    table.values[:] = init
    for t in range(STEPS):
        opt.apply_gradients([(grads[t], var)])
        table.apply(np.arange(ROWS), grads[t], None)
    np.testing.assert_allclose(table.values, np.asarray(var.numpy()), rtol=2e-5, atol=2e-6)


@pytest.mark.parametrize("name", sorted(ROW_SPECS))
def test_untouched_rows_and_their_slots_do_not_move_and_repeats_are_summed(name):
    table = sparse.Table(sparse.TableSpec("t", ROWS, DIM, optimizer=ROW_SPECS[name]), 0, 1)
    before = {k: v.copy() for k, v in table.arrays().items()}
    g = np.ones((3, DIM), np.float32)
    twin = sparse.Table(sparse.TableSpec("t", ROWS, DIM, optimizer=ROW_SPECS[name]), 0, 1)
    table.apply(np.array([5, 1, 5]), g, 0.1)  # row 5 twice: its gradients add up
    twin.apply(np.array([1, 5]), np.stack([g[0], 2 * g[0]]), 0.1)
    for k, v in table.arrays().items():
        untouched = [r for r in range(ROWS) if r not in (1, 5)]
        np.testing.assert_array_equal(v[untouched], before[k][untouched])
        np.testing.assert_allclose(v, twin.arrays()[k], rtol=1e-6)
    assert not np.array_equal(table.values[[1, 5]], before["values"][[1, 5]])


def test_initialisation_is_deterministic_and_sharded():
    spec = sparse.TableSpec("t", 10, 4, initializer={"kind": "uniform", "minval": -1.0, "maxval": 1.0}, seed=3)
    a, b = sparse.Table(spec, 1, 3), sparse.Table(spec, 1, 3)
    np.testing.assert_array_equal(a.values, b.values)
    assert a.values.shape == (3, 4) and a.values.dtype == np.float32
    assert np.all(np.abs(a.values) <= 1.0)
    assert not np.array_equal(a.values, sparse.Table(spec, 0, 3).values[:3])
    normal = sparse.Table(sparse.TableSpec("n", 2000, 8, initializer={"kind": "truncated_normal", "stddev": 0.1}), 0, 1)
    assert np.all(np.abs(normal.values) <= 0.2 + 1e-6) and 0.05 < normal.values.std() < 0.1
    assert not sparse.Table(sparse.TableSpec("z", 5, 2, initializer={"kind": "zeros"}), 0, 2).values.any()


@pytest.mark.parametrize("bad", [
    {"kind": "rmsprop"}, {"kind": "adam", "beta_3": 1.0}, {"kind": "sgd", "momentum": "x"},
    {"kind": "sgd", "nesterov": 1}, {"kind": "adam", "learning_rate": float("nan")}, "adam",
])
def test_bad_optimizer_specs_are_refused(bad):
    with pytest.raises(ValueError, match="optimizer"):
        sparse.make_row_optimizer(bad)


@pytest.mark.parametrize("field, value", [("rows", 0), ("dim", -1), ("rows", True), ("dtype", "float16"),
                                          ("initializer", {"kind": "orthogonal"}),
                                          ("initializer", {"kind": "uniform", "stddev": 1})])
def test_bad_table_specs_are_refused(field, value):
    kwargs = {"key": "t", "rows": 4, "dim": 2, field: value}
    with pytest.raises(ValueError):
        sparse.TableSpec(**kwargs)


def test_spec_round_trip_and_checkpoint_arrays():
    spec = sparse.TableSpec("0003/emb", 9, 2, optimizer={"kind": "adam", "learning_rate": 0.01}, seed=5)
    assert sparse.TableSpec.from_dict(spec.to_dict()) == spec
    table = sparse.Table(spec, 0, 2)
    table.apply(np.array([0, 3]), np.ones((2, 2), np.float32), None)
    copy = sparse.Table(spec, 0, 2)
    copy.load(table.arrays(), table.updates)
    for k, v in table.arrays().items():
        np.testing.assert_array_equal(copy.arrays()[k], v)
    assert copy.updates == 1


@pytest.mark.parametrize("name", sorted(ROW_SPECS))
def test_rows_in_any_order_get_their_own_gradients(name):
    """The rows of a push arrive in the batch's order (not sorted): each row gets its own gradient."""
    spec = sparse.TableSpec("t", ROWS, DIM, optimizer=ROW_SPECS[name])
    shuffled, ordered = sparse.Table(spec, 0, 1), sparse.Table(spec, 0, 1)
    rows = np.array([4, 0, 6, 2])
    g = np.arange(4 * DIM, dtype=np.float32).reshape(4, DIM) - 5
    shuffled.apply(rows, g, 0.1)
    order = np.argsort(rows)
    ordered.apply(rows[order], g[order], 0.1)
    np.testing.assert_array_equal(shuffled.values, ordered.values)
    one_by_one = sparse.Table(spec, 0, 1)
    for r, gr in zip(rows, g):  # rows are independent: one push per row gives the same values (not Adam: it counts)
        one_by_one.updates = 0
        one_by_one.apply(np.array([r]), gr[None], 0.1)
    np.testing.assert_allclose(one_by_one.values, ordered.values, rtol=1e-6)
