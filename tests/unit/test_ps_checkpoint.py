"""PS checkpoints: the files (atomic, verified, last K kept), the store's snapshot and restore, the writer.

Real files in a temporary directory; the store through its request path
(:class:`ParameterService`). Restarting a real PS process is covered by
``tests/integration/test_ps_durability.py``.
"""

import json
import os

import ml_dtypes
import numpy as np
import pytest

from tfdist.consistency import AsyncPolicy, DTSSPPolicy, SSPPolicy
from tfdist.consistency.sync_replicas import BSPPolicy
from tfdist.ps import checkpoint as ckpt
from tfdist.ps.placement import VariableSpec
from tfdist.ps.protocol import RequestError
from tfdist.ps.server import ParameterService, PSServer
from tfdist.ps.store import ParameterStore

SPECS = [VariableSpec("a", "float32", (2, 2)), VariableSpec("b", "float32", (3,))]
SPEC_DICTS = [s.to_dict() for s in SPECS]


def values(a=1.0):
    return {"a": np.full((2, 2), a, np.float32), "b": np.arange(3, dtype=np.float32)}


def store_with(policy, num_workers=2, num_workers_meta=None, **meta):
    store = ParameterStore(policy, num_workers=num_workers)
    if num_workers_meta is not None:
        meta["num_workers"] = num_workers_meta
    ParameterService(store).call("Init", values(), worker=0, specs=SPEC_DICTS, **meta)
    return store


def call(store, method, tensors=None, **meta):
    return ParameterService(store).call(method, tensors, **meta)


# ---------------------------------------------------------------------- files
def test_write_then_read_gives_the_same_arrays_and_meta(tmp_path):
    arrays = {"x": np.arange(12, dtype=np.float32).reshape(3, 4), "bf": np.ones(5, ml_dtypes.bfloat16),
              "i": np.array([1, 2], np.int64), "empty": np.zeros((0, 3), np.float32)}
    ckpt.write_shard(str(tmp_path), 1, 2, 7, {"hello": [1, 2]}, arrays)
    got = ckpt.read_shard(str(tmp_path), 1)
    assert got.step == 7 and got.ps == 1 and got.num_ps == 2 and got.meta == {"hello": [1, 2]}
    assert set(got.values) == set(arrays)
    for k, v in arrays.items():
        assert got.values[k].dtype == v.dtype and got.values[k].shape == v.shape
        np.testing.assert_array_equal(got.values[k].astype(np.float64), v.astype(np.float64))
        assert got.values[k].flags.writeable  # copies, not views into the file's bytes


def test_only_the_newest_k_are_kept_and_the_newest_is_read(tmp_path):
    for step in (3, 10, 11, 40):
        ckpt.write_shard(str(tmp_path), 0, 1, step, {"step": step}, values(step), keep=2)
    assert ckpt.list_steps(str(tmp_path), 0) == [11, 40]
    assert sorted(os.listdir(tmp_path / "ps-0")) == [
        "ckpt-000000000011.data", "ckpt-000000000011.json", "ckpt-000000000040.data", "ckpt-000000000040.json"]
    assert ckpt.read_shard(str(tmp_path), 0).meta == {"step": 40}
    assert ckpt.read_shard(str(tmp_path), 0, step=11).meta == {"step": 11}


@pytest.mark.parametrize("damage", ["truncate", "flip", "no_manifest", "bad_manifest", "no_data"])
def test_a_torn_or_corrupted_checkpoint_is_never_read_the_previous_one_is(tmp_path, damage):
    ckpt.write_shard(str(tmp_path), 0, 1, 5, {"step": 5}, values(5))
    ckpt.write_shard(str(tmp_path), 0, 1, 9, {"step": 9}, values(9))
    data = tmp_path / "ps-0" / "ckpt-000000000009.data"
    manifest = tmp_path / "ps-0" / "ckpt-000000000009.json"
    raw = data.read_bytes()
    if damage == "truncate":  # the process died while writing (what a non-atomic write would leave)
        data.write_bytes(raw[: len(raw) // 2])
    elif damage == "flip":
        data.write_bytes(raw[:-1] + bytes([raw[-1] ^ 1]))
    elif damage == "no_manifest":  # died after the data, before the manifest: the checkpoint does not exist
        manifest.unlink()
    elif damage == "bad_manifest":
        manifest.write_text('{"format": 1, "ps": 0')
    else:
        data.unlink()
    got = ckpt.read_shard(str(tmp_path), 0)
    assert got.step == 5 and got.meta == {"step": 5}
    np.testing.assert_array_equal(got.values["a"], values(5)["a"])


def test_nothing_to_read_and_other_layouts(tmp_path):
    assert ckpt.read_shard(str(tmp_path / "missing"), 0) is None
    ckpt.write_shard(str(tmp_path), 0, 2, 1, {}, values())
    assert ckpt.read_shard(str(tmp_path), 0, num_ps=3) is None  # a job with another number of PS tasks
    assert ckpt.read_shard(str(tmp_path), 0, num_ps=2).step == 1
    (tmp_path / "ps-0" / "ckpt-000000000002.json").write_text(json.dumps({"format": 99}))
    assert ckpt.read_shard(str(tmp_path), 0).step == 1


def test_common_steps_are_the_cuts_every_shard_has(tmp_path):
    for ps, steps in ((0, (2, 4, 6)), (1, (4, 6, 7)), (2, (1, 4, 6))):
        for step in steps:
            ckpt.write_shard(str(tmp_path), ps, 3, step, {}, values(), keep=5)
    assert ckpt.common_steps(str(tmp_path), 3) == [4, 6]
    assert ckpt.common_steps(str(tmp_path), 4) == []


def test_an_unwritable_directory_is_a_clear_error(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(ckpt.CheckpointError, match="ps.checkpoint_dir"):
        ckpt.write_shard(str(blocker / "sub"), 0, 1, 1, {}, values())


# ---------------------------------------------------------------------- store
def comparable(state):
    """The state a restore must reproduce (liveness times and counters of requests served are not kept)."""
    drop = {"init_time", "last_seen", "ever_seen", "expected", "stats", "incarnation", "restored_from",
            "accumulated", "contributors", "history"}
    out = {k: v for k, v in state.items() if k not in drop}
    out["values"] = {k: v.tolist() for k, v in state["values"].items()}
    return out


@pytest.mark.parametrize("policy", [AsyncPolicy(), SSPPolicy(2), DTSSPPolicy(window=2)], ids=lambda p: p.name)
def test_update_path_store_restores_exactly(policy):
    store = store_with(policy, num_workers=3)
    for clock in range(1, 6):
        for w in (0, 1):
            call(store, "Push", {"a": np.full((2, 2), 0.25 * w, np.float32)}, worker=w, clock=clock,
                 loss=1.0 / clock, steps=2)
    call(store, "SetExcluded", worker=0, excluded=[2])
    call(store, "Done", worker=1)
    step, meta, arrays = store.checkpoint_state()
    assert step == store.progress == 20
    json.dumps(meta)  # JSON-able
    fresh = ParameterStore(None, num_workers=3)
    fresh.restore(meta, arrays)
    assert comparable(fresh.state()) == comparable(store.state())
    assert fresh.restored_from == 20 and fresh.policy.spec() == policy.spec()
    # it serves: a push lands on the restored values, and the restored clocks hold
    reply, _ = call(fresh, "Push", {"b": np.ones(3, np.float32)}, worker=0, clock=6)
    assert reply["applied"] and reply["incarnation"] == fresh.incarnation
    np.testing.assert_array_equal(fresh.state()["values"]["b"], store.state()["values"]["b"] + 1)
    if policy.name != "async":
        assert fresh.policy.clocks == {0: 6, 1: 5}


def test_gradient_path_store_restores_its_state_snapshot():
    store = store_with(BSPPolicy(1), num_workers=1, num_workers_meta=1)
    for step in range(3):
        call(store, "PushGradients", {"a": np.ones((2, 2), np.float32)}, worker=0, step=step)
        call(store, "PutState", values(step + 10.0), worker=0, step=step + 1)
    step, meta, arrays = store.checkpoint_state()
    assert step == 3
    fresh = ParameterStore(None, num_workers=1)
    fresh.restore(meta, arrays)
    assert fresh.global_step == fresh.state_step == 3
    np.testing.assert_array_equal(fresh.state()["values"]["a"], values(12.0)["a"])
    # the job goes on from step 3 on the restored task; a gradient of an earlier step is stale
    reply, aggregate = call(fresh, "PushGradients", {"a": np.ones((2, 2), np.float32)}, worker=0, step=3)
    assert not reply["dropped"] and fresh.global_step == 4
    np.testing.assert_array_equal(aggregate["a"], np.ones((2, 2)))
    reply, _ = call(fresh, "PushGradients", {"a": np.ones((2, 2), np.float32)}, worker=0, step=2)
    assert reply["dropped"]


def test_restore_is_refused_whole():
    store = store_with(AsyncPolicy())
    _, meta, arrays = store.checkpoint_state()
    busy = store_with(AsyncPolicy())
    before = comparable(busy.state())
    with pytest.raises(RequestError, match="holds no values"):
        busy.restore(meta, arrays)
    assert comparable(busy.state()) == before
    other_size = ParameterStore(None, num_workers=5)
    with pytest.raises(RequestError, match="5 workers|2 workers"):
        other_size.restore(meta, arrays)
    assert not other_size.initialized
    broken = ParameterStore(None, num_workers=2)
    with pytest.raises(RequestError, match="does not match"):
        broken.restore(meta, {"a": arrays["a"]})
    assert not broken.initialized


def test_steps_capture_snapshots_at_each_multiple():
    store = store_with(AsyncPolicy())
    store.checkpoint_every_steps = 4
    for clock in range(1, 8):
        call(store, "Push", {"b": np.ones(3, np.float32)}, worker=0, clock=clock, steps=3)
    captured = store.take_captured()
    # progress 3, 6, 9, 12, 15, 18, 21 crosses 4, 8, 12, 16, 20 at 6, 9, 12, 18, 21
    assert [step for step, _, _ in captured] == [6, 9, 12, 18, 21]
    assert captured[0][2]["b"].tolist() == [2.0, 3.0, 4.0]
    assert store.take_captured() == []


# ---------------------------------------------------------------------- the writer and the server
def test_a_server_writes_checkpoints_and_a_new_one_restores_the_newest(tmp_path):
    d = str(tmp_path / "ckpt")
    server = PSServer(num_workers=2, checkpoint_dir=d, checkpoint_every_steps=2, checkpoint_keep=2,
                      tune_malloc=False).start()
    try:
        svc = server.service
        svc.call("Init", values(), worker=0, specs=SPEC_DICTS, policy={"policy": "async"}, num_workers=2)
        for clock in range(1, 6):
            svc.call("Push", {"b": np.ones(3, np.float32)}, worker=1, clock=clock)
        meta, _ = svc.call("Checkpoint", worker=1)
        assert meta["step"] == 5 and meta["path"].endswith("ckpt-000000000005.json")
        with pytest.raises(RequestError, match="not a worker"):
            svc.call("Checkpoint", worker=7)
        status, _ = svc.call("Status", brief=True)
        assert status["checkpoint"]["last_step"] == 5 and status["checkpoint"]["written"] >= 2
        incarnation = status["incarnation"]
        svc.call("Push", {"b": np.ones(3, np.float32)}, worker=1, clock=6)
    finally:
        server.stop(0)  # the final checkpoint: step 6
    assert ckpt.list_steps(d, 0) == [5, 6]
    again = PSServer(num_workers=2, checkpoint_dir=d, tune_malloc=False)
    try:
        status, _ = again.service.call("Status", brief=True)
        assert status["initialized"] and status["restored_from"] == 6 and status["incarnation"] != incarnation
        _, got = again.service.call("Pull", worker=0)
        np.testing.assert_array_equal(got["b"], np.arange(3) + 6)
    finally:
        again.stop(0, final_checkpoint=False)


def _written(servers, step, timeout=30.0):
    """Waits (bounded) until every server's checkpointer wrote ``step``."""
    import time

    deadline = time.monotonic() + timeout
    while any(s.checkpointer.last_step != step for s in servers):
        assert time.monotonic() < deadline, [s.checkpointer.last_step for s in servers]
        time.sleep(0.01)


def test_a_restarted_synchronous_job_rolls_every_task_back_to_the_newest_common_step(tmp_path):
    """Two PS tasks restore different steps (ps:1 died before its last checkpoint): the chief aligns them."""
    from tfdist.ps.client import PSClient
    from tfdist.ps.placement import RoundRobinPlacement
    from tfdist.ps.gradient_session import GradientSession

    d = str(tmp_path / "ckpt")
    plan = RoundRobinPlacement().place(SPECS, 2)
    policy = {"policy": "bsp", "replicas_to_aggregate": 1}

    def servers():
        return [PSServer(num_workers=1, checkpoint_dir=d, checkpoint_every_steps=1, task_index=i, num_ps=2,
                         tune_malloc=False).start() for i in range(2)]

    def session(ss):
        client = PSClient([s.address for s in ss], None, rpc_timeout_s=10.0, tune_malloc=False)
        return GradientSession(client, SPECS, plan, 0, True, startup_timeout_s=10, heartbeat_interval_s=None,
                               policy_spec=policy, num_workers=1)

    first = servers()
    states = {}
    try:
        chief = session(first)
        chief.initialize(values(0.0))
        for step in range(3):
            chief.exchange({"a": np.ones((2, 2), np.float32), "b": np.ones(3, np.float32)})
            states[step + 1] = values(step + 1.0)
            chief.end(states[step + 1])  # the closer uploads the state of step+1: a checkpoint on every task
            _written(first, step + 1)  # one write at a time queues: under load the next would be skipped
        chief.close(done=False)
    finally:
        for s in first:
            s.stop(0, final_checkpoint=False)
    assert ckpt.list_steps(d, 0)[-1] == ckpt.list_steps(d, 1)[-1] == 3
    for path in (tmp_path / "ckpt" / "ps-1").glob("ckpt-000000000003.*"):
        path.unlink()  # ps:1 died before it wrote step 3

    again = servers()
    try:
        assert [s.store.state_step for s in again] == [3, 2]
        chief = session(again)
        got = chief.initialize(values(99.0))  # the chief's own fresh values are not used: the job resumes
        assert [s.store.state_step for s in again] == [2, 2] and chief.state.step == 2
        np.testing.assert_array_equal(got["a"], states[2]["a"])
        np.testing.assert_array_equal(got["b"], states[2]["b"])
        assert ckpt.list_steps(d, 0)[-1] == 2  # the abandoned step 3 is gone: a later restart cannot pick it
        chief.close(done=False)
    finally:
        for s in again:
            s.stop(0, final_checkpoint=False)


def test_a_server_removes_temporary_files_of_an_interrupted_write(tmp_path):
    d = tmp_path / "ckpt"
    _, meta, arrays = store_with(AsyncPolicy(), num_workers=1).checkpoint_state()
    ckpt.write_shard(str(d), 0, 1, 4, meta, arrays)
    torn = d / "ps-0" / "ckpt-000000000008.data.tmp-0badc0de"
    torn.write_bytes(b"half a checkpoint")
    server = PSServer(num_workers=1, checkpoint_dir=str(d), tune_malloc=False).start()
    try:
        assert not torn.exists()
        assert ckpt.list_steps(str(d), 0) == [4]
    finally:
        server.stop(0, final_checkpoint=False)


def test_a_checkpoint_that_is_not_a_shard_is_refused_clearly():
    with pytest.raises(RequestError, match="Not a checkpoint of a parameter-server shard") as e:
        ParameterStore(None, num_workers=1).restore({"hello": 1}, {})
    assert e.value.grpc_code == "DATA_LOSS"


def test_ssp_readers_whose_clocks_a_restore_set_back_do_not_wait_for_each_other():
    """A restored SSP task holds older clocks than the workers (their pushes since are lost); their reads at
    their own clocks bring the clocks back instead of waiting forever for pushes nobody makes."""
    import threading

    store = store_with(SSPPolicy(2), num_workers=2, num_workers_meta=2)
    for clock in range(1, 4):
        for w in (0, 1):
            call(store, "Push", {"b": np.ones(3, np.float32)}, worker=w, clock=clock)
    _, meta, arrays = store.checkpoint_state()
    fresh = ParameterStore(None, num_workers=2, max_wait_s=10.0)
    fresh.restore(meta, arrays)
    assert fresh.policy.clocks == {0: 3, 1: 3}
    # both workers went on to clock 8 elsewhere; both now read here at clock 8 (lag 5 > 2 against the restored 3)
    results = []
    readers = [threading.Thread(target=lambda w=w: results.append(call(fresh, "Pull", worker=w, clock=8, timeout=10.0)))
               for w in (0, 1)]
    for t in readers:
        t.start()
    for t in readers:
        t.join(15)
    assert len(results) == 2 and fresh.policy.clocks == {0: 8, 1: 8}
    # a read that is refused (its wait runs out) leaves the clocks as they were
    with pytest.raises(RequestError, match="ahead of the slowest"):
        call(fresh, "Pull", worker=0, clock=20, timeout=0.05)
    assert fresh.policy.clocks == {0: 8, 1: 8}
