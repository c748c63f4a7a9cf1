"""Stuck-task detection: a training task whose Keras call stops moving is reported with every thread's stack.

A task process of a job (the launcher's, or one with ``TF_CONFIG``) runs a
:class:`StuckTaskWatchdog`. While the main thread is inside Keras (its
``fit``/``evaluate``/``predict``, their ``*_on_batch``, and the Keras frames
around them, so the tear-down of a returning ``fit`` counts), a monitor thread
samples the main thread's Python stack and the process's step count (every
step's begin op counts one) every few seconds; when neither has changed for
``TFDIST_STUCK_TIMEOUT_S`` seconds (default 600; 0 turns it off) there was
no progress: not a step, not a callback, not a batch. The task then logs
an ERROR naming what it waited in, writes every thread's stack to stderr (the
task's log) and exits 1, so the launcher ends the job with the task's last
lines instead of waiting forever (``launch.job_timeout_s`` is unset by
default).

Why the stack and not the heartbeat: the heartbeat to the parameter servers
comes from a thread of its own, which goes on while the main thread is stuck,
so "no heartbeat" never comes for a hang inside ``fit``; and a stuck step
leaves nothing else that a launcher outside the process could read. Why only
inside Keras's calls: a script may legitimately wait outside them for as long
as it likes (a file barrier, its own data preparation). Every wait tfdist makes inside a
step is itself bounded (``ps.rpc_timeout_s``, ``ps.reconnect_timeout_s``,
``ps.startup_timeout_s``), so the default stays well above them.

If the stuck call holds the GIL (a C call that never releases it), the monitor
cannot run; ``faulthandler``'s timer, a C thread re-armed by every sample that
saw progress, then dumps the stacks and exits 1 a little later.
"""

from __future__ import annotations

import faulthandler
import logging
import os
import sys
import threading
import time
from typing import Callable

from tfdist import constants

__all__ = ["StuckTaskWatchdog", "arm_exit_watchdog", "exit_watchdog_work_done", "start_stuck_task_watchdog",
           "stop_stuck_task_watchdog", "note_progress", "DEFAULT_STUCK_TIMEOUT_S"]

logger = logging.getLogger(__name__)

#: Seconds without progress inside a Keras call before a task counts as stuck.
DEFAULT_STUCK_TIMEOUT_S = 600.0
#: The Keras calls the watchdog names when it reports (method names of keras.Model / its Trainer).
KERAS_CALLS = frozenset({"fit", "evaluate", "predict", "train_on_batch", "test_on_batch", "predict_on_batch"})


def keras_call(frame) -> str | None:
    """What Keras runs on ``frame``'s stack: the outermost ``fit``/``evaluate``/``predict``/``*_on_batch``, else
    the outermost Keras function (the tear-down of a ``fit`` that is returning, a ``Model.save``); None if none."""
    call = outermost = None
    marker = f"{os.sep}keras{os.sep}"
    while frame is not None:
        code = frame.f_code
        if marker in code.co_filename:
            outermost = code.co_name
            if code.co_name in KERAS_CALLS:
                call = code.co_name
        frame = frame.f_back
    return call or outermost


def stack_signature(frame) -> tuple:
    """Where a thread is: each frame's code and line (a thread that moves between samples made progress)."""
    sig = []
    while frame is not None:
        sig.append((id(frame.f_code), frame.f_lineno))
        frame = frame.f_back
    return tuple(sig)


_steps = 0


def note_progress(steps: int = 1) -> None:
    """Counts steps of this process (every step's begin op; the steps whose begin was skipped when they are
    counted, see ``UpdatePathRuntime.build_begin``): progress the stack may not show."""
    global _steps
    _steps += steps


def steps() -> int:
    """Steps counted by :func:`note_progress` in this process."""
    return _steps


class StuckTaskWatchdog:
    """Reports a thread whose Keras call made no progress for ``timeout_s`` seconds (see the module docstring).

    Args:
        timeout_s: Seconds without progress inside a Keras call.
        thread_id: The thread watched. Defaults to the main thread.
        poll_s: Seconds between two samples. Defaults to ``min(5, timeout_s / 10)``.
        on_stuck: Called with the message once the thread is stuck. Defaults to
            logging it, writing every thread's stack to stderr and ``os._exit(1)``.
        fallback: Arm ``faulthandler``'s exit timer as well (for a call that
            holds the GIL). Defaults to ``True``; one timer exists per process.
    """

    def __init__(self, timeout_s: float, thread_id: int | None = None, poll_s: float | None = None,
                 on_stuck: Callable[[str], None] | None = None, fallback: bool = True):
        if not timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0. Received: timeout_s={timeout_s!r}. Set "
                             f"{constants.ENV_STUCK_TIMEOUT_S}=0 to turn stuck-task detection off.")
        self.timeout_s = float(timeout_s)
        self.thread_id = thread_id if thread_id is not None else threading.main_thread().ident
        self.poll_s = poll_s if poll_s is not None else min(5.0, self.timeout_s / 10)
        self.on_stuck = on_stuck or _report_and_exit
        self.fallback = fallback
        self._stop = threading.Event()
        self._armed = False
        self._thread = threading.Thread(target=self._run, name="tfdist-stuck-task-watchdog", daemon=True)
        #: Set once the watched thread was reported stuck.
        self.fired = threading.Event()

    def start(self) -> "StuckTaskWatchdog":
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stops watching (idempotent); cancels the ``faulthandler`` timer if this watchdog armed it."""
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(self.poll_s + 1.0)
        self._disarm()

    def _arm(self) -> None:
        if self.fallback:  # a little after the monitor's own report, which says more
            faulthandler.dump_traceback_later(self.timeout_s + 3 * self.poll_s + 5.0, exit=True)
            self._armed = True

    def _disarm(self) -> None:
        if self._armed:
            faulthandler.cancel_dump_traceback_later()
            self._armed = False

    def _run(self) -> None:
        last_sig, since = None, time.monotonic()
        last_steps = steps()
        while not self._stop.wait(self.poll_s):
            frame = sys._current_frames().get(self.thread_id)
            if frame is None:  # the thread ended
                break
            call = keras_call(frame)
            if call is None:
                last_sig = None
                self._disarm()
                continue
            sig, done = stack_signature(frame), steps()
            del frame
            now = time.monotonic()
            if sig != last_sig or done != last_steps:
                last_sig, last_steps, since = sig, done, now
                self._arm()
                continue
            if now - since >= self.timeout_s:
                self.fired.set()
                self.on_stuck(f"this task made no progress inside keras {call}() for {now - since:.0f} s "
                              f"(no step, and its main thread's stack did not change; {constants.ENV_STUCK_TIMEOUT_S}="
                              f"{self.timeout_s:g}): it is stuck. Every thread's stack follows. Raise "
                              f"{constants.ENV_STUCK_TIMEOUT_S} if a step can legitimately take that long, or set "
                              "it to 0 to turn this off.")
                return
        self._disarm()


def _report_and_exit(message: str, code: int = 1) -> None:
    logger.error("%s", message)
    for handler in logging.getLogger().handlers:
        handler.flush()
    sys.stderr.flush()
    faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
    os._exit(code)


_WATCHDOG: StuckTaskWatchdog | None = None


def start_stuck_task_watchdog() -> StuckTaskWatchdog | None:
    """Starts this process's watchdog (once) with ``TFDIST_STUCK_TIMEOUT_S``; None when that is 0."""
    global _WATCHDOG
    if _WATCHDOG is not None:
        return _WATCHDOG
    raw = os.environ.get(constants.ENV_STUCK_TIMEOUT_S, "")
    try:
        seconds = float(raw) if raw.strip() else DEFAULT_STUCK_TIMEOUT_S
    except ValueError:
        logger.warning("%s=%r is not a number of seconds; using %g", constants.ENV_STUCK_TIMEOUT_S, raw,
                       DEFAULT_STUCK_TIMEOUT_S)
        seconds = DEFAULT_STUCK_TIMEOUT_S
    if not seconds > 0:
        return None
    _WATCHDOG = StuckTaskWatchdog(seconds).start()
    return _WATCHDOG


def stop_stuck_task_watchdog() -> None:
    """Stops this process's watchdog, if any (before the exit watchdog takes ``faulthandler``'s one timer)."""
    global _WATCHDOG
    if _WATCHDOG is not None:
        _WATCHDOG.stop()
        _WATCHDOG = None


def innermost(frame, depth: int = 3) -> str:
    """Where a thread waits: its ``depth`` innermost frames, ``file:line in function`` each, innermost first."""
    parts = []
    while frame is not None and len(parts) < depth:
        parts.append(f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_lineno} in {frame.f_code.co_name}")
        frame = frame.f_back
    return " <- ".join(parts) or "no Python frame"


#: Seconds after the exit bound at which ``faulthandler`` ends the process if the reporter thread could not run.
EXIT_FALLBACK_S = 5.0


#: What the exit watchdog's reporter exits with: 1, or 0 once the script ended cleanly and said it was done.
_exit_code = 1


def exit_watchdog_work_done() -> None:
    """The script ended without an error and the parameter servers know this task is done.

    From now on a hang in the rest of the tear-down is not a failure of the
    task: the exit watchdog still reports it, but exits 0 (as the launcher
    counts such a task finished, and Kubernetes' chief policy needs).
    """
    global _exit_code
    _exit_code = 0


def arm_exit_watchdog() -> threading.Timer | None:
    """Bounds interpreter shutdown of a task process: exit 1 saying where it waits, with every thread's stack.

    A worker that stopped ``fit`` early (elastic jobs) sometimes never
    exited: a ``tf.data`` iterator's destructor waited for one of its threads
    forever (seen in TF 2.21 under py-spy: ``IteratorResource::~IteratorResource``
    → ``LogicalThreadWrapper`` → ``WaitForNotification``). The cause, an
    iterator freed by the garbage collector on an inter-op thread, is removed
    (:mod:`tfdist.strategies._keras_iterators`); this bound stays for what
    else may hang at exit. ``TFDIST_EXIT_TIMEOUT_S`` (default 20; 0
    disables) sets it. Past it a reporter thread writes what the main thread
    waits in (its innermost Python frame and the Keras call, if any) and
    every thread's stack to stderr, and exits 1, or 0 after
    :func:`exit_watchdog_work_done` (the task's work was done). A hang that never lets
    Python run (the GIL held, or the interpreter already finalizing) is ended
    by ``faulthandler``'s C thread :data:`EXIT_FALLBACK_S` later, with the
    stacks alone. Returns the reporter's timer (None when disabled).
    """
    stop_stuck_task_watchdog()  # faulthandler has one timer: from here on it bounds the exit
    seconds = float(os.environ.get(constants.ENV_EXIT_TIMEOUT_S, "20") or 0)
    if seconds <= 0:
        return None
    main = threading.main_thread().ident
    began = time.strftime("%H:%M:%S")

    def report():
        frame = sys._current_frames().get(main)
        call = keras_call(frame) if frame is not None else None
        code = _exit_code
        why = ("its work was done: the script ended without an error and the parameter servers know it"
               if code == 0 else "the script ended with an error, or before the parameter servers heard it was done")
        _report_and_exit(
            f"The script ended at {began} but this process did not exit within {seconds:g} s "
            f"({constants.ENV_EXIT_TIMEOUT_S}): its main thread waits in {innermost(frame)}"
            + (f" (inside keras {call}())" if call else "") + f". Every thread's stack follows; exiting with "
            f"code {code} ({why}).", code)

    faulthandler.dump_traceback_later(seconds + EXIT_FALLBACK_S, exit=True)
    timer = threading.Timer(seconds, report)
    timer.daemon = True
    try:
        timer.start()
    except RuntimeError:  # no new thread at this point of the shutdown: faulthandler alone
        return None
    return timer
