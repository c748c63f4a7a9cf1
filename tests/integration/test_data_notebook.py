"""Executes colab/04_queue_input_pipeline.ipynb headless (nbclient, python3 kernel)."""


def test_queue_input_pipeline_notebook_runs(run_notebook):
    run = run_notebook("04_queue_input_pipeline.ipynb", timeout=120)
    assert "re-raised in the training thread: ValueError" in run.text
    assert "re-delivered batches: 1" in run.text
