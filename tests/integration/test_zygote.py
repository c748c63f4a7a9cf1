"""Fast start (tfdist/cluster/zygote.py): a forked task behaves like ``python script.py`` started fresh.

Real processes: the zygote imports TensorFlow once; each task is forked from
it and must get its own arguments, environment, working directory, output
pipes, exit code (by ``sys.exit``, by an exception, by a signal), ``atexit``
handlers and random state, and must die with its launcher.
"""

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from tfdist.cluster.process import TaskProcess
from tfdist.config import TaskSpec

pytestmark = pytest.mark.timeout(180)


def _script(tmp_path, body: str) -> str:
    path = tmp_path / "task.py"
    path.write_text(textwrap.dedent(body))
    return str(path)


def _run(tmp_path, body, args=(), env=None, timeout=60.0):
    task = TaskProcess(TaskSpec("worker", 0), [sys.executable, _script(tmp_path, body), *args],
                       {**os.environ, **(env or {})}, log_path=str(tmp_path / "log.txt"),
                       forward_stdout=False, forward_stderr=False, fast_start=True)
    task.start()
    try:
        code = task.wait(timeout)
        assert code is not None, "the task did not end in time"
    finally:
        task.stop(grace=1.0)
    return task, code, (tmp_path / "log.txt").read_text()


def test_a_forked_task_gets_its_argv_env_cwd_output_and_exit_code(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    task, code, log = _run(tmp_path, """
        import atexit, os, sys
        import tensorflow as tf
        atexit.register(lambda: print("atexit ran", flush=True))
        print("argv", sys.argv[1:], "name", __name__, "file", os.path.basename(__file__))
        print("env", os.environ["MY_VALUE"], "cwd", os.getcwd())
        print("tf", tf.reduce_sum(tf.constant([1.0, 2.0])).numpy())
        print("to stderr", file=sys.stderr)
        sys.exit(3)
    """, args=["a", "b c"], env={"MY_VALUE": "42"})
    assert task.forked
    assert code == 3, log
    assert "argv ['a', 'b c'] name __main__ file task.py" in log
    assert f"env 42 cwd {tmp_path}" in log
    assert "tf 3.0" in log and "to stderr" in log and "atexit ran" in log


def test_a_forked_task_starts_with_the_strategies_imported(tmp_path):
    """What a TensorFlow task imports first is imported once, in the zygote (``PRELOAD``): the strategies'
    modules too (``tfdist.strategies`` itself imports them lazily)."""
    from tfdist.cluster.zygote import PRELOAD

    names = [n for n in PRELOAD if n.startswith("tfdist.strategies.")]
    assert names
    task, code, log = _run(tmp_path, f"""
        import sys
        print("preloaded", all(n in sys.modules for n in {names!r}))
    """)
    assert task.forked and code == 0, log
    assert "preloaded True" in log


def test_a_forked_task_starts_with_the_zygote_s_objects_frozen(tmp_path):
    """The zygote freezes what its imports made (``gc.freeze``): a task's full collection skips TensorFlow's and
    Keras's module objects (a worker runs one at exit) and writes none of the pages it shares with the zygote.
    Its own objects are still collected."""
    task, code, log = _run(tmp_path, """
        import gc
        frozen = gc.get_freeze_count()
        class Cycle:
            pass
        a, b = Cycle(), Cycle()
        a.other, b.other = b, a
        del a, b
        print("frozen", frozen, "collected", gc.collect())
    """)
    assert task.forked and code == 0, log
    frozen, collected = (int(v) for v in log.split("frozen ")[1].split()[::2][:2])
    assert frozen > 100_000, log  # TensorFlow, Keras and tfdist: ~400k objects
    assert collected >= 2, log  # the task's own cycle


def test_an_exception_exits_1_with_its_traceback(tmp_path):
    task, code, log = _run(tmp_path, "raise ValueError('broken on purpose')\n")
    assert task.forked and code == 1
    assert "ValueError: broken on purpose" in log and "Traceback" in log


def test_signals_reach_the_task_and_its_exit_says_so(tmp_path):
    path = _script(tmp_path, "import time\nprint('up', flush=True)\ntime.sleep(120)\n")
    task = TaskProcess(TaskSpec("worker", 0), [sys.executable, path], dict(os.environ),
                       forward_stdout=False, forward_stderr=False, fast_start=True).start()
    try:
        deadline = time.monotonic() + 60
        while "up" not in task.tail and time.monotonic() < deadline:
            task.wait(0.1)
        assert task.forked and "up" in task.tail
        task.signal(signal.SIGSTOP)
        assert _state(task.pid) == "T"
        task.signal(signal.SIGCONT)
        task.kill()
        assert task.poll() == -signal.SIGKILL
        assert "killed by SIGKILL" in task.describe_exit()
    finally:
        task.stop(grace=1.0)


def _state(pid: int, timeout: float = 10.0) -> str:
    deadline = time.monotonic() + timeout
    while True:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
        if state == "T" or time.monotonic() > deadline:
            return state
        time.sleep(0.05)


def test_every_task_has_its_own_random_state(tmp_path):
    body = "import random, numpy as np\nprint('draw', random.random(), np.random.rand())\n"
    draws = {_run(tmp_path, body)[2].split("draw")[-1].strip() for _ in range(2)}  # the log is appended to
    assert len(draws) == 2


def test_an_import_time_variable_that_differs_starts_the_task_the_usual_way(tmp_path):
    task, code, log = _run(tmp_path, "import os\nprint('backend', os.environ['KERAS_BACKEND'])\n",
                           env={"KERAS_BACKEND": "tensorflow", "TF_USE_LEGACY_KERAS": "0"})
    assert code == 0 and "backend tensorflow" in log
    assert not task.forked


@pytest.fixture
def lender():
    """This process's zygote lent on a Unix socket (``serve_forks``), as tests/conftest.py lends it to launchers."""
    import shutil
    import tempfile

    from tfdist.cluster import zygote as zyg

    directory = tempfile.mkdtemp(prefix="tfdist-zygote-test-")  # short: a socket path has at most 107 bytes
    lent = zyg.serve_forks(os.path.join(directory, "zygote.sock"))
    try:
        yield lent
    finally:
        lent.close()
        shutil.rmtree(directory, ignore_errors=True)


def _launcher_env(lender=None):
    """The launching process's environment: with ``lender``, it asks that zygote; without, it starts its own."""
    from tfdist.constants import ENV_ZYGOTE_SOCKET

    env = {k: v for k, v in os.environ.items() if k != ENV_ZYGOTE_SOCKET}
    if lender is not None:
        env[ENV_ZYGOTE_SOCKET] = lender.path
    return env


def _lent_zygotes(pid: int) -> list[int]:
    import psutil

    title = f"tfdist-zygote lent to pid {pid}"
    return [p.info["pid"] for p in psutil.process_iter(["pid", "cmdline", "status"])
            if " ".join(p.info["cmdline"] or []).strip() == title and p.info["status"] != "zombie"]


@pytest.mark.parametrize("zygote_kind", ["own", "lent"])
def test_forked_tasks_die_with_their_launcher(tmp_path, request, zygote_kind):
    """SIGKILL the launching process: its zygote (its own, or the one lent to it) and every task it forked go
    too (no orphans)."""
    task_script = _script(tmp_path, "import time\nprint('task up', flush=True)\ntime.sleep(300)\n")
    launcher = tmp_path / "launcher.py"
    launcher.write_text(textwrap.dedent(f"""
        import os, sys, time
        from tfdist.cluster import zygote
        from tfdist.cluster.process import TaskProcess
        from tfdist.config import TaskSpec
        task = TaskProcess(TaskSpec("worker", 0), [sys.executable, {task_script!r}], dict(os.environ),
                           forward_stdout=False, forward_stderr=False, fast_start=True).start()
        while "task up" not in task.tail:
            time.sleep(0.05)
        print("pid", task.pid, task.forked, zygote.zygote(os.environ).lent, flush=True)
        time.sleep(300)
    """))
    env = _launcher_env(request.getfixturevalue("lender") if zygote_kind == "lent" else None)
    proc = subprocess.Popen([sys.executable, str(launcher)], stdout=subprocess.PIPE, text=True, env=env)
    try:
        line = proc.stdout.readline()
        assert line.split()[:1] == ["pid"] and line.split()[2:] == ["True", str(zygote_kind == "lent")], line
        pid = int(line.split()[1])
        assert os.path.exists(f"/proc/{pid}")
        assert len(_lent_zygotes(proc.pid)) == (zygote_kind == "lent")
    finally:
        proc.kill()
        proc.wait(10)
    deadline = time.monotonic() + 20
    while (_alive(pid) or _lent_zygotes(proc.pid)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(pid), "a forked task outlived its launcher"
    assert _lent_zygotes(proc.pid) == [], "the zygote lent to the launcher outlived it"


def test_a_lent_zygote_runs_another_process_tasks_as_its_own_would(tmp_path, lender, monkeypatch):
    """A process told ``TFDIST_ZYGOTE_SOCKET`` forks its tasks from a zygote lent there: argv, env, cwd,
    output, exit codes and signals as with its own; the lent zygote ends when that process exits."""
    monkeypatch.chdir(tmp_path)
    task_script = _script(tmp_path, """
        import os, sys, time
        import tensorflow as tf
        print("argv", sys.argv[1:], "env", os.environ["MY_VALUE"], "cwd", os.getcwd(), flush=True)
        print("tf", tf.reduce_sum(tf.constant([1.0, 2.0])).numpy(), flush=True)
        if sys.argv[1] == "wait":
            time.sleep(120)
        sys.exit(int(sys.argv[1]))
    """)
    launcher = tmp_path / "launcher.py"
    launcher.write_text(textwrap.dedent(f"""
        import os, signal, sys
        from tfdist.cluster import zygote
        from tfdist.cluster.process import TaskProcess
        from tfdist.config import TaskSpec
        env = {{**os.environ, "MY_VALUE": "42"}}
        task = TaskProcess(TaskSpec("worker", 0), [sys.executable, {task_script!r}, "3"], env,
                           forward_stdout=False, forward_stderr=False, fast_start=True).start()
        print("exit", task.wait(60), "forked", task.forked, "lent", zygote.zygote(env).lent, flush=True)
        print("tail", list(task.tail), flush=True)
        waiting = TaskProcess(TaskSpec("worker", 1), [sys.executable, {task_script!r}, "wait"], env,
                              forward_stdout=False, forward_stderr=False, fast_start=True).start()
        while not any("tf 3.0" in line for line in waiting.tail) and waiting.wait(0.1) is None:
            pass
        waiting.signal(signal.SIGTERM)
        print("terminated", waiting.wait(60), waiting.describe_exit(), flush=True)
        print("launcher", os.getpid(), flush=True)
    """))
    done = subprocess.run([sys.executable, str(launcher)], capture_output=True, text=True, timeout=120,
                          env=_launcher_env(lender), check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert "exit 3 forked True lent True" in out, out + done.stderr
    assert f"argv ['3'] env 42 cwd {tmp_path}" in out and "tf 3.0" in out, out
    assert f"terminated {-signal.SIGTERM} worker:1 was killed by SIGTERM" in out, out
    launcher_pid = int(out.split("launcher ")[1].split()[0])
    assert _lent_zygotes(launcher_pid) == []  # its exit closed the connection; it waited for the lent zygote to end


def test_a_lent_zygote_that_imported_under_other_variables_is_given_back(tmp_path, lender):
    """A process whose import-time variables differ from the lender's (here ``OMP_NUM_THREADS``) would have
    every task started the usual way by the lent zygote: it ends that one and goes on to start its own."""
    launcher = tmp_path / "launcher.py"
    launcher.write_text(textwrap.dedent("""
        import logging, os
        logging.basicConfig(level=logging.INFO)
        from tfdist.cluster import zygote
        zygote._failed = True  # an own zygote would be started next: answer None instead of importing TF
        print("zygote", zygote.zygote(os.environ), "pid", os.getpid(), flush=True)
    """))
    env = {**_launcher_env(lender), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, str(launcher)], capture_output=True, text=True, timeout=120, env=env,
                          check=False)
    assert done.returncode == 0, done.stderr
    assert "zygote None" in done.stdout, done.stdout + done.stderr
    assert "imported under other import-time variables than this process (OMP_NUM_THREADS)" in done.stderr, done.stderr
    assert "WARNING" in done.stderr.split("imported under other")[0].splitlines()[-1], done.stderr  # not only at INFO
    assert _lent_zygotes(int(done.stdout.split("pid")[1])) == []  # the lent one was closed, not left running


def test_a_launcher_whose_lender_is_gone_goes_on_to_start_its_own_zygote(tmp_path):
    """A stale ``TFDIST_ZYGOTE_SOCKET`` (nothing listens) costs a warning, then the usual start of a zygote of
    its own (here marked as failed before, so that path is seen without paying its TensorFlow import)."""
    launcher = tmp_path / "launcher.py"
    launcher.write_text(textwrap.dedent("""
        import os
        from tfdist.cluster import zygote
        zygote._failed = True  # an own zygote would be started next: answer None instead of importing TF
        print("zygote", zygote.zygote(os.environ), flush=True)
    """))
    env = {**_launcher_env(), "TFDIST_ZYGOTE_SOCKET": str(tmp_path / "nobody.sock")}
    done = subprocess.run([sys.executable, str(launcher)], capture_output=True, text=True, timeout=120, env=env,
                          check=False)
    assert done.returncode == 0, done.stderr
    assert "zygote None" in done.stdout, done.stdout + done.stderr
    assert "could not use the zygote lent at TFDIST_ZYGOTE_SOCKET=" in done.stderr, done.stderr


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_a_forked_task_shows_its_own_command_line(tmp_path):
    """``ps``/psutil find a task by its command line (the suite's orphan checks do)."""
    import psutil

    path = _script(tmp_path, "import time\nprint('up', flush=True)\ntime.sleep(120)\n")
    task = TaskProcess(TaskSpec("worker", 0), [sys.executable, path, "--tag", "xyz"], dict(os.environ),
                       forward_stdout=False, forward_stderr=False, fast_start=True).start()
    try:
        deadline = time.monotonic() + 60
        while "up" not in task.tail and time.monotonic() < deadline:
            task.wait(0.1)
        assert task.forked
        assert f"{path} --tag xyz" in " ".join(psutil.Process(task.pid).cmdline())
    finally:
        task.stop(grace=1.0)


def test_a_task_launch_forked_from_the_zygote_becomes_its_task_without_importing_tensorflow_again(tmp_path):
    """``python -m tfdist.launch --task T`` forked from the zygote (as NetnsCluster starts a host's task) runs
    the task in its own process, as its ``exec`` would, but with TensorFlow already imported (before: the
    ``exec`` imported it anew, ~7 CPU-seconds per task)."""
    import json

    config = tmp_path / "job.json"
    config.write_text(json.dumps({"cluster": {"worker": ["127.0.0.1:7001"], "ps": ["127.0.0.1:7002"]}}))
    script = _script(tmp_path, """
        import json, logging, os, sys
        preloaded = "tensorflow" in sys.modules  # before this script imports anything
        print("task", os.getpid(), preloaded, json.loads(os.environ["TF_CONFIG"])["task"], sys.argv[1:],
              len(logging.root.handlers), logging.root.level, flush=True)
    """)
    env = {**os.environ, "TFDIST_TOKEN": "become-token"}
    task = TaskProcess(TaskSpec("worker", 0), [sys.executable, "-m", "tfdist.launch", "--config", str(config),
                                               "--task", "worker:0", script, "--x", "1"], env,
                       forward_stdout=False, forward_stderr=False, fast_start=True).start()
    try:
        assert task.wait(60) == 0, "\n".join(task.tail)
        assert task.forked
        line = next(t for t in task.tail if t.startswith("task "))
        # its own pid (as exec keeps it), TensorFlow preloaded, the task's TF_CONFIG and argv, logging as fresh
        assert line == f"task {task.pid} True {{'type': 'worker', 'index': 0}} ['--x', '1'] 0 30", task.tail
    finally:
        task.stop(grace=1.0)


def test_a_missing_script_exits_2_as_python_does(tmp_path):
    task = TaskProcess(TaskSpec("worker", 0), [sys.executable, str(tmp_path / "missing.py")], dict(os.environ),
                       forward_stdout=False, forward_stderr=False, fast_start=True).start()
    try:
        assert task.wait(60) == 2 and task.forked
        assert "can't open file" in "\n".join(task.tail)
    finally:
        task.stop(grace=1.0)


def test_an_unhandled_keyboard_interrupt_ends_the_task_as_sigint_does(tmp_path):
    task, code, log = _run(tmp_path, "raise KeyboardInterrupt\n")
    assert task.forked and code == -signal.SIGINT, (code, log)  # as under Popen: killed by SIGINT
    assert "KeyboardInterrupt" in log


def test_a_zygote_that_answers_late_leaves_no_second_task(tmp_path, monkeypatch):
    """The start gives up on a stopped zygote (the task starts the usual way); the late fork is killed."""
    import psutil

    from tfdist.cluster import zygote as zyg

    path = _script(tmp_path, "import time\nprint('up', flush=True)\ntime.sleep(120)\n")
    argv = [sys.executable, path, "--late-fork-tag"]
    z = zyg.zygote(dict(os.environ))
    assert z is not None and z.alive
    monkeypatch.setattr(zyg, "SPAWN_TIMEOUT_S", 1.0)
    os.kill(z.pid, signal.SIGSTOP)  # its own or, under xdist, the one the controller's zygote lent
    try:
        task = TaskProcess(TaskSpec("worker", 0), argv, dict(os.environ), forward_stdout=False,
                           forward_stderr=False, fast_start=True).start()
    finally:
        os.kill(z.pid, signal.SIGCONT)
    try:
        assert not task.forked  # started the usual way
        deadline = time.monotonic() + 30
        while z._abandoned and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not z._abandoned and z.alive  # the late reply came, its fork was killed, the zygote serves on

        def tagged():
            return sorted(p.info["pid"] for p in psutil.process_iter(["pid", "cmdline", "status"])
                          if "--late-fork-tag" in " ".join(p.info["cmdline"] or []) and p.info["status"] != "zombie")

        deadline = time.monotonic() + 10  # the SIGKILL of the late fork is delivered
        while tagged() != [task.pid] and time.monotonic() < deadline:
            time.sleep(0.05)
        assert tagged() == [task.pid]
    finally:
        task.stop(grace=1.0)


def test_an_xdist_worker_forks_its_tasks_from_the_zygote_the_run_lends():
    """Under pytest-xdist the controller lends one zygote (tests/conftest.py ``pytest_configure``): a worker's
    tasks fork from it only if the worker's import-time variables equal the controller's. A test module that set
    one at collection (``KERAS_BACKEND``, which only workers collect) once made every worker import TensorFlow in
    a zygote of its own, unnoticed: the tasks still forked, only the run cost more."""
    from tfdist.cluster import zygote as zyg
    from tfdist.constants import ENV_ZYGOTE_SOCKET

    address = os.environ.get(ENV_ZYGOTE_SOCKET)
    if not os.environ.get("PYTEST_XDIST_WORKER") or not address or address in zyg._lending_at:
        pytest.skip("not an xdist worker of a run whose controller lends a zygote")
    z = zyg.zygote(dict(os.environ))  # what a LocalCluster's task asks (its environment is this one's and more)
    assert z is not None and z.lent, (zyg._lent_failed, zyg._import_time_env(os.environ))
    assert z._import_env == zyg._import_time_env(os.environ)
