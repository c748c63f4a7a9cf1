"""Worker script for integration tests: trains, evaluates, predicts, reports JSON.

Usage: train_worker.py --out DIR [--model cnn|embed_bn] [--epochs N] [--save-weights F]
       [--load-weights F] [--save-model F] [--crash-after-epochs N] [--crash-how exit|raise|sigkill]
       [--crash-once] [--tag T]
"""

import argparse
import json
import os
import signal
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402

import tfdist  # noqa: E402
from file_barrier import wait_for_all  # noqa: E402  (this script's folder)
from tfdist.datasets import load_digits  # noqa: E402


def make_model(kind, num_classes=10):
    if kind == "cnn":
        return keras.Sequential([
            keras.Input((8, 8, 1)),
            keras.layers.Conv2D(16, 3, padding="same", activation="relu"),
            keras.layers.MaxPooling2D(),
            keras.layers.Flatten(),
            keras.layers.Dense(64, activation="relu"),
            keras.layers.Dense(num_classes, activation="softmax"),
        ])
    if kind == "embed_bn":  # pixels as tokens: Embedding (sparse gradients) + BatchNorm
        return keras.Sequential([
            keras.Input((64,), dtype="int32"),
            keras.layers.Embedding(17, 8),
            keras.layers.Flatten(),
            keras.layers.Dense(64),
            keras.layers.BatchNormalization(),
            keras.layers.Activation("relu"),
            keras.layers.Dense(num_classes, activation="softmax"),
        ])
    raise ValueError(kind)


class CrashAfter(keras.callbacks.Callback):
    """Ends the process after ``epochs`` epochs: ``exit`` (os._exit(3)), ``raise`` (an exception out of fit:
    exit 1) or ``sigkill``; with ``once_file``, only the first time (the file marks that it happened)."""

    def __init__(self, epochs, how="exit", once_file=None):
        super().__init__()
        self.epochs, self.how, self.once_file = epochs, how, once_file

    def on_epoch_end(self, epoch, logs=None):
        if epoch + 1 < self.epochs or (self.once_file and os.path.exists(self.once_file)):
            return
        if self.once_file:
            open(self.once_file, "w").close()
        print(f"crashing on purpose ({self.how})", flush=True)
        if self.how == "raise":
            raise RuntimeError("crashing on purpose in the middle of fit")
        if self.how == "sigkill":
            os.kill(os.getpid(), signal.SIGKILL)
        os._exit(3)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--model", default="cnn")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--save-weights")
    p.add_argument("--load-weights")
    p.add_argument("--save-model")
    p.add_argument("--crash-after-epochs", type=int)
    p.add_argument("--crash-worker", type=int, default=-1)
    p.add_argument("--crash-how", choices=["exit", "raise", "sigkill"], default="exit")
    p.add_argument("--crash-once", action="store_true", help="crash only the first run (a marker file in --out)")
    p.add_argument("--tag", default="")
    p.add_argument("--barrier", action="store_true",
                   help="after fit, wait (bounded) until every worker's updates have landed, then pull and evaluate")
    args = p.parse_args()

    strategy = tfdist.ParameterServerStrategy()
    data = load_digits()
    x_train, x_test = data.x_train, data.x_test
    if args.model == "embed_bn":
        x_train = np.round(x_train * 16).astype("int32").reshape(len(x_train), 64)
        x_test = np.round(x_test * 16).astype("int32").reshape(len(x_test), 64)
    sl = slice(strategy.worker_id, None, strategy.num_workers)
    with strategy.scope():
        model = make_model(args.model)
        model.compile(optimizer=keras.optimizers.Adam(args.lr), loss="sparse_categorical_crossentropy",
                      metrics=["accuracy"])
    result = {"worker_id": strategy.worker_id, "is_chief": strategy.is_chief}
    if args.load_weights and strategy.is_chief:
        model.load_weights(args.load_weights)
    # One batch, so one pull: a worker that evaluates batch by batch pulls before every batch and can see
    # the other worker's first training updates (it starts fit as soon as its own evaluation is done).
    result["initial_eval"] = model.evaluate(x_test, data.y_test, batch_size=len(x_test), verbose=0)
    callbacks = []
    if args.crash_after_epochs and strategy.worker_id == args.crash_worker:
        once = os.path.join(args.out, f"crashed-{strategy.worker_id}") if args.crash_once else None
        callbacks.append(CrashAfter(args.crash_after_epochs, args.crash_how, once))
    if args.epochs:
        hist = model.fit(x_train[sl], data.y_train[sl], batch_size=32, epochs=args.epochs, verbose=2,
                         callbacks=callbacks)
        result["loss_history"] = hist.history["loss"]
    strategy.pull()  # also waits for this worker's last update in flight
    if args.barrier:
        wait_for_all(args.out, "trained", strategy.worker_id, strategy.num_workers)
        strategy.pull()
    result["final_eval"] = model.evaluate(x_test, data.y_test, verbose=0)
    probs = model.predict(x_test[:5], verbose=0)
    result["predict_shape"] = list(probs.shape)
    result["placement"] = [[k, ps, rows] for k, ps, rows in strategy.placement_table()]
    result["sync_stats"] = strategy.sync_stats
    if args.barrier:  # every worker's updates landed: what each PS task counted
        result["ps_worker_batches"] = [st["worker_batches"] for st in strategy.ps_status()]
    result["steps_per_exchange"] = getattr(strategy._runtime, "exchange_every", None)
    result["weights_checksum"] = float(sum(float(np.sum(w)) for w in model.get_weights()))
    bn = [v for v in model.variables if "moving_mean" in v.path]
    if bn:
        result["moving_mean_abs_sum"] = float(np.abs(bn[0].numpy()).sum())
    if strategy.is_chief and args.save_weights:
        model.save_weights(args.save_weights)
    if strategy.is_chief and args.save_model:
        result["saved_weights"] = [w.tolist() for w in model.get_weights()[-1:]]  # what was saved, exactly
        result["saved_checksum"] = float(sum(float(np.sum(w)) for w in model.get_weights()))
        model.save(args.save_model)
    with open(os.path.join(args.out, f"worker-{strategy.worker_id}.json"), "w") as f:  # noqa: SIM115
        json.dump(result, f)
    print(f"worker {strategy.worker_id} final accuracy {result['final_eval'][1]:.4f}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
