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

A task can run in another network namespace (``spawn(..., netns=PATH)``, as
:class:`~tfdist.testing.NetnsCluster` runs each emulated host's tasks): the
forked child enters it with ``setns`` before it starts a thread, so its
sockets and every thread it starts live there, as under ``ip netns exec``.

A process can also lend its zygote to the processes it starts:
:func:`serve_forks` listens on a Unix socket and names it in
``TFDIST_ZYGOTE_SOCKET``; a process that finds that variable (e.g. a
``python -m tfdist.launch`` a test started) asks that zygote for a zygote of
its own, forked with TensorFlow already imported, instead of importing
TensorFlow again. That forked zygote serves the one connection and ends when
the connection closes (the asking process ended, however it ended); its tasks
end with it by their death signal, as with a zygote of one's own.
"""

from __future__ import annotations

import atexit
import gc
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

from tfdist import constants

__all__ = ["fast_start_enabled", "Zygote", "ForkedProcess", "zygote", "can_fork", "serve_forks",
           "ZygoteLender"]

logger = logging.getLogger(__name__)

ENV_FAST_START = "TFDIST_FAST_START"
#: How long a task start waits for the zygote's fork before starting the task the usual way.
SPAWN_TIMEOUT_S = 60.0

#: What the zygote imports before forking (the expensive part of a TensorFlow task's start).
PRELOAD = ("numpy", "grpc", "tensorflow", "keras", "tfdist", "tfdist.strategies.all_reduce",
           "tfdist.strategies.parameter_server", "tfdist.callbacks", "tfdist.ps.server", "tfdist.data",
           "setproctitle")

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
    found = {k: v for k, v in env.items() if k.startswith(IMPORT_TIME_PREFIXES)}
    if found.get("TF2_BEHAVIOR") == "1":  # what ``import tensorflow`` sets it to: a process that imported TF has it
        del found["TF2_BEHAVIOR"]
    return found


#: The import-time variables this zygote process started with (set in the zygote, before its imports).
_started_env: dict[str, str] = {}


def _target(argv: Sequence[str]) -> tuple[str, str, list[str]] | None:
    """``("script", path, args)`` or ``("module", name, args)`` for a plain ``python`` command line, else None."""
    if len(argv) < 2 or os.path.realpath(argv[0]) != os.path.realpath(sys.executable):
        return None
    if argv[1:3] == ["-m", "tfdist.run"] and len(argv) >= 4:  # what tfdist.run would run, run the same way here
        inner = list(argv[3:])
        if inner[0] == "-m":
            return ("module", inner[1], inner[2:]) if len(inner) >= 2 else None
        return None if inner[0].startswith("-") else ("script", inner[0], inner[1:])
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

    def __init__(self, env: Mapping[str, str], address: str | None = None):
        """Starts a zygote process with ``env``, or, given ``address``, asks the one lent there for its own.

        Args:
            env: The environment the zygote imports under (tasks whose import-time variables differ are
                not forked).
            address: Path of a Unix socket served by :func:`serve_forks` in another process. The zygote
                forked there has that process's environment; its import-time variables are the ones
                compared.
        """
        self.env = dict(env)
        self._import_env = _import_time_env(self.env)
        self._proc: subprocess.Popen | None = None
        if address is None:
            parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
            self._proc = subprocess.Popen(
                [sys.executable, "-c", "from tfdist.cluster.zygote import _serve; _serve()", str(child.fileno()),
                 str(os.getpid())],
                env=self.env, stdin=subprocess.DEVNULL, pass_fds=[child.fileno()], start_new_session=True,
            )
            child.close()
        else:
            parent = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                parent.settimeout(10.0)
                parent.connect(address)
                parent.settimeout(None)
            except OSError:
                parent.close()
                raise
        self._sock = parent
        self._request_lock = threading.Lock()
        self._next_id = 0
        self._exits: dict[int, int] = {}
        self._replies: dict[int, dict] = {}  # request id -> reply
        self._abandoned: set[int] = set()  # requests whose reply came too late
        self._cond = threading.Condition()
        self._dead: str | None = None
        self._reader = threading.Thread(target=self._read, daemon=True, name="tfdist-zygote-reader")
        self._reader.start()
        try:
            ready = self._wait_reply(0, "ready", timeout=120.0)
        except Exception:
            self.close()
            raise
        #: A lent zygote's pid (it says so when ready; a connection's peer is the lender, not it).
        self._lent_pid = int(ready.get("pid", 0))
        if "import_env" in ready:  # a lent zygote: it imported under its owner's environment
            self._import_env = dict(ready["import_env"])

    @property
    def lent(self) -> bool:
        """Whether this zygote was forked from another process's (:func:`serve_forks`)."""
        return self._proc is None

    @property
    def pid(self) -> int:
        """The zygote process's pid: the one started here, or the lent one serving this process's connection."""
        return self._proc.pid if self._proc is not None else self._lent_pid

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
        return self._dead is None and (self._proc is None or self._proc.poll() is None)

    def accepts(self, argv: Sequence[str], env: Mapping[str, str]) -> bool:
        """Whether the zygote can run ``argv`` with ``env`` exactly as a fresh interpreter would."""
        return self.alive and _target(argv) is not None and _import_time_env(env) == self._import_env

    def spawn(self, argv: Sequence[str], env: Mapping[str, str], netns: str | None = None,
              cwd: str | None = None) -> ForkedProcess:
        """Forks a task running ``argv`` with ``env``; its stdout and stderr are pipes, as with Popen.

        When the zygote does not answer in time the task starts the usual
        way, and the fork the zygote makes late is killed when its pid
        arrives: none runs beside it.

        Args:
            argv: The task's command line (``python script.py ...`` or ``python -m module ...``).
            env: Its full environment.
            netns: Path of a network namespace (``/var/run/netns/NAME``, as ``ip netns`` names them) the
                task enters before it runs a line (``setns``), as under ``ip netns exec NAME argv``.
                Defaults to None: the zygote's.
            cwd: Its working directory. Defaults to this process's.
        """
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        try:
            with self._request_lock:
                self._next_id += 1
                request_id = self._next_id
                request = {"id": request_id, "argv": list(argv), "env": dict(env), "cwd": cwd or os.getcwd()}
                if netns is not None:
                    request["netns"] = netns
                _send(self._sock, request, [out_w, err_w])
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
        """Ends the zygote; a lent one ends when it reads the end of the connection (waited for, 10 s at most)."""
        if self._proc is None and self._dead is None:
            try:
                self._sock.shutdown(socket.SHUT_WR)
            except OSError:
                pass
            self._reader.join(10.0)  # its end of the connection closes when it has exited
        with self._cond:
            self._dead = self._dead or "closed"
            self._cond.notify_all()
        try:
            self._sock.close()
        finally:
            if self._proc is not None:
                if self._proc.poll() is None:
                    self._proc.kill()
                self._proc.wait(10)

    def lend(self, connection: socket.socket, timeout: float = SPAWN_TIMEOUT_S) -> int:
        """Forks a zygote that serves ``connection`` (another process's); returns its pid.

        The forked zygote answers on ``connection`` as a zygote started for
        that process would, and ends when the connection closes.
        """
        with self._request_lock:
            self._next_id += 1
            request_id = self._next_id
            _send(self._sock, {"id": request_id, "lend": True}, [connection.fileno()])
            try:
                reply = self._wait_reply(request_id, "pid", timeout=timeout)
            except Exception:
                with self._cond:
                    self._abandoned.add(request_id)
                raise
        if "pid" not in reply:
            raise RuntimeError(f"the zygote could not fork a zygote to lend: {reply.get('error')}")
        return int(reply["pid"])


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
_lent_failed = False
#: The socket this process lends its own zygote on (:func:`serve_forks`): never asked by this process itself.
_lending_at: set[str] = set()


def zygote(env: Mapping[str, str]) -> Zygote | None:
    """This process's zygote (started on first use with ``env``); None if it cannot start.

    With ``TFDIST_ZYGOTE_SOCKET`` set (another process lends its zygote,
    :func:`serve_forks`), the zygote is forked there; if that fails, one is
    started here. A zygote of one's own is started from a thread that lives
    as long as this process: Linux sends the parent-death signal when the
    *thread* that forked a child ends, and the zygote must outlive whichever
    thread first started a task.
    """
    global _zygote, _failed, _lent_failed
    with _zygote_lock:
        if _zygote is not None and _zygote.alive:
            return _zygote
        address = os.environ.get(constants.ENV_ZYGOTE_SOCKET, "")
        if address and address not in _lending_at and not _lent_failed:
            try:
                lent = Zygote(env, address=address)
                mine = _import_time_env(env)
                if lent._import_env == mine:
                    atexit.register(lent.close)  # a clean exit waits for it to end (no child left behind)
                    _zygote = lent
                    return _zygote
                # A warning: the fallback costs a TensorFlow import here, which is what lending saves (a test run
                # once lost it for a whole session unseen, at INFO). Names only: the values may be paths.
                differ = sorted(k for k in set(mine) | set(lent._import_env) if mine.get(k) != lent._import_env.get(k))
                logger.warning("the zygote lent at %s imported under other import-time variables than this process "
                               "(%s); starting one here (a TensorFlow import)", address, ", ".join(differ))
                lent.close()
                _lent_failed = True
            except (OSError, RuntimeError) as e:  # the lender is gone or refused: import here, as without it
                logger.warning("could not use the zygote lent at %s=%s (%s); starting one here",
                               constants.ENV_ZYGOTE_SOCKET, address, e)
                _zygote, _lent_failed = None, True
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


def try_spawn(argv: Sequence[str], env: Mapping[str, str], cwd: str | None = None) -> ForkedProcess | None:
    """``argv`` forked from this process's zygote when fast start is on and it can run ``argv`` with ``env`` as a
    fresh interpreter would; None otherwise (or if the fork failed): start it the usual way then.

    The zygote, if not started yet, starts with this process's environment, not ``env``'s."""
    if not (fast_start_enabled() and can_fork()):
        return None
    z = zygote(dict(os.environ))
    if z is None or not z.accepts(argv, env):
        return None
    try:
        return z.spawn(argv, env, cwd=cwd)
    except (OSError, RuntimeError):
        return None


class ZygoteLender:
    """Lends this process's zygote to other processes on a Unix socket (see :func:`serve_forks`)."""

    def __init__(self, path: str, env: Mapping[str, str] | None = None):
        self.path = path
        self._env = None if env is None else dict(env)
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind(path)
        os.chmod(path, 0o600)
        self._listener.listen(64)
        self._closed = threading.Event()
        _lending_at.add(path)
        self._thread = threading.Thread(target=self._accept, daemon=True, name="tfdist-zygote-lender")
        self._thread.start()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                connection, _ = self._listener.accept()
            except OSError:  # closed
                return
            with connection:
                try:
                    _pid, uid, _gid = struct.unpack("3i", connection.getsockopt(
                        socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
                    if uid != os.getuid():  # the socket is the owner's only (0600): defence in depth
                        continue
                    z = zygote(os.environ if self._env is None else self._env)  # started on first use
                    if z is not None:
                        z.lend(connection)
                except (OSError, RuntimeError) as e:  # the asker reads the end of the connection, imports itself
                    logger.warning("could not lend the zygote (%s)", e)

    def close(self) -> None:
        """Stops lending; zygotes already lent go on until their connections close."""
        self._closed.set()
        _lending_at.discard(self.path)
        try:
            self._listener.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._listener.close()
        self._thread.join(10.0)
        try:
            os.unlink(self.path)
        except OSError:
            pass


def serve_forks(path: str, env: Mapping[str, str] | None = None) -> ZygoteLender:
    """Lends this process's zygote to the processes it starts, on the Unix socket ``path``.

    Set ``TFDIST_ZYGOTE_SOCKET=path`` in their environment: with fast start
    on, each asks here for a zygote forked from this process's (started on
    the first ask, with ``env``, default ``os.environ`` as it is then) instead of importing
    TensorFlow in a zygote of its own. Only processes of this user can
    connect (the socket is mode 0600). A test suite that starts many
    launchers saves one TensorFlow import per launcher.

    Example:

    ```python
    lender = serve_forks(os.path.join(private_dir, "zygote.sock"))
    os.environ["TFDIST_ZYGOTE_SOCKET"] = lender.path
    ...
    lender.close()
    ```
    """
    return ZygoteLender(path, env)


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

    fd, parent_pid = int(sys.argv[1]), int(sys.argv[2])
    _die_with(parent_pid)
    sock = socket.socket(fileno=fd)
    _started_env.update(_import_time_env(os.environ))  # before the imports change it (as TensorFlow's does)
    # TensorFlow's C++ start-up lines (written before its logging is set up, whatever TF_CPP_MIN_LOG_LEVEL says)
    # would land on the terminal of whoever started the zygote, saying nothing a task needs. Restored after.
    saved = [os.dup(1), os.dup(2)]
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.dup2(devnull, 2)
    try:
        for name in PRELOAD:
            try:
                importlib.import_module(name)
            except ImportError:  # optional (setproctitle): the child imports what it needs
                pass
    finally:
        for fd, old in zip((1, 2), saved):
            os.dup2(old, fd)
            os.close(old)
        os.close(devnull)
    # The imported modules' objects (hundreds of thousands with TensorFlow and Keras) live as long as any task:
    # frozen, a task's full collections skip them (each would take ~0.2 s of CPU: every worker runs one at exit)
    # and no collection writes to their pages, which a forked task shares with the zygote until written.
    gc.collect()
    gc.freeze()
    _serve_connection(sock, {"id": 0, "ready": True})


def _serve_connection(sock: socket.socket, ready: dict) -> None:
    """Answers ``ready``, then forks a task (or a zygote to lend) per request on ``sock``; never returns."""
    import select

    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    _send(sock, ready)
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
                if request.get("netns"):  # opened here: a namespace that is gone is refused, not a task that dies
                    fds.append(os.open(request["netns"], os.O_RDONLY | os.O_CLOEXEC))
                pid = os.fork()
            except OSError as e:  # EAGAIN, ENOMEM, no such namespace: this task starts the usual way
                for f in fds:
                    os.close(f)
                _send(sock, {"id": request.get("id", -1), "error": f"fork failed: {e}"})
                continue
            if pid == 0:
                os.close(wake_r)
                os.close(wake_w)
                if request.get("lend"):
                    _lent(sock, fds, me)  # never returns
                _child(sock, request, fds, me)  # never returns
            if not request.get("lend"):
                try:  # its own process group before anyone can signal it (the child does the same: no race)
                    os.setpgid(pid, pid)
                except OSError:
                    pass
            for f in fds:
                os.close(f)
            _send(sock, {"id": request.get("id", -1), "pid": pid})
        _reap(sock)


def _lent(sock: socket.socket, fds: list[int], zygote_pid: int) -> None:
    """In a zygote forked to lend: serve the connection ``fds[0]`` (another process's) until it closes.

    Never returns: it ends by ``os._exit`` when the connection closes, and its forked tasks end by raising
    ``SystemExit`` through here, as a task of the zygote itself does through :func:`_serve`.
    """
    sock.close()
    for f in fds[1:]:
        os.close(f)
    connection = socket.socket(fileno=fds[0])
    _die_with(zygote_pid)
    asker = struct.unpack("3i", connection.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                                      struct.calcsize("3i")))[0]
    _set_title([f"tfdist-zygote lent to pid {asker}"])  # ps tells which process's tasks are below it
    _serve_connection(connection, {"id": 0, "ready": True, "import_env": _started_env, "pid": os.getpid()})


#: ``setns`` flag of a network namespace (linux/sched.h).
_CLONE_NEWNET = 0x40000000


def _enter_network_namespace(fd: int) -> None:
    """Moves this (single-threaded) process into the network namespace open at ``fd``, then closes ``fd``."""
    import ctypes

    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    try:
        if libc.setns(fd, _CLONE_NEWNET) != 0:
            errno = ctypes.get_errno()
            raise OSError(errno, f"setns into the task's network namespace failed: {os.strerror(errno)}")
    finally:
        os.close(fd)


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
    global _forked_task
    try:
        netns_fd = fds.pop() if request.get("netns") else None
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
        if netns_fd is not None:  # while this process has one thread: every thread it starts is inside too
            _enter_network_namespace(netns_fd)
        os.chdir(request["cwd"])
        _forked_task = True
    except BaseException:  # pragma: no cover - set-up failed: say why, exit like a crashed interpreter
        import traceback

        traceback.print_exc()
        os._exit(1)
    become(request["argv"], request["env"])


#: Whether this process is a task forked from a zygote (set in the child; :func:`can_become`).
_forked_task = False


def can_become(argv: Sequence[str], env: Mapping[str, str]) -> bool:
    """Whether this process can run ``argv`` with ``env`` in place of an ``exec``, as a fresh interpreter would.

    Only in a task forked from a zygote (e.g. a ``python -m tfdist.launch --task`` forked into an emulated host,
    which, like any launcher, has run no TensorFlow op), for a plain ``python`` command line whose import-time
    variables are the ones the zygote imported under: it then skips importing TensorFlow again.
    """
    return _forked_task and _target(argv) is not None and _import_time_env(env) == _started_env


def become(argv: Sequence[str], env: Mapping[str, str]) -> None:
    """Runs ``argv`` in this process with the environment ``env``, as ``os.execve`` would; never returns.

    What a forked task does once its process is set up (:func:`_child`), and what
    :func:`tfdist.launch` does in place of an ``exec`` where :func:`can_become` says it may: the process
    title, the environment, fresh random seeds, then the script or module, ending in a normal interpreter
    exit (atexit handlers such as a worker's ``Done``, thread joins, flushes).
    """
    try:
        _set_title(argv)  # before the environment changes (setproctitle needs the original)
        os.environ.clear()
        os.environ.update(env)
        import random

        import numpy as np

        random.seed()
        np.random.seed()
        kind, name, args = _target(argv)
    except BaseException:  # pragma: no cover - set-up failed: say why, exit like a crashed interpreter
        import traceback

        traceback.print_exc()
        os._exit(1)
    from tfdist.run import run_target

    code = run_target(kind, name, args, argv[0])
    # A normal interpreter exit from here: atexit handlers (a worker's Done), thread joins, flushes.
    raise SystemExit(code)
