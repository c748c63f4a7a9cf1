"""A job started task by task ends by itself: every process, parameter servers included, exits 0.

No launcher watches these jobs (as under Kubeflow, or one ``--task`` launch per
machine): each task is its own process with its own ``TF_CONFIG``, and nothing
is killed. The parameter-server tasks must exit because every worker said it
is done, which a worker does at interpreter exit (issue #12: with two PS tasks
that message needed a thread pool Python had already shut down, so the PS
tasks served forever).
"""

import json
import os
import sys
import time

import pytest

from tfdist.cluster import zygote
from tfdist.cluster.local import free_port
from tfdist.cluster.process import TaskProcess
from tfdist.config import TaskSpec

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXAMPLE = os.path.join(ROOT, "examples", "train_digits.py")
EXAMPLE_ARGS = ["--dataset", "digits", "--epochs", "3", "--eval-interval", "0.5"]
TOKEN = "lifecycle-test-token"

pytestmark = pytest.mark.timeout(300)
#: Each task forked from the zygote when fast start is on (the suite's default), as a launcher starts its tasks:
#: the same command line and the same interpreter exit (atexit, thread joins) without importing TensorFlow anew.
#: ``TFDIST_FAST_START=0`` starts every task as a fresh interpreter.
FAST = zygote.fast_start_enabled()


def _cluster(jobs):
    return {job: [f"127.0.0.1:{free_port()}" for _ in range(n)] for job, n in jobs.items() if n}


def _base_env():
    env = {k: v for k, v in os.environ.items() if k not in ("TF_CONFIG", "TFDIST_CONFIG")}
    env.update(TF_CPP_MIN_LOG_LEVEL="2", TF_NUM_INTRAOP_THREADS="1", PYTHONUNBUFFERED="1", TFDIST_TOKEN=TOKEN)
    return env


def _wait_all_exit(procs, timeout):
    """Waits (bounded) for every process to exit by itself; returns {task: exit code}."""
    deadline = time.monotonic() + timeout
    codes = {}
    for key, proc in procs.items():
        codes[key] = proc.wait(max(deadline - time.monotonic(), 0.1))
    return codes


def _describe(procs, codes):
    return "\n".join(f"--- {k} (exit {codes.get(k)}): {p.log_path}\n" + "\n".join(list(p.tail)[-12:])
                     for k, p in procs.items())


def _run_job(tmp_path, order, argv_of, env_of, train_timeout=150, end_timeout=20):
    """Starts one process per task; asserts the training tasks, then all the others, exit 0 by themselves."""
    procs = {}
    try:
        for task in order:
            procs[str(task)] = TaskProcess(task, argv_of(task), env_of(task),
                                           log_path=str(tmp_path / "logs" / f"{task.job}-{task.index}.log"),
                                           forward_stdout=False, forward_stderr=False, fast_start=FAST).start()
        training = {k: p for k, p in procs.items() if p.task.job in ("chief", "worker")}
        codes = _wait_all_exit(training, train_timeout)
        assert all(c == 0 for c in codes.values()), _describe(procs, codes)
        # The rest (PS tasks, evaluator) end because the workers are done: nothing stops them.
        codes.update(_wait_all_exit({k: p for k, p in procs.items() if k not in training}, end_timeout))
        assert all(c == 0 for c in codes.values()), (
            f"not every task exited 0 within {end_timeout} s of the workers (None: still running)\n"
            + _describe(procs, codes))
        return procs
    finally:
        for p in procs.values():
            if p.running:
                p.kill()


# The same job across emulated hosts runs in the default suite (test_multihost.py, as root, as CI runs it);
# these two on 127.0.0.1 run with RUN_SLOW=1 (.ci/run's second command).
@pytest.mark.slow
def test_tf_config_job_with_two_ps_and_an_evaluator_ends_by_itself(tmp_path):
    """The example script on every task of a TF_CONFIG job (chief, worker, 2 ps, evaluator)."""
    cluster = _cluster({"chief": 1, "worker": 1, "ps": 2, "evaluator": 1})
    order = [TaskSpec("ps", 0), TaskSpec("ps", 1), TaskSpec("evaluator", 0), TaskSpec("chief", 0),
             TaskSpec("worker", 0)]

    def env_of(task):
        return {**_base_env(), "TF_CONFIG": json.dumps({"cluster": cluster,
                                                         "task": {"type": task.job, "index": task.index}})}

    procs = _run_job(tmp_path, order, lambda task: [sys.executable, EXAMPLE, *EXAMPLE_ARGS], env_of)
    logs = {k: open(p.log_path).read() for k, p in procs.items()}
    for key in ("ps:0", "ps:1"):
        assert "all 2 workers are done; stopping" in logs[key], logs[key][-2000:]
    assert "worker 0: final test accuracy" in logs["chief:0"]
    assert "worker 1: final test accuracy" in logs["worker:0"]
    # The evaluator evaluated the PS values while the job trained, then saw it end.
    evaluations = [line for line in logs["evaluator:0"].splitlines() if line.startswith("evaluator: PS version")]
    assert evaluations, logs["evaluator:0"][-3000:]
    assert "evaluator: training is over after" in logs["evaluator:0"]


@pytest.mark.slow
def test_task_launches_with_two_ps_end_by_themselves(tmp_path):
    """``python -m tfdist.launch --config FILE --task ps:0`` etc., one launch per task (one per machine)."""
    cluster = _cluster({"chief": 1, "worker": 1, "ps": 2})
    config = tmp_path / "job.yaml"
    config.write_text(json.dumps({"name": "lifecycle", "cluster": cluster}))
    order = [TaskSpec("ps", 0), TaskSpec("ps", 1), TaskSpec("chief", 0), TaskSpec("worker", 0)]

    def argv_of(task):
        script = [] if task.job == "ps" else [EXAMPLE, *EXAMPLE_ARGS]
        return [sys.executable, "-m", "tfdist.launch", "--config", str(config), "--task", str(task), *script]

    procs = _run_job(tmp_path, order, argv_of, lambda task: _base_env())
    for key in ("ps:0", "ps:1"):
        assert "all 2 workers are done; stopping" in open(procs[key].log_path).read()


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


CRASH_SCRIPT = os.path.join(ROOT, "tests", "integration", "scripts", "crash_after_fit.py")


@pytest.mark.slow  # ~50 s; test_a_script_that_raises_never_says_done covers the Done decision in the default run
def test_a_chief_that_raises_after_fit_never_says_done_and_its_restart_ends_the_job(tmp_path):
    """Issue 26: a script that dies with an error must not tell the PS it is done.

    A TF_CONFIG job by hand (as under Kubernetes): ps:0, chief:0 (worker 0),
    worker:0 (worker 1). The chief raises after ``fit``; the worker finishes.
    Before the fix the chief's interpreter-exit hook said ``Done`` anyway, the
    PS exited 0 at once (every worker done), and the chief that Kubernetes
    restarts then ran against no PS: a crash loop until the restart limit.
    Now the PS keeps serving with only worker 1 done, and the restarted chief
    joins, finishes and ends the job: every task exits 0.
    """
    from tfdist.ps.client import PSClient

    cluster = _cluster({"chief": 1, "worker": 1, "ps": 1})

    def start(task, *args, tag=""):
        env = {**_base_env(), "TF_CONFIG": json.dumps({"cluster": cluster,
                                                        "task": {"type": task.job, "index": task.index}})}
        argv = [sys.executable, "-m", "tfdist.ps"] if task.job == "ps" else [sys.executable, CRASH_SCRIPT, *args]
        return TaskProcess(task, argv, env, log_path=str(tmp_path / "logs" / f"{task.job}-{task.index}{tag}.log"),
                           forward_stdout=False, forward_stderr=False, fast_start=FAST).start()

    procs = {}
    try:
        procs["ps:0"] = start(TaskSpec("ps", 0))
        procs["chief:0"] = start(TaskSpec("chief", 0), "--raise-after-fit")
        procs["worker:0"] = start(TaskSpec("worker", 0))
        codes = _wait_all_exit({k: procs[k] for k in ("chief:0", "worker:0")}, 150)
        assert codes == {"chief:0": 1, "worker:0": 0}, _describe(procs, codes)
        # The PS serves on: only worker 1 said Done (before the fix the PS had stopped: every worker "done").
        assert procs["ps:0"].running, _describe(procs, codes)
        with PSClient(cluster["ps"], TOKEN, rpc_timeout_s=10, tune_malloc=False) as client:
            meta, _ = client.call(0, "Status", {"brief": True}, timeout=10.0)
        assert meta["done_workers"] == [1], meta
        chief_log = open(procs["chief:0"].log_path).read()
        assert "fit done, worker 0" in chief_log and "not telling the parameter servers it is done" in chief_log
        # The chief started again (as Kubernetes' OnFailure does) joins the running job and ends it.
        procs["chief:0"] = start(TaskSpec("chief", 0), tag="-restarted")
        codes = _wait_all_exit({k: procs[k] for k in ("chief:0", "ps:0")}, 150)
        assert codes == {"chief:0": 0, "ps:0": 0}, _describe(procs, codes)
        assert "all 2 workers are done; stopping" in open(procs["ps:0"].log_path).read()
    finally:
        for p in procs.values():
            if p.running:
                p.kill()


@pytest.mark.parametrize("how", [["--raise-after-fit"], ["--exit-after-fit", "1"], ["--raise-system-exit", "1"]],
                         ids=["raise", "sys.exit(1)", "raise SystemExit(1) through tfdist.run"])
def test_a_script_that_raises_never_says_done(tmp_path, how):
    """A worker whose script raises (or calls ``sys.exit(1)``) after ``fit`` leaves the PS serving (no ``Done``);
    one PS task in this process. ``raise SystemExit(1)`` written out is seen only where tfdist runs the script
    (``python -m tfdist.run``, how the launcher and the manifests start a training task: ``task_argv``)."""
    from tfdist.cluster.local import task_argv
    from tfdist.ps.server import PSServer

    server = PSServer(None, token=TOKEN, num_workers=1).start()
    cluster = {"worker": [f"127.0.0.1:{free_port()}"], "ps": [server.address]}
    env = {**_base_env(), "TF_CONFIG": json.dumps({"cluster": cluster, "task": {"type": "worker", "index": 0}})}
    argv = task_argv(TaskSpec("worker", 0), CRASH_SCRIPT, how) if how[0] == "--raise-system-exit" else \
        [sys.executable, CRASH_SCRIPT, *how]
    proc = TaskProcess(TaskSpec("worker", 0), argv, env,
                       log_path=str(tmp_path / "worker-0.log"), forward_stdout=False, forward_stderr=False,
                       fast_start=FAST).start()
    try:
        code = proc.wait(150)
        log = open(proc.log_path).read()
        assert code == 1, log[-3000:]
        assert "fit done, worker 0" in log, log[-3000:]
        if how[0] == "--raise-after-fit":
            assert "RuntimeError: failing after fit on purpose" in log, log[-3000:]
        assert "not telling the parameter servers it is done" in log, log[-3000:]
        assert server.store.done_workers == set()
        assert server.store.stats["pushes"] > 0  # it did train against this PS
    finally:
        if proc.running:
            proc.kill()
        server.stop(0)
