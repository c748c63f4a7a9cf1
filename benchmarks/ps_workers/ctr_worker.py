"""One tfdist worker of the CTR throughput benchmark: train_ctr.py's model and data, timed steps; writes JSON.

Runs under ``tfdist.testing.LocalCluster`` (the cluster from TF_CONFIG /
TFDIST_CONFIG): ``tfdist.ParameterServerStrategy()`` with its defaults
(async), the example's wide-and-deep model with its two shared
``tfdist.layers.ShardedEmbedding`` tables (PS-resident), Adagrad, binary
cross-entropy and ``keras.metrics.AUC`` as the example compiles it, and
``model.fit`` on this worker's own synthetic examples (``make_data`` with
seed ``1000 + worker id``, as the example). After the first step every
worker waits for the others (a file barrier), so the timed windows overlap;
steps are timed at batch ends over ``--steps`` steps after ``--warmup``, and
the worker's exchange counters (``strategy.sync_stats``) and the seconds its
steps spent in the tables' blocking lookups and row pushes (timed by wrapping
the runtime's calls) are read at the window's ends.

Usage: ctr_worker.py --scale S --out-dir DIR [--batch 256] [--emb-dim 16] [--warmup 20] [--steps 200]
       [--learning-rate 0.05]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "examples"))

from benchmarks import _common  # noqa: E402


def _time_table_calls(strategy) -> dict[str, float]:
    """Counts the seconds the steps spend in the tables' blocking lookups and row pushes (measurement only).

    Wraps the strategy runtime's ``lookup_rows``/``push_rows`` (private: the
    library times its dense exchange in ``sync_stats``, not these calls).
    Returns the live totals: ``lookup_seconds``, ``push_rows_seconds``.
    """
    runtime = strategy._runtime  # noqa: SLF001 - benchmark instrumentation
    totals = {"lookup_seconds": 0.0, "push_rows_seconds": 0.0}

    def timed(fn, name):
        def call(*a, **kw):
            t0 = time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                totals[name] += time.perf_counter() - t0
        return call

    runtime.lookup_rows = timed(runtime.lookup_rows, "lookup_seconds")
    runtime.push_rows = timed(runtime.push_rows, "push_rows_seconds")
    return totals


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--scale", required=True)
    p.add_argument("--out-dir", required=True)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--emb-dim", type=int, default=16)
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--learning-rate", type=float, default=0.05)
    args = p.parse_args()

    import keras
    import numpy as np

    import tfdist
    import train_ctr

    strategy = tfdist.ParameterServerStrategy()
    me, num_workers = strategy.worker_id, strategy.num_workers
    vocabs = train_ctr.vocabularies(args.scale)
    total = args.warmup + args.steps
    x, y, _ = train_ctr.make_data(vocabs, total * args.batch, seed=1000 + me)
    t_build = time.perf_counter()
    with strategy.scope():
        model = train_ctr.make_model(vocabs, args.emb_dim, "shared")
        model.compile(optimizer=keras.optimizers.Adagrad(args.learning_rate), loss="binary_crossentropy",
                      metrics=[keras.metrics.AUC(name="auc")])
    build_s = time.perf_counter() - t_build

    table_calls = _time_table_calls(strategy)
    timer = _common.step_timer_class(keras)()
    barrier = _common.start_barrier_class(keras)(args.out_dir, me, num_workers)
    marks: dict[str, dict] = {}

    class Counters(keras.callbacks.Callback):  # after the timer: its reads are not inside a timed step
        def on_train_batch_end(self, batch, logs=None):
            if batch == args.warmup - 1:
                marks["start"] = {**strategy.sync_stats, **table_calls}
            elif batch == total - 1:
                marks["end"] = {**strategy.sync_stats, **table_calls}

    t_fit = time.perf_counter()
    history = model.fit(x, y, batch_size=args.batch, epochs=1, shuffle=False, verbose=0,
                        callbacks=[timer, barrier, Counters(), tfdist.callbacks.LeaveOnTrainEnd()])
    fit_s = time.perf_counter() - t_fit
    window = slice(args.warmup - 1, total)
    steps = np.diff(timer.times[window])
    counters = {k: (marks["end"][k] - marks["start"][k]) / args.steps for k in marks["end"]
                if isinstance(marks["end"][k], (int, float)) and k in marks["start"]}
    result = {
        "worker": me, "num_workers": num_workers, "scale": args.scale, "rows": sum(vocabs),
        **_common.timed_window(timer.times, args.warmup, args.steps, args.batch),
        "window_wall": [timer.wall[args.warmup - 1], timer.wall[total - 1]],
        "ms_per_step": 1e3 * float(np.mean(steps)), "median_ms_per_step": 1e3 * float(np.median(steps)),
        "p90_ms_per_step": 1e3 * float(np.percentile(steps, 90)),
        "cpu_s_per_step": (timer.cpu[total - 1] - timer.cpu[args.warmup - 1]) / args.steps,
        "sync_stats_per_step": counters,
        "ps_metrics_last": {k: float(v[-1]) for k, v in history.history.items() if k.startswith("ps_")},
        "loss_last": float(history.history["loss"][-1]),
        "build_s": build_s, "fit_s": fit_s,
        "max_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }
    _common.write_result(os.path.join(args.out_dir, f"worker-{me}.json"), result)
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
