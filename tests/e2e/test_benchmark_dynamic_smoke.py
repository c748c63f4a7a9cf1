"""Smoke test of benchmarks/dynamic_tables.py: small sizes, the JSON's shape, a flat table under a flood (no timing)."""

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "benchmarks", "dynamic_tables.py")
pytestmark = pytest.mark.timeout(120)


def test_dynamic_tables_benchmark_reports_both_tables_and_a_bounded_flood(tmp_path):
    out = tmp_path / "report.json"
    proc = subprocess.run([sys.executable, SCRIPT, "--rows", "20000", "--lookup-ids", "1000", "--apply-ids", "20000",
                           "--flood-ids", "3000000", "--flood-capacity", "200000", "--flood-dim", "4",
                           "--out", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=100, check=False)
    assert proc.returncode == 0, proc.stderr[-4000:]
    report = json.loads(out.read_text())
    assert json.loads(proc.stdout) == report
    for part in ("lookup", "adagrad_apply"):
        assert report[part]["dynamic_ms"] > 0 and report[part]["fixed_ms"] > 0 and report[part]["ratio"] > 0
    flood, under_lock = report["flood"], report["flood_choosing_under_the_lock"]
    assert flood["evicted"] > 0 and all(s["rows"] <= 200000 for s in flood["samples"])
    assert flood["choose_ahead"] and not under_lock["choose_ahead"]
    assert under_lock["evicted"] == flood["evicted"]  # the same rows go, whoever chose them
    assert under_lock["evictions_chosen_under_lock"] > 0 and under_lock["update_ms_evicting_median_max"] is not None
    # once full, the table's bytes stay within a band (the id index is rebuilt at one of two sizes), not a trend
    full = flood["table_bytes_once_full"]
    assert max(full) <= 1.5 * min(full), full
    assert flood["samples"][-1]["table_bytes"] <= max(s["table_bytes"] for s in flood["samples"][:2]) * 1.5
