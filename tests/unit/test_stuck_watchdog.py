"""Stuck-task detection (tfdist/strategies/_stuck.py): a Keras call that stops moving is reported, a moving one not.

Threads stand in for a task's main thread; a function named ``fit`` compiled
under a ``keras/`` path stands in for Keras's. No sockets; every wait is
bounded. The exit watchdog's tests run a Python process each (it imports
tfdist, not TensorFlow: ``tfdist.strategies`` imports its strategies lazily).
"""

import os
import threading

import pytest

from tfdist.strategies import _stuck

FAKE_KERAS = os.path.join(os.sep, "site-packages", "keras", "src", "trainer.py")
_namespace: dict = {}
exec(compile("def fit(body):\n    return body()\n", FAKE_KERAS, "exec"), _namespace)  # noqa: S102
keras_fit = _namespace["fit"]


def _run_in_thread(target):
    t = threading.Thread(target=target, daemon=True)
    t.start()
    return t


def test_a_call_stuck_inside_fit_is_reported_with_what_it_was_in():
    release, reports = threading.Event(), []
    worker = _run_in_thread(lambda: keras_fit(lambda: release.wait(60)))
    dog = _stuck.StuckTaskWatchdog(0.3, thread_id=worker.ident, poll_s=0.05, on_stuck=reports.append,
                                   fallback=False).start()
    try:
        assert dog.fired.wait(30), "a thread blocked inside fit was never reported"
    finally:
        release.set()
        dog.stop()
        worker.join(10)
    assert len(reports) == 1
    assert "inside keras fit()" in reports[0] and "TFDIST_STUCK_TIMEOUT_S" in reports[0]


def test_steps_are_progress_even_when_the_stack_looks_the_same():
    """A training loop sampled inside its step always shows the same lines; the step count moves."""
    stop, rounds = threading.Event(), []

    def train():
        while not stop.is_set():
            _stuck.note_progress()
            rounds.append(1)
            stop.wait(0.01)  # the same line at every sample

    worker = _run_in_thread(lambda: keras_fit(train))
    dog = _stuck.StuckTaskWatchdog(0.3, thread_id=worker.ident, poll_s=0.05, on_stuck=lambda m: None,
                                   fallback=False).start()
    try:
        seen = _stuck.steps()
        while _stuck.steps() < seen + 100:  # bounded by the thread's own pace; ~1 s of training
            assert worker.is_alive()
            stop.wait(0.01)
        assert not dog.fired.is_set()
    finally:
        stop.set()
        dog.stop()
        worker.join(10)


def test_a_hang_in_keras_code_around_fit_counts_too():
    """The tear-down of a returning fit runs in Keras's wrapper frames, not in ``fit``'s."""
    ns: dict = {}
    exec(compile("def error_handler(body):\n    return body()\n", FAKE_KERAS, "exec"), ns)  # noqa: S102
    release, reports = threading.Event(), []
    worker = _run_in_thread(lambda: ns["error_handler"](lambda: release.wait(60)))
    dog = _stuck.StuckTaskWatchdog(0.3, thread_id=worker.ident, poll_s=0.05, on_stuck=reports.append,
                                   fallback=False).start()
    try:
        assert dog.fired.wait(30)
    finally:
        release.set()
        dog.stop()
        worker.join(10)
    assert "inside keras error_handler()" in reports[0]


def test_outside_keras_calls_nothing_is_watched():
    release = threading.Event()
    worker = _run_in_thread(lambda: release.wait(60))  # a script's own long wait (a barrier, an export)
    dog = _stuck.StuckTaskWatchdog(0.2, thread_id=worker.ident, poll_s=0.05, on_stuck=lambda m: None,
                                   fallback=False).start()
    try:
        assert not dog.fired.wait(1.0)
    finally:
        release.set()
        dog.stop()
        worker.join(10)


def test_the_timeout_must_be_positive_and_says_how_to_turn_it_off():
    with pytest.raises(ValueError, match=r"(?s)Received: timeout_s=0.*TFDIST_STUCK_TIMEOUT_S=0"):
        _stuck.StuckTaskWatchdog(0)


def test_the_process_watchdog_follows_the_environment(monkeypatch):
    _stuck.stop_stuck_task_watchdog()  # (one a strategy of an earlier test in this process may have started)
    monkeypatch.setenv("TFDIST_STUCK_TIMEOUT_S", "0")
    assert _stuck.start_stuck_task_watchdog() is None
    monkeypatch.setenv("TFDIST_STUCK_TIMEOUT_S", "123")
    dog = _stuck.start_stuck_task_watchdog()
    try:
        assert dog.timeout_s == 123 and _stuck.start_stuck_task_watchdog() is dog  # one per process
    finally:
        _stuck.stop_stuck_task_watchdog()


# ------------------------------------------------------------------ the exit watchdog (issue #25 item 6)
HANG_AT_EXIT = """
import atexit, sys, threading
from tfdist.strategies._stuck import arm_exit_watchdog, exit_watchdog_work_done

def teardown_that_never_ends():
    threading.Event().wait()  # (releases the GIL, as TensorFlow's C++ waits do)

atexit.register(teardown_that_never_ends)
if sys.argv[1] == "done":
    atexit.register(exit_watchdog_work_done)  # as tfdist's hook does once Done reached the parameter servers
atexit.register(arm_exit_watchdog)  # atexit runs hooks last-in first-out: armed first, as tfdist's hook does
print("script done", flush=True)
"""


@pytest.mark.parametrize("work, code", [("not-done", 1), ("done", 0)])
def test_a_hang_at_exit_is_ended_saying_where_the_main_thread_waits(work, code):
    """Exit 1, or 0 when the task's work was done (the launcher counts it finished; a chief's Job completes)."""
    import subprocess
    import sys

    env = dict(os.environ, TFDIST_EXIT_TIMEOUT_S="1")
    proc = subprocess.run([sys.executable, "-c", HANG_AT_EXIT, work], capture_output=True, text=True, timeout=60,
                          env=env)
    assert proc.returncode == code and "script done" in proc.stdout
    assert f"exiting with code {code} (" + ("its work was done" if code == 0 else "the script ended with an error") \
        in proc.stderr
    assert "did not exit within 1 s (TFDIST_EXIT_TIMEOUT_S): its main thread waits in" in proc.stderr
    where = proc.stderr.split("its main thread waits in", 1)[1].splitlines()[0]
    assert where.startswith(" threading.py:") and "in teardown_that_never_ends" in where  # innermost first
    assert 'File "<string>", line 6 in teardown_that_never_ends' in proc.stderr  # every thread's stack follows
    assert "Timeout (" not in proc.stderr  # the reporter thread ended it, not faulthandler's fallback


def test_an_exit_that_finishes_is_not_held_and_zero_disables_the_bound():
    import subprocess
    import sys

    script = ("import sys\nfrom tfdist.strategies._stuck import arm_exit_watchdog\nimport atexit\n"
              "atexit.register(arm_exit_watchdog)\nprint('tensorflow' in sys.modules)\n")
    for value in ("1", "0"):
        proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60,
                              env=dict(os.environ, TFDIST_EXIT_TIMEOUT_S=value))
        assert proc.returncode == 0 and "did not exit" not in proc.stderr, proc.stderr[-2000:]
        assert proc.stdout.strip() == "False", "the watchdog's module imported TensorFlow (tfdist.strategies' lazy names)"
