"""Typed verdicts of the straggler detectors: events, per-iteration and per-epoch results.

Detectors return these objects and do nothing else; a Keras callback, a
strategy or a benchmark acts on them (STYLE habit 2: policies decide,
engines act). Every object converts to a JSON-ready ``dict`` with
:meth:`to_dict`.
"""

from __future__ import annotations

import dataclasses
import enum
import math
from dataclasses import dataclass
from typing import Any

__all__ = ["json_ready", "EventKind", "DetectorName", "StragglerEvent", "IterationVerdict", "EwmaVerdict", "EpochSummary"]


def json_ready(value: Any) -> Any:
    """A JSON-friendly copy of ``value``: NaN/inf become ``None``, enums their value, sets sorted lists."""
    return _clean(value)


class EventKind(str, enum.Enum):
    """What happened to a worker."""

    #: The worker became a straggler (counter reached ``limit``, or EWMA fell below the threshold).
    DETECTED = "detected"
    #: A straggler is normal again (counter fell below ``limit``, or EWMA rose to the threshold).
    RECOVERED = "recovered"


class DetectorName(str, enum.Enum):
    """Which rule produced an event."""

    #: Dynamic threshold + bounded counter (Algorithm 1 of the seed paper).
    DYNAMIC_THRESHOLD = "dynamic_threshold"
    #: EWMA of throughput / median throughput (persistent stragglers).
    EWMA = "ewma"


def _clean(value: Any) -> Any:
    """JSON-friendly copy: NaN/inf become ``None``, enums their value, sets sorted lists."""
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, (frozenset, set)):
        return sorted(value)
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    return value


@dataclass(frozen=True)
class StragglerEvent:
    """One change of a worker's state, as decided by a detector.

    Attributes:
        kind: :class:`EventKind` (detected or recovered).
        worker: Worker id (chief = 0 when the cluster has a chief).
        detector: :class:`DetectorName` of the rule that decided.
        epoch: Epoch (0-based) of the deciding iteration.
        iteration: Iteration within the epoch (0-based) of the deciding iteration.
        step: Iteration counted over the whole training (0-based).
        time: Wall-clock time (``time.time()``) given by the caller with the
            observation, or ``None`` if none was given.
        value: What the rule compared: the worker's compute time in seconds
            (dynamic threshold) or its EWMA ratio (EWMA).
        threshold: What ``value`` was compared with: seconds (dynamic
            threshold) or the EWMA threshold.
        counter: The worker's counter after the iteration (dynamic threshold
            only).
        limit: The counter limit in force (dynamic threshold only).
    """

    kind: EventKind
    worker: int
    detector: DetectorName
    epoch: int
    iteration: int
    step: int
    time: float | None
    value: float
    threshold: float
    counter: int | None = None
    limit: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return _clean(dataclasses.asdict(self))


@dataclass(frozen=True)
class IterationVerdict:
    """What the dynamic-threshold detector concluded from one iteration.

    Attributes:
        epoch: Epoch (0-based).
        iteration: Iteration within the epoch (0-based).
        step: Iteration over the whole training (0-based).
        profiling: Whether this iteration was one of the first ``n`` of the
            epoch, whose fastest times set the epoch's threshold.
        threshold: Threshold (seconds) the times were compared with, ``None``
            while no threshold exists yet (first epoch, before iteration ``n``).
        threshold_set: Whether this iteration set a new threshold.
        counters: Every worker's counter after the iteration.
        stragglers: Workers classified as stragglers after the iteration.
        excluded: Workers an engine may leave out of the *next* iteration:
            the stragglers, except during the first ``n`` iterations of an
            epoch when everyone takes part so recovery can be seen.
        events: State changes decided at this iteration.
    """

    epoch: int
    iteration: int
    step: int
    profiling: bool
    threshold: float | None
    threshold_set: bool
    counters: tuple[int, ...]
    stragglers: frozenset[int]
    excluded: frozenset[int]
    events: tuple[StragglerEvent, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        out = _clean({f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "events"})
        out["events"] = [e.to_dict() for e in self.events]
        return out


@dataclass(frozen=True)
class EwmaVerdict:
    """What the EWMA detector concluded after one observation.

    Attributes:
        updated: Whether a window closed and the averages moved (``False``
            between window ends).
        ratios: Each worker's throughput / median throughput over the window
            just closed (``nan`` for a worker without data).
        ewma: Each worker's moving average of that ratio.
        stragglers: Persistent stragglers after the observation.
        events: State changes decided now.
    """

    updated: bool
    ratios: tuple[float, ...]
    ewma: tuple[float, ...]
    stragglers: frozenset[int]
    events: tuple[StragglerEvent, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        out = _clean({f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "events"})
        out["events"] = [e.to_dict() for e in self.events]
        return out


@dataclass(frozen=True)
class EpochSummary:
    """The dynamic-threshold detector's state at the end of an epoch.

    Attributes:
        epoch: Epoch (0-based).
        iterations: Iterations observed in the epoch.
        threshold: The epoch's threshold in seconds (``None`` if the epoch had
            no iteration).
        profile_minima: Fastest time of each profiling iteration (seconds).
        limit: Counter limit in force during the epoch.
        counters: Every worker's counter at the end of the epoch.
        stragglers: Stragglers at the end of the epoch.
        detections: Detections during the epoch.
        recoveries: Recoveries during the epoch.
    """

    epoch: int
    iterations: int
    threshold: float | None
    profile_minima: tuple[float, ...]
    limit: int
    counters: tuple[int, ...]
    stragglers: frozenset[int]
    detections: int = 0
    recoveries: int = 0

    def to_dict(self) -> dict[str, Any]:
        return _clean(dataclasses.asdict(self))


