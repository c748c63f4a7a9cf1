"""Keras's input iterators are released when ``fit``/``evaluate``/``predict`` return, on the calling thread.

Why (issue #27 item 1, the hang at the end of ``fit`` and at exit): a
``fit`` that stops early (``stop_training``: EarlyStopping, a job that ends,
an elastic leave) leaves Keras's epoch iterator in a reference cycle (its
suspended ``_enumerate_iterator`` generator holds the ``TFEpochIterator``),
and with it the live ``tf.data`` iterator. Only Python's cyclic garbage
collector frees it then, on whichever thread happens to allocate. Under a
tfdist strategy that can be one of TensorFlow's inter-op threads, running a
``tf.py_function`` of the step (tfdist's exchange). The iterator's C++
destructor (``~IteratorResource`` → prefetch thread, the generator's
finalize function) needs a free inter-op thread to finish; with the pool's
threads busy (2 on a 2-core machine) it waits forever:
``EagerTensor_dealloc`` → ``~IteratorResource`` → ``~PrefetchDatasetOp::Iterator``
→ ``~LogicalThreadWrapper`` → ``WaitForNotification``. Plain Keras runs no
Python on inter-op threads, so it never hangs there.

:func:`install` wraps ``fit``/``evaluate``/``predict`` of Keras's TensorFlow
trainer: the epoch iterators created during the call are closed (their
generator) and dropped when it returns or raises, so their ``tf.data``
iterators are freed right there, by reference counting, on the caller's
thread. Nested calls (``fit``'s validation ``evaluate``) release only their
own iterators.
"""

from __future__ import annotations

import functools
import logging
import threading
import weakref

__all__ = ["install", "release"]

logger = logging.getLogger(__name__)

_state = threading.local()  # .calls: one list of weak references per fit/evaluate/predict running on this thread
_installed = False


def release(epoch_iterator) -> None:
    """Closes a Keras epoch iterator's generator and drops its ``tf.data`` iterator (it is freed here)."""
    generator = getattr(epoch_iterator, "_epoch_iterator", None)
    if generator is not None and hasattr(generator, "close"):
        generator.close()  # clears the suspended frame: the reference cycle is gone
    epoch_iterator._epoch_iterator = None
    epoch_iterator._current_iterator = None


def _releasing(method):
    @functools.wraps(method)
    def call(self, *args, **kwargs):
        calls = _state.__dict__.setdefault("calls", [])
        calls.append([])
        try:
            return method(self, *args, **kwargs)
        finally:
            for ref in calls.pop():
                epoch_iterator = ref()
                if epoch_iterator is None:
                    continue
                try:
                    release(epoch_iterator)
                except Exception as e:  # never in place of the call's own result or error
                    logger.debug("could not release a Keras epoch iterator: %r", e)

    call._tfdist_releases_iterators = True
    return call


def install() -> None:
    """Wraps Keras's TensorFlow trainer once (idempotent; plain Keras behaves the same with it)."""
    global _installed
    if _installed:
        return
    try:
        from keras.src.backend.tensorflow import trainer

        iterator_class, trainer_class = trainer.TFEpochIterator, trainer.TensorFlowTrainer
    except (ImportError, AttributeError) as e:  # another Keras: its iterators are left as they are
        logger.warning("tfdist cannot find Keras's TensorFlow trainer (%r): fit's input iterators are not released "
                       "when it returns (a fit stopped early may leave one to the garbage collector)", e)
        _installed = True
        return
    original_init = iterator_class.__init__

    @functools.wraps(original_init)
    def __init__(self, *args, **kwargs):
        original_init(self, *args, **kwargs)
        calls = getattr(_state, "calls", None)
        if calls:
            calls[-1].append(weakref.ref(self))

    iterator_class.__init__ = __init__
    for name in ("fit", "evaluate", "predict"):
        method = getattr(trainer_class, name)
        if not getattr(method, "_tfdist_releases_iterators", False):
            setattr(trainer_class, name, _releasing(method))
    _installed = True
