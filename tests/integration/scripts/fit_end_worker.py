"""Worker script: trains a small MLP on digits for --epochs with validation, then reports that ``fit`` returned.

Usage: fit_end_worker.py --out DIR [--epochs N] [--validation 0|1] [--hang-worker W] [--tag T]

It prints "last epoch done" at the last epoch's end and writes
``fit-<worker>.json`` right after ``fit`` returns: a worker with the first and
not the second hung at the end of ``fit`` (issue 27). Run it with a small
``TFDIST_STUCK_TIMEOUT_S`` to have such a worker report its stacks and exit.
"""

import argparse
import json
import os
import sys
import threading
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402

import tfdist  # noqa: E402
from tfdist.datasets import load_digits  # noqa: E402


class HangAfterEpoch(keras.callbacks.Callback):
    """Blocks forever (a hang inside ``fit``) at the end of the first epoch."""

    def on_epoch_end(self, epoch, logs=None):
        print("hanging inside fit on purpose", flush=True)
        threading.Event().wait()


class MarkLastEpoch(keras.callbacks.Callback):
    def __init__(self, epochs):
        super().__init__()
        self.epochs = epochs

    def on_epoch_end(self, epoch, logs=None):
        if epoch + 1 == self.epochs:
            print("last epoch done", flush=True)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--epochs", type=int, default=30)
    p.add_argument("--validation", type=int, default=1)
    p.add_argument("--data", choices=["arrays", "repeat"], default="arrays",
                   help="numpy arrays, or an endless shuffled tf.data pipeline with steps_per_epoch")
    p.add_argument("--tag", default="", help="marks the processes of one test (to check none outlives it)")
    p.add_argument("--hang-worker", type=int, default=-1, help="this worker hangs inside fit after epoch 1")
    args = p.parse_args()
    strategy = tfdist.ParameterServerStrategy()
    data = load_digits()
    x_train = data.x_train.reshape(len(data.x_train), -1)
    x_test = data.x_test.reshape(len(data.x_test), -1)
    sl = slice(strategy.worker_id, None, strategy.num_workers)
    with strategy.scope():
        model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(64, activation="relu"),
                                  keras.layers.Dense(10, activation="softmax")])
        model.compile(optimizer=keras.optimizers.Adam(1e-3), loss="sparse_categorical_crossentropy",
                      metrics=["accuracy"])
    t0 = time.monotonic()
    if args.data == "repeat":
        import tensorflow as tf

        x, y = x_train[sl], data.y_train[sl]
        train = dict(x=tf.data.Dataset.from_tensor_slices((x, y)).shuffle(512, seed=strategy.worker_id).repeat()
                     .batch(32), steps_per_epoch=len(x) // 32)
    else:
        train = dict(x=x_train[sl], y=data.y_train[sl], batch_size=32)
    model.fit(**train, epochs=args.epochs, verbose=0,
              validation_data=(x_test, data.y_test) if args.validation else None,
              callbacks=[MarkLastEpoch(args.epochs), tfdist.callbacks.LeaveOnTrainEnd()]
              + ([HangAfterEpoch()] if strategy.worker_id == args.hang_worker else []))
    print(f"worker {strategy.worker_id}: fit returned", flush=True)
    with open(os.path.join(args.out, f"fit-{strategy.worker_id}.json"), "w") as f:
        json.dump({"worker": strategy.worker_id, "fit_s": time.monotonic() - t0}, f)


if __name__ == "__main__":
    sys.exit(main())
