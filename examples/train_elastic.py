"""An elastic job: workers join and leave while ``model.fit`` runs; the job ends after a fixed amount of work.

Run it with the autoscaling engine (starts with 1 worker, adds workers while
throughput scales, settles at the knee; replaces persistent stragglers):

    python -m tfdist.launch --config configs/elastic_autoscale.yaml examples/train_elastic.py

Every worker trains on its own shuffle of the whole training set (workers
come and go, so there is no fixed sharding); ``elastic.total_batches`` in the
config is the job's work. ``ElasticCallback`` stops a worker's ``fit`` when
the engine asks it to leave or when the job's batches are done.
``--step-delay`` adds emulated compute per batch (the way the papers emulate
bigger models on small machines).
"""

import argparse
import json
import logging
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import tfdist  # noqa: E402
from tfdist.datasets import load_mnist_or_digits  # noqa: E402


class StepDelay(keras.callbacks.Callback):
    """Emulated compute: sleeps ``seconds`` after every training batch."""

    def __init__(self, seconds: float):
        super().__init__()
        self.seconds = seconds

    def on_train_batch_end(self, batch, logs=None):
        time.sleep(self.seconds)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--learning-rate", type=float, default=1e-3)
    p.add_argument("--dataset", default="digits", choices=["auto", "mnist", "digits"])
    p.add_argument("--step-delay", type=float, default=0.0, help="emulated compute per batch, seconds")
    p.add_argument("--steps-per-epoch", type=int, default=50)
    p.add_argument("--max-epochs", type=int, default=1000, help="upper bound; the job normally ends first")
    p.add_argument("--out", help="directory for a JSON result per worker")
    args = p.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")

    strategy = tfdist.ParameterServerStrategy()
    data = load_mnist_or_digits(args.dataset)
    train = (tf.data.Dataset.from_tensor_slices((data.x_train, data.y_train))
             .shuffle(len(data.x_train), seed=1000 + strategy.worker_id).repeat().batch(args.batch_size))
    with strategy.scope():
        model = keras.Sequential([
            keras.Input(data.x_train.shape[1:]),
            keras.layers.Flatten(),
            keras.layers.Dense(64, activation="relu"),
            keras.layers.Dense(data.num_classes, activation="softmax"),
        ])
        model.compile(optimizer=keras.optimizers.Adam(args.learning_rate),
                      loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    elastic = tfdist.callbacks.ElasticCallback()
    callbacks = [elastic] + ([StepDelay(args.step_delay)] if args.step_delay > 0 else [])
    start = time.perf_counter()
    history = model.fit(train, epochs=args.max_epochs, steps_per_epoch=args.steps_per_epoch,
                        callbacks=callbacks, verbose=2 if strategy.is_chief else 0)
    seconds = time.perf_counter() - start
    loss, acc = model.evaluate(data.x_test, data.y_test, verbose=0)
    steps = sum(len(v) for k, v in history.history.items() if k == "loss") * args.steps_per_epoch
    print(f"worker {strategy.worker_id}: stopped ({elastic.reason or 'fit ended'}) after {seconds:.1f} s; "
          f"test accuracy {acc:.4f} on {data.name}", flush=True)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        path = os.path.join(args.out, f"worker-{strategy.worker_id}-{os.getpid()}.json")
        with open(path, "w") as f:
            json.dump({"worker": strategy.worker_id, "reason": elastic.reason, "accuracy": float(acc),
                       "loss": float(loss), "seconds": seconds, "epochs_started": steps // args.steps_per_epoch,
                       "sync": strategy.sync_stats}, f)
    np.testing.assert_(np.isfinite(loss))


if __name__ == "__main__":
    main()
