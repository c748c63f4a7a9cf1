"""PS-resident tables on the worker side: lookups, gathering, and ``keras.layers.Embedding`` over a size threshold.

:class:`tfdist.layers.ShardedEmbedding` and an ordinary
``keras.layers.Embedding`` whose table is at least ``ps.resident_threshold_bytes``
(built under a tfdist parameter-server strategy) share this code: the rows
live on the PS tasks (:mod:`tfdist.ps.sparse`), a step fetches the distinct
rows its batch touches and sends their gradients back.
"""

from __future__ import annotations

import logging
import types
from typing import Any

import keras
import numpy as np
import tensorflow as tf

__all__ = ["initializer_spec", "lookup", "gather_table", "current_ps_runtime", "install_resident_embeddings"]

logger = logging.getLogger(__name__)


def current_ps_runtime():
    """The PS runtime of the tfdist strategy in scope, or ``None``."""
    from tfdist.strategies._ps_runtime import PSRuntime

    runtime = getattr(tf.distribute.get_strategy().extended, "_runtime", None)
    return runtime if isinstance(runtime, PSRuntime) else None


def initializer_spec(initializer: Any) -> dict[str, Any] | None:
    """The PS-side initialiser for a Keras initializer (``None``: the PS cannot run it)."""
    init = keras.initializers.get(initializer)
    name = type(init).__name__
    config = init.get_config()
    if name == "RandomUniform":
        return {"kind": "uniform", "minval": float(config["minval"]), "maxval": float(config["maxval"])}
    if name == "RandomNormal":
        return {"kind": "normal", "mean": float(config["mean"]), "stddev": float(config["stddev"])}
    if name == "TruncatedNormal":
        return {"kind": "truncated_normal", "mean": float(config["mean"]), "stddev": float(config["stddev"])}
    if name == "Zeros":
        return {"kind": "zeros"}
    return None


def lookup(runtime, key: str, dim: int, inputs, anchor):
    ids = tf.cast(inputs, tf.int64)
    flat = tf.reshape(ids, [-1])
    unique, index = tf.unique(flat)

    @tf.custom_gradient
    def fetch(unique_ids, anchor_value):
        rows = tf.py_function(lambda u: runtime.lookup_rows(key, u.numpy()), [unique_ids], tf.float32,
                              name="tfdist_lookup_rows")
        rows = tf.ensure_shape(rows, [None, dim])

        def grad(d_rows):
            d_rows = tf.convert_to_tensor(d_rows)  # from the gather: IndexedSlices over the unique rows
            def push(u, g):
                runtime.push_rows(key, u.numpy(), g.numpy())
                return np.float32(0.0)

            sent = tf.reshape(tf.py_function(push, [unique_ids, d_rows], tf.float32, name="tfdist_push_rows"), [])
            return None, tf.zeros_like(anchor_value) + 0.0 * sent  # the push runs before the anchor's update

        return rows, grad

    rows = fetch(unique, anchor)
    out = tf.gather(rows, index)
    return tf.reshape(out, tf.concat([tf.shape(ids), [dim]], axis=0))


def gather_table(runtime, key: str, rows: int, chunk_rows: int = 65536) -> np.ndarray:
    """A whole PS-resident table as one array (``chunk_rows`` rows per request)."""
    parts = [runtime.read_rows(key, np.arange(start, min(start + chunk_rows, rows), dtype=np.int64))
             for start in range(0, rows, chunk_rows)]
    return np.concatenate(parts, axis=0)


# ---------------------------------------------------------------- ps.resident_threshold_bytes
_original_build = None


def install_resident_embeddings() -> None:
    """Makes ``keras.layers.Embedding`` layers built from now on resident when the strategy's threshold says so.

    Keras binds a layer's ``build`` when the layer is created, so this runs
    when a strategy with ``ps.resident_threshold_bytes`` is created (before
    the model, which must be built under its scope). A layer built under any
    other strategy, or below the threshold, is built as Keras builds it.
    """
    global _original_build
    if _original_build is not None:
        return
    _original_build = keras.layers.Embedding.build

    def build(self, input_shape=None):
        runtime = current_ps_runtime()
        if runtime is not None and not self.built and _should_be_resident(self, runtime):
            _make_resident(self, runtime)
            return
        return _original_build(self, input_shape)

    keras.layers.Embedding.build = build


def _should_be_resident(layer, runtime) -> bool:
    threshold = runtime.config.ps.resident_threshold_bytes
    if threshold is None or type(layer) is not keras.layers.Embedding:  # subclasses read the table in their own way
        return False
    size = layer.input_dim * layer.output_dim * np.dtype(layer.variable_dtype or "float32").itemsize
    if size < threshold:
        return False
    why = None
    if np.dtype(layer.variable_dtype or "float32") != np.float32:
        why = f"its dtype is {layer.variable_dtype} (PS tables are float32)"
    elif layer.quantization_mode or getattr(layer, "lora_rank", None):
        why = "it is quantized or has LoRA"
    elif layer.embeddings_regularizer is not None or layer.embeddings_constraint is not None:
        why = "it has a regularizer or constraint (the PS applies neither)"
    elif initializer_spec(layer.embeddings_initializer) is None:
        why = (f"the PS tasks cannot run its initializer {type(layer.embeddings_initializer).__name__} "
               "(uniform, normal, truncated_normal, zeros)")
    if why:
        logger.warning("Embedding %r (%d x %d, %d bytes) is above ps.resident_threshold_bytes=%d but stays a "
                       "replicated variable: %s.", layer.name, layer.input_dim, layer.output_dim, size, threshold, why)
        return False
    return True


def _make_resident(layer, runtime) -> None:
    # Distinct seeds: two tables with one seed would start with the same rows.
    seed = len(runtime.table_specs())
    layer._tfdist_anchor = layer.add_weight(shape=(), name="table_anchor", initializer="zeros")
    layer._tfdist_table_key = runtime.register_table(layer.name, layer.input_dim, layer.output_dim,
                                                     initializer_spec(layer.embeddings_initializer), None, seed)
    layer._tfdist_runtime = runtime
    layer.call = types.MethodType(_resident_call, layer)
    layer.save_own_variables = types.MethodType(_resident_save, layer)
    layer.load_own_variables = types.MethodType(_resident_load, layer)
    layer.built = True
    logger.info("Embedding %r (%d x %d) lives on the PS tasks (ps.resident_threshold_bytes=%d)", layer.name,
                layer.input_dim, layer.output_dim, runtime.config.ps.resident_threshold_bytes)


def _resident_call(self, inputs):
    out = lookup(self._tfdist_runtime, self._tfdist_table_key, self.output_dim, inputs, self._tfdist_anchor.value)
    return keras.ops.cast(out, self.compute_dtype)


def _resident_save(self, store):
    """As ``keras.layers.Embedding`` saves itself (the table, gathered from the PS): plain Keras loads it."""
    store["0"] = gather_table(self._tfdist_runtime, self._tfdist_table_key, self.input_dim)


def _resident_load(self, store):
    """Loads the table as ``keras.layers.Embedding`` saved it: written to the PS tasks (see ``write_table``)."""
    if len(store.keys()) != 1:
        raise ValueError(f"Embedding {self.name!r} on the parameter servers expects 1 saved variable (the table); "
                         f"the file has {len(store.keys())}.")
    self._tfdist_runtime.write_table(self._tfdist_table_key, np.asarray(store["0"]))
