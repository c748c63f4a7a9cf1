"""benchmarks/fault_accuracy.py runs (one round of one mode, two faults) and prints the documented JSON."""

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.slow  # CI runs it (.ci/run's second command)
@pytest.mark.timeout(300)
def test_fault_accuracy_benchmark_reports_both_runs(tmp_path):
    out = tmp_path / "r.json"
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "fault_accuracy.py"), "--modes", "async",
                           "--faults", "ps,stop", "--rounds", "1", "--out", str(out)], capture_output=True, text=True,
                          timeout=280, cwd=ROOT, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert json.loads(proc.stdout) == result
    s = result["modes"]["async"]["ps"]
    assert len(s["undisturbed"]) == 1 and len(s["ps_killed"]) == 1
    assert all(0.5 < a <= 1.0 for a in s["undisturbed"] + s["ps_killed"])
    killed = [r for r in result["runs"] if r["fault"] and r["fault_name"] == "ps"]
    assert killed[0]["restarts"] == {"ps:1": 1} and killed[0]["recoveries"] >= 1
    assert killed[0]["restored_from"] is not None  # ps:1 came back from its checkpoint
    s = result["modes"]["async"]["stop"]
    assert len(s["undisturbed"]) == 1 and len(s["worker_stopped"]) == 1 and s["failed_runs"] == 0
    stopped = [r for r in result["runs"] if r["fault"] and r["fault_name"] == "stop"]
    # stopped until ps:0 gave up on it (the 3 s heart-beat timeout runs from its last heart-beat, which can be
    # up to the 1 s interval before the SIGSTOP: the stop itself may last a little under 3 s)
    assert stopped[0]["stopped_s"] >= stopped[0]["dead_after_s"] > 0 and stopped[0]["restarts"] == {}, stopped
