"""Errors raised by the federated-learning simulator."""

from __future__ import annotations

from tfdist.errors import ConfigError, TfdistError

__all__ = ["ConfigError", "FederatedError", "WorkerCrashedError", "SimulationTimeoutError"]


class FederatedError(TfdistError):
    """Base class of the simulator's run-time errors."""


class WorkerCrashedError(FederatedError):
    """A train or test worker process failed; the simulation was stopped.

    Attributes:
        worker: name of the failed process (``"train-worker-1"``, ``"test-worker"``).
        remote_traceback: the traceback text captured in the failed process, or
            ``None`` when the process died without reporting (killed, segfault).
    """

    def __init__(self, message: str, worker: str = "", remote_traceback: str | None = None):
        super().__init__(message)
        self.worker = worker
        self.remote_traceback = remote_traceback

    def __reduce__(self):
        return (type(self), (self.args[0], self.worker, self.remote_traceback))


class SimulationTimeoutError(FederatedError):
    """A bounded wait of the simulator expired (the message names the setting)."""
