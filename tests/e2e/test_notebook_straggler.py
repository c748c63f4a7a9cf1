"""Executes colab/03_straggler_detection.ipynb headless (nbclient, python3 kernel): it must draw its plot."""

import pytest


@pytest.mark.timeout(400)
def test_straggler_notebook_runs_and_plots(run_notebook):
    run = run_notebook("03_straggler_detection.ipynb", timeout=300)
    assert not run.errors, run.errors
    assert "detected workers:" in run.text
    assert "straggler_threshold" in run.text
    assert run.has_image, "no plot was drawn"
