"""Which job this process belongs to and which task it is: the one cluster resolver of tfdist.

The role of TF's ``ClusterResolver``. Every entry point — the strategies,
:func:`tfdist.collective.init_worker_group`, the straggler detector,
``python -m tfdist.ps``, :meth:`tfdist.data.SharedQueue.from_cluster` —
asks :func:`resolve_cluster` and applies one precedence rule (STYLE habit 5,
explicit arguments win over the environment):

* **cluster**: the ``cluster`` argument, else ``TF_CONFIG``'s, else the
  config's (the ``config`` argument or ``TFDIST_CONFIG``). ``TF_CONFIG``
  wins over a config file's cluster because the local launcher gives tasks
  free ports the file does not know.
* **task**: the ``task`` argument, else ``TF_CONFIG``'s.
* **options** (everything but the cluster): the ``config`` argument, else
  ``TFDIST_CONFIG``, else the defaults.

No task found means **no cluster**: the process runs alone (a single-process
strategy, no worker group). Callers decide what that means for them; with
``required=True`` it is an error that says how to start a job.

Example:

>>> r = resolve_cluster({"worker": ["h1:2222", "h2:2222"], "ps": ["h3:2222"]}, "worker:1", env={})
>>> r.task, r.worker_id, r.num_workers, r.source
(TaskSpec(job='worker', index=1), 1, 2, 'arguments')
>>> resolve_cluster(env={}).task is None
True
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Mapping

from tfdist import constants
from tfdist.config import ClusterConfig, JobConfig, TaskSpec, load_config, parse_task
from tfdist.errors import ConfigError

__all__ = ["ResolvedCluster", "resolve_cluster", "resolve_task"]

#: Where the cluster came from.
SOURCES = ("arguments", "tf_config", "config", "none")


@dataclass(frozen=True)
class ResolvedCluster:
    """What :func:`resolve_cluster` found.

    Attributes:
        config: The job config (its ``cluster`` is the resolved one).
        task: This process's task; ``None`` when there is no cluster (one process).
        source: Where the cluster came from: ``"arguments"``, ``"tf_config"``,
            ``"config"`` (the ``config`` argument or ``TFDIST_CONFIG``) or ``"none"``.
    """

    config: JobConfig
    task: TaskSpec | None
    source: str = "none"

    @property
    def worker_id(self) -> int | None:
        """This task's training worker id (the chief is 0); ``None`` for ps/evaluator/input tasks or no cluster."""
        if self.task is None or self.task.job not in ("chief", "worker"):
            return None
        return self.config.cluster.worker_id(self.task.job, self.task.index)

    @property
    def num_workers(self) -> int:
        """Training tasks of the job (chief and workers); 1 without a cluster."""
        return self.config.cluster.num_workers if self.task is not None else 1

    @property
    def is_single_process(self) -> bool:
        """Whether no cluster was found (the process runs alone)."""
        return self.task is None


def resolve_task(task: str | TaskSpec | None) -> TaskSpec | None:
    """``"worker:1"`` or a :class:`TaskSpec` as a :class:`TaskSpec` (``None`` stays ``None``)."""
    if task is None or isinstance(task, TaskSpec):
        return task
    if isinstance(task, str):
        return parse_task(task)
    raise ConfigError(f"`task` must be 'job:index' (e.g. 'worker:1') or a TaskSpec. Received: task={task!r}.")


def _config_argument(config: JobConfig | Mapping | str | os.PathLike | None, env: Mapping[str, str]) -> JobConfig | None:
    if isinstance(config, (str, os.PathLike)):
        return load_config(config)
    if isinstance(config, Mapping):
        return JobConfig.from_dict(config)
    if config is None and env.get(constants.ENV_CONFIG):
        return JobConfig.from_json(env[constants.ENV_CONFIG])
    return config


def resolve_cluster(
    cluster: Any = None,
    task: str | TaskSpec | None = None,
    config: JobConfig | Mapping | str | os.PathLike | None = None,
    *,
    required: bool = False,
    env: Mapping[str, str] | None = None,
) -> ResolvedCluster:
    """Resolves this process's job config and task (see the module docstring for the precedence).

    Args:
        cluster: ``{job: [host:port, ...]}``, a ``tf.train.ClusterSpec`` or a
            :class:`~tfdist.config.ClusterConfig`. Defaults to ``TF_CONFIG``'s.
        task: This task, ``"worker:1"`` or a :class:`~tfdist.config.TaskSpec`.
            Defaults to ``TF_CONFIG``'s.
        config: A :class:`~tfdist.config.JobConfig`, a mapping or a YAML path.
            Defaults to ``TFDIST_CONFIG``, else the defaults.
        required: Raise when no cluster is found instead of resolving to a
            single process. Defaults to ``False``.
        env: The environment to read. Defaults to ``os.environ``.

    Returns:
        A :class:`ResolvedCluster`; its ``task`` is ``None`` when there is no cluster.

    Raises:
        ConfigError: a cluster was given without a task, ``TF_CONFIG`` or the
            config is invalid, or ``required`` and no cluster was found.
    """
    env = os.environ if env is None else env
    config = _config_argument(config, env)
    task = resolve_task(task)
    if cluster is not None:
        if task is None:
            raise ConfigError(
                "A cluster was given without the task this process runs. Pass task='worker:0' "
                "(or 'chief:0', 'ps:0', ...)."
            )
        config = config or JobConfig()
        config.cluster = cluster if isinstance(cluster, ClusterConfig) else ClusterConfig.from_cluster_spec(cluster)
        return ResolvedCluster(config, task, "arguments")
    tf_config = env.get(constants.ENV_TF_CONFIG)
    if tf_config:
        from_env, env_task = JobConfig.from_tf_config(tf_config, base=config)
        return ResolvedCluster(from_env, task or env_task, "tf_config")
    if config is not None and task is not None:
        return ResolvedCluster(config, task, "config")
    if required:
        raise ConfigError(
            f"No cluster: {constants.ENV_TF_CONFIG} is not set and no config with a task was given. Set "
            f"{constants.ENV_TF_CONFIG} (Kubeflow TFJob format), pass --config and --task, or start the job with "
            "`python -m tfdist.launch --config FILE script.py`."
        )
    return ResolvedCluster(config or JobConfig(), None, "none")
