"""What the sync modes survive with the *default* config: a dead worker, a worker that left fit early.

DESIGN.md §11: what a mode promises to survive it survives with the default
config. Before issue #12 the default heart-beat timeout equalled the default
RPC deadline (30 s), so BSP survivors of a dead worker failed with
DEADLINE_EXCEEDED ("the PS task may have died") although the PS was healthy.
"""

import json
import math
import os

import pytest

from tfdist import constants
from tfdist.config import JobConfig
from tfdist.testing import LocalCluster

pytestmark = pytest.mark.timeout(300)

STEPS = 20


def _read(out, i):
    with open(os.path.join(out, f"worker-{i}.json")) as f:
        return json.load(f)


def _wait(cluster, task, timeout, expect=0):
    code = cluster.process(task).wait(timeout)
    assert code == expect, f"{task} exited {code}:\n{cluster.log(task)[-3000:]}"


def _start(tmp_path, scripts_dir, workers, args):
    out = tmp_path / "out"
    out.mkdir(parents=True, exist_ok=True)
    cluster = LocalCluster(workers=workers, ps=1, config=JobConfig(name="faults"), log_dir=str(tmp_path / "logs"))
    cluster.start(os.path.join(scripts_dir, "fault_worker.py"), ["--out", str(out), "--steps", str(STEPS), *args])
    return cluster, out


def test_default_heartbeat_timeout_is_well_below_the_rpc_deadline():
    ps = JobConfig().ps
    assert ps.heartbeat_timeout_s <= ps.rpc_timeout_s / 2
    assert ps.heartbeat_timeout_s >= 3 * ps.heartbeat_interval_s  # a live worker never misses that many beats
    assert ps.heartbeat_timeout_s == constants.DEFAULT_HEARTBEAT_TIMEOUT_S


@pytest.mark.parametrize("mode, m", [("bsp", None), ("sync_replicas", 2)])
def test_survivors_of_a_killed_worker_finish_fit_with_the_default_config(tmp_path, scripts_dir, mode, m):
    """3 workers; worker 2 is SIGKILLed after its 5th step; workers 0 and 1 train all their steps."""
    args = ["--mode", mode, "--crash-worker", "2", "--crash-at", "5"]
    if m:  # 2 of 3: worker 0 waits for the crash at its 3rd step, so it happens mid-fit (1 and 2 pair up meanwhile)
        args += ["--m", str(m), "--hold-worker", "0", "--hold-at", "3"]
    cluster, out = _start(tmp_path, scripts_dir, 3, args)
    with cluster:
        _wait(cluster, "worker:2", 180, expect=-9)
        _wait(cluster, "worker:0", 120)
        _wait(cluster, "worker:1", 120)
    survivors = [_read(out, 0), _read(out, 1)]
    rpc_timeout = JobConfig().ps.rpc_timeout_s
    for r in survivors:
        assert r["steps"] == STEPS
        # the step that waited for the dead worker's gradient ended when its heart-beat timed out
        # (the first step, which also traces the model, is left out)
        assert max(r["durations"][1:]) < rpc_timeout
    last = max(survivors, key=lambda r: r["ps_status"][0]["stats"]["aggregations"])["ps_status"][0]
    assert last["worker_batches"] == {"0": STEPS, "1": STEPS, "2": 5}
    stats = last["stats"]
    # every gradient sent was aggregated or dropped (none lost), and every aggregation is a global step
    assert stats["gradients_aggregated"] + stats["dropped"] == 2 * STEPS + 5
    assert last["global_step"] == stats["aggregations"] >= STEPS
    assert 2 not in last["done_workers"]
    if mode == "bsp":
        # in lockstep: the same steps, the same model and optimizer state on both survivors
        assert last["global_step"] == STEPS and stats["dropped"] == 0
        assert survivors[0]["state_hash"] == survivors[1]["state_hash"]
        assert 2 not in last["live_workers"]
    # SyncReplicas: a worker whose gradient came late may skip a global step (it reloads the job's state),
    # so the survivors can end at different global steps and states; both trained all their batches.


def test_a_bsp_worker_that_leaves_fit_early_and_lingers_does_not_stop_the_others(tmp_path, scripts_dir):
    """Worker 1 stops after 5 of 20 steps (like EarlyStopping), stays alive until worker 0 is done, then evaluates."""
    args = ["--mode", "bsp", "--stop-worker", "1", "--stop-at", "5", "--leave-on-train-end", "--linger-for-others"]
    cluster, out = _start(tmp_path, scripts_dir, 2, args)
    with cluster:
        cluster.wait(240)
        _wait(cluster, "ps:0", 20)  # and the PS ends by itself: both workers said Done at exit
    early, full = _read(out, 1), _read(out, 0)
    assert early["steps"] == 5 and full["steps"] == STEPS
    assert max(full["durations"][1:]) < JobConfig().ps.rpc_timeout_s  # waited for the leaver once, within bounds
    assert math.isfinite(early["eval_after_linger"])  # the leaver still reads (evaluates) after the others are done
    status = full["ps_status"][0]
    assert status["global_step"] == STEPS and status["worker_batches"] == {"0": STEPS, "1": 5}
    assert 1 not in status["live_workers"]
