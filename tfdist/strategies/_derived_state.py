"""Layers that compute with state derived from their variables (Keras's ``finalize_state``), kept in step with them.

Keras 3 preprocessing layers do not compute with their variables directly:
``finalize_state()`` derives the tensors ``call`` uses from them, and Keras
calls it from ``build``, ``adapt`` and ``load_own_variables`` only, never
from ``call`` (checked on Keras 3.15). ``Normalization`` is the one with
variables: ``finalize_state`` sets ``self.mean``/``self.variance`` to eager
tensors (``adapt_mean``/``adapt_variance`` reshaped and cast), and a
``tf.function`` step captures those tensors as constants when it is traced.

A tfdist strategy writes values into variables behind Keras's back (a pull
from the parameter servers, a resync): a worker that did not ``adapt`` (or
did not ``load_weights``) would go on computing with its own initial
statistics although its variables hold the chief's. :class:`DerivedStateLayers`
keeps such layers in step, in graph mode too:

1. every tensor attribute that ``finalize_state`` sets is held in a local
   (non-trainable, untracked) variable, its *mirror*, so a traced step reads
   the current value at run time instead of a constant;
2. after new values are written into a layer's variables
   (:meth:`DerivedStateLayers.refresh`), ``finalize_state`` runs again and
   the mirrors take its results — eagerly, from the writer's thread (inside
   a step that is the ``tf.py_function`` that pulls, which runs before the
   step's computation).
"""

from __future__ import annotations

import contextlib
import logging
import threading
from typing import Any, Callable

import numpy as np
import tensorflow as tf

__all__ = ["DerivedStateLayers"]

logger = logging.getLogger(__name__)


def _is_eager_tensor(value: Any) -> bool:
    return isinstance(value, tf.Tensor) and not isinstance(value, tf.Variable) and not tf.is_symbolic_tensor(value)


class _Tracked:
    """One layer: its variables kept on the parameter servers, their values at the last finalize, its mirrors."""

    def __init__(self, layer, finalize: Callable[[], Any]):
        self.layer = layer
        self.finalize = finalize  # the layer's own finalize_state
        self.variables: list[tf.Variable] = []
        self.seen: list[np.ndarray] | None = None
        self.mirrors: dict[str, tf.Variable] = {}

    def changed(self) -> bool:
        if self.seen is None:
            return True
        return any(not np.array_equal(v.numpy(), s) for v, s in zip(self.variables, self.seen))


class DerivedStateLayers:
    """The layers with a ``finalize_state`` among the owners of a strategy's variables.

    Example (what a strategy's hooks do):

    ```python
    derived = DerivedStateLayers()
    derived.track(layer, variable)    # while the layer creates a variable the strategy manages
    variable.assign(pulled_value)     # the strategy writes a value Keras did not
    derived.refresh()                 # layer.finalize_state() runs; traced steps see the result
    ```
    """

    def __init__(self):
        self._tracked: dict[int, _Tracked] = {}
        self._local = threading.local()

    @property
    def layers(self) -> list:
        return [t.layer for t in self._tracked.values()]

    def creating_mirror(self) -> bool:
        """True while this thread creates a mirror (the strategy must not manage that variable)."""
        return getattr(self._local, "creating", False)

    @contextlib.contextmanager
    def _creating(self):
        self._local.creating = True
        try:
            yield
        finally:
            self._local.creating = False

    def track(self, layer, variable: tf.Variable) -> None:
        """Notes that ``layer`` owns ``variable``; a layer without ``finalize_state`` is ignored.

        The first time, the layer's ``finalize_state`` is wrapped (on the
        instance) so that every call — by ``build``, ``adapt``,
        ``load_weights`` or :meth:`refresh` — leaves the derived tensors in
        mirrors.
        """
        finalize = getattr(layer, "finalize_state", None)
        if not callable(finalize):
            return
        tracked = self._tracked.get(id(layer))
        if tracked is None:
            tracked = self._tracked[id(layer)] = _Tracked(layer, finalize)

            def finalize_state(*args, **kwargs):
                return self._finalize(tracked, *args, **kwargs)

            # object.__setattr__: neither Keras nor TF tracking sees the wrapper (or, below, the mirrors),
            # so saving, get_weights and checkpoints are unchanged.
            object.__setattr__(layer, "finalize_state", finalize_state)
        tracked.variables.append(variable)
        tracked.seen = None

    def refresh(self) -> None:
        """Runs ``finalize_state`` of every layer whose variables changed since its last one."""
        for tracked in self._tracked.values():
            if tracked.layer.built and tracked.changed():
                tracked.layer.finalize_state()

    def _finalize(self, tracked: _Tracked, *args, **kwargs):
        layer = tracked.layer
        before = dict(vars(layer))
        result = tracked.finalize(*args, **kwargs)
        if not tf.executing_eagerly():  # called while a function is traced: its tensors belong to that graph
            return result
        for name, value in list(vars(layer).items()):
            if value is before.get(name) or not _is_eager_tensor(value):
                continue
            mirror = tracked.mirrors.get(name)
            if mirror is not None and mirror.dtype == value.dtype and mirror.shape == value.shape:
                mirror.assign(value)
            else:
                if mirror is not None:
                    logger.warning(
                        "layer %r: finalize_state() changed the shape or dtype of %r (%s%s -> %s%s); steps "
                        "traced before keep the old value (call model.compile() again to retrace them)",
                        layer.name, name, mirror.dtype.name, mirror.shape, value.dtype.name, value.shape)
                with self._creating(), tf.init_scope():
                    mirror = tf.Variable(value, trainable=False, name=f"{layer.name}_{name}_derived")
                tracked.mirrors[name] = mirror
            object.__setattr__(layer, name, mirror)
        tracked.seen = [v.numpy() for v in tracked.variables]
        return result
