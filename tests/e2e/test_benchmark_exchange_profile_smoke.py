"""Smoke test of benchmarks/exchange_profile.py: a tiny run prints the JSON with every part measured.

The worker wraps library functions by name (benchmarks/ps_workers/profile_worker.py): a renamed
function fails here rather than in the next profiling session. No timing thresholds.
"""

import json
import os
import subprocess
import sys

import pytest

from tfdist.testing import run_python

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
pytestmark = pytest.mark.timeout(300)


def test_a_short_profile_reports_the_worker_parts_and_the_ps_cpu(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("TF_CONFIG", "TFDIST_CONFIG")}
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    out = tmp_path / "profile.json"
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "exchange_profile.py"), "--warmup", "5",
                           "--steps", "30", "--out", str(out)], env=env, capture_output=True, text=True, timeout=280)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert json.loads(proc.stdout) == result
    (run,) = result["passes"]
    for key in ("plain_cpu_ms_per_step", "tfdist_worker_cpu_ms_per_step", "ps_cpu_ms_per_worker_step"):
        assert run[key] > 0, (key, run)
    assert run["added_cpu_ms_per_step"] == pytest.approx(run["tfdist_worker_cpu_ms_per_step"]
                                                         - run["plain_cpu_ms_per_step"])
    parts = run["worker_parts_ms_per_step"]
    # the parts every async step runs: the end-of-step py_function, the background exchange and its RPCs
    for part in ("end_of_step py_function", "end_step (count, delta)", "background exchange",
                 "the RPCs to every task (encode, transport, decode)", "encode", "decode", "parse replies"):
        assert parts.get(part, 0) > 0, (part, parts)
    for inner, outer in run["part_inside"].items():  # a part never costs more than the one it runs inside
        if inner in parts and outer in parts:
            assert parts[inner] <= parts[outer] * 1.05 + 0.01, (inner, outer, parts)


def test_the_step_hooks_benchmark_measures_every_variant(tmp_path):
    """benchmarks/step_hooks_cost.py: every graph variant runs and is reported (no timing thresholds)."""
    env = {k: v for k, v in os.environ.items() if k not in ("TF_CONFIG", "TFDIST_CONFIG")}
    out = tmp_path / "hooks.json"
    proc = run_python([sys.executable, os.path.join(ROOT, "benchmarks", "step_hooks_cost.py"), "--calls", "20",
                       "--passes", "2", "--out", str(out)], env, timeout=280)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert set(result["cpu_us_per_call"]) == {"call", "+ begin", "+ end(inputs)", "+ end(inputs, 7 outputs)",
                                              "+ end(inputs, 7 outputs) + 6 conditions",
                                              "+ end(inputs, 2 outputs) + 1 condition"}
    assert all(v > 0 for v in result["cpu_us_per_call"].values())
    assert all(len(v) == 2 for v in result["cpu_us_per_pass"].values())
