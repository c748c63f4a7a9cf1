"""Worker of benchmarks/consistency.py: an MLP on digits under one tfdist consistency mode.

Every worker (started by ``tfdist.testing.LocalCluster``) builds the strategy
for ``--mode``, trains on its shard of the digits training set, and

* writes ``started-<i>`` when its model is built and waits for the driver's
  ``go`` file, so that process start-up is not measured and every worker
  traces its training function at the same time; writes ``ready-<i>`` (with
  the time) at the end of its first step: the driver's clock starts when
  every worker is past its first (tracing) step;
* stops at the first batch end after the driver's ``stop`` file appears;
* writes ``worker-<i>.json``: per-step ``[wall time, ps_step, loss]``, its
  exchange counters and the slowdown it ran with.

The slow workers' "compute" is the fixed per-step delay of ``TFDIST_SLOWDOWN``
(set per task by the driver), which every tfdist strategy applies at the start
of each step.
"""

import argparse
import json
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import tensorflow as tf  # noqa: E402

import tfdist  # noqa: E402
from tfdist.datasets import load_digits  # noqa: E402

#: Hidden units of the MLP 64-HIDDEN-10 (the driver evaluates it in numpy).
HIDDEN = 32


def make_strategy(args):
    if args.mode == "bsp":
        return tfdist.BSPStrategy()
    if args.mode == "sync_replicas":
        return tfdist.SyncReplicasStrategy(replicas_to_aggregate=args.m)
    if args.mode == "asp":
        return tfdist.ParameterServerStrategy(consistency="async")
    if args.mode == "ssp":
        return tfdist.SSPStrategy(staleness=args.staleness)
    if args.mode == "dtssp":
        return tfdist.DTSSPStrategy(min_staleness=args.min_staleness, max_staleness=args.max_staleness,
                                    window=args.window, delta=args.delta)
    raise SystemExit(f"unknown --mode {args.mode!r}")


class Coordinator(keras.callbacks.Callback):
    """Start barrier, first-step mark, stop on the driver's file, per-step record.

    The barrier is *before* the first step (no PS traffic yet), so every worker
    traces its training function at the same time; ``ready-<i>`` (with the
    time) marks the end of the worker's first step. A barrier after the first
    step could deadlock SyncReplicas: a worker that starts after the first M
    have completed step 0 joins at step 1, which needs the others.
    """

    def __init__(self, run_dir, worker_id, max_seconds):
        super().__init__()
        self.run_dir, self.worker_id, self.max_seconds = run_dir, worker_id, max_seconds
        self.steps = []
        self.go_time = None

    def _path(self, name):
        return os.path.join(self.run_dir, name)

    def _write(self, name, text):
        with open(self._path(name + ".tmp"), "w") as f:
            f.write(text)
        os.replace(self._path(name + ".tmp"), self._path(name))

    def on_train_begin(self, logs=None):
        self._write(f"started-{self.worker_id}", repr(time.time()))
        deadline = time.monotonic() + self.max_seconds
        while not os.path.exists(self._path("go")):
            if time.monotonic() > deadline:
                raise TimeoutError(f"no go file within {self.max_seconds} s")
            time.sleep(0.005)
        self.go_time = time.time()

    def on_train_batch_end(self, batch, logs=None):
        logs = logs or {}
        now = time.time()
        if not self.steps:
            self._write(f"ready-{self.worker_id}", repr(now))
        self.steps.append([now, int(logs.get("ps_step", -1)), float(logs.get("loss", float("nan")))])
        if os.path.exists(self._path("stop")) or now - self.go_time > self.max_seconds:
            self.model.stop_training = True


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--run-dir", required=True)
    p.add_argument("--mode", required=True, choices=["bsp", "sync_replicas", "asp", "ssp", "dtssp"])
    p.add_argument("--m", type=int)
    p.add_argument("--staleness", type=int, default=3)
    p.add_argument("--min-staleness", type=int, default=3)
    p.add_argument("--max-staleness", type=int, default=10)
    p.add_argument("--window", type=int, default=10)
    p.add_argument("--delta", type=float, default=0.01)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-seconds", type=float, default=300.0)
    args = p.parse_args()

    strategy = make_strategy(args)
    data = load_digits()
    me, n = strategy.worker_id, strategy.num_workers
    x, y = data.x_train.reshape(-1, 64)[me::n], data.y_train[me::n]
    keras.utils.set_random_seed(args.seed)  # same initial weights everywhere (the chief's count)
    with strategy.scope():
        model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(HIDDEN, activation="relu"),
                                  keras.layers.Dense(10, activation="softmax")])
        model.compile(optimizer=keras.optimizers.Adam(args.lr), loss="sparse_categorical_crossentropy")
    coord = Coordinator(args.run_dir, me, args.max_seconds)
    # A repeated tf.data pipeline: Keras fit on numpy arrays rebuilds its input iterator at every
    # epoch boundary, which stalls a worker for 0.2-0.7 s (seconds on a loaded machine) and would
    # swamp the protocol differences. An "epoch" is still one pass over the shard, so the training
    # loss Keras reports (and DTSSP reads) is the running mean over the current pass.
    ds = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(len(x), seed=args.seed + me).repeat()
    ds = ds.batch(args.batch, drop_remainder=True).prefetch(4)
    steps_per_epoch = max(len(x) // args.batch, 1)
    model.fit(ds, steps_per_epoch=steps_per_epoch, epochs=10**6, verbose=0, callbacks=[coord])
    result = {
        "worker_id": me,
        "go_time": coord.go_time,
        "steps": coord.steps,
        "sync_stats": strategy.sync_stats,
        "num_replicas_in_sync": strategy.num_replicas_in_sync,
        "slowdown": os.environ.get("TFDIST_SLOWDOWN"),
    }
    tmp = os.path.join(args.run_dir, f"worker-{me}.json.tmp")
    with open(tmp, "w") as f:
        json.dump(result, f)
    os.replace(tmp, os.path.join(args.run_dir, f"worker-{me}.json"))
    print(f"worker {me} done: {len(coord.steps)} timed steps", flush=True)


if __name__ == "__main__":
    main()
