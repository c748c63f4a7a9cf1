"""``tfdist.AllReduceStrategy``: synchronous all-reduce over TF collective ops that leaves stragglers out.

Every worker process is one replica and runs the user's unchanged script
(between-graph replication, like Horovod). Each training step all-reduces the
gradients of the workers that take part in it with
``tf.raw_ops.CollectiveReduceV2`` — no parameter server, no
MultiWorkerMirroredStrategy — and every member applies the same mean gradient
with its own Keras optimizer, so members stay bit-identical.

With :class:`tfdist.callbacks.StragglerDetector` in ``fit``'s callbacks the
strategy does **partial all-reduce** (the DPAR idea the seed paper builds on,
``shared/seeds/000_*`` §2.3 and §4.2): a worker the detector flags is left out
of the reduction (the remaining members use a collective group of their own,
keyed by the member set), skips its steps — no compute, no update, no waiting —
and takes part again in the first ``profile_iterations`` of every epoch, when
recovery can be seen. When it is re-admitted it first receives the weights and
optimizer state of the lowest-id member (``CollectiveBcastSendV2/RecvV2``), so
it rejoins identical. Membership changes only at iteration boundaries, decided
by the callback from verdicts that are identical on every worker.

Loss scaling: Keras divides each worker's loss by ``num_replicas_in_sync``
(= the number of workers N) and SUMs the gradients. With all N members the
sum is the mean gradient; with a subset S of members the sum is rescaled by
N/|S|, so **the update is always the mean gradient of the members**
(the effective learning rate does not change when workers are left out).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Any

import numpy as np
import tensorflow as tf

from tfdist import constants
from tfdist._tf_compat import (StrategyBase, in_xla_compilation, is_loss_scale_check, keras_variable_owner,
                               refuse_legacy_keras)
from tfdist.strategies._keras_iterators import install as install_iterator_release
from tfdist.strategies._worker_files import install as install_worker_files
from tfdist.collective import (DEFAULT_TIMEOUT_S, PURPOSE_GRADIENTS, PURPOSE_REDUCE, CollectiveError,
                               CollectiveSetupError, WorkerGroup, get_worker_group, init_worker_group)
from tfdist.collective.group import _training_tasks
from tfdist.data.symbolic_build import build_from_element_spec
from tfdist.errors import ConfigError
from tfdist.strategies._contract import barrier_code, cluster_resolver, is_chief_task, reduce_over_axis
from tfdist.strategies._derived_state import DerivedStateLayers
from tfdist.strategies._input_context import with_input_context, worker_input_context
from tfdist.strategies._steps import StepExtended
from tfdist.strategies._stuck import note_progress, start_stuck_task_watchdog
from tfdist.straggler.membership import Participation, StragglerEngine
from tfdist.slowdown import ENV_SLOWDOWN, Slowdown, slowdown_from_env

__all__ = ["AllReduceStrategy"]

logger = logging.getLogger(__name__)

_SYNCED_AGGREGATIONS = (tf.VariableAggregation.NONE, tf.VariableAggregation.MEAN,
                        tf.VariableAggregation.ONLY_FIRST_REPLICA)


def _is_training_state(name: str, kwargs: dict) -> bool:
    """Model weights, non-trainable layer state and optimizer variables (not metrics, not seeds)."""
    if "seed_generator" in name:
        return False
    if kwargs.get("colocate_with") is not None:  # optimizer slots
        return True
    return kwargs.get("aggregation", tf.VariableAggregation.NONE) in _SYNCED_AGGREGATIONS


class _AllReduceRuntime(StragglerEngine):
    """Host-side state read by the graph (through ``tf.py_function``) and driven by the callback."""

    def __init__(self, group: WorkerGroup, exclude_stragglers: bool, slowdown: Any, timeout_s: float):
        self.group = group
        self.size = group.size
        self.worker_id = group.worker_id
        self.exclude_stragglers = exclude_stragglers
        self.slowdown = slowdown
        self.timeout_s = float(timeout_s)
        self.members: frozenset[int] = frozenset(range(self.size))
        self.variables: list[tf.Variable] = []
        #: Layers computing with tensors derived from their variables (Normalization): kept in step after a resync.
        self.derived = DerivedStateLayers()
        self.step = 0  # training steps begun, members or not (the same count on every worker)
        #: ``variables[:synced]`` started from worker 0's values; the rest are copied before the next training step.
        self.synced = 0
        self.stats = {"steps": 0, "skipped": 0, "partial_steps": 0, "resyncs": 0, "resync_s": 0.0, "wait_s": 0.0}
        self._lock = threading.Lock()
        self._begun = 0.0
        self._reduce_start: float | None = None
        self._wait = 0.0
        self._recent: list[float] = []

    @property
    def last_wait_s(self) -> float:
        return self._wait

    # ----------------------------------------------------------- graph side
    def begin_step(self, training: bool) -> bool:
        """Runs at the start of every step; returns whether this worker computes it."""
        if not training:
            return True
        step, self.step = self.step, self.step + 1
        new, self.synced = self.variables[self.synced:], len(self.variables)
        if new and self.size > 1 and len(self.members) > 1 and self.worker_id in self.members:
            # Every member starts each variable from worker 0's (the lowest member's) value before its first
            # training step, as the PS strategies start from the chief's: weights it loaded or statistics it
            # adapted alone reach everyone, the workers need not seed their initialisers alike, and a model
            # (or optimizer) built after the first step is copied before its own first step. Every worker
            # counts the variables alike (a left-out worker gets everything when it is re-admitted).
            source = min(self.members)
            self.resync(source, self.members - {source}, new)
        self._wait = 0.0
        self._reduce_start = None
        if self.worker_id not in self.members:
            self.stats["skipped"] += 1
            return False
        self.stats["steps"] += 1
        if len(self.members) < self.size:
            self.stats["partial_steps"] += 1
        if self.slowdown is not None:  # emulated slowness: part of this step's compute
            compute = sorted(self._recent)[len(self._recent) // 2] if self._recent else 0.0
            pause = self.slowdown.sleep_for(step, compute)
            if pause > 0:
                time.sleep(pause)
        self._begun = time.perf_counter()
        return True

    def reduce_params(self, count: int, timed: bool = True) -> tuple[np.int32, np.int32, np.int32, np.float64]:
        """``(group_size, group_key, first instance_key, scale)`` of this step's gradient all-reduce.

        ``timed``: this is the step's gradient all-reduce (its start ends the step's compute); ``False`` for
        another collective of the step (the loss-scale finiteness vote).
        """
        if timed:
            now = time.perf_counter()
            if self._begun:
                self._recent = (self._recent + [now - self._begun])[-5:]
            self._reduce_start = now
        members = self.members
        if len(members) == 1:
            return np.int32(1), np.int32(0), np.int32(0), np.float64(self.size)
        size, key, instance = self.group.reserve(members, PURPOSE_GRADIENTS, count=count)
        return np.int32(size), np.int32(key), np.int32(instance), np.float64(self.size / size)

    def reduce_done(self) -> np.int64:
        if self._reduce_start is not None:
            self._wait = time.perf_counter() - self._reduce_start
            self.stats["wait_s"] += self._wait
        return np.int64(0)

    # --------------------------------------------------------- engine side
    def begin_iteration(self, participation: Participation) -> None:
        if participation.joined and self.worker_id in (participation.joined | {participation.source}):
            self.resync(participation.source, participation.joined)
        self.members = frozenset(participation.members)

    def resync(self, source: int, joined, variables: list[tf.Variable] | None = None) -> None:
        """Copies the training state (weights, optimizer state; or ``variables``) of ``source`` to ``joined``."""
        start = time.perf_counter()
        group = frozenset(joined) | {source}
        variables = self.variables if variables is None else variables
        by_dtype: dict[str, list[tf.Variable]] = {}
        for v in variables:
            by_dtype.setdefault(v.dtype.name, []).append(v)
        for dtype, variables in sorted(by_dtype.items()):
            sizes = [int(np.prod(v.shape)) for v in variables]
            np_dtype = np.dtype(variables[0].dtype.as_numpy_dtype)
            flat = None
            if self.worker_id == source:
                flat = np.concatenate([np.ravel(v.numpy()) for v in variables]).astype(np_dtype, copy=False)
            values = self.group.broadcast(flat, source, group, shape=(sum(sizes),), dtype=np_dtype,
                                          timeout_s=self.timeout_s)
            if self.worker_id != source:
                offset = 0
                for v, n in zip(variables, sizes):
                    v.assign(values[offset:offset + n].reshape(v.shape))
                    offset += n
        if self.worker_id != source:
            self.derived.refresh()
        self.stats["resyncs"] += 1
        self.stats["resync_s"] += time.perf_counter() - start
        logger.info("worker %d: training state of worker %d copied to %s (%d variables, %.3f s)", self.worker_id,
                    source, sorted(joined), len(variables), time.perf_counter() - start)


class AllReduceExtended(StepExtended):
    """Hooks: gradients all-reduced across the members of each step; non-members skip the step."""

    def __init__(self, container_strategy, runtime: _AllReduceRuntime, device: str = "/cpu:0"):
        super().__init__(container_strategy, device)
        self._runtime = runtime
        self._tracing_training_step = False

    @property
    def _num_replicas_in_sync(self):
        return self._runtime.size

    def _distribute_datasets_from_function(self, dataset_fn, options):
        runtime = self._runtime
        context = worker_input_context(runtime.size, runtime.worker_id, runtime.size)
        return super()._distribute_datasets_from_function(with_input_context(dataset_fn, context), options)

    def _reduce(self, reduce_op, value):
        """``strategy.reduce(op, value, axis=None)``: ``value`` summed (or averaged) over every worker of the job.

        One collective all-reduce over the whole group (left-out stragglers
        too: the script calls it on every worker), in or out of ``tf.function``.
        """
        runtime = self._runtime
        value = tf.convert_to_tensor(value)
        if runtime.size == 1:
            return value
        if value.dtype not in (tf.float16, tf.bfloat16, tf.float32, tf.float64, tf.int32, tf.int64):
            raise TypeError(f"AllReduceStrategy.reduce reduces float and int32/int64 tensors. Received: a tensor of "
                            f"dtype {value.dtype.name}. Cast it first (e.g. tf.cast(value, tf.float32)).")
        group = runtime.group
        size, key, instance = tf.py_function(lambda: [np.int32(x) for x in group.reserve(None, PURPOSE_REDUCE)], [],
                                             [tf.int32, tf.int32, tf.int32], name="tfdist_reduce_params")
        with tf.device(self._device):
            out = tf.raw_ops.CollectiveReduceV2(
                input=value, group_size=size, group_key=key, instance_key=instance, ordering_token=[],
                merge_op="Add", final_op="Div" if reduce_op == tf.distribute.ReduceOp.MEAN else "Id",
                timeout_seconds=runtime.timeout_s)
        return tf.ensure_shape(tf.reshape(out, tf.shape(value)), value.shape)

    def _create_variable(self, next_creator, **kwargs):
        refuse_legacy_keras()
        var = super()._create_variable(next_creator, **kwargs)
        if not self._runtime.derived.creating_mirror() and _is_training_state(str(kwargs.get("name") or ""), kwargs):
            self._runtime.variables.append(var)
            owner = keras_variable_owner()
            if owner is not None:
                self._runtime.derived.track(owner, var)
        return var

    def _batch_reduce_to(self, reduce_op, value_destination_pairs, options):
        self._tracing_training_step = True
        runtime = self._runtime
        dense = [tf.convert_to_tensor(v) for v, _ in value_destination_pairs]  # IndexedSlices travel dense
        if runtime.size == 1 or not dense:
            return super()._batch_reduce_to(reduce_op, value_destination_pairs, options)
        dtypes = sorted({d.dtype.name for d in dense})
        with tf.control_dependencies(dense):  # the gradients are ready: this worker's compute is done
            size, key, instance, scale = tf.py_function(
                lambda: runtime.reduce_params(len(dtypes)), [], [tf.int32, tf.int32, tf.int32, tf.float64],
                name="tfdist_allreduce_params")
        mean = reduce_op == tf.distribute.ReduceOp.MEAN
        out: list[tf.Tensor | None] = [None] * len(dense)
        reduced_all = []
        for j, dtype in enumerate(dtypes):
            idx = [i for i, d in enumerate(dense) if d.dtype.name == dtype]
            flat = tf.concat([tf.reshape(dense[i], [-1]) for i in idx], axis=0)

            def all_reduce(flat=flat, j=j):
                return tf.raw_ops.CollectiveReduceV2(
                    input=flat, group_size=size, group_key=key, instance_key=instance + j, ordering_token=[],
                    merge_op="Add", final_op="Id", timeout_seconds=runtime.timeout_s)

            reduced = tf.cond(size > 1, all_reduce, lambda flat=flat: tf.identity(flat))
            # SUM of loss/N-scaled gradients over the members, rescaled to their mean (N/|S|); MEAN: / |S|
            factor = 1.0 / tf.cast(size, tf.float64) if mean else scale
            reduced = reduced * tf.cast(factor, reduced.dtype)
            reduced_all.append((idx, reduced))
        with tf.control_dependencies([r for _, r in reduced_all]):
            done = tf.py_function(runtime.reduce_done, [], tf.int64, name="tfdist_allreduce_done")
        with tf.control_dependencies([done]):
            for idx, reduced in reduced_all:
                offset = 0
                for i in idx:
                    n = dense[i].shape.num_elements()
                    out[i] = tf.reshape(reduced[offset:offset + n], tf.shape(dense[i]))
                    out[i] = tf.ensure_shape(out[i], dense[i].shape)
                    offset += n
        return out

    def _update(self, var, fn, args, kwargs, group):
        self._tracing_training_step = True
        return super()._update(var, fn, args, kwargs, group)

    def _agree_on_finite(self, finite: tf.Tensor) -> tf.Tensor:
        """``LossScaleOptimizer``'s overflow check, made the members' joint answer (all finite, or none applies).

        Keras checks each replica's own gradients before they are reduced, so workers could disagree on
        whether to apply (and then on which all-reduces exist): one worker's overflow skips the step on all.
        """
        runtime = self._runtime
        size, key, instance, _ = tf.py_function(lambda: runtime.reduce_params(1, timed=False), [],
                                                [tf.int32, tf.int32, tf.int32, tf.float64],
                                                name="tfdist_allreduce_finite_params")
        flag = tf.reshape(tf.cast(finite, tf.float32), [1])

        def vote():
            return tf.raw_ops.CollectiveReduceV2(
                input=flag, group_size=size, group_key=key, instance_key=instance, ordering_token=[],
                merge_op="Min", final_op="Id", timeout_seconds=runtime.timeout_s)

        return tf.reshape(tf.cond(size > 1, vote, lambda: tf.identity(flag)), []) > 0.5

    def _inside_step(self, fn, args, kwargs):
        result = super()._inside_step(fn, args, kwargs)
        if is_loss_scale_check(fn) and self._runtime.size > 1:
            result = self._agree_on_finite(result)
        return result

    def _step(self, fn, args, kwargs):
        if in_xla_compilation():
            raise ConfigError(
                "AllReduceStrategy cannot run a step compiled with XLA: it decides membership in a "
                "tf.py_function, which XLA cannot compile. Received: model.compile(..., jit_compile=True). "
                "Compile with jit_compile=False (or leave it at 'auto')."
            )
        runtime = self._runtime
        trace = {"training": False}  # known once fn has been traced; read when the step runs
        def begin():
            note_progress()
            return runtime.begin_step(trace["training"])

        member = tf.py_function(begin, [], tf.bool, name="tfdist_begin_step")
        member = tf.ensure_shape(member, [])
        self._tracing_training_step = False
        traced: dict[str, Any] = {}

        def run():
            result = self._on_replica(fn, args, kwargs)
            traced["result"] = result
            leaves = tf.nest.flatten(result)
            traced["tensor"] = [tf.is_tensor(t) and not isinstance(t, tf.Variable) for t in leaves]
            # Only tensors pass through the cond (``None``, Python values and variables are returned as traced);
            # the first output keeps the cond's output list non-empty.
            return [tf.constant(True)] + [t for t, is_t in zip(leaves, traced["tensor"]) if is_t]

        def skip():  # a worker left out of this step computes nothing (the values are placeholders)
            # Unknown dimensions (a predict batch) become 0: the branches' shapes merge to the unknown one.
            leaves = tf.nest.flatten(traced["result"])
            return [tf.constant(False)] + [tf.zeros([0 if d is None else d for d in t.shape.as_list()], t.dtype)
                                           for t, is_t in zip(leaves, traced["tensor"]) if is_t]

        outputs = iter(tf.cond(member, run, skip)[1:])
        trace["training"] = self._tracing_training_step
        leaves = [next(outputs) if is_t else t
                  for t, is_t in zip(tf.nest.flatten(traced["result"]), traced["tensor"])]
        return tf.nest.pack_sequence_as(traced["result"], leaves)


class AllReduceStrategy(StrategyBase):
    """Synchronous data-parallel training over TF collective ops; stragglers are left out.

    Every worker process is a replica. Call
    :func:`tfdist.collective.init_worker_group` first thing in the script (it
    sets up TF's collective runtime, which must happen before any TF op),
    then build the strategy. Add :class:`tfdist.callbacks.StragglerDetector`
    to ``fit`` to leave detected stragglers out of the all-reduce and re-admit
    them (resynchronised) when they recover.

    Example:

    ```python
    import tfdist.collective
    tfdist.collective.init_worker_group()            # FIRST: before any TF op (cluster from TF_CONFIG)

    import keras, tfdist
    strategy = tfdist.AllReduceStrategy()
    with strategy.scope():
        model = build_model()
        model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    model.fit(my_shard_of_the_data, epochs=10, steps_per_epoch=100,
              callbacks=[tfdist.callbacks.StragglerDetector()])
    ```

    Each worker feeds its own shard (``distribute_datasets_from_function``
    gives ``fn`` one input pipeline per worker and ``num_replicas_in_sync``
    = N); every worker must run the same number of steps per epoch (pass
    ``steps_per_epoch``). ``num_replicas_in_sync`` is
    the number of workers N; the update of every step is the mean gradient
    of the workers that take part in it.

    A worker left out of a step skips it entirely (its batch is not used,
    its per-batch logs show zeros for that step; epoch logs are its metrics
    over the steps it ran). Every collective has ``timeout_s``: a dead peer
    makes ``fit`` raise a TF ``UnavailableError`` at once, a hung one a
    ``DeadlineExceededError`` after ``timeout_s``
    (:meth:`translate_error` turns either into a
    :class:`tfdist.collective.CollectiveError` naming the peer).

    Args:
        group: The :class:`tfdist.collective.WorkerGroup`. Defaults to the one
            :func:`tfdist.collective.init_worker_group` set up. In a job of
            several workers whose script did not set one up, the strategy
            joins the group itself, which TF allows only before its first op:
            otherwise it raises :class:`tfdist.collective.CollectiveSetupError`
            saying so (never trains alone). Without a cluster (no
            ``TF_CONFIG``) the strategy trains as a single worker.
        exclude_stragglers: Leave the workers the detector flags out of the
            all-reduce. ``False`` gives plain synchronous training (the
            detector still detects). Defaults to ``True``.
        timeout_s: Timeout of every collective (gradient all-reduce,
            re-admission broadcast). Defaults to the group's timeout (30 s).
        slowdown: Emulated slowness of this worker (tests, benchmarks): a
            :class:`tfdist.slowdown.Slowdown` or any object with
            ``sleep_for(step, compute_s) -> seconds``, slept at the start of
            every step this worker computes. Defaults to this task's entry of
            ``TFDIST_SLOWDOWN``, if any.
    """

    def __init__(
        self,
        group: WorkerGroup | None = None,
        *,
        exclude_stragglers: bool = True,
        timeout_s: float | None = None,
        slowdown: Slowdown | Any | None = None,
    ):
        group = group or get_worker_group()
        if group is None and _training_tasks() > 1:
            # The job has several workers (TF_CONFIG) but the script did not join their group: join it now
            # (possible while TF has run no op; otherwise a CollectiveSetupError says to call
            # tfdist.collective.init_worker_group() first). Training alone here would be silently wrong.
            group = init_worker_group()
        if group is None:
            from tfdist.collective.group import WorkerGroup as _Group
            from tfdist.collective.membership import resolve_group

            group = _Group(resolve_group({"worker": ["127.0.0.1:1"]}, "worker", 0), enabled=False)
            logger.info("AllReduceStrategy: no worker group (no TF_CONFIG): training as a single worker")
        if timeout_s is not None and (isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float))
                                      or timeout_s <= 0):
            raise ValueError(f"`timeout_s` must be a positive number of seconds. Received: timeout_s={timeout_s!r}.")
        if group.size > 24:
            raise CollectiveSetupError(
                f"AllReduceStrategy supports at most 24 workers (one collective group per member set). "
                f"Received: a group of {group.size} workers."
            )
        if slowdown is None:
            member = group.spec.me
            slowdown = slowdown_from_env(f"{member.job}:{member.index}")
            if slowdown is not None:
                logger.warning("%s:%d is slowed down on purpose (%s): %s", member.job, member.index, ENV_SLOWDOWN,
                               slowdown)
        self._runtime = _AllReduceRuntime(group, bool(exclude_stragglers), slowdown,
                                          timeout_s if timeout_s is not None else group.timeout_s or DEFAULT_TIMEOUT_S)
        super().__init__(AllReduceExtended(self, self._runtime))
        install_worker_files()  # the stock callbacks' files: the chief's are the job's (tfdist.strategies._worker_files)
        install_iterator_release()  # fit's tf.data iterators freed when it returns (tfdist.strategies._keras_iterators)
        me = group.spec.me
        self._chief = is_chief_task(group.spec.jobs(), me.job, me.index)
        self.extended.set_job(group.worker_id, self._chief, cluster_resolver(group.spec.jobs(), me.job, me.index),
                              (group.size, group.worker_id))
        build_from_element_spec(self)  # no throwaway iterator in Keras's build (a SIGSEGV in TF 2.21 at times)
        # A launched task of a job: a hang inside fit ends the task with its stacks, not never (a program that
        # builds groups itself, e.g. a test, is not a task and keeps its process to itself).
        if group.size > 1 and (os.environ.get(constants.ENV_TF_CONFIG) or os.environ.get(constants.ENV_CONFIG)):
            start_stuck_task_watchdog()
        logger.info("AllReduceStrategy: worker %d of %d, exclude_stragglers=%s, timeout_s=%g, slowdown=%s",
                    group.worker_id, group.size, exclude_stragglers, self._runtime.timeout_s, slowdown)

    @property
    def straggler_engine(self) -> StragglerEngine:
        """What :class:`tfdist.callbacks.StragglerDetector` drives (found through ``model.distribute_strategy``)."""
        return self._runtime

    @property
    def is_chief(self) -> bool:
        """True on the task that should save models and write summaries (``chief``, else worker 0)."""
        return self._chief

    def reduce(self, reduce_op, value, axis=None):
        """``value`` reduced across the job's workers (and over ``axis``), as under MultiWorkerMirroredStrategy.

        Every worker must call it, in the same order as its other collectives
        (it is one all-reduce over every worker, bounded by ``timeout_s``).
        Works in and out of ``tf.function``.

        Args:
            reduce_op: ``"SUM"``/``"MEAN"`` or a ``tf.distribute.ReduceOp``.
            value: This worker's value (what ``strategy.run`` returned).
            axis: Also reduce over this dimension of ``value`` (e.g. the
                batch); a MEAN then divides by the job's number of elements.
                Defaults to ``None``: across workers only.
        """
        return reduce_over_axis(self.extended._reduce, reduce_op, value, axis)  # pylint: disable=protected-access

    def barrier(self, name: str, timeout_s: float | None = None) -> None:
        """Waits until every worker of the job reached the barrier ``name`` (a collective, bounded).

        For scripts that save on the chief and load everywhere:

        ```python
        if strategy.is_chief:
            model.save(path)
        strategy.barrier("saved")
        model = keras.models.load_model(path)
        ```

        Args:
            name: The barrier's name: every worker must wait at the same
                barriers in the same order (a different name raises).
            timeout_s: How long to wait. Defaults to the strategy's ``timeout_s``.

        Raises:
            tfdist.collective.CollectiveTimeoutError: A worker did not arrive in time.
            tfdist.collective.CollectiveError: Workers waited at barriers of different names.
        """
        code = barrier_code(name)
        codes = self._runtime.group.all_gather([float(code)], timeout_s=timeout_s or self._runtime.timeout_s)
        if any(int(c) != code for c in codes[:, 0]):
            raise CollectiveError(
                f"Worker {self.worker_id} waited at barrier {name!r} while other workers waited at other barriers "
                f"(name codes {[int(c) for c in codes[:, 0]]}; this one is {code}). Every worker must call "
                "strategy.barrier with the same names in the same order.")

    @property
    def last_step_wait_seconds(self) -> float:
        """Seconds the last training step waited in the gradient all-reduce (for the peers).

        :class:`tfdist.callbacks.StragglerDetector` subtracts it from the
        step's time, so each worker's time is its own compute."""
        return self._runtime.last_wait_s

    @property
    def exclude_stragglers(self) -> bool:
        """Whether detected stragglers are left out (settable between ``fit`` calls, same on every worker)."""
        return self._runtime.exclude_stragglers

    @exclude_stragglers.setter
    def exclude_stragglers(self, value: bool) -> None:
        self._runtime.exclude_stragglers = bool(value)

    @property
    def slowdown(self):
        """The emulated slowness of this worker (settable between ``fit`` calls), or ``None``."""
        return self._runtime.slowdown

    @slowdown.setter
    def slowdown(self, value) -> None:
        self._runtime.slowdown = value

    @property
    def worker_id(self) -> int:
        return self._runtime.worker_id

    @property
    def num_workers(self) -> int:
        return self._runtime.size

    @property
    def members(self) -> frozenset[int]:
        """Workers taking part in the current step."""
        return self._runtime.members

    @property
    def stats(self) -> dict:
        """This worker's counters: steps computed, skipped, partial, resyncs, seconds waiting in all-reduces."""
        return dict(self._runtime.stats)

    def set_members(self, members, source: int | None = None) -> None:
        """Sets who takes part from the next step on, without a detector.

        Call it identically on every worker between steps (e.g. from your own
        callback's ``on_train_batch_begin``). Workers added to the members
        first copy the training state of ``source`` (defaults to the lowest-id
        current member that stays).
        """
        members = frozenset(int(m) for m in members)
        if not members or not members <= frozenset(range(self._runtime.size)):
            raise ValueError(f"`members` must be a non-empty set of worker ids in 0..{self._runtime.size - 1}. "
                             f"Received: members={sorted(members)!r}.")
        previous = self._runtime.members
        joined = members - previous
        if joined and source is None:
            kept = sorted(previous & members)
            if not kept:
                raise ValueError("No current member stays to copy the training state from; pass `source=`.")
            source = kept[0]
        self._runtime.begin_iteration(Participation(step=self._runtime.step, members=members, joined=joined,
                                                    left=previous - members, source=source if joined else None))

    def translate_error(self, error: BaseException):
        """A TF error raised by ``fit`` (dead or hung peer) as a :class:`tfdist.collective.CollectiveError`."""
        return self._runtime.group.translate(error, "gradient all-reduce")

    def training_state_variables(self) -> list[tf.Variable]:
        """The variables copied to a re-admitted worker, in creation order (weights, optimizer state)."""
        return list(self._runtime.variables)
