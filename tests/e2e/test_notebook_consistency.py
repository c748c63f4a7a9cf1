"""The consistency-and-stragglers notebook runs headless from top to bottom and draws its plot."""

import pytest


@pytest.mark.timeout(600)
def test_consistency_notebook_executes(run_notebook):
    run = run_notebook("02_consistency_and_stragglers.ipynb", timeout=500)
    assert "done" in run.text
    for mode in ("BSP", "SyncReplicas", "ASP", "SSP(3)", "DTSSP(3..10)"):
        assert mode in run.text
    assert run.has_image
    assert not run.errors
