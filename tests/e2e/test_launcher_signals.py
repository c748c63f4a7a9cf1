"""The launcher under signals and failures it must not retry: real processes, no TensorFlow in the tasks.

* SIGINT and SIGTERM stop every task and the launcher exits 130 / 143, also
  when it inherited SIGINT as ignored (``nohup``, a background job of a
  non-interactive shell), where Python installs no KeyboardInterrupt handler.
* A task whose script raised a ``ConfigError`` (exit 78) is never restarted:
  the launcher exits 2 naming it.
* A chief that exits non-zero after the parameter servers ended the job (it
  had said ``Done``) is never restarted, and the job counts as finished.
"""

import json
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from tfdist.testing.output import OutputLines

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TASK = os.path.join(ROOT, "tests", "e2e", "scripts", "launcher_task.py")
pytestmark = pytest.mark.timeout(180)


def _env():
    env = {k: v for k, v in os.environ.items() if k not in ("TF_CONFIG", "TFDIST_CONFIG", "TFDIST_TOKEN")}
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    return env


def _config(tmp_path, **launch):
    path = tmp_path / "job.yaml"
    path.write_text(json.dumps({"name": "signals", "cluster": {"ps": 1, "worker": 1}, "launch": launch}))
    return str(path)


def _argv(tmp_path, mode, **launch):
    out = tmp_path / "out"
    out.mkdir(exist_ok=True)
    return [sys.executable, "-m", "tfdist.launch", "--config", _config(tmp_path, **launch), "--log-dir",
            str(tmp_path / "logs"), TASK, "--out", str(out), "--mode", mode]


def _tasks_of(launcher_pid):
    """The processes below the launcher: its own children, or, where it forks its tasks from a zygote lent by
    this pytest process (``TFDIST_ZYGOTE_SOCKET``, tests/conftest.py), the tasks of the zygote lent to it."""
    found = psutil.Process(launcher_pid).children(recursive=True)
    for p in psutil.process_iter(["cmdline"]):
        try:
            if " ".join(p.info["cmdline"] or []).strip() == f"tfdist-zygote lent to pid {launcher_pid}":
                found += p.children(recursive=True)
        except psutil.NoSuchProcess:
            pass
    return found


def _runs(tmp_path):
    path = tmp_path / "out" / "runs"
    return path.read_text().splitlines() if path.exists() else []


def _stop_on_signal(tmp_path, sig, ignore_sigint=False):
    """Starts a job whose tasks wait, sends ``sig`` once the worker runs; returns (exit code, output, task pids)."""
    argv = _argv(tmp_path, "wait")
    if ignore_sigint:  # as `cmd &` in a non-interactive shell, or nohup: SIGINT inherited as ignored
        argv = ["bash", "-c", 'trap "" INT; exec "$@"', "bash", *argv]
    proc = subprocess.Popen(argv, cwd=ROOT, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        out = OutputLines(proc.stdout)
        assert out.wait_for("ready", timeout_s=90), out.text()  # the task prints it within seconds
        tasks = [p.pid for p in _tasks_of(proc.pid)]
        assert tasks, "no task process found"
        proc.send_signal(sig)
        proc.wait(60)
        return proc.returncode, out.drain(timeout_s=10), tasks
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def _gone(pids, within_s=10.0):
    """Whether every process in ``pids`` has exited (or is a zombie) within ``within_s`` seconds.

    The zygote and its forked tasks die by ``PR_SET_PDEATHSIG`` once the launcher has exited, which the
    kernel delivers asynchronously: on a loaded machine (the suite's other workers) a task may still be
    running the instant the launcher's exit code is read.
    """
    deadline = time.monotonic() + within_s
    while True:
        alive = []
        for pid in pids:
            try:
                if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                    alive.append(pid)
            except psutil.NoSuchProcess:
                pass
        if not alive or time.monotonic() > deadline:
            return alive == []
        time.sleep(0.05)


@pytest.mark.parametrize("sig, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signal_stops_every_task_with_its_exit_code(tmp_path, sig, code):
    returncode, output, tasks = _stop_on_signal(tmp_path, sig)
    assert returncode == code, output
    assert f"got {signal.Signals(sig).name}; stopping every task" in output
    assert _gone(tasks), tasks


def test_sigint_stops_a_launcher_that_inherited_it_ignored(tmp_path):
    returncode, output, tasks = _stop_on_signal(tmp_path, signal.SIGINT, ignore_sigint=True)
    assert returncode == 130, output
    assert _gone(tasks), tasks


def test_a_task_that_raised_a_config_error_is_not_restarted(tmp_path):
    r = subprocess.run(_argv(tmp_path, "config-error"), cwd=ROOT, env=_env(), capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 2, r.stderr[-3000:]
    assert "worker:0 exited with code 78" in r.stderr and "not restarted" in r.stderr, r.stderr[-3000:]
    assert "model.kind" in r.stderr  # the task's own message, in its last lines
    assert _runs(tmp_path) == ["worker:0 config-error"]  # the chief (worker 0) ran once: launch.restart_chief not used


def test_a_chief_failing_after_the_ps_ended_the_job_is_not_restarted_and_the_job_succeeds(tmp_path):
    r = subprocess.run(_argv(tmp_path, "done-then-fail"), cwd=ROOT, env=_env(), capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "after its training finished" in r.stderr and "not restarting it" in r.stderr, r.stderr[-3000:]
    assert _runs(tmp_path) == ["worker:0 done-then-fail"]


def test_a_chief_killed_before_saying_done_is_restarted(tmp_path):
    """The counterpart: the PS tasks still serve the job, so a chief killed by a signal is started again
    (launch.max_restarts); one that ended by itself with an error is not (decide_chief_restart)."""
    r = subprocess.run(_argv(tmp_path, "killed", max_restarts=1), cwd=ROOT, env=_env(), capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 1, r.stderr[-3000:]
    assert "restarting it (1 of at most 1" in r.stderr, r.stderr[-3000:]
    assert _runs(tmp_path) == ["worker:0 killed"] * 2
    crashed = tmp_path / "crashed"
    crashed.mkdir()
    r = subprocess.run(_argv(crashed, "crash", max_restarts=1), cwd=ROOT, env=_env(), capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 1 and "not restarted: it ended by itself with exit code 1" in r.stderr, r.stderr[-3000:]
    assert _runs(crashed) == ["worker:0 crash"]


def test_a_ps_task_stopped_by_sigterm_is_started_again(tmp_path):
    """Preemption: a PS task that got SIGTERM writes its checkpoint and exits 143, so launch.restart_ps applies."""
    proc = subprocess.Popen(_argv(tmp_path, "wait"), cwd=ROOT, env=_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        out = OutputLines(proc.stdout)
        deadline = time.monotonic() + 90

        def read_until(text):
            assert out.wait_for(text, timeout_s=max(deadline - time.monotonic(), 0.1)), out.text()

        read_until("ready")
        read_until("ps:0 serving on")  # its SIGTERM handler is in place (the worker may be ready first)
        ps = [p for p in _tasks_of(proc.pid) if "tfdist.ps" in " ".join(p.cmdline())]
        assert len(ps) == 1, ps
        ps[0].send_signal(signal.SIGTERM)
        read_until("Task ps:0 exited with code 143; restarting it (1 of at most 3")
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
        assert proc.returncode == 143, out.drain(timeout_s=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
