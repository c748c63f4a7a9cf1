"""ParameterStore through the PS request path (protocol → store): all-or-nothing validation,
init races, liveness with a fake clock, policy decisions, bounded waits."""

import threading
import time

import numpy as np
import pytest

from tfdist.consistency import AsyncPolicy
from tfdist.consistency.base import ConsistencyPolicy, PushAction, PushDecision
from tfdist.ps.placement import VariableSpec
from tfdist.ps.protocol import ProtocolError, RequestError
from tfdist.ps.server import ParameterService
from tfdist.ps.store import ParameterStore

SPECS = [VariableSpec("a", "float32", (2, 2)), VariableSpec("b", "float32", (3,))]
SPEC_DICTS = [s.to_dict() for s in SPECS]


class FakeClock:
    def __init__(self):
        self.t = 100.0

    def __call__(self):
        return self.t


def call(store, method, tensors=None, timeout=None, **meta):
    return ParameterService(store).call(method, tensors, timeout=timeout, **meta)


def init_values(a=1.0):
    return {"a": np.full((2, 2), a, np.float32), "b": np.zeros(3, np.float32)}


def make_store(policy=None, clock=None, num_workers=4, **kwargs):
    store = ParameterStore(policy or AsyncPolicy(), heartbeat_timeout_s=10, time_fn=clock or FakeClock(),
                           num_workers=num_workers, **kwargs)
    call(store, "Init", init_values(), worker=0, specs=SPEC_DICTS)
    return store


def snapshot(store):
    meta, values = call(store, "Pull", worker=0)
    return meta["version"], {k: v.copy() for k, v in values.items()}


def test_push_adds_and_bumps_version():
    store = make_store()
    res, _ = call(store, "Push", {"a": np.full((2, 2), 0.5, np.float32)}, worker=1, clock=0)
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
        ({"b": np.array([1.0, np.nan, 0.0], np.float32)}, "INVALID_ARGUMENT", "Non-finite update .*'b'.*worker 1"),
        ({"b": np.array([1.0, np.inf, 0.0], np.float32)}, "INVALID_ARGUMENT", "Non-finite"),
    ],
)
def test_bad_pushes_change_nothing(deltas, code, match):
    store = make_store()
    before = snapshot(store)
    with pytest.raises(RequestError, match=match) as e:
        call(store, "Push", deltas, worker=1, clock=0)
    assert e.value.grpc_code == code
    after = snapshot(store)
    assert after[0] == before[0]
    for k in before[1]:
        np.testing.assert_array_equal(after[1][k], before[1][k])
    assert store.worker_batches == {} and store.live_workers() == [0]


def test_nonfinite_values_are_stored_when_the_job_allows_them():
    store = ParameterStore(AsyncPolicy(), num_workers=2)
    call(store, "Init", init_values(), worker=0, specs=SPEC_DICTS, nonfinite="allow")
    call(store, "Push", {"b": np.array([np.nan, 0, 0], np.float32)}, worker=1, clock=1)
    assert np.isnan(snapshot(store)[1]["b"][0]) and store.status()["nonfinite"] == "allow"


def test_an_initial_value_with_nan_is_refused_and_the_store_stays_empty():
    store = ParameterStore(AsyncPolicy(), num_workers=2)
    with pytest.raises(RequestError, match="Non-finite initial value"):
        call(store, "Init", {**init_values(), "b": np.array([0, np.inf, 0], np.float32)}, worker=0, specs=SPEC_DICTS)
    assert not store.initialized and store.version == 0


def test_a_push_of_summed_steps_counts_every_step():
    store = make_store()
    call(store, "Push", {"b": np.ones(3, np.float32)}, worker=1, clock=1, steps=3)  # exchange_every=3
    call(store, "Push", {"b": np.ones(3, np.float32)}, worker=1, clock=2)
    assert store.progress == 4 and store.worker_batches == {1: 4}
    assert store.stats["pushes"] == 2
    np.testing.assert_array_equal(snapshot(store)[1]["b"], np.full(3, 2.0))


@pytest.mark.parametrize("steps", [0, -2, 1.5, "3", True])
def test_a_push_with_a_bad_step_count_changes_nothing(steps):
    store = make_store()
    before = snapshot(store)
    with pytest.raises(ProtocolError, match="`steps`") as e:
        call(store, "Push", {"b": np.ones(3, np.float32)}, worker=1, clock=1, steps=steps)
    assert e.value.grpc_code == "INVALID_ARGUMENT"
    assert snapshot(store)[0] == before[0] and store.progress == 0 and not store.worker_batches
    np.testing.assert_array_equal(snapshot(store)[1]["b"], before[1]["b"])


def test_the_same_variable_twice_in_one_push_is_refused():
    from tfdist import wire
    from tfdist.errors import WireFormatError

    message = wire.encode({"worker": 1, "clock": 1}, {"b": np.ones(3, np.float32)})
    # rename nothing: build a header that lists "b" twice (what a hand-made client could send)
    meta_len = int.from_bytes(message[4:8], "little")
    header = message[8:8 + meta_len].decode()
    entry = header[header.index('{"name"'):header.rindex("}]")+1]
    forged = header.replace(entry, entry + "," + entry)
    raw = wire.MAGIC + len(forged).to_bytes(4, "little") + forged.encode()
    raw += b"\0" * ((-len(raw)) % 8) + message[-12:]
    with pytest.raises(WireFormatError, match="appears twice"):
        wire.decode(raw)


def test_init_only_once_and_specs_must_match():
    store = make_store()
    meta, _ = call(store, "Init", init_values(0.0), worker=1, specs=SPEC_DICTS)
    assert meta["initialized_here"] is False
    np.testing.assert_array_equal(snapshot(store)[1]["a"], np.ones((2, 2)))  # first writer wins
    other = [{"key": "a", "dtype": "float32", "shape": [2, 3], "trainable": True}, SPEC_DICTS[1]]
    with pytest.raises(RequestError, match="differ") as e:
        call(store, "Init", {"a": np.zeros((2, 3), np.float32), "b": np.ones(3, np.float32)}, worker=1, specs=other)
    assert e.value.grpc_code == "FAILED_PRECONDITION"


def test_init_validates_values_against_specs():
    store = ParameterStore(AsyncPolicy())
    with pytest.raises(ProtocolError, match="spec says"):
        call(store, "Init", {**init_values(), "a": np.ones((2, 2), np.float64)}, worker=0, specs=SPEC_DICTS)
    with pytest.raises(ProtocolError, match="missing"):
        call(store, "Init", {"a": np.ones((2, 2), np.float32)}, worker=0, specs=SPEC_DICTS)
    assert not store.initialized


def test_a_refused_init_leaves_the_store_uninitialised():
    store = ParameterStore(None)
    with pytest.raises(ProtocolError, match="num_workers"):
        call(store, "Init", init_values(), worker=0, specs=SPEC_DICTS, policy={"policy": "async"}, num_workers=2.5)
    assert not store.initialized and store.policy is None and store.version == 0


def test_requests_before_init_are_refused():
    store = ParameterStore(AsyncPolicy())
    with pytest.raises(RequestError, match="no variables yet") as e:
        call(store, "Push", {"a": np.zeros((2, 2), np.float32)}, worker=0, clock=0)
    assert e.value.grpc_code == "UNAVAILABLE"
    meta, _ = call(store, "WaitInit", timeout_s=0.01)
    assert meta["initialized"] is False


def test_liveness_follows_the_fake_clock():
    clock = FakeClock()
    store = make_store(clock=clock)
    call(store, "Heartbeat", worker=1)
    call(store, "Heartbeat", worker=2)
    assert store.live_workers() == [0, 1, 2]
    clock.t += 5
    call(store, "Heartbeat", worker=2)
    clock.t += 6  # worker 0 and 1 silent for 11 s > 10 s
    assert store.live_workers() == [2]
    call(store, "Done", worker=2)
    assert store.live_workers() == [] and store.done_workers == {2}


@pytest.mark.parametrize("method, meta", [
    ("Done", {"worker": 1000}),
    ("Heartbeat", {"worker": 4}),
    ("Push", {"worker": 47, "clock": 1}),
    ("Control", {"gone": [47]}),
    ("Control", {"gone": [1, "x"]}),
    ("SetExcluded", {"worker": 0, "excluded": [9]}),
])
def test_ids_that_are_not_workers_of_the_job_are_refused_and_change_nothing(method, meta):
    store = make_store(num_workers=4)
    before = store.status()
    with pytest.raises(RequestError):
        call(store, method, {"b": np.ones(3, np.float32)} if method == "Push" else None, **meta)
    assert store.status() == before


def test_pushpull_with_an_unknown_key_in_its_pull_part_applies_nothing():
    store = make_store()
    before = snapshot(store)
    with pytest.raises(RequestError, match="Unknown variable") as e:
        call(store, "PushPull", {"b": np.ones(3, np.float32)}, worker=1, clock=1, keys=["b", "nope"])
    assert e.value.grpc_code == "NOT_FOUND"
    assert snapshot(store)[0] == before[0] and store.progress == 0


def test_a_refused_waitinit_does_not_undo_done():
    store = make_store()
    call(store, "Done", worker=1)
    with pytest.raises(RequestError, match="differ"):
        call(store, "WaitInit", worker=1, timeout_s=0.0, specs=SPEC_DICTS[:1])
    assert 1 in store.done_workers


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
    assert call(store, "Push", {"b": np.ones(3, np.float32)}, worker=0, clock=1)[0]["dropped"]
    assert call(store, "Push", {"b": np.ones(3, np.float32)}, worker=0, clock=2)[0]["applied"]
    np.testing.assert_array_equal(snapshot(store)[1]["b"], np.ones(3))
    assert store.stats["dropped"] == 1


def test_policy_wait_is_bounded_by_the_caller_and_by_the_server():
    store = make_store(WaitForever(), clock=time.monotonic, max_wait_s=0.3)
    with pytest.raises(RequestError, match="Timed out after 0.2 s waiting to push.*never ready") as e:
        call(store, "Push", {"b": np.ones(3, np.float32)}, timeout=0.2, worker=0, clock=0)
    assert e.value.grpc_code == "ABORTED"  # a policy wait that ran out, not a dead server
    with pytest.raises(RequestError, match="Timed out after 0.3 s"):  # no caller deadline: the server's bound
        call(store, "Push", {"b": np.ones(3, np.float32)}, worker=0, clock=0)
    np.testing.assert_array_equal(snapshot(store)[1]["b"], np.zeros(3))


def test_waiters_are_bounded_and_released_by_close():
    store = make_store(WaitForever(), clock=time.monotonic, max_waiters=2, max_wait_s=30)
    errors = []

    def stuck():
        try:
            call(store, "Push", {"b": np.ones(3, np.float32)}, worker=0, clock=0)
        except RequestError as e:
            errors.append(e.grpc_code)

    threads = [threading.Thread(target=stuck) for _ in range(2)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 10
    while store._waiters < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert store._waiters == 2
    with pytest.raises(RequestError, match="Too many calls are waiting") as e:  # a third is refused at once
        call(store, "Push", {"b": np.ones(3, np.float32)}, worker=1, clock=0)
    assert e.value.grpc_code == "RESOURCE_EXHAUSTED"
    assert call(store, "Status")[0]["initialized"]  # calls that do not wait are still answered
    store.close()
    for t in threads:
        t.join(5)
    assert errors == ["UNAVAILABLE", "UNAVAILABLE"]


def test_a_cancelled_caller_stops_waiting():
    store = make_store(WaitForever(), clock=time.monotonic, max_wait_s=30)
    cancelled = threading.Event()
    threading.Timer(0.2, cancelled.set).start()
    svc = ParameterService(store)
    start = time.monotonic()
    with pytest.raises(RequestError, match="went away") as e:
        svc.handle("Push", {"worker": 0, "clock": 0}, {"b": np.ones(3, np.float32)}, None, cancelled.is_set)
    assert e.value.grpc_code == "CANCELLED" and time.monotonic() - start < 5


def test_async_policy_records_clocks():
    p = AsyncPolicy()
    assert p.on_push(0, 5, 0.0).action is PushAction.APPLY and not p.on_pull(0, 5, 0.0).wait
    p.on_applied(0, 5, 0.0)
    p.on_applied(0, 3, 0.0)
    assert p.describe() == {"policy": "async", "clocks": {"0": 5}}


def test_step_with_fewer_gradients_than_m_is_scaled_to_their_mean():
    from tfdist.consistency import SyncReplicasPolicy

    clock = FakeClock()
    store = ParameterStore(SyncReplicasPolicy(2), heartbeat_timeout_s=10, time_fn=clock, num_workers=2)
    call(store, "Init", init_values(), worker=0, specs=SPEC_DICTS, num_workers=2)
    call(store, "Heartbeat", worker=1)
    call(store, "SetExcluded", worker=0, excluded=[1])  # worker 1 is a detected straggler
    meta, agg = call(store, "PushGradients", {"b": np.full(3, 0.5, np.float32)}, timeout=1, worker=0, step=0)
    assert meta["global_step"] == 1 and not meta["dropped"]
    np.testing.assert_allclose(agg["b"], np.full(3, 1.0))  # 0.5 was scaled for M=2: the mean is 1.0
    late, agg_late = call(store, "PushGradients", {"b": np.ones(3, np.float32)}, timeout=1, worker=1, step=0)
    assert late["dropped"] and np.array_equal(agg_late["b"], agg["b"])
    assert store.status()["excluded"] == [1]


def test_leave_stops_counting_a_worker_at_once_without_counting_it_done():
    clock = FakeClock()
    store = make_store(clock=clock)
    call(store, "Heartbeat", worker=1)
    assert store.live_workers() == [0, 1]
    meta, _ = call(store, "Leave", worker=1)
    assert meta["live_workers"] == [0] and store.done_workers == set()  # not a Done: the PS does not exit
    joins = store.joins
    call(store, "Push", {"b": np.ones(3, np.float32)}, worker=1, clock=1)  # training again: back, as a joiner
    assert store.live_workers() == [0, 1] and store.joins == joins + 1


def test_a_bsp_step_stops_waiting_for_a_worker_that_leaves():
    from tfdist.consistency import BSPPolicy

    store = ParameterStore(BSPPolicy(2), heartbeat_timeout_s=10, time_fn=time.monotonic, num_workers=2)
    call(store, "Init", init_values(), worker=0, specs=SPEC_DICTS, num_workers=2)
    call(store, "Heartbeat", worker=1)
    out = {}

    def contribute():  # worker 0's gradient waits for worker 1's
        out["reply"] = call(store, "PushGradients", {"b": np.ones(3, np.float32)}, timeout=20, worker=0, step=0)

    thread = threading.Thread(target=contribute)
    thread.start()
    deadline = time.monotonic() + 10
    while not store.state()["contributors"] and time.monotonic() < deadline:
        time.sleep(0.01)
    assert store.global_step == 0  # waiting for worker 1
    call(store, "Leave", worker=1)
    thread.join(15)
    meta, agg = out["reply"]
    assert meta["global_step"] == 1 and not meta["dropped"]
    np.testing.assert_allclose(agg["b"], np.full(3, 2.0))  # one gradient of an M=2 step, scaled to the mean


def test_a_bsp_step_does_not_wait_for_a_worker_that_waits_for_the_next_state():
    """A joiner told of a later step by another PS task (its first gradient was stale there) waits to read
    the state after the step this task is aggregating: it will send no gradient for that step, so the step
    completes without it instead of holding both workers until the RPC deadline (seen in
    test_a_stopped_worker_rejoins[sync_replicas] under load)."""
    from tfdist.consistency import BSPPolicy

    # (worker 1 stays live throughout: a heart-beat timeout longer than the waits)
    store = ParameterStore(BSPPolicy(2), heartbeat_timeout_s=120, time_fn=time.monotonic, num_workers=2)
    call(store, "Init", init_values(), worker=0, specs=SPEC_DICTS, num_workers=2)
    call(store, "Heartbeat", worker=1)
    out = {}

    def contribute():  # worker 0's gradient for step 0 waits for worker 1's
        out["grad"] = call(store, "PushGradients", {"b": np.ones(3, np.float32)}, timeout=20, worker=0, step=0)

    def read_ahead():  # worker 1 counts step 0 as done: it waits for the state after it
        out["read"] = call(store, "Pull", timeout=20, worker=1, min_state_step=1)

    grad = threading.Thread(target=contribute)
    grad.start()
    deadline = time.monotonic() + 10
    while not store.state()["contributors"] and time.monotonic() < deadline:
        time.sleep(0.01)
    assert store.global_step == 0  # waiting for worker 1
    read = threading.Thread(target=read_ahead)
    read.start()
    grad.join(15)
    assert not grad.is_alive()
    meta, agg = out["grad"]
    assert meta["global_step"] == 1 and meta["write_state"]  # worker 0 closed step 0: it writes the state
    call(store, "PutState", {"a": np.full((2, 2), 5.0, np.float32), "b": np.full(3, 5.0, np.float32)},
         worker=0, step=1)
    read.join(15)
    assert not read.is_alive()
    assert out["read"][0]["state_step"] == 1
    np.testing.assert_allclose(out["read"][1]["b"], np.full(3, 5.0))
    assert 1 in store.live_workers()  # it was never counted gone: only not awaited while it read ahead
