"""Integration fixtures: real PS processes on 127.0.0.1, always torn down."""

import os
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPTS = os.path.join(ROOT, "tests", "integration", "scripts")
ZYGOTE_MARK = "tfdist.cluster.zygote import _serve"
#: multiprocessing's fork server (the federated simulator's pool forks its workers from it): one per process.
FORKSERVER_MARK = "from multiprocessing.forkserver import main"
#: How long a child that is being torn down (killed, its memory already released) may take to become a zombie.
EXITING_BOUND_S = 5.0


def _exits(p) -> bool:
    """Whether ``p``, a process with no command line left (the kernel is tearing it down), exits within the bound.

    A SIGKILLed process loses its command line before it becomes a zombie; a
    test that killed it and returned does not leak it. One that stays is a leak.
    """
    import psutil

    deadline = time.monotonic() + EXITING_BOUND_S
    while True:
        try:
            if p.status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)


@pytest.fixture
def scripts_dir():
    return SCRIPTS


@pytest.fixture
def no_cluster(monkeypatch):
    """No TF_CONFIG/TFDIST_CONFIG: a strategy built in the test runs as one process with an in-process PS."""
    for name in ("TF_CONFIG", "TFDIST_CONFIG"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def send_and_drain():
    """``send_and_drain(sock, frames)``: sends raw frames, ends the sending side and reads whatever the server
    answers until it closes the connection (for tests that play a client that lies); a reset ends it too."""
    import socket

    def run(sock, frames):
        try:
            for frame in frames:
                sock.sendall(frame)
            sock.shutdown(socket.SHUT_WR)
            while sock.recv(1 << 16):  # replies, if any, until the server closes
                pass
        except OSError:
            pass

    return run


def pytest_collection_modifyitems(items):
    for item in items:
        if "tests/integration" in str(item.fspath):
            item.add_marker(pytest.mark.integration)


@pytest.fixture(autouse=True)
def _no_leaked_children():
    """Fails a test that leaves child processes of this pytest behind."""
    import psutil

    before = {p.pid for p in psutil.Process().children(recursive=True)}
    yield
    leaked = []
    for p in psutil.Process().children(recursive=True):
        if p.pid in before:
            continue
        try:
            cmdline = " ".join(p.cmdline())
            if p.ppid() == os.getpid() and (ZYGOTE_MARK in cmdline or FORKSERVER_MARK in cmdline):
                continue  # this process's zygote and fork server (TFDIST_FAST_START) live as long as pytest; their
                # tasks and workers do not
            if not cmdline and _exits(p):
                continue  # killed by the test, not reaped yet
            if p.status() != psutil.STATUS_ZOMBIE and "kernel" not in cmdline:
                leaked.append((p.pid, cmdline[:120]))
        except psutil.NoSuchProcess:
            pass
    for pid, _ in leaked:
        try:
            os.kill(pid, 9)
        except OSError:
            pass
    assert not leaked, f"test leaked child processes: {leaked}"
