"""Smoke test of benchmarks/ctr_throughput.py: tiny scale, a few steps, both configurations, JSON shape (no timing)."""

import json
import os
import subprocess
import sys
import time

import psutil
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "benchmarks", "ctr_throughput.py")
pytestmark = pytest.mark.timeout(150)


@pytest.mark.slow  # CI runs it (.ci/run)
def test_ctr_throughput_measures_both_configurations_and_leaves_no_process(tmp_path):
    out = tmp_path / "report.json"
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, SCRIPT, "--scale", "tiny", "--passes", "1", "--warmup", "3", "--steps", "10",
                           "--timeout", "100", "--out", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=140)
    took = time.monotonic() - t0
    assert proc.returncode == 0, proc.stderr[-4000:]
    report = json.loads(out.read_text())
    assert json.loads(proc.stdout) == report
    runs = {r["config"]: r for r in report["runs"]}
    assert sorted(runs) == ["tf_pss", "tfdist"], report["runs"]
    for run in runs.values():
        assert "error" not in run, run.get("traceback")
        assert run["examples_per_s"] > 0 and run["timed_steps"] == 20, run
    tfdist, tf_pss = runs["tfdist"], runs["tf_pss"]
    assert len(tfdist["per_worker"]) == 2
    assert all(w["sync_stats_per_step"]["rows_pulled"] > 0 and w["sync_stats_per_step"]["lookup_seconds"] > 0
               for w in tfdist["per_worker"])  # PS-resident tables
    assert sorted(tfdist["ms_cpu_per_step"]) == ["ps:0", "ps:1", "worker:0", "worker:1"]
    assert tf_pss["num_workers"] == 2 and tf_pss["num_ps"] == 2 and tf_pss["steps_per_execution"] == 1
    assert len(tf_pss["tables"]["deep_table"]["shards"]) == 2  # the partitioner split the table over the 2 PS
    summary = report["summary"]
    assert summary["ratio_tfdist_over_tf_pss"] > 0 and len(summary["ratio_tfdist_over_tf_pss_per_pass"]) == 1
    assert isinstance(summary["target"]["met"], bool)
    pids = [pid for run in runs.values() for pid in run["pids"].values()]
    assert len(pids) == 9  # 2 PS + 2 workers; 2 PS + 2 worker servers + the coordinator
    left = [p.pid for p in psutil.process_iter(["cmdline", "status"]) if p.info["status"] != psutil.STATUS_ZOMBIE
            and (p.pid in pids or report["log_dir"] in " ".join(p.info["cmdline"] or []))]
    assert left == []  # every child was stopped
    print(f"CTR throughput smoke: {took:.1f} s")  # (no bound on it: a hang is the timeouts' job, speed the benchmark's)
