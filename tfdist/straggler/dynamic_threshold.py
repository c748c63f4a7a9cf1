"""Dynamic-threshold straggler detection with a bounded per-worker counter.

The rule of Algorithm 1 in the seed paper (dynamic straggler detection,
Horovod on 4x T4, CIFAR-10 / ResNet-18; ``shared/seeds/000_*``, §4):

* **Threshold, per epoch.** During the first ``n`` iterations of every epoch
  the fastest worker's compute time of each iteration is collected; at the
  ``n``-th iteration ``threshold = k x mean(those minima)``. The fastest
  worker stands for what a normal worker achieves *now*, so the threshold
  follows the system through the run.
* **Counter, per worker, bounded to [0, limit].** Each iteration a worker's
  time above the threshold adds 1 (at most ``limit``); a time below it takes
  1 off (at least 0). Counting the recent *frequency* of slow iterations
  (not their total) keeps occasionally slow normal workers from being
  misclassified; the bounds keep the counter quick to react to a change.
* **Verdict.** A worker whose counter reaches ``limit`` is a straggler; it is
  normal again as soon as its counter falls below ``limit``.
* **Recovery.** An engine may leave stragglers out of the iterations it runs
  (:attr:`IterationVerdict.excluded`); they take part again in the first ``n``
  iterations of every epoch, so a recovered straggler is seen (§4.2: a time
  below the threshold takes 1 off). Until the epoch's new threshold is set,
  the previous epoch's is in force and may only *lower* counters, so a
  system-wide slow-down at an epoch start is not taken for stragglers. The
  first epoch has no threshold before iteration ``n``, so counting starts
  there (the paper's counters start at 1 when the threshold is set).

The paper's defaults are ``n=5``, ``k=2``. It sets the limit by hand or as a
fraction of an epoch's iterations without giving the fraction; its detection
latencies (10 iterations at 390 iterations/epoch, 6 at 195) both fit about
2.5 %, so ``limit`` defaults to ``max(3, ceil(0.025 x iterations))``
(:func:`default_limit`).

This module has no I/O, no clock, no TensorFlow: it is driven with numbers.

Example:

>>> det = DynamicThresholdDetector(num_workers=2, limit=3)
>>> det.start_epoch(0, iterations=20)
>>> for _ in range(5):
...     v = det.observe([0.10, 0.11])
>>> round(v.threshold, 3)
0.2
>>> for _ in range(3):
...     v = det.observe([0.10, 0.50])
>>> sorted(v.stragglers), v.events[0].kind.value
([1], 'detected')
"""

from __future__ import annotations

import copy
import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from tfdist.straggler.verdicts import DetectorName, EpochSummary, EventKind, IterationVerdict, StragglerEvent

__all__ = [
    "DynamicThresholdConfig",
    "DynamicThresholdDetector",
    "default_limit",
    "DEFAULT_LIMIT_FRACTION",
    "DEFAULT_MIN_LIMIT",
    "DEFAULT_LIMIT_UNKNOWN_EPOCH",
]

#: Fraction of an epoch's iterations used as the counter limit when none is given.
DEFAULT_LIMIT_FRACTION = 0.025
#: Smallest default limit: one or two slow iterations never make a straggler.
DEFAULT_MIN_LIMIT = 3
#: Limit used when the epoch's length is unknown and no epoch has ended yet.
DEFAULT_LIMIT_UNKNOWN_EPOCH = 10


def default_limit(
    iterations: int | None,
    fraction: float = DEFAULT_LIMIT_FRACTION,
    min_limit: int = DEFAULT_MIN_LIMIT,
) -> int:
    """The counter limit for an epoch of ``iterations`` iterations.

    Returns ``max(min_limit, ceil(fraction x iterations))``, or
    :data:`DEFAULT_LIMIT_UNKNOWN_EPOCH` (but at least ``min_limit``) when
    ``iterations`` is ``None``.

    >>> default_limit(390), default_limit(195), default_limit(20), default_limit(None)
    (10, 5, 3, 10)
    """
    if iterations is None:
        return max(min_limit, DEFAULT_LIMIT_UNKNOWN_EPOCH)
    return max(min_limit, math.ceil(fraction * iterations - 1e-9))


def _check_positive_int(name: str, value: Any, fix: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"`{name}` must be an integer >= 1. Received: {name}={value!r}. {fix}")


@dataclass
class DynamicThresholdConfig:
    """Settings of :class:`DynamicThresholdDetector`.

    Attributes:
        profile_iterations: ``n``: iterations at the start of each epoch whose
            fastest times set the threshold (and in which stragglers take part
            again). Defaults to 5.
        factor: ``k``: threshold = ``k`` x mean fastest time. Must be > 1.
            Defaults to 2.0.
        limit: Counter value at which a worker is a straggler. Defaults to
            ``None``: :func:`default_limit` of each epoch's iterations.
        limit_fraction: Fraction of the epoch's iterations used when ``limit``
            is ``None``. Defaults to 0.025.
        min_limit: Smallest limit used when ``limit`` is ``None``. Defaults to 3.
    """

    profile_iterations: int = 5
    factor: float = 2.0
    limit: int | None = None
    limit_fraction: float = DEFAULT_LIMIT_FRACTION
    min_limit: int = DEFAULT_MIN_LIMIT

    def __post_init__(self):
        _check_positive_int("profile_iterations", self.profile_iterations, "The paper uses 5.")
        if isinstance(self.factor, bool) or not isinstance(self.factor, (int, float)) or not self.factor > 1:
            raise ValueError(
                f"`factor` must be a number > 1 (threshold = factor x fastest time). "
                f"Received: factor={self.factor!r}. The paper uses 2.0."
            )
        if self.limit is not None:
            _check_positive_int("limit", self.limit, "Give a positive count, or None for a fraction of the epoch.")
        if isinstance(self.limit_fraction, bool) or not isinstance(self.limit_fraction, (int, float)) or not (
            0 < self.limit_fraction <= 1
        ):
            raise ValueError(
                f"`limit_fraction` must be in (0, 1]. Received: limit_fraction={self.limit_fraction!r}. "
                f"Defaults to {DEFAULT_LIMIT_FRACTION}."
            )
        _check_positive_int("min_limit", self.min_limit, f"Defaults to {DEFAULT_MIN_LIMIT}.")

    def limit_for(self, iterations: int | None) -> int:
        """The limit for an epoch of ``iterations`` iterations (``None``: unknown)."""
        if self.limit is not None:
            return self.limit
        return default_limit(iterations, self.limit_fraction, self.min_limit)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


class DynamicThresholdDetector:
    """Classifies workers as stragglers from their per-iteration compute times.

    Drive it with :meth:`start_epoch`, one :meth:`observe` per iteration (the
    compute time of every worker, ``None`` for a worker that did not take
    part) and :meth:`end_epoch`. Every worker process that feeds the same
    times gets the same verdicts, so no verdict has to be broadcast.

    Args:
        num_workers: Number of workers (ids ``0 .. num_workers-1``).
        config: A :class:`DynamicThresholdConfig`. Defaults to the paper's
            settings.
        **overrides: Fields of the config given directly, e.g. ``limit=4``.

    Raises:
        ValueError: a setting is out of range.
    """

    name = DetectorName.DYNAMIC_THRESHOLD

    def __init__(self, num_workers: int, config: DynamicThresholdConfig | None = None, **overrides: Any):
        _check_positive_int("num_workers", num_workers, "Give the number of training workers.")
        config = config or DynamicThresholdConfig()
        if overrides:
            config = dataclasses.replace(config, **overrides)
        self.config = config
        self.num_workers = num_workers
        self._counters = np.zeros(num_workers, dtype=np.int64)
        self._stragglers: set[int] = set()
        self._threshold: float | None = None  # in force now (previous epoch's during profiling)
        self._epoch = -1
        self._iteration = 0
        self._step = 0
        self._minima: list[float] = []
        self._epoch_threshold: float | None = None
        self._limit = config.limit_for(None)
        self._last_epoch_iterations: int | None = None
        self._in_epoch = False
        self._detections = 0
        self._recoveries = 0

    # ------------------------------------------------------------------ state
    @property
    def counters(self) -> tuple[int, ...]:
        """Every worker's counter."""
        return tuple(int(c) for c in self._counters)

    @property
    def stragglers(self) -> frozenset[int]:
        """Workers classified as stragglers now."""
        return frozenset(self._stragglers)

    @property
    def threshold(self) -> float | None:
        """The threshold (seconds) in force, ``None`` before the first one is set."""
        return self._threshold

    @property
    def limit(self) -> int:
        """The counter limit in force."""
        return self._limit

    @property
    def epoch(self) -> int:
        return self._epoch

    @property
    def step(self) -> int:
        """Iterations observed over the whole run (the next iteration's ``step``)."""
        return self._step

    @property
    def iteration(self) -> int:
        """Iterations observed in the current epoch."""
        return self._iteration

    @property
    def profiling(self) -> bool:
        """Whether the next iteration is one of the epoch's first ``n``."""
        return self._iteration < self.config.profile_iterations

    def excluded(self) -> frozenset[int]:
        """Workers an engine may leave out of the next iteration."""
        return frozenset() if self.profiling else frozenset(self._stragglers)

    def state_dict(self) -> dict[str, Any]:
        """A copy of the detector's whole state (picklable), for :meth:`load_state_dict` on another worker.

        A worker that was left out of some iterations loads a member's state
        when it is re-admitted, so every worker again reaches the same verdicts.
        """
        return copy.deepcopy({k: v for k, v in self.__dict__.items() if k not in ("config", "num_workers")})

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Replaces the state with one from :meth:`state_dict` (same ``num_workers`` and config)."""
        self.__dict__.update(copy.deepcopy(state))

    # ------------------------------------------------------------------ epochs
    def start_epoch(self, epoch: int | None = None, iterations: int | None = None) -> None:
        """Begins an epoch: profiling restarts and the limit is recomputed.

        Args:
            epoch: Epoch number. Defaults to the previous one + 1.
            iterations: Iterations the epoch will have, if known (sets the
                default limit). Defaults to the length of the previous epoch.
        """
        if self._in_epoch:
            self.end_epoch()
        self._epoch = self._epoch + 1 if epoch is None else int(epoch)
        self._iteration = 0
        self._minima = []
        self._epoch_threshold = None
        self._detections = self._recoveries = 0
        self._in_epoch = True
        self._set_limit(self.config.limit_for(iterations if iterations is not None else self._last_epoch_iterations))

    def end_epoch(self) -> EpochSummary:
        """Ends the epoch. An epoch shorter than ``n`` iterations still sets a
        threshold from the minima it has (for the next epoch's profiling).

        Returns:
            The epoch's :class:`EpochSummary`.
        """
        if not self._in_epoch:
            raise RuntimeError("end_epoch() called without start_epoch(). Call start_epoch() first.")
        if self._epoch_threshold is None and self._minima:
            self._epoch_threshold = self.config.factor * float(np.mean(self._minima))
            self._threshold = self._epoch_threshold
        self._in_epoch = False
        if self._iteration:
            self._last_epoch_iterations = self._iteration
        return EpochSummary(
            epoch=self._epoch,
            iterations=self._iteration,
            threshold=self._epoch_threshold,
            profile_minima=tuple(self._minima),
            limit=self._limit,
            counters=self.counters,
            stragglers=self.stragglers,
            detections=self._detections,
            recoveries=self._recoveries,
        )

    def _set_limit(self, limit: int) -> None:
        self._limit = limit
        np.clip(self._counters, 0, limit, out=self._counters)
        for w in self._stragglers:  # a larger limit keeps a straggler a straggler until evidence
            self._counters[w] = limit

    # ---------------------------------------------------------------- observe
    def observe(self, times: Sequence[float | None], now: float | None = None) -> IterationVerdict:
        """Feeds one iteration's compute times and returns the verdict.

        Args:
            times: Seconds per worker, index = worker id; ``None`` or ``nan``
                for a worker that did not take part (its counter is unchanged).
            now: Wall-clock time of the iteration, copied into events.

        Raises:
            ValueError: ``times`` has the wrong length or a negative value.
        """
        if not self._in_epoch:
            self.start_epoch()
        values = self._validate(times)
        n = self.config.profile_iterations
        profiling = self._iteration < n
        threshold_set = False
        if profiling:
            present = values[~np.isnan(values)]
            if present.size:
                self._minima.append(float(present.min()))
            if self._iteration == n - 1 and self._minima:
                self._epoch_threshold = self.config.factor * float(np.mean(self._minima))
                self._threshold = self._epoch_threshold
                threshold_set = True
        # Before this epoch's threshold exists, the previous one only lets counters fall:
        # stragglers can show recovery, but a system-wide slow-down is not taken for stragglers.
        early = profiling and not threshold_set
        events = self._count(values, now, allow_increase=not early) if self._threshold is not None else []
        verdict = IterationVerdict(
            epoch=self._epoch,
            iteration=self._iteration,
            step=self._step,
            profiling=profiling,
            threshold=self._threshold,
            threshold_set=threshold_set,
            counters=self.counters,
            stragglers=self.stragglers,
            excluded=frozenset() if self._iteration + 1 < n else frozenset(self._stragglers),
            events=tuple(events),
        )
        self._iteration += 1
        self._step += 1
        return verdict

    def _validate(self, times: Sequence[float | None]) -> np.ndarray:
        if len(times) != self.num_workers:
            raise ValueError(
                f"Expected one time per worker ({self.num_workers}). Received: {len(times)} times: {list(times)!r}."
            )
        values = np.array([np.nan if t is None else float(t) for t in times], dtype=np.float64)
        if np.any(values < 0) or np.any(np.isinf(values)):
            raise ValueError(f"Compute times must be finite and >= 0 seconds. Received: times={list(times)!r}.")
        return values

    def _count(self, values: np.ndarray, now: float | None, allow_increase: bool = True) -> list[StragglerEvent]:
        threshold, limit = self._threshold, self._limit
        events = []
        for worker, t in enumerate(values):
            if np.isnan(t):
                continue
            c = int(self._counters[worker])
            if t > threshold:
                if allow_increase:
                    c = min(c + 1, limit)
            elif t < threshold and c > 0:
                c -= 1
            self._counters[worker] = c
            kind = None
            if worker not in self._stragglers and c >= limit:
                self._stragglers.add(worker)
                kind = EventKind.DETECTED
                self._detections += 1
            elif worker in self._stragglers and c < limit:
                self._stragglers.discard(worker)
                kind = EventKind.RECOVERED
                self._recoveries += 1
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
                        value=float(t),
                        threshold=float(threshold),
                        counter=c,
                        limit=limit,
                    )
                )
        return events
