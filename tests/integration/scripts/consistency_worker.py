"""Worker script for consistency tests: trains an MLP on digits and reports JSON.

Records, per training step, the PS step/clock and a hash of the worker's full
state (weights + optimizer variables), so tests can check that workers that
were dropped or resynced hold exactly the state the others hold.
"""

import argparse
import json
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import tfdist  # noqa: E402
from tfdist.datasets import load_digits  # noqa: E402
from file_barrier import wait_for_all  # noqa: E402  (this script's folder)
from model_state import state_hash  # noqa: E402  (this script's folder)


class Recorder(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.steps = []

    def on_train_batch_end(self, batch, logs=None):
        self.steps.append([int(logs["ps_step"]), state_hash(self.model), float(logs["ps_dropped"]),
                           float(logs["ps_staleness"])])


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--mode", required=True)
    p.add_argument("--m", type=int)
    p.add_argument("--staleness", type=int, default=2)
    p.add_argument("--window", type=int, default=5)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--optimizer", default="adam")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--blocks", action="store_true", help="worker i takes the i-th block of every global batch")
    p.add_argument("--record", action="store_true")
    p.add_argument("--input-fn", action="store_true",
                   help="feed fit from strategy.distribute_datasets_from_function, MWMS style: shard by the "
                        "InputContext, batch by its per-replica share of a global batch of workers x --batch")
    p.add_argument("--pull-after", action="store_true",
                   help="after every worker's fit: strategy.pull(), then record the state and an evaluation")
    args = p.parse_args()

    if args.mode == "sync_replicas":
        strategy = tfdist.SyncReplicasStrategy(replicas_to_aggregate=args.m)
    elif args.mode == "bsp":
        strategy = tfdist.BSPStrategy()
    elif args.mode == "ssp":
        strategy = tfdist.SSPStrategy(staleness=args.staleness)
    elif args.mode == "dtssp":
        strategy = tfdist.DTSSPStrategy(window=args.window)
    else:
        strategy = tfdist.ParameterServerStrategy(consistency=args.mode)
    data = load_digits()
    x, y = data.x_train.reshape(-1, 64), data.y_train
    me, n = strategy.worker_id, strategy.num_workers
    if args.blocks:  # global batch t = rows [t*n*B, (t+1)*n*B); worker i takes its i-th block
        b = args.batch
        steps = len(x) // (n * b)
        idx = np.concatenate([np.arange(t * n * b + me * b, t * n * b + (me + 1) * b) for t in range(steps)])
        x, y = x[idx], y[idx]
    elif not args.input_fn:
        x, y = x[me::n], y[me::n]
    keras.utils.set_random_seed(0)
    with strategy.scope():
        model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(32, activation="relu"),
                                  keras.layers.Dense(10, activation="softmax")])
        opt = keras.optimizers.SGD(args.lr) if args.optimizer == "sgd" else keras.optimizers.Adam(args.lr)
        model.compile(optimizer=opt, loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    rec = Recorder()
    callbacks = [rec] if args.record else []
    if args.pull_after:  # this worker lingers after its fit: it leaves the barriers (README, "How a job ends")
        callbacks.append(tfdist.callbacks.LeaveOnTrainEnd())
    input_report = None
    if args.input_fn:  # global batch t = rows [t*n*B, (t+1)*n*B): the same rows as --blocks, interleaved
        global_batch = n * args.batch
        rows = len(x) // global_batch * global_batch
        contexts = []

        def pipeline(ctx, arrays):
            ds = tf.data.Dataset.from_tensor_slices(arrays).shard(ctx.num_input_pipelines, ctx.input_pipeline_id)
            return ds.batch(ctx.get_per_replica_batch_size(global_batch), drop_remainder=True)

        def dataset_fn(ctx):
            contexts.append(ctx)
            return pipeline(ctx, (x[:rows], y[:rows]))

        hist = model.fit(strategy.distribute_datasets_from_function(dataset_fn), epochs=args.epochs,
                         verbose=2, callbacks=callbacks)
        ctx = contexts[0]
        batches = [b.numpy().tolist() for b in pipeline(ctx, np.arange(rows))]  # the row ids this worker read
        input_report = {"context": [ctx.num_input_pipelines, ctx.input_pipeline_id, ctx.num_replicas_in_sync],
                        "batch_sizes": sorted({len(b) for b in batches}), "rows": [r for b in batches for r in b]}
    else:
        hist = model.fit(x, y, batch_size=args.batch, epochs=args.epochs, shuffle=not args.blocks, verbose=2,
                         callbacks=callbacks)
    result = {
        "worker_id": me,
        "history": {k: [float(v) for v in vals] for k, vals in hist.history.items()},
        "steps": rec.steps,
        "sync_stats": strategy.sync_stats,
        "num_replicas_in_sync": strategy.num_replicas_in_sync,
        "input": input_report,
        "ps_status": [{k: st[k] for k in ("global_step", "state_step", "stats", "policy", "live_workers")}
                      for st in strategy.ps_status()],
    }
    if args.pull_after:
        wait_for_all(args.out, "fit-done", me, n, timeout=240)
        before = state_hash(model)
        strategy.pull()
        result["after_pull"] = {"hash_before": before, "hash": state_hash(model),
                                "global_step": strategy._runtime.session.state.step,
                                "loss": float(model.evaluate(data.x_test.reshape(-1, 64), data.y_test, verbose=0)[0])}
    session = strategy._runtime.session
    if hasattr(session, "starts"):
        result["starts"] = list(session.starts)
    np.savez(os.path.join(args.out, f"weights-{me}.npz"), *model.get_weights())
    with open(os.path.join(args.out, f"worker-{me}.json"), "w") as f:
        json.dump(result, f)
    print(f"worker {me} done", flush=True)


if __name__ == "__main__":
    main()
