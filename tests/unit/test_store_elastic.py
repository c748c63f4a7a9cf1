"""Elastic membership in the ParameterStore: joins, leaves, barriers sized at step boundaries, drain, job end."""

import threading
import time

import numpy as np
import pytest

from tfdist.consistency import BSPPolicy, PolicyContext, SSPPolicy, SyncReplicasPolicy
from tfdist.ps.placement import VariableSpec
from tfdist.ps.protocol import RequestError as StoreError
from tfdist.ps.server import ParameterService
from tfdist.ps.store import ParameterStore

SPECS = [VariableSpec("w", "float32", (3,))]


class FakeClock:
    def __init__(self):
        self.t = 100.0

    def __call__(self):
        return self.t


#: Worker slots of the job (an elastic job's cluster lists one per possible worker).
SLOTS = 8


def call(store, method, tensors=None, timeout=None, **meta):
    """One request through the PS's request path (protocol → store); returns (meta, tensors)."""
    return ParameterService(store).call(method, tensors, timeout=timeout, **meta)


def push(store, worker, clock, deltas):
    return call(store, "Push", deltas, worker=worker, clock=clock)[0]


def make_store(policy, num_workers, clock=None, **kwargs):
    """A store on ``clock`` (fake); without one, on real time (needed where a wait must time out)."""
    store = ParameterStore(policy, heartbeat_timeout_s=10, startup_grace_s=5, time_fn=clock or time.monotonic,
                           num_workers=SLOTS, **kwargs)
    call(store, "Init", {"w": np.zeros(3, np.float32)}, worker=0, specs=[s.to_dict() for s in SPECS],
         num_workers=num_workers)
    return store


def read_meta(store, worker, clock=0):
    return call(store, "Pull", timeout=0.5, worker=worker, clock=clock)[0]


def grad(value):
    return {"w": np.full(3, value, np.float32)}


def push_in_threads(store, step, grads_by_worker, timeout=5.0):
    """Pushes every worker's gradient for ``step`` concurrently; returns {worker: (meta, aggregate)}."""
    out, errors = {}, []

    def run(worker, g):
        try:
            out[worker] = call(store, "PushGradients", g, timeout=timeout, worker=worker, step=step)
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
        push(store, 0, c, grad(0.0))
        push(store, 1, c, grad(0.0))
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
        push(store, 0, c, grad(0.0))
        push(store, 1, c, grad(0.0))
    call(store, "Done", worker=1)
    for c in range(6, 9):
        push(store, 0, c, grad(0.0))
    assert store.live_workers() == [0]
    call(store, "WaitInit", worker=1)
    assert read_meta(store, 1)["clock"] == 8  # came back at the live workers' clock, not its old 5
    assert store.live_workers() == [0, 1]


def test_crashed_worker_leaves_by_silence_and_its_restart_rejoins():
    clock = FakeClock()
    store = make_store(SSPPolicy(1), num_workers=2, clock=clock)
    push(store, 0, 1, grad(0.0))
    push(store, 1, 1, grad(0.0))
    clock.t += 11  # past the heart-beat timeout and the start-up grace; worker 1 said nothing
    push(store, 0, 2, grad(0.0))
    assert store.live_workers() == [0]
    assert store.policy.min_clock(store._ctx()) == 2  # the dead worker does not hold worker 0 back
    joins = store.status()["joins"]
    call(store, "Heartbeat", worker=1)
    assert store.status()["joins"] == joins + 1 and store.live_workers() == [0, 1]


def test_per_worker_batches_and_progress_are_counted():
    store = make_store(SSPPolicy(10), num_workers=2, clock=FakeClock())
    for c in range(1, 4):
        push(store, 0, c, grad(1.0))
    push(store, 1, 1, grad(1.0))
    status = store.status()
    assert status["worker_batches"] == {"0": 3, "1": 1}
    assert status["progress"] == 4



def test_brief_status_has_the_counters_the_engine_reads_and_no_specs():
    store = make_store(SSPPolicy(10), num_workers=2, clock=FakeClock())
    call(store, "Control", total_batches=5)[0]
    push(store, 0, 1, grad(1.0))
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
    call(store, "Control", drain=[1])[0]
    assert push(store, 1, 1, grad(0.0)).get("leave") is True
    assert "leave" not in push(store, 0, 1, grad(0.0))
    assert read_meta(store, 1).get("leave") is True
    call(store, "Control", undrain=[1])[0]
    assert "leave" not in push(store, 1, 2, grad(0.0))


def test_job_done_after_total_batches_are_applied():
    store = make_store(SSPPolicy(10), num_workers=1, clock=FakeClock())
    call(store, "Control", total_batches=3)[0]
    assert "job_done" not in push(store, 0, 1, grad(1.0))
    assert "job_done" not in push(store, 0, 2, grad(1.0))
    assert push(store, 0, 3, grad(1.0))["job_done"] is True
    assert read_meta(store, 0).get("job_done") is True
    with pytest.raises(StoreError, match="total_batches"):
        call(store, "Control", total_batches=0)[0]
    assert store.status()["total_batches"] == 3  # the bad request changed nothing


def test_update_rate_cap_spaces_applied_updates():
    store = ParameterStore(SSPPolicy(100), heartbeat_timeout_s=10, max_updates_per_s=40.0)
    call(store, "Init", {"w": np.zeros(3, np.float32)}, worker=0, specs=[s.to_dict() for s in SPECS], num_workers=1)
    start = time.monotonic()
    for c in range(1, 9):
        push(store, 0, c, grad(1.0))
    # 8 updates at <= 40/s: the mechanism guarantees at least 7 gaps of 25 ms (a lower bound, not a speed claim)
    assert time.monotonic() - start >= 7 / 40.0 - 1e-3
    np.testing.assert_allclose(call(store, "Pull", worker=0)[1]["w"], np.full(3, 8.0))


# -------------------------------------------------------------- gradient path
def test_bsp_barrier_grows_at_the_next_step_boundary():
    store = make_store(BSPPolicy(2), num_workers=2)
    push_in_threads(store, 0, {0: grad(0.5), 1: grad(0.5)})
    call(store, "Heartbeat", worker=2)  # worker 2 joins during step 1: step 1 still needs only the 2 it started with
    out = push_in_threads(store, 1, {0: grad(0.5), 1: grad(0.5)})
    assert out[0][0]["global_step"] == 2
    assert store.policy.step_replicas == 3  # from step 2 on, all three
    with pytest.raises(StoreError, match="Timed out"):
        call(store, "PushGradients", grad(0.5), timeout=0.3, worker=0, step=2)
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
        call(store, "Heartbeat", worker=w)
    push_in_threads(store, 1, {1: grad(1.0)})  # M for step 1 was fixed at 1 when step 0 completed
    assert store.policy.step_replicas == 2  # 1 of 2 → 2 of 4
    with pytest.raises(StoreError, match="Timed out"):
        call(store, "PushGradients", grad(1.0), timeout=0.3, worker=0, step=2)
    out = push_in_threads(store, 2, {3: grad(3.0)})
    np.testing.assert_allclose(out[3][1]["w"], np.full(3, 2.0))  # (1 + 3) scaled from M=1 to the mean of 2
