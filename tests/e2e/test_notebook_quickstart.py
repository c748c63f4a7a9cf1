"""The quickstart notebook runs headless from top to bottom (so it cannot rot)."""

import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.timeout(400)
def test_quickstart_notebook_executes(tmp_path, monkeypatch):
    import nbformat
    from nbclient import NotebookClient

    path = os.path.join(ROOT, "colab", "01_parameter_server_quickstart.ipynb")
    nb = nbformat.read(path, as_version=4)
    monkeypatch.delenv("MPLBACKEND", raising=False)  # the kernel uses its inline backend
    NotebookClient(nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}).execute()
    outputs = "".join(
        o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
    )
    assert "test accuracy" in outputs and "done" in outputs
    assert any("image/png" in o.get("data", {}) for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []))
