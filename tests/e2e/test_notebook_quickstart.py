"""The quickstart notebook runs headless from top to bottom (so it cannot rot)."""

import pytest


@pytest.mark.timeout(400)
def test_quickstart_notebook_executes(run_notebook):
    run = run_notebook("01_parameter_server_quickstart.ipynb", timeout=300)
    assert "test accuracy" in run.text and "done" in run.text
    assert run.has_image
