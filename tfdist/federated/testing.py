"""Fault injection for tests of federated simulations (importable by spawned workers)."""

from __future__ import annotations

import os

from tfdist.federated.client import KerasClientUpdate

__all__ = ["CrashingClientUpdate"]


class CrashingClientUpdate(KerasClientUpdate):
    """Trains normally, then fails on the ``fail_after + 1``-th client update of a worker.

    Args:
        fail_after: client updates a worker completes before failing. Defaults to 0.
        exit_code: ``None`` raises ``RuntimeError(message)`` (reported with its
            traceback); an int ends the process with ``os._exit(exit_code)``, like
            a native crash or an OOM kill (reported by exit code).
        message: text of the raised error. Defaults to ``"injected failure"``.
    """

    def __init__(self, fail_after: int = 0, exit_code: int | None = None, message: str = "injected failure"):
        self.fail_after = int(fail_after)
        self.exit_code = exit_code
        self.message = message
        self._done = 0

    def warm_up(self, task, x, y):
        super().train(task, x, y)

    def train(self, task, x, y):
        if self._done >= self.fail_after:
            if self.exit_code is not None:
                os._exit(self.exit_code)
            raise RuntimeError(f"{self.message} (client {task.client_id})")
        self._done += 1
        return super().train(task, x, y)
