"""Smoke test of benchmarks/stragglers_vs_peers.py: its quick run (async and MWMS, a straggler, 30 s each).

JSON shape and the evaluation only: every run's snapshots were evaluated into a curve of held-out accuracy that
starts near chance and rises (training happened and was measured), never a timing threshold.
"""

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "benchmarks", "stragglers_vs_peers.py")


# Slow (~2 min): covered by `python benchmarks/stragglers_vs_peers.py --quick`; run with RUN_SLOW=1.
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_quick_benchmark_prints_the_report(tmp_path):
    out = tmp_path / "report.json"
    docs = os.path.join(ROOT, "docs", "benchmarks.md")
    before = open(docs).read()
    proc = subprocess.run([sys.executable, SCRIPT, "--quick", "--out", str(out)], cwd=ROOT, capture_output=True,
                          text=True, timeout=540)
    assert proc.returncode == 0, proc.stderr[-4000:]
    report = json.loads(out.read_text())
    assert json.loads(proc.stdout) == report
    assert [(r["system"], r["straggler"]) for r in report["runs"]] == [("async", True), ("mwms", True)]
    for run in report["runs"]:
        accuracies = [acc for _, acc in run["curve"]]
        assert run["snapshots"] >= 10 and accuracies[0] < 0.3, run  # the first copy: an untrained model
        assert max(accuracies) > accuracies[0] + 0.2, run  # it trained, and the copies saw it
        assert run["training_started_s"] is not None and run["final_accuracy"] == accuracies[-1]
    for clock in ("launch", "first_step"):
        assert set(report["summary"][clock]["vs_peers"]["async"]) == {"mwms"}
    assert open(docs).read() == before  # without --write-docs the docs are untouched
