"""Dynamic-table benchmark (issue #24): PS-side time of lookups and row updates, and memory under a flood of ids.

Prints one JSON document. Measures, in this process and one run, the PS's
own work on a table shard (no gRPC, no worker), dynamic
(:class:`tfdist.ps.dynamic.DynamicTable`, ids hashed into an index) against
the fixed table of the same rows (:class:`tfdist.ps.sparse.Table`, ids are
row numbers: the floor a hash index cannot beat):

* ``lookup`` — the Monolith hash-table workload: look up ``--lookup-ids``
  (10k) distinct ids x dim 32 in a table of ``--rows`` (1 M) rows, 100
  times (ids drawn anew each time from the held ones); also against
  ``np.take`` of the rows from a plain array (``array_take_ms``: the floor;
  the fixed table reads rows by advanced indexing, which is slower);
* ``adagrad_apply`` — an Adagrad update of ``--apply-ids`` (1 M) distinct
  ids x dim 32 (every row of the table), 5 times after a first one that
  creates the rows (``create`` times that first one for the dynamic table);
* ``flood`` (``--flood-ids``, default 10 M; 0 skips it) — never-repeating
  ids pushed in batches of 100k into a dynamic table with a capacity of
  ``--flood-capacity`` rows (1 M) x dim ``--flood-dim`` (16), LRU: the
  table's bytes and this process's resident memory (``VmRSS``) after every
  1 M ids. The claim: once the table is full, both stay within a fixed band
  (the id index is rebuilt at one of two sizes as evictions leave
  tombstones), however many ids come. Each update's time is kept apart for
  the updates that evicted (``update_ms_evicting_median_max``): a lookup
  waits for the PS's lock at most that long. The flood runs twice: with the
  victims chosen ahead on a thread (the default for capacities of 64 k rows
  and more) and with every eviction choosing them under the lock
  (``flood_choosing_under_the_lock``, as before).

Times are the median of the repetitions, in milliseconds per call; ratios
are dynamic / fixed (1.0: as fast as a plain array; more: slower).

Usage::

    python benchmarks/dynamic_tables.py [--quick] [--rows N] [--lookup-ids N] [--apply-ids N]
        [--flood-ids N] [--flood-capacity N] [--flood-dim D] [--out FILE]

``--quick``: 100 k rows and ids, a flood of 1 M ids into 100 k rows (a smoke test, not the claim).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tfdist.ps.dynamic import DynamicTable
from tfdist.ps.sparse import Table, TableSpec

DIM = 32


def _rss_bytes() -> int | None:
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _median_ms(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


def _tables(rows: int, optimizer: dict) -> tuple[DynamicTable, Table, np.ndarray]:
    """A dynamic and a fixed table with the same ``rows`` rows (the dynamic one's ids spread over int64)."""
    init = {"kind": "uniform", "minval": -0.05, "maxval": 0.05}
    dynamic = DynamicTable(TableSpec("d", 0, DIM, initializer=init, optimizer=optimizer, dynamic={}), 0, 1)
    fixed = Table(TableSpec("f", rows, DIM, initializer=init, optimizer=optimizer), 0, 1)
    ids = np.arange(rows, dtype=np.int64) * 0x9E3779B97F4A7C1 + 12345  # wraps: spread over the int64 range
    return dynamic, fixed, ids


def bench_lookup(rows: int, n: int, repeats: int) -> dict:
    dynamic, fixed, ids = _tables(rows, {"kind": "sgd"})
    dynamic.apply(ids, np.zeros((rows, DIM), np.float32), None)  # every row held
    rng = np.random.default_rng(0)
    picks = [rng.choice(rows, n, replace=False) for _ in range(repeats)]
    it = iter(picks)
    dyn_ms = _median_ms(lambda: dynamic.lookup(ids[next(it)]), repeats)
    it = iter(picks)
    fixed_ms = _median_ms(lambda: fixed.lookup(next(it)), repeats)
    it = iter(picks)
    take_ms = _median_ms(lambda: np.take(fixed.values, next(it), axis=0), repeats)
    return {"rows": rows, "ids_per_call": n, "dim": DIM, "calls": repeats, "dynamic_ms": round(dyn_ms, 3),
            "fixed_ms": round(fixed_ms, 3), "array_take_ms": round(take_ms, 3), "ratio": round(dyn_ms / fixed_ms, 2),
            "ratio_to_take": round(dyn_ms / take_ms, 2), "dynamic_ids_per_s": round(n / dyn_ms * 1000)}


def bench_apply(n: int, repeats: int) -> dict:
    opt = {"kind": "adagrad", "learning_rate": 0.01}
    dynamic, fixed, ids = _tables(n, opt)
    grads = np.random.default_rng(1).normal(size=(n, DIM)).astype(np.float32)
    start = time.perf_counter()
    dynamic.apply(ids, grads, None)
    create_ms = (time.perf_counter() - start) * 1000
    fixed.apply(np.arange(n, dtype=np.int64), grads, None)
    order = np.random.default_rng(2).permutation(n)  # a batch's ids come in any order
    dyn_ms = _median_ms(lambda: dynamic.apply(ids[order], grads, None), repeats)
    fixed_ms = _median_ms(lambda: fixed.apply(order.astype(np.int64), grads, None), repeats)
    return {"ids": n, "dim": DIM, "calls": repeats, "create_ms": round(create_ms, 1), "dynamic_ms": round(dyn_ms, 1),
            "fixed_ms": round(fixed_ms, 1), "ratio": round(dyn_ms / fixed_ms, 2)}


def bench_flood(total: int, capacity: int, dim: int, batch: int = 100_000, choose_ahead: bool = True) -> dict:
    """The flood; ``choose_ahead=False`` makes every eviction choose its victims under the lock (as before)."""
    from tfdist.ps import dynamic

    spec = TableSpec("flood", 0, dim, initializer={"kind": "zeros"}, optimizer={"kind": "adagrad"},
                     dynamic={"capacity": capacity, "eviction": "lru"})
    saved = dynamic.CHOOSE_AHEAD_FROM
    dynamic.CHOOSE_AHEAD_FROM = saved if choose_ahead else 2**62
    try:
        table = DynamicTable(spec, 0, 1)
    finally:
        dynamic.CHOOSE_AHEAD_FROM = saved
    if not choose_ahead:
        table._choose_ahead = lambda: None
    grads = np.full((batch, dim), 0.01, np.float32)
    samples = []
    evicting_ms, other_ms = [], []  # each update's time: what a lookup waiting for the PS's lock waits at most
    start = time.perf_counter()
    for first in range(0, total, batch):
        ids = np.arange(first, first + batch, dtype=np.int64) * 7 + 3  # never repeating
        evicted = table.counters["evicted"]
        t0 = time.perf_counter()
        table.apply(ids, grads, None)
        (evicting_ms if table.counters["evicted"] > evicted else other_ms).append((time.perf_counter() - t0) * 1e3)
        if (first + batch) % 1_000_000 == 0 or first + batch >= total:
            samples.append({"ids_seen": first + batch, "rows": table.size, "table_bytes": table.nbytes,
                            "rss_bytes": _rss_bytes()})
    elapsed = time.perf_counter() - start
    full = [s for s in samples if s["rows"] >= capacity * 15 // 16]
    rss = [s["rss_bytes"] for s in full if s["rss_bytes"] is not None]
    return {"ids": total, "capacity": capacity, "dim": dim, "batch": batch, "seconds": round(elapsed, 1),
            "ids_per_s": round(total / elapsed), "evicted": table.counters["evicted"],
            "choose_ahead": choose_ahead, "evictions_chosen_under_lock": table.chose_under_lock,
            "update_ms_evicting_median_max": [round(statistics.median(evicting_ms), 1), round(max(evicting_ms), 1)]
            if evicting_ms else None,
            "update_ms_not_evicting_median_max": [round(statistics.median(other_ms), 1), round(max(other_ms), 1)]
            if other_ms else None,
            "table_bytes_once_full": sorted({s["table_bytes"] for s in full}),
            "rss_mib_once_full_min_max": [round(min(rss) / 2**20), round(max(rss) / 2**20)] if rss else None,
            "samples": samples}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--rows", type=int)
    p.add_argument("--lookup-ids", type=int, default=10_000)
    p.add_argument("--apply-ids", type=int)
    p.add_argument("--flood-ids", type=int)
    p.add_argument("--flood-capacity", type=int)
    p.add_argument("--flood-dim", type=int, default=16)
    p.add_argument("--out")
    args = p.parse_args(argv)
    rows = args.rows or (100_000 if args.quick else 1_000_000)
    apply_ids = args.apply_ids or (100_000 if args.quick else 1_000_000)
    flood = args.flood_ids if args.flood_ids is not None else (1_000_000 if args.quick else 10_000_000)
    capacity = args.flood_capacity or (100_000 if args.quick else 1_000_000)
    result = {
        "benchmark": "dynamic_tables", "python": platform.python_version(), "numpy": np.__version__,
        "cpus": os.cpu_count(), "argv": sys.argv[1:],
        "lookup": bench_lookup(rows, min(args.lookup_ids, rows), 100),
        "adagrad_apply": bench_apply(apply_ids, 5),
    }
    if flood:
        result["flood"] = bench_flood(flood, capacity, args.flood_dim)
        # the same flood with every eviction choosing its victims under the lock: the stall it had before
        result["flood_choosing_under_the_lock"] = bench_flood(flood, capacity, args.flood_dim, choose_ahead=False)
    text = json.dumps(result, indent=1)
    print(text)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
