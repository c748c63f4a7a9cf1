"""Reading a child process's output with a deadline that holds even when the child prints nothing.

``for line in proc.stdout`` checks a deadline only when a line arrives: a
child that hangs silently blocks the reader until something else (pytest's
timeout) ends it. :class:`OutputLines` reads in a daemon thread and waits
on a queue with a timeout instead.
"""

from __future__ import annotations

import queue
import threading
import time

__all__ = ["OutputLines"]


class OutputLines:
    """The lines a process writes to a pipe (``stdout=PIPE, text=True``), read in the background.

    Example::

        out = OutputLines(proc.stdout)
        assert out.wait_for("ready", timeout_s=90), out.text()
    """

    def __init__(self, stream):
        self.lines: list[str] = []
        self._queue: queue.Queue = queue.Queue()
        self._closed = False
        threading.Thread(target=self._read, args=(stream,), daemon=True, name="tfdist-output-lines").start()

    def _read(self, stream) -> None:
        try:
            for line in stream:
                self._queue.put(line)
        except (OSError, ValueError):  # the pipe was closed under the reader
            pass
        self._queue.put(None)

    def wait_for(self, text: str, timeout_s: float) -> bool:
        """Waits until a line containing ``text`` has arrived (True) or ``timeout_s`` passed or the pipe closed."""
        if any(text in line for line in self.lines):
            return True
        deadline = time.monotonic() + timeout_s
        while not self._closed:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            try:
                line = self._queue.get(timeout=left)
            except queue.Empty:
                return False
            if line is None:
                self._closed = True
                break
            self.lines.append(line)
            if text in line:
                return True
        return False

    def drain(self, timeout_s: float) -> str:
        """Waits (up to ``timeout_s``) until the pipe closes; returns everything read."""
        self.wait_for("\0", timeout_s)  # never in text output: reads to the end or the timeout
        return self.text()

    def text(self) -> str:
        """Everything read so far."""
        return "".join(self.lines)
