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
import contextlib
import dataclasses
import logging
import os
import secrets
import sys
import threading
import time
from typing import Any, Callable, Iterator, Mapping

import numpy as np
import tensorflow as tf

from tfdist import constants
from tfdist.config import ClusterConfig, JobConfig, TaskSpec, load_config, parse_task
from tfdist.errors import ClusterError, ConfigError, PSUnavailableError
from tfdist.ps.client import PSClient
from tfdist.ps.placement import PlacementPlan, VariableSpec, make_placement
from tfdist.consistency import ConsistencyPolicy, policy_from_spec
from tfdist.data.symbolic_build import build_from_element_spec
from tfdist.ps.session import GradientSession, UpdateSession, WorkerSession
from tfdist._tf_compat import OneDeviceExtended, StrategyBase
from tfdist.testing.slowdown import ENV_SLOWDOWN, StepSlowdown, slowdown_from_env

__all__ = ["ParameterServerStrategy"]

logger = logging.getLogger(__name__)

_PS_AGGREGATIONS = (tf.VariableAggregation.NONE, tf.VariableAggregation.MEAN)
_OPTIMIZER_AGGREGATION = tf.VariableAggregation.ONLY_FIRST_REPLICA


def default_variable_filter(name: str, kwargs: Mapping[str, Any]) -> bool:
    """True for model variables, which belong on the parameter servers.

    Model weights and non-trainable layer state (BatchNorm moving statistics)
    go to the PS. Optimizer slots (created with ``colocate_with``), optimizer
    counters and learning rates (``ONLY_FIRST_REPLICA``), metric accumulators
    (``SUM``), random-seed state and integer variables are not model
    variables (on the gradient path the optimizer's variables also go to the
    PS, as part of the state snapshot; see :func:`_is_optimizer_variable`).
    """
    if kwargs.get("colocate_with") is not None:
        return False
    aggregation = kwargs.get("aggregation", tf.VariableAggregation.NONE)
    if aggregation not in _PS_AGGREGATIONS:
        return False
    if "seed_generator" in name:
        return False
    return True


def _is_optimizer_variable(name: str, kwargs: Mapping[str, Any]) -> bool:
    """Optimizer slots, step counter and learning rate (not metrics, not seeds)."""
    if "seed_generator" in name:
        return False
    return kwargs.get("colocate_with") is not None or kwargs.get("aggregation") == _OPTIMIZER_AGGREGATION


def _numpy_dtype_name(dtype: tf.DType) -> str:
    return "bfloat16" if dtype == tf.bfloat16 else np.dtype(dtype.as_numpy_dtype).name


class _Runtime:
    """Per-process state shared by the strategy and its extended object."""

    def __init__(self, config: JobConfig, task: TaskSpec, token: str | None, variable_filter, policy_spec: dict):
        self.config = config
        self.task = task
        self.token = token
        self.variable_filter = variable_filter
        self.policy_spec = policy_spec
        policy = policy_from_spec(policy_spec, config.starting_workers)
        self.path = policy.path
        self.refresh_every_step = bool(getattr(policy, "refresh_every_step", False))
        self.staleness = getattr(policy, "staleness", None)
        # Only pure ASP may overlap: SSP's read guarantee needs the reply before the next step.
        asp = self.path == "update" and self.refresh_every_step and self.staleness == float("inf")
        self.overlap = asp and config.strategy.overlap_exchange
        #: ASP: exchange after every k-th step; the steps in between stay local (``strategy.exchange_every``).
        self.exchange_every = config.strategy.exchange_every if asp else 1
        self._unsent_steps = 0
        self.num_replicas = policy.replicas_to_aggregate if self.path == "gradient" else 1
        self.worker_id = config.cluster.worker_id(task.job, task.index) if task.job in ("chief", "worker") else -1
        self.is_chief = self.worker_id == 0
        self.variables: list[tf.Variable] = []
        self.specs: list[VariableSpec] = []
        self._keys_by_var: dict[int, str] = {}
        self.session: WorkerSession | None = None
        self.plan: PlacementPlan | None = None
        self.late_variables: list[str] = []
        self._lock = threading.Lock()
        self._closed = False
        #: Seconds the current/last training step spent blocked on the PS (waits, transfers).
        self.step_wait_s = 0.0
        # Elastic join: train this many batches locally (build, trace, warm caches) before joining the job.
        # The engine sets the variable for the workers it starts; a worker started by hand (--task) into
        # an elastic job's spare slot warms up as the config says.
        default = config.elastic.warmup_batches if config.elastic.enabled and self.worker_id >= config.starting_workers else 0
        warmup = int(os.environ.get(constants.ENV_WARMUP_BATCHES, str(default)) or 0)
        self.warmup_left = warmup if self.worker_id > 0 else 0
        self.in_warmup = False
        self._warmup_started: float | None = None
        self._left = False
        #: While a side-car evaluation round runs: evaluate/predict use the round's snapshot, no pull per step.
        self.hold_values = False
        slowdown = slowdown_from_env(str(task))
        self.slowdown = StepSlowdown(slowdown) if slowdown else None
        if slowdown:
            logger.warning("task %s is slowed down on purpose (%s): %s", task, ENV_SLOWDOWN, slowdown)

    # -------------------------------------------------------------- variables
    def wants(self, name: str, kwargs: Mapping[str, Any]) -> bool:
        if self.variable_filter(name, kwargs):
            return True
        return self.path == "gradient" and _is_optimizer_variable(name, kwargs)

    def register(self, var: tf.Variable, model_variable: bool) -> None:
        name = var.name.split(":")[0]
        if model_variable and not var.dtype.is_floating:
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
        self._keys_by_var[id(var)] = key
        trainable = bool(var.trainable) and model_variable
        self.specs.append(VariableSpec(key, _numpy_dtype_name(var.dtype), tuple(var.shape.as_list()), trainable))

    def key_of(self, var) -> str | None:
        return self._keys_by_var.get(id(var))

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
                "worker %d: %d variables on %d PS task(s), placement=%s, consistency=%s:\n%s",
                self.worker_id,
                len(self.specs),
                self.plan.num_ps,
                self.config.ps.placement,
                self.policy_spec,
                self.plan.describe(self.specs),
            )
            client = PSClient(
                self.config.cluster.ps,
                self.token,
                rpc_timeout_s=self.config.ps.rpc_timeout_s,
                max_message_bytes=self.config.ps.max_message_bytes,
                tls_ca=self.config.security.tls_ca,
                tune_malloc=self.config.ps.tune_malloc,
            )
            common = dict(
                startup_timeout_s=self.config.ps.startup_timeout_s,
                heartbeat_interval_s=self.config.ps.heartbeat_interval_s if self.worker_id >= 0 else None,
                policy_spec=self.policy_spec,
                num_workers=self.config.starting_workers,
                nonfinite=self.config.ps.nonfinite,
            )
            args = (client, self.specs, self.plan, self.worker_id, self.is_chief)
            if self.path == "gradient":
                session = GradientSession(*args, **common)
            else:
                session = UpdateSession(
                    *args,
                    staleness=float("inf") if self.staleness is None else self.staleness,
                    refresh_every_step=self.refresh_every_step,
                    **common,
                )
            local = {s.key: v.numpy() for s, v in zip(self.specs, self.variables)} if self.is_chief else {}
            values = session.initialize(local)
            if values is not None:
                self.assign(values)
            self.session = session
            return session

    def assign(self, values: Mapping[str, np.ndarray]) -> None:
        """Writes fresh values into the local variables (eagerly: from a py_function or the caller's thread).

        The one way PS values reach the variables: pulls, resyncs and the
        blocking exchange assign; the overlapped exchange adds (:meth:`add`).
        """
        for spec, var in zip(self.specs, self.variables):
            var.assign(values[spec.key])

    def add(self, corrections: Mapping[str, np.ndarray]) -> None:
        """Adds ``corrections`` (variable key → array) to the local variables, eagerly."""
        for spec, var in zip(self.specs, self.variables):
            correction = corrections.get(spec.key)
            if correction is not None:
                var.assign_add(correction)

    def _require_training_task(self) -> None:
        if self.worker_id < 0:
            raise ClusterError(f"Task {self.task} is not a training task: it may evaluate and predict, not fit.")

    def begin_step(self, training: bool) -> None:
        if training and self.slowdown is not None:
            self.slowdown.at_step_start()
        self.in_warmup = False
        if training and self.warmup_left > 0 and self.session is None:
            if self._warmup_started is None:
                self._warmup_started = time.perf_counter()
                logger.info("worker %d: warming up on %d local batch(es) before joining the job",
                            self.worker_id, self.warmup_left)
            self.warmup_left -= 1
            self.in_warmup = True
            return
        if self._warmup_started is not None:
            logger.info("worker %d: warmed up in %.2f s; joining (pulling parameters from %d PS task(s))",
                        self.worker_id, time.perf_counter() - self._warmup_started, len(self.config.cluster.ps))
            self._warmup_started = None
        session = self.ensure_session()
        if training and self._left:
            self.rejoin()
        if not training or self.worker_id < 0:
            if self.hold_values:
                return
            if self.path == "update" or self.worker_id < 0:
                self.push_unsent()  # local steps not yet sent would be lost to the pull
                self.assign(session.pull(as_reader=self._left))
                return
        self.step_wait_s = 0.0
        with self._blocked():
            values = session.begin()
        if values is not None:
            self.assign(values)

    @contextlib.contextmanager
    def _blocked(self):
        """Adds the duration of the block to ``step_wait_s``."""
        start = time.perf_counter()
        try:
            yield
        finally:
            self.step_wait_s += time.perf_counter() - start

    def end_update_step(self, current: list[np.ndarray], loss: float | None) -> None:
        """Update path, blocking: pushes the step's update; fresh values (if pulled) go into the variables."""
        self._require_training_task()
        if self.in_warmup:  # not part of the job yet: keep the local update, send nothing
            return
        steps = self._steps_to_send()
        if not steps:  # exchange_every: this step stays local
            return
        with self._blocked():
            values = self.session.end({s.key: v for s, v in zip(self.specs, current)}, loss, steps=steps)
        if values is not None:
            self.assign(values)

    def end_overlapped_step(self, current: list[np.ndarray], loss: float | None) -> None:
        """ASP, overlapped: sends this step's update in the background; adds the previous one's corrections."""
        self._require_training_task()
        if self.in_warmup:  # not part of the job yet: keep the local update, send nothing
            return
        steps = self._steps_to_send()
        if not steps:  # exchange_every: this step stays local
            return
        with self._blocked():
            corrections = self.session.end_overlapped({s.key: v for s, v in zip(self.specs, current)}, loss,
                                                      steps=steps)
        if corrections:
            self.add(corrections)

    def _steps_to_send(self) -> int:
        """Counts a finished step; the number of local steps to send now, or 0 to keep this one local."""
        self._unsent_steps += 1
        if self._unsent_steps < self.exchange_every:
            return 0
        steps, self._unsent_steps = self._unsent_steps, 0
        return steps

    def push_unsent(self) -> None:
        """Sends the local steps an ``exchange_every`` > 1 has held back, and loads fresh values."""
        if not self._unsent_steps or self.session is None or self.worker_id < 0 or self._left:
            return
        steps, self._unsent_steps = self._unsent_steps, 0
        current = {s.key: v.numpy() for s, v in zip(self.specs, self.variables)}
        values = self.session.end(current, None, steps=steps)  # waits for any exchange in flight first
        if values is not None:
            self.assign(values)

    def exchange_gradients(self, keys: list[str | None], grads: list[np.ndarray]) -> list[np.ndarray]:
        self._require_training_task()
        mapped = {k: g for k, g in zip(keys, grads) if k is not None}
        if not mapped or self.in_warmup:
            return grads
        with self._blocked():
            aggregate = self.session.exchange(mapped)
        return [aggregate[k] if k is not None else g for k, g in zip(keys, grads)]

    def end_gradient_step(self, current: list[np.ndarray]) -> None:
        if self.in_warmup:
            return
        with self._blocked():
            values = self.session.end({s.key: v for s, v in zip(self.specs, current)})
        if values is not None:  # too far behind: load the job's state instead of this step's result
            self.assign(values)

    def step_stats(self) -> np.ndarray:
        """``[step, dropped, waits, staleness or -1, refreshes or resyncs]`` for Keras logs."""
        st = self.session.stats if self.session else {}
        if self.path == "gradient":
            step = self.session.global_step if self.session else 0
            return np.array([step, st.get("dropped", 0), st.get("waits", 0), 0, st.get("resyncs", 0)], np.float32)
        s = self.session.staleness if self.session else float("inf")
        return np.array([self.session.clock if self.session else 0, 0, st.get("waits", 0),
                         -1 if s == float("inf") else s, st.get("refreshes", 0)], np.float32)

    def stop_reason(self) -> str | None:
        """``"leave"`` (drained by the engine), ``"job_done"``, or ``None`` to keep training."""
        session = self.session
        if session is None:
            return None
        if session.job_done:
            return "job_done"
        if session.leave_requested:
            return "leave"
        return None

    def leave(self) -> None:
        """Stops taking part in training (graceful): barriers stop waiting for this worker; reads still work.

        The last local steps and any update in flight are sent first. Then
        the worker stops heart-beating and reads like an evaluator (no worker
        id), so no PS task counts it as live any more:

        * elastic jobs (``elastic.enabled``): the worker also says ``Done``,
          and barriers stop waiting for it at once; the PS tasks keep serving
          (the launcher or engine stops them);
        * other jobs: a PS task exits once every worker said ``Done``, so a
          worker that may still evaluate does not say it here (it does when
          its process ends, or on :meth:`close`). Barriers stop waiting for
          it when its silence reaches ``ps.heartbeat_timeout_s``.

        A later training step takes the worker back into the job (:meth:`rejoin`).
        """
        if self._left or self.session is None or self.worker_id < 0:
            return
        unsent = self._unsent_steps
        try:
            self.push_unsent()
        except Exception as e:
            logger.warning("worker %d: could not send its last %d local step(s): %s", self.worker_id, unsent, e)
        self._left = True
        try:
            flush = getattr(self.session, "flush", None)
            if flush is not None:
                flush()  # an overlapped update in flight lands before this worker stops counting
            if self.config.elastic.enabled:
                self.session.client.call_all("Done", {"worker": self.worker_id}, timeout=5.0)
        except Exception as e:  # leaving is best effort: heart-beat silence has the same effect
            logger.warning("worker %d: could not tell the PS it leaves: %s", self.worker_id, e)
        self.session.stop_heartbeat()
        if self.config.elastic.enabled:
            logger.info("worker %d left the job", self.worker_id)
        else:
            logger.info("worker %d left training; the others stop waiting for it within %g s "
                        "(ps.heartbeat_timeout_s)", self.worker_id, self.config.ps.heartbeat_timeout_s)

    def rejoin(self) -> None:
        """Takes part in training again after :meth:`leave` (a later ``fit``)."""
        if not self._left or self.session is None:
            return
        self.session.rejoin()
        self._left = False
        logger.info("worker %d takes part in training again", self.worker_id)

    def evaluation_rounds(self, interval_s: float) -> Iterator[int]:
        """Side-car evaluation: see :meth:`ParameterServerStrategy.evaluation_rounds`."""
        session = self.ensure_session()
        num_workers = self.config.starting_workers
        last = None
        while True:
            try:
                statuses = [meta for _, (meta, _) in
                            sorted(session.client.call_all("Status", {"brief": True}).items())]
            except PSUnavailableError as e:
                logger.info("task %s: the parameter servers have ended (the job is over): %s", self.task, e)
                return
            if any(len(st.get("done_workers", ())) >= num_workers for st in statuses):
                logger.info("task %s: every training worker is done", self.task)
                return
            version = tuple(st.get("version", 0) for st in statuses)
            if version != last:
                try:
                    self.assign(session.pull(as_reader=True))
                except PSUnavailableError as e:
                    logger.info("task %s: the parameter servers have ended (the job is over): %s", self.task, e)
                    return
                last = version
                self.hold_values = True
                try:
                    yield sum(version)
                finally:
                    self.hold_values = False
            time.sleep(interval_s)

    def close(self, done: bool = True) -> None:
        """Sends what is unsent, says ``Done`` (training tasks) and closes the connections (idempotent).

        Safe at interpreter exit: no call here needs a new thread.
        """
        if self._closed:
            return
        self._closed = True
        if self.session is not None:
            try:
                self.push_unsent()
            except Exception as e:  # closing goes on: the PS keeps what it has
                logger.warning("worker %d: could not send its last local step(s): %s", self.worker_id, e)
            self.session.close(done=done and self.worker_id >= 0)


#: Names of the per-step exchange counters added to Keras logs (History, TensorBoard).
STAT_NAMES = ("ps_step", "ps_dropped", "ps_waits", "ps_staleness", "ps_refreshes")


class ParameterServerExtended(OneDeviceExtended):
    """Hooks that route variables and steps through the parameter servers."""

    def __init__(self, container_strategy, runtime: _Runtime, device: str = "/cpu:0"):
        super().__init__(container_strategy, device)
        self._runtime = runtime
        self._tracing_training_step = False
        # Gradient path, while a step traces: the keys list of the pending
        # exchange and how many of its gradients _update has matched so far.
        self._pending: tuple[list, list] | None = None

    @property
    def _num_replicas_in_sync(self):
        return self._runtime.num_replicas

    def _create_variable(self, next_creator, **kwargs):
        name = str(kwargs.get("name") or "")
        model_variable = self._runtime.variable_filter(name, kwargs)
        on_ps = self._runtime.wants(name, kwargs)
        var = super()._create_variable(next_creator, **kwargs)
        if on_ps:
            self._runtime.register(var, model_variable)
        return var

    def _batch_reduce_to(self, reduce_op, value_destination_pairs, options):
        self._tracing_training_step = True
        runtime = self._runtime
        if runtime.path != "gradient":
            return super()._batch_reduce_to(reduce_op, value_destination_pairs, options)
        dense = [tf.convert_to_tensor(v) for v, _ in value_destination_pairs]  # IndexedSlices travel dense
        keys: list[str | None] = [None] * len(dense)  # filled while _update traces

        def exchange(*grads):
            return runtime.exchange_gradients(keys, [np.asarray(g) for g in grads])

        out = tf.py_function(exchange, dense, [d.dtype for d in dense], name="tfdist_exchange_gradients")
        out = [tf.ensure_shape(o, d.shape) for o, d in zip(out, dense)]
        # TF wraps all-reduce results in a custom-gradient identity, so the
        # tensors _update receives are not these: Keras applies the reduced
        # gradients in list order, which is how _update matches them.
        self._pending = (keys, [d.shape for d in dense])
        return out

    def _update(self, var, fn, args, kwargs, group):
        self._tracing_training_step = True
        if self._pending is not None and args:
            keys, shapes = self._pending
            i = next((j for j, k in enumerate(keys) if k is None), None)
            if i is not None and shapes[i].is_compatible_with(var.shape):
                keys[i] = self._runtime.key_of(var)
            elif i is not None:
                logger.warning("gradient %d (shape %s) does not match variable %s %s; it stays local",
                               i, shapes[i], var.name, var.shape)
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
        self._pending = None
        trace["training"] = self._tracing_training_step
        if not (trace["training"] and runtime.variables):
            return result
        current = [v.read_value() for v in runtime.variables]
        if runtime.path == "gradient":
            def end(*tensors):
                runtime.end_gradient_step([np.asarray(t) for t in tensors])
                return runtime.step_stats()

            stats = tf.py_function(end, current, tf.float32, name="tfdist_end_step")
        else:
            loss = result.get("loss") if isinstance(result, dict) else None
            has_loss = loss is not None
            inputs = current + [tf.cast(tf.reshape(loss, []), tf.float32) if has_loss else tf.constant(0.0)]
            if runtime.overlap:
                stats = self._overlapped_sync(inputs, has_loss)
            else:
                stats = self._blocking_sync(inputs, has_loss)
        if isinstance(result, dict):
            result = dict(result)
            stats = tf.ensure_shape(stats, [len(STAT_NAMES)])
            for i, name in enumerate(STAT_NAMES):
                result[name] = stats[i]
        return result


    def _blocking_sync(self, inputs, has_loss: bool):
        """Push (and for ASP pull) inside the step; pulled values are assigned inside the py_function."""
        runtime = self._runtime

        def end(*tensors):
            runtime.end_update_step([np.asarray(t) for t in tensors[:-1]],
                                    float(tensors[-1].numpy()) if has_loss else None)
            return runtime.step_stats()

        return tf.py_function(end, inputs, tf.float32, name="tfdist_sync")

    def _overlapped_sync(self, inputs, has_loss: bool):
        """ASP: the update leaves in the background; the previous exchange's corrections are added.

        The py_function adds the corrections to the variables itself (only
        where another worker's update arrived) and returns only the step's
        statistics: no per-variable output is converted for nothing.
        """
        runtime = self._runtime

        def end(*tensors):
            runtime.end_overlapped_step([np.asarray(t) for t in tensors[:-1]],
                                        float(tensors[-1].numpy()) if has_loss else None)
            return runtime.step_stats()

        return tf.py_function(end, inputs, tf.float32, name="tfdist_sync_overlapped")


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
        consistency: Overrides ``strategy.consistency``: a mode name
            (``"async"``, ``"bsp"``, ``"sync_replicas"``, ``"ssp"``,
            ``"dtssp"``; parameters from the config), or a policy object such
            as ``tfdist.consistency.SSP(3)``.
        placement: Overrides ``ps.placement`` (``"round_robin"``/``"greedy"``).
        partition_threshold_bytes: Overrides ``ps.partition_threshold_bytes``.
        token: The job token. Defaults to ``security.token`` or the
            environment variable ``security.token_env``.
        variable_filter: ``f(name, creation_kwargs) -> bool`` choosing the
            variables kept on the PS. Defaults to
            :func:`default_variable_filter`.
        overlap_exchange: Overrides ``strategy.overlap_exchange`` (async
            only: exchange with the PS in the background while the next step
            computes).
        exchange_every: Overrides ``strategy.exchange_every`` (async only:
            exchange with the PS after every k-th step).
    """

    def __init__(
        self,
        cluster=None,
        *,
        task: str | TaskSpec | None = None,
        config: JobConfig | Mapping | str | None = None,
        consistency: str | ConsistencyPolicy | Mapping | None = None,
        placement: str | None = None,
        partition_threshold_bytes: int | None = None,
        token: str | None = None,
        variable_filter: Callable[[str, Mapping[str, Any]], bool] | None = None,
        overlap_exchange: bool | None = None,
        exchange_every: int | None = None,
    ):
        config, task = _resolve(cluster, task, config)
        if isinstance(consistency, str):
            config.strategy = dataclasses.replace(config.strategy, consistency=consistency)
        if overlap_exchange is not None:
            config.strategy = dataclasses.replace(config.strategy, overlap_exchange=overlap_exchange)
        if exchange_every is not None:
            config.strategy = dataclasses.replace(config.strategy, exchange_every=exchange_every)
        if placement is not None:
            config.ps.placement = placement
        if partition_threshold_bytes is not None:
            config.ps.partition_threshold_bytes = partition_threshold_bytes
        config.ps.__post_init__()
        self._local_server = None
        if task is not None and not config.cluster.ps:
            raise ConfigError(
                "Invalid config field `cluster.ps`. Received: cluster.ps=[]. "
                f"{type(self).__name__} needs at least one parameter-server task, e.g. `ps: 1`."
            )
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
        if isinstance(consistency, ConsistencyPolicy):
            policy_spec = consistency.spec()
        elif isinstance(consistency, Mapping):
            policy_spec = dict(consistency)
        else:
            policy_spec = config.strategy.policy_spec(config.starting_workers)
        m = policy_spec.get("replicas_to_aggregate")
        if m is not None and m > config.starting_workers:
            raise ConfigError(
                f"replicas_to_aggregate={m} exceeds the job's {config.starting_workers} worker(s); "
                "accumulating gradients across steps is not supported. Use at most the number of workers."
            )
        policy_from_spec(policy_spec, config.starting_workers)  # validates
        self._runtime = _Runtime(config, task, token, variable_filter or default_variable_filter, policy_spec)
        super().__init__(ParameterServerExtended(self, self._runtime))
        # Keras builds from the dataset's element spec: no throwaway iterator (a SIGSEGV in TF 2.21 at times).
        build_from_element_spec(self)
        atexit.register(self._at_exit)
        logger.info(
            "%s: task=%s worker_id=%d workers=%d ps=%s consistency=%s placement=%s",
            type(self).__name__,
            task,
            self._runtime.worker_id,
            config.cluster.num_workers,
            config.cluster.ps,
            policy_spec,
            config.ps.placement,
        )

    # ------------------------------------------------------------- set-up
    def _start_in_process_ps(self, config: JobConfig) -> tuple[TaskSpec, str]:
        from tfdist.ps.server import PSServer

        token = secrets.token_hex(16)
        self._local_server = PSServer(None, token=token, num_workers=1, max_wait_s=config.ps.rpc_timeout_s).start()
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
    def is_evaluator(self) -> bool:
        """True on an ``evaluator`` task (it may evaluate and predict, not fit); see :meth:`evaluation_rounds`."""
        return self._runtime.task.job == "evaluator"

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
    def consistency(self) -> dict:
        """The consistency policy spec this worker runs (same on every worker)."""
        return dict(self._runtime.policy_spec)

    def staleness_changes(self) -> list[dict]:
        """DTSSP: every evaluation of the LPR rule on PS task 0 (window, LPR, old/new bound)."""
        return list((self.ps_status()[0].get("policy") or {}).get("changes", []))

    @property
    def sync_stats(self) -> dict:
        """This worker's exchange counters (syncs, pulls, bytes, seconds)."""
        return dict(self._runtime.session.stats) if self._runtime.session else {}

    @property
    def last_step_wait_seconds(self) -> float:
        """Seconds the last training step spent blocked on the parameter servers.

        Waiting for other workers and moving data; a straggler detector
        subtracts it from the step's wall time to get this worker's own
        compute time (in sync modes every worker waits for the slowest).
        """
        return self._runtime.step_wait_s

    def exclude_workers(self, workers) -> None:
        """Stops barriers from waiting for ``workers`` (detected stragglers) until called again.

        SyncReplicas/BSP steps complete without them (their gradients still
        count when they arrive in time) and SSP's minimum clock ignores them.
        Pass an empty set to re-admit everyone.
        """
        self._runtime.ensure_session().set_excluded(workers)

    def straggler_listener(self):
        """A listener for :class:`tfdist.callbacks.StragglerDetector` that acts on its verdicts.

        Example:

        ```python
        detector = tfdist.callbacks.StragglerDetector()
        detector.subscribe(strategy.straggler_listener())
        model.fit(ds, callbacks=[detector])
        ```
        """
        return _ExcludeStragglers(self)

    @property
    def stop_reason(self) -> str | None:
        """Why this worker should stop training, in an elastic job; ``None`` to go on.

        ``"leave"``: the autoscaling engine asked it to leave (scale-down or
        replacement); ``"job_done"``: the job's ``elastic.total_batches``
        are applied. :class:`tfdist.callbacks.ElasticCallback` acts on it.
        """
        return self._runtime.stop_reason()

    def leave(self) -> None:
        """Stops taking part in training: barriers (BSP, SyncReplicas, SSP) stop waiting for this worker.

        Call it when this worker's ``fit`` is over for good while its process
        goes on (or add :class:`tfdist.callbacks.LeaveOnTrainEnd` to ``fit``).
        In an elastic job the parameter servers stop waiting at once;
        otherwise within ``ps.heartbeat_timeout_s`` (the worker says ``Done``
        only when its process ends, because a PS task exits once every worker
        has). Evaluate and predict still work afterwards (they read like an
        evaluator), and a later ``fit`` takes the worker back into the job.
        """
        self._runtime.leave()

    def evaluation_rounds(self, interval_s: float = 5.0) -> Iterator[int]:
        """Side-car evaluation: yields while the job trains, each time the parameter servers hold new values.

        Before each round the PS values are loaded into this task's
        variables, and during the round ``evaluate``/``predict`` use that one
        snapshot (they do not pull before every batch), so every batch of an
        evaluation sees the same model. Between rounds it waits
        ``interval_s`` seconds. The loop ends, without an error, once every
        training worker is done or the parameter servers have ended (they
        exit when the job is over): the final model is evaluated by the
        workers (the chief) after ``fit``.

        Example (the ``evaluator`` task of a ``TF_CONFIG`` job):

        ```python
        if strategy.is_evaluator:
            for version in strategy.evaluation_rounds(interval_s=10):
                loss, acc = model.evaluate(x_val, y_val, verbose=0)
                print(f"PS version {version}: val accuracy {acc:.4f}")
        ```

        Args:
            interval_s: Seconds between two looks at the parameter servers.
                Defaults to 5.

        Yields:
            The version of the snapshot (the sum of the PS tasks' update counters).
        """
        if interval_s <= 0:
            raise ValueError(f"interval_s must be > 0. Received: interval_s={interval_s!r}.")
        return self._runtime.evaluation_rounds(interval_s)

    def _at_exit(self) -> None:
        in_cluster = self._local_server is None
        self.shutdown()
        if in_cluster:
            _arm_exit_watchdog()

    def shutdown(self) -> None:
        """Tells the PS this worker is done and closes connections (idempotent).

        Called automatically at interpreter exit (the ``Done`` message needs
        no thread pool, so it goes out then too). A parameter-server task
        exits once every training worker is done; an evaluator's shutdown
        sends nothing.
        """
        # An in-process PS needs no "done" message (and may already be gone).
        self._runtime.close(done=self._local_server is None)
        if self._local_server is not None:
            self._local_server.stop(0)
            self._local_server = None


def _arm_exit_watchdog() -> None:
    """Bounds interpreter shutdown of a task process: exit 1 (with every thread's stack) if it hangs.

    A worker that stopped ``fit`` early (elastic jobs) sometimes never exits:
    at interpreter finalisation a ``tf.data`` iterator's destructor waits for
    one of its threads forever (seen in TF 2.21 under py-spy:
    ``IteratorResource::~IteratorResource`` → ``LogicalThreadWrapper`` →
    ``WaitForNotification``). ``faulthandler``'s watchdog is a C thread that
    needs no GIL, so it still fires then. ``TFDIST_EXIT_TIMEOUT_S`` (default
    20; 0 disables) sets the bound.
    """
    import faulthandler

    seconds = float(os.environ.get(constants.ENV_EXIT_TIMEOUT_S, "20") or 0)
    if seconds > 0:
        faulthandler.dump_traceback_later(seconds, exit=True)


class _ExcludeStragglers:
    """Straggler-detector listener: keeps the PS's excluded set equal to the detected stragglers."""

    def __init__(self, strategy: ParameterServerStrategy):
        self._strategy = strategy
        self.excluded: set[int] = set()

    def _send(self) -> None:
        try:
            self._strategy.exclude_workers(self.excluded)
        except Exception as e:  # acting on a verdict must never break training
            logger.warning("could not tell the parameter servers about stragglers %s: %s", sorted(self.excluded), e)

    def on_straggler_detected(self, worker, info) -> None:
        self.excluded.add(int(worker))
        self._send()

    def on_straggler_recovered(self, worker, info) -> None:
        self.excluded.discard(int(worker))
        self._send()


#: Placeholder address of the single worker in in-process mode (never dialled).
UNUSED_WORKER_ADDRESS = "127.0.0.1:1"


class SyncReplicasStrategy(ParameterServerStrategy):
    """TF1 ``SyncReplicasOptimizer`` for Keras 3: each step uses the first M of N gradients.

    Each global step sums the first ``replicas_to_aggregate`` gradients that
    arrive *for that step* (Keras divides every loss by
    ``num_replicas_in_sync = M``, so the sum is their mean); every worker —
    including one whose gradient came too late and was dropped — applies the
    same aggregate with its own optimizer, so all workers and their optimizer
    slots stay identical. A worker that falls further behind reloads the
    state snapshot (weights, optimizer slots, step counter) before its next
    step. ``N - M`` backup workers absorb stragglers; dead workers are never
    waited for.

    Example:

    ```python
    strategy = tfdist.SyncReplicasStrategy(replicas_to_aggregate=3)   # 4 workers: 1 backup
    ```

    Args:
        replicas_to_aggregate: ``M``. Defaults to the number of workers (BSP).
        **kwargs: As for :class:`ParameterServerStrategy`.
    """

    def __init__(self, replicas_to_aggregate: int | None = None, **kwargs):
        config, task = _resolve(kwargs.pop("cluster", None), kwargs.pop("task", None), kwargs.pop("config", None))
        config.strategy = dataclasses.replace(config.strategy, consistency="sync_replicas",
                                              replicas_to_aggregate=replicas_to_aggregate)
        super().__init__(config=config, task=task, **kwargs)


class BSPStrategy(ParameterServerStrategy):
    """Bulk synchronous training: every live worker's gradient, every step.

    With plain SGD (and in fact any optimizer) N workers end with the same
    weights, to float tolerance, as one process training on their
    concatenated batches. Same arguments as :class:`ParameterServerStrategy`.
    """

    def __init__(self, **kwargs):
        super().__init__(consistency="bsp", **kwargs)


class SSPStrategy(ParameterServerStrategy):
    """Stale synchronous parallel training with bound ``staleness``.

    A worker at clock ``c`` never starts while it is more than ``s`` clocks
    ahead of the slowest live worker; it refreshes its cache only when the SSP
    read guarantee requires it. Each worker applies its own full-rate update
    (``num_replicas_in_sync = 1``), as in asynchronous training.

    Args:
        staleness: The bound ``s`` >= 0. Defaults to 3.
        **kwargs: As for :class:`ParameterServerStrategy`.
    """

    def __init__(self, staleness: int = 3, **kwargs):
        super().__init__(consistency={"policy": "ssp", "staleness": staleness, "refresh_every_step": False}, **kwargs)


class DTSSPStrategy(ParameterServerStrategy):
    """SSP whose bound adapts to learning progress (DTSSP, DESIGN.md §4.2).

    Args:
        min_staleness: Lower bound and start. Defaults to 3.
        max_staleness: Upper bound. Defaults to 10.
        window: Global clocks per loss window. Defaults to 10.
        delta: Dead band of the learning-progress ratio. Defaults to 0.01.
        **kwargs: As for :class:`ParameterServerStrategy`.
    """

    def __init__(self, min_staleness: int = 3, max_staleness: int = 10, window: int = 10, delta: float = 0.01,
                 **kwargs):
        super().__init__(consistency={"policy": "dtssp", "min_staleness": min_staleness,
                                      "max_staleness": max_staleness, "window": window, "delta": delta}, **kwargs)
