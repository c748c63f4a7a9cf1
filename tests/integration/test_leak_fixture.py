"""The leak fixture (conftest.py) tells a killed child that the kernel is still tearing down from one that stays."""

import os
import signal
import subprocess
import sys

import importlib.util

import psutil

_spec = importlib.util.spec_from_file_location("_integration_conftest",
                                               os.path.join(os.path.dirname(__file__), "conftest.py"))
integration_conftest = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(integration_conftest)


def test_a_killed_child_not_reaped_yet_is_not_a_leak_and_a_live_one_is(monkeypatch):
    monkeypatch.setattr(integration_conftest, "EXITING_BOUND_S", 0.5)
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    killed = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        os.kill(killed.pid, signal.SIGKILL)
        assert integration_conftest._exits(psutil.Process(killed.pid))  # gone or a zombie within the bound
        assert not integration_conftest._exits(psutil.Process(live.pid))  # still running at the bound: a leak
    finally:
        for p in (live, killed):
            p.kill()
            p.wait(timeout=10)
