"""PS-resident tables in the store, through the request path: lookup, row gradients, sync steps, checkpoints."""

import threading

import numpy as np
import pytest

from tfdist.consistency import AsyncPolicy, SSPPolicy
from tfdist.consistency.sync_replicas import BSPPolicy
from tfdist.ps import sparse
from tfdist.ps.placement import VariableSpec
from tfdist.ps.protocol import RequestError
from tfdist.ps.server import ParameterService
from tfdist.ps.store import ParameterStore

SPECS = [VariableSpec("w", "float32", (2,))]
TABLE = {"key": "emb", "rows": 9, "dim": 2, "shard": 1, "num_shards": 3,
         "optimizer": {"kind": "sgd", "learning_rate": 0.5}, "initializer": {"kind": "zeros"}}


def make(policy, num_workers=2, tables=(TABLE,)):
    store = ParameterStore(policy, num_workers=num_workers, max_wait_s=5.0)
    svc = ParameterService(store)
    svc.call("Init", {"w": np.zeros(2, np.float32)}, worker=0, specs=[s.to_dict() for s in SPECS],
             tables=list(tables), num_workers=num_workers, policy=policy.spec())
    return store, svc


def rows(*r):
    return np.array(r, np.int64)


def lookup(svc, *r, worker=0):
    return svc.call("Lookup", {"rows": rows(*r)}, worker=worker, key="emb")[1]["values"]


def test_lookup_and_row_updates_on_the_update_path():
    store, svc = make(AsyncPolicy())
    assert store.status()["tables"]["emb"]["rows"] == 3  # rows 1, 4, 7 of 9
    np.testing.assert_array_equal(lookup(svc, 0, 2, 2), np.zeros((3, 2)))
    meta, _ = svc.call("PushRows", {"rows": rows(2, 0, 2), "grads": np.ones((3, 2), np.float32)}, worker=1,
                       key="emb")
    assert meta["applied"]
    np.testing.assert_array_equal(lookup(svc, 0, 1, 2), [[-0.5, -0.5], [0, 0], [-1.0, -1.0]])
    svc.call("PushRows", {"rows": rows(1), "grads": np.ones((1, 2), np.float32)}, worker=0, key="emb",
             learning_rate=0.1)  # the worker's own schedule
    np.testing.assert_allclose(lookup(svc, 1), [[-0.1, -0.1]])


WIDE = {**TABLE, "key": "wide", "rows": 6, "dim": 1}  # shard 1 of 3: rows 1, 4 (2 rows)


def test_one_lookup_reads_several_tables_at_the_same_rows():
    store, svc = make(AsyncPolicy(), tables=(TABLE, WIDE))
    svc.call("PushRows", {"rows": rows(1), "grads": np.ones((1, 1), np.float32)}, worker=0, key="wide")
    meta, tensors = svc.call("Lookup", {"rows": rows(1, 0, 1)}, worker=0, key="emb", also=["wide"])
    assert set(tensors) == {"values", "values.1"}
    np.testing.assert_array_equal(tensors["values"], np.zeros((3, 2)))
    np.testing.assert_array_equal(tensors["values.1"], [[-0.5], [0.0], [-0.5]])
    pulls = store.stats["pulls"]
    # every table is checked before any is read: a row outside the smaller table refuses the whole request
    for also, r, code in ((["wide"], rows(0, 2), "OUT_OF_RANGE"), (["nope"], rows(0), "NOT_FOUND"),
                          (["wide", "wide"], rows(0), "INVALID_ARGUMENT"), (["emb"], rows(0), "INVALID_ARGUMENT"),
                          ("wide", rows(0), "INVALID_ARGUMENT")):
        with pytest.raises(RequestError) as e:
            svc.call("Lookup", {"rows": r}, worker=0, key="emb", also=also)
        assert e.value.grpc_code == code, (also, e.value)
    assert store.stats["pulls"] == pulls


def test_one_push_carries_several_tables_gradients_all_or_nothing():
    store, svc = make(AsyncPolicy(), tables=(TABLE, WIDE))
    ones = np.ones((2, 2), np.float32)
    meta, _ = svc.call("PushRows", {"rows": rows(0, 1), "grads": ones, "grads.1": np.ones((2, 1), np.float32)},
                       worker=0, key="emb", also=["wide"])
    assert meta["applied"] and store.stats["row_pushes"] == 2
    np.testing.assert_array_equal(lookup(svc, 0, 1), [[-0.5, -0.5], [-0.5, -0.5]])
    emb_before = lookup(svc, 0, 1)
    wide_before = svc.call("Lookup", {"rows": rows(0, 1)}, worker=0, key="wide")[1]["values"]
    for tensors, also, code in (
            ({"rows": rows(0, 1), "grads": ones, "grads.1": np.full((2, 1), np.nan, np.float32)}, ["wide"],
             "INVALID_ARGUMENT"),  # the second table's part is non-finite: the first is not applied either
            ({"rows": rows(0, 1), "grads": ones, "grads.1": ones}, ["wide"], "INVALID_ARGUMENT"),  # too wide
            ({"rows": rows(0, 2), "grads": ones, "grads.1": np.ones((2, 1), np.float32)}, ["wide"],
             "OUT_OF_RANGE"),  # row 2 is outside the wide table's shard (2 rows)
            ({"rows": rows(0, 1), "grads": ones}, ["wide"], "INVALID_ARGUMENT"),  # its tensor is missing
            ({"rows": rows(0, 1), "grads": ones, "grads.1": ones}, ["nope"], "NOT_FOUND")):
        with pytest.raises(RequestError) as e:
            svc.call("PushRows", tensors, worker=0, key="emb", also=also)
        assert e.value.grpc_code == code, (also, e.value)
    np.testing.assert_array_equal(lookup(svc, 0, 1), emb_before)
    np.testing.assert_array_equal(svc.call("Lookup", {"rows": rows(0, 1)}, worker=0, key="wide")[1]["values"],
                                  wide_before)
    assert store.stats["row_pushes"] == 2


@pytest.mark.parametrize("method, tensors, meta, match, code", [
    ("Lookup", {"rows": rows(0, 3)}, {"key": "emb"}, "outside", "OUT_OF_RANGE"),
    ("Lookup", {"rows": rows(-1)}, {"key": "emb"}, "outside", "OUT_OF_RANGE"),
    ("Lookup", {"rows": rows(0)}, {"key": "nope"}, "Unknown table", "NOT_FOUND"),
    ("Lookup", {"rows": np.array([0], np.int32)}, {"key": "emb"}, "int64", "INVALID_ARGUMENT"),
    ("PushRows", {"rows": rows(0, 5), "grads": np.ones((2, 2), np.float32)}, {"key": "emb"}, "outside",
     "OUT_OF_RANGE"),
    ("PushRows", {"rows": rows(0), "grads": np.ones((1, 3), np.float32)}, {"key": "emb"}, "wide", "INVALID_ARGUMENT"),
    ("PushRows", {"rows": rows(0), "grads": np.ones((2, 2), np.float32)}, {"key": "emb"}, "one row per index",
     "INVALID_ARGUMENT"),
    ("PushRows", {"rows": rows(0), "grads": np.full((1, 2), np.nan, np.float32)}, {"key": "emb"}, "Non-finite",
     "INVALID_ARGUMENT"),
    ("PushRows", {"rows": rows(0), "grads": np.ones((1, 2), np.float64)}, {"key": "emb"}, "float32",
     "INVALID_ARGUMENT"),
    ("WriteRows", {"rows": rows(0, 3), "values": np.ones((2, 2), np.float32)}, {"key": "emb"}, "outside",
     "OUT_OF_RANGE"),
    ("WriteRows", {"rows": rows(0, 0), "values": np.ones((2, 2), np.float32)}, {"key": "emb"}, "named twice",
     "INVALID_ARGUMENT"),
    ("WriteRows", {"rows": rows(0), "values": np.ones((1, 3), np.float32)}, {"key": "emb"}, "wide",
     "INVALID_ARGUMENT"),
    ("WriteRows", {"rows": rows(0), "values": np.full((1, 2), np.inf, np.float32)}, {"key": "emb"}, "Non-finite",
     "INVALID_ARGUMENT"),
    ("WriteRows", {"rows": rows(0), "values": np.ones((1, 2), np.float64)}, {"key": "emb"}, "float32",
     "INVALID_ARGUMENT"),
    ("WriteRows", {"rows": rows(0), "values": np.ones((1, 2), np.float32)}, {"key": "nope"}, "Unknown table",
     "NOT_FOUND"),
])
def test_bad_table_requests_change_nothing(method, tensors, meta, match, code):
    store, svc = make(AsyncPolicy())
    before = store.table_arrays()
    with pytest.raises(RequestError, match=match) as e:
        svc.call(method, tensors, worker=1, **meta)
    assert e.value.grpc_code == code
    after = store.table_arrays()
    assert all(np.array_equal(after[k], before[k]) for k in before)


def test_written_rows_take_the_values_and_the_optimizer_slots_stay():
    store, svc = make(AsyncPolicy(), tables=({**TABLE, "optimizer": {"kind": "adagrad", "learning_rate": 0.5,
                                                                     "initial_accumulator_value": 0.1}},))
    svc.call("PushRows", {"rows": rows(0), "grads": np.ones((1, 2), np.float32)}, worker=1, key="emb")
    slots = {k: v.copy() for k, v in store.table_arrays().items() if "slot" in k}
    meta, _ = svc.call("WriteRows", {"rows": rows(2, 0), "values": np.array([[1, 2], [3, 4]], np.float32)},
                       worker=0, key="emb")
    assert meta["written"] == 2
    np.testing.assert_array_equal(lookup(svc, 0, 1, 2), [[3, 4], [0, 0], [1, 2]])
    after = store.table_arrays()
    assert all(np.array_equal(after[k], v) for k, v in slots.items())  # the accumulator is not reset
    assert store.status()["stats"]["row_writes"] == 1


def test_a_second_init_with_other_tables_is_refused():
    _, svc = make(AsyncPolicy())
    with pytest.raises(RequestError, match="tables differ"):
        svc.call("Init", {"w": np.zeros(2, np.float32)}, worker=1, specs=[s.to_dict() for s in SPECS],
                 tables=[{**TABLE, "rows": 10}])
    meta, _ = svc.call("Init", {"w": np.zeros(2, np.float32)}, worker=1, specs=[s.to_dict() for s in SPECS],
                       tables=[TABLE])
    assert not meta["initialized_here"]


def test_the_gradient_path_sums_the_step_rows_and_applies_them_when_the_step_completes():
    store, svc = make(BSPPolicy(2))
    g = np.ones((1, 2), np.float32)
    svc.call("PushRows", {"rows": rows(0), "grads": g}, worker=0, key="emb", step=0)
    svc.call("PushRows", {"rows": rows(0, 2), "grads": np.ones((2, 2), np.float32)}, worker=1, key="emb", step=0)
    np.testing.assert_array_equal(lookup(svc, 0, 2), np.zeros((2, 2)))  # nothing before the step completes
    with pytest.raises(RequestError, match="step 1 refused"):
        svc.call("PushRows", {"rows": rows(0), "grads": g}, worker=0, key="emb", step=1)
    done = []
    t = threading.Thread(target=lambda: done.append(svc.call("PushGradients", {"w": np.ones(2, np.float32)},
                                                             worker=0, step=0)))
    t.start()
    svc.call("PushGradients", {"w": np.ones(2, np.float32)}, worker=1, step=0)
    t.join(10)
    assert done and store.global_step == 1
    np.testing.assert_array_equal(lookup(svc, 0, 2), [[-1.0, -1.0], [-0.5, -0.5]])  # row 0: both workers' sum
    meta, _ = svc.call("PushRows", {"rows": rows(1), "grads": g}, worker=1, key="emb", step=0)
    assert meta["dropped"]  # that step is over
    np.testing.assert_array_equal(lookup(svc, 1), [[0.0, 0.0]])


def test_tables_are_in_checkpoints_and_restore_exactly():
    spec = dict(TABLE, optimizer={"kind": "adam", "learning_rate": 0.1})
    store, svc = make(SSPPolicy(2), tables=[spec])
    svc.call("PushRows", {"rows": rows(0, 2), "grads": np.ones((2, 2), np.float32)}, worker=1, key="emb")
    step, meta, arrays = store.checkpoint_state()
    assert {"table/emb/values", "table/emb/slot/m", "table/emb/slot/v"} <= set(arrays)
    fresh = ParameterStore(None, num_workers=2)
    fresh.restore(meta, arrays)
    for k, v in store.table_arrays().items():
        np.testing.assert_array_equal(fresh.table_arrays()[k], v)
    assert fresh.status()["tables"]["emb"]["updates"] == 1
    # Adam goes on from the restored moments: the same result as the original store's next step
    for s in (store, fresh):
        ParameterService(s).call("PushRows", {"rows": rows(2), "grads": np.ones((1, 2), np.float32)}, worker=0,
                                 key="emb")
    np.testing.assert_array_equal(fresh.table_arrays()["table/emb/values"], store.table_arrays()["table/emb/values"])


def test_row_values_match_a_table_applied_directly():
    """The store applies exactly what :class:`sparse.Table` computes (the reference tested against Keras)."""
    spec = dict(TABLE, optimizer={"kind": "ftrl", "learning_rate": 0.2}, initializer={"kind": "uniform"}, seed=4)
    store, svc = make(AsyncPolicy(), tables=[spec])
    ref = sparse.Table(sparse.TableSpec.from_dict(spec), 1, 3)
    rng = np.random.default_rng(1)
    for _ in range(5):
        r = rng.integers(0, 3, size=4).astype(np.int64)
        g = rng.normal(size=(4, 2)).astype(np.float32)
        svc.call("PushRows", {"rows": r, "grads": g}, worker=1, key="emb")
        ref.apply(r, g, None)
    np.testing.assert_array_equal(lookup(svc, 0, 1, 2), ref.values)


def test_a_row_sparse_push_adds_the_rows_it_names_and_is_checked_whole():
    store = ParameterStore(AsyncPolicy(), num_workers=2)
    svc = ParameterService(store)
    emb = VariableSpec("e", "float32", (6, 2))
    svc.call("Init", {"e": np.zeros((6, 2), np.float32)}, worker=0, specs=[emb.to_dict()], num_workers=2)
    meta, _ = svc.call("Push", {"e": np.ones((2, 2), np.float32), "e@rows": rows(4, 1)}, worker=1, clock=1,
                       sparse=["e"])
    assert meta["applied"]
    np.testing.assert_array_equal(store.state()["values"]["e"], [[0, 0], [1, 1], [0, 0], [0, 0], [1, 1], [0, 0]])
    before = store.state()["values"]["e"].copy()
    for tensors, match in (({"e": np.ones((1, 2), np.float32), "e@rows": rows(6)}, "outside"),
                           ({"e": np.ones((1, 3), np.float32), "e@rows": rows(0)}, "Wrong rows"),
                           ({"e": np.ones((2, 2), np.float32), "e@rows": rows(1, 1)}, "twice"),
                           ({"e": np.ones((2, 2), np.float32), "e@rows": rows(1)}, "one row per index")):
        with pytest.raises(RequestError, match=match):
            svc.call("Push", tensors, worker=1, clock=2, sparse=["e"])
        np.testing.assert_array_equal(store.state()["values"]["e"], before)


def test_the_session_sends_only_changed_rows_of_large_variables():
    from tfdist.ps.session import ROW_SPARSE_MIN_ROWS, _row_sparse

    n = ROW_SPARSE_MIN_ROWS
    table = np.zeros((n, 3), np.float32)
    table[[5, 9]] = 1.0
    kernel = np.ones((n, 3), np.float32)  # every row changed: stays dense
    small = np.zeros((4, 3), np.float32)
    small[0] = 1.0  # too few rows to bother
    deltas, row_map = _row_sparse({"t": table, "k": kernel, "s": small, "b": np.ones(3, np.float32)})
    assert list(row_map) == ["t"] and row_map["t"].tolist() == [5, 9] and row_map["t"].dtype == np.int64
    np.testing.assert_array_equal(deltas["t"], table[[5, 9]])
    assert deltas["k"] is kernel and deltas["s"] is small
