"""Worker script: trains a small MLP on digits for --epochs with validation, then reports that ``fit`` returned.

Usage: fit_end_worker.py --out DIR [--epochs N] [--bound S] [--validation 0|1] [--hang-worker W]

It writes ``fit-<worker>.json`` right after ``fit`` returns. With ``--bound``,
a ``faulthandler`` watchdog armed at the last epoch's end prints every
thread's stack and exits 3 if ``fit`` has not returned ``S`` seconds later
(a hang at the end of ``fit``; issue 27).
"""

import argparse
import faulthandler
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


class ArmAtLastEpoch(keras.callbacks.Callback):
    def __init__(self, epochs, bound):
        super().__init__()
        self.epochs, self.bound = epochs, bound

    def on_epoch_end(self, epoch, logs=None):
        if epoch + 1 == self.epochs and self.bound:
            print(f"last epoch done; fit must return within {self.bound} s", flush=True)
            faulthandler.dump_traceback_later(self.bound, exit=False)  # stacks only: the test counts the hang


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--epochs", type=int, default=30)
    p.add_argument("--bound", type=float, default=0)
    p.add_argument("--validation", type=int, default=1)
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
    model.fit(x_train[sl], data.y_train[sl], batch_size=32, epochs=args.epochs, verbose=0,
              validation_data=(x_test, data.y_test) if args.validation else None,
              callbacks=[ArmAtLastEpoch(args.epochs, args.bound), tfdist.callbacks.LeaveOnTrainEnd()]
              + ([HangAfterEpoch()] if strategy.worker_id == args.hang_worker else []))
    faulthandler.cancel_dump_traceback_later()
    print(f"worker {strategy.worker_id}: fit returned", flush=True)
    with open(os.path.join(args.out, f"fit-{strategy.worker_id}.json"), "w") as f:
        json.dump({"worker": strategy.worker_id, "fit_s": time.monotonic() - t0}, f)


if __name__ == "__main__":
    sys.exit(main())
