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


_BASELINE: dict[str, float] = {}


def _run(tmp_path, scripts_dir, mode, config, fault, extra=()):
    """Runs the job; with ``fault``, kills ps:1 while the chief is paused. Returns (results, before, restarts, logs)."""
    out = tmp_path / "out"
    out.mkdir()
    cluster = LocalCluster(workers=2, ps=2, config=config, log_dir=str(tmp_path / "logs"))
    args = ["--out", str(out), "--mode", mode, "--m", "1", "--steps", str(STEPS), *extra]
    before = None
    with cluster:
        cluster.start(os.path.join(scripts_dir, "durability_worker.py"),
                      args + (["--pause-at", str(PAUSE_AT)] if fault else []))
        if fault:
            _wait_for_file(cluster, str(out / "paused"), 240)
            before = _status(cluster, 1)
            cluster.kill("ps:1")
            (out / "resume").touch()
        cluster.wait(240)  # restarts ps:1 when it sees it dead
        logs = {t: cluster.log(t)[-3000:] for t in ("worker:0", "worker:1", "ps:1")}
        restarts = dict(cluster.job.restarts)
    results = [json.load(open(out / f"worker-{w}.json")) for w in (0, 1)]
    return results, before, restarts, logs


def _baseline(tmp_path_factory, scripts_dir, mode) -> float:
    """The chief's test accuracy of the same job without the fault (run once per mode)."""
    if mode not in _BASELINE:
        results, _, _, _ = _run(tmp_path_factory.mktemp(f"baseline-{mode}"), scripts_dir, mode,
                                JobConfig(name="durable"), fault=False)
        _BASELINE[mode] = results[0]["accuracy"]
    return _BASELINE[mode]


@pytest.mark.parametrize("mode, with_checkpoints", [
    ("async", True), ("async", False), ("bsp", True), ("sync_replicas", False),
], ids=["async-checkpoint", "async-no-checkpoint", "bsp-checkpoint", "sync_replicas-no-checkpoint"])
def test_a_job_survives_a_killed_ps(tmp_path, tmp_path_factory, scripts_dir, mode, with_checkpoints):
    config = JobConfig(name="durable")
    if with_checkpoints:
        config.ps.checkpoint_dir = str(tmp_path / "ckpt")
        config.ps.checkpoint_every_steps = EVERY
        config.ps.checkpoint_every_s = None
    results, before, restarts, logs = _run(tmp_path, scripts_dir, mode, config, fault=True)
    assert restarts == {"ps:1": 1}
    baseline = _baseline(tmp_path_factory, scripts_dir, mode)
    print(f"{mode}: accuracy {results[0]['accuracy']:.4f} with ps:1 killed, {baseline:.4f} without")
    for r in results:
        assert r["steps"] == STEPS, logs
        assert r["accuracy"] >= baseline - 0.02, (r, baseline, logs)
        assert r["recoveries"] >= 1, logs  # every worker recovered by itself
    after = results[0]["ps_status"][1]
    assert after["incarnation"] != before["incarnation"]
    if mode != "async":  # the gradient path: the chief reset every task to its state; one state everywhere
        assert "reset every parameter server to this worker's state" in logs["worker:0"]
        assert len({st["state_step"] for st in results[0]["ps_status"]}) == 1
    elif with_checkpoints:
        restored = after["restored_from"]
        # the newest checkpoint captured before the kill: a multiple of EVERY at most the progress seen
        assert restored is not None and restored % EVERY == 0 and EVERY <= restored <= before["progress"] + EVERY
        print(f"ps:1 restored from step {restored}; progress before the kill {before['progress']}; "
              f"at least {before['progress'] - restored} applied batches lost on it")
        assert "restarted from the checkpoint" in logs["ps:1"]
    else:
        assert after["restored_from"] is None
        assert "initialised again from this worker's current values" in logs["worker:0"]


@pytest.mark.parametrize("mode", ["async", "bsp"])
def test_a_job_survives_a_killed_chief(tmp_path, tmp_path_factory, scripts_dir, mode):
    """The chief SIGKILLs itself mid-fit; the launcher starts it again and it joins with the job's values."""
    results, _, restarts, logs = _run(tmp_path, scripts_dir, mode, JobConfig(name="durable"), fault=False,
                                      extra=["--crash-chief-at", str(PAUSE_AT)])
    assert restarts == {"worker:0": 1}, logs
    assert os.path.exists(tmp_path / "out" / "crashed")
    baseline = _baseline(tmp_path_factory, scripts_dir, mode)
    print(f"{mode}: accuracy {results[0]['accuracy']:.4f} with the chief killed, {baseline:.4f} without")
    for r in results:
        assert r["steps"] == STEPS, logs
        assert r["accuracy"] >= baseline - 0.02, (r, baseline, logs)
    assert "already held values" in logs["worker:0"]  # the new chief joined; it did not initialise the PS again
