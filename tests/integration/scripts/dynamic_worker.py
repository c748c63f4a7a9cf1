"""Worker script for dynamic table tests: a DynamicEmbedding model trained on fixed data, results to JSON.

Usage: dynamic_worker.py --out DIR --mode async|ssp|dtssp|bsp|sync_replicas [--steps N] [--batch B]
[--vocab V] [--pause-at K] [--capacity C] [--export]

The ids are the zipf ids of ``sparse_worker.py`` (0 .. vocab-1) renamed to
huge and negative int64 values (:func:`big_ids`), so a table with a row per
name trains like ``sparse_worker``'s fixed table. Each worker trains on its
half of every global batch with SGD and a zero initializer, so BSP over 2
workers is the single-process run on the global batch. ``--pause-at K``: every
worker, before its K-th step, writes ``paused-<id>`` and waits (bounded) for
the test to write ``resume`` (``sparse_worker.Pause``). Writes
``worker-<id>.json``: the dense weights, the rows of every vocabulary id (read
from the PS), predictions on the first 32 examples, the strategy's table
listing and the PS status' table counters.

``--export`` (one worker, ``ps.checkpoint_dir`` set): trains the first half
of the steps, writes a PS checkpoint and a full export of the table
(``full.npz``), trains the second half, writes a checkpoint and a delta
export since the full one (``delta.npz``), and records the predictions on
every vocabulary id then (``export_predictions``).
"""

import argparse
import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import keras
import numpy as np
import tensorflow as tf
from sparse_worker import DIM, LEN, Pause, build, data

import tfdist


def big_ids(ids):
    """Vocabulary ids renamed to spread-out int64 values (negative, beyond any fixed table)."""
    return np.asarray(ids, np.int64) * 1_000_003 - 2**62


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--mode", required=True, choices=["async", "ssp", "dtssp", "bsp", "sync_replicas"])
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--vocab", type=int, default=50)
    p.add_argument("--pause-at", type=int)
    p.add_argument("--capacity", type=int)
    p.add_argument("--export", action="store_true")
    args = p.parse_args()
    strategy = {"bsp": tfdist.BSPStrategy, "ssp": lambda: tfdist.SSPStrategy(staleness=2),
                "dtssp": tfdist.DTSSPStrategy, "sync_replicas": lambda: tfdist.SyncReplicasStrategy(2),
                "async": tfdist.ParameterServerStrategy}[args.mode]()
    me, n = strategy.worker_id, strategy.num_workers
    ids, y = data(args.steps, n * args.batch, args.vocab)
    ids = big_ids(ids)
    mine = np.concatenate([np.arange(s * n * args.batch + me * args.batch, s * n * args.batch + (me + 1) * args.batch)
                           for s in range(args.steps)])
    ds = tf.data.Dataset.from_tensor_slices((ids[mine], y[mine])).batch(args.batch)
    with strategy.scope():
        layer = tfdist.layers.DynamicEmbedding(DIM, embeddings_initializer="zeros", capacity=args.capacity)
        model = build(layer)
        model.compile(optimizer=keras.optimizers.SGD(0.5), loss="binary_crossentropy")

    vocab_ids = big_ids(np.arange(args.vocab))
    extra = {}
    if args.export:
        directory = strategy._runtime.config.ps.checkpoint_dir
        half = args.steps // 2
        model.fit(ds.take(half), epochs=1, verbose=0)
        strategy.checkpoint()
        tfdist.checkpoint.export_table(directory, layer.name, os.path.join(args.out, "full.npz"))
        hist = model.fit(ds.skip(half), epochs=1, verbose=0)
        strategy.checkpoint()
        tfdist.checkpoint.export_table(directory, layer.name, os.path.join(args.out, "delta.npz"),
                                       since=os.path.join(args.out, "full.npz"))
        extra["export_predictions"] = model.predict(vocab_ids[:, None].repeat(LEN, axis=1), verbose=0).tolist()
    else:
        hist = model.fit(ds, epochs=1, verbose=0, callbacks=[Pause(me, args.pause_at, args.out),
                                                             tfdist.callbacks.LeaveOnTrainEnd()])
    strategy.pull()
    result = {**extra,
        "worker_id": me,
        "loss": [float(v) for v in hist.history["loss"]],
        "recoveries": strategy.sync_stats.get("recoveries", 0),
        "kernel": model.layers[-1].kernel.numpy().tolist(),
        "bias": model.layers[-1].bias.numpy().tolist(),
        "table": strategy._runtime.read_rows(layer.table_key, vocab_ids).tolist(),
        "predictions": model.predict(ids[:32], verbose=0).tolist(),
        "tables": strategy.tables(),
        "ps_tables": [st["tables"] for st in strategy.ps_status()],
        "distinct_ids": len(np.unique(ids)),
    }
    with open(os.path.join(args.out, f"worker-{me}.json"), "w") as f:
        json.dump(result, f)
    print(f"worker {me} done", flush=True)


if __name__ == "__main__":
    main()
