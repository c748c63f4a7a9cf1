"""Pure straggler detectors: dynamic threshold + bounded counter, and EWMA vs median.

No Keras, no TensorFlow, no I/O: the detectors take numbers and return typed
verdicts; :mod:`tfdist.callbacks` measures and exchanges the numbers and acts.

* :class:`DynamicThresholdDetector` — threshold = k x mean fastest time over
  the first n iterations of each epoch; a per-worker counter bounded to
  [0, limit] (seed paper 000, Algorithm 1).
* :class:`EwmaDetector` — EWMA of throughput / median throughput below 0.8
  (Or et al., MLSys 2020; seed 002).
* :func:`plan_members` / :class:`Participation` — who takes part in each
  iteration when stragglers are left out (partial all-reduce), and
  :class:`ParticipationEngine`, what an engine offers the callback.
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
from tfdist.straggler.membership import Participation, ParticipationEngine, plan_members, plan_participation
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
    "Participation",
    "ParticipationEngine",
    "StragglerEvent",
    "StragglerHistory",
    "StragglerListener",
    "default_limit",
    "plan_members",
    "plan_participation",
    "throughput_ratios",
]
