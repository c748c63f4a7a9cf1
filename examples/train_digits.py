"""Train a small CNN with tfdist.ParameterServerStrategy on MNIST (or bundled digits).

Run on a local cluster (2 parameter servers + 2 workers):

    python -m tfdist.launch --config configs/local_async.yaml examples/train_digits.py

or alone (an in-process parameter server):  python examples/train_digits.py

The same script runs every task of a job whose scheduler sets TF_CONFIG
(Kubeflow TFJob: chief, worker, ps, evaluator) — start it on each task with
that task's TF_CONFIG and the job's TFDIST_TOKEN:

* ps: ``ParameterServerStrategy()`` serves the variables and exits the process
  once every training worker is done;
* chief / worker: train on their shard, evaluate, exit (the chief can save);
* evaluator: evaluates the parameter servers' current values while the job
  trains and exits when it is over (``strategy.evaluation_rounds``).
"""

import argparse
import logging
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402

import tfdist  # noqa: E402
from tfdist.datasets import load_mnist_or_digits  # noqa: E402


def make_model(input_shape, num_classes):
    return keras.Sequential(
        [
            keras.Input(input_shape),
            keras.layers.Conv2D(16, 3, padding="same", activation="relu"),
            keras.layers.MaxPooling2D(),
            keras.layers.Conv2D(32, 3, padding="same", activation="relu"),
            keras.layers.MaxPooling2D(),
            keras.layers.Flatten(),
            keras.layers.Dense(64, activation="relu"),
            keras.layers.Dense(num_classes, activation="softmax"),
        ]
    )


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=8)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--learning-rate", type=float, default=2e-3)
    p.add_argument("--dataset", default="auto", choices=["auto", "mnist", "digits"])
    p.add_argument("--save", help="chief saves the trained model here (.keras)")
    p.add_argument("--eval-interval", type=float, default=5.0,
                   help="evaluator task: seconds between two evaluations of the PS values")
    args = p.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")

    strategy = tfdist.ParameterServerStrategy()  # on a ps task this serves until the job ends, then exits
    data = load_mnist_or_digits(args.dataset)
    if strategy.is_chief:
        print(f"dataset: {data.name} ({len(data.x_train)} train / {len(data.x_test)} test examples)"
              + ("" if data.name == "mnist" else " - MNIST not available offline, using scikit-learn digits"))

    with strategy.scope():
        model = make_model(data.x_train.shape[1:], data.num_classes)
        model.compile(
            optimizer=keras.optimizers.Adam(args.learning_rate),
            loss="sparse_categorical_crossentropy",
            metrics=["accuracy"],
        )
    if strategy.is_evaluator:  # side-car evaluation of the PS values while the workers train
        rounds = 0
        for version in strategy.evaluation_rounds(interval_s=args.eval_interval):
            loss, acc = model.evaluate(data.x_test, data.y_test, batch_size=256, verbose=0)
            rounds += 1
            print(f"evaluator: PS version {version}: test accuracy {acc:.4f} (loss {loss:.4f})", flush=True)
        print(f"evaluator: training is over after {rounds} evaluation(s)", flush=True)
        return

    shard = data.shard(strategy.worker_id, strategy.num_workers)  # each worker reads its own part
    model.fit(
        shard.x_train,
        shard.y_train,
        batch_size=args.batch_size,
        epochs=args.epochs,
        validation_data=(data.x_test, data.y_test),
        verbose=2,
        # A worker whose fit ends stops holding the others back (BSP/SSP barriers), even if its process goes on.
        callbacks=[tfdist.callbacks.LeaveOnTrainEnd()],
    )
    loss, acc = model.evaluate(data.x_test, data.y_test, verbose=0)
    print(f"worker {strategy.worker_id}: final test accuracy {acc:.4f} (loss {loss:.4f}) on {data.name}")
    if strategy.is_chief and args.save:
        model.save(args.save)
        print(f"saved model to {args.save}")
    stats = strategy.sync_stats
    logging.getLogger("train_digits").info(
        "worker %d exchanged with the PS %d times, %.1f MB pushed, %.2f s in sync",
        strategy.worker_id, stats["syncs"], stats["bytes_pushed"] / 1e6, stats["sync_seconds"])
    np.testing.assert_(np.isfinite(loss))


if __name__ == "__main__":
    main()
