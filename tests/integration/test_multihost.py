"""Jobs across emulated hosts: every task in its own network namespace, with its own address.

``tfdist.testing.NetnsCluster`` makes one Linux network namespace per host,
joined by a bridge (veth pairs, addresses in 10.77.0.0/24 that exist only
inside the namespaces), and runs each task there with ``ip netns exec``. Tasks
reach each other only by those addresses, as on separate machines; a host's
link can be capped with ``tc ... tbf``. Needs root (skipped otherwise, saying
why); every namespace, link and process is removed when a test ends.

Each test starts few, small TensorFlow processes (2-3 s and a few hundred MB
each). Assertions are on exit codes, log lines and the results the worker
scripts write, never on sleeps.
"""

import json
import os
import sys

import pytest

from tfdist.testing import NetnsCluster

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPTS = os.path.join(ROOT, "tests", "integration", "scripts")
EXAMPLE = os.path.join(ROOT, "examples", "train_digits.py")
EXAMPLE_ARGS = ["--dataset", "digits", "--epochs", "3", "--eval-interval", "0.5"]
TOKEN = "multihost-test-token"
PORT = 2222  # every host has its own address, so every task can use the same port

pytestmark = [
    pytest.mark.timeout(300),
    pytest.mark.skipif(not NetnsCluster.available(),
                       reason=f"multi-host tests need network namespaces: {NetnsCluster.unavailable_reason()}"),
]

PS_JOB_HOSTS = {"ps:0": "ps0", "ps:1": "ps1", "chief:0": "chief", "worker:0": "worker", "evaluator:0": "evaluator"}


def _env(**extra):
    """The environment of a task: this one's, without any job's variables, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if k not in ("TF_CONFIG",) and not k.startswith("TFDIST_")}
    env.update(TF_CPP_MIN_LOG_LEVEL="2", TF_NUM_INTRAOP_THREADS="1", PYTHONUNBUFFERED="1", TFDIST_TOKEN=TOKEN,
               PYTHONPATH=os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p))
    env.update(extra)
    return env


def _cluster_spec(net, hosts):
    """``{job: [host:port, ...]}`` of tasks named like ``ps:0`` placed on ``hosts[task]``."""
    jobs = {}
    for task, host in hosts.items():
        job, index = task.split(":")
        jobs.setdefault(job, []).append((int(index), f"{net.address(host)}:{PORT}"))
    return {job: [a for _, a in sorted(tasks)] for job, tasks in jobs.items()}


def _wait_job(net, training, others, train_timeout=180, end_timeout=30):
    """The training tasks exit 0, then the others (PS, evaluator) exit 0 by themselves."""
    codes = net.wait(training, train_timeout)
    assert all(c == 0 for c in codes.values()), f"exit codes {codes}\n{net.describe()}"
    codes = net.wait(others, end_timeout)
    assert all(c == 0 for c in codes.values()), (
        f"not every task exited 0 within {end_timeout} s of the workers (None: still running): {codes}\n"
        + net.describe())


def _check_ps_job_logs(net):
    for i in (0, 1):
        log = net.log(f"ps:{i}")
        assert "all 2 workers are done; stopping" in log, log[-2000:]
        # it says what it listens on: every interface (the workers reached it at its host's address)
        assert f"ps:{i} serving on every interface, port {PORT}" in log, log[-2000:]
    assert "worker 0: final test accuracy" in net.log("chief:0")
    assert "worker 1: final test accuracy" in net.log("worker:0")
    evaluator = net.log("evaluator:0")
    assert any(line.startswith("evaluator: PS version") for line in evaluator.splitlines()), evaluator[-3000:]
    assert "evaluator: training is over after" in evaluator


def test_ps_job_started_one_task_per_host_with_the_launcher(tmp_path):
    """README "Many machines": the same config on every host, ``python -m tfdist.launch --config F --task T``."""
    with NetnsCluster(list(PS_JOB_HOSTS.values()), log_dir=str(tmp_path / "logs")) as net:
        cluster = _cluster_spec(net, PS_JOB_HOSTS)
        config = tmp_path / "multi.yaml"
        config.write_text(json.dumps({"name": "multi-host", "cluster": cluster, "ps": {"placement": "greedy"}}))
        for task, host in PS_JOB_HOSTS.items():
            script = [] if task.startswith("ps:") else [EXAMPLE, *EXAMPLE_ARGS]
            net.run(host, task, [sys.executable, "-m", "tfdist.launch", "--config", str(config), "--task", task,
                                 *script], env=_env())
        _wait_job(net, ["chief:0", "worker:0"], ["ps:0", "ps:1", "evaluator:0"])
        _check_ps_job_logs(net)


def test_ps_job_started_from_tf_config_by_hand(tmp_path):
    """Each host runs its task with its own ``TF_CONFIG`` and the token: ps:0 ``python -m tfdist.ps``,
    every other task (ps:1 included) the example script, as under a scheduler that sets TF_CONFIG."""
    with NetnsCluster(list(PS_JOB_HOSTS.values()), log_dir=str(tmp_path / "logs")) as net:
        cluster = _cluster_spec(net, PS_JOB_HOSTS)
        for task, host in PS_JOB_HOSTS.items():
            job, index = task.split(":")
            tf_config = json.dumps({"cluster": cluster, "task": {"type": job, "index": int(index)}})
            argv = [sys.executable, "-m", "tfdist.ps"] if task == "ps:0" else [sys.executable, EXAMPLE, *EXAMPLE_ARGS]
            net.run(host, task, argv, env=_env(TF_CONFIG=tf_config))
        _wait_job(net, ["chief:0", "worker:0"], ["ps:0", "ps:1", "evaluator:0"])
        _check_ps_job_logs(net)
