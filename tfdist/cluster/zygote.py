"""Fast task start-up: a process that imported TensorFlow, Keras and tfdist once forks every task from there.

A TensorFlow task spends seconds importing TensorFlow and Keras before it
runs a line of its script; a local job of N tasks imports N times, and a test
suite hundreds of times. A *zygote* (the Android name) imports them once
and forks each task from that state: the child is a real, separate process
(its own pid, session, gRPC servers, TensorFlow runtime, which is created
after the fork) running the same command line it would have run, but it
starts in a fraction of a second.

Opt-in: ``LocalCluster(fast_start=True)`` or the environment variable
``TFDIST_FAST_START=1`` (the test suite sets it). A command the zygote cannot
run as it would have run (not ``python script.py ...`` or ``python -m module
...``, or an environment that differs in a variable read at import time, such
as ``KERAS_BACKEND`` or ``TF_USE_LEGACY_KERAS``) is started the usual way.

The zygote is started lazily, once per parent process, and dies with it
(``PR_SET_PDEATHSIG``); every forked task dies with the zygote the same way.
It never runs TensorFlow ops itself, so the fork copies no TensorFlow
runtime state (the imports leave two idle native threads, NumPy's OpenBLAS
pool and one of TensorFlow's; OpenBLAS re-creates its pool after a fork).
Each child reseeds Python's and NumPy's global random generators (a fresh
process would have different ones) and, with ``setproctitle`` installed,
shows its own command line in ``ps``. It keeps the zygote's string hash seed
(``PYTHONHASHSEED`` cannot change after start): every forked task hashes
strings alike, where fresh interpreters would not, so run a suite once with
``TFDIST_FAST_START=0`` to catch code that depends on set order agreeing
across processes.
"""

from __future__ import annotations

import io
import json
import logging
import os
import signal
import socket
import struct
import subprocess
import sys
import threading
from typing import Mapping, Sequence

from tfdist import exit_status

__all__ = ["fast_start_enabled", "Zygote", "ForkedProcess", "zygote", "can_fork"]

logger = logging.getLogger(__name__)

ENV_FAST_START = "TFDIST_FAST_START"
#: How long a task start waits for the zygote's fork before starting the task the usual way.
SPAWN_TIMEOUT_S = 60.0

#: What the zygote imports before forking (the expensive part of a TensorFlow task's start).
PRELOAD = ("numpy", "grpc", "tensorflow", "keras", "tfdist", "tfdist.strategies", "tfdist.callbacks",
           "tfdist.ps.server", "tfdist.data", "setproctitle")

#: Environment variables read while those modules import (or that change the interpreter): a task whose
#: value differs from the zygote's is started the usual way.
IMPORT_TIME_PREFIXES = ("KERAS_", "TF_USE_LEGACY_KERAS", "TF_CPP_", "TF_ENABLE_", "TF_XLA", "XLA_", "CUDA_",
                        "PYTHON", "LD_", "MALLOC_", "OMP_", "MKL_", "OPENBLAS_", "TF2_BEHAVIOR", "GRPC_",
                        "TFDIST_LOG")


def fast_start_enabled(flag: bool | None = None) -> bool:
    """``flag`` if given, else whether ``TFDIST_FAST_START`` is set to 1/true/yes."""
    if flag is not None:
        return flag
    return os.environ.get(ENV_FAST_START, "").strip().lower() in ("1", "true", "yes")


def _import_time_env(env: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if k.startswith(IMPORT_TIME_PREFIXES)}


def _target(argv: Sequence[str]) -> tuple[str, str, list[str]] | None:
    """``("script", path, args)`` or ``("module", name, args)`` for a plain ``python`` command line, else None."""
    if len(argv) < 2 or os.path.realpath(argv[0]) != os.path.realpath(sys.executable):
        return None
    if argv[1] == "-m" and len(argv) >= 3:
        return "module", argv[2], list(argv[3:])
    if argv[1].startswith("-"):
        return None
    return "script", argv[1], list(argv[2:])


# ------------------------------------------------------------------ framing (both sides)
def _send(sock: socket.socket, message: dict, fds: Sequence[int] = ()) -> None:
    data = json.dumps(message).encode()
    header = struct.pack("!I", len(data))
    if fds:
        socket.send_fds(sock, [header + data], list(fds))
    else:
        sock.sendall(header + data)


def _recv_exact(sock: socket.socket, n: int, fds: list[int] | None = None) -> bytes:
    out = b""
    while len(out) < n:
        if fds is not None and not out:
            chunk, got, _, _ = socket.recv_fds(sock, n - len(out), 4)
            fds.extend(got)
        else:
            chunk = sock.recv(n - len(out))
        if not chunk:
            raise EOFError("zygote connection closed")
        out += chunk
    return out


def _recv(sock: socket.socket, fds: list[int] | None = None) -> dict:
    (size,) = struct.unpack("!I", _recv_exact(sock, 4, fds))
    return json.loads(_recv_exact(sock, size))


# ------------------------------------------------------------------ parent side
class ForkedProcess:
    """The part of ``subprocess.Popen`` that :class:`~tfdist.cluster.process.TaskProcess` uses, for a forked task."""

    def __init__(self, zygote: "Zygote", pid: int, stdout, stderr):
        self._zygote = zygote
        self.pid = pid
        self.stdout = stdout
        self.stderr = stderr
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self._zygote.exit_code(self.pid)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            code = self._zygote.wait_exit(self.pid, timeout)
            if code is None:
                raise subprocess.TimeoutExpired([str(self.pid)], timeout)
            self.returncode = code
        return self.returncode


class Zygote:
    """One zygote process and the exit codes of the tasks it forked."""

    def __init__(self, env: Mapping[str, str]):
        self.env = dict(env)
        self._import_env = _import_time_env(self.env)
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        self._proc = subprocess.Popen(
            [sys.executable, "-c", "from tfdist.cluster.zygote import _serve; _serve()", str(child.fileno()),
             str(os.getpid())],
            env=self.env, stdin=subprocess.DEVNULL, pass_fds=[child.fileno()], start_new_session=True,
        )
        child.close()
        self._sock = parent
        self._request_lock = threading.Lock()
        self._next_id = 0
        self._exits: dict[int, int] = {}
        self._replies: dict[int, dict] = {}  # request id -> reply
        self._abandoned: set[int] = set()  # requests whose reply came too late
        self._cond = threading.Condition()
        self._dead: str | None = None
        threading.Thread(target=self._read, daemon=True, name="tfdist-zygote-reader").start()
        try:
            self._wait_reply(0, "ready", timeout=120.0)
        except Exception:
            self.close()
            raise

    # The zygote sends {"id": 0, "ready"}, {"id": n, "pid": ...} or {"id": n, "error": ...} replies, and
    # {"exit": pid, "code": c} any time.
    def _read(self) -> None:
        try:
            while True:
                message = _recv(self._sock)
                with self._cond:
                    if "exit" in message:
                        self._exits[int(message["exit"])] = int(message["code"])
                    else:
                        request_id = int(message.get("id", 0))
                        if "pid" in message:  # a pid the kernel reused: its old exit code is not this task's
                            self._exits.pop(int(message["pid"]), None)
                        if request_id in self._abandoned:  # its caller gave up and started the task itself
                            self._abandoned.discard(request_id)
                            if "pid" in message:
                                _kill_group(int(message["pid"]))
                            continue
                        self._replies[request_id] = message
                    self._cond.notify_all()
        except Exception as e:  # EOF, a broken socket, a garbled message: the zygote is unusable
            with self._cond:
                self._dead = f"the zygote process ended ({type(e).__name__}: {e})"
                self._cond.notify_all()

    def _wait_reply(self, request_id: int, kind: str, timeout: float) -> dict:
        with self._cond:
            if not self._cond.wait_for(lambda: request_id in self._replies or self._dead, timeout):
                raise RuntimeError(f"no {kind!r} reply from the zygote within {timeout:.0f} s")
            if request_id not in self._replies:
                raise RuntimeError(self._dead)
            return self._replies.pop(request_id)

    @property
    def alive(self) -> bool:
        return self._dead is None and self._proc.poll() is None

    def accepts(self, argv: Sequence[str], env: Mapping[str, str]) -> bool:
        """Whether the zygote can run ``argv`` with ``env`` exactly as a fresh interpreter would."""
        return self.alive and _target(argv) is not None and _import_time_env(env) == self._import_env

    def spawn(self, argv: Sequence[str], env: Mapping[str, str]) -> ForkedProcess:
        """Forks a task running ``argv`` with ``env``; its stdout and stderr are pipes, as with Popen.

        When the zygote does not answer in time the task starts the usual
        way, and the fork the zygote makes late is killed when its pid
        arrives: none runs beside it.
        """
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        try:
            with self._request_lock:
                self._next_id += 1
                request_id = self._next_id
                _send(self._sock, {"id": request_id, "argv": list(argv), "env": dict(env), "cwd": os.getcwd()},
                      [out_w, err_w])
                try:
                    reply = self._wait_reply(request_id, "pid", timeout=SPAWN_TIMEOUT_S)
                except Exception:
                    with self._cond:  # a late fork of it is killed as soon as its pid arrives (see _read)
                        self._abandoned.add(request_id)
                    raise
        except Exception:
            os.close(out_r)
            os.close(err_r)
            raise
        finally:
            os.close(out_w)
            os.close(err_w)
        if "pid" not in reply:
            os.close(out_r)
            os.close(err_r)
            raise RuntimeError(f"the zygote could not start {argv}: {reply.get('error')}")
        stdout = io.open(out_r, "r", encoding="utf-8", errors="replace", buffering=1)
        stderr = io.open(err_r, "r", encoding="utf-8", errors="replace", buffering=1)
        return ForkedProcess(self, int(reply["pid"]), stdout, stderr)

    def exit_code(self, pid: int) -> int | None:
        with self._cond:
            if pid in self._exits:
                return self._exits[pid]
            if self._dead is not None:
                return -signal.SIGKILL  # its zygote died: so did it (PR_SET_PDEATHSIG)
            return None

    def wait_exit(self, pid: int, timeout: float | None) -> int | None:
        with self._cond:
            self._cond.wait_for(lambda: pid in self._exits or self._dead is not None, timeout)
        return self.exit_code(pid)

    def close(self) -> None:
        with self._cond:
            self._dead = self._dead or "closed"
            self._cond.notify_all()
        try:
            self._sock.close()
        finally:
            if self._proc.poll() is None:
                self._proc.kill()
            self._proc.wait(10)


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except OSError:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


_zygote: Zygote | None = None
_failed = False
_zygote_lock = threading.Lock()


def zygote(env: Mapping[str, str]) -> Zygote | None:
    """This process's zygote (started on first use with ``env``); None if it cannot start.

    It is started from a thread that lives as long as this process: Linux
    sends the parent-death signal when the *thread* that forked a child ends,
    and the zygote must outlive whichever thread first started a task.
    """
    global _zygote, _failed
    with _zygote_lock:
        if _zygote is not None and _zygote.alive:
            return _zygote
        if _failed:  # it could not start (or stopped answering) once: tasks start the usual way from now on
            return None
        result: list = []
        started = threading.Event()

        def own() -> None:
            try:
                result.append(Zygote(env))
            except Exception as e:  # tasks then start the usual way
                result.append(e)
            started.set()
            threading.Event().wait()  # keep this thread (the zygote's parent) alive

        threading.Thread(target=own, daemon=True, name="tfdist-zygote-owner").start()
        started.wait()
        if isinstance(result[0], Exception):
            logger.warning("fast start unavailable (%s); starting tasks the usual way", result[0])
            _zygote, _failed = None, True
        else:
            _zygote = result[0]
        return _zygote


def can_fork() -> bool:
    return sys.platform.startswith("linux") and hasattr(socket, "send_fds")


# ------------------------------------------------------------------ zygote side
def _die_with(parent_pid: int) -> None:
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass
    if os.getppid() != parent_pid:
        os._exit(137)


def _serve() -> None:
    """The zygote's main loop (``python -c ... FD PARENT_PID``): fork a task per request, report exits."""
    import importlib
    import select

    fd, parent_pid = int(sys.argv[1]), int(sys.argv[2])
    _die_with(parent_pid)
    sock = socket.socket(fileno=fd)
    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except ImportError:  # optional (setproctitle): the child imports what it needs
            pass
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    _send(sock, {"id": 0, "ready": True})
    me = os.getpid()
    while True:
        readable, _, _ = select.select([sock, wake_r], [], [])
        if wake_r in readable:
            os.read(wake_r, 4096)
            _reap(sock)
        if sock in readable:
            fds: list[int] = []
            try:
                request = _recv(sock, fds)
            except (EOFError, OSError):
                os._exit(0)  # the parent is gone: so are we (and our tasks, by their death signal)
            except ValueError as e:  # a garbled request: refuse it, keep serving the others
                _send(sock, {"id": -1, "error": f"bad request: {e}"})
                continue
            try:
                pid = os.fork()
            except OSError as e:  # EAGAIN, ENOMEM: this task starts the usual way; the others live on
                for f in fds:
                    os.close(f)
                _send(sock, {"id": request.get("id", -1), "error": f"fork failed: {e}"})
                continue
            if pid == 0:
                os.close(wake_r)
                os.close(wake_w)
                _child(sock, request, fds, me)  # never returns
            try:  # its own process group before anyone can signal it (the child does the same: no race)
                os.setpgid(pid, pid)
            except OSError:
                pass
            for f in fds:
                os.close(f)
            _send(sock, {"id": request.get("id", -1), "pid": pid})
        _reap(sock)


def _reap(sock: socket.socket) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        _send(sock, {"exit": pid, "code": os.waitstatus_to_exitcode(status)})


def _set_title(argv: Sequence[str]) -> None:
    """Shows the task's command line in ``ps`` and ``/proc/PID/cmdline`` (with ``setproctitle``, if installed)."""
    try:
        import setproctitle
    except ImportError:
        return
    setproctitle.setproctitle(" ".join(argv))


def _child(sock: socket.socket, request: dict, fds: list[int], zygote_pid: int) -> None:
    """In the forked task: become the command line ``request["argv"]`` would have started."""
    code: int | str | None = 0
    try:
        sock.close()
        signal.set_wakeup_fd(-1)
        for sig in (signal.SIGCHLD, signal.SIGTERM):  # as a fresh interpreter has them (SIGPIPE stays ignored)
            signal.signal(sig, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        os.setpgid(0, 0)  # the task's process group, signalled as a whole (the zygote's session: no terminal)
        _die_with(zygote_pid)
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.dup2(fds[0], 1)
        os.dup2(fds[1], 2)
        for f in (devnull, *fds):
            os.close(f)
        sys.stdin = io.open(0, "r", closefd=False)
        sys.stdout = io.open(1, "w", encoding="utf-8", errors="backslashreplace", buffering=1, closefd=False)
        sys.stderr = io.open(2, "w", encoding="utf-8", errors="backslashreplace", buffering=1, closefd=False)
        _set_title(request["argv"])  # before the environment changes (setproctitle needs the original)
        os.environ.clear()
        os.environ.update(request["env"])
        os.chdir(request["cwd"])
        import random

        import numpy as np

        random.seed()
        np.random.seed()
        kind, name, args = _target(request["argv"])
    except BaseException:  # pragma: no cover - set-up failed: say why, exit like a crashed interpreter
        import traceback

        traceback.print_exc()
        os._exit(1)
    import runpy

    try:
        if kind == "module":
            sys.argv = [name, *args]
            sys.path[0] = os.getcwd()
            runpy.run_module(name, run_name="__main__", alter_sys=True)
        else:
            if not os.path.isfile(name):  # as CPython says it, with its exit code
                print(f"{request['argv'][0]}: can't open file {os.path.abspath(name)!r}: [Errno 2] No such file or "
                      "directory", file=sys.stderr)
                raise SystemExit(2)
            sys.argv = [name, *args]
            sys.path[0] = os.path.dirname(os.path.abspath(name))
            runpy.run_path(name, run_name="__main__")
    except SystemExit as e:
        code = e.code
        exit_status.record_exit(code)
    except KeyboardInterrupt as e:  # as CPython ends on an unhandled SIGINT: killed by it (exit code -2)
        import traceback

        traceback.print_exc()
        sys.stderr.flush()
        exit_status.record_exit(exit_status.EXIT_SIGINT, e)
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
        code = 130
    except BaseException as e:  # as CPython: the traceback, exit 1 (a ConfigError: its own code, never restarted)
        import traceback

        traceback.print_exc()
        code = exit_status.exit_code_for(e)
        exit_status.record_exit(code, e)
    # A normal interpreter exit from here: atexit handlers (a worker's Done), thread joins, flushes.
    raise SystemExit(code)
