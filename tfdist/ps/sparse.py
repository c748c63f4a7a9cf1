"""PS-resident embedding tables: row sharding, initialisation and per-row optimizers, in numpy.

A *table* lives only on the parameter servers: row ``i`` of a table with
``num_shards`` PS tasks is row ``i // num_shards`` of shard ``i % num_shards``
(mod sharding: deterministic, and balanced for the power-law ids of real
vocabularies, whose frequent ids are spread over every task). Workers fetch
the rows a batch touches and send back row gradients; the PS applies an
optimizer to those rows only (:class:`RowOptimizer`): SGD (with momentum),
Adagrad, Adam (lazy: only touched rows' moments move; bias correction by the
table's update count, as TF Addons' LazyAdam) and FTRL, each the same
arithmetic as the Keras 3 optimizer of that name applied to the touched rows.

Nothing here does I/O or imports TensorFlow; :mod:`tfdist.ps.store` holds
the tables and checks every request before it applies it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = [
    "DYNAMIC_OPTIONS",
    "EVICTION_POLICIES",
    "INITIALIZERS",
    "OPTIMIZERS",
    "RowOptimizer",
    "Table",
    "TableSpec",
    "describe_table",
    "make_row_optimizer",
    "placement_rule",
    "shard_of",
    "shard_rows",
]

#: Row optimizers and their hyper-parameters (defaults as in Keras 3).
OPTIMIZERS: dict[str, dict[str, float | bool]] = {
    "sgd": {"learning_rate": 0.01, "momentum": 0.0, "nesterov": False},
    "adagrad": {"learning_rate": 0.001, "initial_accumulator_value": 0.1, "epsilon": 1e-7},
    "adam": {"learning_rate": 0.001, "beta_1": 0.9, "beta_2": 0.999, "epsilon": 1e-7},
    "ftrl": {"learning_rate": 0.001, "learning_rate_power": -0.5, "initial_accumulator_value": 0.1,
             "l1_regularization_strength": 0.0, "l2_regularization_strength": 0.0,
             "l2_shrinkage_regularization_strength": 0.0, "beta": 0.0},
}
#: Initialisers a PS can run itself (Keras's ``uniform``, ``normal``, ``truncated_normal``, ``zeros``).
INITIALIZERS = {"uniform": ("minval", "maxval"), "normal": ("mean", "stddev"),
                "truncated_normal": ("mean", "stddev"), "zeros": ()}
#: A dynamic table's options (:mod:`tfdist.ps.dynamic`) and their defaults: rows per PS task at most (0: no
#: bound), which rows eviction frees, updates of the table after which an unchanged row expires (0: never),
#: pushes an id needs before it gets a row, the admission filter's counters per row, the value of a row not
#: admitted yet.
DYNAMIC_OPTIONS: dict[str, Any] = {"capacity": 0, "eviction": "lru", "ttl": 0, "min_count": 1,
                                   "filter_width": 1 << 20, "default_value": 0.0, "capacity_bytes": 0}
#: Bytes a dynamic table's row takes beside its values and optimizer slots, at most: its id, recency, count,
#: live flag and free-list entry (33), and its share of the id index (kept at most half full and rebuilt at
#: four times the rows: up to 8 entries of 16 bytes per row).
DYNAMIC_ROW_OVERHEAD = 33 + 8 * 16
EVICTION_POLICIES = ("lru", "lfu")
_MAX_DYNAMIC_INT = 2**40


def _check_dynamic(key: str, options: Any) -> dict[str, Any]:
    """A dynamic table's options, completed with the defaults; raises ``ValueError`` on anything else."""
    if not isinstance(options, Mapping) or set(options) - set(DYNAMIC_OPTIONS):
        raise ValueError(f"Table {key!r}: dynamic options are a mapping of {sorted(DYNAMIC_OPTIONS)}. "
                         f"Received: {options!r}.")
    out = {**DYNAMIC_OPTIONS, **options}
    for name in ("capacity", "ttl", "min_count", "filter_width", "capacity_bytes"):
        v = out[name]
        low = 1 if name in ("min_count", "filter_width") else 0
        if isinstance(v, bool) or not isinstance(v, int) or not low <= v <= _MAX_DYNAMIC_INT:
            raise ValueError(f"Table {key!r}: {name} must be an integer in [{low}, 2**40]. Received: {name}={v!r}.")
    if out["eviction"] not in EVICTION_POLICIES:
        raise ValueError(f"Table {key!r}: eviction must be one of {EVICTION_POLICIES}. "
                         f"Received: eviction={out['eviction']!r}.")
    v = out["default_value"]
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or abs(v) > 3e38:
        raise ValueError(f"Table {key!r}: default_value must be a finite float32. Received: {v!r}.")
    out["default_value"] = float(v)
    return out


def dynamic_row_bytes(spec: "TableSpec") -> int:
    """Bytes one row of dynamic table ``spec`` takes on its PS task at most (values, slots, metadata, index)."""
    slots = len(make_row_optimizer(spec.optimizer).slot_names)
    return 4 * spec.dim * (1 + slots) + DYNAMIC_ROW_OVERHEAD


def dynamic_capacity_rows(spec: "TableSpec") -> int:
    """Rows per PS task dynamic table ``spec`` holds at most: the smaller of ``capacity`` and what
    ``capacity_bytes`` holds (less the admission filter); 0 when neither bounds it."""
    opts = spec.dynamic
    bounds = [opts["capacity"]] if opts["capacity"] else []
    if opts["capacity_bytes"]:
        bounds.append((opts["capacity_bytes"] - _filter_bytes(opts)) // dynamic_row_bytes(spec))
    return min(bounds) if bounds else 0


def _filter_bytes(opts: Mapping[str, Any]) -> int:
    return 4 * opts["filter_width"] if opts["min_count"] > 1 else 0


def shard_of(ids: np.ndarray, num_shards: int) -> tuple[np.ndarray, np.ndarray]:
    """``(shard, local row)`` of each global row id under mod sharding."""
    ids = np.asarray(ids, dtype=np.int64)
    return ids % num_shards, ids // num_shards


def shard_rows(rows: int, shard: int, num_shards: int) -> int:
    """How many rows of a ``rows``-row table shard ``shard`` of ``num_shards`` holds."""
    return max(0, (rows - shard + num_shards - 1) // num_shards)


def placement_rule(spec: "TableSpec", ps: int, num_ps: int) -> str:
    """Which rows of table ``spec`` PS task ``ps`` holds, in words (``strategy.placement_table()``)."""
    if spec.dynamic is not None:  # a hash of the id (salted SplitMix64) modulo the tasks
        return f"ids i with tfdist.ps.dynamic.shard_of_ids(i, {num_ps}) == {ps}"
    return f"rows i with i % {num_ps} == {ps}"


def describe_table(spec: "TableSpec", num_ps: int) -> dict:
    """``strategy.tables()``'s entry: the spec, and the rows each task holds (a dynamic table: its capacity)."""
    out = spec.to_dict()
    if spec.dynamic is not None:  # grows as ids arrive
        out["rows_per_task"] = None
        out["capacity_per_task"] = dynamic_capacity_rows(spec) or None
    else:
        out["rows_per_task"] = [shard_rows(spec.rows, ps, num_ps) for ps in range(num_ps)]
    return out


@dataclass(frozen=True)
class TableSpec:
    """A PS-resident table as every worker and PS task describes it (JSON-able with :meth:`to_dict`).

    Attributes:
        key: The table's key (as a variable key: creation index and name).
        rows: Rows of the whole table (the vocabulary).
        dim: Width of a row.
        dtype: ``"float32"`` (the only one supported).
        initializer: ``{"kind": "uniform", "minval": -0.05, "maxval": 0.05}``
            and the like (:data:`INITIALIZERS`); ``seed`` makes it deterministic.
        optimizer: ``{"kind": "adam", "learning_rate": ..., ...}`` (:data:`OPTIMIZERS`).
        dynamic: ``None`` for a table of ``rows`` rows (ids ``0 .. rows-1``);
            for a dynamic table (any int64 id, :mod:`tfdist.ps.dynamic`) its
            options (:data:`DYNAMIC_OPTIONS`, completed with the defaults),
            and ``rows`` is 0.
    """

    key: str
    rows: int
    dim: int
    dtype: str = "float32"
    initializer: dict = field(default_factory=lambda: {"kind": "uniform", "minval": -0.05, "maxval": 0.05})
    optimizer: dict = field(default_factory=lambda: {"kind": "sgd"})
    seed: int = 0
    dynamic: dict | None = None

    def __post_init__(self):
        if self.dynamic is not None:
            object.__setattr__(self, "dynamic", _check_dynamic(self.key, self.dynamic))
            if self.rows != 0 or isinstance(self.rows, bool):
                raise ValueError(f"Table {self.key!r}: a dynamic table has no row count (rows=0; its capacity is "
                                 f"an option). Received: rows={self.rows!r}.")
        elif not isinstance(self.rows, int) or isinstance(self.rows, bool) or self.rows < 1:
            raise ValueError(f"Table {self.key!r}: rows must be a positive integer. Received: rows={self.rows!r}.")
        if not isinstance(self.dim, int) or isinstance(self.dim, bool) or self.dim < 1:
            raise ValueError(f"Table {self.key!r}: dim must be a positive integer. Received: dim={self.dim!r}.")
        if not isinstance(self.seed, int) or isinstance(self.seed, bool):
            raise ValueError(f"Table {self.key!r}: seed must be an integer. Received: seed={self.seed!r}.")  # noqa: TRY004 (callers catch ValueError)
        if self.dtype != "float32":
            raise ValueError(f"Table {self.key!r}: only float32 tables are supported. Received: {self.dtype!r}.")
        kind = self.initializer.get("kind") if isinstance(self.initializer, Mapping) else None
        if kind not in INITIALIZERS or set(self.initializer) - {"kind", *INITIALIZERS[kind]} or not all(
                isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
                for k, v in self.initializer.items() if k != "kind"):
            raise ValueError(f"Table {self.key!r}: unknown initializer {self.initializer!r}. "
                             f"Kinds: {sorted(INITIALIZERS)} with fields {INITIALIZERS}.")
        make_row_optimizer(self.optimizer)  # raises on a bad spec
        if self.dynamic is not None and self.dynamic["capacity_bytes"] and dynamic_capacity_rows(self) < 1:
            need = dynamic_row_bytes(self) + _filter_bytes(self.dynamic)
            raise ValueError(f"Table {self.key!r}: capacity_bytes={self.dynamic['capacity_bytes']} holds no row: a row "
                             f"of dim {self.dim} with the {self.optimizer.get('kind')} optimizer's slots takes up to "
                             f"{dynamic_row_bytes(self)} bytes on its PS task (values, slots, id index)"
                             + (f", and the admission filter {_filter_bytes(self.dynamic)}" if _filter_bytes(
                                 self.dynamic) else "") + f". Give at least {need} bytes (or use capacity in rows).")

    @property
    def nbytes(self) -> int:
        return self.rows * self.dim * 4

    def to_dict(self) -> dict[str, Any]:
        out = {"key": self.key, "rows": self.rows, "dim": self.dim, "dtype": self.dtype,
               "initializer": dict(self.initializer), "optimizer": dict(self.optimizer), "seed": self.seed}
        if self.dynamic is not None:
            out["dynamic"] = dict(self.dynamic)
        return out

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> TableSpec:
        default = cls.__dataclass_fields__
        initializer = d.get("initializer")
        optimizer = d.get("optimizer")
        return cls(str(d["key"]), d["rows"], d["dim"], d.get("dtype", "float32"),
                   default["initializer"].default_factory() if initializer is None else initializer,
                   default["optimizer"].default_factory() if optimizer is None else optimizer,
                   d.get("seed", 0), d.get("dynamic"))


class RowOptimizer:
    """Applies an optimizer to some rows of a table (values and slots are this shard's arrays)."""

    kind = "base"
    slot_names: tuple[str, ...] = ()

    def __init__(self, **params):
        self.params = {**OPTIMIZERS[self.kind], **params}

    def init_slots(self, rows: int, dim: int) -> dict[str, np.ndarray]:
        return {name: np.zeros((rows, dim), np.float32) for name in self.slot_names}

    def apply(self, values: np.ndarray, slots: dict[str, np.ndarray], rows: np.ndarray, grads: np.ndarray,
              learning_rate: float, step: int) -> None:
        """Updates ``values[rows]`` (unique sorted rows, or a slice) with their summed ``grads``; ``step`` counts from 1."""
        raise NotImplementedError

    def spec(self) -> dict[str, Any]:
        return {"kind": self.kind, **self.params}


class _SGD(RowOptimizer):
    kind = "sgd"

    @property
    def slot_names(self):  # type: ignore[override]
        return ("momentum",) if self.params["momentum"] else ()

    def apply(self, values, slots, rows, grads, learning_rate, step):
        lr = np.float32(learning_rate)
        momentum = self.params["momentum"]
        if not momentum:
            values[rows] -= grads * lr
            return
        m = slots["momentum"]
        mom = np.float32(momentum)
        m[rows] = m[rows] * mom - grads * lr
        if self.params["nesterov"]:
            values[rows] += m[rows] * mom - grads * lr
        else:
            values[rows] += m[rows]


class _Adagrad(RowOptimizer):
    kind = "adagrad"
    slot_names = ("accumulator",)

    def init_slots(self, rows, dim):
        return {"accumulator": np.full((rows, dim), self.params["initial_accumulator_value"], np.float32)}

    def apply(self, values, slots, rows, grads, learning_rate, step):
        acc = slots["accumulator"]
        acc[rows] += np.square(grads)
        values[rows] -= np.float32(learning_rate) * grads / np.sqrt(acc[rows] + np.float32(self.params["epsilon"]))


class _Adam(RowOptimizer):
    kind = "adam"
    slot_names = ("m", "v")

    def apply(self, values, slots, rows, grads, learning_rate, step):
        b1, b2 = np.float32(self.params["beta_1"]), np.float32(self.params["beta_2"])
        t = np.float32(step)
        alpha = np.float32(learning_rate) * np.sqrt(1 - b2 ** t) / (1 - b1 ** t)
        m, v = slots["m"], slots["v"]
        m[rows] += (grads - m[rows]) * (1 - b1)
        v[rows] += (np.square(grads) - v[rows]) * (1 - b2)
        values[rows] -= m[rows] * alpha / (np.sqrt(v[rows]) + np.float32(self.params["epsilon"]))


class _Ftrl(RowOptimizer):
    kind = "ftrl"
    slot_names = ("accumulator", "linear")

    def init_slots(self, rows, dim):
        return {"accumulator": np.full((rows, dim), self.params["initial_accumulator_value"], np.float32),
                "linear": np.zeros((rows, dim), np.float32)}

    def apply(self, values, slots, rows, grads, learning_rate, step):
        p = self.params
        lr = np.float32(learning_rate)
        lr_power = np.float32(p["learning_rate_power"])
        l1 = np.float32(p["l1_regularization_strength"])
        l2 = np.float32(p["l2_regularization_strength"]) + np.float32(p["beta"]) / (2 * lr)
        var = values[rows]
        accum = slots["accumulator"][rows]
        grad_to_use = grads + 2 * np.float32(p["l2_shrinkage_regularization_strength"]) * var
        new_accum = accum + np.square(grads)
        linear = slots["linear"][rows] + grad_to_use - (np.power(new_accum, -lr_power)
                                                        - np.power(accum, -lr_power)) / lr * var
        quadratic = np.power(new_accum, -lr_power) / lr + 2 * l2
        values[rows] = (np.clip(linear, -l1, l1) - linear) / quadratic
        slots["linear"][rows] = linear
        slots["accumulator"][rows] = new_accum


_OPTIMIZER_CLASSES = {c.kind: c for c in (_SGD, _Adagrad, _Adam, _Ftrl)}


def make_row_optimizer(spec: Mapping[str, Any]) -> RowOptimizer:
    """The row optimizer of ``{"kind": ..., hyper-parameters}``; raises ``ValueError`` on anything else."""
    if not isinstance(spec, Mapping) or spec.get("kind") not in _OPTIMIZER_CLASSES:
        raise ValueError(f"Unknown row optimizer {spec!r}. Kinds: {sorted(_OPTIMIZER_CLASSES)}.")
    kind = spec["kind"]
    params = {k: v for k, v in spec.items() if k != "kind"}
    unknown = set(params) - set(OPTIMIZERS[kind])
    if unknown:
        raise ValueError(f"Row optimizer {kind!r} has no parameter(s) {sorted(unknown)}; it takes "
                         f"{sorted(OPTIMIZERS[kind])}.")
    for name, value in params.items():
        default = OPTIMIZERS[kind][name]
        if isinstance(default, bool):
            if not isinstance(value, bool):
                raise ValueError(f"Row optimizer {kind!r}: {name} must be true or false. Received: {value!r}.")  # noqa: TRY004
        elif isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise ValueError(f"Row optimizer {kind!r}: {name} must be a finite number. Received: {value!r}.")
    return _OPTIMIZER_CLASSES[kind](**params)


class Table:
    """One PS task's shard of a table: its rows, the optimizer's slots, the count of updates applied."""

    dynamic = False

    def __init__(self, spec: TableSpec, shard: int, num_shards: int):
        self.spec, self.shard, self.num_shards = spec, shard, num_shards
        self.num_rows = shard_rows(spec.rows, shard, num_shards)
        self.optimizer = make_row_optimizer(spec.optimizer)
        self.values = _initial_rows(spec, shard, num_shards, self.num_rows)
        self.slots = self.optimizer.init_slots(self.num_rows, spec.dim)
        #: Optimizer applications so far (Adam's bias correction counts them).
        self.updates = 0

    def lookup(self, rows: np.ndarray) -> np.ndarray:
        return self.values[rows]

    def apply(self, rows: np.ndarray, grads: np.ndarray, learning_rate: float | None) -> None:
        """Sums the gradients of repeated rows, then applies the optimizer to each row once."""
        unique, inverse = np.unique(rows, return_inverse=True)  # sorted; inverse: each row's place in it
        grads = np.asarray(grads, np.float32)
        summed = np.empty((len(unique), self.spec.dim), np.float32) if len(unique) == len(rows) else None
        if summed is not None:
            summed[inverse] = grads
        else:
            summed = np.zeros((len(unique), self.spec.dim), np.float32)
            np.add.at(summed, inverse, grads)
        grads = summed
        self.updates += 1
        lr = self.optimizer.params["learning_rate"] if learning_rate is None else learning_rate
        self.optimizer.apply(self.values, self.slots, unique, grads.astype(np.float32, copy=False), lr,
                             self.updates)

    def write(self, rows: np.ndarray, values: np.ndarray) -> None:
        """Sets rows (distinct) to ``values``; the optimizer's slots stay."""
        self.values[rows] = values

    def arrays(self) -> dict[str, np.ndarray]:
        """Values and slots, for checkpoints."""
        return {"values": self.values, **{f"slot/{k}": v for k, v in self.slots.items()}}

    def load(self, arrays: Mapping[str, np.ndarray], updates: int) -> None:
        self.values = np.array(arrays["values"], np.float32, copy=True)
        self.slots = {k: np.array(arrays[f"slot/{k}"], np.float32, copy=True) for k in self.slots}
        self.updates = updates


def _initial_rows(spec: TableSpec, shard: int, num_shards: int, num_rows: int) -> np.ndarray:
    init = spec.initializer
    kind = init["kind"]
    shape = (num_rows, spec.dim)
    if kind == "zeros":
        return np.zeros(shape, np.float32)
    rng = np.random.default_rng([spec.seed, shard, num_shards])
    if kind == "uniform":
        low, high = init.get("minval", -0.05), init.get("maxval", 0.05)
        return (rng.random(shape, dtype=np.float32) * np.float32(high - low) + np.float32(low))
    mean, stddev = np.float32(init.get("mean", 0.0)), np.float32(init.get("stddev", 0.05))
    values = rng.standard_normal(shape, dtype=np.float32)
    if kind == "truncated_normal":  # redraw beyond two standard deviations, as Keras does
        bad = np.abs(values) > 2
        while bad.any():
            values[bad] = rng.standard_normal(int(bad.sum()), dtype=np.float32)
            bad = np.abs(values) > 2
    return values * stddev + mean
