"""``tfdist.ParameterServerStrategy``: between-graph parameter-server training for Keras 3.

Every worker process runs the user's unchanged script and is its own client
and its own replica. Model variables (weights and non-trainable state such as
BatchNorm moving statistics) live on the parameter servers, placed
round-robin (or greedily) in creation order; every worker keeps a local copy
(its cache) and trains on it with the ordinary Keras optimizer. At the end of
every training step the worker pushes its *update* (the change its optimizer
and layers made since the last sync, an additive delta) and pulls fresh
values in the same round trip — asynchronous (ASP) training as in TF1's
between-graph replication. Optimizer slots, metrics and counters stay local.

Evaluate and predict steps pull fresh values before every step and push
nothing. ``num_replicas_in_sync`` is 1: each worker's update is computed on
its own batch at the optimizer's full learning rate (TF1 async semantics).
"""

from __future__ import annotations

import atexit
import logging
import os
import secrets
import sys
import threading
from typing import Any, Callable, Mapping

import numpy as np
import tensorflow as tf

from tfdist import constants
from tfdist.config import ClusterConfig, JobConfig, TaskSpec, load_config, parse_task
from tfdist.errors import ClusterError, ConfigError
from tfdist.ps.client import PSClient
from tfdist.ps.placement import PlacementPlan, VariableSpec, make_placement
from tfdist.ps.session import WorkerSession
from tfdist.strategies._tf_compat import OneDeviceExtended, StrategyBase

__all__ = ["ParameterServerStrategy"]

logger = logging.getLogger(__name__)

_PS_AGGREGATIONS = (tf.VariableAggregation.NONE, tf.VariableAggregation.MEAN)


def default_variable_filter(name: str, kwargs: Mapping[str, Any]) -> bool:
    """True for variables that belong on the parameter servers.

    Model weights and non-trainable layer state (BatchNorm moving statistics)
    go to the PS. Optimizer slots (created with ``colocate_with``), optimizer
    counters and learning rates (``ONLY_FIRST_REPLICA``), metric accumulators
    (``SUM``), random-seed state and integer variables stay local.
    """
    if kwargs.get("colocate_with") is not None:
        return False
    aggregation = kwargs.get("aggregation", tf.VariableAggregation.NONE)
    if aggregation not in _PS_AGGREGATIONS:
        return False
    if "seed_generator" in name:
        return False
    return True


class _Runtime:
    """Per-process state shared by the strategy and its extended object."""

    def __init__(self, config: JobConfig, task: TaskSpec, token: str | None, variable_filter):
        self.config = config
        self.task = task
        self.token = token
        self.variable_filter = variable_filter
        self.worker_id = config.cluster.worker_id(task.job, task.index) if task.job in ("chief", "worker") else -1
        self.is_chief = self.worker_id == 0
        self.variables: list[tf.Variable] = []
        self.specs: list[VariableSpec] = []
        self.session: WorkerSession | None = None
        self.plan: PlacementPlan | None = None
        self.late_variables: list[str] = []
        self._lock = threading.Lock()
        self._closed = False

    # -------------------------------------------------------------- variables
    def register(self, var: tf.Variable) -> None:
        name = var.name.split(":")[0]
        if not var.dtype.is_floating:
            return
        if self.session is not None:
            self.late_variables.append(name)
            logger.warning(
                "variable %r was created after the parameter servers were initialised; it stays local "
                "to this worker (create every model variable before the first fit/evaluate/predict step)",
                name,
            )
            return
        key = f"{len(self.variables):04d}/{name}"
        self.variables.append(var)
        self.specs.append(VariableSpec(key, var.dtype.as_numpy_dtype.__name__ if var.dtype != tf.bfloat16 else "bfloat16", tuple(var.shape.as_list())))

    def make_plan(self) -> PlacementPlan:
        placement = make_placement(self.config.ps.placement, self.config.ps.partition_threshold_bytes)
        return placement.place(self.specs, len(self.config.cluster.ps))

    # ------------------------------------------------------------ protocol
    def ensure_session(self) -> WorkerSession:
        with self._lock:
            if self.session is not None:
                return self.session
            self.plan = self.make_plan()
            logger.info(
                "worker %d: %d variables on %d PS task(s), placement=%s:\n%s",
                self.worker_id,
                len(self.specs),
                self.plan.num_ps,
                self.config.ps.placement,
                self.plan.describe(self.specs),
            )
            client = PSClient(
                self.config.cluster.ps,
                self.token,
                rpc_timeout_s=self.config.ps.rpc_timeout_s,
                max_message_bytes=self.config.ps.max_message_bytes,
                tls_ca=self.config.security.tls_ca,
            )
            session = WorkerSession(
                client,
                self.specs,
                self.plan,
                self.worker_id,
                self.is_chief,
                startup_timeout_s=self.config.ps.startup_timeout_s,
                heartbeat_interval_s=self.config.ps.heartbeat_interval_s if self.worker_id >= 0 else None,
            )
            local = {s.key: v.numpy() for s, v in zip(self.specs, self.variables)} if self.is_chief else {}
            values = session.initialize(local)
            if values is not None:
                self.assign(values)
            self.session = session
            return session

    def assign(self, values: Mapping[str, np.ndarray]) -> None:
        for spec, var in zip(self.specs, self.variables):
            var.assign(values[spec.key])

    def begin_step(self, training: bool) -> None:
        session = self.ensure_session()
        if not training:
            self.assign(session.pull())

    def end_train_step(self, current: list[np.ndarray]) -> list[np.ndarray]:
        if self.worker_id < 0:
            raise ClusterError(f"Task {self.task} is not a training task: it may evaluate and predict, not fit.")
        values = self.session.sync({s.key: v for s, v in zip(self.specs, current)})
        return [values[s.key] for s in self.specs]

    def close(self, done: bool = True) -> None:
        if self._closed:
            return
        self._closed = True
        if self.session is not None:
            self.session.close(done=done and self.worker_id >= 0)


class ParameterServerExtended(OneDeviceExtended):
    """Hooks that route variables and steps through the parameter servers."""

    def __init__(self, container_strategy, runtime: _Runtime, device: str = "/cpu:0"):
        super().__init__(container_strategy, device)
        self._runtime = runtime
        self._tracing_training_step = False

    def _create_variable(self, next_creator, **kwargs):
        name = kwargs.get("name") or ""
        on_ps = self._runtime.variable_filter(str(name), kwargs)
        var = super()._create_variable(next_creator, **kwargs)
        if on_ps:
            self._runtime.register(var)
        return var

    def _batch_reduce_to(self, reduce_op, value_destination_pairs, options):
        self._tracing_training_step = True
        return super()._batch_reduce_to(reduce_op, value_destination_pairs, options)

    def _update(self, var, fn, args, kwargs, group):
        self._tracing_training_step = True
        return super()._update(var, fn, args, kwargs, group)

    def _call_for_each_replica(self, fn, args, kwargs):
        runtime = self._runtime
        trace = {"training": False}

        def begin():
            runtime.begin_step(trace["training"])
            return np.int64(0)

        began = tf.py_function(begin, [], tf.int64, name="tfdist_begin_step")
        self._tracing_training_step = False
        with tf.control_dependencies([began]):
            result = super()._call_for_each_replica(fn, args, kwargs)
        trace["training"] = self._tracing_training_step
        if trace["training"] and runtime.variables:
            current = [v.read_value() for v in runtime.variables]

            def end(*tensors):
                return runtime.end_train_step([t.numpy() for t in tensors])

            fresh = tf.py_function(end, current, [v.dtype for v in runtime.variables], name="tfdist_sync")
            for var, value in zip(runtime.variables, fresh):
                var.assign(tf.ensure_shape(value, var.shape))
        return result


def _resolve(
    cluster, task, config
) -> tuple[JobConfig, TaskSpec | None]:
    """Explicit arguments first, then TF_CONFIG / TFDIST_CONFIG, else no cluster."""
    if isinstance(config, (str, os.PathLike)):
        config = load_config(config)
    elif isinstance(config, Mapping):
        config = JobConfig.from_dict(config)
    env_config = os.environ.get(constants.ENV_CONFIG)
    if config is None and env_config:
        config = JobConfig.from_json(env_config)
    if isinstance(task, str):
        task = parse_task(task)
    if cluster is not None:
        config = config or JobConfig()
        if isinstance(cluster, ClusterConfig):
            config.cluster = cluster
        else:
            config.cluster = ClusterConfig.from_cluster_spec(cluster)
        if task is None:
            raise ConfigError(
                "A cluster was given without the task this process runs. Pass task='worker:0' "
                "(or 'chief:0', 'ps:0', ...) to ParameterServerStrategy."
            )
        return config, task
    if os.environ.get(constants.ENV_TF_CONFIG):
        tf_config_cfg, tf_task = JobConfig.from_tf_config()
        base = config or tf_config_cfg
        base.cluster = tf_config_cfg.cluster
        return base, task or tf_task
    if config is not None and task is not None:
        return config, task
    return config or JobConfig(), None


class ParameterServerStrategy(StrategyBase):
    """Between-graph parameter-server training for Keras 3 ``fit``.

    Example:

    ```python
    strategy = tfdist.ParameterServerStrategy()   # cluster from tfdist.launch / TF_CONFIG
    with strategy.scope():
        model = make_model()
        model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    model.fit(train_ds, validation_data=val_ds, epochs=5)
    ```

    Start the same script on every task with
    ``python -m tfdist.launch --config configs/local_async.yaml script.py``.
    Run without any cluster, the strategy starts an in-process parameter
    server and trains as a single worker (handy in a notebook).

    On a ``ps`` task the constructor serves parameters until the job ends
    and then exits the process, so one script fits every task.

    Args:
        cluster: A :class:`tfdist.ClusterConfig`, ``tf.train.ClusterSpec`` or
            mapping of job → addresses. Defaults to ``TF_CONFIG``.
        task: This process's task, ``"worker:1"`` or a ``TaskSpec``.
            Defaults to ``TF_CONFIG``'s task.
        config: A :class:`tfdist.JobConfig`, a mapping, or a YAML path.
            Defaults to ``TFDIST_CONFIG`` (set by the launcher), else defaults.
        consistency: Overrides ``strategy.consistency``. Only ``"async"`` so far.
        placement: Overrides ``ps.placement`` (``"round_robin"``/``"greedy"``).
        partition_threshold_bytes: Overrides ``ps.partition_threshold_bytes``.
        token: The job token. Defaults to ``security.token`` or the
            environment variable ``security.token_env``.
        variable_filter: ``f(name, creation_kwargs) -> bool`` choosing the
            variables kept on the PS. Defaults to
            :func:`default_variable_filter`.
    """

    def __init__(
        self,
        cluster=None,
        *,
        task: str | TaskSpec | None = None,
        config: JobConfig | Mapping | str | None = None,
        consistency: str | None = None,
        placement: str | None = None,
        partition_threshold_bytes: int | None = None,
        token: str | None = None,
        variable_filter: Callable[[str, Mapping[str, Any]], bool] | None = None,
    ):
        config, task = _resolve(cluster, task, config)
        if consistency is not None:
            config.strategy = type(config.strategy)(consistency=consistency)
        if placement is not None:
            config.ps.placement = placement
        if partition_threshold_bytes is not None:
            config.ps.partition_threshold_bytes = partition_threshold_bytes
        config.ps.__post_init__()
        self._local_server = None
        if task is None:
            task, token = self._start_in_process_ps(config)
        token = token or config.security.resolve_token()
        if task.job == "ps":
            self._serve_and_exit(config, task)
        if token is None:
            raise ConfigError(
                f"No job token: set the environment variable {config.security.token_env} to the same "
                "value on every task (tfdist.launch does this for local jobs), or pass token=..."
            )
        self._runtime = _Runtime(config, task, token, variable_filter or default_variable_filter)
        super().__init__(ParameterServerExtended(self, self._runtime))
        atexit.register(self.shutdown)
        logger.info(
            "ParameterServerStrategy: task=%s worker_id=%d workers=%d ps=%s consistency=%s placement=%s",
            task,
            self._runtime.worker_id,
            config.cluster.num_workers,
            config.cluster.ps,
            config.strategy.consistency,
            config.ps.placement,
        )

    # ------------------------------------------------------------- set-up
    def _start_in_process_ps(self, config: JobConfig) -> tuple[TaskSpec, str]:
        from tfdist.consistency import make_policy
        from tfdist.ps.server import PSServer

        token = secrets.token_hex(16)
        self._local_server = PSServer(make_policy(config.strategy.consistency), token=token, num_workers=1).start()
        config.cluster = ClusterConfig(worker=[UNUSED_WORKER_ADDRESS], ps=[self._local_server.address])
        logger.info("no cluster given: training as one worker with an in-process parameter server at %s",
                    self._local_server.address)
        return TaskSpec("worker", 0), token

    @staticmethod
    def _serve_and_exit(config: JobConfig, task: TaskSpec) -> None:
        from tfdist.ps.__main__ import serve

        logger.info("task %s is a parameter server: serving until the job ends", task)
        sys.exit(serve(config, task))

    # ----------------------------------------------------------- public API
    @property
    def worker_id(self) -> int:
        """This worker's id (the chief is 0); -1 on an evaluator."""
        return self._runtime.worker_id

    @property
    def is_chief(self) -> bool:
        """True on the task that initialises the PS and should save models."""
        return self._runtime.is_chief

    @property
    def num_workers(self) -> int:
        return self._runtime.config.cluster.num_workers

    @property
    def config(self) -> JobConfig:
        return self._runtime.config

    @property
    def task(self) -> TaskSpec:
        return self._runtime.task

    def placement(self) -> PlacementPlan:
        """The variable → PS task map (same on every worker of a job)."""
        return self._runtime.plan or self._runtime.make_plan()

    def placement_table(self) -> list[tuple[str, int, tuple[int, int] | None]]:
        """``[(variable key, PS task, rows or None), ...]`` in creation order."""
        return self.placement().as_table()

    def pull(self) -> None:
        """Loads the freshest PS values into this worker's variables now."""
        self._runtime.begin_step(training=False)

    def ps_status(self) -> list[dict]:
        """Status of every PS task (version, live workers, counters, policy)."""
        return self._runtime.ensure_session().status()

    @property
    def sync_stats(self) -> dict:
        """This worker's exchange counters (syncs, pulls, bytes, seconds)."""
        return dict(self._runtime.session.stats) if self._runtime.session else {}

    def shutdown(self) -> None:
        """Tells the PS this worker is done and closes connections (idempotent).

        Called automatically at interpreter exit.
        """
        # An in-process PS needs no "done" message (and may already be gone).
        self._runtime.close(done=self._local_server is None)
        if self._local_server is not None:
            self._local_server.stop(0)
            self._local_server = None


#: Placeholder address of the single worker in in-process mode (never dialled).
UNUSED_WORKER_ADDRESS = "127.0.0.1:1"
