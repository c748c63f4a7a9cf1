"""BSP acts on straggler verdicts: exclusion, re-admission, no divergence."""

import json
import os

import pytest

from tfdist.config import JobConfig
from tfdist.testing import LocalCluster

pytestmark = pytest.mark.timeout(400)


def test_bsp_stops_waiting_for_a_detected_straggler_and_readmits_it(tmp_path, scripts_dir):
    out = tmp_path / "out"
    out.mkdir()
    cfg = JobConfig.from_dict({"ps": {"heartbeat_interval_s": 0.5, "heartbeat_timeout_s": 10}})
    with LocalCluster(workers=3, ps=1, config=cfg, log_dir=str(tmp_path / "logs")) as cluster:
        cluster.start(os.path.join(scripts_dir, "sync_straggler_worker.py"), ["--out", str(out)])
        cluster.wait(300)
    results = [json.load(open(out / f"worker-{i}.json")) for i in range(3)]
    for r in results:  # every worker saw the same verdicts: worker 2 detected, then recovered
        kinds = [(kind, w) for kind, w, _ in r["events"]]
        assert ("detected", 2) in kinds and ("recovered", 2) in kinds, r["events"]
        assert all(w == 2 for _, w in kinds)
    chief = results[0]["records"]
    excluded_steps = [step for _, excl, _, step in chief if excl == [2]]
    assert excluded_steps, "the PS never excluded the straggler"
    detected_at = next(i for kind, w, i in results[0]["events"] if kind == "detected")
    recovered_at = next(i for kind, w, i in results[0]["events"] if kind == "recovered")
    assert recovered_at > detected_at
    assert chief[-1][1] == []  # re-admitted by the end
    # one worker (the lowest member, the chief) tells the PS of each change: not every worker, not every event twice
    changes = len(results[0]["events"])  # without EWMA every event changes the flagged set
    assert results[0]["ps_stats"]["set_excluded"] == changes, (results[0]["ps_stats"], results[0]["events"])
    # no divergence: at every global step several workers reached, their states are identical
    by_step = {}
    for r in results:
        for ps_step, _, digest, _ in r["records"]:
            by_step.setdefault(ps_step, set()).add(digest)
    assert all(len(d) == 1 for d in by_step.values()), {s: d for s, d in by_step.items() if len(d) > 1}
