"""A parameter-server task killed mid-fit: the launcher restarts it, it restores its checkpoint, workers go on.

Real processes (``tfdist.testing.LocalCluster``, whose wait loop is the
launcher's: ``launch.restart_ps`` is on by default): 2 PS tasks, 2 workers,
an MLP on digits. The chief pauses before a given step (a file handshake,
bounded), the test SIGKILLs ``ps:1`` and lets the chief go on; both workers
must finish ``fit`` with a good model, having recovered by themselves, and
``ps:1`` must come back as a new incarnation restored from a checkpoint (or,
without ``ps.checkpoint_dir``, initialised again from the chief's values).
"""

import json
import os
import time

import pytest

from tfdist.config import JobConfig
from tfdist.testing import LocalCluster

pytestmark = pytest.mark.timeout(420)

STEPS, PAUSE_AT, EVERY = 150, 60, 20


def _wait_for_file(cluster, path, timeout):
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        for task, proc in cluster.job.tasks.items():
            assert proc.poll() is None, f"{task} exited {proc.poll()} early:\n{cluster.log(task)[-3000:]}"
        assert time.monotonic() < deadline, f"{path} did not appear within {timeout} s"
        time.sleep(0.05)


def _status(cluster, ps):
    with cluster.client() as client:
        meta, _ = client.call(ps, "Status", {"brief": True})
    return meta


@pytest.mark.parametrize("with_checkpoints", [True, False], ids=["checkpoint", "no-checkpoint"])
def test_async_job_survives_a_killed_ps(tmp_path, scripts_dir, with_checkpoints):
    out = tmp_path / "out"
    out.mkdir()
    config = JobConfig(name="durable")
    if with_checkpoints:
        config.ps.checkpoint_dir = str(tmp_path / "ckpt")
        config.ps.checkpoint_every_steps = EVERY
        config.ps.checkpoint_every_s = None
    cluster = LocalCluster(workers=2, ps=2, config=config, log_dir=str(tmp_path / "logs"))
    with cluster:
        cluster.start(os.path.join(scripts_dir, "durability_worker.py"),
                      ["--out", str(out), "--mode", "async", "--steps", str(STEPS), "--pause-at", str(PAUSE_AT)])
        _wait_for_file(cluster, str(out / "paused"), 240)
        before = _status(cluster, 1)
        cluster.kill("ps:1")
        (out / "resume").touch()
        cluster.wait(240)  # restarts ps:1 when it sees it dead
        assert cluster.job.ps_restarts == {"ps:1": 1}
        logs = {t: cluster.log(t)[-3000:] for t in ("worker:0", "worker:1", "ps:1")}
    results = [json.load(open(out / f"worker-{w}.json")) for w in (0, 1)]
    for r in results:
        assert r["steps"] == STEPS, logs
        assert r["accuracy"] >= 0.9, (r, logs)
    assert results[0]["recoveries"] >= 1, logs  # the chief's next exchange after the kill failed
    after = results[0]["ps_status"][1]
    assert after["incarnation"] != before["incarnation"]
    if with_checkpoints:
        restored = after["restored_from"]
        # the newest checkpoint captured before the kill: a multiple of EVERY at most the progress seen
        assert restored is not None and restored % EVERY == 0 and EVERY <= restored <= before["progress"] + EVERY
        lost = before["progress"] - restored
        print(f"ps:1 restored from step {restored}; progress before the kill {before['progress']}; "
              f"at least {lost} applied batches lost")
        assert "restarted from the checkpoint" in logs["ps:1"]
    else:
        assert after["restored_from"] is None
        assert "initialised again from this worker's current values" in cluster.log("worker:0")
