"""Parameter servers: store, gRPC server and client, placement, wire format.

Nothing in this package imports TensorFlow, so a PS task starts fast and small.
"""

from tfdist.ps.client import PSClient
from tfdist.ps.placement import (
    GreedyPlacement,
    PlacementPlan,
    RoundRobinPlacement,
    Shard,
    VariableSpec,
    make_placement,
)
from tfdist.ps.server import PSServer
from tfdist.ps.session import WorkerSession
from tfdist.ps.store import ParameterStore

__all__ = [
    "GreedyPlacement",
    "ParameterStore",
    "PlacementPlan",
    "PSClient",
    "PSServer",
    "RoundRobinPlacement",
    "Shard",
    "VariableSpec",
    "WorkerSession",
    "make_placement",
]
