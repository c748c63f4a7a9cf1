"""A job's only training worker (async) runs its steps without a per-step exchange (issue #12, item 9).

README "One worker": nobody else writes to the PS, so the worker's local
values are the job's. Its steps are Keras's own step plus a step counter (no
``tf.py_function``), and a background thread sends their summed update every
``strategy.lone_worker_exchange_s`` (and before every pull, checkpoint, local
write and at the end). Checked here: nothing of the per-step exchange runs
during ``fit``; the weights equal plain Keras's; the PS learns of the steps
while ``fit`` still runs and ends holding exactly the local state; a local
write after training can be discarded without losing the steps; a PS task
killed mid-fit (real processes, launcher restart from a checkpoint) is
recovered from in the background; a PS that is gone for good stops ``fit``
with an error that says so.
"""

import json
import os
import sys
import time

import numpy as np
import pytest

from tfdist.config import JobConfig
from tfdist.datasets import load_digits
from tfdist.testing import LocalCluster

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "scripts"))
from durability_faults import EVERY, PAUSE_AT, STEPS, checkpoint_files, kill_ps1, wait_for_file, wait_until  # noqa: E402
from digits_mlp import sgd_mlp as _model  # noqa: E402  (the single-process tests' MLP)

pytestmark = pytest.mark.timeout(300)

TOKEN = "a-token-123"


@pytest.fixture
def ps_server(no_cluster):
    """A PS task in this process (real gRPC on 127.0.0.1) for a job of one worker."""
    from tfdist.ps.server import PSServer

    server = PSServer(None, token=TOKEN, num_workers=1).start()
    yield server
    server.stop(0)


def _strategy(server, **strategy):
    import tfdist

    # a PS gone for good is given up on within seconds (a call waits for it up to ps.rpc_timeout_s)
    config = JobConfig.from_dict({"strategy": strategy, "ps": {"reconnect_timeout_s": 3, "rpc_timeout_s": 4}})
    return tfdist.ParameterServerStrategy(cluster={"worker": ["127.0.0.1:1"], "ps": [server.address]},
                                          task="worker:0", token=TOKEN, config=config)


def _ps_batches(runtime) -> int:
    """The batches the PS counted for worker 0, read without sending this worker's held steps first."""
    meta, _ = runtime.session.client.call(0, "Status", {"brief": True})
    return int(meta["worker_batches"].get("0", 0))


def _assert_the_ps_holds_the_local_state(strategy, model):
    """A pull that drops local writes leaves the weights as they were (up to float rounding): the PS holds them."""
    trained = model.get_weights()
    strategy.pull(keep_local_writes=False)
    for got, want in zip(model.get_weights(), trained):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_a_lone_worker_steps_without_an_exchange_and_trains_as_plain_keras(ps_server, monkeypatch):
    import keras

    data = load_digits()
    x, y = data.x_train.reshape(-1, 64), data.y_train
    plain = _model()
    plain.fit(x, y, batch_size=32, epochs=3, shuffle=False, verbose=0)

    strategy = _strategy(ps_server, lone_worker_exchange_s=0.05)
    runtime = strategy._runtime
    calls = []
    for name in ("begin_step", "end_step"):  # the per-step exchange of a job with several workers
        original = getattr(runtime, name)
        monkeypatch.setattr(runtime, name, lambda *a, _o=original, _n=name, **k: (calls.append(_n), _o(*a, **k))[1])
    seen_during_fit = []

    class PSLearnsOfTheSteps(keras.callbacks.Callback):
        """After the first epoch the background exchange, not a read, brings the steps to the PS (bounded)."""

        def on_epoch_end(self, epoch, logs=None):
            if epoch == 0:
                deadline = time.monotonic() + 20
                while _ps_batches(runtime) == 0 and time.monotonic() < deadline:
                    time.sleep(0.02)
                seen_during_fit.append(_ps_batches(runtime))

    try:
        with strategy.scope():
            model = _model()
        history = model.fit(x, y, batch_size=32, epochs=3, shuffle=False, verbose=0,
                            callbacks=[PSLearnsOfTheSteps()])
        steps = 3 * int(np.ceil(len(x) / 32))
        assert calls == [], calls[:5]
        assert runtime.local_only() and runtime.lone_worker
        assert seen_during_fit and seen_during_fit[0] > 0, seen_during_fit
        assert history.history["ps_step"][-1] == steps
        for got, want in zip(model.get_weights(), plain.get_weights()):
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)

        assert strategy.ps_status()[0]["worker_batches"] == {"0": steps}  # every step, exactly once
        trained = model.get_weights()
        strategy.pull(keep_local_writes=False)  # the PS holds the local state (up to float rounding)
        for got, want in zip(model.get_weights(), trained):
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)

        # A local write after training: the steps reach the PS before it, so discarding it keeps them.
        model.set_weights([np.zeros_like(w) for w in trained])
        strategy.pull(keep_local_writes=False)
        for got, want in zip(model.get_weights(), trained):
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    finally:
        strategy.shutdown()


def test_a_fit_after_leaving_takes_part_in_the_job_again(ps_server):
    """LeaveOnTrainEnd, then a second fit: its local-only steps bring the worker back and reach the PS."""
    import tfdist

    data = load_digits()
    x, y = data.x_train[:320].reshape(-1, 64), data.y_train[:320]
    strategy = _strategy(ps_server, lone_worker_exchange_s=0.05)
    try:
        with strategy.scope():
            model = _model()
        model.fit(x, y, batch_size=32, epochs=1, verbose=0, callbacks=[tfdist.callbacks.LeaveOnTrainEnd()])
        assert strategy._runtime.lifecycle.left
        model.fit(x, y, batch_size=32, epochs=1, verbose=0)
        assert strategy.ps_status()[0]["worker_batches"] == {"0": 20}
        assert not strategy._runtime.lifecycle.left
        _assert_the_ps_holds_the_local_state(strategy, model)
    finally:
        strategy.shutdown()


def test_a_read_of_the_ps_waits_for_the_background_exchange_in_flight(ps_server, monkeypatch):
    """ps_status() right after the background thread took the last steps (their exchange still in flight): it
    counts them, and the values it pulls afterwards are the local ones (the exchange is slowed by 1 s here)."""
    from tfdist.ps.update_session import UpdateSession

    data = load_digits()
    x, y = data.x_train[:320].reshape(-1, 64), data.y_train[:320]
    strategy = _strategy(ps_server, lone_worker_exchange_s=60)  # no exchange of its own during the test
    runtime = strategy._runtime
    try:
        with strategy.scope():
            model = _model()
        model.fit(x, y, batch_size=32, epochs=1, verbose=0)
        original = UpdateSession._exchange_once

        def slow(self, *args, **kwargs):
            time.sleep(1.0)  # an injected delay: a slow link or a loaded PS
            return original(self, *args, **kwargs)

        monkeypatch.setattr(UpdateSession, "_exchange_once", slow)
        runtime.schedule.exchange_now(runtime)  # what the background thread does: takes the 10 steps, sends them
        assert runtime._unsent_steps == 0 and runtime.session._exchange is not None  # in flight
        assert strategy.ps_status()[0]["worker_batches"] == {"0": 10}
        _assert_the_ps_holds_the_local_state(strategy, model)
    finally:
        strategy.shutdown()


def test_zero_exchanges_after_every_step_as_with_several_workers(ps_server, monkeypatch):
    """``lone_worker_exchange_s: 0``: the schedule of a job with several workers (here every step)."""
    strategy = _strategy(ps_server, lone_worker_exchange_s=0, exchange_every=1)
    runtime = strategy._runtime
    ends = []
    original = runtime.end_step
    monkeypatch.setattr(runtime, "end_step", lambda *a, **k: (ends.append(1), original(*a, **k))[1])
    data = load_digits()
    try:
        with strategy.scope():
            model = _model()
        model.fit(data.x_train[:256].reshape(-1, 64), data.y_train[:256], batch_size=32, epochs=1, verbose=0)
        assert not runtime.lone_worker and not runtime.local_only()
        assert len(ends) == 8
    finally:
        strategy.shutdown()


def test_a_ps_gone_for_good_stops_fit_with_an_error_that_says_so(ps_server):
    import keras
    import tensorflow as tf

    strategy = _strategy(ps_server, lone_worker_exchange_s=0.05)
    runtime = strategy._runtime

    class StopThePS(keras.callbacks.Callback):
        """Stops the PS after batch 5; after the next batch (a step the PS has not seen) waits for the failure."""

        def on_train_batch_end(self, batch, logs=None):
            if batch == 5:
                ps_server.stop(0)
            elif batch == 6:
                deadline = time.monotonic() + 60  # ps.rpc_timeout_s (4 s, twice), ps.reconnect_timeout_s (3 s)
                while runtime.schedule.error is None and time.monotonic() < deadline:
                    time.sleep(0.05)

    data = load_digits()
    try:
        with strategy.scope():
            model = _model()
        with pytest.raises(tf.errors.InvalidArgumentError, match="background exchange with the parameter servers"):
            model.fit(data.x_train.reshape(-1, 64), data.y_train, batch_size=32, epochs=3, verbose=0,
                      callbacks=[StopThePS()])
        assert runtime.schedule.error is not None
        with pytest.raises(type(runtime.schedule.error)):  # a read says why too
            strategy.pull()
    finally:
        strategy.shutdown()


def test_a_lone_worker_recovers_from_a_killed_ps_in_the_background(tmp_path, scripts_dir):
    """Real processes: 1 worker, 2 PS tasks with checkpoints; ps:1 SIGKILLed while the worker is paused."""
    config = JobConfig(name="lone")
    config.ps.checkpoint_dir = str(tmp_path / "ckpt")
    config.ps.checkpoint_every_steps, config.ps.checkpoint_every_s = EVERY, None
    out = tmp_path / "out"
    out.mkdir()
    with LocalCluster(workers=1, ps=2, config=config, log_dir=str(tmp_path / "logs")) as cluster:
        cluster.start(os.path.join(scripts_dir, "durability_worker.py"),
                      ["--out", str(out), "--mode", "async", "--steps", str(STEPS), "--pause-at", str(PAUSE_AT)])
        # The lone worker sends its steps in the background (every lone_worker_exchange_s), and ps:1 writes
        # its checkpoint on a thread of its own: wait (bounded) until one is on disk, so the restart has one
        # to restore. (Killed at once, under load a kill could come first: seen once in a parallel run.)
        wait_for_file(cluster, str(out / "paused"), 240)
        wait_until(cluster, "a complete checkpoint of ps:1", lambda: checkpoint_files(tmp_path / "ckpt" / "ps-1")[0], 120)
        before = kill_ps1(cluster, out)
        cluster.wait(240)
        log = cluster.log("worker:0")
        restarts = dict(cluster.job.restarts)
    result = json.load(open(out / "worker-0.json"))
    assert restarts == {"ps:1": 1}
    assert result["lone_worker"], log[-3000:]
    assert result["steps"] == STEPS and result["recoveries"] >= 1, log[-3000:]
    after = result["ps_status"][1]
    assert after["incarnation"] != before["incarnation"] and after["restored_from"] is not None
    # every batch reached ps:0 (never lost); the restarted ps:1 holds a checkpoint's plus what came after
    assert int(result["ps_status"][0]["worker_batches"]["0"]) == STEPS
    assert result["accuracy"] > 0.85, result["accuracy"]
    print(f"lone worker: accuracy {result['accuracy']:.4f} after ps:1 was killed (restored from step "
          f"{after['restored_from']}; progress before the kill {before['progress']})")
