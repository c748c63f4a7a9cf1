"""``StepExtended``: what one training (or evaluation) step is, for tfdist's ``tf.distribute`` extendeds.

Keras runs a step with ``strategy.run`` → ``extended.call_for_each_replica``;
the extendeds wrap that call with their begin/end of step. Calls made from
*inside* a step are part of it, not steps of their own: checked on Keras
3.15, ``LossScaleOptimizer`` (``mixed_float16``) calls
``call_for_each_replica`` for its overflow check and its apply from within
the optimizer's merge call.
"""

from __future__ import annotations

from tfdist._tf_compat import OneDeviceExtended

__all__ = ["StepExtended"]


class StepExtended(OneDeviceExtended):
    """One outermost ``call_for_each_replica`` is one step (:meth:`_step`); nested calls go to :meth:`_inside_step`."""

    def __init__(self, container_strategy, device: str = "/cpu:0"):
        super().__init__(container_strategy, device)
        self._in_step = False  # a step is being traced (or run eagerly)

    def _call_for_each_replica(self, fn, args, kwargs):
        if self._in_step:
            return self._inside_step(fn, args, kwargs)
        self._in_step = True
        try:
            return self._step(fn, args, kwargs)
        finally:
            self._in_step = False

    def _on_replica(self, fn, args, kwargs):
        """``fn`` on this worker's one replica, as TF's one-device strategy runs it."""
        return OneDeviceExtended._call_for_each_replica(self, fn, args, kwargs)

    def _inside_step(self, fn, args, kwargs):
        """A call from inside the step: runs as part of it."""
        return self._on_replica(fn, args, kwargs)

    def _step(self, fn, args, kwargs):
        raise NotImplementedError
