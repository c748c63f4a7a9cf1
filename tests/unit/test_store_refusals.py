"""The store's refusals that a protocol fuzzer and a demanding user found (issue 21, item 6), one test each.

Every case was first reproduced against the store as it was: a request
that timed out or was refused changed another worker's state, a value out
of any real range was accepted or answered INTERNAL, or a checkpoint was
half applied. Each test asserts the refusal *and* that nothing changed.
"""

import threading
import time

import numpy as np
import pytest

from tfdist.consistency import AsyncPolicy, SSPPolicy
from tfdist.consistency.sync_replicas import SyncReplicasPolicy
from tfdist.ps import checkpoint as ckpt
from tfdist.ps.checkpointer import ShardCheckpointer
from tfdist.ps.placement import VariableSpec
from tfdist.ps.protocol import RequestError
from tfdist.ps.server import ParameterService
from tfdist.ps.store import ParameterStore

SPECS = [VariableSpec("a", "float32", (2, 2)), VariableSpec("b", "float32", (3,))]
SPEC_DICTS = [s.to_dict() for s in SPECS]
HUGE = 10**400  # an integer no float holds


def values(a=1.0):
    return {"a": np.full((2, 2), a, np.float32), "b": np.zeros(3, np.float32)}


def call(store, method, tensors=None, timeout=None, **meta):
    return ParameterService(store).call(method, tensors, timeout=timeout, **meta)


def make(policy=None, num_workers=2, **kwargs):
    store = ParameterStore(policy or AsyncPolicy(), num_workers=num_workers, **kwargs)
    call(store, "Init", values(), worker=0, specs=SPEC_DICTS, num_workers=num_workers)
    return store


def refused(store, method, tensors=None, code="INVALID_ARGUMENT", match=None, **meta):
    """Asserts the request is refused with ``code`` and the store's whole state is unchanged."""
    before = comparable(store.state())
    with pytest.raises(RequestError, match=match) as e:
        call(store, method, tensors, **meta)
    assert e.value.grpc_code == code, str(e.value)
    assert comparable(store.state()) == before
    return e.value


def comparable(state):
    def conv(x):
        if isinstance(x, np.ndarray):
            return (x.dtype.name, x.shape, x.tobytes())
        if isinstance(x, dict):
            return {k: conv(v) for k, v in x.items() if k != "last_seen"}
        if isinstance(x, (list, tuple, set)):
            return [conv(v) for v in (sorted(x) if isinstance(x, set) else x)]
        return x

    return conv(state)


# ------------------------------------------------------------------ SSP clocks
def test_a_pull_that_times_out_keeps_every_other_workers_clock():
    """SSP(0), two workers at clock 2: worker 0's Pull at clock 10 waits and runs out; worker 1's push
    meanwhile must stay (the store restored a snapshot of every clock: {0: 10, 1: 3} became {0: 2, 1: 2})."""
    store = make(SSPPolicy(0), max_wait_s=1.0)
    for w in (0, 1):
        for c in (1, 2):
            call(store, "Push", {"b": np.ones(3, np.float32)}, worker=w, clock=c)
    assert store.policy.clocks == {0: 2, 1: 2}
    errors = []

    def pull():
        try:
            call(store, "Pull", worker=0, clock=10, timeout=1.0)
        except RequestError as e:
            errors.append(e)

    t = threading.Thread(target=pull)
    t.start()
    deadline = time.monotonic() + 5
    while store.waits.waiters < 1 and time.monotonic() < deadline:  # the pull is waiting
        time.sleep(0.005)
    assert store.waits.waiters == 1
    call(store, "Push", {"b": np.ones(3, np.float32)}, worker=1, clock=3)
    t.join(10)
    assert not t.is_alive() and errors and errors[0].grpc_code == "ABORTED"
    assert store.policy.clocks == {0: 2, 1: 3}  # worker 0's read is taken back, worker 1's push stays


# ------------------------------------------------------------------ Init
def test_init_cannot_claim_more_workers_than_the_job_has():
    store = ParameterStore(AsyncPolicy(), num_workers=2, starting_workers=2)
    refused(store, "Init", values(), code="FAILED_PRECONDITION", match="starts with 1000",
            worker=0, specs=SPEC_DICTS, num_workers=1000)
    refused(store, "Init", values(), code="FAILED_PRECONDITION", match="starts with 3",
            worker=0, specs=SPEC_DICTS, num_workers=3)
    assert not store.initialized
    elastic = ParameterStore(AsyncPolicy(), num_workers=4)  # slots known, start size not: up to the slots
    refused(elastic, "Init", values(), code="FAILED_PRECONDITION", match="4 worker slot", worker=0,
            specs=SPEC_DICTS, num_workers=1000)
    call(elastic, "Init", values(), worker=0, specs=SPEC_DICTS, num_workers=2)
    assert elastic.live_workers() == [0, 1]


def test_init_of_a_huge_job_is_refused_before_anything_is_allocated():
    store = ParameterStore(None)  # slots unknown: the first Init would decide them
    refused(store, "Init", values(), match="num_workers", worker=0, specs=SPEC_DICTS, num_workers=2**31 - 1,
            policy={"policy": "async"})
    assert not store.initialized and store.num_workers is None


def test_sync_replicas_that_could_never_complete_a_step_is_refused():
    store = ParameterStore(None, num_workers=2)
    refused(store, "Init", values(), code="FAILED_PRECONDITION", match="no step could ever complete",
            worker=0, specs=SPEC_DICTS, num_workers=2, policy={"policy": "sync_replicas", "replicas_to_aggregate": 5})
    assert not store.initialized


def test_a_reset_cannot_change_the_jobs_nonfinite_policy():
    store = make(SyncReplicasPolicy(2))
    refused(store, "Init", values(2.0), code="FAILED_PRECONDITION", match="nonfinite",
            worker=0, specs=SPEC_DICTS, num_workers=2, reset=True, nonfinite="allow")
    assert store.nonfinite == "refuse"


# ------------------------------------------------------------------ ranges
def test_gradient_path_requests_are_refused_on_an_update_path_job():
    store = make(AsyncPolicy())
    refused(store, "PutState", values(9.0), code="FAILED_PRECONDITION", match="gradient-path", worker=1, step=5)
    refused(store, "PushGradients", {"b": np.ones(3, np.float32)}, code="FAILED_PRECONDITION", worker=1, step=0)
    refused(store, "Checkpoint", code="FAILED_PRECONDITION", match="gradient-path", worker=0, at_step=3)


@pytest.mark.parametrize("steps", [2**53, 10**7 + 1])
def test_a_push_cannot_claim_more_steps_than_any_job_takes(steps):
    store = make(AsyncPolicy())
    refused(store, "Push", {"b": np.ones(3, np.float32)}, match="steps", worker=1, clock=1, steps=steps)
    assert store.progress == 0


@pytest.mark.parametrize("method, tensors, meta", [
    ("Push", {"b": np.ones(3, np.float32)}, {"worker": 1, "clock": 1, "loss": HUGE}),
    ("WaitInit", None, {"worker": 1, "timeout_s": HUGE}),
    ("PushRows", {"rows": np.array([0], np.int64), "grads": np.ones((1, 2), np.float32)},
     {"worker": 1, "key": "t", "learning_rate": HUGE}),
    ("Init", values(), {"worker": 0, "specs": SPEC_DICTS, "num_workers": 2,
                        "tables": [{"key": "t", "rows": 4, "dim": 2, "shard": 0, "num_shards": 1,
                                    "optimizer": {"kind": "sgd", "learning_rate": HUGE}}]}),
    ("Init", values(), {"worker": 0, "specs": SPEC_DICTS, "num_workers": 2,
                        "tables": [{"key": "t", "rows": 4, "dim": 10**30, "shard": 0, "num_shards": 1}]}),
])
def test_numbers_that_fit_no_float_are_refused_as_invalid_not_internal(method, tensors, meta):
    store = ParameterStore(AsyncPolicy(), num_workers=2) if method == "Init" else make()
    refused(store, method, tensors, **meta)


# ------------------------------------------------------------------ non-finite by accumulation
def test_a_sum_that_overflows_is_refused_and_nothing_is_applied():
    store = make(AsyncPolicy())
    big = {"a": np.full((2, 2), 3e38, np.float32), "b": np.ones(3, np.float32)}
    call(store, "Push", big, worker=1, clock=1)
    refused(store, "Push", big, match="Non-finite result", worker=1, clock=2)
    _, got = call(store, "Pull", worker=0)
    assert np.isfinite(got["a"]).all() and (got["b"] == 1).all()


def test_a_row_update_that_overflows_is_refused_and_nothing_is_applied():
    store = ParameterStore(AsyncPolicy(), num_workers=2)
    table = {"key": "t", "rows": 4, "dim": 2, "shard": 0, "num_shards": 1, "initializer": {"kind": "zeros"},
             "optimizer": {"kind": "sgd", "learning_rate": 0.1}}
    call(store, "Init", values(), worker=0, specs=SPEC_DICTS, num_workers=2, tables=[table])
    refused(store, "PushRows", {"rows": np.array([1, 2], np.int64), "grads": np.full((2, 2), 3e38, np.float32)},
            match="non-finite", worker=1, key="t", learning_rate=1e6)
    call(store, "PushRows", {"rows": np.array([1], np.int64), "grads": np.ones((1, 2), np.float32)},
         worker=1, key="t")
    assert store.state()["tables"]["table/t/updates"] == 1


def test_an_initializer_beyond_float32_is_refused():
    store = ParameterStore(AsyncPolicy(), num_workers=2)
    table = {"key": "t", "rows": 4, "dim": 2, "shard": 0, "num_shards": 1,
             "initializer": {"kind": "uniform", "minval": -1e308, "maxval": 1e308}}
    refused(store, "Init", values(), match="non-finite rows", worker=0, specs=SPEC_DICTS, num_workers=2,
            tables=[table])
    assert not store.initialized


def test_a_push_of_no_rows_changes_nothing_not_even_adams_step():
    store = ParameterStore(AsyncPolicy(), num_workers=2)
    table = {"key": "t", "rows": 4, "dim": 2, "shard": 0, "num_shards": 1, "optimizer": {"kind": "adam"}}
    call(store, "Init", values(), worker=0, specs=SPEC_DICTS, num_workers=2, tables=[table])
    before = store.state()["tables"]
    call(store, "PushRows", {"rows": np.zeros(0, np.int64), "grads": np.zeros((0, 2), np.float32)},
         worker=1, key="t")
    after = store.state()["tables"]
    assert after["table/t/updates"] == before["table/t/updates"] == 0


# ------------------------------------------------------------------ cost bounds
def test_a_table_too_large_for_the_machine_is_a_refusal_not_an_internal_error():
    store = ParameterStore(AsyncPolicy(), num_workers=2)
    table = {"key": "t", "rows": 2**50, "dim": 2**10, "shard": 0, "num_shards": 1}
    refused(store, "Init", values(), code="RESOURCE_EXHAUSTED", match="GiB", worker=0, specs=SPEC_DICTS,
            num_workers=2, tables=[table])
    assert not store.initialized


def test_a_lookup_whose_reply_is_too_large_is_refused_before_gathering_rows():
    store = ParameterStore(AsyncPolicy(), num_workers=2, max_reply_bytes=1 << 20)
    table = {"key": "t", "rows": 64, "dim": 32, "shard": 0, "num_shards": 1}
    call(store, "Init", values(), worker=0, specs=SPEC_DICTS, num_workers=2, tables=[table])
    ids = np.zeros(1_000_000, np.int64)  # 1 M ids of a 32-wide table: a 122 MiB reply
    refused(store, "Lookup", {"rows": ids}, code="RESOURCE_EXHAUSTED", match="MiB", worker=1, key="t")
    _, got = call(store, "Lookup", {"rows": ids[:100]}, worker=1, key="t")
    assert got["values"].shape == (100, 32)


# ------------------------------------------------------------------ checkpoints
def _snapshot():
    store = make(SSPPolicy(2))
    call(store, "Push", {"b": np.ones(3, np.float32)}, worker=1, clock=1)
    return store.checkpoint_state()


@pytest.mark.parametrize("damage", [
    lambda meta, arrays: arrays.__setitem__("b", np.array([np.nan, 0, 0], np.float32)),
    lambda meta, arrays: meta.__setitem__("done_workers", [1000, -5]),
    lambda meta, arrays: meta.__setitem__("worker_batches", {"1": -3}),
    lambda meta, arrays: meta.__setitem__("progress", HUGE),
    lambda meta, arrays: meta.__setitem__("policy_state", {"clocks": {"0": "x"}}),
    lambda meta, arrays: meta.__setitem__("nonfinite", "sometimes"),
    lambda meta, arrays: meta.__setitem__("tables", [{"key": "t"}]),
    lambda meta, arrays: arrays.pop("a"),
], ids=["nan", "done_ids", "batches", "progress", "clocks", "nonfinite", "table", "missing"])
def test_a_malformed_checkpoint_is_data_loss_and_restores_nothing(damage):
    step, meta, arrays = _snapshot()
    damage(meta, arrays)
    fresh = ParameterStore(None, num_workers=2)
    before = comparable(fresh.state())
    with pytest.raises(RequestError) as e:
        fresh.restore(meta, arrays)
    assert e.value.grpc_code == "DATA_LOSS"
    assert comparable(fresh.state()) == before and not fresh.initialized


def test_a_malformed_newest_checkpoint_falls_back_to_the_previous_one(tmp_path):
    store = make(SSPPolicy(2))
    writer = ShardCheckpointer(store, str(tmp_path), 0, 1)
    step, meta, arrays = store.checkpoint_state()
    ckpt.write_shard(str(tmp_path), 0, 1, 1, meta, arrays)
    bad = dict(meta, done_workers=[1000])  # a valid file (its hash matches) with malformed content
    ckpt.write_shard(str(tmp_path), 0, 1, 2, bad, arrays)
    fresh = ParameterStore(None, num_workers=2)
    restored = ShardCheckpointer(fresh, str(tmp_path), 0, 1).restore()
    assert restored == 1 and fresh.initialized
    writer.close(final=False)


def test_concurrent_checkpoint_requests_hold_one_copy_of_the_state_at_a_time(tmp_path, monkeypatch):
    """24 concurrent Checkpoint calls queued 24 full copies of the state (+350 MiB on a real model)."""
    store = make(SSPPolicy(2))
    writer = ShardCheckpointer(store, str(tmp_path), 0, 1).start()
    in_flight, peak, lock = [0], [0], threading.Lock()
    capture, write = store.checkpoint_state, ckpt.write_shard

    def counted_capture():
        with lock:
            in_flight[0] += 1
            peak[0] = max(peak[0], in_flight[0])
        return capture()

    def slow_write(*args, **kwargs):
        time.sleep(0.01)  # a slow disk, so that the calls overlap
        try:
            return write(*args, **kwargs)
        finally:
            with lock:
                in_flight[0] -= 1

    monkeypatch.setattr(store, "checkpoint_state", counted_capture)
    monkeypatch.setattr(ckpt, "write_shard", slow_write)
    results = []
    threads = [threading.Thread(target=lambda: results.append(writer.checkpoint_now(timeout=30))) for _ in range(24)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    writer.close(final=False)
    assert len(results) == 24 and all(path for _, path in results)
    assert peak[0] == 1


# ------------------------------------------------------------------ the job's epoch logs
def test_epoch_logs_are_the_jobs_mean_once_every_live_worker_reported():
    store = make(SyncReplicasPolicy(2), max_wait_s=5.0)
    results = {}

    def report(worker, loss):
        results[worker] = call(store, "EpochLogs", worker=worker, epoch=0, logs={"loss": loss, "acc": 0.5})[0]

    t = threading.Thread(target=report, args=(1, 3.0))
    t.start()
    deadline = time.monotonic() + 5
    while not store.state()["epoch_reports"] and time.monotonic() < deadline:  # worker 1 waits for worker 0
        time.sleep(0.005)
    report(0, 1.0)
    t.join(10)
    assert results[0] == results[1] == {"logs": {"loss": 2.0, "acc": 0.5}, "workers": [0, 1], "epoch": 0}


def test_a_restarted_worker_counts_on_from_the_jobs_epoch():
    store = make(SyncReplicasPolicy(1), num_workers=1, max_wait_s=1.0)
    for epoch in range(3):
        assert call(store, "EpochLogs", worker=0, epoch=epoch, logs={"loss": 1.0})[0]["epoch"] == epoch
    again = call(store, "EpochLogs", worker=0, epoch=0, logs={"loss": 5.0})[0]  # its script runs again
    assert again["epoch"] == 3 and again["logs"] == {"loss": 5.0}


def test_epoch_logs_are_refused_on_an_update_path_job():
    refused(make(AsyncPolicy()), "EpochLogs", code="FAILED_PRECONDITION", worker=0, epoch=0, logs={"loss": 1.0})


def test_a_worker_whose_model_differs_fails_as_a_config_error_so_the_job_stops():
    """Refused at WaitInit, the worker used to exit 1 and an async job trained on without it; a ConfigError exits
    with the config-error code, which the launcher never restarts nor leaves out (it stops the job)."""
    from tfdist.errors import ConfigError, JobMismatchError
    from tfdist.ps.client import PSClient
    from tfdist.ps.protocol import WaitInitRequest
    from tfdist.ps.server import PSServer

    with PSServer(AsyncPolicy(), num_workers=2, tune_malloc=False) as server:
        with PSClient([server.address], None, tune_malloc=False) as client:
            ParameterService(server.store).call("Init", values(), worker=0, specs=SPEC_DICTS, num_workers=2)
            other = (VariableSpec("a", "float32", (2, 3)), SPECS[1])
            with pytest.raises(JobMismatchError, match="cannot join the job.*same script") as e:
                client.request(0, WaitInitRequest(1, 1.0, other))
            assert isinstance(e.value, ConfigError)
            assert client.request(0, WaitInitRequest(1, 1.0, tuple(SPECS))).initialized


def test_replies_keep_zeros_on_the_wire():
    """SSP(0)'s bound travelled as "no bound" (0 == False dropped it from the wire): workers never refreshed."""
    from tfdist.ps.replies import PullReply, PushReply

    reply = PushReply(True, False, 3, 7, previous_version=0, global_step=0, min_clock=0, staleness=0)
    assert PushReply.parse(reply.to_wire()[0]) == reply
    pull = PullReply(1, 0, 0, 5, min_clock=0, staleness=0, clock=0)
    again = PullReply.parse(pull.to_wire()[0])
    assert (again.staleness, again.min_clock, again.clock) == (0, 0, 0)


def test_sync_replicas_epoch_logs_need_the_first_m_reports_and_late_ones_get_the_same_answer():
    """A slow backup must not hold the others at an epoch end (SyncReplicas 1 of 2)."""
    store = make(SyncReplicasPolicy(1, num_workers=2), max_wait_s=5.0)
    first = call(store, "EpochLogs", worker=0, epoch=0, logs={"loss": 1.0})[0]
    late = call(store, "EpochLogs", worker=1, epoch=0, logs={"loss": 9.0})[0]
    assert first == late == {"logs": {"loss": 1.0}, "workers": [0], "epoch": 0}


def test_a_worker_waiting_at_an_epoch_end_does_not_hold_the_gradient_barrier():
    """BSP, uneven epochs: worker 0 waits for worker 1's logs while worker 1 still has a batch; its gradient
    completes the step instead of waiting for worker 0 (which waits for it): no deadlock."""
    from tfdist.consistency.sync_replicas import BSPPolicy

    store = make(BSPPolicy(2), max_wait_s=5.0)
    done = {}

    def epoch_end():
        done["logs"] = call(store, "EpochLogs", worker=0, epoch=0, logs={"loss": 1.0})[0]

    t = threading.Thread(target=epoch_end)
    t.start()
    deadline = time.monotonic() + 5
    while not store.state()["epoch_reports"] and time.monotonic() < deadline:
        time.sleep(0.005)
    reply = call(store, "PushGradients", {"b": np.ones(3, np.float32)}, worker=1, step=0, timeout=5.0)[0]
    assert not reply["dropped"] and reply["global_step"] == 1  # completed by worker 1 alone
    call(store, "EpochLogs", worker=1, epoch=0, logs={"loss": 3.0})
    t.join(10)
    assert done["logs"]["logs"] == {"loss": 2.0}


def test_a_worker_that_joined_a_running_job_reports_for_the_jobs_epoch():
    store = make(SyncReplicasPolicy(1, num_workers=2), max_wait_s=1.0)
    for epoch in range(3):
        call(store, "EpochLogs", worker=0, epoch=epoch, logs={"loss": 1.0})
    joined = call(store, "EpochLogs", worker=1, epoch=0, logs={"loss": 5.0}, joined=True)[0]
    assert joined["epoch"] == 3 and joined["logs"] == {"loss": 5.0}
    again = call(store, "EpochLogs", worker=0, epoch=1, logs={"loss": 7.0})[0]  # restarted: the epoch after its 2
    assert again["epoch"] == 3 and again["logs"] == {"loss": 5.0}  # epoch 3 is answered already: the same answer
