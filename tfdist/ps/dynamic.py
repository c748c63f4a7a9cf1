"""Dynamic PS-resident tables: rows keyed by any int64 id, created at first sight, admitted by count, evicted.

A dynamic table (``tfdist.layers.DynamicEmbedding``) has no vocabulary size:
id ``i`` (any int64) lives on PS task ``hash64(i) % num_shards``
(:func:`shard_of_ids`), and that task creates its row when the row's first
gradient arrives, with values that depend only on the table's initializer,
its seed and the id (:func:`initial_rows`): a restarted task, another task
or a worker computing it gets the same row. Until then a lookup reads that
initial row (or, under admission, the table's default vector) and creates
nothing: lookups never change a table.

On the PS (:class:`DynamicTable`), every operation is vectorised over the
batch's ids (no per-id Python loop): an open-addressing hash index
(:class:`IdIndex`, linear probing, one numpy round per probe step) maps
ids to row slots; rows and the optimizer's slots are arrays grown by
doubling up to the table's capacity.

* **Admission** (``min_count`` > 1): an id gets a row once its gradients
  arrived in ``min_count`` pushes (steps, on the gradient path); until then
  its gradients are dropped and it reads the default vector. Counts live
  in a count-min sketch of ``filter_width`` x 2 saturating 16-bit counters
  (bounded memory; it may over-count an id that shares both counters
  with others, never under-count).
* **Eviction** (``capacity`` rows per PS task, or as many as ``capacity_bytes``
  holds, :func:`~tfdist.ps.sparse.dynamic_capacity_rows`): creating rows beyond it
  first frees the least recently updated (``lru``) or least often updated
  (``lfu``, ties broken by recency) rows not in the batch, 1/16 of the capacity more than needed
  so eviction runs once per many batches; ``ttl`` frees rows not updated
  in that many of the table's updates (checked every ``ttl // 4`` updates).
  Freed slots are reused; the memory stays within the capacity. Choosing
  the victims means ordering every row, which the PS does under its lock
  (lookups wait). From a capacity of :data:`CHOOSE_AHEAD_FROM` rows, once
  the table is 7/8 full, the next victims are chosen ahead on a thread of
  their own, from a copy of the rows' recency and counts (:class:`~tfdist.ps._eviction.Ahead`):
  the eviction itself then only frees them (those updated since the copy are
  skipped, as they are no longer the oldest), and chooses under the lock only
  if the candidates ran out. For ``lru`` the victims are exactly those a
  choice at eviction time would make; for ``lfu`` rows created after the
  copy are candidates only from the next choice on.

An update is computed before anything changes (:meth:`DynamicTable.prepare`,
then :meth:`DynamicTable.commit`), so a refused update (non-finite result)
changes nothing. No I/O, no TensorFlow.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from tfdist.ps._eviction import Ahead as _Ahead
from tfdist.ps._eviction import eviction_order as _eviction_order
from tfdist.ps.sparse import TableSpec, dynamic_capacity_rows, make_row_optimizer

__all__ = ["DynamicTable", "IdIndex", "hash64", "initial_rows", "shard_of_ids"]

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
#: Salts keeping the sharding hash, the index's hash and the initializer's streams independent.
_SHARD_SALT = np.uint64(0x5D1E5A17C0FFEE01)
_FILTER_SALTS = (np.uint64(0x2545F4914F6CDD1D), np.uint64(0x61C8864680B583EB))
_EMPTY, _DELETED = -1, -2
#: Elements of initial rows made at once (their uint64 temporaries: 1 MiB each).
_INIT_CHUNK_ELEMENTS = 1 << 17
#: Capacity (rows per task) from which eviction victims are chosen ahead, on a thread: below it a choice
#: under the lock costs less than a thread (ordering 64 k rows takes about a millisecond).
CHOOSE_AHEAD_FROM = 1 << 16


def hash64(x: np.ndarray) -> np.ndarray:
    """SplitMix64's finaliser of each element (uint64 in, uint64 out): a bijection that mixes every bit."""
    z = np.asarray(x).astype(np.uint64, copy=True)
    z += _GOLDEN
    z ^= z >> np.uint64(30)
    z *= _M1
    z ^= z >> np.uint64(27)
    z *= _M2
    z ^= z >> np.uint64(31)
    return z


def _as_u64(ids: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(ids, np.int64).view(np.uint64)


def shard_of_ids(ids: np.ndarray, num_shards: int) -> np.ndarray:
    """The PS task (``0 .. num_shards - 1``) holding each id of a dynamic table: ``hash64(id) % num_shards``."""
    return (hash64(_as_u64(ids) ^ _SHARD_SALT) % np.uint64(num_shards)).astype(np.int64)


def _uniform(ids_u64: np.ndarray, seed: int, dim: int, stream: int) -> np.ndarray:
    """U[0, 1) float32 of shape (n, dim), a pure function of (seed, stream, id, column)."""
    base = hash64(ids_u64 ^ hash64(np.array([seed, stream], np.int64).view(np.uint64)).sum(dtype=np.uint64))
    z = hash64(base[:, None] + np.arange(1, dim + 1, dtype=np.uint64)[None, :] * _GOLDEN)
    return (z >> np.uint64(40)).astype(np.float32) * np.float32(2.0 ** -24)


def initial_rows(initializer: Mapping[str, Any], seed: int, ids: np.ndarray, dim: int) -> np.ndarray:
    """The initial rows of ``ids`` (float32, ``(len(ids), dim)``): deterministic per (seed, id), not per shard.

    ``uniform`` (``minval``, ``maxval``), ``normal`` and ``truncated_normal``
    (``mean``, ``stddev``; Box-Muller, redrawn beyond two deviations as
    Keras does) or ``zeros``, as :data:`tfdist.ps.sparse.INITIALIZERS`.
    """
    kind = initializer["kind"]
    n = len(ids)
    if kind == "zeros" or n == 0:
        return np.zeros((n, dim), np.float32)
    chunk = max(1, _INIT_CHUNK_ELEMENTS // dim)
    if n > chunk:  # a chunk's temporaries stay in the cache
        return np.concatenate([initial_rows(initializer, seed, ids[i:i + chunk], dim) for i in range(0, n, chunk)])
    u = _as_u64(ids)
    if kind == "uniform":
        low, high = initializer.get("minval", -0.05), initializer.get("maxval", 0.05)
        return _uniform(u, seed, dim, 0) * np.float32(high - low) + np.float32(low)
    mean, stddev = np.float32(initializer.get("mean", 0.0)), np.float32(initializer.get("stddev", 0.05))

    def normal(stream):
        u1 = np.float32(1.0) - _uniform(u, seed, dim, 2 * stream)  # (0, 1]
        u2 = _uniform(u, seed, dim, 2 * stream + 1)
        return (np.sqrt(np.float32(-2.0) * np.log(u1)) * np.cos(np.float32(2 * np.pi) * u2)).astype(np.float32)

    values = normal(0)
    if kind == "truncated_normal":
        stream = 1
        bad = np.abs(values) > 2
        while bad.any():  # each round redraws ~4.6 % of the rest: a few rounds
            values[bad] = normal(stream)[bad]
            bad = np.abs(values) > 2
            stream += 1
    return values * stddev + mean


class IdIndex:
    """An open-addressing hash map from int64 ids to int64 slots, vectorised over a batch of ids.

    Linear probing; every operation runs one numpy round per probe step
    (at most :attr:`max_probe` + 1 rounds) over all the ids still looking.
    The array is kept at most half full (tombstones included), rebuilt
    when deletions leave too many tombstones.
    """

    def __init__(self, expected: int = 0):
        self._allocate(_power_of_two(max(16, 2 * expected)))

    def _allocate(self, cap: int) -> None:
        # an id and its slot side by side: a probe reads one cache line
        self.entries = np.zeros((cap, 2), np.int64)
        self.entries[:, 1] = _EMPTY
        self.keys, self.slots = self.entries[:, 0], self.entries[:, 1]
        self.size = 0
        self.deleted = 0
        self.max_probe = 0

    def _home(self, ids: np.ndarray) -> np.ndarray:
        return (hash64(_as_u64(ids)) & np.uint64(len(self.keys) - 1)).astype(np.int64)

    def find(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(slot, position) of each id; -1 for ids not held."""
        ids = np.asarray(ids, np.int64)
        n = len(ids)
        out, where = np.full(n, -1, np.int64), np.full(n, -1, np.int64)
        p = self._home(ids)
        todo, want = np.arange(n), ids
        mask = len(self.keys) - 1
        for _ in range(self.max_probe + 1):  # the ids still looking, compacted every round
            if not todo.size:
                break
            entries = np.take(self.entries, p, axis=0)
            s = entries[:, 1]
            hit = (s >= 0) & (entries[:, 0] == want)
            if hit.any():
                found = todo[hit]
                out[found], where[found] = s[hit], p[hit]
            go_on = ~hit & (s != _EMPTY)
            todo, want, p = todo[go_on], want[go_on], (p[go_on] + 1) & mask
        return out, where

    def insert(self, ids: np.ndarray, slots: np.ndarray) -> None:
        """Adds ``ids`` (distinct, none held) with their ``slots``."""
        ids, slots = np.asarray(ids, np.int64), np.asarray(slots, np.int64)
        if 2 * (self.size + self.deleted + len(ids)) > len(self.keys):
            self._rebuild(_power_of_two(4 * (self.size + len(ids))))
        self._place(ids, slots)

    def _place(self, ids: np.ndarray, slots: np.ndarray) -> None:
        pos = self._home(ids)
        todo = np.arange(len(ids))
        mask = len(self.keys) - 1
        distance = 0
        while todo.size:
            p = pos[todo]
            free = self.slots[p] < 0
            cand, cand_pos = todo[free], p[free]
            taken_pos, first = np.unique(cand_pos, return_index=True)  # one id per free position this round
            winners = cand[first]
            self.deleted -= int((self.slots[taken_pos] == _DELETED).sum())
            self.keys[taken_pos], self.slots[taken_pos] = ids[winners], slots[winners]
            self.size += len(winners)
            if len(winners):
                self.max_probe = max(self.max_probe, distance)
            placed = np.zeros(len(ids), bool)
            placed[winners] = True
            todo = todo[~placed[todo]]
            pos[todo] = (pos[todo] + 1) & mask
            distance += 1

    def delete(self, ids: np.ndarray) -> None:
        """Removes ``ids`` (each held)."""
        _, where = self.find(ids)
        where = where[where >= 0]
        self.slots[where] = _DELETED
        self.size -= len(where)
        self.deleted += len(where)
        if self.deleted > len(self.keys) // 4:
            self._rebuild(_power_of_two(max(16, 4 * self.size)))

    def _rebuild(self, cap: int) -> None:
        live = self.slots >= 0
        keys, slots = self.keys[live], self.slots[live]
        self._allocate(cap)
        self._place(keys, slots)

    @property
    def nbytes(self) -> int:
        return self.entries.nbytes


def take_rows(a: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """``a[idx]`` for a 2-D array: ``np.take`` (several times faster than advanced indexing of rows)."""
    return np.take(a, idx, axis=0)


def put_rows(a: np.ndarray, idx: np.ndarray, values: np.ndarray) -> None:
    """``a[idx] = values`` for a C-contiguous 2-D array, each row moved as one opaque item (a 1-D scatter:
    tens of times faster than advanced indexing of rows for a few thousand rows)."""
    values = np.ascontiguousarray(values, a.dtype)
    if values.shape[1:] != a.shape[1:] or not a.flags.c_contiguous or a.shape[1] == 0:
        a[idx] = values
        return
    row = np.dtype((np.void, a.dtype.itemsize * a.shape[1]))
    a.view(row).reshape(len(a))[idx] = values.view(row).reshape(len(values))


def sum_by_id(ids: np.ndarray, grads: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(sorted distinct ids, the sum of each one's gradient rows): one sort, no per-row ``np.add.at``."""
    if len(ids) < 2 or bool((ids[1:] > ids[:-1]).all()):  # distinct and sorted already
        return ids, grads
    order = np.argsort(ids, kind="stable")
    ids_sorted = ids[order]
    starts = np.flatnonzero(np.concatenate([[True], ids_sorted[1:] != ids_sorted[:-1]]))
    unique = ids_sorted[starts]
    grads = take_rows(grads, order)
    if len(unique) == len(ids):
        return unique, grads
    return unique, np.add.reduceat(grads, starts, axis=0)


def _power_of_two(n: int) -> int:
    return 1 << max(4, int(n - 1).bit_length())


@dataclass
class PreparedUpdate:
    """An update computed by :meth:`DynamicTable.prepare`, applied by :meth:`DynamicTable.commit`."""

    old_ids: np.ndarray      # ids with a row (their slots in old_slots)
    old_slots: np.ndarray
    new_ids: np.ndarray      # ids admitted now (rows created at commit)
    values: np.ndarray       # new values: old rows first, then new ones
    slots: dict[str, np.ndarray]
    counted: np.ndarray      # ids counted by the admission filter (no row yet)
    dropped: int             # gradients of ids not admitted (or beyond the capacity)

    def finite(self) -> bool:
        return bool(np.isfinite(self.values).all() and all(np.isfinite(s).all() for s in self.slots.values()))


#: Counters a dynamic table keeps (in ``ps_status()`` and checkpoints).
COUNTERS = ("created", "evicted", "not_admitted")


class DynamicTable:
    """One PS task's shard of a dynamic table: the id index, rows, slots, row metadata, admission filter."""

    dynamic = True

    def __init__(self, spec: TableSpec, shard: int, num_shards: int):
        self.spec, self.shard, self.num_shards = spec, shard, num_shards
        opts = spec.dynamic
        self.capacity: int = dynamic_capacity_rows(spec)  # rows; 0: unbounded
        self.eviction: str = opts["eviction"]
        self.ttl: int = opts["ttl"]                      # 0: none
        self.min_count: int = opts["min_count"]
        self.default_value = np.float32(opts["default_value"])
        self.optimizer = make_row_optimizer(spec.optimizer)
        self.updates = 0
        self.counters = dict.fromkeys(COUNTERS, 0)
        width = opts["filter_width"] if self.min_count > 1 else 0
        self.sketch = np.zeros((len(_FILTER_SALTS), width), np.uint16)
        self.ahead: _Ahead | None = None  # victims being (or already) chosen ahead
        self.chose_under_lock = 0  # evictions that chose their victims themselves (counted for the benchmark)
        self._allocate_rows(min(1024, self.capacity) if self.capacity else 1024)

    # ------------------------------------------------------------------ storage
    def _allocate_rows(self, n: int) -> None:
        dim = self.spec.dim
        self.index = IdIndex(n)
        self.values = np.zeros((n, dim), np.float32)
        self.slots = self.optimizer.init_slots(n, dim)
        self.ids = np.zeros(n, np.int64)
        self.last = np.zeros(n, np.int64)     # the table update that last changed the row
        self.count = np.zeros(n, np.int64)    # updates of the row
        self.live = np.zeros(n, bool)
        self.free = np.arange(n - 1, -1, -1, dtype=np.int64)  # a stack: the next free slot last
        self.num_free = n
        self.ahead = None

    @property
    def size(self) -> int:
        """Rows held."""
        return self.index.size

    @property
    def num_rows(self) -> int:
        return self.size

    def _grow(self, need: int) -> None:
        """Room for ``need`` more rows (doubling; never beyond the capacity)."""
        if need <= self.num_free:
            return
        old = len(self.values)
        new = max(old * 2, old - self.num_free + need)
        if self.capacity:
            new = min(new, max(self.capacity, old))
        if new - old + self.num_free < need:
            raise AssertionError("a dynamic table grew beyond its capacity")  # callers evict first
        extra = new - old
        dim = self.spec.dim
        self.values = np.concatenate([self.values, np.zeros((extra, dim), np.float32)])
        fresh = self.optimizer.init_slots(extra, dim)
        self.slots = {k: np.concatenate([v, fresh[k]]) for k, v in self.slots.items()}
        self.ids = np.concatenate([self.ids, np.zeros(extra, np.int64)])
        self.last = np.concatenate([self.last, np.zeros(extra, np.int64)])
        self.count = np.concatenate([self.count, np.zeros(extra, np.int64)])
        self.live = np.concatenate([self.live, np.zeros(extra, bool)])
        free = np.concatenate([np.arange(new - 1, old - 1, -1, dtype=np.int64), self.free[:self.num_free]])
        self.free = free
        self.num_free = len(free)

    def _take_slots(self, n: int) -> np.ndarray:
        self._grow(n)
        taken = self.free[self.num_free - n:self.num_free][::-1].copy()
        self.num_free -= n
        return taken

    def _release(self, slots: np.ndarray) -> None:
        self.index.delete(self.ids[slots])
        self.live[slots] = False
        fresh = self.optimizer.init_slots(len(slots), self.spec.dim)
        for k, v in self.slots.items():
            put_rows(v, slots, fresh[k])
        if self.num_free + len(slots) > len(self.free):
            self.free = np.concatenate([self.free, np.zeros(len(slots), np.int64)])
        self.free[self.num_free:self.num_free + len(slots)] = slots
        self.num_free += len(slots)
        self.counters["evicted"] += len(slots)

    # ------------------------------------------------------------------ reads
    def owns(self, ids: np.ndarray) -> np.ndarray:
        """Whether each id belongs to this shard."""
        return shard_of_ids(ids, self.num_shards) == self.shard

    def lookup(self, ids: np.ndarray) -> np.ndarray:
        """Rows of ``ids``: held rows, else the initial row (or, under admission, the default vector)."""
        slots, _ = self.index.find(ids)
        held = slots >= 0
        if held.all():
            return take_rows(self.values, slots)
        out = np.empty((len(ids), self.spec.dim), np.float32)
        out[held] = take_rows(self.values, slots[held])
        missing = ~held
        if missing.any():
            if self.min_count > 1:
                out[missing] = self.default_value
            else:
                out[missing] = initial_rows(self.spec.initializer, self.spec.seed, ids[missing], self.spec.dim)
        return out

    # ------------------------------------------------------------------ updates
    def _filter_columns(self, ids: np.ndarray) -> list[np.ndarray]:
        width = np.uint64(self.sketch.shape[1])
        return [(hash64(_as_u64(ids) ^ salt) % width).astype(np.int64) for salt in _FILTER_SALTS]

    def _count(self, ids: np.ndarray) -> None:
        """Counts each id once in the admission filter (saturating at 65535)."""
        for d, c in enumerate(self._filter_columns(ids)):
            cols, k = np.unique(c, return_counts=True)
            self.sketch[d, cols] = np.minimum(self.sketch[d, cols].astype(np.int64) + k, 65535)

    def prepare(self, ids: np.ndarray, grads: np.ndarray, learning_rate: float | None) -> PreparedUpdate:
        """The update of ``ids`` (may repeat: gradients add up) computed, nothing changed."""
        unique, summed = sum_by_id(np.asarray(ids, np.int64), np.asarray(grads, np.float32))
        slots, _ = self.index.find(unique)
        held = slots >= 0
        new_ids, counted = unique[~held], np.zeros(0, np.int64)
        if self.min_count > 1 and new_ids.size:
            cols = self._filter_columns(new_ids)
            seen = np.min([self.sketch[d, c] for d, c in enumerate(cols)], axis=0).astype(np.int64) + 1
            admit = seen >= self.min_count
            counted = new_ids[~admit]
            new_ids = new_ids[admit]
        if self.capacity and new_ids.size > self.capacity - int(held.sum()):  # more new ids than fit: the first
            new_ids = new_ids[:max(0, self.capacity - int(held.sum()))]
        dropped = len(unique) - int(held.sum()) - len(new_ids)
        all_held = bool(held.all())
        old_slots = slots if all_held else slots[held]
        values = take_rows(self.values, old_slots)
        row_slots = {k: take_rows(v, old_slots) for k, v in self.slots.items()}
        g = summed
        if not held.any() and len(new_ids) == len(unique):  # every id new and admitted: no copies either
            values = initial_rows(self.spec.initializer, self.spec.seed, new_ids, self.spec.dim)
            row_slots = self.optimizer.init_slots(len(new_ids), self.spec.dim)
        elif not all_held:  # the new rows after the held ones
            values = np.concatenate([values, initial_rows(self.spec.initializer, self.spec.seed, new_ids,
                                                          self.spec.dim)])
            fresh = self.optimizer.init_slots(len(new_ids), self.spec.dim)
            row_slots = {k: np.concatenate([v, fresh[k]]) for k, v in row_slots.items()}
            g = np.concatenate([summed[held], take_rows(summed, np.searchsorted(unique, new_ids))])
        if len(g):
            lr = self.optimizer.params["learning_rate"] if learning_rate is None else learning_rate
            # every row of the compact arrays: a slice (views, no gather/scatter) where the optimizer indexes rows
            self.optimizer.apply(values, row_slots, slice(None), g, lr, self.updates + 1)
        return PreparedUpdate(unique if all_held else unique[held], old_slots, new_ids, values, row_slots, counted,
                              dropped)

    def commit(self, up: PreparedUpdate) -> None:
        """Applies a prepared update: creates the new rows (evicting first if over capacity), writes every row.

        An update that changes no row (every id below ``min_count``) only counts: it is not one of the
        table's updates (Adam's step, recency, TTL).
        """
        if self.min_count > 1 and (up.counted.size or up.new_ids.size):  # every push of an id without a row
            self._count(np.concatenate([up.counted, up.new_ids]))
        if not up.old_slots.size and not up.new_ids.size:
            self.counters["not_admitted"] += up.dropped
            return
        self.updates += 1
        tick = self.updates
        if up.new_ids.size:
            self._evict_for(len(up.new_ids), up.old_slots)
            new_slots = self._take_slots(len(up.new_ids))
            self.index.insert(up.new_ids, new_slots)
            self.ids[new_slots] = up.new_ids
            self.live[new_slots] = True
            self.count[new_slots] = 0
            self.counters["created"] += len(up.new_ids)
            slots = np.concatenate([up.old_slots, new_slots])
        else:
            slots = up.old_slots
        put_rows(self.values, slots, up.values)
        for k, v in self.slots.items():
            put_rows(v, slots, up.slots[k])
        self.last[slots] = tick
        self.count[slots] += 1
        self.counters["not_admitted"] += up.dropped
        if self.ttl and tick % max(1, self.ttl // 4) == 0:
            expired = np.flatnonzero(self.live & (self.last < tick - self.ttl))
            if expired.size:
                self._release(expired)
        self._choose_ahead()

    def _evict_for(self, n_new: int, keep: np.ndarray) -> None:
        """Frees rows (not in ``keep``) so that ``n_new`` more fit the capacity (1/16 of it more, at once)."""
        if not self.capacity or self.size + n_new <= self.capacity:
            return
        need = self.size + n_new - self.capacity + self.capacity // 16
        keep = np.asarray(keep, np.int64)
        victims = self._victims_chosen_ahead(need, keep)
        if victims is None:  # none chosen ahead (a small table, or they ran out): choose now
            self.chose_under_lock += 1
            live = self.live.copy()
            live[keep] = False  # the batch's rows stay
            victims = _eviction_order(self.last, self.count, live, self.updates, self.eviction, need)
        if victims.size:
            self._release(victims)

    def _victims_chosen_ahead(self, need: int, keep: np.ndarray) -> np.ndarray | None:
        """The first ``need`` candidates chosen ahead still held, not updated since and not in ``keep``."""
        ahead = self.ahead
        if ahead is None or not ahead.ready.is_set():
            return None
        cands, was = ahead.slots, ahead.last
        ok = self.live[cands] & (self.last[cands] == was)
        if keep.size:
            in_keep = np.zeros(len(self.live), bool)
            in_keep[keep] = True
            ok &= ~in_keep[cands]
        at = np.flatnonzero(ok)
        self.ahead = None  # one choice per eviction: the next starts after this update, from a fresh copy
        if len(at) < need:  # too many updated since the copy: the caller chooses
            return None
        return cands[at[:need]]

    def _choose_ahead(self) -> None:
        """Starts choosing the next victims on a thread once a large table is 7/8 full (see the docstring)."""
        if (not self.capacity or self.capacity < CHOOSE_AHEAD_FROM or self.ahead is not None
                or self.size < self.capacity - self.capacity // 8):
            return
        # one eviction frees capacity / 16 and the batch's new rows: a quarter of the capacity leaves room for
        # large batches and rows updated since the copy. The copies take a few milliseconds per million rows.
        self.ahead = _Ahead(self.last.copy(), self.count.copy(), self.live.copy(), self.updates, self.eviction,
                            self.capacity // 4)

    def apply(self, ids: np.ndarray, grads: np.ndarray, learning_rate: float | None) -> None:
        """Prepares and commits an update (no finiteness check: see :meth:`prepare`)."""
        self.commit(self.prepare(ids, grads, learning_rate))

    def write(self, ids: np.ndarray, values: np.ndarray) -> None:
        """Sets the rows of ``ids`` (distinct), creating those not held (capacity and admission apply as usual)."""
        ids = np.asarray(ids, np.int64)
        slots, _ = self.index.find(ids)
        held = slots >= 0
        put_rows(self.values, slots[held], values[held])
        new = ids[~held]
        if new.size:
            if self.capacity and new.size > self.capacity:
                raise ValueError(f"{new.size} rows written to a table of {self.capacity} rows per task")
            self._evict_for(len(new), slots[held])
            fresh = self._take_slots(len(new))
            self.index.insert(new, fresh)
            self.ids[fresh], self.live[fresh], self.count[fresh] = new, True, 0
            self.last[fresh] = self.updates
            put_rows(self.values, fresh, values[~held])
            self.counters["created"] += len(new)
        self._choose_ahead()

    # ------------------------------------------------------------------ state
    def arrays(self) -> dict[str, np.ndarray]:
        """The held rows in id order: ``ids``, ``values``, ``slot/<name>``, ``last``, ``count``; the filter."""
        live = np.flatnonzero(self.live)
        live = live[np.argsort(self.ids[live], kind="stable")]
        out = {"ids": self.ids[live], "values": take_rows(self.values, live),
               **{f"slot/{k}": take_rows(v, live) for k, v in self.slots.items()},
               "last": self.last[live], "count": self.count[live]}
        if self.sketch.size:
            out["filter"] = self.sketch.copy()
        return out

    def meta(self) -> dict[str, Any]:
        return {"updates": self.updates, **self.counters}

    def load(self, arrays: Mapping[str, np.ndarray], updates: int, counters: Mapping[str, int] | None = None) -> None:
        """Replaces the state with a checkpoint's (:meth:`arrays`; validated by the caller)."""
        ids = np.asarray(arrays["ids"], np.int64)
        n = len(ids)
        self._allocate_rows(max(n, min(1024, self.capacity) if self.capacity else 1024))
        slots = self._take_slots(n)
        self.index.insert(ids, slots)
        self.ids[slots], self.live[slots] = ids, True
        put_rows(self.values, slots, arrays["values"])
        for k, v in self.slots.items():
            put_rows(v, slots, arrays[f"slot/{k}"])
        self.last[slots], self.count[slots] = arrays["last"], arrays["count"]
        if "filter" in arrays:
            self.sketch = np.array(arrays["filter"], np.uint16, copy=True)
        self.updates = updates
        self.counters = {k: int((counters or {}).get(k, 0)) for k in COUNTERS}

    def status(self) -> dict[str, Any]:
        return {"rows": self.size, "capacity": self.capacity, "capacity_bytes": self.spec.dynamic["capacity_bytes"],
                **self.counters, "bytes": self.nbytes}

    @property
    def nbytes(self) -> int:
        return int(self.values.nbytes + sum(v.nbytes for v in self.slots.values()) + self.ids.nbytes
                   + self.last.nbytes + self.count.nbytes + self.live.nbytes + self.free.nbytes
                   + self.index.nbytes + self.sketch.nbytes)
