"""Worker script for PS-resident table tests: a ShardedEmbedding model trained on fixed data, results to JSON.

Usage: sparse_worker.py --out DIR --mode async|ssp|bsp [--steps N] [--batch B] [--vocab V] [--pause-at K]

``--pause-at K``: every worker, before its K-th step, writes ``paused-<id>``
and waits (bounded) for the test to write ``resume``; the test kills a PS
task once every worker is paused (:func:`wait_until_paused`).

Each worker trains on its half of every global batch (worker w: rows
``w*B .. (w+1)*B`` of global batch ``2B``), with SGD and a zero-initialised
table, so BSP over 2 workers is the single-process run on the global batch.
Writes ``worker-<id>.json``: the dense weights, the whole table (gathered
from the PS), predictions on the first 32 examples, the strategy's table
listing and placement, and the PS status' table counters.
"""

import argparse
import json
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras
import numpy as np
import tensorflow as tf

import tfdist

LEN, DIM = 6, 4


def data(steps, global_batch, vocab):
    rng = np.random.default_rng(0)
    ids = (rng.zipf(1.5, size=(steps * global_batch, LEN)) % vocab).astype(np.int64)
    y = (ids.sum(axis=1) % 2).astype(np.float32)
    return ids, y


def build(embedding):
    keras.utils.set_random_seed(1)
    inp = keras.Input((LEN,), dtype="int64")
    x = keras.layers.GlobalAveragePooling1D()(embedding(inp))
    return keras.Model(inp, keras.layers.Dense(1, activation="sigmoid")(x))


class Pause(keras.callbacks.Callback):
    """Every worker, before its ``pause_at``-th step, writes ``paused-<id>`` in ``out`` and waits (bounded) for
    ``resume`` there.

    A test injects its fault once every worker is paused (:func:`wait_until_paused`): a worker ahead of the
    chief (async: nothing holds it back) cannot finish its steps before the fault, and one that starts late
    (a slow import under load) cannot start after it, when the fault is already over. Every worker has
    trained before the fault and trains after it.
    """

    def __init__(self, me, pause_at, out):
        super().__init__()
        self.me, self.pause_at, self.out = me, pause_at, out

    def on_train_batch_begin(self, batch, logs=None):
        if self.pause_at is not None and batch + 1 == self.pause_at:
            open(os.path.join(self.out, f"paused-{self.me}"), "w").close()
            deadline = time.monotonic() + 120
            while not os.path.exists(os.path.join(self.out, "resume")):
                if time.monotonic() > deadline:
                    raise TimeoutError("the test did not say resume within 120 s")
                time.sleep(0.02)


def wait_until_paused(cluster, out, workers, bound_s=240.0):
    """Waits until every one of ``workers`` wrote ``paused-<id>`` in ``out`` (:class:`Pause`); fails, with the
    log of a worker that is not there, if one exits first or the bound passes."""
    deadline = time.monotonic() + bound_s
    for w in range(workers):
        while not os.path.exists(os.path.join(out, f"paused-{w}")):
            task = f"worker:{w}"
            assert time.monotonic() < deadline and cluster.process(task).poll() is None, \
                f"{task} did not reach its pause:\n" + cluster.log(task)[-3000:]
            time.sleep(0.05)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--mode", required=True, choices=["async", "ssp", "bsp"])
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--vocab", type=int, default=50)
    p.add_argument("--pause-at", type=int)
    args = p.parse_args()
    strategy = {"bsp": tfdist.BSPStrategy, "ssp": lambda: tfdist.SSPStrategy(staleness=2),
                "async": tfdist.ParameterServerStrategy}[args.mode]()
    me, n = strategy.worker_id, strategy.num_workers
    ids, y = data(args.steps, n * args.batch, args.vocab)
    mine = np.concatenate([np.arange(s * n * args.batch + me * args.batch, s * n * args.batch + (me + 1) * args.batch)
                           for s in range(args.steps)])
    ds = tf.data.Dataset.from_tensor_slices((ids[mine], y[mine])).batch(args.batch)
    with strategy.scope():
        layer = tfdist.layers.ShardedEmbedding(args.vocab, DIM, embeddings_initializer="zeros")
        model = build(layer)
        model.compile(optimizer=keras.optimizers.SGD(0.5), loss="binary_crossentropy")
    hist = model.fit(ds, epochs=1, verbose=0, callbacks=[Pause(me, args.pause_at, args.out),
                                                         tfdist.callbacks.LeaveOnTrainEnd()])
    strategy.pull()
    result = {
        "worker_id": me,
        "loss": [float(v) for v in hist.history["loss"]],
        "recoveries": strategy.sync_stats.get("recoveries", 0),
        "kernel": model.layers[-1].kernel.numpy().tolist(),
        "bias": model.layers[-1].bias.numpy().tolist(),
        "table": layer.table_values().tolist(),
        "predictions": model.predict(ids[:32], verbose=0).tolist(),
        "tables": strategy.tables(),
        "placement": [list(map(str, entry)) for entry in strategy.placement_table()],
        "ps_tables": [st["tables"] for st in strategy.ps_status()],
    }
    with open(os.path.join(args.out, f"worker-{me}.json"), "w") as f:
        json.dump(result, f)
    print(f"worker {me} done", flush=True)


if __name__ == "__main__":
    main()
