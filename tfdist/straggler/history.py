"""What a straggler detector saw over a training run, as plain data.

:class:`StragglerHistory` is filled by the Keras callback (or any engine)
from the detectors' verdicts and converts to JSON-ready dicts.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tfdist.straggler.verdicts import EpochSummary, EventKind, StragglerEvent, _clean

__all__ = ["StragglerHistory", "ExchangeFailure"]


@dataclass(frozen=True)
class ExchangeFailure:
    """The timing exchange between workers failed (a peer died or timed out).

    Attributes:
        epoch: Epoch of the failed exchange.
        step: Iteration (over the whole run) of the failed exchange.
        time: Wall-clock time of the failure.
        error: The error's class name (e.g. ``CollectiveTimeoutError``).
        message: The error message (names the timeout setting or the peer).
        peers: Worker ids named by the error as unreachable, if any.
    """

    epoch: int
    step: int
    time: float | None
    error: str
    message: str
    peers: tuple[int, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return _clean(
            {"epoch": self.epoch, "step": self.step, "time": self.time, "error": self.error,
             "message": self.message, "peers": list(self.peers)}
        )


@dataclass
class StragglerHistory:
    """Per-epoch summaries, every event, per-iteration counters, failures.

    Attributes:
        epochs: One :class:`EpochSummary` per finished epoch (threshold,
            limit, counters, stragglers).
        events: Every :class:`StragglerEvent` (detections and recoveries of
            both detectors) with its time.
        counters: Per iteration, every worker's counter (if recorded).
        times: Per iteration, every worker's compute time in seconds (if
            recorded).
        ewma: Per EWMA window, every worker's moving average.
        failures: Exchanges that failed (see :class:`ExchangeFailure`).
        participation: Every change of the members of an iteration when an
            engine leaves stragglers out (:class:`~tfdist.straggler.Participation`).
    """

    epochs: list[EpochSummary] = field(default_factory=list)
    events: list[StragglerEvent] = field(default_factory=list)
    counters: list[tuple[int, ...]] = field(default_factory=list)
    times: list[tuple[float | None, ...]] = field(default_factory=list)
    ewma: list[tuple[float, ...]] = field(default_factory=list)
    failures: list[ExchangeFailure] = field(default_factory=list)
    participation: list[Any] = field(default_factory=list)

    def detections(self, worker: int | None = None, detector: str | None = None) -> list[StragglerEvent]:
        """Detection events, optionally of one worker and/or one detector."""
        return self._select(EventKind.DETECTED, worker, detector)

    def recoveries(self, worker: int | None = None, detector: str | None = None) -> list[StragglerEvent]:
        """Recovery events, optionally of one worker and/or one detector."""
        return self._select(EventKind.RECOVERED, worker, detector)

    def _select(self, kind, worker, detector):
        return [
            e for e in self.events
            if e.kind is kind and (worker is None or e.worker == worker)
            and (detector is None or e.detector.value == str(getattr(detector, "value", detector)))
        ]

    def to_dict(self) -> dict[str, Any]:
        return {
            "epochs": [e.to_dict() for e in self.epochs],
            "events": [e.to_dict() for e in self.events],
            "counters": [list(c) for c in self.counters],
            "times": _clean([list(t) for t in self.times]),
            "ewma": _clean([list(e) for e in self.ewma]),
            "failures": [f.to_dict() for f in self.failures],
            "participation": [p.to_dict() for p in self.participation],
        }
