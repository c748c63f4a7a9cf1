"""Executes colab/06_elastic_autoscaling.ipynb headless (nbclient, python3 kernel): a real elastic job settles below max."""

import re

import pytest

pytestmark = pytest.mark.timeout(300)


def test_elastic_notebook_grows_settles_below_max_and_plots(run_notebook):
    run = run_notebook("06_elastic_autoscaling.ipynb", timeout=260)
    assert not run.errors, run.errors
    assert "scale_up" in run.text and "s = " in run.text  # decisions printed with their numbers
    final = run.cell_text(-2)  # the "Where it settled" cell
    m = re.search(r"settled at (\d+) worker\(s\) of at most (\d+)", final)
    assert m, final
    settled, most = int(m.group(1)), int(m.group(2))
    assert 2 <= settled < most  # it grew from 1 and stopped at the knee, not at max_workers
    m = re.search(r"the step (\d+) -> (\d+) failed with s = (-?[\d.]+)", final)
    assert m and int(m.group(1)) == settled and float(m.group(3)) <= 0.1, final
    assert run.has_image, "no plot was drawn"
