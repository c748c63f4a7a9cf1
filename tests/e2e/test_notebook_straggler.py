"""Executes colab/03_straggler_detection.ipynb headless (nbclient, python3 kernel): it must draw its plot."""

import pathlib

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

NOTEBOOK = pathlib.Path(__file__).resolve().parents[2] / "colab" / "03_straggler_detection.ipynb"


def test_straggler_notebook_runs_and_plots(tmp_path, monkeypatch):
    nb = nbformat.read(NOTEBOOK, as_version=4)
    monkeypatch.delenv("MPLBACKEND", raising=False)  # the inline backend then emits image/png
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "2")
    client = nbclient.NotebookClient(nb, timeout=600, kernel_name="python3",
                                     resources={"metadata": {"path": str(tmp_path)}})
    client.execute()
    outputs = [o for cell in nb.cells if cell.cell_type == "code" for o in cell.get("outputs", [])]
    errors = [o for o in outputs if o.get("output_type") == "error"]
    assert not errors, errors
    text = "\n".join(o.get("text", "") for o in outputs)
    assert "detected workers:" in text
    assert "straggler_threshold" in text
    assert any("image/png" in o.get("data", {}) for o in outputs), "no plot was drawn"
