"""Elastic training (``tfdist.elastic``): workers join and leave a running job; an engine scales it.

Policies are pure decision logic, no I/O, no TensorFlow (STYLE habit 2:
policies decide, engines act); the engine does the I/O. Nothing here imports
TensorFlow.

* :class:`ScalingPolicy` — add ``K`` workers while the last step's scaling
  efficiency (and, with a :class:`Utility`, marginal utility vs marginal
  cost) says it pays; fall back to the best size seen and settle (Or et al.,
  MLSys 2020).
* :class:`ElasticEngine` — measures the job on the parameter servers, asks
  the policies and acts through an :class:`Actuator` (local processes, or a
  dry run; Kubernetes/Ray actuators implement the same four methods).
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
from tfdist.elastic.actuators import Actuator, DryRunActuator, LocalActuator
from tfdist.elastic.engine import ElasticEngine, EngineResult, PSControl
from tfdist.elastic.local import run_local_elastic

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
    # engine and actuators
    "ElasticEngine",
    "EngineResult",
    "PSControl",
    "Actuator",
    "LocalActuator",
    "DryRunActuator",
    "run_local_elastic",
]
