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

Layers that compute with state derived from their variables by
``finalize_state()`` (``keras.layers.Normalization``) compute with the
values a pull writes into those variables, in traced steps too
(``_derived_state.py``): a worker that did not ``adapt`` uses the chief's
statistics from its first step.
"""

from __future__ import annotations

import atexit
import dataclasses
import gc
import logging
import os
import secrets
import sys
from typing import Any, Callable, Iterator, Mapping

from tfdist import constants, exit_status
from tfdist._tf_compat import StrategyBase
from tfdist.cluster.resolver import resolve_cluster
from tfdist.config import ClusterConfig, JobConfig, TaskSpec
from tfdist.consistency import ConsistencyPolicy, make_policy, mode_of, policy_from_spec
from tfdist.data.symbolic_build import build_from_element_spec
from tfdist.errors import ConfigError
from tfdist.ps.placement import PlacementPlan
from tfdist.straggler.events import StragglerListener
from tfdist.straggler.membership import StragglerEngine
from tfdist.strategies._worker_files import install as install_worker_files
from tfdist.strategies._contract import cluster_resolver, reduce_over_axis
from tfdist.strategies._job_meeting import JobMeeting
from tfdist.strategies._job_logs import install_job_epoch_logs
from tfdist.strategies._keras_iterators import install as install_iterator_release
from tfdist.strategies._ps_extended import ParameterServerExtended, install_plain_batch_results
from tfdist.strategies._ps_runtime import STAT_NAMES, default_variable_filter
from tfdist.strategies._runtimes import make_runtime
from tfdist.strategies._stuck import arm_exit_watchdog, exit_watchdog_work_done, start_stuck_task_watchdog
from tfdist.strategies._tables import install_resident_embeddings

__all__ = ["ParameterServerStrategy", "SyncReplicasStrategy", "BSPStrategy", "SSPStrategy", "DTSSPStrategy",
           "default_variable_filter", "STAT_NAMES"]

logger = logging.getLogger(__name__)

def _resolve(cluster, task, config) -> tuple[JobConfig, TaskSpec | None]:
    """The job config and this task (``None``: no cluster), from :func:`tfdist.cluster.resolve_cluster`."""
    resolved = resolve_cluster(cluster, task, config)
    return resolved.config, resolved.task


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

    ``distribute_datasets_from_function(fn)`` calls ``fn`` with one input
    pipeline per training worker (``input_pipeline_id`` = :attr:`worker_id`)
    and this strategy's ``num_replicas_in_sync`` (M under BSP/SyncReplicas,
    1 on the update path), so ``ctx.get_per_replica_batch_size(B)`` is the
    batch one gradient or one update is computed on.

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
            exchange with the PS after every k-th step; ``"auto"``: k chosen
            from the measured CPU of exchanges and steps).
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
        exchange_every: int | str | None = None,
    ):
        #: A task of a launched job (its cluster and task from TF_CONFIG/TFDIST_CONFIG), not a strategy a program
        #: (a test, a notebook) built with explicit arguments: only such a process bounds its own exit.
        self._task_process = cluster is None and task is None and bool(
            os.environ.get(constants.ENV_TF_CONFIG) or os.environ.get(constants.ENV_CONFIG))
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
        self._straggler_engine: StragglerEngine | None = None
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
        elif isinstance(consistency, Mapping):  # validated and made canonical by the one codec
            policy_spec = policy_from_spec(consistency, config.starting_workers).spec()
        else:
            policy_spec = config.strategy.policy_spec(config.starting_workers)
        mode_of(policy_spec["policy"]).check_workers(policy_spec, config.starting_workers)
        self._runtime = make_runtime(config, task, token, variable_filter or default_variable_filter, policy_spec,
                                     single_process=self._local_server is not None)
        if config.ps.resident_threshold_bytes is not None:  # large keras.layers.Embedding tables on the PS
            install_resident_embeddings()
        install_plain_batch_results()  # train_on_batch's list without the ps_* statistics, as plain Keras
        install_job_epoch_logs()  # BSP/SyncReplicas: callbacks see the job's epoch logs
        install_worker_files()  # the stock callbacks' files: the chief's are the job's (tfdist.strategies._worker_files)
        install_iterator_release()  # fit's tf.data iterators freed when it returns (tfdist.strategies._keras_iterators)
        super().__init__(ParameterServerExtended(self, self._runtime))
        self._meeting = JobMeeting(self._runtime)  # strategy.barrier, the gradient path's strategy.reduce
        # Gradient path: the workers are one sync group (replica id = worker id); update path: each its own.
        me = self._runtime.worker_id
        self.extended.set_job(me if self._runtime.num_replicas > 1 and me > 0 else 0, self._runtime.is_chief,
                              cluster_resolver(config.cluster.jobs(), task.job, task.index),
                              (config.cluster.num_workers, me) if me >= 0 else (1, 0))  # evaluator: one pipeline
        # Keras builds from the dataset's element spec: no throwaway iterator (a SIGSEGV in TF 2.21 at times).
        build_from_element_spec(self)
        atexit.register(self._at_exit)
        if self._task_process:  # a job's task: a hang inside fit ends the task with its stacks, not never
            start_stuck_task_watchdog()
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
        ps = config.ps
        self._local_server = PSServer(None, token=token, num_workers=1, max_wait_s=ps.rpc_timeout_s,
                                      checkpoint_dir=ps.checkpoint_dir, checkpoint_every_s=ps.checkpoint_every_s,
                                      checkpoint_every_steps=ps.checkpoint_every_steps,
                                      checkpoint_keep=ps.checkpoint_keep).start()
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

    def reduce(self, reduce_op, value, axis=None):
        """``value`` reduced across the replicas in sync (and over ``axis``), as under MultiWorkerMirroredStrategy.

        BSP, SyncReplicas: SUM/MEAN over every live worker, in and out of
        ``tf.function`` (met on PS task 0: every worker calls it in the same
        order as its other ``reduce``/``barrier`` calls). Async, SSP, DTSSP:
        each worker is a sync group of one replica: this worker's value.
        ``axis``: also reduce over this dimension (a MEAN divides by the count).
        """
        return reduce_over_axis(self._meeting.reduce_across, reduce_op, value, axis)

    def barrier(self, name: str, timeout_s: float | None = None) -> None:
        """Waits (up to ``timeout_s``, default ``ps.rpc_timeout_s``) until every live worker reached barrier ``name``.

        E.g. the chief saves, ``strategy.barrier("saved")``, every worker
        loads. Every worker waits at the same barriers in the same order (a
        different name raises); an evaluator does not take part.
        """
        self._meeting.barrier(name, timeout_s)

    def placement(self) -> PlacementPlan:
        """The variable → PS task map (same on every worker of a job)."""
        return self._runtime.plan or self._runtime.make_plan()

    def placement_table(self) -> list[tuple[str, int, tuple[int, int] | str | None]]:
        """``[(variable key, PS task, rows or None), ...]`` in creation order.

        A PS-resident table follows, one entry per PS task: ``(table key,
        task, "rows i with i % N == task")`` (``ShardedEmbedding``) or ``"ids i
        with tfdist.ps.dynamic.shard_of_ids(i, N) == task"`` (``DynamicEmbedding``).
        """
        from tfdist.ps.sparse import placement_rule

        n = len(self._runtime.config.cluster.ps)
        tables = [(spec.key, ps, placement_rule(spec, ps, n)) for spec in self._runtime.table_specs() for ps in range(n)]
        return self.placement().as_table() + tables

    def tables(self) -> list[dict]:
        """The PS-resident tables: key, rows, width, row optimizer, and the rows each PS task holds (or, for a
        dynamic table, ``rows_per_task=None`` and its ``capacity_per_task``)."""
        from tfdist.ps.sparse import describe_table

        return [describe_table(spec, len(self._runtime.config.cluster.ps)) for spec in self._runtime.table_specs()]

    def pull(self, keep_local_writes: bool = True) -> None:
        """Loads the job's freshest values into this worker's variables now.

        Update path (async, SSP, DTSSP): the PS's current values (local steps
        that ``exchange_every`` held back are sent first). Gradient path
        (BSP, SyncReplicas): the job's latest state snapshot (weights and
        optimizer state) when this worker is behind it, e.g. a backup whose
        gradients were dropped at the end of ``fit``; a worker that is not
        behind keeps its (identical) state.

        Args:
            keep_local_writes: Variables this worker wrote itself since its
                last training step (``set_weights``, ``load_weights``,
                ``EarlyStopping(restore_best_weights=True)``) keep their
                values, as they do at every ``evaluate``/``predict`` (README
                "Local writes"). ``False`` discards them and loads the job's
                values. Defaults to ``True``.
        """
        self._runtime.refresh(keep_local_writes)

    def checkpoint(self) -> list[dict]:
        """Writes a checkpoint of every PS task's shard now (``ps.checkpoint_dir``) and waits for it.

        Returns:
            Per PS task, ``{"step", "path"}`` of the checkpoint written
            (``None`` for both when the job has no ``ps.checkpoint_dir``).
            Load it into a plain Keras model with
            :func:`tfdist.checkpoint.load_into`.
        """
        return self._runtime.checkpoint()

    def ps_status(self) -> list[dict]:
        """Status of every PS task (version, live workers, counters, policy); local steps held back are sent first."""
        session = self._runtime.ensure_session()
        self._runtime.flush_local_steps()
        return session.status()

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
        """Seconds the last training step spent blocked on the parameter servers, waiting for other workers.

        A straggler detector subtracts it from the step's wall time to get
        this worker's own time (in sync modes every worker waits for the
        slowest). In BSP, SyncReplicas, SSP and DTSSP it is all the time the
        step was blocked on the PS (waits and the transfers they cannot be told
        apart from); under ASP, where nothing waits for another worker, it is
        0: the exchange is this worker's own work, so a worker behind a slow
        link is seen as a straggler.
        """
        return self._runtime.step_wait_s

    def exclude_workers(self, workers) -> None:
        """Stops barriers from waiting for ``workers`` (detected stragglers) until called again.

        SyncReplicas/BSP steps complete without them (their gradients still
        count when they arrive in time) and SSP's minimum clock ignores them.
        Pass an empty set to re-admit everyone.
        """
        self._runtime.ensure_session().set_excluded(workers)

    @property
    def straggler_engine(self) -> StragglerEngine:
        """What :class:`tfdist.callbacks.StragglerDetector` drives (found through ``model.distribute_strategy``).

        When the detector's verdicts change the flagged workers, one worker
        (the lowest-id member) tells every PS task, through
        :meth:`exclude_workers`, to stop waiting for them.
        """
        if self._straggler_engine is None:
            self._straggler_engine = _ExcludeStragglers(self)
        return self._straggler_engine

    def straggler_listener(self) -> StragglerListener:
        """Kept for old scripts: the detector now finds :attr:`straggler_engine` by itself.

        The listener returned does nothing, so scripts that still subscribe it
        keep working and the parameter servers hear each change once.

        Example (no longer needed):

        ```python
        detector = tfdist.callbacks.StragglerDetector()
        detector.subscribe(strategy.straggler_listener())
        ```
        """
        return StragglerListener()

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
        if in_cluster and self._task_process:
            arm_exit_watchdog()  # bounds what follows too (sending Done, closing, the interpreter's tear-down)
        gc.collect()  # garbage holding tf.data iterators is freed here, not on an inter-op thread of a later op
        if not in_cluster:  # nothing reads an in-process PS after exit: do not send it the held steps
            self._runtime.close(done=False, flush=False)
        failed = exit_status.ended_with_error()
        if failed and in_cluster and self._runtime.worker_id >= 0:
            # A script that died has not finished its work: a Done would let the PS tasks end the job (they
            # stop once every worker is done) while a supervisor restarts this task against nothing.
            logger.warning("worker %d: the script ended with an error; not telling the parameter servers it is "
                           "done (they keep serving, so this task can be started again)", self._runtime.worker_id)
        self.shutdown(done=not failed)
        if not failed:
            exit_watchdog_work_done()  # a hang from here on ends the process with 0, its work done

    def shutdown(self, done: bool = True) -> None:
        """Tells the PS this worker is done and closes connections (idempotent).

        Called automatically at interpreter exit (the ``Done`` message needs
        no thread pool, so it goes out then too), with ``done=False`` when the
        script ended with an uncaught exception (:mod:`tfdist.exit_status`).
        A parameter-server task exits once every training worker is done; an
        evaluator's shutdown sends nothing.

        Args:
            done: Say ``Done`` to the parameter servers. Defaults to ``True``.
                Pass ``False`` before a script exits with an error code
                (``sys.exit(1)``), which no exit hook can see: the PS tasks
                then keep serving for a restarted task.
        """
        # An in-process PS needs no "done" message (and may already be gone).
        self._runtime.close(done=done and self._local_server is None)
        self._meeting.close()
        if self._local_server is not None:
            self._local_server.stop(0)
            self._local_server = None


class _ExcludeStragglers(StragglerEngine):
    """The PS strategies' straggler engine: the reporting worker keeps the PS's excluded set = the stragglers."""

    def __init__(self, strategy: ParameterServerStrategy):
        self._strategy = strategy

    def set_stragglers(self, stragglers: frozenset[int], report: bool) -> None:
        if not report:
            return
        try:
            self._strategy.exclude_workers(stragglers)
        except Exception as e:  # acting on a verdict must never break training
            logger.warning("could not tell the parameter servers about stragglers %s: %s", sorted(stragglers), e)


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
        super().__init__(consistency=make_policy("ssp", staleness=staleness), **kwargs)


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
        super().__init__(consistency=make_policy("dtssp", min_staleness=min_staleness, max_staleness=max_staleness,
                                                 window=window, delta=delta), **kwargs)
