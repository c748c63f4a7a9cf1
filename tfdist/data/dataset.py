"""Adapts a batch source (a local or shared queue) to a ``tf.data.Dataset``.

This is the only module of ``tfdist.data`` that imports TensorFlow.
"""

from __future__ import annotations

from typing import Callable

import tensorflow as tf

from tfdist.data.element_spec import ElementSpec

__all__ = ["dataset_from_batches", "tensor_specs"]


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


def dataset_from_batches(
    next_batch: Callable[[], list | None],
    spec: ElementSpec,
    *,
    batch_size: int | None,
    drop_remainder: bool,
    prefetch: int | None = None,
) -> tf.data.Dataset:
    """Builds a dataset that calls ``next_batch()`` until it returns ``None``.

    Args:
        next_batch: returns one batch as a list of numpy arrays (components in
            ``spec`` order), or ``None`` at the end of data; may raise, and the
            dataset's iterator then raises (tf.data wraps the error, keeping its
            traceback in the message).
        spec: element structure.
        batch_size: leading dimension (``None``: unbatched elements).
        drop_remainder: the leading dimension is exactly ``batch_size``.
        prefetch: ``prefetch`` buffer to add. Defaults to ``None`` (none).

    Returns:
        A ``tf.data.Dataset``; each iteration continues from where the source is.
    """

    def generate():
        while True:
            batch = next_batch()
            if batch is None:
                return
            yield spec.pack(batch)

    ds = tf.data.Dataset.from_generator(
        generate, output_signature=tensor_specs(spec, batch_size, drop_remainder)
    )
    if prefetch:
        ds = ds.prefetch(prefetch)
    return ds
