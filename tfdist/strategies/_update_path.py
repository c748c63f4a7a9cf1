"""The update path's worker side (ASP, SSP, DTSSP): after a training step the worker pushes its update.

The vertical slice of the update path is this module (the worker runtime)
with its schedules (:mod:`tfdist.strategies._schedules`),
:class:`~tfdist.ps.update_session.UpdateSession` (its requests, the staleness
bound's refreshes, the overlapped exchange) and
:mod:`tfdist.ps._update_requests` (the store's handlers). The update is an
additive delta (this worker's values minus those the PS last gave it); the
schedule, chosen once, decides when it travels.
"""

from __future__ import annotations

import logging

import numpy as np
import tensorflow as tf
from tensorflow.python.ops import gen_resource_variable_ops

from tfdist.errors import PSUnavailableError
from tfdist.ps.session import WorkerSession
from tfdist.ps.update_session import Corrections, FlatLayout, UpdateSession
from tfdist.strategies._ps_runtime import PSRuntime
from tfdist.strategies._schedules import (
    LocalOnly,
    LoneWorker,
    Schedule,
    choose_schedule,
    send_blocking,
)
from tfdist.strategies._stuck import note_progress
from tfdist.strategies._variable_registry import aliasable

__all__ = ["UpdatePathRuntime"]

logger = logging.getLogger(__name__)


class UpdatePathRuntime(PSRuntime):
    """ASP, SSP, DTSSP: push the step's update after it; pull as the policy needs.

    ``schedule`` (:mod:`~tfdist.strategies._schedules`) is chosen here and
    fixed when the first training step is traced (:meth:`local_only`). This
    runtime owns the steps not sent yet (``_unsent_steps``; a local-only
    schedule counts its steps in a graph variable, read into it by
    :meth:`_count_local_steps`).
    """

    def __init__(self, config, task, token, variable_filter, policy, single_process: bool = False):
        super().__init__(config, task, token, variable_filter, policy)
        #: When and how steps reach the PS; fixed at the first trace (see :meth:`local_only`).
        self.schedule: Schedule = choose_schedule(config, policy, self.worker_id, single_process)
        self._schedule_fixed = not self.schedule.local_only
        # Async with overlap: a step's row gradients travel while the next steps run (staleness of this
        # worker's own rows by at most MAX_ROW_PUSHES_IN_FLIGHT steps, as other workers' are under async).
        # One process (in-process PS) keeps them in step: its tables train exactly as local embeddings.
        per_step = self.schedule.fallback if isinstance(self.schedule, LocalOnly) else self.schedule
        self.background_row_pushes = per_step.overlapped and not single_process
        #: Local-only: the graph's count of training steps, and how many of them were counted already.
        self._local_steps: tf.Variable | None = None
        self._local_steps_counted = 0
        #: Lone worker: set when its background exchange failed for good (the next step raises).
        self.lone_failed: tf.Variable | None = None
        #: Every-k and auto: how many coming training steps stay local without running Python (the graph counts
        #: them down, and up in ``_local_steps``; set after each step that ran Python), and the statistics
        #: such a step reports (the last exchange's). See :meth:`_holds_in_graph`.
        self._hold: tf.Variable | None = None
        self._skip_begin: tf.Variable | None = None
        self._held_stats: tf.Variable | None = None
        self._graph_holds = False  # a traced training step reads ``_hold``
        if self.schedule.local_only or self.schedule.may_hold:
            with tf.init_scope():
                self._local_steps = tf.Variable(0, dtype=tf.int64, trainable=False, name="tfdist_local_steps")
                if isinstance(self.schedule, LoneWorker):
                    self.lone_failed = tf.Variable(False, trainable=False, name="tfdist_lone_exchange_failed")
                if not self.schedule.local_only:
                    self._hold = tf.Variable(0, dtype=tf.int64, trainable=False, name="tfdist_steps_to_hold")
                    # The same count for the begin op of Keras's training steps (build_begin): their begins are
                    # skipped while it is above 0, the held steps' ends while ``_hold`` is.
                    self._skip_begin = tf.Variable(0, dtype=tf.int64, trainable=False, name="tfdist_begins_to_skip")
                    self._held_stats = tf.Variable(self.step_stats(), trainable=False, name="tfdist_held_stats")
        # Under ASP nothing waits for anyone: time blocked on the PS is this worker's own exchange.
        self.blocked_time_waits_for_peers = not (policy.refresh_every_step and policy.staleness == float("inf"))
        self._unsent_steps = 0
        # Steps held back are sent before a local write, so the two never travel as one update (and
        # pull(keep_local_writes=False) can drop the write and keep the steps).
        self._flushing_for_write = False
        self.registry.before_local_write = self._flush_before_local_write
        #: While a step built to fold in its graph ends: the corrections its outputs carry (see :meth:`fold`).
        self._graph_fold: dict[str, np.ndarray] | None = None

    def _new_session(self, *args, **kwargs) -> WorkerSession:
        return UpdateSession(*args, staleness=self.policy.staleness,
                             refresh_every_step=self.policy.refresh_every_step, **kwargs)

    # -------------------------------------------------------------- schedule
    @property
    def exchange_every(self) -> int:
        return self.schedule.every

    @property
    def overlap(self) -> bool:
        return self.schedule.overlapped

    @property
    def lone_worker(self) -> bool:
        """Whether this worker runs (or, before its first step, will run) the lone-worker schedule."""
        return isinstance(self.schedule, LoneWorker)

    def _lone(self) -> LoneWorker | None:
        """The lone-worker schedule, once fixed as this worker's."""
        return self.schedule if self._schedule_fixed and isinstance(self.schedule, LoneWorker) else None

    @property
    def _local_only(self) -> bool:
        return self._schedule_fixed and self.schedule.local_only

    def local_only(self) -> bool:
        """Whether training steps run without any exchange; fixes the schedule at the first call (a trace).

        A local-only schedule falls back when a step must run Python (tables,
        injected slow-down, warm-up); a lone worker's background exchange
        starts here (if it cannot, no PS yet, the decision waits for the next trace).
        """
        if not self._schedule_fixed:
            eligible = not self._tables and self.slowdown is None and self.lifecycle.warmup_left == 0
            if not eligible:
                self.schedule = self.schedule.fallback
            elif isinstance(self.schedule, LoneWorker):
                self.schedule.start(self)
            self._schedule_fixed = True
            logger.debug("worker %d: exchange schedule %s", self.worker_id, self.schedule)
        return self.schedule.local_only

    def build_local_end_of_step(self) -> tf.Tensor:
        """The end of a local-only training step: counts it; its stats (the job's step is this count).

        The count goes up after the step wrote its variables: a reader that
        sees the count (the lone worker's background exchange, a flush) also
        sees the step's values. Without the order, TensorFlow may count the
        step before its optimizer writes: an exchange then sends part of the
        step and counts all of it, and a flush that finds nothing unsent
        never sends the rest. (An op on each variable's handle orders the
        count after the step's write to it: the function's automatic control
        dependencies chain the ops of one variable in program order. It is
        ``VarIsInitializedOp``, which reads no data: a read would copy a
        variable that sparse updates put in copy-on-read mode, every step.)
        """
        written = _after_writes(self.variables)
        checks = []
        if self.lone_failed is not None:  # a lone worker stops at the step after its background exchange failed
            checks.append(tf.debugging.Assert(tf.logical_not(self.lone_failed.read_value()), [
                "tfdist: this worker's background exchange with the parameter servers failed (the error is in "
                "its log, logger tfdist.strategies._schedules); training stops"]))
        with tf.control_dependencies(written + checks):
            step = tf.cast(self._local_steps.assign_add(1), tf.float32)
        return tf.stack([step, 0.0, 0.0, -1.0, 0.0])

    def _recover(self, error: PSUnavailableError, as_reader: bool) -> None:
        """A lone worker keeps its values: it is the job's only writer, so they are the job's state.

        The PS tasks answer again (one that restarted restored its checkpoint,
        or was initialised again from these values); the session's base is
        now their state, so the next exchange sends ``local - theirs`` and
        they hold this worker's state again: no step is lost, whatever the
        checkpoint held. (Other workers load the job's values instead.)
        """
        lone = self._lone()
        if lone is None:
            return super()._recover(error, as_reader)
        self.session.recover(error, self.registry.values(), as_reader=as_reader)
        lone.resync = True

    def _before_join(self) -> None:
        corrections = self._recovering(self.session.land)  # an overlapped exchange in flight lands first
        if corrections:
            self.registry.add(corrections)

    def _stop_background_exchange(self) -> None:
        if isinstance(self.schedule, LoneWorker):
            self.schedule.stop(join_timeout_s=float(self.config.ps.rpc_timeout_s) + 5.0)

    def _count_local_steps(self, done: int | None = None) -> None:
        """Local-only: the steps the graph counted since the last look become unsent steps.

        ``done``: the graph's count, when the step passed it in (its end-of-step ``py_function``'s input: an eager
        read of the variable from inside the ``py_function`` cost ~1 ms per call on a 2-core host).
        """
        if self._local_steps is None or not (self._local_only or self._graph_holds):
            return
        done = int(self._local_steps.numpy()) if done is None else int(done)
        added = max(0, done - self._local_steps_counted)  # (an older read than the last one adds none)
        self._unsent_steps += added
        self._local_steps_counted = max(done, self._local_steps_counted)
        if added and self._skip_begin is not None:
            note_progress(added)  # held steps may have skipped their begin op, which counts steps for the watchdog

    def _leave(self) -> None:
        super()._leave()
        if self._skip_begin is not None and self.lifecycle.left:
            self._skip_begin.assign(0)  # a later fit's first step runs its begin op: the worker rejoins there

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

    # ----------------------------------------------------------------- steps
    def _holds_in_graph(self) -> bool:
        """Whether a traced training step may stay local without Python (every-k and auto, steps without tables,
        injected slow-down, warm-up or elastic membership: what a local-only step also needs)."""
        return (self._hold is not None and not self._tables and self.slowdown is None
                and self.lifecycle.warmup_left == 0 and not self.config.elastic.enabled)

    def _steps_to_hold(self) -> int:
        """After a step that ran Python: how many steps after it the schedule holds (they stay local in the graph)."""
        return max(0, self.schedule.every - 1 - self._unsent_steps) if self.session is not None else 0

    def _set_hold(self) -> None:
        """:meth:`_steps_to_hold` into ``_hold`` now (a step built to hold assigns its output in its graph instead)."""
        if self._graph_holds:
            self._hold.assign(self._steps_to_hold())

    def build_begin(self, begin, keras_train_step: bool) -> tuple[tf.Tensor, bool]:
        """Every-k and auto: Keras's training step skips its begin ``py_function`` when its schedule holds it.

        A held step needs nothing of :meth:`begin_step` (async: no pull, no wait; the holding conditions,
        :meth:`_holds_in_graph`, exclude tables, slow-down, warm-up and elastic membership), and the hop
        itself costs ~0.3-0.5 ms of CPU. The count of begins to skip (``_skip_begin``) is set with
        ``_hold`` by the step that ran Python and counted down by the begin op itself, so a step that does not
        end the way it was guessed (a ``train_step`` that trains nothing) skips at most that many begins. Only
        Keras's ``train_step`` (known before the step is traced); any other step (evaluation, prediction, a
        custom loop's) always runs its begin: an evaluation must load the job's values.
        """
        if not (keras_train_step and self._skip_begin is not None and self._holds_in_graph()):
            return super().build_begin(begin, keras_train_step)
        skip = self._skip_begin

        def skipped():
            with tf.control_dependencies([skip.assign_sub(1)]):
                return tf.constant(0, tf.int64)

        def run():
            return tf.py_function(begin, [], tf.int64, name="tfdist_begin_step")

        return tf.cond(skip.read_value() > 0, skipped, run), True

    def build_end_of_step(self, result, begin_skips: bool = False) -> tf.Tensor:
        """The end of a training step: the end-of-step ``py_function`` (see :meth:`_build_python_end_of_step`).

        Every-k and auto: a step the schedule holds skips it (``_hold`` > 0, set from Python after the step
        before): the graph counts the step, as a local-only step, and reports the statistics of the last
        exchange. The next step that runs Python takes the steps counted so (:meth:`_count_local_steps`).
        ``begin_skips``: the step's begin op was built by :meth:`build_begin` to skip the same steps (the
        step that runs Python sets both counts).
        """
        if not self._holds_in_graph():
            return self._build_python_end_of_step(result)
        hold, count, held_stats = self._hold, self._local_steps, self._held_stats
        self._graph_holds = True

        def held():
            with tf.control_dependencies(_after_writes(self.variables)):  # counted after the step's writes
                counted = [count.assign_add(1), hold.assign_sub(1)]
            with tf.control_dependencies(counted):
                return held_stats.read_value()

        def python():
            # The graph's count of held steps goes in, the steps to hold after this one come out: no eager
            # variable op inside the py_function.
            stats, steps_to_hold = self._build_python_end_of_step(result, held_count=count.read_value())
            writes = [held_stats.assign(stats), hold.assign(steps_to_hold)]
            if begin_skips:
                writes.append(self._skip_begin.assign(steps_to_hold))
            with tf.control_dependencies(writes):
                return tf.identity(stats)

        return tf.cond(hold.read_value() > 0, held, python)

    def _build_python_end_of_step(self, result, held_count: tf.Tensor | None = None):
        """The end-of-step ``py_function`` and, for an overlapped exchange, the fold of its corrections.

        Returns the step's statistics; with ``held_count`` (the graph's count of held steps, a step built to hold,
        :meth:`build_end_of_step`) also the number of steps to hold after this one, for the graph to assign.
        """
        loss, has_loss = _loss_input(result)
        variables = list(self.variables)
        inputs = [v.read_value() for v in variables] + [loss]
        holds = held_count is not None
        if holds:
            inputs.append(held_count)
        # Overlapped: the corrections of the exchange that just landed leave the py_function as outputs
        # and the step's graph adds them (see fold); other schedules write inside it (VariableRegistry).
        # One output for all of them when the variables share a dtype (a py_function's outputs and the
        # graph's conditions cost per tensor, every step): a flat buffer the exchange wrote them into.
        fold_in_graph = self.schedule.overlapped and bool(variables)
        keys = [spec.key for spec in self.specs[:len(variables)]]
        layout = _flat_layout(keys, variables) if fold_in_graph else None

        def end(*tensors):
            if holds:
                *tensors, counted = tensors
                self._count_local_steps(counted.numpy())  # steps the graph held since the last step that ran Python
            else:
                self._count_local_steps()
            held = self._holds_next_step()  # the step stays local: its values are not needed
            current = None if held else [np.asarray(t) for t in tensors[:-1]]
            self._graph_fold = {} if fold_in_graph else None
            if layout is not None and self.session is not None:
                self.session.flat_layout = layout  # the exchange sent now writes its corrections so
            try:
                self.end_step(current, float(tensors[-1].numpy()) if has_loss and not held else None)
                corrections = self._graph_fold
            finally:
                self._graph_fold = None
            head = [self.step_stats()] + ([np.int64(self._steps_to_hold())] if holds else [])
            if not holds:
                self._set_hold()  # (a step built without holding, in a job whose other steps hold)
            if not fold_in_graph:
                return head
            if layout is not None:
                return [*head, self._fold_flat_output(corrections, layout, variables)]
            return [*head, *self._fold_outputs(corrections, keys, variables)]

        # Outputs: the statistics, the steps to hold (with held_count), then the corrections (overlapped).
        head = [tf.float32] + ([tf.int64] if holds else [])
        folded = [variables[0].dtype] if layout is not None else [v.dtype for v in variables] if fold_in_graph else []
        outputs = tf.py_function(end, inputs, head + folded, name="tfdist_end_update_step")
        if layout is not None:
            folds = [_fold_flat(variables, layout, outputs[-1])]
        else:
            folds = [_fold(var, correction) for var, correction in zip(variables, outputs[len(head):])]
        with tf.control_dependencies(folds):
            stats = tf.identity(outputs[0])
        return (stats, outputs[1]) if holds else stats

    def fold(self, corrections: dict[str, np.ndarray]) -> None:
        """Adds an overlapped exchange's corrections to the variables: now, or in the step's graph.

        Inside a training step built to fold in its graph, the corrections are
        left for :meth:`build_end_of_step`'s outputs: the step's own ops add
        them after the py_function returns (no eager op per variable from
        Python). Anywhere else (a join, a pull) they are added now.
        """
        if self._graph_fold is not None:
            # The step's only fold keeps the exchange's Corrections (its flat buffer goes to the graph as is);
            # a second one makes a plain dict of both (no flat buffer holds them).
            self._graph_fold = corrections if not self._graph_fold else {**self._graph_fold, **corrections}
        else:
            self.registry.add(corrections)

    def _fold_outputs(self, corrections: dict[str, np.ndarray], keys: list[str],
                      variables: list[tf.Variable]) -> list:
        """Per traced variable its correction (or an empty array: nothing to add); the others added now.

        Variables that joined after the step was traced, and any variable
        when layers derive state from their variables (their ``finalize_state``
        must see the new values), are added eagerly as :meth:`fold` would.
        """
        traced = set(keys)
        if corrections and self.registry.derived.layers:
            self.registry.add(corrections)
            corrections = {}
        later = {k: c for k, c in corrections.items() if k not in traced}
        if later:
            self.registry.add(later)
        return [_output(corrections.get(key), var) for key, var in zip(keys, variables)]

    def _fold_flat_output(self, corrections: dict[str, np.ndarray], layout: FlatLayout,
                          variables: list[tf.Variable]):
        """The flat output of a step built with ``layout``: every traced variable's correction, or empty.

        The exchange's own buffer when it was written with this layout (no
        copy); else the corrections are packed into a new one. Corrections of
        variables outside the layout (joined after the trace), and all of
        them when layers derive state from their variables, are added now.
        """
        empty = np.zeros((0,), layout.dtype)
        if corrections and self.registry.derived.layers:
            self.registry.add(corrections)
            return empty
        traced = set(layout.keys)
        later = {k: c for k, c in corrections.items() if k not in traced}
        if later:
            self.registry.add(later)
        if len(later) == len(corrections):
            return empty
        if isinstance(corrections, Corrections) and corrections.flat is not None and corrections.layout == layout:
            packed = corrections.flat  # (its slots hold the traced keys' corrections; later ones were added above)
        else:
            packed = layout.pack(corrections)
        if aliasable(packed, variables[0]):
            return tf.experimental.dlpack.from_dlpack(packed.__dlpack__())
        return packed

    def _holds_next_step(self) -> bool:
        """Whether the step ending now will stay local (``exchange_every``), so ``end_step`` needs no values."""
        return self.in_warmup or (self.session is not None and self.schedule.holds(self._unsent_steps))

    def end_step(self, current: list[np.ndarray] | None, loss: float | None) -> None:
        """After a training step: count it, and send it (and earlier held-back ones) when the schedule says.

        ``current``: the variables' values after the step; may be ``None``
        when :meth:`_holds_next_step` said the step stays local.
        """
        self._require_training_task()
        if self.in_warmup:  # not part of the job yet: keep the local update, send nothing
            return
        if self.schedule.holds(self._unsent_steps):  # exchange_every: this step stays local
            self._unsent_steps += 1
            return
        steps, self._unsent_steps = self._unsent_steps + 1, 0
        values = self.registry.keyed(current) if current is not None else self.registry.values()
        with self._blocked():
            self.schedule.exchange(self, values, loss, steps)

    def flush_local_steps(self) -> None:
        """Sends the local steps the schedule held back (every-k, local-only); loads fresh values.

        Row pushes and an overlapped exchange still in flight are waited for first (every read of the PS
        after this sees them).
        """
        self.wait_row_pushes()
        with self._exchange_lock:
            lone = self._lone()
            if lone is not None and lone.error is not None and not self.lifecycle.closed:
                raise lone.error  # (closing tries to send the last steps all the same)
            self._count_local_steps()
            if self.session is None or self.lifecycle.reader:
                return
            if self.registry.pending:
                self.join_new_variables()  # the steps held back may have trained them
            if self.lifecycle.left and self._unsent_steps and self._local_only:
                self.rejoin()  # local-only steps of a later fit after leave(): they take part in the job again
            if self.lifecycle.left:
                return
            # An exchange still in flight (overlapped, a lone worker's background one) lands first: every read of
            # the PS after this sees the steps it carries, though none is left unsent here.
            corrections = self._recovering(self.session.land)
            if corrections:
                self.registry.add(corrections)
            if lone is not None and lone.resync and not self._unsent_steps:
                self._unsent_steps = 1  # the PS tasks must get this lone worker's state back: a push counts a batch
            if not self._unsent_steps:
                return
            steps, self._unsent_steps = self._unsent_steps, 0
            for _ in range(2):  # a lone worker's push lost with a PS task is sent again once it recovered
                recoveries = self._recoveries()
                send_blocking(self, self.registry.values(), None, steps)  # waits for any exchange in flight first
                if self._recoveries() == recoveries or self._lone() is None:
                    if lone is not None:
                        lone.resync = False
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


def _output(correction: np.ndarray | None, var: tf.Variable):
    """A py_function output: the correction (without a copy when it may be aliased), or an empty array."""
    if correction is None:
        return np.zeros((0,), var.dtype.as_numpy_dtype)
    if aliasable(correction, var):
        return tf.experimental.dlpack.from_dlpack(correction.__dlpack__())
    return correction


def _flat_layout(keys: list[str], variables: list[tf.Variable]) -> FlatLayout | None:
    """The flat layout of a step's corrections: when its variables share one floating dtype and known shapes."""
    dtypes = {v.dtype for v in variables}
    if len(dtypes) != 1 or not all(v.shape.is_fully_defined() for v in variables):
        return None
    dtype = variables[0].dtype
    if not dtype.is_floating:
        return None
    return FlatLayout(tuple(keys), tuple(tuple(v.shape.as_list()) for v in variables), np.dtype(dtype.as_numpy_dtype))


def _fold_flat(variables: list[tf.Variable], layout: FlatLayout, flat: tf.Tensor) -> tf.Operation:
    """In the step's graph: each variable ``+=`` its slot of ``flat``, unless ``flat`` is empty (nothing landed)."""

    def add():
        ops = []
        for var, shape, (start, size) in zip(variables, layout.shapes, layout.slots):
            piece = tf.reshape(tf.slice(flat, [start], [size]), shape)
            ops.append(gen_resource_variable_ops.assign_add_variable_op(var.handle, piece))
        return tf.group(ops)

    return tf.cond(tf.size(flat) > 0, add, tf.no_op)


def _fold(var: tf.Variable, correction: tf.Tensor) -> tf.Operation:
    """In the step's graph: ``var += correction`` unless the correction is empty (nothing landed for it)."""

    def add():
        return tf.group(gen_resource_variable_ops.assign_add_variable_op(
            var.handle, tf.reshape(correction, tf.shape(var))))

    return tf.cond(tf.size(correction) > 0, add, tf.no_op)



def _after_writes(variables) -> list:
    """An op per variable that runs after the step's write to it and reads no data (see build_local_end_of_step)."""
    return [gen_resource_variable_ops.var_is_initialized_op(v.handle) if _plain_handle(v) else v.read_value()
            for v in variables]


def _plain_handle(var) -> bool:
    """Whether ``var`` has a resource handle an op may take as is (a plain resource variable)."""
    handle = getattr(var, "handle", None)
    return isinstance(handle, tf.Tensor) and handle.dtype == tf.resource

def _loss_input(result) -> tuple[tf.Tensor, bool]:
    """The step's scalar loss as a float32 input of the end-of-step py_function (0 when there is none)."""
    loss = result.get("loss") if isinstance(result, dict) else None
    if loss is None:
        return tf.constant(0.0), False
    return tf.cast(tf.reshape(loss, []), tf.float32), True
