"""The variables a parameter-server worker keeps on the PS: their keys, specs, and the one way values reach them.

:class:`VariableRegistry` is the worker side's owner of the set of shared
variables (docs/architecture.md): keys in creation order with canonical names
(:mod:`tfdist.ps.identity`), their specs for placement, the marks of local
writes, and every write of PS values into the local variables.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import tensorflow as tf
from tensorflow.python.ops import gen_resource_variable_ops

from tfdist.ps.identity import CanonicalNames
from tfdist.ps.placement import VariableSpec
from tfdist.strategies._derived_state import DerivedStateLayers
from tfdist.wire import ALIGNMENT

__all__ = ["VariableRegistry", "is_optimizer_variable"]

logger = logging.getLogger(__name__)

_OPTIMIZER_AGGREGATION = tf.VariableAggregation.ONLY_FIRST_REPLICA


def is_optimizer_variable(name: str, kwargs: Mapping[str, Any]) -> bool:
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
    if add and aliasable(value, var):
        # The addend is read once, synchronously: the op may read the array's memory in place (no copy).
        gen_resource_variable_ops.assign_add_variable_op(handle, tf.experimental.dlpack.from_dlpack(value.__dlpack__()))
        return
    op = gen_resource_variable_ops.assign_add_variable_op if add else gen_resource_variable_ops.assign_variable_op
    op(handle, tf.convert_to_tensor(value, dtype=var.dtype))


#: Addends at least this large are handed to TensorFlow without a copy when they can be (:func:`aliasable`).
ALIAS_MIN_BYTES = 16 * 1024


def aliasable(value, var: tf.Variable) -> bool:
    """Whether a TensorFlow tensor may alias ``value`` for one ``assign_add`` (never for ``assign``).

    Only for an addend: ``assign`` may keep its input's buffer as the
    variable's, which must never be an array tfdist writes again. The array
    must be aligned as TensorFlow requires (:func:`tfdist.wire.aligned_empty`;
    an unaligned one would abort the process), C-contiguous, of the
    variable's dtype, on a CPU variable, and the eager op synchronous (it has
    read the array when it returns).
    """
    return (isinstance(value, np.ndarray) and value.nbytes >= ALIAS_MIN_BYTES
            and value.ctypes.data % ALIGNMENT == 0 and value.flags.c_contiguous
            and value.dtype == var.dtype.as_numpy_dtype and value.dtype.kind == "f" and value.dtype.itemsize >= 4
            and "CPU" in var.device.upper() and not _eager_async())


def _eager_async() -> bool:
    from tensorflow.python.eager import context

    return context.is_async()


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
        #: Names of variables a reader (evaluator) created after it joined the job: they stay local.
        self.late: list[str] = []
        #: Specs of variables created after the job started, not yet joined to it (the runtime joins them
        #: before the next step or read: :meth:`peek_pending`, :meth:`joined`).
        self.pending: list[VariableSpec] = []
        self._pending_lock = threading.Lock()
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

    def register(self, var: tf.Variable, trainable: bool, frozen: bool = False, owner=None, watch: bool = True,
                 joins: bool = False) -> None:
        """Adds ``var``: a key (creation order, canonical name) and its spec.

        ``frozen``: the job runs and this process may not extend it (an
        evaluator): ``var`` stays local, with a warning. ``joins``: the job
        runs and ``var`` joins it (:attr:`pending` until the runtime sends it).
        ``owner``: the layer creating ``var``, if known; one with a
        ``finalize_state`` is kept computing with the values written here.
        ``watch``: mark local writes of ``var`` (not on an evaluator, which
        only mirrors the job).
        """
        name = var.name.split(":")[0]
        if frozen:
            self.late.append(name)
            logger.warning(
                "variable %r was created after this task joined the job as a reader; it stays local to this task "
                "(an evaluator mirrors the job's variables, it does not add any)", name)
            return
        key = f"{len(self.variables):04d}/{self._names.canonical(name)}"
        spec = VariableSpec(key, _numpy_dtype_name(var.dtype), tuple(var.shape.as_list()),
                            bool(var.trainable) and trainable)
        self.variables.append(var)
        self._keys_by_var[id(var)] = key
        self.specs.append(spec)
        if joins:
            with self._pending_lock:
                self.pending.append(spec)
        if owner is not None:
            self.derived.track(owner, var)
        if watch:
            self._watch(var, key)

    def peek_pending(self) -> list[VariableSpec]:
        """The variables waiting to join the job, in creation order (they stay pending)."""
        with self._pending_lock:
            return list(self.pending)

    def joined(self, specs: list[VariableSpec]) -> None:
        """``specs`` are in the job now: no longer pending."""
        keys = {s.key for s in specs}
        with self._pending_lock:
            self.pending = [s for s in self.pending if s.key not in keys]

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
        """Arrays in variable order, keyed; variables created after they were read (a step traced before a
        second model existed) are read now."""
        out = {s.key: a for s, a in zip(self.specs, arrays)}
        for spec, var in zip(self.specs[len(arrays):], self.variables[len(arrays):]):
            out[spec.key] = var.numpy()
        return out

    def assign(self, values: Mapping[str, np.ndarray], keep_written: bool = True, partial: bool = False) -> None:
        """Writes fresh values into the local variables (except those written locally, if ``keep_written``).

        ``partial``: ``values`` may name only some variables (a join); the others are left as they are.
        """
        kept = frozenset(self.written) if keep_written else frozenset()
        waiting = {s.key for s in self.pending}  # not in the job yet: nothing to read for them
        self._own_write = True
        try:
            for spec, var in zip(self.specs, self.variables):
                if spec.key not in kept and ((not partial and spec.key not in waiting) or spec.key in values):
                    _write(var, values[spec.key])
        finally:
            self._own_write = False
        if not keep_written:
            if partial:
                self.written.difference_update(values)  # only the variables written now lose their marks
            else:
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


