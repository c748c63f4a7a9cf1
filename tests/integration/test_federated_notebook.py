"""Executes colab/05_federated_simulation.ipynb headless (nbclient, python3 kernel)."""


def test_federated_notebook_runs(run_notebook):
    # In-process workers: the same results as the process pool (tested in
    # test_federated_processes.py) without three pool start-ups on 2 cores.
    run = run_notebook("05_federated_simulation.ipynb", timeout=120, env={"TFDIST_NOTEBOOK_WORKERS": "0"})
    assert "100 clients" in run.text
    assert "median beats FedAvg under attack: True" in run.text
    assert run.has_image, "no plot was drawn"
