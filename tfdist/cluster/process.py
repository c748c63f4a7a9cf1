"""One task of a local cluster as a child process with prefixed, logged output.

Children run in their own process group and get SIGKILL if the launcher
dies (Linux ``PR_SET_PDEATHSIG``), so no task outlives the job.
"""

from __future__ import annotations

import collections
import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from typing import IO, Sequence

from tfdist.config import TaskSpec

__all__ = ["TaskProcess"]

logger = logging.getLogger(__name__)


#: Runs in a fresh interpreter before the task: ask the kernel to SIGKILL us when the launcher dies
#: (PR_SET_PDEATHSIG survives exec), give up if it already died, then exec the task. A ``preexec_fn``
#: would do this between fork and exec, which is unsafe in a launcher with threads (gRPC, log pumps):
#: the forked child can crash or deadlock on a lock another thread held.
_DIE_WITH_PARENT = (
    "import ctypes,os,signal,sys\n"
    "try: ctypes.CDLL('libc.so.6', use_errno=True).prctl(1, signal.SIGKILL)\n"
    "except OSError: pass\n"
    "if os.getppid() != int(sys.argv[1]): sys.exit(137)\n"
    "os.execv(sys.argv[2], sys.argv[2:])\n"
)


#: Where ``ip netns`` keeps a file per named network namespace (iproute2's NETNS_RUN_DIR).
NETNS_RUN_DIR = "/var/run/netns"


def sbin_tool(name: str) -> str | None:
    """Path of a system tool (iproute2's ``ip``, ``tc``) on PATH or in the sbin directories, or None."""
    return shutil.which(name) or next((p for p in (f"/usr/sbin/{name}", f"/sbin/{name}") if os.path.exists(p)), None)


def ip_binary() -> str | None:
    """Path of iproute2's ``ip`` command, or None if it is not installed."""
    return sbin_tool("ip")


def _with_parent_death_signal(argv: list[str]) -> list[str]:
    """``argv`` wrapped so the task dies with this process (Linux); unchanged elsewhere."""
    if not sys.platform.startswith("linux") or not argv or not os.path.isabs(argv[0]):
        return list(argv)
    return [sys.executable, "-S", "-c", _DIE_WITH_PARENT, str(os.getpid()), *argv]


class TaskProcess:
    """A running task: its process, its log file and the tail of its output.

    Args:
        task: Which task this is (used as the output prefix ``[worker:1]``).
        argv: Command line.
        env: Full environment of the child.
        log_path: File receiving the child's complete stdout and stderr.
        forward_stdout: Copy the child's stdout to ours (prefixed).
        forward_stderr: Copy the child's stderr to ours (prefixed).
        out: Where forwarded output goes. Defaults to ``sys.stdout``.
        fast_start: Fork the task from this process's zygote (:mod:`tfdist.cluster.zygote`) when it can
            run ``argv`` as a fresh interpreter would. Defaults to ``False``.
        netns: Name of a network namespace (``ip netns``) the task runs in: started as ``ip netns exec
            NETNS argv``, or forked into it. Defaults to None: this process's.
    """

    def __init__(
        self,
        task: TaskSpec,
        argv: Sequence[str],
        env: dict[str, str],
        log_path: str | None = None,
        forward_stdout: bool = True,
        forward_stderr: bool = True,
        out: IO[str] | None = None,
        tail_lines: int = 40,
        fast_start: bool = False,
        netns: str | None = None,
    ):
        self.task = task
        self.argv = list(argv)
        self.env = env
        self.log_path = log_path
        self.forward_stdout = forward_stdout
        self.forward_stderr = forward_stderr
        self._out = out
        self.tail: collections.deque[str] = collections.deque(maxlen=tail_lines)
        self.proc: subprocess.Popen | None = None
        self._pumps: list[threading.Thread] = []
        self._log = None
        self._write_lock = threading.Lock()
        self.started_at: float | None = None
        #: Fork the task from a zygote that imported TensorFlow once (:mod:`tfdist.cluster.zygote`).
        self.fast_start = fast_start
        #: Whether this task was forked from the zygote.
        self.forked = False
        #: The network namespace the task runs in (``ip netns`` name), or None.
        self.netns = netns

    @property
    def prefix(self) -> str:
        return f"[{self.task}] "

    def start(self) -> "TaskProcess":
        if self.log_path:
            os.makedirs(os.path.dirname(self.log_path) or ".", exist_ok=True)
            self._log = open(self.log_path, "a", encoding="utf-8", errors="replace")
        self.proc = self._fork() if self.fast_start else None
        self.forked = self.proc is not None
        argv = self.argv if self.netns is None else [ip_binary() or "ip", "netns", "exec", self.netns, *self.argv]
        self.proc = self.proc or subprocess.Popen(
            _with_parent_death_signal(argv),
            env=self.env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
            text=True,
            errors="replace",
            bufsize=1,
        )
        self.started_at = time.monotonic()
        for stream, forward in ((self.proc.stdout, self.forward_stdout), (self.proc.stderr, self.forward_stderr)):
            t = threading.Thread(target=self._pump, args=(stream, forward), daemon=True, name=f"pump-{self.task}")
            t.start()
            self._pumps.append(t)
        logger.debug("started %s (pid %d): %s", self.task, self.proc.pid, " ".join(self.argv))
        return self

    def _fork(self):
        """The task forked from this process's zygote, or None when it must start the usual way."""
        from tfdist.cluster import zygote

        if not zygote.can_fork():
            return None
        z = zygote.zygote(self.env)
        if z is None or not z.accepts(self.argv, self.env):
            return None
        try:
            netns = None if self.netns is None else os.path.join(NETNS_RUN_DIR, self.netns)
            return z.spawn(self.argv, self.env, netns=netns)
        except Exception as e:
            logger.warning("could not fork %s from the zygote (%s); starting it the usual way", self.task, e)
            return None

    def _pump(self, stream, forward: bool) -> None:
        for line in iter(stream.readline, ""):
            self.tail.append(line.rstrip("\n"))
            with self._write_lock:
                if self._log is not None:
                    self._log.write(line)
                    self._log.flush()
            if forward:
                out = self._out or sys.stdout
                try:
                    out.write(self.prefix + line)
                    out.flush()
                except ValueError:  # our stdout closed
                    pass
        stream.close()

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def poll(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def wait(self, timeout: float | None = None) -> int | None:
        """Waits up to ``timeout`` s; returns the exit code or None if running."""
        if self.proc is None:
            return None
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None
        self._finish_pumps()
        return code

    def _finish_pumps(self) -> None:
        for t in self._pumps:
            t.join(timeout=5)
        if self._log is not None:
            with self._write_lock:
                self._log.close()
                self._log = None

    def signal(self, sig: int) -> None:
        """Sends ``sig`` to the task's whole process group."""
        if self.running:
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                pass

    def stop(self, grace: float = 5.0) -> int | None:
        """SIGTERM, then SIGKILL after ``grace`` seconds; returns the exit code."""
        if self.proc is None:
            return None
        if self.running:
            self.signal(signal.SIGTERM)
            if self.wait(grace) is None:
                self.kill()
        return self.wait(10)

    def kill(self) -> None:
        """SIGKILL to the task's process group (simulates a crash)."""
        self.signal(signal.SIGKILL)
        if self.proc is not None:
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:  # pragma: no cover - kernel trouble
                logger.error("task %s (pid %d) did not die after SIGKILL", self.task, self.proc.pid)
        self._finish_pumps()

    def describe_exit(self) -> str:
        code = self.poll()
        if code is None:
            return f"{self.task} is running"
        if code < 0:
            try:
                name = signal.Signals(-code).name
            except ValueError:
                name = str(-code)
            return f"{self.task} was killed by {name}"
        return f"{self.task} exited with code {code}"
