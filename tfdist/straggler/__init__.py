"""Straggler detection without a framework: detectors, the exchange and participation protocol, records.

No Keras, no TensorFlow: the detectors take numbers and return typed
verdicts; :class:`StragglerMonitor` exchanges the numbers over a worker group,
records verdicts (history, a JSON-lines file) and drives the strategy's
:class:`StragglerEngine`; :mod:`tfdist.callbacks` is the thin Keras shell.

* :class:`DynamicThresholdDetector` — threshold = k x mean fastest time over
  the first n iterations of each epoch; a per-worker counter bounded to
  [0, limit] (seed paper 000, Algorithm 1).
* :class:`EwmaDetector` — EWMA of throughput / median throughput below 0.8
  (Or et al., MLSys 2020; seed 002).
* :func:`plan_members` / :class:`Participation` — who takes part in each
  iteration when stragglers are left out (partial all-reduce);
  :func:`agree_participation`, the re-admission protocol.
* :class:`StragglerEngine` (also ``ParticipationEngine``) — what every
  strategy offers the callback to act on verdicts; :func:`reporter`, the one
  worker that reports them to the parameter servers.
* :func:`pack_times` / :func:`unpack_times` — the exchanged payload;
  :class:`JsonLinesLog` — the verdict file.
"""

from tfdist.straggler.dynamic_threshold import (
    DEFAULT_LIMIT_FRACTION,
    DEFAULT_LIMIT_UNKNOWN_EPOCH,
    DEFAULT_MIN_LIMIT,
    DynamicThresholdConfig,
    DynamicThresholdDetector,
    default_limit,
)
from tfdist.straggler.events import EventDispatcher, StragglerListener
from tfdist.straggler.ewma import EwmaConfig, EwmaDetector, throughput_ratios
from tfdist.straggler.history import ExchangeFailure, StragglerHistory
from tfdist.straggler.exchange import LocalTimingGroup, TimingsOutOfStep, pack_times, unpack_times
from tfdist.straggler.membership import (
    Participation,
    ParticipationEngine,
    StragglerEngine,
    flagged_after,
    plan_members,
    plan_participation,
    reporter,
)
from tfdist.straggler.monitor import StragglerMonitor
from tfdist.straggler.readmission import agree_participation
from tfdist.straggler.verdict_log import JsonLinesLog
from tfdist.straggler.verdicts import (
    DetectorName,
    EpochSummary,
    EventKind,
    EwmaVerdict,
    IterationVerdict,
    StragglerEvent,
)

__all__ = [
    "DEFAULT_LIMIT_FRACTION",
    "DEFAULT_LIMIT_UNKNOWN_EPOCH",
    "DEFAULT_MIN_LIMIT",
    "DetectorName",
    "DynamicThresholdConfig",
    "DynamicThresholdDetector",
    "EpochSummary",
    "EventDispatcher",
    "EventKind",
    "EwmaConfig",
    "EwmaDetector",
    "EwmaVerdict",
    "ExchangeFailure",
    "IterationVerdict",
    "JsonLinesLog",
    "LocalTimingGroup",
    "Participation",
    "ParticipationEngine",
    "StragglerEngine",
    "StragglerEvent",
    "StragglerHistory",
    "StragglerListener",
    "StragglerMonitor",
    "TimingsOutOfStep",
    "agree_participation",
    "default_limit",
    "flagged_after",
    "pack_times",
    "plan_members",
    "plan_participation",
    "reporter",
    "throughput_ratios",
    "unpack_times",
]
