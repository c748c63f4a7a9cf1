"""Adapts a batch source (a local or shared queue) to a ``tf.data.Dataset``.

With :mod:`tfdist.data.symbolic_build`, the only modules of ``tfdist.data`` that
import TensorFlow.
"""

from __future__ import annotations

from typing import Callable, Iterator

import tensorflow as tf

from tfdist.data import symbolic_build
from tfdist.data.element_spec import ElementSpec

__all__ = ["dataset_from_blocks", "tensor_specs"]


def tensor_specs(spec: ElementSpec, batch_size: int | None, drop_remainder: bool):
    """The ``tf.TensorSpec`` structure of the dataset's elements."""
    if batch_size is None:
        lead: tuple = ()
    else:
        lead = (batch_size if drop_remainder else None,)
    specs = [
        tf.TensorSpec(shape=None if shape is None else lead + tuple(shape), dtype=tf.as_dtype(dtype))
        for dtype, shape in zip(spec.dtypes, spec.shapes)
    ]
    return spec.pack(specs)


def dataset_from_blocks(
    make_blocks: Callable[[], Iterator[list]],
    spec: ElementSpec,
    *,
    batch_size: int | None,
    drop_remainder: bool,
    prefetch: int | None = None,
) -> tf.data.Dataset:
    """Builds a dataset over blocks of batches from ``make_blocks()``.

    Args:
        make_blocks: called once per iteration of the dataset; returns an
            iterator of blocks, each a list of numpy arrays (components in
            ``spec`` order) whose first dimension counts batches (or, when
            ``batch_size`` is ``None``, elements). The dataset yields the
            block's batches in order: one Python call per block. It may
            raise: the dataset's iterator then raises (tf.data wraps the
            error and keeps its traceback in the message).
        spec: element structure.
        batch_size: leading dimension of a batch (``None``: unbatched elements).
        drop_remainder: the leading dimension is exactly ``batch_size``.
        prefetch: ``prefetch`` buffer to add. Defaults to ``None`` (none).

    Returns:
        A ``tf.data.Dataset``; each iteration continues from where the source is.
        Keras builds a model fed by it under a strategy from its element spec
        instead of taking a batch (see :mod:`tfdist.data.symbolic_build`).
    """
    symbolic_build.install()

    def generate():
        for block in make_blocks():
            yield spec.pack(block)

    element = tensor_specs(spec, batch_size, drop_remainder)
    block = tf.nest.map_structure(
        lambda s: tf.TensorSpec(shape=None if s.shape.rank is None else [None] + s.shape.as_list(), dtype=s.dtype),
        element,
    )
    ds = tf.data.Dataset.from_generator(generate, output_signature=block).unbatch()
    if prefetch:
        ds = ds.prefetch(prefetch)
    return symbolic_build.mark_queue_dataset(ds)
