"""The runtime of a job's exchange path, chosen once from the mode's descriptor.

Each :class:`~tfdist.consistency.modes.ExchangePath` has one worker runtime:
the update path :class:`~tfdist.strategies._update_path.UpdatePathRuntime`,
the gradient path :class:`~tfdist.strategies._gradient_path.GradientPathRuntime`.
"""

from __future__ import annotations

from typing import Mapping

from tfdist.config import JobConfig, TaskSpec
from tfdist.consistency import policy_from_spec
from tfdist.strategies._gradient_path import GradientPathRuntime
from tfdist.strategies._ps_runtime import PSRuntime
from tfdist.strategies._update_path import UpdatePathRuntime

__all__ = ["make_runtime", "RUNTIMES"]

#: The worker runtime of each exchange path, by the path's name.
RUNTIMES: dict[str, type[PSRuntime]] = {"update": UpdatePathRuntime, "gradient": GradientPathRuntime}


def make_runtime(config: JobConfig, task: TaskSpec, token: str | None, variable_filter, policy_spec: Mapping,
                 single_process: bool = False) -> PSRuntime:
    """The runtime of the policy's exchange path (chosen once, for the life of the strategy).

    ``single_process``: one worker with an in-process PS (no cluster); it
    matters to the update path's schedule only.
    """
    policy = policy_from_spec(policy_spec, config.starting_workers)
    return RUNTIMES[policy.exchange.name](config, task, token, variable_filter, policy, single_process=single_process)
