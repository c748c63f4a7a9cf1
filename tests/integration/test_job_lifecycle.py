"""A job started task by task ends by itself: every process, parameter servers included, exits 0.

No launcher watches these jobs (as under Kubeflow, or one ``--task`` launch per
machine): each task is its own process with its own ``TF_CONFIG``, and nothing
is killed. The parameter-server tasks must exit because every worker said it
is done, which a worker does at interpreter exit (issue #12: with two PS tasks
that message needed a thread pool Python had already shut down, so the PS
tasks served forever).
"""

import pytest

TOKEN = "lifecycle-test-token"

pytestmark = pytest.mark.timeout(300)


def test_calls_to_several_ps_tasks_go_out_one_by_one_when_no_thread_can_take_them():
    """At interpreter exit ``concurrent.futures`` refuses new work; a worker's last calls must still go out."""
    from tfdist.ps.client import PSClient
    from tfdist.ps.server import PSServer

    servers = [PSServer(None, token=TOKEN, num_workers=2, task_index=i).start() for i in range(2)]
    client = PSClient([s.address for s in servers], TOKEN, rpc_timeout_s=10)
    try:
        assert sorted(client.call_all("Status", {"brief": True})) == [0, 1]  # in parallel: starts the pool
        client._executor().shutdown()  # what Python's exit does to every pool before atexit hooks run
        assert sorted(client.call_all("Status", {"brief": True})) == [0, 1]
        assert sorted(client.call_all("Done", {"worker": 0}, parallel=False)) == [0, 1]
        assert all(s.store.done_workers == {0} for s in servers)
    finally:
        client.close()
        for s in servers:
            s.stop(0)


def test_a_worker_that_left_after_fit_evaluates_and_takes_part_again_in_its_next_fit(monkeypatch):
    import keras
    import numpy as np

    import tfdist

    monkeypatch.delenv("TF_CONFIG", raising=False)
    monkeypatch.delenv("TFDIST_CONFIG", raising=False)
    strategy = tfdist.BSPStrategy()  # no cluster: one worker and an in-process PS
    try:
        rng = np.random.default_rng(0)
        x, y = rng.normal(size=(32, 4)).astype("float32"), rng.integers(0, 3, 32)
        with strategy.scope():
            model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])
            model.compile(optimizer="sgd", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        model.fit(x, y, batch_size=8, epochs=1, verbose=0, callbacks=[tfdist.callbacks.LeaveOnTrainEnd()])
        assert strategy.ps_status()[0]["global_step"] == 4
        assert np.isfinite(model.evaluate(x, y, verbose=0))  # reads like an evaluator now
        model.fit(x, y, batch_size=8, epochs=1, verbose=0)  # back in the job
        status = strategy.ps_status()[0]
        assert status["global_step"] == 8 and status["worker_batches"] == {"0": 8}
        assert status["live_workers"] == [0]
    finally:
        strategy.shutdown()
