"""What a parameter-server worker does around each Keras step, one runtime per exchange path.

:class:`ParameterServerExtended` (the graph hooks, ``_ps_extended.py``) calls
a runtime while Keras traces a step and, through ``tf.py_function``, while
the step runs. The runtime is chosen once, from the consistency policy's
path (:func:`make_runtime`):

* :class:`UpdatePathRuntime` — ASP, SSP, DTSSP: after a training step the
  worker pushes its *update* (an additive delta); ASP also pulls, either in
  the step (blocking) or in the background while the next step computes
  (overlapped), the choice made once at construction.
* :class:`GradientPathRuntime` — BSP, SyncReplicas: the gradients are
  exchanged inside the step (the all-reduce hook) and every worker applies
  the step's aggregate; the state snapshot is uploaded or reloaded at its end.

Both share :class:`PSRuntime`: the variables (:class:`VariableRegistry`, the
one writer of fresh values into them), the worker's session with the PS
(which owns clock, staleness, statistics and membership flags), warm-up,
slow-down injection and the worker's lifecycle (leave, rejoin, close).
"""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import threading
import time
from typing import Any, Callable, Iterator, Mapping

import numpy as np
import tensorflow as tf
from tensorflow.python.ops import gen_resource_variable_ops

from tfdist import constants
from tfdist.config import JobConfig, TaskSpec
from tfdist.consistency import ConsistencyPolicy, policy_from_spec
from tfdist.errors import ClusterError, PSRestartedError, PSUnavailableError
from tfdist.ps.client import PSClient
from tfdist.ps.identity import CanonicalNames
from tfdist.ps.placement import PlacementPlan, VariableSpec, make_placement
from tfdist.ps.protocol import MAX_LOOKUP_TABLES, CheckpointRequest, DoneRequest, StatusRequest
from tfdist.ps.replies import StatusReply
from tfdist.strategies._job_logs import job_epoch_logs
from tfdist.strategies._lifecycle import WorkerLifecycle
from tfdist.ps.sparse import TableSpec
from tfdist.ps.session import GradientSession, UpdateSession, WorkerSession
from tfdist.strategies._derived_state import DerivedStateLayers
from tfdist.strategies._shared_state import default_variable_filter
from tfdist.slowdown import ENV_SLOWDOWN, StepSlowdown, slowdown_from_env

__all__ = ["PSRuntime", "UpdatePathRuntime", "GradientPathRuntime", "VariableRegistry", "make_runtime",
           "STAT_NAMES", "default_variable_filter"]

logger = logging.getLogger(__name__)

#: Async training as one process (no cluster, in-process PS): the worker's steps reach the PS this often
#: (and before every read), since nothing else reads the PS meanwhile.
SINGLE_PROCESS_EXCHANGE_EVERY = 100
#: Async: row pushes of PS-resident tables a worker may have in flight (its next steps' lookups do not wait
#: for them; the push before those waits for the oldest).
MAX_ROW_PUSHES_IN_FLIGHT = 4

#: Names of the per-step exchange counters added to Keras logs (History, TensorBoard).
STAT_NAMES = ("ps_step", "ps_dropped", "ps_waits", "ps_staleness", "ps_refreshes")

_OPTIMIZER_AGGREGATION = tf.VariableAggregation.ONLY_FIRST_REPLICA


def _is_optimizer_variable(name: str, kwargs: Mapping[str, Any]) -> bool:
    """Optimizer slots, step counter and learning rate (not metrics, not seeds)."""
    if "seed_generator" in name:
        return False
    return kwargs.get("colocate_with") is not None or kwargs.get("aggregation") == _OPTIMIZER_AGGREGATION


def _numpy_dtype_name(dtype: tf.DType) -> str:
    return "bfloat16" if dtype == tf.bfloat16 else np.dtype(dtype.as_numpy_dtype).name


def _write(var: tf.Variable, value: np.ndarray, add: bool = False) -> None:
    """``var = value`` (``var += value`` with ``add``) eagerly, as the bare resource op.

    ``tf.Variable.assign[_add]``'s Python layers (dispatch, the returned
    read) cost more than the write on small models. A variable without a
    plain handle, a graph context, or a value of another shape (which the
    bare assign would not refuse) goes through the method.
    """
    handle = getattr(var, "handle", None)
    if handle is None or not tf.executing_eagerly() or tuple(np.shape(value)) != tuple(var.shape):
        (var.assign_add if add else var.assign)(value, read_value=False)
        return
    op = gen_resource_variable_ops.assign_add_variable_op if add else gen_resource_variable_ops.assign_variable_op
    op(handle, tf.convert_to_tensor(value, dtype=var.dtype))


class VariableRegistry:
    """The variables kept on the parameter servers, in creation order, and the one way values reach them.

    Every write of PS values into the local variables goes through
    :meth:`assign` (pulls, resyncs, the blocking exchange) or :meth:`add`
    (the overlapped exchange's corrections), eagerly: from inside a step's
    ``tf.py_function`` or from the caller's thread. Both then bring the
    layers that derive state from their variables (``Normalization``) in
    step with the new values (:class:`DerivedStateLayers`).

    Local writes: an eager ``assign``/``assign_add``/``assign_sub`` of a
    registered variable that does not come from here (``set_weights``,
    ``load_weights``, ``EarlyStopping``'s restore, a callback) marks the
    variable *written*; :meth:`assign` then leaves it as written (the
    runtime clears the marks where the write has reached the job, or where
    the job's state must win). Writes traced into a ``tf.function`` (the
    optimizer in a training step) are not marks.
    """

    def __init__(self):
        self.variables: list[tf.Variable] = []
        self.specs: list[VariableSpec] = []
        self._keys_by_var: dict[int, str] = {}
        #: Keys name variables by creation order and path, with Keras's auto-name counters renumbered.
        self._names = CanonicalNames()
        #: Names of variables created after the PS was initialised (they stay local).
        self.late: list[str] = []
        #: Owners of registered variables that implement ``finalize_state``.
        self.derived = DerivedStateLayers()
        #: Keys of variables written locally since the marks were last cleared (see the class doc).
        self.written: set[str] = set()
        #: Called before a local write is marked (the runtime sends steps held back first, so a held
        #: training update and a later local write never travel as one delta).
        self.before_local_write: Callable[[], None] | None = None
        #: True while a step runs (set by the strategy): its writes (the optimizer's, eagerly under
        #: ``run_eagerly=True``) are training, not local writes.
        self.stepping = False
        # Per thread: a lone worker's background exchange adds corrections while the training thread may
        # make a local write, which must still be marked.
        self._own = threading.local()
        self._kept_logged: frozenset[str] = frozenset()

    def register(self, var: tf.Variable, trainable: bool, frozen: bool, owner=None, watch: bool = True) -> None:
        """Adds ``var`` (unless ``frozen``: the PS already holds the job's variables).

        ``owner``: the layer creating ``var``, if known; one with a
        ``finalize_state`` is kept computing with the values written here.
        ``watch``: mark local writes of ``var`` (not on an evaluator, which
        only mirrors the job).
        """
        name = var.name.split(":")[0]
        if frozen:
            self.late.append(name)
            logger.warning(
                "variable %r was created after the parameter servers were initialised; it stays local "
                "to this worker (create every model variable before the first fit/evaluate/predict step)",
                name,
            )
            return
        key = f"{len(self.variables):04d}/{self._names.canonical(name)}"
        self.variables.append(var)
        self._keys_by_var[id(var)] = key
        self.specs.append(VariableSpec(key, _numpy_dtype_name(var.dtype), tuple(var.shape.as_list()),
                                       bool(var.trainable) and trainable))
        if owner is not None:
            self.derived.track(owner, var)
        if watch:
            self._watch(var, key)

    def _watch(self, var: tf.Variable, key: str) -> None:
        """Marks ``key`` written when ``var`` is assigned eagerly by anyone but this registry."""
        for method in ("assign", "assign_add", "assign_sub"):
            original = getattr(var, method)

            def write(*args, _original=original, **kwargs):
                if not self._own_write and not self.stepping and tf.executing_eagerly():
                    if self.before_local_write is not None:
                        self.before_local_write()
                    self.written.add(key)
                return _original(*args, **kwargs)

            setattr(var, method, write)

    @property
    def _own_write(self) -> bool:
        return getattr(self._own, "write", False)

    @_own_write.setter
    def _own_write(self, value: bool) -> None:
        self._own.write = value

    def key_of(self, var) -> str | None:
        return self._keys_by_var.get(id(var))

    def values(self) -> dict[str, np.ndarray]:
        """The local values, keyed (copies)."""
        return {s.key: v.numpy() for s, v in zip(self.specs, self.variables)}

    def keyed(self, arrays: list[np.ndarray]) -> dict[str, np.ndarray]:
        """Arrays in variable order, keyed."""
        return {s.key: a for s, a in zip(self.specs, arrays)}

    def assign(self, values: Mapping[str, np.ndarray], keep_written: bool = True) -> None:
        """Writes fresh values into the local variables (except those written locally, if ``keep_written``)."""
        kept = frozenset(self.written) if keep_written else frozenset()
        self._own_write = True
        try:
            for spec, var in zip(self.specs, self.variables):
                if spec.key not in kept:
                    _write(var, values[spec.key])
        finally:
            self._own_write = False
        if not keep_written:
            self.written.clear()
        if kept and kept != self._kept_logged:
            self._kept_logged = kept
            logger.info("kept %d variable(s) written locally (e.g. set_weights, load_weights, EarlyStopping's "
                        "restore) instead of the job's values: %s", len(kept), sorted(kept)[:5])
        self.derived.refresh()

    def add(self, corrections: Mapping[str, np.ndarray]) -> None:
        """Adds ``corrections`` (variable key → array; missing keys: nothing to add); see :func:`_write`."""
        self._own_write = True
        try:
            for spec, var in zip(self.specs, self.variables):
                correction = corrections.get(spec.key)
                if correction is not None:
                    _write(var, correction, add=True)
        finally:
            self._own_write = False
        self.derived.refresh()


class PSRuntime:
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
        #: PS-resident tables: key → (name, rows, dim, initializer, optimizer or None, seed).
        self._tables: dict[str, tuple] = {}
        #: The Keras optimizer built under the scope (the row optimizer of tables without their own).
        self.keras_optimizer = None
        #: Tables loaded (load_weights) before the PS was initialised: written once the chief initialises it.
        self._pending_table_writes: dict[str, np.ndarray] = {}
        #: Row pushes in flight (``background_row_pushes``), oldest first, with the recovery count when sent.
        self._row_pushes: collections.deque = collections.deque()
        self._row_pusher = None
        self._row_push_lock = threading.RLock()
        #: Table lookups (see :meth:`lookup_rows`): lead table → tables read with it; rows read ahead for this
        #: step (key → (ids, rows)); the step's last requested lookup (key, ids).
        self._companions: dict[str, list[str]] = {}
        self._prefetched: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        self._last_lookup: tuple[str, np.ndarray] | None = None
        #: Tables read in this step; tables read more than once in a step (never grouped).
        self._looked_up: set[str] = set()
        self._solo: set[str] = set()
        self._lookup_lock = threading.Lock()
        #: Background row pushes of a table group waiting for the group's other members (key → ids, grads, lr).
        self._held_pushes: dict[str, tuple[np.ndarray, np.ndarray, float | None]] = {}
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
        self.registry.register(var, model_variable, frozen=self.session is not None, owner=owner,
                               watch=not self.lifecycle.reader)

    def key_of(self, var) -> str | None:
        return self.registry.key_of(var)

    # ------------------------------------------------------------------ tables
    def register_table(self, name: str, rows: int, dim: int, initializer: dict, optimizer: dict | None,
                       seed: int) -> str:
        """A PS-resident table (``tfdist.layers.ShardedEmbedding``); returns its key.

        Its row optimizer is fixed when the parameter servers are initialised:
        ``optimizer`` if given, else the Keras optimizer this worker builds
        under the strategy's scope (see :meth:`note_optimizer`).
        """
        if self.session is not None:
            raise ClusterError(f"Table {name!r} was created after the parameter servers were initialised: create "
                               "every ShardedEmbedding before the first fit/evaluate/predict step.")
        key = f"t{len(self._tables):03d}/{name}"
        self._tables[key] = (name, rows, dim, initializer, optimizer, seed)
        return key

    def note_optimizer(self, optimizer) -> None:
        """The Keras optimizer whose variables are created under the scope: tables without their own use it.

        Keras's base ``Optimizer`` (``load_model`` creates one to read the
        saved optimizer variables into) is not a user's optimizer.
        """
        if type(optimizer).__name__ == "Optimizer":
            return
        self.keras_optimizer = optimizer

    def _table_specs(self) -> list[TableSpec]:
        from tfdist.strategies._row_optimizer import row_optimizer_spec

        specs = []
        for key, (name, rows, dim, initializer, optimizer, seed) in self._tables.items():
            if optimizer is None:
                if self.keras_optimizer is None:
                    logger.warning("table %r: no optimizer known yet (the first step is not a training step); its rows "
                                   "are trained with SGD(0.01). Give ShardedEmbedding(optimizer=...) to choose.", name)
                    optimizer = {"kind": "sgd"}
                else:
                    optimizer = row_optimizer_spec(self.keras_optimizer)
            specs.append(TableSpec(key, rows, dim, initializer=initializer, optimizer=optimizer, seed=seed))
        return specs

    def lookup_rows(self, key: str, ids: np.ndarray) -> np.ndarray:
        """The rows ``ids`` (unique) of table ``key``, for the step running now (a lost PS task is recovered).

        Tables looked up by the same ids in one step (a wide and a deep table
        of the same features) are learnt as companions: from the next step on
        the first one's request reads the others' rows too (one request per
        PS task instead of one per table), and their own lookups in that step
        take those rows if their ids are the same (else they ask, and the
        companionship is forgotten). Nothing read is kept past its step.
        """
        session = self.ensure_session()
        as_reader = self.lifecycle.reads_as_reader
        with self._lookup_lock:  # the bookkeeping only: requests of several lookups may overlap
            if key in self._looked_up:  # read twice in one step (a shared table): never grouped
                self._ungroup(key)
            self._looked_up.add(key)
            held = self._prefetched.pop(key, None)
            if held is not None:
                if np.array_equal(held[0], ids):
                    return held[1]
                self._forget_companion(key)
            keys = [key, *self._companions.get(key, ())]
        try:
            rows = session.lookup_tables(keys, ids, as_reader=as_reader)
        except PSUnavailableError as e:
            self._recover(e, as_reader)
            rows = session.lookup_tables(keys, ids, as_reader=as_reader)
        with self._lookup_lock:
            for other in keys[1:]:
                if other not in self._looked_up:
                    self._prefetched[other] = (ids, rows[other])
            self._learn_companion(key, ids)
        return rows[key]

    def _ungroup(self, key: str) -> None:
        """``key`` is read more than once in a step: it never shares a request (its reads are not one set of ids)."""
        self._solo.add(key)
        self._companions.pop(key, None)
        self._forget_companion(key)

    def _learn_companion(self, key: str, ids: np.ndarray) -> None:
        """``key`` was just read by a request of its own: a companion of the step's previous lookup if same ids."""
        last, self._last_lookup = self._last_lookup, (key, ids)
        if last is None:
            return
        lead, lead_ids = last
        read_with_another = {k for companions in self._companions.values() for k in companions}
        if lead == key or key in self._companions or key in read_with_another or lead in read_with_another:
            return
        if key in self._solo or lead in self._solo or len(self._companions.get(lead, ())) >= MAX_LOOKUP_TABLES - 1:
            return
        if lead_ids.shape != ids.shape or not np.array_equal(lead_ids, ids):
            return
        self._companions.setdefault(lead, []).append(key)
        self._last_lookup = last  # a third table with the same ids joins the same lead
        logger.info("worker %d: %s and %s are looked up by the same ids: one request per PS task serves both from "
                    "now on", self.worker_id, lead, key)

    def _forget_companion(self, key: str) -> None:
        for lead, companions in list(self._companions.items()):
            if key in companions:
                companions.remove(key)
                if not companions:
                    del self._companions[lead]

    def _new_step_for_lookups(self) -> None:
        """A step begins: rows read ahead for the step before are dropped (unused: that companionship is wrong)."""
        self._send_held_pushes()
        with self._lookup_lock:
            for key in list(self._prefetched):
                self._forget_companion(key)
            self._prefetched.clear()
            self._last_lookup = None
            self._looked_up.clear()

    def read_rows(self, key: str, ids: np.ndarray) -> np.ndarray:
        """Rows of table ``key`` outside a step (saving, inspection): read as an evaluator reads."""
        session = self.ensure_session()
        self.wait_row_pushes()
        return session.lookup_rows(key, ids, as_reader=True)

    def table_specs(self) -> list[TableSpec]:
        """The job's PS-resident tables (their row optimizers as the PS runs them, once the job started)."""
        return list(self.session.tables.values()) if self.session is not None else self._table_specs()

    def push_rows(self, key: str, ids: np.ndarray, grads: np.ndarray) -> None:
        """The step's row gradients of table ``key`` (dropped, after recovering, if a PS task was lost).

        With :attr:`background_row_pushes` (async with ``overlap_exchange``)
        the push is sent by a background thread, in order, while the step
        goes on (at most :data:`MAX_ROW_PUSHES_IN_FLIGHT` in flight; a
        failure surfaces, and is recovered from, at the next push or
        :meth:`wait_row_pushes`).
        """
        self._require_training_task()
        if self.in_warmup:
            return
        lr = None
        if self.keras_optimizer is not None:
            lr = float(self.keras_optimizer.learning_rate)  # (np.asarray of a Keras variable: 3-4x slower)
        session = self.session
        if not self.background_row_pushes:
            self._recovering(lambda: session.push_rows(key, ids, grads, lr))
            return
        ids, grads = np.array(ids, copy=True), np.array(grads, copy=True)  # the step's buffers are reused
        group = self._push_group(key)
        if group is None:
            self._submit_row_push([key], ids, [grads], lr)
            return
        # Tables read together (see lookup_rows) also push together: held until the group's last one arrives
        # in this step, then one request per PS task when their ids agree.
        with self._row_push_lock:
            earlier = self._held_pushes.pop(key, None)
            if earlier is None:
                self._held_pushes[key] = (ids, grads, lr)
                if not all(k in self._held_pushes for k in group):
                    return
                held = [self._held_pushes.pop(k) for k in group]
        if earlier is not None:  # pushed twice in one step: each on its own, and the table is grouped no more
            with self._lookup_lock:
                self._ungroup(key)
            self._submit_row_push([key], earlier[0], [earlier[1]], earlier[2])
            self._submit_row_push([key], ids, [grads], lr)
            return
        if all(np.array_equal(held[0][0], h[0]) for h in held[1:]):
            self._submit_row_push(group, held[0][0], [h[1] for h in held], lr)
        else:
            for k, (k_ids, k_grads, k_lr) in zip(group, held):
                self._submit_row_push([k], k_ids, [k_grads], k_lr)

    def _push_group(self, key: str) -> list[str] | None:
        """The tables ``key`` is read with (lead first), or None."""
        for lead, companions in self._companions.items():
            if key == lead or key in companions:
                return [lead, *companions]
        return None

    def _submit_row_push(self, keys: list[str], ids: np.ndarray, grads: list[np.ndarray], lr: float | None) -> None:
        self._reap_row_pushes(block_until=MAX_ROW_PUSHES_IN_FLIGHT - 1)
        if self._row_pusher is None:
            import concurrent.futures

            self._row_pusher = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="tfdist-row-push")
        try:
            future = self._row_pusher.submit(self.session.push_tables, keys, ids, grads, lr)
        except RuntimeError:  # the interpreter is ending (no new futures): push in this thread
            self._recovering(lambda: self.session.push_tables(keys, ids, grads, lr))
            return
        with self._row_push_lock:
            self._row_pushes.append((future, self._recoveries()))

    def _send_held_pushes(self) -> None:
        """Row pushes held for a group whose other members did not push in their step: each on its own now."""
        if not self._held_pushes:
            return
        with self._row_push_lock:
            held, self._held_pushes = self._held_pushes, {}
        for key, (ids, grads, lr) in held.items():
            self._submit_row_push([key], ids, [grads], lr)

    #: Row pushes of a table may travel in the background (set by the exchange path).
    background_row_pushes = False

    def _recoveries(self) -> int:
        session = self.session
        return int(session.stats.get("recoveries", 0)) if session is not None else 0

    def _reap_row_pushes(self, block_until: int = 0) -> None:
        """Waits until at most ``block_until`` background row pushes are in flight; recovers from a failed one.

        A push that failed because a PS task was lost is recovered from here
        (in the calling thread, which may write the variables), unless the
        job recovered since it was sent (the lookup of a later step usually
        has): the push is then one of the steps a recovery loses.
        """
        with self._row_push_lock:
            while self._row_pushes and (len(self._row_pushes) > block_until or self._row_pushes[0][0].done()):
                future, recoveries = self._row_pushes.popleft()
                error = future.exception()
                if isinstance(error, PSUnavailableError):
                    if self._recoveries() == recoveries and not self.lifecycle.closed:
                        self._recover(error, as_reader=self.lifecycle.reads_as_reader)
                elif error is not None:
                    raise error

    def wait_row_pushes(self) -> None:
        """Every row push sent (before reads of the PS, checkpoints, leaving, closing)."""
        self._send_held_pushes()
        self._reap_row_pushes(block_until=0)

    def make_plan(self) -> PlacementPlan:
        placement = make_placement(self.config.ps.placement, self.config.ps.partition_threshold_bytes)
        return placement.place(self.specs, len(self.config.cluster.ps))

    # ----------------------------------------------------------------- session
    def ensure_session(self) -> WorkerSession:
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

    def write_table(self, key: str, values: np.ndarray) -> None:
        """Loads a whole PS-resident table (``load_weights``/``load_model`` under the strategy).

        Before the PS is initialised: kept, and written by the worker that
        initialises it (the chief's load becomes the job's, like its other
        weights). After: written to the PS tasks now (every worker reads
        the new rows at its next lookup).
        """
        if key not in self._tables:
            raise ClusterError(f"Unknown table {key!r}.")
        name, rows, dim = self._tables[key][:3]
        values = np.asarray(values, np.float32)
        if values.shape != (rows, dim):
            raise ValueError(f"Table {name!r} is {rows} x {dim}; the weights loaded into it are "
                             f"{' x '.join(map(str, values.shape))}.")
        if self.config.ps.nonfinite == "refuse" and not np.isfinite(values).all():  # refused before any row is sent
            raise ValueError(f"Table {name!r}: the weights loaded into it hold NaN or Inf (ps.nonfinite: refuse).")
        with self._lock:
            if self.session is None:
                self._pending_table_writes[key] = values
                return
        self.wait_row_pushes()  # a push sent before the load lands before it
        self._write_table(self.session, key, values)

    def _write_table(self, session: WorkerSession, key: str, values: np.ndarray, chunk_rows: int = 65536) -> None:
        for start in range(0, len(values), chunk_rows):
            ids = np.arange(start, min(start + chunk_rows, len(values)), dtype=np.int64)
            session.write_rows(key, ids, values[start:start + len(ids)])
        logger.info("worker %d: wrote table %s (%d rows) to the PS tasks", self.worker_id, key, len(values))

    def _new_session(self, *args, **kwargs) -> WorkerSession:
        raise NotImplementedError

    def local_only(self) -> bool:
        """Whether training steps skip the exchange entirely (one process, nothing to exchange)."""
        return False

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

    def build_end_of_step(self, result) -> tf.Tensor:
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


def _loss_input(result) -> tuple[tf.Tensor, bool]:
    """The step's scalar loss as a float32 input of the end-of-step py_function (0 when there is none)."""
    loss = result.get("loss") if isinstance(result, dict) else None
    if loss is None:
        return tf.constant(0.0), False
    return tf.cast(tf.reshape(loss, []), tf.float32), True


class UpdatePathRuntime(PSRuntime):
    """ASP, SSP, DTSSP: push the step's update after it; pull as the policy needs.

    ASP (an infinite bound, a refresh every step) may overlap the exchange
    with the next step (``strategy.overlap_exchange``) and exchange every
    k-th step (``strategy.exchange_every``); both are decided once here.
    """

    def __init__(self, config, task, token, variable_filter, policy, single_process: bool = False):
        super().__init__(config, task, token, variable_filter, policy)
        # Only pure ASP may overlap or hold steps back: SSP's read guarantee needs every reply in time.
        asp = policy.refresh_every_step and policy.staleness == float("inf")
        self.overlap = asp and config.strategy.overlap_exchange
        # Async with overlap: a step's row gradients travel while the next steps run (staleness of this
        # worker's own rows by at most MAX_ROW_PUSHES_IN_FLIGHT steps, as other workers' are under async).
        # One process (in-process PS) keeps them in step: its tables train exactly as local embeddings.
        self.background_row_pushes = self.overlap and not single_process
        #: ASP: exchange after every k-th step; the steps in between stay local (``strategy.exchange_every``).
        self.exchange_every = config.strategy.exchange_every if asp else 1
        #: A lone worker: the only training worker of a job with remote PS tasks (not elastic), pure ASP,
        #: ``strategy.lone_worker_exchange_s`` > 0. Nobody else writes to the PS, so its local values are
        #: the job's: its steps run as local-only ones and a background thread sends them every
        #: ``lone_worker_exchange_s`` (:meth:`_lone_exchange`).
        self.lone_worker = (asp and not single_process and self.exchange_every == 1
                            and config.strategy.lone_worker_exchange_s > 0 and self.worker_id == 0
                            and config.cluster.num_workers == 1 and not config.elastic.enabled)
        #: One worker and its in-process PS (no cluster, no checkpoints), pure ASP, or a lone worker:
        #: nobody else writes to the PS, so a training step is Keras's own step plus a step counter (no
        #: exchange, no py_function); the PS learns of the steps when something reads it (pull,
        #: ps_status, checkpoint, the end) and, for a lone worker, from the background exchange.
        #: Decided for good when the first step is traced (:meth:`local_only`).
        self._local_only: bool | None = (
            None if (asp and single_process and self.exchange_every == 1 and not config.ps.checkpoint_dir)
            or self.lone_worker else False)
        self._local_steps: tf.Variable | None = None
        self._local_steps_counted = 0
        #: Lone worker: set when its background exchange failed for good (the next step raises).
        self._lone_failed: tf.Variable | None = None
        self._lone_error: BaseException | None = None
        self._lone_thread: threading.Thread | None = None
        self._lone_stop = threading.Event()
        #: Lone worker after a recovery: the PS tasks do not hold its state; the next exchange sends it.
        self._lone_resync = False
        if self._local_only is None:
            if single_process:
                # A PS-resident table needs its exchange every step: then the steps stay local for
                # SINGLE_PROCESS_EXCHANGE_EVERY steps and reach the PS before every read instead.
                self.exchange_every = SINGLE_PROCESS_EXCHANGE_EVERY
            with tf.init_scope():
                self._local_steps = tf.Variable(0, dtype=tf.int64, trainable=False, name="tfdist_local_steps")
                if self.lone_worker:
                    self._lone_failed = tf.Variable(False, trainable=False, name="tfdist_lone_exchange_failed")
        self.blocked_time_waits_for_peers = not asp
        self._unsent_steps = 0
        # Steps held back are sent before a local write, so the two never travel as one update (and
        # pull(keep_local_writes=False) can drop the write and keep the steps).
        self._flushing_for_write = False
        self.registry.before_local_write = self._flush_before_local_write
        self._send: Callable[[dict, float | None, int], None] = (
            self._send_overlapped if self.overlap else self._send_blocking)

    def _new_session(self, *args, **kwargs) -> WorkerSession:
        return UpdateSession(*args, staleness=self.policy.staleness,
                             refresh_every_step=self.policy.refresh_every_step, **kwargs)

    def local_only(self) -> bool:
        """Whether training steps run without any exchange (see ``_local_only``); fixed at the first call."""
        if self._local_only is None:
            local_only = not self._tables and self.slowdown is None and self.lifecycle.warmup_left == 0
            if local_only and self.lone_worker:
                self._start_background_exchange()  # may fail (no PS): decided at the next trace then
            self._local_only = local_only
        return self._local_only

    def build_local_end_of_step(self) -> tf.Tensor:
        """The end of a local-only training step: counts it; its stats (the job's step is this count)."""
        if self._lone_failed is None:
            step = tf.cast(self._local_steps.assign_add(1), tf.float32)
        else:  # a lone worker stops at the step after its background exchange failed for good
            ok = tf.debugging.Assert(tf.logical_not(self._lone_failed.read_value()), [
                "tfdist: this worker's background exchange with the parameter servers failed (the error is in "
                "its log, logger tfdist.strategies._ps_runtime); training stops"])
            with tf.control_dependencies([ok]):
                step = tf.cast(self._local_steps.assign_add(1), tf.float32)
        return tf.stack([step, 0.0, 0.0, -1.0, 0.0])

    # ------------------------------------------------------ lone worker (background exchange)
    def _start_background_exchange(self) -> None:
        """A lone worker's first step is being traced: joins the job now and starts the background exchange."""
        with tf.init_scope():  # eager, out of the step's trace: the chief initialises the PS with its values
            self.ensure_session()
        interval = float(self.config.strategy.lone_worker_exchange_s)
        logger.info("worker %d is the job's only training worker: its steps run without an exchange; their "
                    "update reaches the PS every %g s in the background (strategy.lone_worker_exchange_s)",
                    self.worker_id, interval)
        self._lone_thread = threading.Thread(target=self._background_exchange_loop, args=(interval,),
                                             name="tfdist-lone-exchange", daemon=True)
        self._lone_thread.start()

    def _background_exchange_loop(self, interval: float) -> None:
        while not self._lone_stop.wait(interval):
            try:
                self._lone_exchange()
            except Exception as e:  # the PS is gone for good (recovery failed) or refused the update
                if self._lone_stop.is_set() or (isinstance(e, RuntimeError) and "shutdown" in str(e)):
                    return  # the process is ending: close() sends what is left, in its own thread
                self._lone_error = e
                logger.error("worker %d: the background exchange with the parameter servers failed; training "
                             "stops at the next step: %s", self.worker_id, e)
                self._lone_failed.assign(True)
                return

    def _lone_exchange(self) -> None:
        """Sends the steps made since the last exchange (their summed update), in the background.

        The training thread goes on meanwhile: the values read here may mix
        two steps across variables, which loses nothing, since each
        variable's next update is taken against the very values sent now.
        """
        with self._exchange_lock:
            if self.lifecycle.closed or self.session is None:
                return
            self._count_local_steps()
            if self.lifecycle.left:
                if not self._unsent_steps:
                    return
                self.rejoin()  # a later fit after leave(): its steps take part in the job again
            if not self._unsent_steps:  # the last exchange's outcome (a lost PS is found, and recovered from, now)
                corrections = self._recovering(self.session.flush)
                if corrections:
                    self.registry.add(corrections)
                return
            steps, self._unsent_steps = self._unsent_steps, 0
            recoveries = self._recoveries()
            try:
                self._send_overlapped(self.registry.values(), None, steps)
            except BaseException:
                self._unsent_steps += steps  # not sent: the next exchange (or close) carries them
                raise
            if self._recoveries() > recoveries:  # the exchange before failed and this one was not sent:
                self._unsent_steps += steps      # the next one carries these steps (and the state, see _recover)
            else:
                self._lone_resync = False

    def _lone(self) -> bool:
        return bool(self.lone_worker and self._local_only)

    def _recover(self, error: PSUnavailableError, as_reader: bool) -> None:
        """A lone worker keeps its values: it is the job's only writer, so they are the job's state.

        The PS tasks answer again (one that restarted restored its checkpoint,
        or was initialised again from these values); the session's base is
        now their state, so the next exchange sends ``local - theirs`` and
        they hold this worker's state again: no step is lost, whatever the
        checkpoint held. (Other workers load the job's values instead.)
        """
        if not self._lone():
            return super()._recover(error, as_reader)
        self.session.recover(error, self.registry.values(), as_reader=as_reader)
        self._lone_resync = True

    def _stop_background_exchange(self) -> None:
        thread = self._lone_thread
        if thread is None:
            return
        self._lone_stop.set()
        if thread is not threading.current_thread():
            thread.join(timeout=float(self.config.ps.rpc_timeout_s) + 5.0)

    def _count_local_steps(self) -> None:
        """Local-only: the steps the graph counted since the last look become unsent steps."""
        if self._local_steps is None or not self._local_only:
            return
        done = int(self._local_steps.numpy())
        self._unsent_steps += done - self._local_steps_counted
        self._local_steps_counted = done

    def _flush_before_local_write(self) -> None:
        if self._flushing_for_write or self.lifecycle.reader:
            return
        self._flushing_for_write = True
        try:
            if self._local_only and self.session is None:  # the PS has not seen this process's steps yet
                self._count_local_steps()
                if self._unsent_steps:
                    self.ensure_session()  # initialised with the values before the write
            self.flush_local_steps()  # a lost PS is recovered from inside; a refusal reaches the writer
        finally:
            self._flushing_for_write = False

    def build_end_of_step(self, result) -> tf.Tensor:
        loss, has_loss = _loss_input(result)
        inputs = [v.read_value() for v in self.variables] + [loss]

        def end(*tensors):
            held = self._holds_next_step()  # the step stays local: its values are not needed
            current = None if held else [np.asarray(t) for t in tensors[:-1]]
            self.end_step(current, float(tensors[-1].numpy()) if has_loss and not held else None)
            return self.step_stats()

        # Fresh values go into the variables inside the py_function (VariableRegistry): it returns
        # only the statistics, so no per-variable output is converted for nothing.
        return tf.py_function(end, inputs, tf.float32, name="tfdist_end_update_step")

    def _holds_next_step(self) -> bool:
        """Whether the step ending now will stay local (``exchange_every``), so ``end_step`` needs no values."""
        return self.in_warmup or (self.session is not None and self._unsent_steps + 1 < self.exchange_every)

    def end_step(self, current: list[np.ndarray] | None, loss: float | None) -> None:
        """After a training step: count it, and send it (and earlier held-back ones) when it is time.

        ``current``: the variables' values after the step; may be ``None``
        when :meth:`_holds_next_step` said the step stays local.
        """
        self._require_training_task()
        if self.in_warmup:  # not part of the job yet: keep the local update, send nothing
            return
        self._unsent_steps += 1
        if self._unsent_steps < self.exchange_every:  # exchange_every: this step stays local
            return
        steps, self._unsent_steps = self._unsent_steps, 0
        values = self.registry.keyed(current) if current is not None else self.registry.values()
        with self._blocked():
            self._send(values, loss, steps)

    def _send_blocking(self, current: dict, loss: float | None, steps: int) -> None:
        self.registry.written.clear()  # this update carries the local writes (current - snapshot)
        values = self._recovering(lambda: self.session.end(current, loss, steps=steps))
        if values is not None:
            self.registry.assign(values)

    def _send_overlapped(self, current: dict, loss: float | None, steps: int) -> None:
        self.registry.written.clear()  # this update carries the local writes (current - base)
        corrections = self._recovering(lambda: self.session.end_overlapped(current, loss, steps=steps))
        if corrections:
            self.registry.add(corrections)

    def flush_local_steps(self) -> None:
        """Sends the local steps an ``exchange_every`` > 1 (or a local-only process) held back; loads fresh values.

        Row pushes still in flight are waited for first (every read of the PS after this sees them).
        """
        self.wait_row_pushes()
        with self._exchange_lock:
            if self._lone_error is not None and not self.lifecycle.closed:
                raise self._lone_error  # (closing tries to send the last steps all the same)
            self._count_local_steps()
            if self.session is None or self.lifecycle.reader:
                return
            if self.lifecycle.left and self._unsent_steps and self._local_only:
                self.rejoin()  # local-only steps of a later fit after leave(): they take part in the job again
            if self.lifecycle.left:
                return
            if self._lone_resync and not self._unsent_steps:
                self._unsent_steps = 1  # the PS tasks must get this lone worker's state back: a push counts a batch
            if not self._unsent_steps:
                return
            steps, self._unsent_steps = self._unsent_steps, 0
            for _ in range(2):  # a lone worker's push lost with a PS task is sent again once it recovered
                recoveries = self._recoveries()
                self._send_blocking(self.registry.values(), None, steps)  # waits for any exchange in flight first
                if self._recoveries() == recoveries or not self._lone():
                    self._lone_resync = False
                    return
            raise PSUnavailableError(f"worker {self.worker_id}: a parameter server was lost twice while this worker "
                                     "sent its last steps")

    def step_stats(self) -> np.ndarray:
        session = self.session
        if session is None:
            return np.array([0, 0, 0, -1, 0], np.float32)
        st, s = session.stats, session.state.staleness
        return np.array([session.state.clock, 0, st["waits"], -1 if s == float("inf") else s, st["refreshes"]],
                        np.float32)


class GradientPathRuntime(PSRuntime):
    """BSP, SyncReplicas: gradients are exchanged inside the step; every worker applies the aggregate.

    The optimizer's variables travel too (the state snapshot a lagging
    worker reloads), so :meth:`wants` takes them.
    """

    def __init__(self, config, task, token, variable_filter, policy):
        super().__init__(config, task, token, variable_filter, policy)
        self.num_replicas = policy.aggregation_size()
        self._trained_since_check = False
        #: Set when a PS task was lost inside a step: the state to load at the step's end instead of its result.
        self._recovered: dict[str, np.ndarray] | None = None
        # While a step traces: the keys of the pending exchange (filled as the optimizer's
        # updates trace, in gradient order) and the gradients' shapes.
        self._pending: tuple[list[str | None], list[tf.TensorShape]] | None = None

    #: Epoch ends this worker has reported (the job's epoch logs are matched by it).
    epochs_ended = 0

    def job_epoch_logs(self, logs):
        """The epoch logs callbacks see: the job's (see :mod:`tfdist.strategies._job_logs`)."""
        return job_epoch_logs(self, logs, STAT_NAMES)

    def _new_session(self, *args, **kwargs) -> WorkerSession:
        ps = self.config.ps
        return GradientSession(*args, checkpoint_every_s=ps.checkpoint_every_s if ps.checkpoint_dir else None,
                               **kwargs)

    def wants(self, name: str, kwargs: Mapping[str, Any], owner=None) -> bool:
        return super().wants(name, kwargs, owner) or (
            not self.registry.derived.creating_mirror() and _is_optimizer_variable(name, kwargs))

    def reduce_gradients(self, grads: list[tf.Tensor]) -> list[tf.Tensor]:
        dense = [tf.convert_to_tensor(g) for g in grads]  # IndexedSlices travel dense
        keys: list[str | None] = [None] * len(dense)  # filled while the optimizer's updates trace

        def exchange(*tensors):
            return self.exchange_gradients(keys, [np.asarray(g) for g in tensors])

        out = tf.py_function(exchange, dense, [d.dtype for d in dense], name="tfdist_exchange_gradients")
        out = [tf.ensure_shape(o, d.shape) for o, d in zip(out, dense)]
        # TF wraps all-reduce results in a custom-gradient identity, so the tensors the optimizer's
        # updates receive are not these: Keras applies the reduced gradients in list order, which is
        # how note_update matches them.
        self._pending = (keys, [d.shape for d in dense])
        return out

    def note_update(self, var) -> None:
        if self._pending is None:
            return
        keys, shapes = self._pending
        i = next((j for j, k in enumerate(keys) if k is None), None)
        if i is not None and shapes[i].is_compatible_with(var.shape):
            keys[i] = self.key_of(var)
        elif i is not None:
            logger.warning("gradient %d (shape %s) does not match variable %s %s; it stays local",
                           i, shapes[i], var.name, var.shape)

    def end_of_step_done_tracing(self) -> None:
        self._pending = None

    def _refresh_for_reading(self, session: WorkerSession) -> None:
        if self.lifecycle.reader:  # an evaluator reads the job's state
            self.registry.assign(session.pull(as_reader=True))
            return
        # A worker's copy equals the job's unless it fell behind. Once after training steps
        # (the first evaluate/predict step after fit), ask the PS for its latest state;
        # otherwise reload only when this worker already knows it is behind.
        if self._trained_since_check or self.lifecycle.left:
            self._trained_since_check = False
            # a worker that left reads as an evaluator
            values = self._recovering(lambda: session.catch_up(as_reader=self.lifecycle.reads_as_reader))
        else:
            values = self._recovering(session.begin)
        if values is not None:
            self.registry.assign(values)

    def _training_step_begins(self) -> None:
        # Synchronous training keeps every worker on the job's state: from its next step on, a worker's
        # local writes no longer hold back a reload of that state.
        self.registry.written.clear()

    def refresh(self, keep_local_writes: bool = True) -> None:
        """``strategy.pull()``: a worker loads the job's latest state snapshot if it is behind."""
        if not keep_local_writes:
            self.registry.written.clear()
        session = self.ensure_session()
        if self.lifecycle.reader:
            values = self._recovering(lambda: session.pull(as_reader=True))
        else:
            values = self._recovering(lambda: session.catch_up(as_reader=self.lifecycle.reads_as_reader))
        if values is not None:
            self.registry.assign(values)

    def exchange_gradients(self, keys: list[str | None], grads: list[np.ndarray]) -> list[np.ndarray]:
        self._require_training_task()
        mapped = {k: g for k, g in zip(keys, grads) if k is not None}
        if not mapped or self.in_warmup:
            return grads
        with self._blocked():
            try:
                aggregate = self.session.exchange(mapped)
            except PSUnavailableError as e:
                # A task was lost mid-step: recover now, apply nothing (zeros), and load the
                # recovered state at the step's end instead of this step's result.
                self._recovered = self.session.recover(e, self.registry.values() if self.is_chief else None,
                                                       as_reader=self.lifecycle.reads_as_reader)
                return [np.zeros_like(g) for g in grads]
        return [aggregate[k] if k is not None else g for k, g in zip(keys, grads)]

    def build_end_of_step(self, result) -> tf.Tensor:
        def end(*tensors):
            self.end_step([np.asarray(t) for t in tensors])
            return self.step_stats()

        return tf.py_function(end, [v.read_value() for v in self.variables], tf.float32, name="tfdist_end_step")

    def end_step(self, current: list[np.ndarray]) -> None:
        self._trained_since_check = True
        self.registry.written.clear()  # marks of an eager (run_eagerly) step's own updates
        if self.in_warmup:
            return
        if self._recovered is not None:  # a task was lost in this step: the recovered state, not its result
            values, self._recovered = self._recovered, None
            self.registry.assign(values)
            return
        state = self.registry.keyed(current)
        with self._blocked():
            values = self._recovering(lambda: self.session.end(state))
        if values is not None:  # too far behind: load the job's state instead of this step's result
            self.registry.assign(values)

    def step_stats(self) -> np.ndarray:
        session = self.session
        if session is None:
            return np.zeros(5, np.float32)
        st = session.stats
        return np.array([session.state.step, st["dropped"], st["waits"], 0, st["resyncs"]], np.float32)


def make_runtime(config: JobConfig, task: TaskSpec, token: str | None, variable_filter, policy_spec: Mapping,
                 single_process: bool = False) -> PSRuntime:
    """The runtime of the policy's exchange path (chosen once, for the life of the strategy).

    ``single_process``: one worker with an in-process PS (no cluster).
    """
    policy = policy_from_spec(policy_spec, config.starting_workers)
    if policy.path == "gradient":
        return GradientPathRuntime(config, task, token, variable_filter, policy)
    return UpdatePathRuntime(config, task, token, variable_filter, policy, single_process=single_process)
