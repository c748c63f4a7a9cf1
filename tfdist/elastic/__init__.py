"""Elastic training: the autoscaling policy and the straggler-replacement planner (``tfdist.elastic``).

Pure decision logic, no I/O, no TensorFlow (STYLE habit 2: policies decide,
engines act):

* :class:`ScalingPolicy` — add ``K`` workers while the last step's scaling
  efficiency (and, with a :class:`Utility`, marginal utility vs marginal
  cost) says it pays; fall back to the best size seen and settle (Or et al.,
  MLSys 2020).
* :class:`ReplacementPlanner` — replace persistent stragglers (EWMA of
  throughput ÷ median < 0.8) by spares, removing a straggler only after its
  spare has joined, with a cap on pending spares.
"""

from tfdist.elastic.policy import (
    Action,
    DeadlineUtility,
    LinearUtility,
    ScalingConfig,
    ScalingDecision,
    ScalingPolicy,
    SizeStats,
    Utility,
    scaling_efficiency,
    utility_from_dict,
)
from tfdist.elastic.replacement import KEEP_SPARE, REMOVE, START_SPARE, ReplacementAction, ReplacementPlanner

__all__ = [
    # scaling policy
    "Action",
    "ScalingConfig",
    "ScalingDecision",
    "ScalingPolicy",
    "SizeStats",
    "scaling_efficiency",
    # utilities of completion time
    "Utility",
    "LinearUtility",
    "DeadlineUtility",
    "utility_from_dict",
    # straggler replacement
    "ReplacementAction",
    "ReplacementPlanner",
    "START_SPARE",
    "REMOVE",
    "KEEP_SPARE",
]
