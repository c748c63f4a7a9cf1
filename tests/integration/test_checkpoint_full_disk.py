"""A real PS process whose checkpoint disk fills up keeps checkpointing; SIGKILLed, it loses at most one interval.

The checkpoint directory is a 1 MiB tmpfs (root only: skipped elsewhere)
that something else fills while the job runs. The shard is ~300 KiB, so the
volume then holds the newest checkpoint and one more, not ``keep=3``. Before
retention pruned ahead of a write, every checkpoint after the disk filled
failed and a restart went back to the last one written before (issue 27:
215 and 238 updates lost where one interval is ~105).
"""

import os
import time

import numpy as np
import pytest

from tfdist.config import JobConfig
from tfdist.ps.placement import VariableSpec
from tfdist.testing import LocalCluster

KIB = 1024
ROWS = 300 * KIB // 4
EVERY = 5  # ps.checkpoint_every_steps: the interval a restart may lose at most


def _status(client):
    meta, _ = client.call(0, "Status", {"brief": True})
    return meta


def _wait_for_checkpoint(client, step, timeout=60.0):
    """Polls (bounded) the PS's status until its newest checkpoint is ``step``; fails at a failed write."""
    deadline = time.monotonic() + timeout
    while True:
        seen = _status(client)["checkpoint"]
        assert seen["failed"] == 0, f"a checkpoint write failed: {seen}"
        if seen["last_step"] == step:
            return seen
        assert time.monotonic() < deadline, f"the checkpoint of step {step} was not written within {timeout} s: {seen}"
        time.sleep(0.05)


def _push(client, clocks):
    for clock in clocks:
        client.call(0, "Push", {"worker": 0, "clock": clock}, {"w": np.ones(ROWS, np.float32)})


def test_a_ps_on_a_full_disk_keeps_checkpointing_and_loses_at_most_one_interval(small_tmpfs):
    d = small_tmpfs(1024 * KIB)
    config = JobConfig(name="full-disk")
    config.ps.checkpoint_dir, config.ps.checkpoint_every_s = str(d / "ckpt"), None
    config.ps.checkpoint_every_steps, config.ps.checkpoint_keep = EVERY, 3
    with LocalCluster(workers=1, ps=1, config=config) as cluster:
        cluster.start_ps()
        with cluster.client() as client:
            spec = VariableSpec("w", "float32", (ROWS,)).to_dict()
            client.call(0, "Init", {"worker": 0, "specs": [spec], "policy": {"policy": "async"}, "num_workers": 1},
                        {"w": np.zeros(ROWS, np.float32)})
            _push(client, range(1, 11))
            _wait_for_checkpoint(client, 10)
            with open(d / "filler", "wb") as f:  # something else fills the disk: 50 KiB stay free
                f.write(b"\0" * (os.statvfs(d).f_bavail * os.statvfs(d).f_frsize - 50 * KIB))
            _push(client, range(11, 31))
            _wait_for_checkpoint(client, 30)
            _push(client, range(31, 34))  # 3 updates after the newest checkpoint: what a crash now loses
        cluster.kill("ps:0")
        cluster.restart("ps:0")
        with cluster.client() as client:
            cluster.job.wait_servers_ready(client, 30)
            status = _status(client)
            _, values = client.call(0, "Pull", {"worker": 0})
        log = cluster.log("ps:0")
    assert status["restored_from"] == 30, (status, log[-3000:])
    assert 33 - status["restored_from"] < EVERY  # at most one checkpoint interval lost
    np.testing.assert_array_equal(values["w"], np.full(ROWS, 30, np.float32))
    assert "short of space" in log


def test_the_small_tmpfs_fixture_is_a_real_small_disk(small_tmpfs):
    d = small_tmpfs(256 * KIB)
    with pytest.raises(OSError, match="No space left"):
        with open(d / "too-big", "wb") as f:
            f.write(b"\0" * 512 * KIB)
