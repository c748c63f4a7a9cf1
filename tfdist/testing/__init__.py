"""Local clusters for tests and experiments: start, kill, restart tasks; emulate hosts; inject slowdowns.

Example:

```python
from tfdist.testing import LocalCluster

with LocalCluster(workers=2, ps=2) as cluster:
    cluster.start(script="train.py", args=["--epochs", "2"])
    cluster.wait(timeout=120)          # raises LaunchError naming a failed task
    print(cluster.log("worker:1"))
```

Every wait is bounded and every child is killed when the block exits, even
when the test fails. :class:`NetnsCluster` runs tasks on emulated hosts
(Linux network namespaces on a bridge, optionally rate-limited links; root only).
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from typing import Callable, Sequence

from tfdist.cluster.local import LocalJob
from tfdist.config import ClusterConfig, JobConfig, TaskSpec, parse_task
from tfdist.ps.client import PSClient
from tfdist.testing.netns import Host, NetnsCluster

__all__ = ["LocalCluster", "NetnsCluster", "Host", "Slowdown", "SlowdownCallback", "ENV_SLOWDOWN", "slowdown_env",
           "run_python"]


def __getattr__(name):  # the Keras callback imports keras; load it only when asked
    if name in ("Slowdown", "SlowdownCallback", "ENV_SLOWDOWN", "slowdown_from_env"):
        from tfdist import slowdown  # the injector is part of the runtime; re-exported here

        return getattr(slowdown, name)
    raise AttributeError(name)


def slowdown_env(slowdowns: dict[str, dict]) -> dict[str, str]:
    """Environment that makes tfdist strategies slow the given tasks down.

    Example: ``LocalCluster(env={"worker:1": slowdown_env({"worker:1": {"factor": 3}})})``
    or pass it as every task's environment.
    """
    import json

    from tfdist.constants import ENV_SLOWDOWN

    return {ENV_SLOWDOWN: json.dumps(slowdowns)}


def run_python(argv: Sequence[str], env: dict[str, str] | None = None, timeout: float | None = None,
               cwd: str | None = None) -> subprocess.CompletedProcess:
    """``subprocess.run(argv, env=env, cwd=cwd, timeout=timeout, capture_output=True, text=True)`` for a
    ``python script.py ...`` or ``python -m module ...`` command line, forked from the zygote when fast start
    is on (``TFDIST_FAST_START=1``, as the test suite sets it; :mod:`tfdist.cluster.zygote`) and the zygote can
    run it as a fresh interpreter would: the same command line without importing TensorFlow anew (~7
    CPU-seconds). Otherwise, and with fast start off, it is ``subprocess.run``.

    On ``timeout`` the process group is killed and ``subprocess.TimeoutExpired`` raised, as ``subprocess.run``
    does.
    """
    import signal
    import threading

    from tfdist.cluster import zygote

    argv, env = list(argv), dict(os.environ if env is None else env)
    proc = zygote.try_spawn(argv, env, cwd=cwd)
    if proc is None:
        return subprocess.run(argv, env=env, cwd=cwd, timeout=timeout, capture_output=True, text=True)
    out: dict[str, str] = {}
    readers = [threading.Thread(target=lambda name=name, f=f: out.__setitem__(name, f.read()), daemon=True)
               for name, f in (("stdout", proc.stdout), ("stderr", proc.stderr))]
    for t in readers:
        t.start()
    try:
        code = proc.wait(timeout)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # the forked task leads its own process group
        except OSError:
            pass
        proc.wait(10)
        raise subprocess.TimeoutExpired(argv, timeout) from None
    finally:
        for t in readers:
            t.join(10)
        proc.stdout.close()
        proc.stderr.close()
    return subprocess.CompletedProcess(argv, code, out.get("stdout", ""), out.get("stderr", ""))


class LocalCluster:
    """A job of local processes on free 127.0.0.1 ports.

    Args:
        workers: Number of worker tasks.
        ps: Number of parameter-server tasks.
        chief: Add a chief task (worker id 0).
        evaluator: Add an ``evaluator`` task (it runs the same script; see
            ``strategy.evaluation_rounds``).
        config: Base :class:`JobConfig` (its cluster is replaced).
        log_dir: Per-task logs. Defaults to a fresh temporary directory.
        env: Extra environment per task, e.g.
            ``{"worker:1": slowdown_env({"worker:1": {"factor": 3}})}``.
        forward: Also print task output to stdout. Defaults to ``False``.
        fast_start: Fork the TensorFlow tasks from a process that imported
            TensorFlow once (seconds saved per task; see ``LocalJob``).
            Defaults to the environment variable ``TFDIST_FAST_START``.
    """

    def __init__(
        self,
        workers: int = 2,
        ps: int = 1,
        chief: bool = False,
        config: JobConfig | None = None,
        evaluator: bool = False,
        log_dir: str | None = None,
        env: dict[str, dict[str, str]] | None = None,
        forward: bool = False,
        fast_start: bool | None = None,
    ):
        config = config or JobConfig(name="test")
        config.cluster = ClusterConfig(chief=1 if chief else 0, worker=workers, ps=ps, evaluator=1 if evaluator else 0)
        self._tmp = None if log_dir else tempfile.TemporaryDirectory(prefix="tfdist-")
        self.log_dir = log_dir or self._tmp.name
        self.job = LocalJob(config, log_dir=self.log_dir, forward=forward, env=env, fast_start=fast_start)
        self.config = self.job.config
        self.token = self.job.token

    # ------------------------------------------------------------ control
    def start_ps(self, ready_timeout: float = 30.0) -> list[str]:
        """Starts only the PS tasks and waits (bounded) until they accept calls.

        Returns:
            Their addresses.
        """
        self.job.start([TaskSpec("ps", i) for i in range(len(self.config.cluster.ps))])
        with self.client() as c:
            self.job.wait_servers_ready(c, ready_timeout)  # fails at once, naming it, if a PS dies
        return list(self.config.cluster.ps)

    def start(self, script: str, args: Sequence[str] = (), tasks: Sequence[str | TaskSpec] | None = None) -> None:
        """Starts the PS tasks (if not running) and the training tasks running ``script``."""
        self.job.script, self.job.script_args = script, list(args)
        if tasks is None:
            tasks = [t for t in self.job.all_tasks() if not (str(t) in self.job.tasks and self.job.tasks[str(t)].running)]
        self.job.start([parse_task(t) if isinstance(t, str) else t for t in tasks])

    def wait(self, timeout: float, progress: Callable[[], object] | None = None,
             stall_s: float | None = None) -> None:
        """Waits (bounded) for every training task to exit 0.

        ``progress`` and ``stall_s``: also fail (and stop the job) when
        ``progress()`` kept its value for ``stall_s`` seconds, e.g. the number
        of result files written: a long job gets a generous ``timeout`` and
        its hang still fails soon (see :meth:`LocalJob.wait`).
        """
        self.job.wait(timeout, progress=progress, stall_s=stall_s)

    def kill(self, task: str | TaskSpec) -> None:
        self.job.kill(task)

    def restart(self, task: str | TaskSpec):
        return self.job.restart(task)

    def process(self, task: str | TaskSpec):
        return self.job.tasks[str(task)]

    def log(self, task: str | TaskSpec) -> str:
        """The complete output of a task so far."""
        t = parse_task(task) if isinstance(task, str) else task
        path = os.path.join(self.log_dir, f"{t.job}-{t.index}.log")
        if not os.path.exists(path):
            return ""
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()

    def env(self, task: str | TaskSpec) -> dict[str, str]:
        """The environment a task of this cluster gets (to run it yourself)."""
        from tfdist.cluster.local import task_environment

        t = parse_task(task) if isinstance(task, str) else task
        return task_environment(self.config, t, self.token)

    def client(self, rpc_timeout_s: float = 10.0) -> PSClient:
        """A PS client with this job's token."""
        return PSClient(self.config.cluster.ps, self.token, rpc_timeout_s=rpc_timeout_s,
                        stream=self.config.ps.transport == "auto", shared_memory=self.config.ps.shared_memory)

    def stop(self) -> None:
        self.job.stop(grace=2.0)

    def __enter__(self) -> "LocalCluster":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
        if self._tmp is not None:
            self._tmp.cleanup()
