"""Smoke test of benchmarks/ps_throughput.py: the cheapest part runs, prints the JSON shape, leaves no child.

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
SCRIPT = os.path.join(ROOT, "benchmarks", "ps_throughput.py")
pytestmark = pytest.mark.timeout(180)


def _env():
    env = dict(os.environ)
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    env.pop("TF_CONFIG", None)
    env.pop("TFDIST_CONFIG", None)
    return env


def _echo_servers():
    found = []
    for p in psutil.process_iter(["pid", "cmdline"]):
        try:
            if any("grpc_echo.py" in part for part in p.info["cmdline"] or []):
                found.append(p.info["pid"])
        except psutil.NoSuchProcess:
            pass
    return found


@pytest.fixture(scope="module")
def bytes_result(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench") / "ps.json"
    before = set(_echo_servers())
    proc = subprocess.run(
        [sys.executable, SCRIPT, "--only", "bytes", "--quick", "--sizes", "65536", "--rounds", "1", "--out", str(out)],
        cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=150,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    printed = json.loads(proc.stdout)
    with open(out) as f:
        assert json.load(f) == printed
    assert not set(_echo_servers()) - before, "the raw gRPC echo server outlived the benchmark"
    return printed


def test_bytes_json_shape(bytes_result):
    r = bytes_result
    assert r["benchmark"] == "ps_throughput"
    assert r["quick"] is True
    assert "training" not in r
    assert {"cpus", "load_avg_1_5_15"} <= set(r["machine"])
    assert {"tensorflow", "keras", "grpcio"} <= set(r["versions"])
    assert "load_at_start" in r["load"] and "load_at_end" in r["load"]
    (row,) = r["bytes"]["rows"]
    assert row["payload_bytes"] == 65536
    for name in ("raw_grpc", "tfdist_sync", "tfdist_pushpull_rpc"):
        assert row[name]["bytes_per_s"] > 0
        assert row[name]["ms_per_call"] > 0
    assert row["ratio_sync_vs_raw"] == pytest.approx(row["tfdist_sync"]["bytes_per_s"] / row["raw_grpc"]["bytes_per_s"])
    assert r["targets"] == {}  # no payload >= 1 MB, no training: nothing to judge


def test_write_docs_replaces_only_the_ps_section(bytes_result, tmp_path):
    sys.path.insert(0, ROOT)
    from benchmarks import _common, ps_throughput

    docs = tmp_path / "benchmarks.md"
    shutil.copy(os.path.join(ROOT, "docs", "benchmarks.md"), docs)
    original = docs.read_text()
    result = dict(bytes_result)
    result["training"] = {
        "cnn": {
            "description": "CNN",
            "configs": {
                "plain": {"ok": True, "examples_per_s": 1000.0, "steps_per_s": 15.6, "per_worker_examples_per_s": [1000.0],
                          "warmup_steps": 1, "timed_steps_per_worker": 2, "load_1min_at_start": 0.1},
                "mwms": {"ok": False, "error": "RuntimeError: could not start | here", "warmup_steps": 1,
                         "timed_steps_per_worker": 2, "load_1min_at_start": 0.1},
            },
            "ratios": {},
        }
    }
    ps_throughput.write_docs(result, str(docs))
    text = docs.read_text()
    begin, end = _common.section_markers(ps_throughput.SECTION)
    assert text.split(begin)[0] == original.split(begin)[0]
    assert text.split(end)[1] == original.split(end)[1]
    section = text.split(begin)[1].split(end)[0]
    assert "64 KiB" in section and "1,000" in section and "failed" in section
    assert r"could not start \| here" in section
    assert result["command"] in section
