"""Worker script: ``mixed_float16`` (dynamic loss scaling) under ``AllReduceStrategy`` with an overflow on one worker.

Usage: mixed_precision_worker.py --out DIR [--overflow-worker W --overflow-step K]

Every worker trains the digits MLP on its shard under the ``mixed_float16``
policy (Keras wraps the optimizer in a ``LossScaleOptimizer``). Worker W's
batch K is scaled by 1e6 (infinite in float16): its gradients overflow while
the others' do not. Keras checks each replica's own gradients before they are
reduced; the strategy makes that check the members' joint answer, so every
worker skips that step and halves its loss scale, and the workers stay one
model. Writes ``worker-<id>.json``: a hash of the weights, the loss scale,
the optimizer's iterations and the steps run.
"""

import argparse
import hashlib
import json
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tfdist  # noqa: E402  (no TF op before AllReduceStrategy joins the collective group)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--overflow-worker", type=int, default=1)
    p.add_argument("--overflow-step", type=int, default=3)
    args = p.parse_args()
    strategy = tfdist.AllReduceStrategy()
    import keras
    import numpy as np

    from tfdist.datasets import load_digits

    me, batch, steps = strategy.worker_id, 32, 8
    data = load_digits().shard(me, strategy.num_replicas_in_sync)
    x = data.x_train.reshape(-1, 64)[:steps * batch].copy()
    y = data.y_train[:steps * batch]
    if me == args.overflow_worker:
        k = args.overflow_step
        x[k * batch:(k + 1) * batch] *= 1e6
    keras.mixed_precision.set_global_policy("mixed_float16")
    with strategy.scope():
        model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(32, activation="relu"),
                                  keras.layers.Dense(10), keras.layers.Activation("softmax", dtype="float32")])
        model.compile(keras.optimizers.SGD(0.1), "sparse_categorical_crossentropy")
    history = model.fit(x, y, batch_size=batch, epochs=1, shuffle=False, verbose=0)
    weights = b"".join(np.asarray(w).tobytes() for w in model.get_weights())
    result = {
        "hash": hashlib.sha256(weights).hexdigest(), "loss": [float(v) for v in history.history["loss"]],
        "loss_scale": float(keras.ops.convert_to_numpy(model.optimizer.dynamic_scale)),
        "initial_scale": float(model.optimizer.initial_scale),
        "iterations": int(keras.ops.convert_to_numpy(model.optimizer.iterations)),
        "steps": strategy.stats["steps"],
    }
    with open(os.path.join(args.out, f"worker-{me}.json"), "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
