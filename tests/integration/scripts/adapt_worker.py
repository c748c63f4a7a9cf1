"""Worker script: only the chief adapts a Normalization layer; every worker trains, pulls, evaluates, reports JSON.

Usage: adapt_worker.py --out DIR [--mode async|bsp] [--steps N]
"""

import argparse
import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402

import tfdist  # noqa: E402
from file_barrier import wait_for_all  # noqa: E402  (this script's folder)
from tfdist.datasets import load_digits  # noqa: E402


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--mode", default="async")
    p.add_argument("--steps", type=int, default=30)
    args = p.parse_args()

    strategy = tfdist.ParameterServerStrategy(consistency=args.mode)
    data = load_digits()
    # Raw pixel scale plus an offset: without its statistics the network sees very different inputs.
    x_train = (data.x_train.reshape(len(data.x_train), 64) * 16 + 50).astype("float32")
    x_test = (data.x_test.reshape(len(data.x_test), 64) * 16 + 50).astype("float32")
    with strategy.scope():
        model = keras.Sequential([
            keras.Input((64,)),
            keras.layers.Normalization(),
            keras.layers.Dense(32, activation="relu"),
            keras.layers.Dense(10, activation="softmax"),
        ])
        model.compile(keras.optimizers.Adam(0.01), "sparse_categorical_crossentropy", metrics=["accuracy"])
    if strategy.is_chief:
        model.layers[0].adapt(x_train)
    sl = slice(strategy.worker_id, None, strategy.num_workers)
    model.fit(x_train[sl], data.y_train[sl], batch_size=32, epochs=1, steps_per_epoch=args.steps, verbose=2)
    strategy.pull()
    wait_for_all(args.out, "trained", strategy.worker_id, strategy.num_workers)  # every update has landed
    strategy.pull()
    _, accuracy = model.evaluate(x_test, data.y_test, batch_size=len(x_test), verbose=0)
    result = {
        "worker_id": strategy.worker_id,
        "adapted": strategy.is_chief,
        "adapt_mean": model.layers[0].adapt_mean.numpy().tolist(),
        "accuracy": float(accuracy),
        "probs": model.predict(x_test[:20], verbose=0).tolist(),
    }
    with open(os.path.join(args.out, f"worker-{strategy.worker_id}.json"), "w") as f:  # noqa: SIM115
        json.dump(result, f)
    print(f"worker {strategy.worker_id} accuracy {accuracy:.4f}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
