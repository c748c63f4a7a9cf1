"""Smoke test of benchmarks/multihost.py: ``--quick`` runs every configuration on capped emulated hosts,
prints the JSON shape, and leaves no namespace behind.

No timing thresholds: the numbers depend on the machine and its load. Needs network namespaces (root);
skipped otherwise, saying why. About 1.5 minutes on 2 cores.
"""

import json
import os
import shutil
import subprocess
import sys

import pytest

from tfdist.testing import NetnsCluster

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "benchmarks", "multihost.py")
CONFIGS = ("ps1", "ps2", "allreduce", "mwms")

pytestmark = [
    pytest.mark.slow,  # ~1.5 min; RUN_SLOW=1
    pytest.mark.timeout(420),
    pytest.mark.skipif(not NetnsCluster.available(),
                       reason=f"the multi-host benchmark needs network namespaces: {NetnsCluster.unavailable_reason()}"),
]


def _env():
    env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG" and not k.startswith("TFDIST_")}
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    return env


def _namespaces():
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=10).stdout
    return {line.split()[0] for line in out.splitlines() if line.strip()}


@pytest.fixture(scope="module")
def quick_result(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench") / "multihost.json"
    before = _namespaces()
    proc = subprocess.Popen([sys.executable, SCRIPT, "--quick", "--out", str(out)], cwd=ROOT, env=_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        stdout, stderr = proc.communicate(timeout=360)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, stderr[-4000:]
    printed = json.loads(stdout)
    with open(out) as f:
        assert json.load(f) == printed
    left = {ns for ns in _namespaces() - before if ns.startswith(f"tfdist-{proc.pid}-")}
    assert not left, f"the benchmark left namespaces behind: {left}"
    return printed


def test_quick_json_shape(quick_result):
    r = quick_result
    assert r["benchmark"] == "multihost" and r["quick"] is True
    assert r["rates"] == ["100mbit"] and r["workers"] == [2] and tuple(r["configs"]) == CONFIGS
    assert {"cpus", "load_avg_1_5_15"} <= set(r["machine"])
    assert {"tensorflow", "keras", "grpcio"} <= set(r["versions"])
    (link,) = r["link_check"]
    assert link["rate"] == "100mbit" and 0 < link["measured_mbit_per_s"] <= 110  # the cap holds
    assert list(r["cells"]) == ["100mbit/2w"]
    cell = r["cells"]["100mbit/2w"]
    assert cell["rate"] == "100mbit" and cell["workers"] == 2
    for name in CONFIGS:
        row = cell["configs"][name]
        assert row["ok"], row.get("error")
        assert row["examples_per_s"] > 0 and len(row["per_worker_examples_per_s"]) == 2
        assert row["params"] == 2156490
        # every worker moves at least one model's worth of bytes (8.6 MB) per step: push or all-reduce
        assert all(tx > 8e6 for tx in row["worker_tx_bytes_per_step"]), row["worker_tx_bytes_per_step"]
        assert row["worker_bytes_per_step"] == pytest.approx(
            (sum(row["worker_tx_bytes_per_step"]) + sum(row["worker_rx_bytes_per_step"])) / 2, rel=1e-3)
        assert all(0 < u <= 1.1 for u in row["worker_link_use"]), row["worker_link_use"]
        if name.startswith("ps"):
            assert len(row["ps_hosts"]) == int(name[-1])
            assert all(p is not None and p["rx_bytes_per_step"] > 0 for p in row["ps_hosts"]), row["ps_hosts"]
        else:
            assert "ps_hosts" not in row
    ratios = cell["ratios"]
    assert {"ps1_vs_mwms", "ps2_vs_mwms", "allreduce_vs_mwms", "ps2_vs_ps1"} <= set(ratios)
    c = cell["configs"]
    assert ratios["ps2_vs_ps1"] == pytest.approx(c["ps2"]["examples_per_s"] / c["ps1"]["examples_per_s"], rel=1e-2)
    assert r["notes"]


def test_write_docs_replaces_only_the_multihost_section(quick_result, tmp_path):
    sys.path.insert(0, ROOT)
    from benchmarks import _common, multihost

    docs = tmp_path / "benchmarks.md"
    shutil.copy(os.path.join(ROOT, "docs", "benchmarks.md"), docs)
    original = docs.read_text()
    result = json.loads(json.dumps(quick_result))
    result["cells"]["100mbit/2w"]["configs"]["mwms"] = {"ok": False, "error": "RuntimeError: no | peer",
                                                        "load_1min_at_start": 1.0}
    multihost.write_docs(result, str(docs))
    text = docs.read_text()
    begin, end = _common.section_markers(multihost.SECTION)
    assert text.split(begin)[0] == original.split(begin)[0]
    assert text.split(end)[1] == original.split(end)[1]
    section = text.split(begin)[1].split(end)[0]
    assert result["command"] in section and "100mbit" in section
    assert r"no \| peer" in section and "failed" in section
    assert multihost.CONFIG_LABELS["ps2"] in section
