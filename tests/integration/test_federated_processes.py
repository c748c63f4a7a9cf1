"""The federated simulator's process pool: same results as in-process, crashes stop it cleanly."""

import json
import multiprocessing as mp
import os
import subprocess
import sys

import numpy as np
import pytest

from tfdist import federated as fl
from tfdist.federated.testing import CrashingClientUpdate
from tfdist.testing import run_python

pytestmark = pytest.mark.integration

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _stacks_if_slow(seconds=20.0):
    """Every thread's stack on stderr if the set-up below takes longer than ``seconds`` (it goes on).

    The first test's set-up took ~77 s in two full runs (sessions 7 and 9), never alone; this shows where.
    """
    import contextlib
    import faulthandler

    @contextlib.contextmanager
    def guard():
        faulthandler.dump_traceback_later(seconds, exit=False)
        try:
            yield
        finally:
            faulthandler.cancel_dump_traceback_later()

    return guard()


@pytest.fixture(scope="module", autouse=True)
def _resource_tracker():
    """Starts multiprocessing's resource tracker (one per interpreter, lives until
    pytest exits) before the per-test leak check takes its snapshot."""
    from multiprocessing import resource_tracker

    with _stacks_if_slow():
        resource_tracker.ensure_running()


@pytest.fixture
def no_children_left():
    """Fails (after killing them) if a test leaves multiprocessing children alive."""
    yield
    alive = mp.active_children()
    for p in alive:
        p.kill()
        p.join(5)
    assert not alive, f"children left running: {alive}"


@pytest.fixture(scope="module")
def small():
    with _stacks_if_slow():
        (x, y), test = fl.load_digits_split(seed=0)
        return fl.partition(x, y, num_clients=30, scheme="dirichlet", alpha=0.5, seed=0), test


def _sim(data, test, num_workers, **kwargs):
    return fl.Simulation(
        fl.make_mlp, data, test_data=test, num_workers=num_workers, progress=False,
        client={"learning_rate": 0.3, "batch_size": 16}, task_timeout_s=120, start_timeout_s=240, **kwargs,
    )


def test_parallel_and_sequential_give_the_same_result(small, no_children_left):
    data, test = small
    kwargs = dict(
        strategy=fl.FedAvg(clients_per_round=10, staleness_exponent=0.5), rounds=6,
        delays=fl.LogNormalDelay(seconds_per_example=0.02, network_s=0.3), round_deadline_s=0.8,
        byzantine={"fraction": 0.1, "attack": "random_noise"}, seed=3,
    )
    sequential = _sim(data, test, 0, **kwargs)
    h_seq = sequential.run()
    parallel = _sim(data, test, 2, **kwargs)
    h_par = parallel.run()
    key = lambda h: [(u.client_id, u.round_dispatched, u.round_applied, u.arrival_time) for u in h.updates]
    assert key(h_par) == key(h_seq)
    assert any(u.staleness > 0 for u in h_par.updates)
    assert {u.worker for u in h_par.updates} == {"train-worker-0", "train-worker-1"}
    for a, b in zip(parallel.global_weights, sequential.global_weights):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(h_par.accuracy, h_seq.accuracy, atol=1 / len(test[1]) + 1e-9)
    assert h_par.worker_utilisation > 0 and set(h_par.worker_busy_s) == {"train-worker-0", "train-worker-1"}
    assert all(p is None or not os.path.exists(f"/proc/{p}") or _is_zombie(p) for p in parallel.backend.pids)


def _is_zombie(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] == "Z"
    except OSError:
        return True


def test_worker_exception_stops_the_run_with_its_traceback(small, no_children_left):
    data, _ = small
    update = CrashingClientUpdate(fail_after=2, message="boom")
    sim = _sim(data, None, 2, strategy=fl.FedAvg(clients_per_round=5), rounds=3, client_update=update)
    with pytest.raises(fl.WorkerCrashedError, match=r"boom \(client \d+\)") as err:
        sim.run()
    assert err.value.worker.startswith("train-worker-")
    assert "Traceback" in err.value.remote_traceback and "RuntimeError: boom" in err.value.remote_traceback
    assert "in train" in err.value.remote_traceback
    assert not mp.active_children()


def test_dead_worker_is_noticed_and_the_others_are_stopped(small, no_children_left):
    data, test = small
    sim = _sim(data, test, 2, strategy=fl.FedAvg(clients_per_round=5), rounds=3, client_update=CrashingClientUpdate(exit_code=7))
    with pytest.raises(fl.WorkerCrashedError, match="exit code 7"):
        sim.run()
    assert not mp.active_children()


def test_command_line_runs_a_config(tmp_path):
    out = tmp_path / "history.json"
    cmd = [sys.executable, "-m", "tfdist.federated", "--config", os.path.join(ROOT, "configs", "fl_fedavg_digits.yaml"),
           "--rounds", "3", "--num-workers", "1", "--no-progress", "--output", str(out), "--log-level", "WARNING"]
    proc = run_python(cmd, {**os.environ}, timeout=280, cwd=ROOT)  # forked from the zygote under fast start
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(proc.stdout)
    assert summary["rounds"] == 3 and len(summary["accuracy"]) == 4
    saved = json.loads(out.read_text())
    assert saved["summary"]["final_accuracy"] == summary["final_accuracy"]
    assert saved["config"]["num_workers"] == 1 and saved["updates"][0]["worker"] == "train-worker-0"


def test_workers_end_when_the_main_process_is_killed(tmp_path):
    """A worker forked from the pool's fork server (fast start; its parent is the fork server, not the main process)
    leaves by itself when the main process dies: the fork server ends with the main process, and the
    worker's parent changes. The fork server imports nothing here: the test is about the exit, not the
    preload (which test_parallel_and_sequential_give_the_same_result uses)."""
    import signal
    import time

    script = tmp_path / "main.py"
    script.write_text(
        "import os, sys, time\n"
        "from tfdist.federated import _backend\n"
        "_backend.FORKSERVER_PRELOAD = ()\n"
        "def wait_for_the_main_process(pid):  # as a worker's queue waits do between gets\n"
        "    if _backend._parent_alive(pid):\n"
        "        print('watching', flush=True)\n"
        "    while _backend._parent_alive(pid):\n"
        "        time.sleep(0.1)\n"
        "if __name__ == '__main__':\n"
        "    ctx = _backend._context()\n"
        "    p = ctx.Process(target=wait_for_the_main_process, args=(os.getpid(),), daemon=True)\n"
        "    p.start()\n"
        "    print(ctx.get_start_method(), p.pid, flush=True)\n"
        "    p.join(60)  # bounded: ends at once only if the worker wrongly thinks the main process is gone\n"
        "    print('worker ended', p.exitcode, flush=True)\n"
        "    time.sleep(300)\n"
    )
    main = subprocess.Popen([sys.executable, str(script)], cwd=ROOT, stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "TFDIST_FAST_START": "1"})
    try:
        method, worker = main.stdout.readline().split()
        worker = int(worker)
        assert method == "forkserver"
        with open(f"/proc/{worker}/stat") as f:
            assert int(f.read().rsplit(")", 1)[1].split()[1]) != main.pid  # forked by the fork server
        line = main.stdout.readline()  # the worker's, or the main's once the worker ended (bounded: 60 s)
        assert line == "watching\n", line  # the worker sees the main process alive behind its fork server
    finally:
        main.send_signal(signal.SIGKILL)
        main.wait(10)
    deadline = time.monotonic() + 30
    while os.path.exists(f"/proc/{worker}") and not _is_zombie(worker) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not os.path.exists(f"/proc/{worker}") or _is_zombie(worker), "a worker outlived the main process"
