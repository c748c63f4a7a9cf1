"""Keras layers for parameter-server training: :class:`ShardedEmbedding` and :class:`DynamicEmbedding`, tables on the PS.

```python
strategy = tfdist.ParameterServerStrategy()
with strategy.scope():
    ids = keras.Input((8,), dtype="int64")
    x = tfdist.layers.ShardedEmbedding(10_000_000, 32)(ids)     # 1.28 GB: on the PS tasks only
    ...
```

Under a tfdist parameter-server strategy the table's rows are split over
every PS task (row ``i`` on task ``i % num_ps``); a worker holds no row. Each
step fetches the distinct rows its batch touches (one request per task, in
parallel), and the backward pass sends the row gradients back; the PS applies
the optimizer to those rows (:mod:`tfdist.ps.sparse`: SGD, Adagrad, lazy
Adam, FTRL). Which optimizer: ``optimizer=`` if given, else the Keras
optimizer the model was compiled with (SGD, Adagrad, Adam, Ftrl map
directly; its current learning rate is sent with every step, so schedules
work). Outside such a strategy (a plain Keras process, loading a saved model)
it is an ordinary ``keras.layers.Embedding`` with a local table.

:class:`DynamicEmbedding` has no vocabulary size: any int64 id (or string,
hashed) gets its own row, created by the PS task that holds it when the id
is first trained (see :mod:`tfdist.ps.dynamic`), with admission and
eviction options.
"""

from __future__ import annotations

import logging
from typing import Any

import keras
import numpy as np

from tfdist.errors import ConfigError
from tfdist.strategies._row_optimizer import row_optimizer_spec  # re-exported
from tfdist.strategies._tables import (
    current_ps_runtime,
    gather_table,
    initializer_spec,
    lookup,
)

__all__ = ["DynamicEmbedding", "ShardedEmbedding", "hash_strings", "row_optimizer_spec"]

logger = logging.getLogger(__name__)


def _require_ps_initializer(layer, init) -> None:
    """The parameter servers create rows with an initializer they can run themselves: refuse any other."""
    if init is None:
        raise ConfigError(f"{type(layer).__name__} {layer.name!r}: the parameter servers cannot run the initializer "
                          f"{type(layer.embeddings_initializer).__name__}; use uniform, normal, truncated_normal "
                          "or zeros.")


@keras.saving.register_keras_serializable(package="tfdist")
class ShardedEmbedding(keras.layers.Layer):
    """``keras.layers.Embedding`` whose table lives on the parameter servers (see the module docstring).

    Args:
        input_dim: Rows of the table (the vocabulary size).
        output_dim: Width of a row.
        embeddings_initializer: ``"uniform"`` (Keras's default, U(-0.05, 0.05)),
            ``"normal"``, ``"truncated_normal"``, ``"zeros"`` or such a Keras
            initializer: the PS tasks initialise their rows themselves.
        mask_zero: As in ``keras.layers.Embedding``.
        optimizer: The row optimizer: a Keras optimizer or ``{"kind":
            "adam", "learning_rate": ...}``. Defaults to the optimizer the
            model is compiled with.
        seed: Seed of the PS-side initialisation. Defaults to 0.
    """

    def __init__(self, input_dim: int, output_dim: int, embeddings_initializer: Any = "uniform",
                 mask_zero: bool = False, optimizer: Any = None, seed: int = 0, **kwargs):
        super().__init__(**kwargs)
        self.input_dim, self.output_dim = int(input_dim), int(output_dim)
        self.embeddings_initializer = keras.initializers.get(embeddings_initializer)
        self.mask_zero = mask_zero
        self.supports_masking = mask_zero
        self.row_optimizer = None if optimizer is None else row_optimizer_spec(optimizer)
        self.seed = int(seed)
        self._table_key: str | None = None
        self._runtime = None

    def build(self, input_shape=None):
        runtime = current_ps_runtime()
        init = initializer_spec(self.embeddings_initializer)
        if runtime is None:  # plain Keras: an ordinary embedding
            self.embeddings = self.add_weight(shape=(self.input_dim, self.output_dim), name="embeddings",
                                              initializer=self.embeddings_initializer)
        else:
            _require_ps_initializer(self, init)
            self._runtime = runtime
            # The step's gradient reaches the table through this scalar (its own gradient is always 0).
            self._anchor = self.add_weight(shape=(), name="table_anchor", initializer="zeros")
            self._table_key = runtime.register_table(self.name, self.input_dim, self.output_dim, init,
                                                     self.row_optimizer, self.seed)
        self.built = True

    @property
    def resident(self) -> bool:
        """Whether the table lives on the parameter servers (else it is a local variable)."""
        return self._table_key is not None

    def call(self, inputs):
        if not self.resident:
            if inputs.dtype != "int32" and inputs.dtype != "int64":
                inputs = keras.ops.cast(inputs, "int32")
            return keras.ops.take(self.embeddings, inputs, axis=0)
        return lookup(self._runtime, self._table_key, self.output_dim, inputs, self._anchor.value)

    # ------------------------------------------------------------------ saving
    def table_values(self, chunk_rows: int = 65536) -> np.ndarray:
        """The whole table as one array (gathered from the PS tasks, ``chunk_rows`` rows per request)."""
        if not self.resident:
            return np.asarray(self.embeddings.numpy())
        return gather_table(self._runtime, self._table_key, self.input_dim, chunk_rows)

    def save_own_variables(self, store):
        """``model.save``/``save_weights``: the table as ``keras.layers.Embedding`` saves it (gathered from the PS).

        A model saved from a job with PS-resident tables loads into plain
        Keras (this layer outside a tfdist strategy is an ordinary
        embedding) with the same predictions. The worker gathers the whole
        table to write it: for tables larger than its memory, read the PS
        checkpoints instead (``tfdist.checkpoint.read``). Load such a file
        into plain Keras with ``keras.saving.load_model(path, compile=False)``
        and compile it again to go on training: the optimizer state saved with
        it is the job's (the table's own is on the PS), which does not fit a
        local table. Loaded under a tfdist strategy (``load_weights``,
        ``load_model`` in its scope), the table is written to the PS tasks.
        """
        store["0"] = self.table_values()

    def load_own_variables(self, store):
        """Loads the table as ``keras.layers.Embedding`` saved it (on the PS: written there, see ``write_table``)."""
        if len(store.keys()) != 1:
            raise ValueError(f"ShardedEmbedding {self.name!r} expects 1 saved variable (the table); "
                             f"the file has {len(store.keys())}.")
        if self.resident:
            self._runtime.write_table(self._table_key, np.asarray(store["0"]))
            return
        self.embeddings.assign(store["0"])

    def compute_mask(self, inputs, mask=None):
        if not self.mask_zero:
            return None
        return keras.ops.not_equal(inputs, 0)

    def compute_output_shape(self, input_shape):
        return (*input_shape, self.output_dim)

    def get_config(self):
        return {**super().get_config(), "input_dim": self.input_dim, "output_dim": self.output_dim,
                "embeddings_initializer": keras.initializers.serialize(self.embeddings_initializer),
                "mask_zero": self.mask_zero, "optimizer": self.row_optimizer, "seed": self.seed}




#: Strings are hashed into ``[0, STRING_BUCKETS)`` (:func:`hash_strings`).
STRING_BUCKETS = 2**63 - 1


def hash_strings(inputs):
    """The int64 id of each string: FarmHash64 (``tf.strings.to_hash_bucket_fast``) modulo ``2**63 - 1``.

    Two different strings share an id (and so a row) only if their 64-bit
    fingerprints collide modulo ``2**63 - 1``: about ``n**2 / 2**64`` pairs
    among ``n`` distinct strings (1 in 37 million for a million strings; an
    expected 5 for ten billion). The hash is stable across processes,
    machines and TensorFlow versions (FarmHash's fingerprint), so a serving
    model hashing the same way reads the same rows.
    """
    import tensorflow as tf

    return tf.strings.to_hash_bucket_fast(inputs, STRING_BUCKETS)


@keras.saving.register_keras_serializable(package="tfdist")
class DynamicEmbedding(keras.layers.Layer):
    """An embedding of unbounded ids whose rows live on the parameter servers and appear as ids arrive.

    Any int64 id (negative and huge ones too) has its own row; string
    inputs are hashed first (:func:`hash_strings`, collisions stated
    there). Id ``i`` lives on PS task ``hash64(i) % num_ps``, which creates
    the row when the id's first gradient arrives, with values that depend
    only on the initializer, ``seed`` and the id (a restarted task or
    another worker gets the same row); until then a lookup reads that
    initial row and creates nothing. The PS applies the row optimizer (SGD,
    Adagrad, lazy Adam, FTRL) as for :class:`ShardedEmbedding`.

    Trains under a tfdist parameter-server strategy (any mode; one process
    with ``tfdist.ParameterServerStrategy()`` and no cluster runs its PS in
    process). Built outside one (to load a job's weights for serving), it
    holds no rows and reads ``default_value`` for every id, with a warning:
    export the table and make a plain Keras model with
    ``tfdist.checkpoint.serving_model``.

    Args:
        output_dim: Width of a row.
        embeddings_initializer: ``"uniform"``, ``"normal"``,
            ``"truncated_normal"``, ``"zeros"`` or such a Keras initializer
            (run by the PS, per id). Defaults to ``"uniform"``.
        optimizer: The row optimizer, as for :class:`ShardedEmbedding`.
            Defaults to the optimizer the model is compiled with.
        seed: Seed of the per-id initialisation. Defaults to 0.
        capacity: Rows each PS task holds at most; beyond it ``eviction``
            frees rows (and their optimizer slots). Defaults to ``None``
            (no bound).
        capacity_bytes: Bytes each PS task gives the table at most: it
            holds as many rows as fit, counting a row's values, optimizer
            slots, metadata and id index at their largest
            (``4 * output_dim * (1 + slots) + 161`` bytes) and the
            admission filter; with ``capacity`` too, the smaller bound
            holds. Defaults to ``None`` (no bound).
        eviction: ``"lru"`` (least recently updated) or ``"lfu"`` (least
            often updated). Defaults to ``"lru"``.
        ttl: Free a row not updated in this many of its table's updates
            (per PS task). Defaults to ``None`` (never).
        min_count: Pushes an id needs before it gets a row (admission);
            below it the id reads ``default_value`` and its gradients are
            dropped. Defaults to 1 (a row at first sight).
        filter_width: Counters per row of the admission filter (a count-min
            sketch of 2 rows of 16-bit counters: ``4 * filter_width``
            bytes per PS task). Defaults to ``2**20``.
        default_value: What an id not admitted yet reads (every element).
            Defaults to 0.0.
    """

    #: Marks the layers ``tfdist.checkpoint.serving_model`` replaces (it cannot import this module).
    _tfdist_dynamic_table = True

    def __init__(self, output_dim: int, embeddings_initializer: Any = "uniform", optimizer: Any = None,
                 seed: int = 0, capacity: int | None = None, eviction: str = "lru", ttl: int | None = None,
                 min_count: int = 1, filter_width: int = 1 << 20, default_value: float = 0.0,
                 capacity_bytes: int | None = None, **kwargs):
        super().__init__(**kwargs)
        from tfdist.ps.sparse import TableSpec

        self.output_dim = int(output_dim)
        self.embeddings_initializer = keras.initializers.get(embeddings_initializer)
        self.row_optimizer = None if optimizer is None else row_optimizer_spec(optimizer)
        self.seed = int(seed)
        self.options = {"capacity": capacity or 0, "eviction": eviction, "ttl": ttl or 0, "min_count": min_count,
                        "filter_width": filter_width, "default_value": default_value,
                        "capacity_bytes": capacity_bytes or 0}
        try:  # refused at construction, with the layer's name
            TableSpec(self.name, 0, self.output_dim, dynamic=self.options)
        except ValueError as e:
            raise ConfigError(f"DynamicEmbedding {self.name!r}: {e}") from None
        self._table_key: str | None = None
        self._runtime = None
        #: Whether the layer was called on strings (hashed first; a serving model hashes them the same way).
        self.string_inputs = False
        self._said_rows_not_saved = False

    def build(self, input_shape=None):
        runtime = current_ps_runtime()
        init = initializer_spec(self.embeddings_initializer)
        if runtime is None:
            logger.warning("DynamicEmbedding %r is built outside a tfdist parameter-server strategy: it holds no "
                           "rows and reads default_value=%s for every id. Train under a strategy; to serve a trained "
                           "table, export it and use tfdist.checkpoint.serving_model.", self.name,
                           self.options["default_value"])
            self._anchor = self.add_weight(shape=(), name="table_anchor", initializer="zeros", trainable=False)
            self.built = True
            return
        _require_ps_initializer(self, init)
        self._runtime = runtime
        self._anchor = self.add_weight(shape=(), name="table_anchor", initializer="zeros")
        self._table_key = runtime.register_table(self.name, 0, self.output_dim, init, self.row_optimizer, self.seed,
                                                 dict(self.options))
        self.built = True

    @property
    def table_key(self) -> str | None:
        """The table's key on the parameter servers (``ps_status()['tables']``, checkpoints, exports)."""
        return self._table_key

    def call(self, inputs):
        if inputs.dtype == "string":
            self.string_inputs = True
            inputs = hash_strings(inputs)
        if self._table_key is None:  # outside a strategy: no rows
            zeros = keras.ops.expand_dims(keras.ops.zeros_like(keras.ops.cast(inputs, "float32")), -1)
            return zeros + keras.ops.full((self.output_dim,), self.options["default_value"], dtype="float32")
        return lookup(self._runtime, self._table_key, self.output_dim, inputs, self._anchor.value)

    def save_own_variables(self, store):
        """Nothing: the rows are in the PS checkpoints and in exports (``tfdist.checkpoint``), not in model files.

        Saving a trained layer says so (a warning, once per layer): a model
        loaded from the file reads ``default_value`` for every id.
        """
        if self._table_key is not None and not self._said_rows_not_saved:  # once per layer (callbacks save often)
            self._said_rows_not_saved = True
            logger.warning("model.save/save_weights holds no rows of DynamicEmbedding %r: they live on the parameter "
                           "servers (and in their checkpoints). A model loaded from this file reads default_value=%s "
                           "for every id. To serve the table, export it (tfdist.checkpoint.export_table) and build a "
                           "plain Keras model with tfdist.checkpoint.serving_model.", self.name,
                           self.options["default_value"])

    def load_own_variables(self, store):
        """Nothing to load (see :meth:`save_own_variables`)."""

    def compute_output_shape(self, input_shape):
        return (*input_shape, self.output_dim)

    def get_config(self):
        opts = self.options
        return {**super().get_config(), "output_dim": self.output_dim,
                "embeddings_initializer": keras.initializers.serialize(self.embeddings_initializer),
                "optimizer": self.row_optimizer, "seed": self.seed, "capacity": opts["capacity"] or None,
                "eviction": opts["eviction"], "ttl": opts["ttl"] or None, "min_count": opts["min_count"],
                "filter_width": opts["filter_width"], "default_value": opts["default_value"],
                "capacity_bytes": opts["capacity_bytes"] or None}
