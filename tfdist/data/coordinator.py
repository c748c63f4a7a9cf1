"""Coordinator: stops a group of threads together and re-raises their first error.

TF1's ``tf.train.Coordinator`` semantics, without TensorFlow.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import threading
import time
from typing import Callable, Iterable

from tfdist.data.errors import QueueClosedError

__all__ = ["Coordinator"]

logger = logging.getLogger(__name__)


class Coordinator:
    """Coordinates the termination of a set of threads (and what they feed).

    Any thread may call :meth:`request_stop`; every thread polls
    :meth:`should_stop`. The first exception passed to ``request_stop`` is
    kept and re-raised (with its original traceback) by :meth:`join`, by
    :meth:`raise_requested_exception`, and when a ``with`` block ends.
    A :class:`~tfdist.data.QueueRunner` started with this coordinator
    registers its queue: on a stop, the queue is closed (pending enqueues
    cancelled) and, if the stop carries an error, dequeuers get that error
    at once, so ``model.fit`` fails instead of waiting.

    Args:
        clean_stop_exception_types: exceptions that mean "stop, no error".
            Defaults to ``(QueueClosedError,)`` (TF1: ``OutOfRangeError``).

    Example:
        >>> with Coordinator() as coord:
        ...     runner.start(coord)
        ...     model.fit(queue.as_dataset(batch_size=64), epochs=1)
        ... # leaving the block stops and joins the producer threads
        ... # and re-raises the first producer error, if any.
    """

    def __init__(self, clean_stop_exception_types: Iterable[type] | None = None):
        self._clean_stop_types = tuple(
            (QueueClosedError,) if clean_stop_exception_types is None else clean_stop_exception_types
        )
        self._lock = threading.Lock()
        self._stop_event = threading.Event()
        self._exc_info: tuple | None = None
        self._threads: list[threading.Thread] = []
        self._on_stop: list[Callable[[BaseException | None], None]] = []
        self._joined = False

    # -- stopping --------------------------------------------------------------

    def should_stop(self) -> bool:
        """True once a stop was requested."""
        return self._stop_event.is_set()

    def request_stop(self, ex: BaseException | tuple | None = None) -> None:
        """Asks every coordinated thread to stop.

        Args:
            ex: an exception, or an ``exc_info`` tuple, that caused the stop.
                Only the first one is kept; clean-stop types are ignored.
                Defaults to ``None``.
        """
        if isinstance(ex, tuple):
            exc_info = ex
        elif isinstance(ex, BaseException):
            exc_info = (type(ex), ex, ex.__traceback__)
        else:
            exc_info = None
        if exc_info is not None and issubclass(exc_info[0], self._clean_stop_types):
            exc_info = None
        with self._lock:
            new_error = exc_info is not None and self._exc_info is None
            if new_error:
                self._exc_info = exc_info
                logger.error("stopping: %s: %s", exc_info[0].__name__, exc_info[1])
            first = not self._stop_event.is_set()
            self._stop_event.set()
            # Callbacks run on the first stop, and again if an error arrives
            # after a clean stop (it still has to reach the dequeuers).
            callbacks = list(self._on_stop) if (first or new_error) else []
            error = None if self._exc_info is None else self._exc_info[1]
        for callback in callbacks:
            callback(error)

    def clear_stop(self) -> None:
        """Clears the stop request (and the kept exception), for reuse."""
        with self._lock:
            self._stop_event.clear()
            self._exc_info = None
            self._joined = False

    def wait_for_stop(self, timeout: float | None = None) -> bool:
        """Waits until a stop is requested; returns whether it was."""
        return self._stop_event.wait(timeout)

    def add_stop_callback(self, callback: Callable[[BaseException | None], None]) -> None:
        """Calls ``callback(error_or_None)`` when a stop is first requested.

        Called at once if the stop was already requested.
        """
        with self._lock:
            self._on_stop.append(callback)
            stopped = self._stop_event.is_set()
            error = None if self._exc_info is None else self._exc_info[1]
        if stopped:
            callback(error)

    @contextlib.contextmanager
    def stop_on_exception(self):
        """Context manager: an exception in the block requests a stop with it.

        Example:
            >>> with coord.stop_on_exception():
            ...     while not coord.should_stop():
            ...         do_work()
        """
        try:
            yield
        except BaseException:  # noqa: BLE001 - handed to the coordinator
            self.request_stop(sys.exc_info())

    # -- threads ---------------------------------------------------------------

    def register_thread(self, thread: threading.Thread) -> None:
        """Adds a thread that :meth:`join` waits for."""
        with self._lock:
            self._threads.append(thread)

    @property
    def joined(self) -> bool:
        return self._joined

    def join(
        self,
        threads: Iterable[threading.Thread] | None = None,
        stop_grace_period_secs: float = 120.0,
        ignore_live_threads: bool = False,
    ) -> None:
        """Waits for the threads to end, then re-raises the first error.

        Blocks until the threads end or a stop is requested; after a stop,
        threads get ``stop_grace_period_secs`` to finish.

        Args:
            threads: threads to wait for. Defaults to the registered ones.
            stop_grace_period_secs: seconds the threads get after a stop.
                Defaults to 120.
            ignore_live_threads: when threads outlive the grace period, log
                instead of raising. Defaults to ``False``.

        Raises:
            RuntimeError: threads still alive after the grace period.
            BaseException: the first exception passed to ``request_stop``.
        """
        with self._lock:
            threads = list(self._threads if threads is None else threads)
        while any(t.is_alive() for t in threads) and not self._stop_event.wait(0.1):
            pass
        deadline = time.monotonic() + stop_grace_period_secs
        for t in threads:
            t.join(max(0.0, deadline - time.monotonic()))
        alive = [t.name for t in threads if t.is_alive()]
        self._joined = True
        if alive:
            message = (
                f"Coordinator stopped but threads are still running after "
                f"stop_grace_period_secs={stop_grace_period_secs}: {alive}. "
                "Make them check should_stop() or use timeouts on blocking calls."
            )
            if ignore_live_threads:
                logger.warning(message)
            else:
                self.raise_requested_exception()
                raise RuntimeError(message)
        self.raise_requested_exception()

    def raise_requested_exception(self) -> None:
        """Re-raises the exception given to :meth:`request_stop`, if any."""
        with self._lock:
            exc_info = self._exc_info
        if exc_info is not None:
            raise exc_info[1].with_traceback(exc_info[2])

    # -- with-block ------------------------------------------------------------

    def __enter__(self) -> "Coordinator":
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        # The training thread's own error (often tf.data reporting the
        # producer's failure) becomes the __context__ of the producer's error.
        self.request_stop()
        self.join()
        return False
