"""The launcher as a user runs it: README command, failures, Ctrl-C, one task per machine."""

import json
import os
import pathlib
import signal
import subprocess
import sys
import time

import psutil
import pytest

from tfdist.cluster.local import free_port
from tfdist.testing.output import OutputLines

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "tests", "integration", "scripts", "train_worker.py")
pytestmark = pytest.mark.timeout(400)


def _env():
    env = dict(os.environ)
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    env.pop("TF_CONFIG", None)
    env.pop("TFDIST_CONFIG", None)
    return env


def _tagged(tag):
    found = []
    for p in psutil.process_iter(["pid", "cmdline"]):
        try:
            if tag in " ".join(p.info["cmdline"] or []):
                found.append(p.info["pid"])
        except psutil.NoSuchProcess:
            pass
    return found


def _launch(args, timeout, **kw):
    return subprocess.run([sys.executable, "-m", "tfdist.launch", *args], cwd=ROOT, env=_env(),
                          capture_output=True, text=True, timeout=timeout, **kw)


def test_readme_main_command(tmp_path):
    r = _launch(["--config", "configs/local_async.yaml", "--log-dir", str(tmp_path),
                 "examples/train_digits.py", "--epochs", "3"], timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "dataset: digits" in r.stdout or "dataset: mnist" in r.stdout
    assert "[worker:0] worker 0: final test accuracy" in r.stdout
    # the progress bar comes from worker 0 only; worker 1's stdout is in its log
    assert "[worker:1] Epoch" not in r.stdout
    assert "Epoch 1/3" in (tmp_path / "worker-1.log").read_text()
    assert {"ps-0.log", "ps-1.log", "worker-0.log", "worker-1.log"} <= set(os.listdir(tmp_path))


def test_a_failing_worker_stops_the_job_and_is_named(tmp_path):
    tag = f"crash-{os.getpid()}-{time.time_ns()}"
    out = tmp_path / "out"
    out.mkdir()
    cfg = tmp_path / "stop.yaml"  # local_async.yaml, but any failed task stops the job (today's default was this)
    cfg.write_text((pathlib.Path(ROOT) / "configs" / "local_async.yaml").read_text()
                   + "  on_worker_failure: stop\n")
    r = _launch(["--config", str(cfg), "--log-dir", str(tmp_path / "logs"), SCRIPT,
                 "--out", str(out), "--epochs", "100", "--crash-after-epochs", "1", "--crash-worker", "1",
                 "--tag", tag], timeout=300)
    assert r.returncode == 1
    assert "worker:1 exited with code 3" in r.stderr and "crashing on purpose" in r.stderr
    assert "launch.on_worker_failure" in r.stderr
    assert _tagged(tag) == []


def test_an_async_job_goes_on_without_a_failed_worker_and_exits_0(tmp_path):
    """launch.on_worker_failure: auto (the default): async training does not need worker 1."""
    tag = f"goes-on-{os.getpid()}-{time.time_ns()}"
    out = tmp_path / "out"
    out.mkdir()
    cfg = tmp_path / "async.yaml"
    cfg.write_text("name: goes-on\ncluster: {ps: 1, worker: 2}\nstrategy: {consistency: async}\n")
    t0 = time.monotonic()
    r = _launch(["--config", str(cfg), "--log-dir", str(tmp_path / "logs"), SCRIPT, "--out", str(out),
                 "--epochs", "3", "--crash-after-epochs", "1", "--crash-worker", "1", "--tag", tag], timeout=200)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    assert "worker:1 exited with code 3" in r.stderr and "goes on without it" in r.stderr
    assert json.loads((out / "worker-0.json").read_text())["is_chief"]  # the chief finished its training
    assert not (out / "worker-1.json").exists()
    assert "worker 0 final accuracy" in r.stdout
    assert _tagged(tag) == []
    print(f"job with a failed worker: {time.monotonic() - t0:.1f} s")


def test_a_chief_that_raises_mid_fit_is_not_restarted_and_the_launcher_says_why(tmp_path):
    """README "Failures": a chief that ended by itself with an error (a Python exception: exit 1) is the job's
    result; only a killed chief is started again (the next test)."""
    tag = f"chief-raises-{os.getpid()}-{time.time_ns()}"
    out = tmp_path / "out"
    out.mkdir()
    r = _launch(["--config", "configs/local_async.yaml", "--log-dir", str(tmp_path / "logs"), SCRIPT,
                 "--out", str(out), "--epochs", "50", "--crash-after-epochs", "1", "--crash-worker", "0",
                 "--crash-how", "raise", "--tag", tag], timeout=300)
    assert r.returncode == 1, r.stdout[-2000:] + r.stderr[-3000:]
    assert "worker:0 exited with code 1" in r.stderr and "crashing on purpose in the middle of fit" in r.stderr
    assert "not restarted: it ended by itself with exit code 1" in r.stderr, r.stderr[-3000:]
    assert "restarting it" not in r.stderr
    assert _tagged(tag) == []


def test_a_killed_chief_is_restarted_by_the_launcher_and_the_job_ends_0(tmp_path):
    tag = f"chief-killed-{os.getpid()}-{time.time_ns()}"
    out = tmp_path / "out"
    out.mkdir()
    r = _launch(["--config", "configs/local_async.yaml", "--log-dir", str(tmp_path / "logs"), SCRIPT,
                 "--out", str(out), "--epochs", "2", "--crash-after-epochs", "1", "--crash-worker", "0",
                 "--crash-how", "sigkill", "--crash-once", "--tag", tag], timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    assert "worker:0 was killed by SIGKILL; restarting it (1 of at most 3" in r.stderr, r.stderr[-3000:]
    assert (out / "crashed-0").exists() and json.loads((out / "worker-0.json").read_text())["is_chief"]
    assert _tagged(tag) == []


def test_a_task_stuck_inside_fit_is_reported_with_its_stack_and_the_job_ends(tmp_path):
    """A job never runs forever by default (issue 27): the chief hangs in a callback inside fit; its stuck-task
    watchdog (TFDIST_STUCK_TIMEOUT_S, here 5 s instead of 600) logs it with every thread's stack and exits 1."""
    tag = f"stuck-{os.getpid()}-{time.time_ns()}"
    out = tmp_path / "out"
    out.mkdir()
    cfg = tmp_path / "stuck.yaml"
    cfg.write_text("name: stuck\ncluster: {ps: 1, worker: 2}\nstrategy: {consistency: async}\n"
                   "launch: {env: {TFDIST_STUCK_TIMEOUT_S: '5'}}\n")
    script = os.path.join(ROOT, "tests", "integration", "scripts", "fit_end_worker.py")
    r = _launch(["--config", str(cfg), "--log-dir", str(tmp_path / "logs"), script, "--out", str(out),
                 "--epochs", "3", "--hang-worker", "0", "--tag", tag], timeout=300)
    log = (tmp_path / "logs" / "worker-0.log").read_text()
    assert r.returncode == 1, r.stderr[-3000:]
    assert "worker:0 exited with code 1" in r.stderr, r.stderr[-3000:]
    assert "made no progress inside keras fit() for" in log and "it is stuck" in log, log[-3000:]
    assert "in on_epoch_end" in log and "fit_end_worker.py" in log  # the stack shows where it hung
    assert _tagged(tag) == []


def test_ctrl_c_stops_every_task(tmp_path):
    tag = f"sigint-{os.getpid()}-{time.time_ns()}"
    out = tmp_path / "out"
    out.mkdir()
    proc = subprocess.Popen([sys.executable, "-m", "tfdist.launch", "--config", "configs/local_async.yaml",
                             "--log-dir", str(tmp_path / "logs"), SCRIPT, "--out", str(out), "--epochs", "500",
                             "--tag", tag], cwd=ROOT, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    try:
        out = OutputLines(proc.stdout)
        assert out.wait_for("Epoch 2/", timeout_s=120), out.text()  # training really runs
        assert len([p for p in _tagged(tag) if p != proc.pid]) == 2  # both workers are up
        proc.send_signal(signal.SIGINT)
        assert proc.wait(60) == 130
        assert _tagged(tag) == []
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def test_bad_config_exits_2_naming_the_field(tmp_path):
    cfg = tmp_path / "bad.yaml"
    cfg.write_text("cluster: {ps: 1, worker: 1}\nps: {placement: sideways}\n")
    r = _launch(["--config", str(cfg), "examples/train_digits.py"], timeout=60)
    assert r.returncode == 2
    assert "ps.placement" in r.stderr and "sideways" in r.stderr


def test_one_task_per_machine_mode(tmp_path):
    """Each task started by its own launcher (--task), as on separate machines.

    With fast start on (the suite's default), each launcher is forked from the zygote, as NetnsCluster starts
    a host's, and runs its task in its own process instead of an ``exec`` importing TensorFlow anew
    (``zygote.become``); ``TFDIST_FAST_START=0`` runs the launchers as fresh processes, each ``exec``-ing."""
    from tfdist.cluster import zygote
    from tfdist.cluster.process import TaskProcess
    from tfdist.config import parse_task

    ports = [free_port(), free_port(), free_port(), free_port()]
    cfg = tmp_path / "multi.yaml"
    cfg.write_text(json.dumps({
        "name": "multi",
        "cluster": {"chief": [f"127.0.0.1:{ports[0]}"], "worker": [f"127.0.0.1:{ports[1]}"],
                    "ps": [f"127.0.0.1:{ports[2]}"], "evaluator": [f"127.0.0.1:{ports[3]}"]},
    }))
    out = tmp_path / "out"
    out.mkdir()
    env = _env()
    env["TFDIST_TOKEN"] = "shared-secret-token"
    procs = []
    try:
        for task in ("ps:0", "chief:0", "worker:0", "evaluator:0"):
            epochs = "0" if task == "evaluator:0" else "2"  # the evaluator only evaluates
            procs.append(TaskProcess(
                parse_task(task),
                [sys.executable, "-m", "tfdist.launch", "--config", str(cfg), "--task", task, SCRIPT,
                 "--out", str(out), "--epochs", epochs],
                env, log_path=str(tmp_path / f"{task.replace(':', '-')}.log"), forward_stdout=False,
                forward_stderr=False, fast_start=zygote.fast_start_enabled()).start())
        codes = [p.wait(240) for p in procs]
        assert codes == [0, 0, 0, 0], "\n".join(open(p.log_path).read()[-1500:] for p in procs)
        chief = json.loads((out / "worker-0.json").read_text())
        worker = json.loads((out / "worker-1.json").read_text())
        assert chief["is_chief"] and chief["placement"] == worker["placement"]
        evaluator = json.loads((out / "worker--1.json").read_text())  # evaluators have worker id -1
        assert evaluator["placement"] == chief["placement"] and evaluator["predict_shape"] == [5, 10]
        assert "sync_stats" in evaluator and evaluator["sync_stats"]["syncs"] == 0
    finally:
        for p in procs:
            if p.running:
                p.kill()


def test_task_mode_refuses_missing_token(tmp_path):
    cfg = tmp_path / "multi.yaml"
    cfg.write_text(json.dumps({"cluster": {"worker": ["127.0.0.1:5000"], "ps": ["127.0.0.1:5001"]}}))
    env = _env()
    env.pop("TFDIST_TOKEN", None)
    r = subprocess.run([sys.executable, "-m", "tfdist.launch", "--config", str(cfg), "--task", "ps:0"],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "TFDIST_TOKEN" in r.stderr


# ----------------------------------------------------------------------------------------------------------
# Issue #12: a config mistake exits 2 at once (before TensorFlow or any task starts), naming the field.

LAUGHS = "a0: &a0 [lol]\n" + "".join(
    f"a{i}: &a{i} [" + ",".join([f"*a{i - 1}"] * 9) + "]\n" for i in range(1, 10)) + "name: *a9\n"
BAD_CONFIGS = [
    ("replicas", "cluster: {ps: 1, worker: 2}\nstrategy: {consistency: sync_replicas, replicas_to_aggregate: 3}\n",
     ["strategy.replicas_to_aggregate", "2 worker"]),
    ("duplicate", 'cluster: {ps: ["127.0.0.1:5000"], worker: ["127.0.0.1:5000"]}\n',
     ["cluster.worker[0]", "cluster.ps[0]"]),
    ("nan", "ps: {rpc_timeout_s: .nan}\n", ["ps.rpc_timeout_s", "nan"]),
    ("inf", "launch: {job_timeout_s: .inf}\n", ["launch.job_timeout_s", "inf"]),
    ("bool", "ps: {startup_timeout_s: yes}\n", ["ps.startup_timeout_s", "True"]),
    ("heartbeat", "ps: {heartbeat_interval_s: 40, heartbeat_timeout_s: 30}\n",
     ["ps.heartbeat_interval_s=40", "ps.heartbeat_timeout_s=30"]),
    ("tls", "security: {tls_cert: /nonexistent/cert.pem, tls_key: /nonexistent/key.pem, tls_ca: /nonexistent/ca.pem}\n",
     ["security.tls_cert", "TLS", "/nonexistent/cert.pem"]),
    ("half-tls", "security: {tls_cert: cert.pem}\n", ["security.tls_cert", "tls_key"]),
    ("latin1", "name: caf\u00e9\n".encode("latin-1"), ["not UTF-8", "UTF-8"]),
    ("list", "- cluster\n- ps\n", ["mapping", "a list"]),
    ("workers", "cluster: {ps: 1, worker: 100000}\n", ["cluster.worker", "100000", "--task"]),
    ("local-workers", "cluster: {ps: 1, worker: 5000}\n", ["cluster.worker", "5000", "at most", "--task"]),
    ("laughs", LAUGHS, ["alias"]),
    ("policy", "launch: {on_worker_failure: sometimes}\n", ["launch.on_worker_failure", "auto"]),
    # Issue 26: these got past validation and failed later, with a traceback or at every checkpoint.
    ("checkpoint-under-file", "ps: {checkpoint_dir: /dev/null/ckpt}\n", ["ps.checkpoint_dir", "under '/dev/null'"]),
    ("log-dir-under-file", "launch: {log_dir: /dev/null/logs}\n", ["launch.log_dir", "/dev/null/logs"]),
    ("env-name", "launch: {env: {'A=B': 1}}\n", ["launch.env.A=B", "letters, digits"]),
    ("env-reserved", "launch: {env: {TF_CONFIG: x}}\n", ["launch.env.TF_CONFIG", "sets TF_CONFIG"]),
    ("threads", "launch: {threads_per_task: 100000000000}\n", ["launch.threads_per_task", "4096"]),
    ("huge-int", "ps: {rpc_timeout_s: 1" + "0" * 400 + "}\n", ["ps.rpc_timeout_s", "2**53"]),
    ("message-bytes", "ps: {max_message_bytes: 1099511627776}\n", ["ps.max_message_bytes", "2147483647"]),
]


@pytest.mark.parametrize("name, text, words", BAD_CONFIGS, ids=[c[0] for c in BAD_CONFIGS])
def test_config_mistakes_exit_2_at_once_naming_the_field(tmp_path, name, text, words):
    cfg = tmp_path / f"{name}.yaml"
    if isinstance(text, bytes):
        cfg.write_bytes(text)
    else:
        cfg.write_text(text)
    t0 = time.monotonic()
    r = _launch(["--config", str(cfg), "examples/train_digits.py"], timeout=60)
    assert r.returncode == 2, r.stderr[-2000:]
    assert "Traceback" not in r.stderr and r.stderr.startswith("tfdist.launch: ")
    for word in words:
        assert word in r.stderr, r.stderr
    assert len(r.stderr) < 1500
    assert time.monotonic() - t0 < 30  # no TensorFlow import, no task started


@pytest.mark.parametrize("value", ["nan", "-1", "0", "inf"])
def test_a_bad_timeout_option_exits_2(tmp_path, value):
    r = _launch(["--config", "configs/local_async.yaml", "--timeout", value, "examples/train_digits.py"], timeout=60)
    assert r.returncode == 2 and "--timeout" in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_timeout_stops_every_task_and_names_the_option(tmp_path):
    tag = f"sleeper-{os.getpid()}-{time.time_ns()}"
    script = tmp_path / "sleep.py"
    started = tmp_path / "started"
    started.mkdir()
    script.write_text("import os, sys, time\n"
                      f"open(os.path.join({str(started)!r}, str(os.getpid())), 'w').write(repr(time.time()))\n"
                      "print('sleeping', sys.argv[1:], flush=True)\ntime.sleep(120)\n")
    cfg = tmp_path / "sleep.yaml"
    cfg.write_text("name: sleepy\ncluster: {ps: 1, worker: 2}\n")
    t0, launched = time.monotonic(), time.time()
    r = _launch(["--config", str(cfg), "--log-dir", str(tmp_path / "logs"), "--timeout", "3", str(script), tag],
                timeout=90)
    took, ended = time.monotonic() - t0, time.time()
    assert r.returncode == 1, r.stderr[-2000:]
    assert "--timeout" in r.stderr and "3 s" in r.stderr and "Stopped all tasks" in r.stderr, r.stderr[-2000:]
    # Stopped long before the sleepers' 120 s, counted from the first task's start: the launcher's own
    # start-up (its zygote imports TensorFlow: 10 s of CPU, more on a loaded machine) is not the timeout's.
    first_task = min((float(f.read_text()) for f in started.iterdir() if f.read_text()), default=launched)
    assert took >= 3 and ended - first_task < 40, (took, ended - first_task)
    assert _tagged(tag) == []
