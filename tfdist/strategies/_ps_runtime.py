"""What a parameter-server worker does around each Keras step: the part both exchange paths share.

:class:`ParameterServerExtended` (the graph hooks, ``_ps_extended.py``) calls
a runtime while Keras traces a step and, through ``tf.py_function``, while
the step runs. One runtime per exchange path, chosen once from the mode's
descriptor (:func:`tfdist.strategies._runtimes.make_runtime`):

* :class:`~tfdist.strategies._update_path.UpdatePathRuntime` — ASP, SSP,
  DTSSP: the worker pushes its *update* after a step, on one of the update
  path's schedules (blocking, overlapped, every-k, lone worker, local-only);
* :class:`~tfdist.strategies._gradient_path.GradientPathRuntime` — BSP,
  SyncReplicas: gradients are exchanged inside the step and every worker
  applies the step's aggregate.

Both share :class:`PSRuntime` (this module): the variables
(:class:`~tfdist.strategies._variable_registry.VariableRegistry`, the one
writer of fresh values into them), the session with the PS (whose
:class:`~tfdist.ps.exchange_state.ExchangeState` owns clock, staleness, steps
and membership flags), the worker's role
(:class:`~tfdist.strategies._lifecycle.WorkerLifecycle`), warm-up, slow-down
injection, recovery, leaving, check-pointing, side-car evaluation rounds and
closing. PS-resident tables are the slice :class:`RuntimeTables`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from typing import Any, Callable, Iterator, Mapping

import numpy as np
import tensorflow as tf

from tfdist import constants
from tfdist.config import JobConfig, TaskSpec
from tfdist.consistency import ConsistencyPolicy
from tfdist.errors import ClusterError, PSRestartedError, PSUnavailableError
from tfdist.ps.client import PSClient
from tfdist.ps.placement import PlacementPlan, VariableSpec, make_placement
from tfdist.ps.protocol import CheckpointRequest, DoneRequest, StatusRequest
from tfdist.ps.replies import StatusReply
from tfdist.ps.session import WorkerSession
from tfdist.strategies._lifecycle import WorkerLifecycle
from tfdist.strategies._runtime_tables import RuntimeTables
from tfdist.strategies._shared_state import default_variable_filter
from tfdist.strategies._variable_registry import VariableRegistry
from tfdist.slowdown import ENV_SLOWDOWN, StepSlowdown, slowdown_from_env

__all__ = ["PSRuntime", "STAT_NAMES", "default_variable_filter"]

logger = logging.getLogger(__name__)

#: Names of the per-step exchange counters added to Keras logs (History, TensorBoard).
STAT_NAMES = ("ps_step", "ps_dropped", "ps_waits", "ps_staleness", "ps_refreshes")


class PSRuntime(RuntimeTables):
    """Per-process state shared by the strategy and its extended object (one exchange path).

    Subclasses implement the path: :meth:`_new_session`, :meth:`_begin_training`,
    :meth:`build_end_of_step` and :meth:`step_stats`, and may hook gradient
    reduction (:meth:`reduce_gradients`, :meth:`note_update`).
    """

    #: Replicas Keras divides the loss by (see DESIGN.md §1: it sets the effective learning rate).
    num_replicas = 1

    def __init__(self, config: JobConfig, task: TaskSpec, token: str | None, variable_filter,
                 policy: ConsistencyPolicy):
        self.config = config
        self.task = task
        self.token = token
        self.variable_filter = variable_filter
        self.policy = policy
        self.policy_spec = policy.spec()
        self.worker_id = config.cluster.worker_id(task.job, task.index) if task.job in ("chief", "worker") else -1
        self.is_chief = self.worker_id == 0
        self.registry = VariableRegistry()
        self._init_tables()
        self.session: WorkerSession | None = None
        self.plan: PlacementPlan | None = None
        self._lock = threading.Lock()
        #: Held by every exchange a lone worker's background thread makes and by the calls of the training
        #: thread that use the session (pull, checkpoint, leave, close): one at a time.
        self._exchange_lock = threading.RLock()
        #: Seconds the current/last training step spent blocked on the PS (waits, transfers).
        self.step_wait_s = 0.0
        #: Whether time blocked on the PS may be time spent waiting for other workers (barriers, staleness
        #: bounds) and so counts in ``step_wait_s``. Under ASP nothing waits for anyone: the time is this
        #: worker's own exchange (a slow link makes it slow), which a straggler detector must see.
        self.blocked_time_waits_for_peers = True
        # Elastic join: train this many batches locally (build, trace, warm caches) before joining the job.
        # The engine sets the variable for the workers it starts; a worker started by hand (--task) into
        # an elastic job's spare slot warms up as the config says.
        default = (config.elastic.warmup_batches
                   if config.elastic.enabled and self.worker_id >= config.starting_workers else 0)
        warmup = int(os.environ.get(constants.ENV_WARMUP_BATCHES, str(default)) or 0)
        #: The worker's part in the job (reader, warming up, training, left, closed): the one owner of its role.
        self.lifecycle = WorkerLifecycle(self.worker_id, warmup if self.worker_id > 0 else 0)
        self._warmup_started: float | None = None
        #: While a side-car evaluation round runs: evaluate/predict use the round's snapshot, no pull per step.
        self.hold_values = False
        slowdown = slowdown_from_env(str(task))
        self.slowdown = StepSlowdown(slowdown) if slowdown else None
        if slowdown:
            logger.warning("task %s is slowed down on purpose (%s): %s", task, ENV_SLOWDOWN, slowdown)

    # -------------------------------------------------------------- variables
    @property
    def variables(self) -> list[tf.Variable]:
        return self.registry.variables

    @property
    def specs(self) -> list[VariableSpec]:
        return self.registry.specs

    def wants(self, name: str, kwargs: Mapping[str, Any], owner=None) -> bool:
        """Whether a variable being created goes to the PS (never a derived-state mirror); ``owner``: its creator."""
        return not self.registry.derived.creating_mirror() and self._model_variable(name, kwargs, owner)

    def _model_variable(self, name: str, kwargs: Mapping[str, Any], owner) -> bool:
        """The variable filter's answer (the default one also looks at the variable's owner)."""
        if self.variable_filter is default_variable_filter:
            return default_variable_filter(name, kwargs, owner)
        return self.variable_filter(name, kwargs)

    def register(self, var: tf.Variable, name: str, kwargs: Mapping[str, Any], owner=None) -> None:
        """Registers a variable :meth:`wants` (model variables must be floating point); ``owner``: its layer."""
        model_variable = self._model_variable(name, kwargs, owner)
        if model_variable and not var.dtype.is_floating:
            return
        running = self.session is not None
        self.registry.register(var, model_variable, frozen=running and self.lifecycle.reader, owner=owner,
                               watch=not self.lifecycle.reader, joins=running)

    def key_of(self, var) -> str | None:
        return self.registry.key_of(var)

    def make_plan(self) -> PlacementPlan:
        placement = make_placement(self.config.ps.placement, self.config.ps.partition_threshold_bytes)
        return placement.place(self.specs, len(self.config.cluster.ps))

    # ----------------------------------------------------------------- session
    def ensure_session(self) -> WorkerSession:
        """The session with the PS (joining the job at the first call); variables created since join it."""
        session = self._ensure_session()
        if self.registry.pending:
            self.join_new_variables()
        return session

    def join_new_variables(self) -> None:
        """Variables created after the job started join it: placed after the others, sent, the job's values loaded.

        The first worker to send a variable gives the job its value; the
        others load that value (so every worker's copy agrees whatever each
        initialised). Under async an exchange still in flight lands first.
        A lost PS task: recovered from, and the variables join at the next call.
        """
        with self._exchange_lock:
            session = self.session
            pending = self.registry.peek_pending()  # they stay pending (reads skip them) until the job has them
            if session is None or not pending:
                return
            self._before_join()
            placement = make_placement(self.config.ps.placement, self.config.ps.partition_threshold_bytes)
            plan = placement.extend(session.plan, session.specs, pending)
            local = self.registry.values()
            joined = self._recovering(lambda: session.extend(plan, pending, local))
            if joined is None:  # a PS task was lost and recovered from: they join at the next call
                return
            values, added = joined
            self.registry.joined(pending)
            self.plan = plan
            theirs = {k: v for k, v in values.items() if k not in added}
            if theirs:
                self.registry.assign(theirs, keep_written=False, partial=True)
            logger.info("worker %d: %d variable(s) created after the job's first step joined it (%d new to the job, "
                        "%d loaded from it):\n%s", self.worker_id, len(pending), len(added), len(theirs),
                        PlacementPlan(plan.num_ps, tuple(sh for sh in plan.shards
                                                         if sh.var_key in values)).describe())

    def _before_join(self) -> None:
        """Hook: what must land before variables join (the update path's exchange in flight)."""

    def _ensure_session(self) -> WorkerSession:
        with self._lock:
            if self.session is not None:
                return self.session
            self.plan = self.make_plan()
            logger.info(
                "worker %d: %d variables on %d PS task(s), placement=%s, consistency=%s:\n%s",
                self.worker_id, len(self.specs), self.plan.num_ps, self.config.ps.placement, self.policy_spec,
                self.plan.describe(self.specs),
            )
            client = PSClient(
                self.config.cluster.ps,
                self.token,
                rpc_timeout_s=self.config.ps.rpc_timeout_s,
                max_message_bytes=self.config.ps.max_message_bytes,
                tls_ca=self.config.security.tls_ca,
                tune_malloc=self.config.ps.tune_malloc,
                stream=self.config.ps.transport == "auto",
                shared_memory=self.config.ps.shared_memory,
            )
            session = self._new_session(
                client, self.specs, self.plan, self.worker_id, self.is_chief,
                startup_timeout_s=self.config.ps.startup_timeout_s,
                heartbeat_interval_s=None if self.lifecycle.reader else self.config.ps.heartbeat_interval_s,
                policy_spec=self.policy_spec,
                num_workers=self.config.starting_workers,
                nonfinite=self.config.ps.nonfinite,
                reconnect_timeout_s=self.config.ps.reconnect_timeout_s,
                tables=self._table_specs(),
            )
            session.local_values = self.registry.values  # what a task that lost joined variables gets again
            values = session.initialize(self.registry.values() if self.is_chief else {})
            # Writes before joining: the chief's became the job's initial values, or the job's win.
            self.registry.written.clear()
            if values is not None:
                self.registry.assign(values)
            self.session = session
            pending, self._pending_table_writes = self._pending_table_writes, {}
            if pending and values is None:  # this worker initialised the job: its loaded tables are the job's
                for key, table in pending.items():
                    self._write_table(session, key, table)
            elif pending:
                logger.info("worker %d: the job already holds its tables; the %d table(s) loaded before joining "
                            "are not written", self.worker_id, len(pending))
            return session

    def _new_session(self, *args, **kwargs) -> WorkerSession:
        raise NotImplementedError

    def local_only(self) -> bool:
        """Whether training steps skip the exchange entirely (one process, nothing to exchange)."""
        return False

    def _recoveries(self) -> int:
        session = self.session
        return int(session.stats.get("recoveries", 0)) if session is not None else 0

    def _recovering(self, call: Callable[[], Any]) -> Any:
        """Runs ``call`` (an exchange with the PS); if a PS task was lost or restarted, recovers and returns None.

        Recovery (:meth:`WorkerSession.recover`) reconnects within
        ``ps.reconnect_timeout_s``, has the chief initialise a task that came
        back empty, and loads the job's values into the variables; the
        exchange that failed is not repeated (at most one step is lost).
        """
        try:
            return call()
        except PSUnavailableError as e:
            if self.session is None or self.lifecycle.closed:
                raise
            self._recover(e, as_reader=self.lifecycle.reads_as_reader)
            return None

    def _recover(self, error: PSUnavailableError, as_reader: bool) -> None:
        """Recovers from a lost or restarted PS task and loads the job's values into the variables."""
        self.registry.assign(self.session.recover(error, self.registry.values() if self.is_chief else None,
                                                  as_reader=as_reader))

    # ------------------------------------------------------------------- steps
    @property
    def in_warmup(self) -> bool:
        """Whether the step now running is a warm-up step (the lifecycle's)."""
        return self.lifecycle.in_warmup_step

    def _require_training_task(self) -> None:
        if self.lifecycle.reader:
            raise ClusterError(f"Task {self.task} is not a training task: it may evaluate and predict, not fit.")

    def begin_step(self, training: bool) -> None:
        """Runs (in a py_function) before every step: warm-up, joining, pulls, the policy's refresh."""
        if self._tables:
            self._new_step_for_lookups()
        if training and self.slowdown is not None:
            self.slowdown.at_step_start()
        left_before = self.lifecycle.warmup_left
        if training and self.lifecycle.warmup_step(may_warm_up=self.session is None):
            if self._warmup_started is None:
                self._warmup_started = time.perf_counter()
                logger.info("worker %d: warming up on %d local batch(es) before joining the job",
                            self.worker_id, left_before)
            return
        self.lifecycle.end_warmup_step()
        if self._warmup_started is not None:
            logger.info("worker %d: warmed up in %.2f s; joining (pulling parameters from %d PS task(s))",
                        self.worker_id, time.perf_counter() - self._warmup_started, len(self.config.cluster.ps))
            self._warmup_started = None
        session = self.ensure_session()
        if training and self.lifecycle.left:
            self.rejoin()
        if not training or self.lifecycle.reader:
            if not self.hold_values:
                self._refresh_for_reading(session)
            return
        self.step_wait_s = 0.0
        self._training_step_begins()
        with self._blocked():
            values = self._recovering(session.begin)
        if values is not None:
            self.registry.assign(values)

    def build_begin(self, begin, keras_train_step: bool) -> tuple[tf.Tensor, bool]:
        """The begin op of a step being traced: ``begin`` (which runs :meth:`begin_step`) in a ``py_function``.

        Returns the op's output and whether it may skip ``begin`` (see the update path's override); here never.
        ``keras_train_step``: the step is Keras's ``train_step`` (the update path may skip the begin of steps
        its schedule holds).
        """
        return tf.py_function(begin, [], tf.int64, name="tfdist_begin_step"), False

    def _refresh_for_reading(self, session: WorkerSession) -> None:
        """Before an evaluate/predict step (or on an evaluator): the job's freshest values."""
        self.flush_local_steps()
        values = self._recovering(lambda: session.pull(as_reader=self.lifecycle.reads_as_reader))
        if values is not None:
            self.registry.assign(values)

    def flush_local_steps(self) -> None:
        """Sends local steps the exchange held back (update path with ``exchange_every``)."""

    def _training_step_begins(self) -> None:
        """Hook: a training step of this worker begins (before its pull, if any)."""

    def refresh(self, keep_local_writes: bool = True) -> None:
        """``strategy.pull()``: the job's freshest values into this worker's variables now."""
        with self._exchange_lock:
            if not keep_local_writes:
                self.registry.written.clear()
            self.begin_step(training=False)

    @contextlib.contextmanager
    def _blocked(self):
        """Adds the duration of the block to ``step_wait_s`` (if it may be a wait for peers)."""
        if not self.blocked_time_waits_for_peers:
            yield
            return
        start = time.perf_counter()
        try:
            yield
        finally:
            self.step_wait_s += time.perf_counter() - start

    def reduce_gradients(self, grads: list[tf.Tensor]) -> list[tf.Tensor] | None:
        """Graph hook of the gradient all-reduce; ``None``: the default (local) reduction."""
        return None

    def note_update(self, var) -> None:
        """Graph hook: the optimizer applies a gradient to ``var`` (in gradient order)."""

    def end_of_step_done_tracing(self) -> None:
        """Graph hook: the step's function is traced."""

    def build_end_of_step(self, result, begin_skips: bool = False) -> tf.Tensor:
        """Builds the end of a training step (after Keras's train step); returns its stats tensor."""
        raise NotImplementedError

    def step_stats(self) -> np.ndarray:
        """``[step, dropped, waits, staleness or -1, refreshes or resyncs]`` for Keras logs."""
        raise NotImplementedError

    # --------------------------------------------------------------- lifecycle
    def stop_reason(self) -> str | None:
        """``"leave"`` (drained by the engine), ``"job_done"``, or ``None`` to keep training."""
        session = self.session
        if session is None:
            return None
        if session.state.job_done:
            return "job_done"
        if session.state.leave_requested:
            return "leave"
        return None

    def leave(self) -> None:
        """Stops taking part in training (graceful): barriers stop waiting for this worker now; reads still work.

        The last local steps and any update in flight are sent first. Then
        the worker stops heart-beating and reads like an evaluator (no worker
        id), and every PS task stops counting it for barriers at once:

        * elastic jobs (``elastic.enabled``): the worker says ``Done``; the PS
          tasks keep serving (the launcher or engine stops them);
        * other jobs: the worker says ``Leave``, which, unlike ``Done``, does
          not count towards the PS tasks' exit (a PS task exits once every
          worker said ``Done``, which this worker does when its process ends
          or on :meth:`close`), so it may still evaluate and read.

        A later training step takes the worker back into the job (:meth:`rejoin`).
        """
        with self._exchange_lock:
            self._leave()

    def _leave(self) -> None:
        if self.session is None or self.lifecycle.reader or self.lifecycle.left or self.lifecycle.closed:
            return
        try:
            self.flush_local_steps()
        except Exception as e:
            logger.warning("worker %d: could not send its last local step(s): %s", self.worker_id, e)
        self.lifecycle.leave()
        try:
            self.session.flush()  # an update in flight lands before this worker stops counting
            if self.config.elastic.enabled:
                self.session.stop_heartbeat()
                self.session.client.request_all(DoneRequest(self.worker_id), timeout=5.0)
            else:
                self.session.leave()
        except Exception as e:  # leaving is best effort: heart-beat silence has the same effect
            logger.warning("worker %d: could not tell the PS it leaves (the others stop waiting for it within "
                           "ps.heartbeat_timeout_s): %s", self.worker_id, e)
        self.session.stop_heartbeat()
        logger.info("worker %d left %s", self.worker_id,
                    "the job" if self.config.elastic.enabled else "training; the others no longer wait for it")

    def rejoin(self) -> None:
        """Takes part in training again after :meth:`leave` (a later ``fit``)."""
        if not self.lifecycle.left or self.session is None:
            return
        self.session.rejoin()
        self.lifecycle.rejoin()
        logger.info("worker %d takes part in training again", self.worker_id)

    def checkpoint(self) -> list[dict]:
        """``strategy.checkpoint()``: every PS task writes its shard now (update path: local steps sent first)."""
        self._require_training_task()
        session = self.ensure_session()
        with self._exchange_lock:
            self.flush_local_steps()
            session.flush()
        replies = session.client.request_many(
            {ps: CheckpointRequest(self.worker_id) for ps in range(session.plan.num_ps)},
            timeout=max(self.config.ps.rpc_timeout_s, 120.0))
        return [{"step": reply.step, "path": reply.path} for _, reply in sorted(replies.items())]

    def evaluation_rounds(self, interval_s: float) -> Iterator[int]:
        """Side-car evaluation: see :meth:`ParameterServerStrategy.evaluation_rounds`.

        A PS task that stops answering while another one says training goes
        on is restarting (``launch.restart_ps``): the rounds wait for it
        (within ``ps.reconnect_timeout_s``) and read its new incarnation. When
        no task answers, or one says every worker is done, the job is over.
        """
        session = self.ensure_session()
        num_workers = self.config.starting_workers
        last = None
        failing_since = None
        while True:
            statuses = self._statuses_while_the_job_runs(session, num_workers)
            if statuses is None:
                return
            if any(len(st.done_workers) >= num_workers for st in statuses):
                logger.info("task %s: every training worker is done", self.task)
                return
            version = tuple(st.fields.get("version", 0) for st in statuses)
            if version != last:
                try:
                    values = session.pull(as_reader=True)
                except PSUnavailableError as e:  # a task restarted (new incarnation) or is not initialised yet
                    if isinstance(e, PSRestartedError):
                        session.state.forget_incarnations()  # learnt again from the next pull
                    failing_since = failing_since or time.monotonic()
                    if time.monotonic() - failing_since > self.reconnect_timeout_s:
                        logger.warning("task %s: no read of the parameter servers succeeded for %.0f s; ending the "
                                       "evaluation rounds: %s", self.task, time.monotonic() - failing_since, e)
                        return
                    time.sleep(min(interval_s, 0.5))
                    continue
                failing_since = None
                self.registry.assign(values)
                last = version
                self.hold_values = True
                try:
                    yield sum(version)
                finally:
                    self.hold_values = False
            time.sleep(interval_s)

    @property
    def reconnect_timeout_s(self) -> float:
        return float(self.config.ps.reconnect_timeout_s)

    def _statuses_while_the_job_runs(self, session: WorkerSession, num_workers: int) -> list[StatusReply] | None:
        """Every PS task's brief status, or ``None`` when the job is over (see :meth:`evaluation_rounds`)."""
        deadline = None
        while True:
            answers, lost = {}, None
            for ps in range(session.plan.num_ps):
                try:
                    answers[ps] = session.client.request(ps, StatusRequest(brief=True), timeout=5.0)
                except PSUnavailableError as e:
                    lost = e
            if lost is None:
                return [answers[ps] for ps in range(session.plan.num_ps)]
            if not answers or any(len(st.done_workers) >= num_workers for st in answers.values()):
                logger.info("task %s: the parameter servers have ended (the job is over): %s", self.task, lost)
                return None
            if deadline is None:
                deadline = time.monotonic() + self.reconnect_timeout_s
                logger.warning("task %s: %s; the other PS tasks say training goes on: waiting for it to come back "
                               "(ps.reconnect_timeout_s=%g)", self.task, lost, self.reconnect_timeout_s)
            if time.monotonic() > deadline:
                logger.warning("task %s: a PS task did not come back within ps.reconnect_timeout_s; ending the "
                               "evaluation rounds: %s", self.task, lost)
                return None
            time.sleep(0.5)

    def close(self, done: bool = True, flush: bool = True) -> None:
        """Sends what is unsent, says ``Done`` (training tasks) and closes the connections (idempotent).

        Safe at interpreter exit: no call here needs a new thread. ``flush``:
        send held steps first (an in-process PS at interpreter exit needs
        none: nothing reads it afterwards, and its threads are gone).
        """
        self._stop_background_exchange()
        with self._exchange_lock:
            self._close(done, flush)

    def _stop_background_exchange(self) -> None:
        """Hook: stops a lone worker's background exchange (before the last steps are sent)."""

    def _close(self, done: bool, flush: bool) -> None:
        if not self.lifecycle.close():
            return
        if self.session is not None and flush:
            try:
                self.flush_local_steps()
            except Exception as e:  # closing goes on: the PS keeps what it has
                logger.warning("worker %d: could not send its last local step(s): %s", self.worker_id, e)
            self.session.close(done=done and not self.lifecycle.reader)
        if self._row_pusher is not None:
            self._row_pusher.shutdown(wait=False)
