"""This PS task's shards of the PS-resident tables (:mod:`tfdist.ps.sparse`), as the store holds them.

Owns (PS side): the tables by key, their rows, optimizer slots and update
counts; dynamic tables (:class:`~tfdist.ps.dynamic.DynamicTable`: any int64
id, rows created at first sight) beside fixed ones. Allocation is checked (a table too large for this machine is
refused with ``RESOURCE_EXHAUSTED``, never an internal error); a lookup's
reply size is checked before any row is gathered; a row update of several
tables applies all of them or none (under ``nonfinite: refuse`` an update
whose result is not finite is undone and refused); an update of no rows
changes nothing (Adam's step count included).

Every method runs with the store's lock held, except :meth:`TableShards.allocate`
(it builds new tables, touching nothing held). No sockets, no TensorFlow.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from tfdist.ps._schema import SchemaError
from tfdist.ps._variables import all_finite
from tfdist.ps._waits import StoreError
from tfdist.ps.dynamic import COUNTERS, DynamicTable
from tfdist.ps.protocol import RequestError, TableShard, _table_shard, short
from tfdist.ps.sparse import Table, dynamic_capacity_rows, shard_rows

__all__ = ["TableShards"]


def _available_bytes() -> int | None:
    """Memory this machine can still give (``MemAvailable``), or ``None`` where it cannot be read."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def _shard_bytes(shard: TableShard) -> int:
    """Bytes a table shard takes: its rows and up to two optimizer slots of the same size."""
    spec = shard.spec
    slots = {"sgd": 1, "adagrad": 1, "adam": 2, "ftrl": 2}.get(str(spec.optimizer.get("kind")), 2)
    if spec.dynamic is not None:  # at its capacity (unbounded: what it starts with)
        rows = dynamic_capacity_rows(spec) or 1024
        return rows * (spec.dim * 4 * (1 + slots) + 64) + 4 * spec.dynamic["filter_width"] * (spec.dynamic["min_count"] > 1)
    return shard_rows(spec.rows, shard.shard, shard.num_shards) * spec.dim * 4 * (1 + slots)


class TableShards:
    """The tables of one PS task, by key."""

    def __init__(self):
        self.tables: dict[str, Table] = {}

    @staticmethod
    def allocate(shards: Iterable[TableShard], nonfinite: str) -> dict[str, Table]:
        """Builds (and initialises) the tables of an ``Init``; refuses what does not fit or is not finite."""
        shards = list(shards)
        need = sum(_shard_bytes(s) for s in shards)
        available = _available_bytes()
        if shards and available is not None and need > available:
            raise StoreError(f"The tables' shards need {need / 2**30:.1f} GiB on this parameter server; it has "
                             f"{available / 2**30:.1f} GiB free. Use more PS tasks or smaller tables.",
                             grpc_code="RESOURCE_EXHAUSTED")
        tables = {}
        for s in shards:
            try:
                with np.errstate(over="ignore", invalid="ignore"):  # checked below
                    cls = DynamicTable if s.spec.dynamic is not None else Table
                    tables[s.spec.key] = cls(s.spec, s.shard, s.num_shards)
            except (MemoryError, ValueError, OverflowError) as e:
                raise StoreError(f"Table {short(s.spec.key)} ({s.spec.rows} x {s.spec.dim}) cannot be allocated on "
                                 f"this parameter server ({short(str(e), 120)}). Use more PS tasks or a smaller "
                                 "table.", grpc_code="RESOURCE_EXHAUSTED") from None
            if nonfinite != "allow" and not all_finite(tables[s.spec.key].values):
                raise StoreError(f"Table {short(s.spec.key)}'s initializer {short(s.spec.initializer)} gives "
                                 "non-finite rows (it does not fit float32); the job refuses such values.")
        return tables

    def install(self, tables: dict[str, Table]) -> None:
        """The tables of an ``Init`` or a restored checkpoint (built and checked by :meth:`allocate`)."""
        self.tables = tables

    def check_same(self, shards: Iterable[TableShard]) -> None:
        theirs = {t.spec.key: (t.spec, t.shard, t.num_shards) for t in shards}
        mine = {k: (t.spec, t.shard, t.num_shards) for k, t in self.tables.items()}
        if theirs != mine:
            diff = sorted(set(theirs) ^ set(mine)) or sorted(k for k in theirs if theirs[k] != mine.get(k))
            raise StoreError(
                f"This worker's PS-resident tables differ from the ones the parameter servers hold (first "
                f"differences: {short(diff[:4], 300)}). Every worker must build the same model.",
                grpc_code="FAILED_PRECONDITION")

    def get(self, key: str) -> Table:
        table = self.tables.get(key)
        if table is None:
            raise StoreError(f"Unknown table {short(key)} on this parameter server. It holds "
                             f"{len(self.tables)} table(s), e.g. {short(list(self.tables)[:4], 200)}.",
                             grpc_code="NOT_FOUND")
        return table

    @staticmethod
    def check_rows(table: Table | DynamicTable, rows: np.ndarray) -> None:
        if table.dynamic:
            mine = table.owns(rows)
            if not mine.all():
                raise StoreError(f"Ids {rows[~mine][:4].tolist()} of dynamic table {short(table.spec.key)} belong to "
                                 f"other PS tasks than shard {table.shard} of {table.num_shards} (an id's task is "
                                 "tfdist.ps.dynamic.shard_of_ids).", grpc_code="OUT_OF_RANGE")
            return
        if rows.size and (int(rows.min()) < 0 or int(rows.max()) >= table.num_rows):
            bad = rows[(rows < 0) | (rows >= table.num_rows)][:4].tolist()
            raise StoreError(f"Rows {bad} are outside {short(table.spec.key)}'s shard {table.shard} of "
                             f"{table.num_shards} ({table.num_rows} rows: 0..{table.num_rows - 1}).",
                             grpc_code="OUT_OF_RANGE")

    @staticmethod
    def check_reply_size(tables: list[Table], rows: np.ndarray, limit: int | None) -> None:
        """A lookup whose reply would exceed the message limit is refused before any row is gathered."""
        size = int(rows.size) * sum(t.spec.dim for t in tables) * 4
        if limit is not None and size > limit:
            raise StoreError(f"A lookup of {rows.size} rows would answer {size / 2**20:.1f} MiB; replies are "
                             f"limited to {limit / 2**20:.1f} MiB (ps.max_message_bytes). Look up fewer ids per "
                             "request.", grpc_code="RESOURCE_EXHAUSTED")

    def apply(self, tables: list[Table], rows: np.ndarray, grads: list[np.ndarray], learning_rate: float | None,
              nonfinite: str, worker: int) -> bool:
        """Applies row gradients to every table, or to none; returns False when there were no rows."""
        if rows.size == 0:
            return False
        # dynamic tables: computed first, committed once everything passed (nothing to undo)
        with np.errstate(over="ignore", invalid="ignore"):  # a non-finite result is checked below
            prepared = [(t, t.prepare(rows, g, learning_rate)) for t, g in zip(tables, grads) if t.dynamic]
        if nonfinite != "allow":
            bad = [t.spec.key for t, p in prepared if not p.finite()]
            if bad:
                raise StoreError(f"Row update of {short(bad[:4])} from worker {worker} gives non-finite values "
                                 "(the learning rate or the gradients are too large): refused, nothing applied.")
        grads = [g for t, g in zip(tables, grads) if not t.dynamic]
        tables = [t for t in tables if not t.dynamic]
        saved = [_saved_rows(t, rows) for t in tables] if nonfinite != "allow" else None
        with np.errstate(over="ignore", invalid="ignore"):  # a non-finite result is checked below
            for table, g in zip(tables, grads):
                table.apply(rows, g, learning_rate)
        if saved is not None:
            bad = [t.spec.key for t, s in zip(tables, saved) if not _rows_finite(t, s[0])]
            if bad:
                for table, s in zip(tables, saved):
                    _restore_rows(table, s)
                raise StoreError(f"Row update of {short(bad[:4])} from worker {worker} gives non-finite values "
                                 "(the learning rate or the gradients are too large): refused, nothing applied.")
        for table, p in prepared:
            table.commit(p)
        return True

    # ------------------------------------------------------------------ schema
    def arrays(self) -> dict[str, np.ndarray]:
        """Every table's values and slots, keyed ``table/<key>/<array>`` (copies)."""
        return {f"table/{key}/{name}": a.copy() for key, t in self.tables.items() for name, a in t.arrays().items()}

    def state(self) -> dict[str, Any]:
        return {"tables": {**self.arrays(), **{f"table/{k}/{n}": v for k, t in self.tables.items()
                                               for n, v in _meta(t).items()}}}

    def checkpoint(self) -> list[dict[str, Any]]:
        return [{**TableShard(t.spec, t.shard, t.num_shards).to_dict(), **_meta(t)} for t in self.tables.values()]

    @staticmethod
    def parse_checkpoint(entries: Any, arrays: Mapping[str, np.ndarray], nonfinite: str) -> dict[str, Table]:
        """A checkpoint's tables, validated whole and built (nothing held is touched)."""
        if entries is None:
            entries = []
        if not isinstance(entries, list):
            raise SchemaError(f"`tables` must be a list; it holds {short(entries)}")
        tables = {}
        for d in entries:
            if not isinstance(d, dict):
                raise SchemaError(f"a table entry is not an object: {short(d)}")
            try:
                shard = _table_shard("checkpoint", {k: v for k, v in d.items() if k not in ("updates", *COUNTERS)})
            except RequestError as e:
                raise SchemaError(str(e)) from None
            counts = {name: d.get(name, 0) for name in ("updates", *(COUNTERS if shard.spec.dynamic else ()))}
            for name, v in counts.items():
                if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= 2**53:
                    raise SchemaError(f"table {short(shard.spec.key)}: `{name}` holds {short(v)}")
            updates = counts.pop("updates")
            prefix = f"table/{shard.spec.key}/"
            mine = {k[len(prefix):]: v for k, v in arrays.items() if k.startswith(prefix)}
            if shard.spec.dynamic is not None:
                tables[shard.spec.key] = _parse_dynamic(shard, mine, updates, counts, nonfinite)
                continue
            num_rows = shard_rows(shard.spec.rows, shard.shard, shard.num_shards)
            if "values" not in mine or mine["values"].shape != (num_rows, shard.spec.dim) or any(
                    a.shape != (num_rows, shard.spec.dim) for a in mine.values()):
                raise SchemaError(f"the checkpoint's table {short(shard.spec.key)} is incomplete or of another shape")
            if nonfinite != "allow" and not all(all_finite(a) for a in mine.values()):
                raise SchemaError(f"the checkpoint's table {short(shard.spec.key)} holds non-finite values")
            table = TableShards.allocate([shard], "allow")[shard.spec.key]
            if set(mine) != set(table.arrays()):
                raise SchemaError(f"the checkpoint's table {short(shard.spec.key)} has arrays {sorted(mine)}; its "
                                  f"optimizer keeps {sorted(table.arrays())}")
            table.load(mine, updates)
            tables[shard.spec.key] = table
        return tables

    def status(self) -> dict[str, Any]:
        return {k: {"dim": t.spec.dim, "shard": t.shard, "num_shards": t.num_shards, "updates": t.updates,
                    "optimizer": t.optimizer.kind, "dynamic": True, **t.status()} if t.dynamic else
                {"rows": t.num_rows, "dim": t.spec.dim, "shard": t.shard, "num_shards": t.num_shards,
                    "updates": t.updates, "optimizer": t.optimizer.kind,
                    "bytes": int(sum(a.nbytes for a in t.arrays().values()))}
                for k, t in self.tables.items()}


def _saved_rows(table: Table, rows: np.ndarray):
    unique = np.unique(rows)
    return unique, table.values[unique].copy(), {k: s[unique].copy() for k, s in table.slots.items()}, table.updates


def _rows_finite(table: Table, unique: np.ndarray) -> bool:
    return all_finite(table.values[unique]) and all(all_finite(s[unique]) for s in table.slots.values())


def _restore_rows(table: Table, saved) -> None:
    unique, values, slots, updates = saved
    table.values[unique] = values
    for k, s in slots.items():
        table.slots[k][unique] = s
    table.updates = updates


def _meta(table) -> dict[str, int]:
    """A table's counts (checkpointed beside its arrays): updates; a dynamic table's counters too."""
    return table.meta() if table.dynamic else {"updates": table.updates}


def _parse_dynamic(shard: TableShard, mine: Mapping[str, np.ndarray], updates: int, counters: dict[str, int],
                   nonfinite: str) -> DynamicTable:
    """A checkpoint's dynamic table, validated whole (ids distinct and this shard's; shapes; finite) and built."""
    key, dim = short(shard.spec.key), shard.spec.dim
    table = DynamicTable(shard.spec, shard.shard, shard.num_shards)
    expected = set(table.arrays())
    if set(mine) != expected:
        raise SchemaError(f"the checkpoint's dynamic table {key} has arrays {sorted(mine)}; it keeps {sorted(expected)}")
    ids = mine["ids"]
    n = len(ids) if ids.ndim == 1 else -1
    if ids.dtype != np.int64 or n < 0 or any(mine[k].shape != (n, dim) for k in mine if k in ("values",)
                                             or k.startswith("slot/")) \
            or any(mine[k].shape != (n,) or mine[k].dtype != np.int64 for k in ("last", "count")) \
            or ("filter" in mine and (mine["filter"].shape != table.sketch.shape or mine["filter"].dtype != np.uint16)):
        raise SchemaError(f"the checkpoint's dynamic table {key} is incomplete or of another shape")
    if len(np.unique(ids)) != n or not table.owns(ids).all():
        raise SchemaError(f"the checkpoint's dynamic table {key} holds repeated ids or ids of other shards")
    if table.capacity and n > table.capacity:
        raise SchemaError(f"the checkpoint's dynamic table {key} holds {n} rows; its capacity is {table.capacity}")
    if nonfinite != "allow" and not all(all_finite(mine[k]) for k in mine if k == "values" or k.startswith("slot/")):
        raise SchemaError(f"the checkpoint's dynamic table {key} holds non-finite values")
    table.load(mine, updates, counters)
    return table
