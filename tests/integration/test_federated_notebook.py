"""Executes colab/05_federated_simulation.ipynb headless (nbclient, python3 kernel)."""

import os
import pathlib

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

NOTEBOOK = pathlib.Path(__file__).resolve().parents[2] / "colab" / "05_federated_simulation.ipynb"


def test_federated_notebook_runs(tmp_path, monkeypatch):
    nb = nbformat.read(NOTEBOOK, as_version=4)
    # In-process workers: the same results as the process pool (tested in
    # test_federated_processes.py) without three pool start-ups on 2 cores.
    monkeypatch.setenv("TFDIST_NOTEBOOK_WORKERS", "0")
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "2")
    client = nbclient.NotebookClient(
        nb, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    )
    client.execute()
    outputs = [o for cell in nb.cells if cell.cell_type == "code" for o in cell.get("outputs", [])]
    text = "\n".join(o.get("text", "") for o in outputs)
    assert "100 clients" in text
    assert "median beats FedAvg under attack: True" in text
    assert any("image/png" in o.get("data", {}) for o in outputs), "no plot was drawn"
