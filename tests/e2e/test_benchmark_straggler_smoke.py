"""Smoke test of benchmarks/straggler_detection.py: the cheapest configuration, JSON shape only (no timing)."""

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "benchmarks", "straggler_detection.py")


# Slow (~45 s): covered by `python benchmarks/straggler_detection.py --quick`; run with RUN_SLOW=1.
@pytest.mark.slow
def test_quick_benchmark_prints_the_report(tmp_path):
    out = tmp_path / "report.json"
    docs = os.path.join(ROOT, "docs", "benchmarks.md")
    before = open(docs).read() if os.path.exists(docs) else None
    proc = subprocess.run([sys.executable, SCRIPT, "--quick", "--out", str(out)], cwd=ROOT, capture_output=True,
                          text=True, timeout=480)
    assert proc.returncode == 0, proc.stderr[-4000:]
    report = json.loads(out.read_text())
    assert json.loads(proc.stdout) == report
    assert set(report) >= {"detection", "motivation", "targets", "config", "environment", "command"}
    (det,) = report["detection"]
    assert det["batch"] == 32 and det["epochs"] == 2 and det["iterations_per_epoch"] >= 14
    for key in ("detection_iterations", "detection_s", "recovery_iterations", "recovery_s"):
        assert det[key] is None or set(det[key]) == {"mean", "min", "max", "n"}
    assert isinstance(det["misclassifications"], int) and len(det["per_epoch"]) == 2
    rows = report["motivation"]["rows"]
    assert [r["stragglers"] for r in rows] == [0, 1]
    assert all(r["plain_s"] > 0 and r["exclude_s"] > 0 for r in rows)
    assert set(report["targets"]) >= {"zero_misclassifications", "detection_within_6_iterations",
                                      "recovery_within_2_iterations", "exclusion_within_1_15x_healthy", "worst"}
    # without --write-docs the docs are untouched
    assert (open(docs).read() if os.path.exists(docs) else None) == before
