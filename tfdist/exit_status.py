"""How a task process ended: whether its script failed, and the exit code a deterministic failure gets.

A training task tells the parameter servers it is done (``Done``) at
interpreter exit, and a PS task stops once every worker is done. That
message must go out only when the script ended cleanly: a script that died
with an uncaught exception has not finished its work, and a ``Done`` from it
lets the PS tasks end a job whose chief a supervisor (the launcher,
Kubernetes) is about to restart. :func:`ended_with_error` answers the
question at exit; :func:`install` (run once when :mod:`tfdist` is imported)
records the uncaught exception through ``sys.excepthook``.

A :class:`~tfdist.errors.ConfigError` is deterministic: the same task started
again fails the same way. A task whose script ends with an uncaught
``ConfigError`` exits with :data:`EXIT_CONFIG_ERROR` (78, ``EX_CONFIG`` of
``sysexits.h``) instead of Python's 1, and the launcher never restarts a task
that exits with it.

Python reports no ``SystemExit`` to any hook, so :func:`install` also wraps
``sys.exit`` and the ``exit``/``quit`` builtins: a script (its main thread)
that calls ``sys.exit(1)`` (or any non-zero code or a message) is recorded
as failed before the ``SystemExit`` is raised. Left unseen in a plain
``python SCRIPT`` interpreter: ``raise SystemExit(1)`` written out, and
``os._exit`` (no exit hook runs at all: such a task never says it is done).
The last call wins: a script that catches the ``SystemExit`` of
``sys.exit(1)`` and then ends cleanly is still recorded as failed unless it
calls ``sys.exit(0)``. A script run by :mod:`tfdist.run` (``python -m
tfdist.run SCRIPT``: how the launcher and the Kubernetes manifests start
training tasks; the launcher's zygote does the same) is seen however it
ends.
"""

from __future__ import annotations

import atexit
import builtins
import logging
import os
import sys
import threading

__all__ = ["EXIT_CONFIG_ERROR", "EXIT_SIGINT", "EXIT_SIGTERM", "install", "record_exit", "ended_with_error",
           "exit_code_for", "is_deterministic_failure"]

logger = logging.getLogger(__name__)

#: Exit code of a task whose script ended with an uncaught :class:`~tfdist.errors.ConfigError`
#: (``EX_CONFIG`` of ``sysexits.h``): starting it again cannot help, so nothing restarts it.
EXIT_CONFIG_ERROR = 78
#: Exit code of a process stopped by SIGINT (Ctrl-C): 128 + 2.
EXIT_SIGINT = 130
#: Exit code of a process stopped by SIGTERM: 128 + 15.
EXIT_SIGTERM = 143

_lock = threading.Lock()
_installed = False
#: Exit code the script's end called for (None: it has not ended, or ended cleanly in a plain interpreter).
_recorded_code: int | None = None
_config_error = False


def exit_code_for(exc: BaseException) -> int:
    """The exit code a task whose script raised ``exc`` (uncaught) ends with.

    Returns:
        :data:`EXIT_CONFIG_ERROR` for a :class:`~tfdist.errors.ConfigError`
        (deterministic), the code of a ``SystemExit``, else 1 (as Python).
    """
    from tfdist.errors import ConfigError

    if isinstance(exc, SystemExit):
        code = exc.code
        if code is None:
            return 0
        return code if isinstance(code, int) else 1
    if isinstance(exc, ConfigError):
        return EXIT_CONFIG_ERROR
    return 1


def is_deterministic_failure(code: int | None) -> bool:
    """Whether a task's exit code says that starting it again would fail the same way."""
    return code == EXIT_CONFIG_ERROR


def record_exit(code: int | str | None, exc: BaseException | None = None) -> None:
    """Records how the script ended (used where tfdist runs the script itself, e.g. the zygote).

    Args:
        code: The exit code the script's end called for (``SystemExit.code``
            or a code from :func:`exit_code_for`); 0 or None is a clean end.
        exc: The uncaught exception, if any.
    """
    global _recorded_code, _config_error
    if isinstance(code, str):  # sys.exit("message"): Python prints it and exits 1
        code = 1
    with _lock:
        _recorded_code = int(code or 0)
        from tfdist.errors import ConfigError

        _config_error = _config_error or isinstance(exc, ConfigError)


def ended_with_error() -> bool:
    """Whether the script of this process ended with an uncaught exception (or a recorded non-zero exit).

    Meant for interpreter-exit hooks: true after an uncaught exception seen by
    ``sys.excepthook`` (or left in ``sys.last_value`` by Python's own
    reporting, outside IPython, whose cells leave it set), or after
    :func:`record_exit` with a non-zero code.
    """
    with _lock:
        if _recorded_code is not None:
            return _recorded_code != 0
    if getattr(sys, "last_value", None) is not None and not _in_ipython():
        return not (isinstance(sys.last_value, SystemExit) and not sys.last_value.code)
    return False


def _in_ipython() -> bool:
    """Whether an IPython shell runs this process (its cells catch ``SystemExit``; it leaves ``sys.last_value`` set).

    ``"IPython" in sys.modules`` is not the test: TensorFlow and Keras import IPython in a plain interpreter.
    """
    ipython = sys.modules.get("IPython")
    try:
        return ipython is not None and ipython.get_ipython() is not None
    except Exception:  # noqa: BLE001 - an IPython without get_ipython: not a shell
        return False


def _excepthook(exc_type, exc, tb, _previous=None):
    record_exit(exit_code_for(exc) if exc is not None else 1, exc)
    (_previous or sys.__excepthook__)(exc_type, exc, tb)


def _exit_with_config_code() -> None:
    """Last exit hook: a script that died of a ConfigError exits :data:`EXIT_CONFIG_ERROR`, not 1.

    Python's exit code after an uncaught exception is always 1 and an exit
    hook cannot change it, so this one ends the process itself, after
    flushing the logs and standard streams. It runs after every exit hook
    registered later (tfdist's are), and only after a ``ConfigError``.
    """
    with _lock:
        if not _config_error:
            return
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (AttributeError, OSError, ValueError):
            pass
    os._exit(EXIT_CONFIG_ERROR)


def install() -> None:
    """Chains tfdist's recorder into ``sys.excepthook`` and registers the exit-code hook (idempotent)."""
    global _installed
    with _lock:
        if _installed:
            return
        _installed = True
    previous = sys.excepthook

    def hook(exc_type, exc, tb):
        _excepthook(exc_type, exc, tb, previous)

    sys.excepthook = hook
    sys.exit = _recording_exit(sys.exit)
    for name in ("exit", "quit"):  # site's Quitter objects raise SystemExit themselves
        if hasattr(builtins, name):
            setattr(builtins, name, _recording_exit(getattr(builtins, name)))
    atexit.register(_exit_with_config_code)


def _recording_exit(exit_fn):
    """``exit_fn`` that first records the code when the main thread calls it (a thread's exit ends only itself)."""

    def exit(status=None):  # noqa: A001 - the name Python users see
        if threading.current_thread() is threading.main_thread() and not _in_ipython():
            record_exit(exit_code_for(SystemExit(status)) if not isinstance(status, str) else 1)
        exit_fn(status)

    exit.__doc__ = exit_fn.__doc__
    exit.__wrapped__ = exit_fn
    return exit
