"""Elastic membership in the ParameterStore: joins, leaves, barriers sized at step boundaries, drain, job end."""

import threading
import time

import numpy as np
import pytest

from tfdist.consistency import BSPPolicy, PolicyContext, SSPPolicy, SyncReplicasPolicy
from tfdist.ps.placement import VariableSpec
from tfdist.ps.store import ParameterStore, StoreError

SPECS = [VariableSpec("w", "float32", (3,))]


class FakeClock:
    def __init__(self):
        self.t = 100.0

    def __call__(self):
        return self.t


def make_store(policy, num_workers, clock=None, **kwargs):
    """A store on ``clock`` (fake); without one, on real time (needed where a wait must time out)."""
    store = ParameterStore(policy, heartbeat_timeout_s=10, startup_grace_s=5, time_fn=clock or time.monotonic, **kwargs)
    store.init(0, SPECS, {"w": np.zeros(3, np.float32)}, num_workers=num_workers)
    return store


def read_meta(store, worker, clock=0):
    return store.read(worker, clock, None, lambda meta, values: meta, timeout=0.5)


def grad(value):
    return {"w": np.full(3, value, np.float32)}


def push_in_threads(store, step, grads_by_worker, timeout=5.0):
    """Pushes every worker's gradient for ``step`` concurrently; returns {worker: (meta, aggregate)}."""
    out, errors = {}, []

    def run(worker, g):
        try:
            out[worker] = store.push_gradients(worker, step, g, timeout=timeout)
        except Exception as e:  # surfaced below
            errors.append(e)

    threads = [threading.Thread(target=run, args=(w, g)) for w, g in grads_by_worker.items()]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout + 5)
    assert not errors, errors
    return out


# ------------------------------------------------------------------ update path
def test_ssp_joiner_adopts_the_slowest_clock_and_does_not_hold_others_back():
    clock = FakeClock()
    store = make_store(SSPPolicy(2), num_workers=2, clock=clock)
    for c in range(1, 11):
        store.push(0, c, grad(0.0))
        store.push(1, c, grad(0.0))
    assert store.policy.min_clock(store._ctx()) == 10
    meta = read_meta(store, 2)  # worker 2 joins the running job
    assert meta["clock"] == 10  # told where it starts
    assert store.policy.clock_of(2) == 10
    assert store.policy.min_clock(store._ctx()) == 10  # a joiner at clock 0 would have made this 0
    assert read_meta(store, 0, clock=12)["min_clock"] == 10  # worker 0 may start clock 12 = 10 + s at once
    assert store.status()["joins"] == 1  # worker 2 (workers 0 and 1 started the job)


def test_worker_that_said_done_can_rejoin_and_is_announced_again():
    clock = FakeClock()
    store = make_store(SSPPolicy(1), num_workers=2, clock=clock)
    for c in range(1, 6):
        store.push(0, c, grad(0.0))
        store.push(1, c, grad(0.0))
    store.mark_done(1)
    for c in range(6, 9):
        store.push(0, c, grad(0.0))
    assert store.live_workers() == [0]
    store.rejoin(1)
    assert read_meta(store, 1)["clock"] == 8  # came back at the live workers' clock, not its old 5
    assert store.live_workers() == [0, 1]


def test_crashed_worker_leaves_by_silence_and_its_restart_rejoins():
    clock = FakeClock()
    store = make_store(SSPPolicy(1), num_workers=2, clock=clock)
    store.push(0, 1, grad(0.0))
    store.push(1, 1, grad(0.0))
    clock.t += 11  # past the heart-beat timeout and the start-up grace; worker 1 said nothing
    store.push(0, 2, grad(0.0))
    assert store.live_workers() == [0]
    assert store.policy.min_clock(store._ctx()) == 2  # the dead worker does not hold worker 0 back
    joins = store.status()["joins"]
    store.heartbeat(1)
    assert store.status()["joins"] == joins + 1 and store.live_workers() == [0, 1]


def test_per_worker_batches_and_progress_are_counted():
    store = make_store(SSPPolicy(10), num_workers=2, clock=FakeClock())
    for c in range(1, 4):
        store.push(0, c, grad(1.0))
    store.push(1, 1, grad(1.0))
    status = store.status()
    assert status["worker_batches"] == {"0": 3, "1": 1}
    assert status["progress"] == 4



def test_brief_status_has_the_counters_the_engine_reads_and_no_specs():
    store = make_store(SSPPolicy(10), num_workers=2, clock=FakeClock())
    store.control(total_batches=5)
    store.push(0, 1, grad(1.0))
    full, brief = store.status(), store.status(brief=True)
    assert full["specs"] == [s.to_dict() for s in SPECS]
    assert "specs" not in brief
    assert brief == {k: v for k, v in full.items() if k != "specs"}
    # what ElasticEngine.poll reads (and tests/integration/test_elastic.py: the policy)
    assert brief["initialized"] is True and brief["worker_batches"] == {"0": 1} and brief["progress"] == 1
    assert brief["total_batches"] == 5 and brief["job_done"] is False and brief["policy"] is not None


# ---------------------------------------------------------------- drain, job end
def test_drained_worker_is_told_to_leave_and_others_are_not():
    store = make_store(SSPPolicy(10), num_workers=2, clock=FakeClock())
    store.control(drain=[1])
    assert store.push(1, 1, grad(0.0)).get("leave") is True
    assert "leave" not in store.push(0, 1, grad(0.0))
    assert read_meta(store, 1).get("leave") is True
    store.control(undrain=[1])
    assert "leave" not in store.push(1, 2, grad(0.0))


def test_job_done_after_total_batches_are_applied():
    store = make_store(SSPPolicy(10), num_workers=1, clock=FakeClock())
    store.control(total_batches=3)
    assert "job_done" not in store.push(0, 1, grad(1.0))
    assert "job_done" not in store.push(0, 2, grad(1.0))
    assert store.push(0, 3, grad(1.0))["job_done"] is True
    assert read_meta(store, 0).get("job_done") is True
    with pytest.raises(StoreError, match="total_batches"):
        store.control(total_batches=0)
    assert store.status()["total_batches"] == 3  # the bad request changed nothing


def test_update_rate_cap_spaces_applied_updates():
    store = ParameterStore(SSPPolicy(100), heartbeat_timeout_s=10, max_updates_per_s=40.0)
    store.init(0, SPECS, {"w": np.zeros(3, np.float32)}, num_workers=1)
    start = time.monotonic()
    for c in range(1, 9):
        store.push(0, c, grad(1.0))
    # 8 updates at <= 40/s: the mechanism guarantees at least 7 gaps of 25 ms (a lower bound, not a speed claim)
    assert time.monotonic() - start >= 7 / 40.0 - 1e-3
    np.testing.assert_allclose(store.read(0, 0, None, lambda m, v: v["w"].copy()), np.full(3, 8.0))


# -------------------------------------------------------------- gradient path
def test_bsp_barrier_grows_at_the_next_step_boundary():
    store = make_store(BSPPolicy(2), num_workers=2)
    push_in_threads(store, 0, {0: grad(0.5), 1: grad(0.5)})
    store.heartbeat(2)  # worker 2 joins during step 1: step 1 still needs only the 2 it started with
    out = push_in_threads(store, 1, {0: grad(0.5), 1: grad(0.5)})
    assert out[0][0]["global_step"] == 2
    assert store.policy.step_replicas == 3  # from step 2 on, all three
    with pytest.raises(StoreError, match="Timed out"):
        store.push_gradients(0, 2, grad(0.5), timeout=0.3)
    assert store.global_step == 2  # two of three gradients do not complete a BSP step of three
    out = push_in_threads(store, 2, {1: grad(1.0), 2: grad(1.5)})
    # Keras scaled each loss by 1/M = 1/2; three gradients 1, 2, 3 (sent as 0.5, 1.0, 1.5) average to 2
    np.testing.assert_allclose(out[1][1]["w"], np.full(3, 2.0))


def test_sync_replicas_keeps_its_ratio_as_workers_join_and_leave():
    policy = SyncReplicasPolicy(3, num_workers=4)
    for awaited, m in [(4, 3), (8, 6), (5, 4), (2, 2), (1, 1)]:
        policy.on_step_boundary(PolicyContext(live=frozenset(range(awaited))))
        assert policy.step_replicas == m, (awaited, m)
    fixed = SyncReplicasPolicy(3)  # no N known: M stays 3
    fixed.on_step_boundary(PolicyContext(live=frozenset(range(8))))
    assert fixed.step_replicas == 3


def test_sync_replicas_joiners_raise_m_at_the_boundary_end_to_end():
    store = make_store(SyncReplicasPolicy(1, num_workers=2), num_workers=2)
    push_in_threads(store, 0, {0: grad(1.0)})  # 1 of 2
    for w in (2, 3):
        store.heartbeat(w)
    push_in_threads(store, 1, {1: grad(1.0)})  # M for step 1 was fixed at 1 when step 0 completed
    assert store.policy.step_replicas == 2  # 1 of 2 → 2 of 4
    with pytest.raises(StoreError, match="Timed out"):
        store.push_gradients(0, 2, grad(1.0), timeout=0.3)
    out = push_in_threads(store, 2, {3: grad(3.0)})
    np.testing.assert_allclose(out[3][1]["w"], np.full(3, 2.0))  # (1 + 3) scaled from M=1 to the mean of 2
