"""One training process of the sparse-table benchmark: an embedding table of ``--rows`` rows; writes JSON.

Modes:

* ``plain``      — single-process Keras 3 ``fit`` with ``keras.layers.Embedding``;
* ``replicated`` — ``tfdist.ParameterServerStrategy()`` (cluster from TF_CONFIG /
  TFDIST_CONFIG, as ``tfdist.testing.LocalCluster`` sets them) with
  ``keras.layers.Embedding``: the worker holds the table, every step
  exchanges its dense delta;
* ``sharded``    — the same with ``tfdist.layers.ShardedEmbedding``: the table
  lives on the PS, a step moves the rows its batch touches.

Model: ``Embedding(rows, dim)`` + ``GlobalAveragePooling1D`` + ``Dense(1)``,
SGD(0.1), binary cross-entropy, batch ``--batch`` x ``--ids`` ids drawn
uniformly from the table (every batch distinct), random labels. Times
``--steps`` steps after ``--warmup`` at batch ends; on the tfdist modes it
also reads the exchange counters at the start and end of that window.

Usage: sparse_table_worker.py --mode plain|replicated|sharded --rows N --out FILE
       [--dim 32] [--batch 64] [--ids 8] [--warmup 5] [--steps 20]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from benchmarks import _common  # noqa: E402


def _counters(strategy) -> dict:
    """The worker's exchange counters and the PS tasks' bytes in (summed)."""
    stats = strategy.sync_stats
    ps = [s["stats"] for s in strategy.ps_status()]
    return {"bytes_pushed": stats.get("bytes_pushed", 0), "bytes_pulled": stats.get("bytes_pulled", 0),
            "rows_pulled": stats.get("rows_pulled", 0), "rows_pushed": stats.get("rows_pushed", 0),
            "ps_bytes_in": sum(s["bytes_in"] for s in ps), "ps_bytes_out_counter": sum(s["bytes_out"] for s in ps)}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--mode", required=True, choices=["plain", "replicated", "sharded"])
    p.add_argument("--rows", type=int, required=True)
    p.add_argument("--dim", type=int, default=32)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--ids", type=int, default=8)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--out", required=True)
    args = p.parse_args()

    import keras
    import numpy as np

    total = args.warmup + args.steps
    rng = np.random.default_rng(0)
    ids = rng.integers(0, args.rows, size=(total * args.batch, args.ids), dtype=np.int64)
    y = rng.integers(0, 2, size=(total * args.batch, 1)).astype(np.float32)
    window = ids[args.warmup * args.batch:].reshape(args.steps, args.batch * args.ids)
    unique_per_step = float(np.mean([len(np.unique(b)) for b in window]))

    strategy = None
    if args.mode != "plain":
        import tfdist

        strategy = tfdist.ParameterServerStrategy()
    t_build = time.perf_counter()
    scope = strategy.scope() if strategy else contextlib.nullcontext()
    with scope:
        if args.mode == "sharded":
            import tfdist

            embedding = tfdist.layers.ShardedEmbedding(args.rows, args.dim)
        else:
            embedding = keras.layers.Embedding(args.rows, args.dim)
        model = keras.Sequential([keras.Input((args.ids,), dtype="int64"), embedding,
                                  keras.layers.GlobalAveragePooling1D(), keras.layers.Dense(1, activation="sigmoid")])
        model.compile(optimizer=keras.optimizers.SGD(0.1), loss="binary_crossentropy")
    build_s = time.perf_counter() - t_build

    timer = _common.step_timer_class(keras)()
    marks: dict[str, dict] = {}

    class Counters(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if strategy is None:
                return
            if batch == args.warmup - 1:
                marks["start"] = _counters(strategy)
            elif batch == total - 1:
                marks["end"] = _counters(strategy)

    t_fit = time.perf_counter()
    model.fit(ids, y, batch_size=args.batch, epochs=1, shuffle=False, verbose=0, callbacks=[timer, Counters()])
    fit_s = time.perf_counter() - t_fit
    # timer first: the counters callback's status call is not inside a timed step
    steps = np.diff(timer.times[args.warmup - 1:total])
    result = {
        "mode": args.mode, "rows": args.rows, "dim": args.dim, "batch": args.batch, "ids_per_example": args.ids,
        **_common.timed_window(timer.times, args.warmup, args.steps, args.batch),
        "ms_per_step": 1e3 * float(np.mean(steps)), "median_ms_per_step": 1e3 * float(np.median(steps)),
        "unique_ids_per_step": unique_per_step, "build_s": build_s, "fit_s": fit_s,
        "max_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "table_mb": args.rows * args.dim * 4 / 1e6,
    }
    if strategy is not None:
        d = {k: (marks["end"][k] - marks["start"][k]) / args.steps for k in marks["end"]}
        row_bytes = args.dim * 4
        # ps_bytes_out_counter is the PS's bytes_out: it also counts the values of "unchanged" PushPull replies
        # (a lone async worker's), which are not sent, so the way back is read from the worker's counters.
        # payload bytes per step (tensor data, not gRPC framing): worker -> PS: the PS's bytes in (dense deltas,
        # row ids and gradients) + the ids of the lookups; PS -> worker: dense values pulled + rows looked up.
        to_ps = d["ps_bytes_in"] + 8 * d["rows_pulled"]
        from_ps = d["bytes_pulled"] + row_bytes * d["rows_pulled"]
        result.update({"per_step": d, "bytes_to_ps_per_step": to_ps, "bytes_from_ps_per_step": from_ps,
                       "bytes_per_step": to_ps + from_ps,
                       "reference_bytes_per_step": unique_per_step * row_bytes * 2})
        result["bytes_vs_reference"] = result["bytes_per_step"] / result["reference_bytes_per_step"]
        strategy.shutdown()
    _common.write_result(args.out, result)
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
