"""benchmarks/_common.replace_section: rewrites one marked section of a Markdown file and nothing else."""

import pathlib
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

from benchmarks import _common  # noqa: E402

DOC = """# Benchmarks

<!-- section: alpha -->
old alpha
<!-- /section: alpha -->

<!-- section: beta -->
old beta
<!-- /section: beta -->
tail
"""


def test_replaces_only_the_named_section(tmp_path):
    path = tmp_path / "benchmarks.md"
    path.write_text(DOC, encoding="utf-8")
    _common.replace_section(str(path), "alpha", "## Alpha\n\nnew | table")
    assert path.read_text(encoding="utf-8") == DOC.replace("old alpha", "## Alpha\n\nnew | table")
    _common.replace_section(str(path), "beta", "")
    assert path.read_text(encoding="utf-8").endswith("<!-- section: beta -->\n\n<!-- /section: beta -->\ntail\n")
    assert "new | table" in path.read_text(encoding="utf-8")  # alpha kept
    assert not list(tmp_path.glob("*.tmp"))


def test_same_text_twice_leaves_the_file_unchanged(tmp_path):
    path = tmp_path / "benchmarks.md"
    path.write_text(DOC, encoding="utf-8")
    _common.replace_section(str(path), "beta", "old beta")
    assert path.read_text(encoding="utf-8") == DOC


@pytest.mark.parametrize("doc", [
    "no markers at all\n",
    "<!-- section: gamma -->\nno end\n",
    "<!-- /section: gamma -->\nend first\n<!-- section: gamma -->\n",
    "<!-- section: gammaray -->\n<!-- /section: gammaray -->\n",
])
def test_missing_markers_raise_and_leave_the_file(tmp_path, doc):
    path = tmp_path / "benchmarks.md"
    path.write_text(doc, encoding="utf-8")
    with pytest.raises(ValueError, match=r"has no section 'gamma'.*<!-- section: gamma -->.*<!-- /section: gamma -->"):
        _common.replace_section(str(path), "gamma", "text")
    assert path.read_text(encoding="utf-8") == doc


def test_every_benchmark_section_exists_in_the_docs():
    root = pathlib.Path(__file__).resolve().parents[2]
    text = (root / "docs" / "benchmarks.md").read_text(encoding="utf-8")
    for name in ("parameter-server", "federated", "straggler", "consistency", "autoscaling", "sparse-scaling",
                 "stragglers-vs-peers", "stragglers-vs-peers-moving"):
        begin, end = _common.section_markers(name)
        assert text.count(begin) == 1 and text.count(end) == 1 and text.index(begin) < text.index(end), name


def test_the_joint_rate_counts_only_what_every_worker_finished_while_all_trained():
    """Issue #23: a job's throughput is measured in the window in which all of its workers train."""
    from benchmarks.ps_throughput import joint_rate

    # worker 0 ends a batch every 0.1 s from t=0; worker 1 starts 1 s later and ends one every 0.2 s
    w0 = {"batch_end_wall": [0.1 * i for i in range(31)]}  # 0 .. 3.0
    w1 = {"batch_end_wall": [1.0 + 0.2 * i for i in range(16)]}  # 1.0 .. 4.0
    r = joint_rate([w0, w1], batch=10)
    assert r["seconds"] == pytest.approx(2.0)  # from 1.0 (the later start) to 3.0 (the earlier end)
    # worker 0 ends 20 batches in (1.0, 3.0], worker 1 ends 10: 300 examples in 2 s
    assert r["examples"] == 300 and r["examples_per_s"] == pytest.approx(150.0)
    # a sum of the workers' own rates would say 100 + 50 = 150 here too, but not when one is idle meanwhile:
    w1_late = {"batch_end_wall": [3.5 + 0.2 * i for i in range(6)]}
    assert joint_rate([w0, w1_late], batch=10) is None  # no moment in which both train
    assert joint_rate([w0, {}], batch=10) is None


def test_the_ps_cpu_report_cost_benchmark_measures_both_variants_on_a_real_store():
    from benchmarks import ps_cpu_report_cost

    result = ps_cpu_report_cost.measure(calls=50, rounds=2, size=4)
    assert set(result["us_per_call"]) == {"without", "with"}
    assert all(len(v) == 2 and all(x > 0 for x in v) for v in result["us_per_call"].values())
    assert result["added_us_per_call"] == round(result["median_us_per_call"]["with"]
                                                - result["median_us_per_call"]["without"], 2)
