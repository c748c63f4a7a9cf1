"""The consistency-and-stragglers notebook runs headless from top to bottom and draws its plot."""

import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.timeout(600)
def test_consistency_notebook_executes(tmp_path, monkeypatch):
    import nbformat
    from nbclient import NotebookClient

    path = os.path.join(ROOT, "colab", "02_consistency_and_stragglers.ipynb")
    nb = nbformat.read(path, as_version=4)
    monkeypatch.delenv("MPLBACKEND", raising=False)  # the kernel uses its inline backend
    for name in ("TF_CONFIG", "TFDIST_CONFIG", "TFDIST_SLOWDOWN"):
        monkeypatch.delenv(name, raising=False)
    NotebookClient(nb, timeout=500, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}).execute()
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    text = "".join(o.get("text", "") for o in outputs)
    assert "done" in text
    for mode in ("BSP", "SyncReplicas", "ASP", "SSP(3)", "DTSSP(3..10)"):
        assert mode in text
    assert any("image/png" in o.get("data", {}) for o in outputs)
    assert not any(o.get("output_type") == "error" for o in outputs)
