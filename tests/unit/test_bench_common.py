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
    for name in ("parameter-server", "federated", "straggler", "consistency", "autoscaling", "sparse-scaling"):
        begin, end = _common.section_markers(name)
        assert text.count(begin) == 1 and text.count(end) == 1 and text.index(begin) < text.index(end), name
