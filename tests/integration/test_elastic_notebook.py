"""Executes colab/06_elastic_autoscaling.ipynb headless (nbclient, python3 kernel): a real elastic job settles below max."""

import pathlib
import re

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

NOTEBOOK = pathlib.Path(__file__).resolve().parents[2] / "colab" / "06_elastic_autoscaling.ipynb"

pytestmark = pytest.mark.timeout(300)


def test_elastic_notebook_grows_settles_below_max_and_plots(tmp_path, monkeypatch):
    nb = nbformat.read(NOTEBOOK, as_version=4)
    monkeypatch.delenv("MPLBACKEND", raising=False)  # the inline backend then emits image/png
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "2")
    for name in ("TF_CONFIG", "TFDIST_CONFIG", "TFDIST_SLOWDOWN", "TFDIST_WARMUP_BATCHES"):
        monkeypatch.delenv(name, raising=False)
    client = nbclient.NotebookClient(nb, timeout=260, kernel_name="python3",
                                     resources={"metadata": {"path": str(tmp_path)}})
    client.execute()
    outputs = [o for cell in nb.cells if cell.cell_type == "code" for o in cell.get("outputs", [])]
    errors = [o for o in outputs if o.get("output_type") == "error"]
    assert not errors, errors
    text = "\n".join(o.get("text", "") for o in outputs)
    assert "scale_up" in text and "s = " in text  # decisions printed with their numbers
    final = "".join(o.get("text", "") for o in nb.cells[-2].get("outputs", []))  # the "Where it settled" cell
    m = re.search(r"settled at (\d+) worker\(s\) of at most (\d+)", final)
    assert m, final
    settled, most = int(m.group(1)), int(m.group(2))
    assert 2 <= settled < most  # it grew from 1 and stopped at the knee, not at max_workers
    m = re.search(r"the step (\d+) -> (\d+) failed with s = (-?[\d.]+)", final)
    assert m and int(m.group(1)) == settled and float(m.group(3)) <= 0.1, final
    assert any("image/png" in o.get("data", {}) for o in outputs), "no plot was drawn"
