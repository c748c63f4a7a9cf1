"""Executes colab/04_queue_input_pipeline.ipynb headless (nbclient, python3 kernel)."""

import os
import pathlib

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

NOTEBOOK = pathlib.Path(__file__).resolve().parents[2] / "colab" / "04_queue_input_pipeline.ipynb"


def test_queue_input_pipeline_notebook_runs(tmp_path):
    nb = nbformat.read(NOTEBOOK, as_version=4)
    client = nbclient.NotebookClient(
        nb,
        timeout=120,  # per cell
        kernel_name="python3",
        resources={"metadata": {"path": str(tmp_path)}},
    )
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    client.execute()
    outputs = "\n".join(
        o.get("text", "") for cell in nb.cells if cell.cell_type == "code" for o in cell.get("outputs", [])
    )
    assert "re-raised in the training thread: ValueError" in outputs
    assert "re-delivered batches: 1" in outputs
