"""Worker that trains from the job's shared input queue under ParameterServerStrategy."""

import argparse
import json
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import tfdist  # noqa: E402
from tfdist.data import SharedQueue  # noqa: E402


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--epochs", type=int, default=2)
    args = p.parse_args()
    strategy = tfdist.ParameterServerStrategy()
    queue = SharedQueue.from_cluster(timeout_s=30)
    seen = []

    def to_xy(batch):
        return batch["x"], batch["y"]

    with strategy.scope():
        model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(32, activation="relu"),
                                  keras.layers.Dense(10, activation="softmax")])
        model.compile(optimizer=keras.optimizers.Adam(3e-3), loss="sparse_categorical_crossentropy",
                      metrics=["accuracy"])

    for _ in range(args.epochs):  # one fit per epoch: each worker's share changes per epoch
        ids = []
        before = queue.last_epoch
        ds = queue.as_dataset(batch_size=32).map(lambda b: (tf.py_function(
            lambda i: ids.extend(i.numpy().tolist()) or np.int64(0), [b["id"]], tf.int64), b)).map(
            lambda _, b: to_xy(b))
        try:
            model.fit(ds, epochs=1, verbose=2)
        except StopIteration:  # a dataset with no batch (faster workers took them all) may raise
            pass
        # the queue epoch this fit's iteration ended: a worker that starts late joins the oldest
        # epoch not yet finished, which need not be the fit's index
        seen.append({"epoch": queue.last_epoch if queue.last_epoch != before else None, "ids": ids})
    with open(os.path.join(args.out, f"worker-{strategy.worker_id}.json"), "w") as f:
        json.dump({"seen": seen, "syncs": strategy.sync_stats["syncs"]}, f)


if __name__ == "__main__":
    main()
