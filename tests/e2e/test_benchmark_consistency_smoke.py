"""Smoke test of benchmarks/consistency.py: the cheapest configuration runs and prints the JSON shape.

No timing thresholds: the numbers depend on the machine and its load.
"""

import json
import os
import shutil
import subprocess
import sys

import psutil
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "benchmarks", "consistency.py")
# Slow (~40 s): covered by `python benchmarks/consistency.py --quick`; run with RUN_SLOW=1.
pytestmark = [pytest.mark.timeout(240), pytest.mark.slow]


def _env():
    env = dict(os.environ)
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    for name in ("TF_CONFIG", "TFDIST_CONFIG", "TFDIST_SLOWDOWN"):
        env.pop(name, None)
    return env


def _benchmark_workers():
    found = []
    for p in psutil.process_iter(["pid", "cmdline"]):
        try:
            if any("consistency_workers" in part for part in p.info["cmdline"] or []):
                found.append(p.info["pid"])
        except psutil.NoSuchProcess:
            pass
    return found


@pytest.fixture(scope="module")
def result(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench") / "consistency.json"
    before = set(_benchmark_workers())
    proc = subprocess.run(
        [sys.executable, SCRIPT, "--quick", "--modes", "bsp,sync_replicas", "--workers", "2",
         "--scenarios", "straggler", "--steps", "15", "--target-accuracy", "0.3", "--base-delay-s", "0.01",
         "--max-run-s", "20", "--out", str(out)],
        cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=220,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    printed = json.loads(proc.stdout)
    with open(out) as f:
        assert json.load(f) == printed
    assert not set(_benchmark_workers()) - before, "a worker process outlived the benchmark"
    return printed


def test_json_shape(result):
    r = result
    assert r["benchmark"] == "consistency" and r["quick"] is True
    assert {"cpus", "platform"} <= set(r["machine"])
    assert {"tensorflow", "keras"} <= set(r["versions"])
    assert r["settings"]["workers"] == 2 and r["settings"]["modes"] == ["bsp", "sync_replicas"]
    assert set(r["runs"]) == {"straggler@2"}
    for mode in ("bsp", "sync_replicas"):
        run = r["runs"]["straggler@2"][mode]
        assert "error" not in run, run.get("error")
        assert run["speeds"] == [1.0, 3.0]
        assert run["time_to_steps_s"] > 0 and run["time_to_accuracy_s"] > 0
        assert 0.0 <= run["final_accuracy"] <= 1.0
        assert len(run["per_worker"]) == 2 and all(w["steps"] > 0 for w in run["per_worker"])
        assert run["global_steps_run"] >= 15
        assert run["curve"] and len(run["curve"][0]) == 4
    sync = r["runs"]["straggler@2"]["sync_replicas"]
    assert sync["policy"]["replicas_to_aggregate"] == 1  # N-1 of N
    assert sync["ps_stats"]["aggregations"] >= 15
    assert set(r["report"]) == {"ratios", "paper_table", "targets"}


def test_write_docs_replaces_only_its_section(result, tmp_path):
    sys.path.insert(0, ROOT)
    from benchmarks import _common, consistency

    docs = tmp_path / "benchmarks.md"
    shutil.copy(os.path.join(ROOT, "docs", "benchmarks.md"), docs)
    original = docs.read_text()
    consistency.write_docs(result, str(docs))
    text = docs.read_text()
    begin, end = _common.section_markers(consistency.SECTION)
    assert text.count(begin) == 1 and text.count(end) == 1
    if begin in original:
        assert text.split(begin)[0] == original.split(begin)[0]
        assert text.split(end)[1] == original.split(end)[1]
    else:
        assert text.startswith(original.rstrip("\n"))
    section = text.split(begin)[1].split(end)[0]
    assert result["command"] in section and "SyncReplicas" in section
