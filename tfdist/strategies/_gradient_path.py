"""The gradient path's worker side (BSP, SyncReplicas): gradients exchanged inside the step.

The vertical slice of the gradient path is this module (the worker runtime),
:class:`~tfdist.ps.gradient_session.GradientSession` (its requests and the state
snapshot) and :mod:`tfdist.ps._gradient_requests` (the store's handlers).
The all-reduce hook of the step sends the step's gradients and returns the
step's aggregate; every worker applies it with its own optimizer, and the
state snapshot (variables and optimizer slots) is uploaded or reloaded at the
step's end. The job's epoch logs are shared (:mod:`tfdist.strategies._job_logs`).
"""

from __future__ import annotations

import logging
from typing import Any, Mapping

import numpy as np
import tensorflow as tf

from tfdist.errors import PSUnavailableError
from tfdist.ps.gradient_session import GradientSession
from tfdist.ps.session import WorkerSession
from tfdist.strategies._job_logs import job_epoch_logs
from tfdist.strategies._ps_runtime import STAT_NAMES, PSRuntime
from tfdist.strategies._variable_registry import is_optimizer_variable

__all__ = ["GradientPathRuntime"]

logger = logging.getLogger(__name__)


class GradientPathRuntime(PSRuntime):
    """BSP, SyncReplicas: gradients are exchanged inside the step; every worker applies the aggregate.

    The optimizer's variables travel too (the state snapshot a lagging
    worker reloads), so :meth:`wants` takes them.
    """

    def __init__(self, config, task, token, variable_filter, policy, single_process: bool = False):
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
            not self.registry.derived.creating_mirror() and is_optimizer_variable(name, kwargs))

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

    def build_end_of_step(self, result, begin_skips: bool = False) -> tf.Tensor:
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
