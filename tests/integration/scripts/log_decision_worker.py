"""Worker script: a callback changes the learning rate from the epoch logs (issue #21 item 7b).

Worker 0 trains on real digits, worker 1 on shuffled labels, so their own
losses straddle ``--threshold``: a callback that reads only the logs decides
differently on the two workers unless the logs are the job's.
"""

import argparse
import json
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402

import tfdist  # noqa: E402
from tfdist.datasets import load_digits  # noqa: E402
from file_barrier import wait_for_all  # noqa: E402  (this script's folder)


class LowerRateBelow(keras.callbacks.Callback):
    """ReduceLROnPlateau's kind of decision, made deterministic: lr × 0.1 once the epoch's loss is below a bound."""

    def __init__(self, threshold):
        super().__init__()
        self.threshold = threshold
        self.seen = []

    def on_epoch_end(self, epoch, logs=None):
        self.seen.append(float(logs["loss"]))
        if logs["loss"] < self.threshold:
            lr = self.model.optimizer.learning_rate
            lr.assign(float(lr.numpy()) * 0.1)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--mode", default="bsp")
    p.add_argument("--threshold", type=float, default=2.25)
    p.add_argument("--epochs", type=int, default=3)
    args = p.parse_args()
    strategy = tfdist.BSPStrategy() if args.mode == "bsp" else tfdist.SyncReplicasStrategy()
    data = load_digits()
    me, n = strategy.worker_id, strategy.num_workers
    x, y = data.x_train.reshape(-1, 64)[me::n], data.y_train[me::n]
    if me == 1:
        y = np.random.default_rng(0).permutation(y)
    keras.utils.set_random_seed(0)
    with strategy.scope():
        model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(32, activation="relu"),
                                  keras.layers.Dense(10, activation="softmax")])
        model.compile(keras.optimizers.SGD(0.05), "sparse_categorical_crossentropy")
    decide = LowerRateBelow(args.threshold)
    steps = len(x) // 32
    model.fit(x[: steps * 32], y[: steps * 32], batch_size=32, epochs=args.epochs, shuffle=False, verbose=2,
              callbacks=[decide, tfdist.callbacks.LeaveOnTrainEnd()])
    wait_for_all(args.out, "fit-done", me, n, timeout=240)
    strategy.pull()
    np.savez(os.path.join(args.out, f"weights-{me}.npz"), *model.get_weights())
    with open(os.path.join(args.out, f"worker-{me}.json"), "w") as f:
        json.dump({"losses": decide.seen, "learning_rate": float(model.optimizer.learning_rate.numpy())}, f)


if __name__ == "__main__":
    main()
