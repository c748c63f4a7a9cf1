"""Slow-worker injection for experiments, the way the papers emulate stragglers.

Part of the runtime (every tfdist strategy applies ``TFDIST_SLOWDOWN``);
:mod:`tfdist.testing` re-exports it.

A :class:`Slowdown` decides how long to sleep after each training step of a
chosen worker: a fixed ``delay_s``, and/or ``factor`` × the step's measured
compute time (``factor=3`` makes the step take about 3× as long), optionally
only on a schedule (e.g. the first half of every epoch).

Two ways to use it:

* with no code change, from the environment: ``TFDIST_SLOWDOWN`` holds JSON
  ``{"worker:2": {"factor": 3, "schedule": "first_half", "steps_per_epoch": 40}}``
  (``tfdist.launch`` sets it from ``launch.slowdown`` in the config); every
  tfdist strategy applies it at the start of each training step;
* explicitly: ``model.fit(..., callbacks=[SlowdownCallback(factor=3)])``.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from typing import Any, Mapping

__all__ = ["Slowdown", "SlowdownCallback", "slowdown_from_env", "ENV_SLOWDOWN"]  # noqa: F822 (module __getattr__)

from tfdist.constants import ENV_SLOWDOWN  # noqa: E402  (re-exported)
SCHEDULES = ("always", "first_half", "second_half")


@dataclass
class Slowdown:
    """How much slower one worker runs.

    Attributes:
        factor: Target step time as a multiple of the measured compute time
            (1 = no slowdown). Defaults to 1.
        delay_s: Extra fixed sleep per step, in seconds. Defaults to 0.
        schedule: ``"always"``, ``"first_half"`` or ``"second_half"`` of
            every epoch (needs ``steps_per_epoch``). Defaults to ``"always"``.
        steps_per_epoch: Steps per epoch, for the schedules.
        start_step: No slowdown before this global step index. Defaults to 0.
        stop_step: No slowdown from this step on. Defaults to ``None`` (never stop).
    """

    factor: float = 1.0
    delay_s: float = 0.0
    schedule: str = "always"
    steps_per_epoch: int | None = None
    start_step: int = 0
    stop_step: int | None = None

    def __post_init__(self):
        if self.factor < 1:
            raise ValueError(f"factor must be >= 1. Received: factor={self.factor!r}.")
        if self.delay_s < 0:
            raise ValueError(f"delay_s must be >= 0. Received: delay_s={self.delay_s!r}.")
        if self.schedule not in SCHEDULES:
            raise ValueError(f"Unknown schedule. Received: schedule={self.schedule!r}. Use one of {list(SCHEDULES)}.")
        if self.schedule != "always" and not self.steps_per_epoch:
            raise ValueError(f"schedule={self.schedule!r} needs steps_per_epoch.")

    def active(self, step: int) -> bool:
        """Whether training step ``step`` (0-based, counted over all epochs) is slowed."""
        if step < self.start_step or (self.stop_step is not None and step >= self.stop_step):
            return False
        if self.schedule == "always":
            return True
        in_epoch = step % self.steps_per_epoch
        first_half = in_epoch < self.steps_per_epoch / 2
        return first_half if self.schedule == "first_half" else not first_half

    def sleep_for(self, step: int, compute_s: float) -> float:
        """Seconds to sleep after step ``step`` that took ``compute_s`` to compute."""
        if not self.active(step):
            return 0.0
        return self.delay_s + (self.factor - 1.0) * max(compute_s, 0.0)


class StepSlowdown:
    """Applies a :class:`Slowdown` around consecutive steps (used by strategies).

    The compute time a ``factor`` multiplies is the median of the last five
    measured steps, and the first step (which includes tracing the training
    function) is never measured, so one slow outlier does not turn into a
    long sleep.
    """

    def __init__(self, slowdown: Slowdown, window: int = 5):
        self.slowdown = slowdown
        self.step = 0
        self._started: float | None = None
        self._recent: list[float] = []
        self._window = window
        self.slept_s = 0.0

    def at_step_start(self) -> None:
        """Call at the start of each step: sleeps for the previous one."""
        now = time.perf_counter()
        if self._started is not None:
            if self.step > 1:  # step 0 traced the function: not a compute time
                self._recent = (self._recent + [now - self._started])[-self._window:]
            compute = sorted(self._recent)[len(self._recent) // 2] if self._recent else 0.0
            pause = self.slowdown.sleep_for(self.step - 1, compute)
            if pause > 0:
                time.sleep(pause)
                self.slept_s += pause
        self._started = time.perf_counter()
        self.step += 1


def slowdown_from_env(task: str, env: Mapping[str, str] | None = None) -> Slowdown | None:
    """The slowdown ``TFDIST_SLOWDOWN`` assigns to ``task`` (e.g. ``"worker:2"``), if any."""
    raw = (os.environ if env is None else env).get(ENV_SLOWDOWN)
    if not raw:
        return None
    try:
        spec: Any = json.loads(raw)
    except ValueError as e:
        raise ValueError(f"{ENV_SLOWDOWN} is not valid JSON: {e}. Received: {raw[:200]!r}.") from e
    if not isinstance(spec, dict):
        raise ValueError(f'{ENV_SLOWDOWN} must map tasks to settings, e.g. {{"worker:1": {{"factor": 3}}}}.')
    mine = spec.get(task)
    return Slowdown(**mine) if mine else None


def _make_callback_class():
    import keras

    class SlowdownCallback(keras.callbacks.Callback):
        """Keras callback that slows the worker it runs on.

        Example:

        ```python
        model.fit(ds, callbacks=[SlowdownCallback(factor=3, schedule="first_half", steps_per_epoch=40)])
        ```

        Args:
            **kwargs: The fields of :class:`Slowdown`.
        """

        def __init__(self, **kwargs):
            super().__init__()
            self.slowdown = Slowdown(**kwargs)
            self._step = 0
            self._start = 0.0

        def on_train_batch_begin(self, batch, logs=None):
            self._start = time.perf_counter()

        def on_train_batch_end(self, batch, logs=None):
            pause = self.slowdown.sleep_for(self._step, time.perf_counter() - self._start)
            if pause > 0:
                time.sleep(pause)
            self._step += 1

    return SlowdownCallback


def __getattr__(name: str):  # the callback needs Keras; import it only when asked for
    if name == "SlowdownCallback":
        cls = _make_callback_class()
        globals()[name] = cls
        return cls
    raise AttributeError(name)
