"""Emulated hosts for tests: Linux network namespaces on one bridge, optional rate caps, tasks run inside.

Each host of a :class:`NetnsCluster` is a network namespace with its own
loopback and one interface ``eth0`` holding an address of a private subnet
(``10.77.0.0/24`` by default: host ``i`` gets ``.i+1``). The ``eth0`` of every
host is one end of a veth pair whose other end is a port of a Linux bridge
that lives in one more namespace, so the hosts reach each other and nothing
else, and the root namespace is never touched (no interface, no address, no
route is added there). ``cap()`` puts a token-bucket filter (``tc ... tbf``)
on both directions of a host's link: a host behind a slow network.

Tasks run as ``ip netns exec NAMESPACE argv`` through
:class:`tfdist.cluster.process.TaskProcess`: their own process group, one
log file each, SIGKILL if the test process dies (``PR_SET_PDEATHSIG``). With
fast start on (``TFDIST_FAST_START=1``, as for a ``LocalCluster``), a
``python script.py`` or ``python -m module`` task is instead forked from this
process's zygote (:mod:`tfdist.cluster.zygote`, TensorFlow imported once) and
enters its host's namespace before it runs a line: the same network as under
``ip netns exec``, without importing TensorFlow once per task.

Example:

```python
from tfdist.testing import NetnsCluster

with NetnsCluster(["ps", "chief", "worker"]) as net:
    net.cap("worker", rate="10mbit")
    cluster = {"ps": [f"{net.address('ps')}:2222"], ...}
    net.run("ps", "ps:0", [sys.executable, "-m", "tfdist.ps"], env={...})
    codes = net.wait(["ps:0", ...], timeout=120)   # bounded; None = still running
    print(net.log("ps:0"))
```

Leaving the block kills every process the cluster started (and any other
process still inside its namespaces), deletes the namespaces — the veth pairs
and the bridge go with them — and checks that nothing is left, also when the
block raises. Creating namespaces needs root (CAP_SYS_ADMIN and CAP_NET_ADMIN):
:meth:`NetnsCluster.available` says whether this process may, and
:meth:`NetnsCluster.unavailable_reason` why not.
"""

from __future__ import annotations

import atexit
import dataclasses
import ipaddress
import logging
import os
import re
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from typing import Mapping, Sequence

from tfdist.cluster.process import TaskProcess
from tfdist.cluster.process import ip_binary as _ip_binary
from tfdist.cluster.process import sbin_tool
from tfdist.cluster.zygote import fast_start_enabled
from tfdist.errors import LaunchError

__all__ = ["NetnsCluster", "Host"]

logger = logging.getLogger(__name__)

#: Every namespace a NetnsCluster creates is named ``tfdist-<pid>-<random>-<host>``.
NAMESPACE_PREFIX = "tfdist"
_NAMESPACE_RE = re.compile(rf"^{NAMESPACE_PREFIX}-(\d+)-([0-9a-f]{{6}})-")
_HOST_NAME_RE = re.compile(r"^[a-z][a-z0-9]{0,15}$")
_BRIDGE = "bridge"
#: Bound on each ``ip``/``tc`` command.
_COMMAND_TIMEOUT_S = 15.0

_availability: tuple[bool, str | None] | None = None


@dataclasses.dataclass(frozen=True)
class Host:
    """One emulated host.

    Attributes:
        name: The name the test uses (``"ps0"``).
        namespace: The network namespace (``tfdist-1234-a1b2c3-ps0``).
        address: Its IPv4 address on the cluster's subnet.
        port: Name of its bridge port (in the bridge namespace).
    """

    name: str
    namespace: str
    address: str
    port: str


def _tc_binary() -> str | None:
    return sbin_tool("tc")


def _run(argv: Sequence[str], check: bool = True) -> subprocess.CompletedProcess:
    result = subprocess.run(list(argv), stdin=subprocess.DEVNULL, capture_output=True, text=True,
                            timeout=_COMMAND_TIMEOUT_S)
    if check and result.returncode != 0:
        raise LaunchError(f"`{' '.join(argv)}` failed (exit {result.returncode}): {result.stderr.strip()}")
    return result


def _namespaces() -> list[str]:
    """Names of the network namespaces ``ip netns`` knows."""
    ip = _ip_binary()
    if ip is None:
        return []
    out = _run([ip, "netns", "list"], check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def _pids_in(namespace: str) -> list[int]:
    ip = _ip_binary()
    result = _run([ip, "netns", "pids", namespace], check=False)
    return [int(p) for p in result.stdout.split() if p.isdigit()] if result.returncode == 0 else []


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class NetnsCluster:
    """Emulated hosts (network namespaces on one bridge) that run tasks.

    Args:
        hosts: Number of hosts (named ``h0``, ``h1``, ...) or their names
            (lower-case letters and digits, at most 16 characters). Defaults to 2.
        subnet: Private IPv4 subnet of the hosts; host ``i`` gets its
            ``i + 1``-th address. It exists only inside the namespaces, so
            several clusters may use the same one. Defaults to ``"10.77.0.0/24"``.
        log_dir: Where each task's output goes (``<task>.log``, ``:``
            replaced by ``-``). Defaults to a fresh temporary directory,
            removed on exit.
        forward: Also copy every task's output to this process's stdout,
            prefixed with the task name. Defaults to ``False``.
        fast_start: Fork Python tasks from this process's zygote into their
            host's namespace instead of starting them with ``ip netns exec``
            (:mod:`tfdist.cluster.zygote`). Defaults to the environment
            variable ``TFDIST_FAST_START``.

    Raises:
        LaunchError: (on entering) this process may not create namespaces,
            naming the reason; or a command failed (everything created so far
            is removed again).
    """

    def __init__(
        self,
        hosts: int | Sequence[str] = 2,
        subnet: str = "10.77.0.0/24",
        log_dir: str | None = None,
        forward: bool = False,
        fast_start: bool | None = None,
    ):
        names = [f"h{i}" for i in range(hosts)] if isinstance(hosts, int) else list(hosts)
        if not names:
            raise ValueError(f"A NetnsCluster needs at least one host. Received: hosts={hosts!r}.")
        bad = [n for n in names if not isinstance(n, str) or not _HOST_NAME_RE.match(n) or n == _BRIDGE]
        if bad or len(set(names)) != len(names):
            raise ValueError(f"Host names must be distinct, lower-case letters and digits (starting with a letter, "
                             f"at most 16 characters, not {_BRIDGE!r}). Received: hosts={names!r}.")
        network = ipaddress.ip_network(subnet)
        if not isinstance(network, ipaddress.IPv4Network) or not network.is_private:
            raise ValueError(f"subnet must be a private IPv4 network. Received: subnet={subnet!r}. "
                             "Use e.g. 10.77.0.0/24.")
        addresses = list(network.hosts())
        if len(addresses) < len(names):
            raise ValueError(f"subnet {subnet} has {len(addresses)} host addresses for {len(names)} hosts. "
                             "Use a larger subnet.")
        self.subnet = network
        self.id = f"{NAMESPACE_PREFIX}-{os.getpid()}-{secrets.token_hex(3)}"
        self.hosts: dict[str, Host] = {
            n: Host(n, f"{self.id}-{n}", str(addresses[i]), f"p{i}") for i, n in enumerate(names)
        }
        self.bridge_namespace = f"{self.id}-{_BRIDGE}"
        self._tmp = None if log_dir else tempfile.TemporaryDirectory(prefix="tfdist-netns-")
        self.log_dir = log_dir or self._tmp.name
        self.forward = forward
        #: Fork Python tasks from a zygote into their host's namespace (``TFDIST_FAST_START=1``).
        self.fast_start = fast_start_enabled(fast_start)
        self.tasks: dict[str, TaskProcess] = {}
        self._created: list[str] = []  # namespaces, in creation order
        self._caps: dict[str, str] = {}
        self._closed = False

    # ----------------------------------------------------------- availability
    @staticmethod
    def unavailable_reason() -> str | None:
        """Why this process may not create network namespaces, or ``None`` if it may."""
        global _availability
        if _availability is None:
            _availability = (True, None)
            ip, tc = _ip_binary(), _tc_binary()
            if not sys.platform.startswith("linux"):
                _availability = (False, f"network namespaces need Linux (this is {sys.platform})")
            elif os.geteuid() != 0:
                _availability = (False, f"creating network namespaces needs root (running as uid {os.geteuid()})")
            elif ip is None or tc is None:
                _availability = (False, "the `ip` and `tc` commands (iproute2) are not installed")
            else:
                probe = f"{NAMESPACE_PREFIX}-{os.getpid()}-{secrets.token_hex(3)}-probe"
                try:
                    result = _run([ip, "netns", "add", probe], check=False)
                    if result.returncode != 0:
                        _availability = (False, f"`ip netns add` failed: {result.stderr.strip()}")
                finally:
                    _run([ip, "netns", "del", probe], check=False)
        return _availability[1]

    @staticmethod
    def available() -> bool:
        """Whether this process may create network namespaces (root, ``ip netns`` works)."""
        return NetnsCluster.unavailable_reason() is None

    @staticmethod
    def remove_stale() -> list[str]:
        """Deletes namespaces left by NetnsClusters of processes that no longer exist.

        Only namespaces named by this class whose creating process is gone and
        which hold no process are deleted. Returns their names.
        """
        removed = []
        ip = _ip_binary()
        for ns in _namespaces():
            m = _NAMESPACE_RE.match(ns)
            if m and not _alive(int(m.group(1))) and not _pids_in(ns):
                if _run([ip, "netns", "del", ns], check=False).returncode == 0:
                    removed.append(ns)
        if removed:
            logger.warning("removed %d network namespace(s) left by dead test processes: %s", len(removed), removed)
        return removed

    # ---------------------------------------------------------------- set-up
    def create(self) -> "NetnsCluster":
        """Creates the namespaces, the bridge and the links (idempotent within one instance)."""
        if self._created:
            return self
        reason = self.unavailable_reason()
        if reason is not None:
            raise LaunchError(f"Cannot create a NetnsCluster: {reason}. Run as root on Linux with iproute2, "
                              "or skip the test when NetnsCluster.available() is False.")
        self.remove_stale()
        atexit.register(self.close)
        ip = _ip_binary()
        try:
            self._add_namespace(self.bridge_namespace)
            br = ["-n", self.bridge_namespace]
            _run([ip, *br, "link", "add", "br0", "type", "bridge"])
            _run([ip, *br, "link", "set", "br0", "up"])
            for host in self.hosts.values():
                self._add_namespace(host.namespace)
                hn = ["-n", host.namespace]
                # Both ends are created inside namespaces: nothing appears in the root namespace.
                _run([ip, *br, "link", "add", host.port, "type", "veth", "peer", "name", "eth0",
                      "netns", host.namespace])
                _run([ip, *br, "link", "set", host.port, "master", "br0"])
                _run([ip, *br, "link", "set", host.port, "up"])
                _run([ip, *hn, "link", "set", "lo", "up"])
                _run([ip, *hn, "addr", "add", f"{host.address}/{self.subnet.prefixlen}", "dev", "eth0"])
                _run([ip, *hn, "link", "set", "eth0", "up"])
        except BaseException:
            self.close()
            raise
        logger.info("netns cluster %s: %s on %s", self.id,
                    ", ".join(f"{h.name}={h.address}" for h in self.hosts.values()), self.subnet)
        return self

    def _add_namespace(self, name: str) -> None:
        _run([_ip_binary(), "netns", "add", name])
        self._created.append(name)

    def namespaces(self) -> list[str]:
        """Names of this cluster's namespaces (the hosts', then the bridge's)."""
        return [h.namespace for h in self.hosts.values()] + [self.bridge_namespace]

    def host(self, name: str) -> Host:
        """The host called ``name``."""
        try:
            return self.hosts[name]
        except KeyError:
            raise KeyError(f"No host {name!r} in this NetnsCluster. Received: host={name!r}; "
                           f"its hosts are {list(self.hosts)}.") from None

    def address(self, host: str) -> str:
        """The IPv4 address of ``host``."""
        return self.host(host).address

    def cap(self, host: str, rate: str = "10mbit", burst: str = "32kb", latency: str = "50ms") -> None:
        """Limits ``host``'s link to ``rate`` in both directions (``tc ... tbf``).

        Args:
            host: The host.
            rate: ``tc`` rate (``"10mbit"``, ``"1gbit"``). Defaults to ``"10mbit"``.
            burst: Bucket size (``tc`` units: ``kb`` is kilobytes, ``kbit``
                kilobits); at least ``rate`` / HZ. Defaults to ``"32kb"``.
            latency: Longest a packet may wait in the queue before it is
                dropped. Defaults to ``"50ms"``.
        """
        h = self.host(host)
        tbf = ["root", "tbf", "rate", rate, "burst", burst, "latency", latency]
        tc = _tc_binary()
        _run([tc, "-n", h.namespace, "qdisc", "replace", "dev", "eth0", *tbf])  # what the host sends
        _run([tc, "-n", self.bridge_namespace, "qdisc", "replace", "dev", h.port, *tbf])  # what it receives
        self._caps[host] = rate

    def uncap(self, host: str) -> None:
        """Removes the limit :meth:`cap` put on ``host``'s link."""
        h = self.host(host)
        tc = _tc_binary()
        _run([tc, "-n", h.namespace, "qdisc", "del", "dev", "eth0", "root"], check=False)
        _run([tc, "-n", self.bridge_namespace, "qdisc", "del", "dev", h.port, "root"], check=False)
        self._caps.pop(host, None)

    # ---------------------------------------------------------------- tasks
    def run(self, host: str, task: str, argv: Sequence[str], env: Mapping[str, str] | None = None) -> TaskProcess:
        """Starts ``argv`` on ``host`` as the task called ``task``.

        Args:
            host: The host it runs on.
            task: Its name (``"ps:0"``): the key of :meth:`wait`, :meth:`log`
                and :attr:`tasks`, the prefix of forwarded output.
            argv: Command line; ``argv[0]`` is looked up on ``PATH``.
            env: Environment variables on top of this process's environment.

        Returns:
            The started :class:`~tfdist.cluster.process.TaskProcess`.
        """
        h = self.host(host)
        if not self._created or self._closed:
            raise LaunchError(f"NetnsCluster {self.id} is not set up: use it as `with NetnsCluster(...) as net:` "
                              f"(or call create()) before run(). Received: run({host!r}, {task!r}, ...).")
        if task in self.tasks and self.tasks[task].running:
            raise LaunchError(f"Task {task} is already running on this NetnsCluster. Received: task={task!r}. "
                              "Give every task its own name.")
        full_env = dict(os.environ)
        full_env.update(env or {})
        full_env.setdefault("PYTHONUNBUFFERED", "1")
        full_env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        proc = TaskProcess(task, argv, full_env, log_path=self.log_path(task),  # type: ignore[arg-type]
                           forward_stdout=self.forward, forward_stderr=self.forward, fast_start=self.fast_start,
                           netns=h.namespace)
        self.tasks[task] = proc.start()
        logger.debug("%s on %s (%s): %s", task, host, h.address, " ".join(argv))
        return proc

    def log_path(self, task: str) -> str:
        return os.path.join(self.log_dir, f"{task.replace(':', '-')}.log")

    def log(self, task: str) -> str:
        """Everything ``task`` wrote so far (stdout and stderr)."""
        path = self.log_path(task)
        if not os.path.exists(path):
            return ""
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()

    def wait(self, tasks: Sequence[str], timeout: float) -> dict[str, int | None]:
        """Waits, ``timeout`` seconds in all, for ``tasks`` to exit.

        Returns:
            ``{task: exit code}``; ``None`` for a task still running at the deadline.
        """
        deadline = time.monotonic() + timeout
        return {t: self.tasks[t].wait(max(deadline - time.monotonic(), 0.01)) for t in tasks}

    def wait_for_output(self, task: str, text: str, timeout: float) -> None:
        """Waits, at most ``timeout`` seconds, until ``task`` has written ``text``.

        Raises:
            LaunchError: the task exited, or the time ran out, before it did (naming the task and its last lines).
        """
        proc = self.tasks[task]
        deadline = time.monotonic() + timeout
        while text not in self.log(task):
            if not proc.running and text not in self.log(task):
                raise LaunchError(f"{proc.describe_exit()} before writing {text!r}:\n{self.describe([task])}")
            if time.monotonic() > deadline:
                raise LaunchError(f"{task} did not write {text!r} within {timeout} s:\n{self.describe([task])}")
            time.sleep(0.02)

    def describe(self, tasks: Sequence[str] | None = None, lines: int = 15) -> str:
        """Exit status and last output lines of ``tasks`` (default: all), for assertion messages."""
        parts = []
        for t in tasks or list(self.tasks):
            p = self.tasks[t]
            parts.append(f"--- {p.describe_exit()} ({self.log_path(t)})\n" + "\n".join(list(p.tail)[-lines:]))
        return "\n".join(parts)

    # -------------------------------------------------------------- teardown
    def close(self) -> None:
        """Kills every task, deletes every namespace (with its links), checks nothing is left.

        Idempotent; runs on leaving the ``with`` block and at interpreter exit.

        Raises:
            LaunchError: a namespace or a process inside one could not be removed.
        """
        if self._closed:
            return
        self._closed = True
        atexit.unregister(self.close)
        for proc in self.tasks.values():
            if proc.running:
                proc.stop(grace=2.0)
        problems = []
        ip = _ip_binary()
        for ns in reversed(self._created):
            # Anything still inside was started by this cluster (a task's escaped child, a leftover exec).
            pids = _pids_in(ns)
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            deadline = time.monotonic() + 10.0
            while pids and time.monotonic() < deadline:
                pids = [p for p in pids if _alive(p) and not _is_zombie(p)]
                if pids:
                    time.sleep(0.05)
            if pids:
                problems.append(f"processes {pids} in {ns} survived SIGKILL")
            result = _run([ip, "netns", "del", ns], check=False)
            if result.returncode != 0:
                problems.append(f"`ip netns del {ns}` failed: {result.stderr.strip()}")
        left = [ns for ns in _namespaces() if ns.startswith(self.id + "-")]
        if left:
            problems.append(f"namespaces still present: {left}")
        self._created = []
        if self._tmp is not None:
            self._tmp.cleanup()
        if problems:
            raise LaunchError(f"NetnsCluster {self.id} left things behind: {'; '.join(problems)}. Remove them "
                              f"with `ip netns del NAME` (and kill the processes `ip netns pids NAME` lists).")
        logger.info("netns cluster %s removed", self.id)

    def __enter__(self) -> "NetnsCluster":
        return self.create()

    def __exit__(self, exc_type, exc, tb) -> None:
        try:
            self.close()
        except LaunchError:
            if exc_type is None:
                raise
            logger.exception("while handling %s", exc_type.__name__)  # the test's own error stays the one raised


def _is_zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            return f.read().rpartition(")")[2].split()[0] == "Z"
    except OSError:
        return False
