"""Keras builds a model under a strategy from the element spec of a queue dataset, not from a batch.

Keras 3.15's TensorFlow trainer (``keras/src/backend/tensorflow/trainer.py``,
``TensorFlowTrainer._maybe_symbolic_build``) runs at the start of every
``fit`` and ``evaluate`` when the model has a distribution strategy (any
``tf.distribute`` strategy, tfdist's included). It makes an iterator over
the dataset, takes one batch with ``next()`` to learn the input shapes, and
abandons the iterator; training then iterates the dataset again. It does
this even when the model is already built and the batch is thrown away.

A dataset that replays its data (``from_tensor_slices``, files) does not
mind. A queue dataset consumes its source, and more than one batch is lost:
the strategy's input pipeline prefetches several batches behind that
``next()`` (five under ``OneDeviceStrategy`` on TF 2.21), all dropped with
the abandoned iterator and never trained. No rule inside the dataset can
tell this look-ahead from an iteration that trained what it read and was
then stopped (``steps_per_epoch``), so the look-ahead is removed where it
happens: for a pipeline built on a ``tfdist.data`` queue dataset, Keras
builds the model from the dataset's ``element_spec`` (shapes and dtypes are
all it uses) and never touches the data. Other datasets keep Keras's
behaviour, except under tfdist's own strategies (below).

The same peek crashes processes. On TF 2.21 / Keras 3.15 about 6 % of the
short worker processes of a multi-process job died with SIGSEGV right after
it, in ``EpochIterator.reset`` during ``evaluate`` (most often the
validation of ``fit``), when the abandoned iterator — a
``MultiDeviceIterator`` still prefetching behind the peeked batch — is
destroyed. It happens under TensorFlow's own ``OneDeviceStrategy`` with no
tfdist code, and never without a strategy (Keras then does not peek).
:func:`build_from_element_spec` makes Keras build from the element spec of
*every* dataset under a given strategy; tfdist's strategies call it, so
their ``fit``/``evaluate`` never open and drop an iterator for the build.
``scripts/evaluate_segv_repro.py`` counts the crashes (short processes, 3 at
a time on 2 busy cores; each evaluates, fits 4 epochs with validation,
evaluates, predicts): with the peek, ``OneDeviceStrategy`` 10 of 80 processes
and tfdist's strategy 3 of 40 died with SIGSEGV, every one in
``EpochIterator.reset``; built from the spec, 0 of 40 and 0 of 80.

:func:`install` is called when the first queue dataset is made.
"""

from __future__ import annotations

import functools
import logging
from typing import Any

import keras
import tensorflow as tf

__all__ = ["install", "is_installed", "mark_queue_dataset", "contains_queue_dataset", "build_from_element_spec"]

logger = logging.getLogger(__name__)

#: Attribute set on the datasets that ``tfdist.data`` queues return.
_MARK = "_tfdist_queue_dataset"
#: Attribute set on the strategies under which Keras builds from the element spec of every dataset.
_SPEC_BUILD = "_tfdist_build_from_element_spec"
#: Most datasets of a pipeline looked at when searching for a queue dataset.
_MAX_PIPELINE_DATASETS = 1024


def mark_queue_dataset(dataset: tf.data.Dataset) -> tf.data.Dataset:
    """Marks ``dataset`` as consuming its source; returns it."""
    setattr(dataset, _MARK, True)
    return dataset


def contains_queue_dataset(dataset: Any) -> bool:
    """Whether a queue dataset is an input of ``dataset`` (through map, batch, zip, ...).

    Datasets created inside functions (``interleave``, ``flat_map``) are not
    inputs in this sense and are not found.
    """
    stack, seen = [dataset], set()
    while stack and len(seen) < _MAX_PIPELINE_DATASETS:
        ds = stack.pop()
        if id(ds) in seen:
            continue
        seen.add(id(ds))
        if getattr(ds, _MARK, False):
            return True
        inputs = getattr(ds, "_inputs", None)
        if inputs is not None:
            try:
                stack.extend(inputs())
            except Exception:  # noqa: BLE001 - a dataset type without inputs
                pass
    return False


def build_from_element_spec(strategy: Any) -> Any:
    """Makes Keras build models under ``strategy`` from the element spec of every dataset; returns it.

    ``fit``/``evaluate`` then never take a batch from a throwaway iterator
    (see the module docstring for the crash this avoids). Datasets whose
    element spec has a component of unknown rank or a non-dense tensor
    keep Keras's behaviour.
    """
    setattr(strategy, _SPEC_BUILD, True)
    install()
    return strategy


def _dense_symbolic(element_spec):
    """KerasTensors for a batch of ``element_spec``, or ``None`` if a component is not a dense tensor of known rank."""
    specs = tf.nest.flatten(element_spec)
    if not all(isinstance(s, tf.TensorSpec) and s.shape.rank is not None for s in specs):
        return None
    return tf.nest.map_structure(lambda s: keras.KerasTensor(tuple(s.shape.as_list()), dtype=s.dtype.name),
                                 element_spec)


def _symbolic_batch(epoch_iterator: Any, every_dataset: bool = False):
    """KerasTensors for one batch of the pipeline, or ``None`` to let Keras peek.

    Queue-fed pipelines always; with ``every_dataset``, any pipeline.
    """
    if every_dataset:
        # The strategy's distributed dataset, which Keras's TF epoch iterator already made (building the
        # adapter's dataset again would copy in-memory arrays into a second pipeline).
        distributed = getattr(epoch_iterator, "_distributed_dataset", None)
        spec = getattr(distributed, "element_spec", None)
        if spec is not None:
            batch = _dense_symbolic(spec)
            if batch is not None:
                return batch
    adapter = getattr(epoch_iterator, "data_adapter", None)
    get_dataset = getattr(adapter, "get_tf_dataset", None)
    if get_dataset is None:
        return None
    dataset = get_dataset()
    if not isinstance(dataset, tf.data.Dataset) or not contains_queue_dataset(dataset):
        return None
    batch = _dense_symbolic(dataset.element_spec)
    if batch is None:
        logger.warning(
            "Keras will take one batch from a tfdist.data queue dataset to build the model "
            "(its element_spec has a component of unknown rank or a non-dense tensor: %s); "
            "that batch and the batches prefetched behind it are not trained. Build the model "
            "before fit (model.build or call it on a batch) to avoid it.",
            dataset.element_spec,
        )
    return batch


def _patched(original):
    @functools.wraps(original)
    def _maybe_symbolic_build(self, iterator=None, data_batch=None):
        strategy = getattr(self, "_distribute_strategy", None)
        if iterator is not None and data_batch is None and strategy is not None:
            batch = _symbolic_batch(iterator, every_dataset=getattr(strategy, _SPEC_BUILD, False))
            if batch is not None:
                return original(self, data_batch=batch)
        return original(self, iterator=iterator, data_batch=data_batch)

    _maybe_symbolic_build._tfdist_original = original
    return _maybe_symbolic_build


def _trainer_class():
    from tfdist._tf_compat import keras_tensorflow_trainer

    return keras_tensorflow_trainer()


def is_installed() -> bool:
    """Whether Keras builds queue-fed models from the element spec."""
    cls = _trainer_class()
    return cls is not None and hasattr(getattr(cls, "_maybe_symbolic_build", None), "_tfdist_original")


def install() -> bool:
    """Makes Keras build queue-fed models from the element spec (idempotent).

    Returns:
        ``True`` if installed; ``False`` (with a warning) where this Keras has
        no ``TensorFlowTrainer._maybe_symbolic_build`` to adapt.
    """
    cls = _trainer_class()
    method = getattr(cls, "_maybe_symbolic_build", None) if cls is not None else None
    if method is None:
        logger.warning(
            "Keras %s has no TensorFlowTrainer._maybe_symbolic_build; tfdist.data cannot stop it "
            "from taking a batch of a queue dataset under a strategy (checked on Keras 3.15).",
            keras.__version__,
        )
        return False
    if not hasattr(method, "_tfdist_original"):
        cls._maybe_symbolic_build = _patched(method)
        logger.debug("Keras builds models fed by tfdist.data queues from the element spec")
    return True
