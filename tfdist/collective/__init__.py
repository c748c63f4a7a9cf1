"""TF collective ops between a job's training processes (no MultiWorkerMirroredStrategy needed).

Call :func:`init_worker_group` first thing in the training script; the
straggler callback and collective strategies then exchange small tensors
(gather, all-reduce-min) across the workers, every call with a timeout.
"""

from tfdist.collective.errors import (
    CollectiveError,
    CollectivePeerError,
    CollectiveSetupError,
    CollectiveTimeoutError,
)
from tfdist.collective.group import (
    DEFAULT_TIMEOUT_S,
    PURPOSE_EXCHANGE,
    PURPOSE_GRADIENTS,
    PURPOSE_REDUCE,
    WorkerGroup,
    get_worker_group,
    init_worker_group,
    subgroup_key,
)
from tfdist.collective.membership import ENV_COLLECTIVE_ADDRESSES, GroupMember, GroupSpec, resolve_group

__all__ = [
    "CollectiveError",
    "CollectivePeerError",
    "CollectiveSetupError",
    "CollectiveTimeoutError",
    "DEFAULT_TIMEOUT_S",
    "ENV_COLLECTIVE_ADDRESSES",
    "GroupMember",
    "GroupSpec",
    "PURPOSE_EXCHANGE",
    "PURPOSE_GRADIENTS",
    "PURPOSE_REDUCE",
    "WorkerGroup",
    "get_worker_group",
    "init_worker_group",
    "resolve_group",
    "subgroup_key",
]
