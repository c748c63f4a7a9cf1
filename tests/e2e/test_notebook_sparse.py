"""The sparse-embeddings notebook runs headless: a CTR model with PS-resident tables on 2 PS, vs a replicated one."""

import pytest


@pytest.mark.timeout(300)
def test_sparse_embeddings_notebook_executes(run_notebook):
    run = run_notebook("07_sparse_embeddings.ipynb", timeout=200)
    assert "rows i with i % 2 == 0" in run.text and "rows per PS task [" in run.text
    assert "ps:1 holds t000/deep_table" in run.text
    assert "the replicated table pushes" in run.text and "done" in run.text
    assert "ps:1 dynamic t000/deep_table" in run.text and "with dynamic tables" in run.text  # section 7
    assert run.has_image
    assert not run.errors
