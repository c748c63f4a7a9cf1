"""Dynamic PS-resident tables (:mod:`tfdist.ps.dynamic`): the id index, per-id initialisation, admission,
eviction, and the store's request path (lookup, row gradients, sync steps, refusals, checkpoints)."""

import threading

import numpy as np
import pytest

from tfdist.consistency import AsyncPolicy, SSPPolicy
from tfdist.consistency.sync_replicas import BSPPolicy
from tfdist.ps import sparse
from tfdist.ps.dynamic import (
    DynamicTable,
    IdIndex,
    initial_rows,
    shard_of_ids,
    sum_by_id,
)
from tfdist.ps.placement import VariableSpec
from tfdist.ps.protocol import RequestError
from tfdist.ps.server import ParameterService
from tfdist.ps.store import ParameterStore

SPECS = [VariableSpec("w", "float32", (2,))]
#: Shard 0 of 1 (every id is this task's), rows 2 wide, SGD(0.5), zeros: easy arithmetic.
DYN = {"key": "dyn", "rows": 0, "dim": 2, "shard": 0, "num_shards": 1, "initializer": {"kind": "zeros"},
       "optimizer": {"kind": "sgd", "learning_rate": 0.5}, "dynamic": {}}
FIXED = {"key": "emb", "rows": 4, "dim": 2, "shard": 0, "num_shards": 1,
         "optimizer": {"kind": "sgd", "learning_rate": 0.5}, "initializer": {"kind": "zeros"}}
BIG = np.array([-2**63, -1, 0, 7, 2**40 + 3, 2**63 - 1], np.int64)


def ids(*r):
    return np.array(r, np.int64)


def make(policy=None, tables=(DYN,), num_workers=2):
    policy = policy or AsyncPolicy()
    store = ParameterStore(policy, num_workers=num_workers, max_wait_s=5.0)
    svc = ParameterService(store)
    svc.call("Init", {"w": np.zeros(2, np.float32)}, worker=0, specs=[s.to_dict() for s in SPECS],
             tables=list(tables), num_workers=num_workers, policy=policy.spec())
    return store, svc


def lookup(svc, *r, key="dyn", worker=0):
    return svc.call("Lookup", {"rows": ids(*r)}, worker=worker, key=key)[1]["values"]


def push(svc, r, g=1.0, key="dyn", worker=1, **meta):
    r = np.asarray(r, np.int64)
    return svc.call("PushRows", {"rows": r, "grads": np.full((len(r), 2), g, np.float32)}, worker=worker, key=key,
                    **meta)[0]


def table(store, key="dyn") -> DynamicTable:
    return store.table_shards.tables[key]


def same_tables(a, b) -> bool:
    a, b = a["tables"], b["tables"]
    return set(a) == set(b) and all(np.array_equal(a[k], b[k]) and np.asarray(a[k]).dtype == np.asarray(b[k]).dtype
                                    for k in a)


# ------------------------------------------------------------------ pure parts
def test_the_id_index_maps_any_int64_ids_and_forgets_deleted_ones():
    rng = np.random.default_rng(0)
    keys = np.unique(np.concatenate([BIG, rng.integers(-2**63, 2**63 - 1, 5000, dtype=np.int64)]))
    index = IdIndex()
    index.insert(keys[:3000], np.arange(3000))
    index.insert(keys[3000:], np.arange(3000, len(keys)))  # grows
    found, _ = index.find(keys)
    np.testing.assert_array_equal(found, np.arange(len(keys)))
    assert (index.find(ids(12345, 54321))[0] == -1).all() or 12345 in keys
    index.delete(keys[::2])
    found, _ = index.find(keys)
    assert (found[::2] == -1).all()
    np.testing.assert_array_equal(found[1::2], np.arange(len(keys))[1::2])
    index.insert(keys[::2], np.arange(len(keys))[::2] + 10**6)  # into the tombstones
    np.testing.assert_array_equal(index.find(keys[::2])[0], np.arange(len(keys))[::2] + 10**6)
    assert index.size == len(keys) and 2 * (index.size + index.deleted) <= len(index.keys)


def test_initial_rows_depend_on_the_seed_and_the_id_only():
    init = {"kind": "uniform", "minval": -0.5, "maxval": 0.5}
    a = initial_rows(init, 3, BIG, 8)
    b = initial_rows(init, 3, BIG[::-1], 8)[::-1]  # another batch, another order
    np.testing.assert_array_equal(a, b)
    assert a.dtype == np.float32 and (a >= -0.5).all() and (a < 0.5).all()
    assert not np.array_equal(a, initial_rows(init, 4, BIG, 8))
    assert len({r.tobytes() for r in a}) == len(BIG)
    many = initial_rows({"kind": "normal", "mean": 1.0, "stddev": 2.0}, 0, np.arange(4000), 16)
    assert abs(many.mean() - 1.0) < 0.05 and abs(many.std() - 2.0) < 0.05
    trunc = initial_rows({"kind": "truncated_normal", "mean": 0.0, "stddev": 1.0}, 0, np.arange(4000), 16)
    assert np.abs(trunc).max() <= 2.0
    assert not initial_rows({"kind": "zeros"}, 0, BIG, 3).any()
    ids = np.arange(20000, dtype=np.int64) * 977 - 5  # made in chunks: the same rows as one by one
    rows = initial_rows(init, 1, ids, 16)
    for i in (0, 8191, 8192, 19999):
        np.testing.assert_array_equal(rows[i], initial_rows(init, 1, ids[i:i + 1], 16)[0])


def test_ids_are_sharded_by_a_hash_deterministically_and_evenly():
    shard = shard_of_ids(np.arange(40000), 4)
    np.testing.assert_array_equal(shard, shard_of_ids(np.arange(40000), 4))
    counts = np.bincount(shard, minlength=4)
    assert counts.min() > 9000  # sequential ids spread like random ones
    assert set(shard_of_ids(BIG, 3).tolist()) <= {0, 1, 2}


def test_gradients_of_repeated_ids_add_up():
    unique, summed = sum_by_id(ids(5, -1, 5, 5), np.arange(8, dtype=np.float32).reshape(4, 2))
    np.testing.assert_array_equal(unique, [-1, 5])
    np.testing.assert_array_equal(summed, [[2, 3], [10, 13]])


@pytest.mark.parametrize("kind", ["sgd", "adagrad", "adam", "ftrl"])
def test_rows_train_exactly_as_a_fixed_table_of_the_same_rows(kind):
    """A dynamic table applies the row optimizer a fixed table applies (tested against Keras)."""
    opt = {"kind": kind, "learning_rate": 0.1}
    dyn = DynamicTable(sparse.TableSpec("d", 0, 3, initializer={"kind": "zeros"}, optimizer=opt, dynamic={}), 0, 1)
    ref = sparse.Table(sparse.TableSpec("f", 50, 3, initializer={"kind": "zeros"}, optimizer=opt), 0, 1)
    rng = np.random.default_rng(2)
    for _ in range(6):
        r = rng.integers(0, 50, size=7).astype(np.int64)
        g = rng.normal(size=(7, 3)).astype(np.float32)
        dyn.apply(r * 1000003 - 17, g, None)  # any ids: the same rows under other names
        ref.apply(r, g, None)
    touched = np.unique(np.concatenate([rng.integers(0, 50, 7)]))
    np.testing.assert_allclose(dyn.lookup(touched * 1000003 - 17), ref.values[touched], rtol=1e-6, atol=1e-7)


# ------------------------------------------------------------------ through the store
def test_a_lookup_reads_the_initial_row_and_creates_nothing_the_first_gradient_creates_it():
    spec = {**DYN, "initializer": {"kind": "uniform", "minval": -1.0, "maxval": 1.0}, "seed": 9}
    store, svc = make(tables=[spec])
    before = store.state()
    first = lookup(svc, *BIG)
    np.testing.assert_array_equal(first, initial_rows(spec["initializer"], 9, BIG, 2))
    assert same_tables(store.state(), before)  # reads change no table
    assert push(svc, BIG)["applied"]
    np.testing.assert_allclose(lookup(svc, *BIG), first - 0.5)
    status = store.status()["tables"]["dyn"]
    assert status["rows"] == len(BIG) and status["created"] == len(BIG) and status["dynamic"]


def test_admission_reads_the_default_until_an_id_was_pushed_min_count_times():
    store, svc = make(tables=[{**DYN, "dynamic": {"min_count": 3, "default_value": 0.25, "filter_width": 64}}])
    for _ in range(2):
        push(svc, [7, 8])
        np.testing.assert_array_equal(lookup(svc, 7, 8), np.full((2, 2), 0.25, np.float32))
    push(svc, [7])  # third push of 7: admitted, its row created (zeros) and updated
    np.testing.assert_array_equal(lookup(svc, 7, 8), [[-0.5, -0.5], [0.25, 0.25]])
    status = store.status()["tables"]["dyn"]
    assert status["rows"] == 1 and status["not_admitted"] == 4
    assert status["updates"] == 1  # pushes that changed no row are not updates (Adam's step, recency, TTL)


@pytest.mark.parametrize("policy", ["lru", "lfu"])
def test_eviction_frees_the_least_recently_or_least_often_updated_rows(policy):
    store, svc = make(tables=[{**DYN, "dynamic": {"capacity": 16, "eviction": policy}}])
    push(svc, [2])
    push(svc, [2])  # id 2: updated twice, long ago
    push(svc, np.arange(100, 114))  # 14 more: 15 rows
    push(svc, [1])  # id 1: updated once, most recently: 16 rows, full
    push(svc, [500])  # one more: frees 1 + 16 // 16 = 2 rows
    t = table(store)
    assert t.size == 15 and t.counters["evicted"] == 2 and len(t.values) == 16
    held = set(t.arrays()["ids"].tolist())
    assert 500 in held and 1 in held
    assert (2 in held) == (policy == "lfu")  # updated most often, least recently
    batch = set(range(100, 114))  # updated once, at the same time: lru frees one of them, lfu two
    assert len(held & batch) == (13 if policy == "lru" else 12)
    gone = min(batch - held)
    np.testing.assert_array_equal(lookup(svc, gone), [[0.0, 0.0]])  # back to its initial row


def test_rows_not_updated_for_ttl_updates_expire():
    store, svc = make(tables=[{**DYN, "dynamic": {"ttl": 4}}])
    push(svc, [1, 2])
    for _ in range(6):
        push(svc, [2])
    assert set(table(store).arrays()["ids"].tolist()) == {2}
    assert store.status()["tables"]["dyn"]["evicted"] == 1


def test_a_flood_of_new_ids_stays_within_the_capacity():
    store, svc = make(tables=[{**DYN, "dynamic": {"capacity": 1000}}])
    t = table(store)
    sizes = []
    for start in range(0, 200_000, 5000):
        push(svc, np.arange(start, start + 5000) * 7 + 3)  # never repeating; more new ids than fit
        sizes.append(t.nbytes)
    assert t.size <= 1000 and len(t.values) == 1000
    assert max(sizes[2:]) == min(sizes[2:])  # flat once full
    assert t.counters["not_admitted"] == 200_000 - 40 * 1000  # beyond the capacity in one push: dropped


def _lru_table(capacity):
    spec = sparse.TableSpec("t", 0, 2, initializer={"kind": "zeros"}, optimizer={"kind": "sgd", "learning_rate": 0.1},
                            dynamic={"capacity": capacity, "eviction": "lru"})
    return DynamicTable(spec, 0, 1)


@pytest.mark.parametrize("eviction", ["lru", "lfu"])
def test_victims_chosen_ahead_on_a_thread_are_the_ones_chosen_at_eviction_time(monkeypatch, eviction):
    """A large table chooses its next victims on a thread once 7/8 full; the eviction only frees them, and for
    lru frees exactly the rows a choice under the lock frees (rows updated since the copy are skipped)."""
    from tfdist.ps import dynamic

    monkeypatch.setattr(dynamic, "CHOOSE_AHEAD_FROM", 256)
    ahead, now = _lru_table(256), _lru_table(256)
    ahead.eviction = now.eviction = eviction
    now.capacity = 256  # the same capacity, below the threshold: chooses under the lock
    monkeypatch.setattr(now, "_choose_ahead", lambda: None)
    rng = np.random.default_rng(0)
    grads = np.ones((40, 2), np.float32)
    old = np.arange(1000, 1010, dtype=np.int64)  # held from the start, updated now and then (never oldest)
    for step in range(60):
        fresh = np.arange(step * 40, step * 40 + 30, dtype=np.int64)
        batch = np.concatenate([fresh, old if step % 3 == 0 else rng.choice(fresh, 10, replace=False)])
        for t in (ahead, now):
            if t.ahead is not None:
                assert t.ahead.wait(10)  # deterministic: the thread finished before the next update
            t.apply(batch, grads, None)
        if eviction == "lru":
            assert set(ahead.arrays()["ids"].tolist()) == set(now.arrays()["ids"].tolist()), step
        assert ahead.size <= 256
    assert ahead.counters["evicted"] > 256 and now.chose_under_lock > 5
    assert ahead.chose_under_lock == 0  # every eviction freed victims chosen ahead
    if eviction == "lfu":  # approximately LFU: the rows updated most often stayed
        assert set(old.tolist()) <= set(ahead.arrays()["ids"].tolist())


def test_rows_updated_after_the_copy_are_not_freed_and_a_small_table_chooses_under_the_lock(monkeypatch):
    from tfdist.ps import dynamic

    monkeypatch.setattr(dynamic, "CHOOSE_AHEAD_FROM", 64)
    t = _lru_table(64)
    for first in range(0, 60, 10):  # rows 0-9 updated first, 50-59 last: 60 of 64, 7/8 full after the last
        t.apply(np.arange(first, first + 10, dtype=np.int64), np.ones((10, 2), np.float32), None)
    assert t.ahead is not None and t.ahead.wait(10)
    assert set(t.ahead.slots.tolist()) >= set(t.index.find(np.arange(10, dtype=np.int64))[0].tolist())
    t.apply(np.arange(0, 5, dtype=np.int64), np.ones((5, 2), np.float32), None)  # rows 0-4: the newest now
    t.apply(np.arange(100, 110, dtype=np.int64), np.ones((10, 2), np.float32), None)  # 70 > 64: frees 6 + 4
    held = set(t.arrays()["ids"].tolist())
    assert set(range(5)) <= held and not (set(range(5, 10)) & held) and set(range(100, 110)) <= held
    assert len(set(range(10, 20)) - held) == 5 and t.size == 60  # then 5 of the next oldest (equally old)
    assert t.chose_under_lock == 0 and t.counters["evicted"] == 10
    small = _lru_table(63)  # below the threshold: no thread, chosen at eviction time
    small.apply(np.arange(70, dtype=np.int64), np.ones((70, 2), np.float32), None)
    assert small.ahead is None and small.size <= 63


def test_a_capacity_in_bytes_bounds_the_rows_and_the_table_s_memory():
    spec = sparse.TableSpec("t", 0, 8, initializer={"kind": "zeros"}, optimizer={"kind": "adam"},
                            dynamic={"capacity_bytes": 1 << 20})
    per_row = 4 * 8 * 3 + sparse.DYNAMIC_ROW_OVERHEAD  # values and Adam's two slots, then metadata and index
    assert sparse.dynamic_row_bytes(spec) == per_row
    t = DynamicTable(spec, 0, 1)
    assert t.capacity == (1 << 20) // per_row and t.status()["capacity_bytes"] == 1 << 20
    for start in range(0, 60_000, 3000):  # a flood of new ids
        t.apply(np.arange(start, start + 3000, dtype=np.int64), np.ones((3000, 8), np.float32), None)
        assert t.size <= t.capacity and t.nbytes <= 1 << 20, (t.size, t.nbytes)
    assert t.counters["evicted"] > 0
    both = sparse.TableSpec("t", 0, 8, optimizer={"kind": "adam"}, dynamic={"capacity_bytes": 1 << 20,
                                                                              "capacity": 100})
    assert sparse.dynamic_capacity_rows(both) == 100  # the smaller bound
    assert sparse.describe_table(both, 2)["capacity_per_task"] == 100
    with_filter = sparse.TableSpec("t", 0, 8, optimizer={"kind": "adam"}, dynamic={
        "capacity_bytes": 1 << 20, "min_count": 2, "filter_width": 1 << 16})
    assert sparse.dynamic_capacity_rows(with_filter) == ((1 << 20) - 4 * (1 << 16)) // per_row
    with pytest.raises(ValueError, match=r"capacity_bytes=100 holds no row: .* takes up to 257 bytes .* at least 257"):
        sparse.TableSpec("t", 0, 8, optimizer={"kind": "adam"}, dynamic={"capacity_bytes": 100})
    with pytest.raises(ValueError, match="capacity_bytes must be an integer"):
        sparse.TableSpec("t", 0, 8, dynamic={"capacity_bytes": -1})


@pytest.mark.parametrize("method, tensors, meta, match, code", [
    ("PushRows", {"rows": ids(1), "grads": np.ones((1, 3), np.float32)}, {}, "wide", "INVALID_ARGUMENT"),
    ("PushRows", {"rows": ids(1), "grads": np.full((1, 2), np.nan, np.float32)}, {}, "Non-finite",
     "INVALID_ARGUMENT"),
    ("PushRows", {"rows": ids(1, 2), "grads": np.full((2, 2), 3e38, np.float32)}, {"learning_rate": 1e6},
     "non-finite", "INVALID_ARGUMENT"),
    ("PushRows", {"rows": ids(1), "grads": np.ones((1, 2), np.float32), "grads.1": np.ones((1, 2), np.float32)},
     {"also": ["emb"]}, "fixed and dynamic", "INVALID_ARGUMENT"),
    ("Lookup", {"rows": ids(1)}, {"also": ["emb"]}, "fixed and dynamic", "INVALID_ARGUMENT"),
    ("WriteRows", {"rows": ids(1, 2, 3), "values": np.ones((3, 2), np.float32)}, {}, "capacity", "OUT_OF_RANGE"),
])
def test_bad_dynamic_table_requests_change_nothing(method, tensors, meta, match, code):
    store, svc = make(tables=[{**DYN, "dynamic": {"capacity": 2}}, FIXED])
    push(svc, [1])
    before = store.state()
    with pytest.raises(RequestError, match=match) as e:
        svc.call(method, tensors, worker=1, key="dyn", **meta)
    assert e.value.grpc_code == code
    assert same_tables(store.state(), before)


def test_ids_of_another_task_are_refused():
    store, svc = make(tables=[{**DYN, "shard": 1, "num_shards": 2}])
    mine = np.arange(50)[shard_of_ids(np.arange(50), 2) == 1]
    other = np.arange(50)[shard_of_ids(np.arange(50), 2) == 0]
    push(svc, mine)
    with pytest.raises(RequestError, match="belong to other PS tasks") as e:
        push(svc, np.concatenate([mine[:2], other[:1]]))
    assert e.value.grpc_code == "OUT_OF_RANGE"
    with pytest.raises(RequestError, match="belong to other PS tasks"):
        lookup(svc, int(other[0]))
    assert table(store).size == len(mine)


def test_a_lookup_above_the_reply_limit_is_refused_before_reading():
    store = ParameterStore(AsyncPolicy(), num_workers=1, max_reply_bytes=1000)
    svc = ParameterService(store)
    svc.call("Init", {"w": np.zeros(2, np.float32)}, worker=0, specs=[s.to_dict() for s in SPECS], tables=[DYN],
             num_workers=1, policy=AsyncPolicy().spec())
    with pytest.raises(RequestError, match="limited") as e:
        svc.call("Lookup", {"rows": np.arange(200, dtype=np.int64)}, worker=0, key="dyn")
    assert e.value.grpc_code == "RESOURCE_EXHAUSTED"


def test_the_gradient_path_sums_the_step_rows_and_creates_them_when_the_step_completes():
    store, svc = make(BSPPolicy(2))
    push(svc, [10**12], worker=0, step=0)
    push(svc, [10**12, -5], worker=1, step=0)
    assert table(store).size == 0  # nothing before the step completes
    done = []
    t = threading.Thread(target=lambda: done.append(svc.call("PushGradients", {"w": np.ones(2, np.float32)},
                                                             worker=0, step=0)))
    t.start()
    svc.call("PushGradients", {"w": np.ones(2, np.float32)}, worker=1, step=0)
    t.join(10)
    assert done and store.global_step == 1
    np.testing.assert_array_equal(lookup(svc, 10**12, -5), [[-1.0, -1.0], [-0.5, -0.5]])


def test_dynamic_tables_are_in_checkpoints_and_restore_exactly():
    spec = {**DYN, "optimizer": {"kind": "adam", "learning_rate": 0.1},
            "dynamic": {"capacity": 8, "min_count": 2, "filter_width": 32}}
    store, svc = make(SSPPolicy(2), tables=[spec])
    for r in ([1, 2, 3], [1, 2, 4], [5, 2]):
        push(svc, r)
    _, meta, arrays = store.checkpoint_state()
    assert {"table/dyn/ids", "table/dyn/values", "table/dyn/slot/m", "table/dyn/slot/v", "table/dyn/filter",
            "table/dyn/last", "table/dyn/count"} <= set(arrays)
    fresh = ParameterStore(None, num_workers=2)
    fresh.restore(meta, arrays)
    assert same_tables(fresh.state(), store.state())
    for s in (store, fresh):  # both go on alike: 4 and 5 admitted at their second push, Adam from its moments
        push(ParameterService(s), [1, 4, 5])
    assert same_tables(fresh.state(), store.state())


@pytest.mark.parametrize("damage, match", [
    (lambda a: a.__setitem__("table/dyn/ids", np.array([1, 1, 2], np.int64)), "repeated"),
    (lambda a: a.__setitem__("table/dyn/values", np.zeros((3, 5), np.float32)), "shape"),
    (lambda a: a["table/dyn/values"].__setitem__((0, 0), np.nan), "non-finite"),
    (lambda a: a.pop("table/dyn/last"), "arrays"),
])
def test_a_damaged_dynamic_table_checkpoint_is_refused_whole(damage, match):
    store, svc = make(SSPPolicy(2))
    push(svc, [1, 2, 3])
    _, meta, arrays = store.checkpoint_state()
    arrays = {k: v.copy() for k, v in arrays.items()}
    damage(arrays)
    fresh = ParameterStore(None, num_workers=2)
    before = fresh.state()
    with pytest.raises(RequestError, match=match):
        fresh.restore(meta, arrays)
    assert fresh.state().keys() == before.keys() and not fresh.initialized


def test_bad_dynamic_options_are_refused_with_the_option_named():
    for options, match in (({"eviction": "fifo"}, "eviction"), ({"capacity": -1}, "capacity"),
                           ({"min_count": 0}, "min_count"), ({"default_value": float("nan")}, "default_value"),
                           ({"nope": 1}, "dynamic options")):
        with pytest.raises(ValueError, match=match):
            sparse.TableSpec("d", 0, 2, dynamic=options)
    with pytest.raises(ValueError, match="rows=0"):
        sparse.TableSpec("d", 10, 2, dynamic={})
    with pytest.raises(RequestError):
        make(tables=[{**DYN, "dynamic": {"ttl": "soon"}}])


def test_exports_and_a_chain_of_deltas_stand_for_the_checkpointed_table(tmp_path):
    """Full export, then two deltas (rows changed, created, evicted); each export reads back as its table."""
    from tfdist import checkpoint as exports
    from tfdist.errors import TfdistError
    from tfdist.ps import checkpoint as files

    store, svc = make(tables=[{**DYN, "key": "t000/user", "dynamic": {"capacity": 8}}], num_workers=2)
    directory = str(tmp_path / "ckpt")

    def checkpoint(step):
        _, meta, arrays = store.checkpoint_state()
        files.write_shard(directory, 0, 1, step, meta, arrays, keep=10)
        state = store.state()["tables"]
        return state["table/t000/user/ids"], state["table/t000/user/values"]

    def push_user(r):
        r = np.asarray(r, np.int64)
        svc.call("PushRows", {"rows": r, "grads": np.ones((len(r), 2), np.float32)}, worker=1, key="t000/user")

    push_user([1, 2, 3])
    checkpoint(1)
    full = exports.export_table(directory, "user", str(tmp_path / "e0.npz"))
    assert full.kind == "full" and full.upserts == 3 and full.deleted == 0
    push_user([3, 4])  # 3 changed, 4 created
    ids, values = checkpoint(2)
    d1 = exports.export_table(directory, "t000/user", str(tmp_path / "e1.npz"), since=str(tmp_path / "e0.npz"))
    assert (d1.kind, d1.upserts, d1.deleted) == ("delta", 2, 0)
    push_user(np.arange(10, 17))  # 7 new rows into a capacity of 8: evicts the oldest
    ids, values = checkpoint(3)
    d2 = exports.export_table(directory, "user", str(tmp_path / "e2.npz"), since=str(tmp_path / "e1.npz"))
    assert d2.deleted > 0 and d2.upserts == 7
    again = exports.read_export(str(tmp_path / "e2.npz"))  # e0 + e1 + e2
    np.testing.assert_array_equal(again.ids, ids)
    np.testing.assert_array_equal(again.values, values)
    with np.load(tmp_path / "e2.npz") as f:  # the delta itself holds only what changed
        assert len(f["ids"]) == 7 and set(f["deleted"].tolist()) <= {1, 2, 3, 4}
    with pytest.raises(TfdistError, match="No single dynamic table"):
        exports.export_table(directory, "nope", str(tmp_path / "x.npz"))


def test_strategy_descriptions_of_a_dynamic_table_say_how_ids_are_placed_not_a_row_range():
    fixed = sparse.TableSpec("f", 10, 3)
    dyn = sparse.TableSpec("d", 0, 3, dynamic={"capacity": 1000})
    unbounded = sparse.TableSpec("u", 0, 3, dynamic={})
    assert sparse.placement_rule(fixed, 1, 2) == "rows i with i % 2 == 1"
    assert sparse.placement_rule(dyn, 1, 2) == "ids i with tfdist.ps.dynamic.shard_of_ids(i, 2) == 1"
    assert sparse.describe_table(fixed, 3)["rows_per_task"] == [4, 3, 3]
    d = sparse.describe_table(dyn, 2)
    assert d["rows_per_task"] is None and d["capacity_per_task"] == 1000 and d["dynamic"]["capacity"] == 1000
    assert sparse.describe_table(unbounded, 2)["capacity_per_task"] is None
