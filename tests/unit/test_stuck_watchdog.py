"""Stuck-task detection (tfdist/strategies/_stuck.py): a Keras call that stops moving is reported, a moving one not.

Threads stand in for a task's main thread; a function named ``fit`` compiled
under a ``keras/`` path stands in for Keras's. No sockets, no TensorFlow;
every wait is bounded.
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
