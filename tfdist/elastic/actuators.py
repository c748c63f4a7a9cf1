"""Actuators: how the autoscaling engine starts and stops workers.

The engine (:mod:`tfdist.elastic.engine`) decides; an actuator carries the
decision out on some kind of infrastructure. The interface is four methods,
so a Kubernetes actuator (create/delete a pod of the worker template with
``TF_CONFIG`` for slot ``worker``) or a Ray actuator (start/stop an actor)
can be added without touching the policy or the engine:

* ``start_worker(worker, env)`` — start training slot ``worker`` (a worker id:
  index into ``cluster.training_tasks()``) with extra environment ``env``
  (the engine passes ``TFDIST_WARMUP_BATCHES`` to joiners). Return at once;
  the engine sees the worker join on the parameter servers.
* ``stop_worker(worker)`` — stop it *now* (the engine first asks it to leave
  gracefully through the parameter servers and calls this only when it has
  not left within ``elastic.drain_timeout_s``).
* ``poll()`` — ``{worker: exit code}`` of workers that ended since the last
  call (``None`` code: ended, status unknown). Crashes are non-zero codes.
* ``close()`` — stop everything this actuator started.

Shipped: :class:`LocalActuator` (processes on this machine through the
launcher's :class:`~tfdist.cluster.local.LocalJob`) and
:class:`DryRunActuator` (records calls; for tests and for trying a policy).
"""

from __future__ import annotations

import abc
import logging
import time
from dataclasses import dataclass, field
from typing import Callable, Mapping

from tfdist.config import TaskSpec
from tfdist.errors import LaunchError

__all__ = ["Actuator", "LocalActuator", "DryRunActuator", "ActuatorCall"]

logger = logging.getLogger(__name__)


class Actuator(abc.ABC):
    """Starts and stops training workers for the autoscaling engine."""

    @abc.abstractmethod
    def start_worker(self, worker: int, env: Mapping[str, str]) -> None:
        """Starts training slot ``worker`` with extra environment ``env``."""

    @abc.abstractmethod
    def stop_worker(self, worker: int) -> None:
        """Stops slot ``worker`` now (after a graceful drain timed out)."""

    @abc.abstractmethod
    def poll(self) -> dict[int, int | None]:
        """Exit codes of workers that ended since the last call."""

    def running(self) -> set[int]:
        """Workers this actuator believes are running (for logs)."""
        return set()

    def close(self) -> None:
        """Stops every worker this actuator started."""


class LocalActuator(Actuator):
    """Worker processes on this machine, started through a :class:`LocalJob`.

    Args:
        job: The launcher's job (its parameter servers already started); its
            config lists ``elastic.max_workers`` training tasks.
        stop_grace_s: SIGTERM → SIGKILL grace when stopping a worker.
    """

    def __init__(self, job, stop_grace_s: float = 5.0):
        self.job = job
        self.stop_grace_s = stop_grace_s
        self._tasks = job.config.cluster.training_tasks()
        self._watching: set[int] = set()

    def task(self, worker: int) -> TaskSpec:
        if not 0 <= worker < len(self._tasks):
            raise LaunchError(
                f"Worker {worker} has no training-task slot: the cluster has {len(self._tasks)} "
                "(elastic.max_workers)."
            )
        return TaskSpec(*self._tasks[worker])

    def start_worker(self, worker: int, env: Mapping[str, str]) -> None:
        task = self.task(worker)
        self.job.extra_env[str(task)] = dict(env)
        self.job.start_task(task)
        self._watching.add(worker)

    def stop_worker(self, worker: int) -> None:
        proc = self.job.tasks.get(str(self.task(worker)))
        if proc is not None and proc.running:
            proc.stop(self.stop_grace_s)

    def kill_worker(self, worker: int) -> None:
        """SIGKILL (a crash; for tests and experiments)."""
        self.job.kill(self.task(worker))

    def poll(self) -> dict[int, int | None]:
        ended = {}
        for worker in sorted(self._watching):
            proc = self.job.tasks.get(str(self.task(worker)))
            code = None if proc is None else proc.poll()
            if proc is None or code is not None:
                ended[worker] = code
                self._watching.discard(worker)
        return ended

    def running(self) -> set[int]:
        return set(self._watching)

    def close(self) -> None:
        for worker in sorted(self._watching):
            self.stop_worker(worker)
        self._watching.clear()


@dataclass
class ActuatorCall:
    """One call a :class:`DryRunActuator` received."""

    time: float
    method: str
    worker: int
    env: dict = field(default_factory=dict)


class DryRunActuator(Actuator):
    """Starts nothing; records every call. Tests script exits with :meth:`end`.

    Args:
        clock: Time source for the records. Defaults to ``time.monotonic``.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self.clock = clock
        self.calls: list[ActuatorCall] = []
        self._running: set[int] = set()
        self._ended: dict[int, int | None] = {}

    def start_worker(self, worker: int, env: Mapping[str, str]) -> None:
        if worker in self._running:
            raise LaunchError(f"Worker {worker} is already running.")
        self.calls.append(ActuatorCall(self.clock(), "start", worker, dict(env)))
        self._running.add(worker)

    def stop_worker(self, worker: int) -> None:
        self.calls.append(ActuatorCall(self.clock(), "stop", worker))
        self.end(worker, -15)

    def end(self, worker: int, code: int | None = 0) -> None:
        """Makes ``worker`` end with exit ``code`` (0: left, non-zero: crashed)."""
        if worker in self._running:
            self._running.discard(worker)
            self._ended[worker] = code

    def poll(self) -> dict[int, int | None]:
        ended, self._ended = self._ended, {}
        return ended

    def running(self) -> set[int]:
        return set(self._running)

    def close(self) -> None:
        for worker in sorted(self._running):
            self.calls.append(ActuatorCall(self.clock(), "close", worker))
        self._running.clear()
