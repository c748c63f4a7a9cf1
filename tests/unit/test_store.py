"""ParameterStore: all-or-nothing validation, init races, liveness with a fake clock."""

import numpy as np
import pytest

from tfdist.consistency import AsyncPolicy
from tfdist.consistency.base import ConsistencyPolicy, PushAction, PushDecision
from tfdist.ps.placement import VariableSpec
from tfdist.ps.store import ParameterStore, StoreError

SPECS = [VariableSpec("a", "float32", (2, 2)), VariableSpec("b", "float32", (3,))]


class FakeClock:
    def __init__(self):
        self.t = 100.0

    def __call__(self):
        return self.t


def make_store(policy=None, clock=None):
    store = ParameterStore(policy or AsyncPolicy(), heartbeat_timeout_s=10, time_fn=clock or FakeClock())
    store.init(0, SPECS, {"a": np.ones((2, 2), np.float32), "b": np.zeros(3, np.float32)})
    return store


def snapshot(store):
    return store.read(0, 0, None, lambda v, vals: (v, {k: x.copy() for k, x in vals.items()}))


def test_push_adds_and_bumps_version():
    store = make_store()
    res = store.push(1, 0, {"a": np.full((2, 2), 0.5, np.float32)})
    assert res["applied"] and res["version"] == 2
    version, vals = snapshot(store)
    np.testing.assert_array_equal(vals["a"], np.full((2, 2), 1.5))
    np.testing.assert_array_equal(vals["b"], np.zeros(3))


@pytest.mark.parametrize(
    "deltas, code, match",
    [
        ({"zzz": np.zeros(1, np.float32)}, "NOT_FOUND", "Unknown variable"),
        ({"a": np.zeros((2, 2), np.float64)}, "INVALID_ARGUMENT", "Wrong dtype"),
        ({"a": np.zeros((4,), np.float32)}, "INVALID_ARGUMENT", "Wrong shape"),
        # one good delta with one bad one: nothing is applied
        ({"b": np.ones(3, np.float32), "a": np.zeros((3, 3), np.float32)}, "INVALID_ARGUMENT", "Wrong shape"),
    ],
)
def test_bad_pushes_change_nothing(deltas, code, match):
    store = make_store()
    before = snapshot(store)
    with pytest.raises(StoreError, match=match) as e:
        store.push(1, 0, deltas)
    assert e.value.grpc_code == code
    after = snapshot(store)
    assert after[0] == before[0]
    for k in before[1]:
        np.testing.assert_array_equal(after[1][k], before[1][k])
    assert store.stats["rejected"] == 1


def test_a_push_of_summed_steps_counts_every_step():
    store = make_store()
    store.push(1, 1, {"b": np.ones(3, np.float32)}, steps=3)  # exchange_every=3: three local steps, one delta
    store.push(1, 2, {"b": np.ones(3, np.float32)})
    assert store.progress == 4 and store.worker_batches == {1: 4}
    assert store.stats["pushes"] == 2
    np.testing.assert_array_equal(snapshot(store)[1]["b"], np.full(3, 2.0))


@pytest.mark.parametrize("steps", [0, -2, 1.5, "3", True])
def test_a_push_with_a_bad_step_count_changes_nothing(steps):
    store = make_store()
    before = snapshot(store)
    with pytest.raises(StoreError, match="at least one step") as e:
        store.push(1, 1, {"b": np.ones(3, np.float32)}, steps=steps)
    assert e.value.grpc_code == "INVALID_ARGUMENT"
    assert snapshot(store)[0] == before[0] and store.progress == 0 and not store.worker_batches
    np.testing.assert_array_equal(snapshot(store)[1]["b"], before[1]["b"])


def test_init_only_once_and_specs_must_match():
    store = make_store()
    assert store.init(1, SPECS, {"a": np.zeros((2, 2), np.float32), "b": np.ones(3, np.float32)}) is False
    np.testing.assert_array_equal(snapshot(store)[1]["a"], np.ones((2, 2)))  # first writer wins
    other = [VariableSpec("a", "float32", (2, 3)), SPECS[1]]
    with pytest.raises(StoreError, match="differ") as e:
        store.init(1, other, {"a": np.zeros((2, 3), np.float32), "b": np.ones(3, np.float32)})
    assert e.value.grpc_code == "FAILED_PRECONDITION"


def test_init_validates_values_against_specs():
    store = ParameterStore(AsyncPolicy())
    with pytest.raises(StoreError, match="spec says"):
        store.init(0, SPECS, {"a": np.ones((2, 2), np.float64), "b": np.zeros(3, np.float32)})
    with pytest.raises(StoreError, match="missing"):
        store.init(0, SPECS, {"a": np.ones((2, 2), np.float32)})
    assert not store.initialized


def test_requests_before_init_are_refused():
    store = ParameterStore(AsyncPolicy())
    with pytest.raises(StoreError, match="no variables yet") as e:
        store.push(0, 0, {"a": np.zeros((2, 2), np.float32)})
    assert e.value.grpc_code == "FAILED_PRECONDITION"
    assert store.wait_initialized(0.01) is False


def test_liveness_follows_the_fake_clock():
    clock = FakeClock()
    store = make_store(clock=clock)
    store.heartbeat(1)
    store.heartbeat(2)
    assert store.live_workers() == [0, 1, 2]
    clock.t += 5
    store.heartbeat(2)
    clock.t += 6  # worker 0 and 1 silent for 11 s > 10 s
    assert store.live_workers() == [2]
    store.mark_done(2)
    assert store.live_workers() == [] and store.done_workers == {2}


class DropOdd(ConsistencyPolicy):
    name = "drop-odd"

    def on_push(self, worker, clock, now):
        return PushDecision(PushAction.DROP if clock % 2 else PushAction.APPLY, "odd clock")


class WaitForever(ConsistencyPolicy):
    name = "wait"

    def on_push(self, worker, clock, now):
        return PushDecision(PushAction.WAIT, "never ready")


def test_policy_decides_drop():
    store = make_store(DropOdd())
    assert store.push(0, 1, {"b": np.ones(3, np.float32)})["dropped"]
    assert store.push(0, 2, {"b": np.ones(3, np.float32)})["applied"]
    np.testing.assert_array_equal(snapshot(store)[1]["b"], np.ones(3))
    assert store.stats["dropped"] == 1


def test_policy_wait_is_bounded():
    store = make_store(WaitForever(), clock=None)
    store._time = __import__("time").monotonic
    with pytest.raises(StoreError, match="Timed out waiting to push.*never ready") as e:
        store.push(0, 0, {"b": np.ones(3, np.float32)}, timeout=0.2)
    assert e.value.grpc_code == "DEADLINE_EXCEEDED"
    np.testing.assert_array_equal(snapshot(store)[1]["b"], np.zeros(3))


def test_async_policy_records_clocks():
    p = AsyncPolicy()
    assert p.on_push(0, 5, 0.0).action is PushAction.APPLY and not p.on_pull(0, 5, 0.0).wait
    p.on_applied(0, 5, 0.0)
    p.on_applied(0, 3, 0.0)
    assert p.describe() == {"policy": "async", "clocks": {"0": 5}}


def test_step_with_fewer_gradients_than_m_is_scaled_to_their_mean():
    from tfdist.consistency import SyncReplicasPolicy

    clock = FakeClock()
    store = ParameterStore(SyncReplicasPolicy(2), heartbeat_timeout_s=10, time_fn=clock)
    store.init(0, SPECS, {"a": np.ones((2, 2), np.float32), "b": np.zeros(3, np.float32)}, num_workers=2)
    store.heartbeat(1)
    store.set_excluded(0, [1])  # worker 1 is a detected straggler: step 0 completes with worker 0 alone
    meta, agg = store.push_gradients(0, 0, {"b": np.full(3, 0.5, np.float32)}, timeout=1)
    assert meta["global_step"] == 1 and not meta["dropped"]
    np.testing.assert_allclose(agg["b"], np.full(3, 1.0))  # 0.5 was scaled for M=2: the mean is 1.0
    late, agg_late = store.push_gradients(1, 0, {"b": np.ones(3, np.float32)}, timeout=1)
    assert late["dropped"] and np.array_equal(agg_late["b"], agg["b"])
    assert store.status()["excluded"] == [1]
