"""Persistent-straggler detection: EWMA of each worker's throughput / median throughput.

The rule of the autoscaling engine of Or, Zhang and Freedman, "Resource
Elasticity in Distributed Deep Learning" (MLSys 2020; ``shared/seeds/002_*``):
a worker is a *potential* straggler when its throughput as a fraction of the
median throughput falls below a threshold (0.8: at most a 1.25x slow-down is
tolerated). Acting on one slow batch is too aggressive, and "N slow batches
in a row" is evaded by a worker that recovers every N-1 batches, so the
engine keeps an exponentially weighted moving average (EWMA) of that
fraction and calls a worker a *persistent* straggler while the average is
below the threshold. Statistics are taken over windows of minibatches (the
paper uses 10).

Choices tfdist makes where the paper is silent:

* The EWMA of every worker starts at 1.0 (a worker is presumed normal), so a
  single slow window never flags a worker: with ``alpha=0.1`` a worker at
  1/5 of the median speed is flagged after 3 windows.
* A persistent straggler recovers when its EWMA is back at or above
  ``recovery_threshold`` (defaults to ``threshold``).

No I/O, no clock, no TensorFlow.

Example:

>>> det = EwmaDetector(num_workers=3, window=1)
>>> [sorted(det.observe_times([0.1, 0.1, 0.5]).stragglers) for _ in range(3)]
[[], [], [2]]
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from tfdist.straggler.verdicts import DetectorName, EventKind, EwmaVerdict, StragglerEvent

__all__ = ["EwmaConfig", "EwmaDetector", "throughput_ratios"]


def throughput_ratios(throughputs: Sequence[float]) -> np.ndarray:
    """Each worker's throughput divided by the median of the workers present.

    ``nan`` marks a worker without data; it stays ``nan`` and does not count
    toward the median.

    >>> throughput_ratios([10.0, 10.0, 5.0]).tolist()
    [1.0, 1.0, 0.5]
    """
    values = np.asarray(throughputs, dtype=np.float64)
    present = values[~np.isnan(values)]
    if present.size == 0:
        return np.full_like(values, np.nan)
    median = float(np.median(present))
    if median <= 0:
        return np.where(np.isnan(values), np.nan, 1.0)
    return values / median


@dataclass
class EwmaConfig:
    """Settings of :class:`EwmaDetector`.

    Attributes:
        alpha: Weight of the newest window in the moving average, in (0, 1].
            Defaults to 0.1.
        threshold: A worker whose average falls below this is a persistent
            straggler. Defaults to 0.8 (the paper's value).
        recovery_threshold: A persistent straggler whose average is back at
            or above this is normal again. Must be >= ``threshold``. Defaults
            to ``None`` (= ``threshold``).
        window: Iterations per window; throughput is measured over a window.
            Defaults to 10 (the paper collects statistics every 10 batches).
    """

    alpha: float = 0.1
    threshold: float = 0.8
    recovery_threshold: float | None = None
    window: int = 10

    def __post_init__(self):
        def number(name, value, low, high, fix):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not (low < value <= high):
                raise ValueError(f"`{name}` must be in ({low}, {high}]. Received: {name}={value!r}. {fix}")

        number("alpha", self.alpha, 0.0, 1.0, "Defaults to 0.1.")
        number("threshold", self.threshold, 0.0, 1.0, "Defaults to 0.8 (tolerate a 1.25x slow-down).")
        if self.recovery_threshold is not None:
            number("recovery_threshold", self.recovery_threshold, 0.0, 1.0, "Defaults to `threshold`.")
            if self.recovery_threshold < self.threshold:
                raise ValueError(
                    f"`recovery_threshold` must be >= `threshold`. Received: recovery_threshold="
                    f"{self.recovery_threshold!r}, threshold={self.threshold!r}."
                )
        if isinstance(self.window, bool) or not isinstance(self.window, int) or self.window < 1:
            raise ValueError(f"`window` must be an integer >= 1. Received: window={self.window!r}. Defaults to 10.")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


class EwmaDetector:
    """Flags persistent stragglers from per-iteration times or throughputs.

    Feed :meth:`observe_times` (seconds per worker per iteration, equal batch
    sizes) or :meth:`observe_throughputs` (examples/s per worker) once per
    iteration; every ``window`` iterations the window's throughputs update
    the averages.

    Args:
        num_workers: Number of workers.
        config: An :class:`EwmaConfig`. Defaults to alpha 0.1, threshold 0.8,
            window 10.
        **overrides: Config fields given directly, e.g. ``alpha=0.2``.
    """

    name = DetectorName.EWMA

    def __init__(self, num_workers: int, config: EwmaConfig | None = None, **overrides: Any):
        if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 1:
            raise ValueError(f"`num_workers` must be an integer >= 1. Received: num_workers={num_workers!r}.")
        config = config or EwmaConfig()
        if overrides:
            config = dataclasses.replace(config, **overrides)
        self.config = config
        self.num_workers = num_workers
        self._ewma = np.ones(num_workers, dtype=np.float64)
        self._ratios = np.full(num_workers, np.nan)
        self._stragglers: set[int] = set()
        self._work = np.zeros(num_workers)  # examples (or iterations) in the open window
        self._seconds = np.zeros(num_workers)
        self._seen = np.zeros(num_workers, dtype=np.int64)
        self._in_window = 0
        self._epoch = 0
        self._iteration = 0
        self._step = 0

    @property
    def ewma(self) -> tuple[float, ...]:
        return tuple(float(x) for x in self._ewma)

    @property
    def stragglers(self) -> frozenset[int]:
        return frozenset(self._stragglers)

    def state_dict(self) -> dict[str, Any]:
        """A copy of the detector's whole state (picklable), for :meth:`load_state_dict` on another worker.

        A worker that was left out of some iterations loads a member's state
        when it is re-admitted, so every worker again reaches the same verdicts.
        """
        return copy.deepcopy({k: v for k, v in self.__dict__.items() if k not in ("config", "num_workers")})

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Replaces the state with one from :meth:`state_dict` (same ``num_workers`` and config)."""
        self.__dict__.update(copy.deepcopy(state))

    def start_epoch(self, epoch: int | None = None) -> None:
        """Sets the epoch number copied into events (windows span epochs)."""
        self._epoch = self._epoch + 1 if epoch is None else int(epoch)
        self._iteration = 0

    def observe_times(
        self, times: Sequence[float | None], batch_sizes: Sequence[float] | float = 1.0, now: float | None = None
    ) -> EwmaVerdict:
        """One iteration: each worker's seconds (``None``: did not take part)."""
        if len(times) != self.num_workers:
            raise ValueError(f"Expected one time per worker ({self.num_workers}). Received: {list(times)!r}.")
        secs = np.array([np.nan if t is None else float(t) for t in times])
        if np.any(secs < 0) or np.any(np.isinf(secs)):
            raise ValueError(f"Times must be finite and >= 0 seconds. Received: times={list(times)!r}.")
        work = np.broadcast_to(np.asarray(batch_sizes, dtype=np.float64), secs.shape)
        present = ~np.isnan(secs)
        self._work[present] += work[present]
        self._seconds[present] += secs[present]
        self._seen[present] += 1
        return self._advance(now)

    def observe_throughputs(self, throughputs: Sequence[float | None], now: float | None = None) -> EwmaVerdict:
        """One iteration: each worker's throughput (``None``: no data)."""
        if len(throughputs) != self.num_workers:
            raise ValueError(
                f"Expected one throughput per worker ({self.num_workers}). Received: {list(throughputs)!r}."
            )
        rates = np.array([np.nan if r is None else float(r) for r in throughputs])
        if np.any(rates < 0) or np.any(np.isinf(rates)):
            raise ValueError(f"Throughputs must be finite and >= 0. Received: {list(throughputs)!r}.")
        present = ~np.isnan(rates)
        # one "second" of work at the given rate: the window's throughput is the mean rate
        self._work[present] += rates[present]
        self._seconds[present] += 1.0
        self._seen[present] += 1
        return self._advance(now)

    def _advance(self, now: float | None) -> EwmaVerdict:
        self._in_window += 1
        events: list[StragglerEvent] = []
        updated = self._in_window >= self.config.window
        if updated:
            # a worker with no data in the window is nan; a zero time counts as 1 microsecond
            rates = np.where(self._seen > 0, self._work / np.maximum(self._seconds, 1e-6), np.nan)
            self._ratios = throughput_ratios(rates)
            events = self._update(now)
            self._work[:] = 0
            self._seconds[:] = 0
            self._seen[:] = 0
            self._in_window = 0
        verdict = EwmaVerdict(
            updated=updated,
            ratios=tuple(float(r) for r in self._ratios),
            ewma=self.ewma,
            stragglers=self.stragglers,
            events=tuple(events),
        )
        self._iteration += 1
        self._step += 1
        return verdict

    def _update(self, now: float | None) -> list[StragglerEvent]:
        alpha, low = self.config.alpha, self.config.threshold
        high = self.config.recovery_threshold if self.config.recovery_threshold is not None else low
        events = []
        for worker, ratio in enumerate(self._ratios):
            if np.isnan(ratio):
                continue
            self._ewma[worker] = alpha * ratio + (1 - alpha) * self._ewma[worker]
            avg = float(self._ewma[worker])
            kind = None
            if worker not in self._stragglers and avg < low:
                self._stragglers.add(worker)
                kind, threshold = EventKind.DETECTED, low
            elif worker in self._stragglers and avg >= high:
                self._stragglers.discard(worker)
                kind, threshold = EventKind.RECOVERED, high
            if kind is not None:
                events.append(
                    StragglerEvent(
                        kind=kind,
                        worker=worker,
                        detector=self.name,
                        epoch=self._epoch,
                        iteration=self._iteration,
                        step=self._step,
                        time=now,
                        value=avg,
                        threshold=threshold,
                    )
                )
        return events
