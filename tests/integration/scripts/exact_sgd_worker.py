"""Worker script: SGD with a gradient of exactly 1 per weight per step, so the PS sum is known.

Dense(3) on inputs of ones with loss = sum of the outputs: d loss / d w = 1
for every kernel and bias entry, so each step subtracts exactly ``lr`` from
every weight. After ``--steps`` steps on each of the job's workers the PS
must hold exactly ``-lr * steps * workers`` everywhere: any update lost or
pushed twice shows. Every worker, once all of them are done, pulls and
writes what it got.

With ``--exchange-every K`` the worker sends every K-th step (the K local
updates summed); the steps a run ends with are sent by the final pull.

Usage: exact_sgd_worker.py --out DIR --steps N [--overlap 0|1] [--exchange-every K|auto]
"""

import argparse
import json
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import tfdist  # noqa: E402
from file_barrier import wait_for_all  # noqa: E402  (this script's folder)

LR = 2.0 ** -4


class Pace(keras.callbacks.Callback):
    """A few ms per step, so that both workers' updates reach the PS while the other trains."""

    def on_train_batch_end(self, batch, logs=None):
        time.sleep(0.005)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--overlap", type=int, default=1)
    p.add_argument("--exchange-every", type=lambda v: v if v == "auto" else int(v), default=1)
    args = p.parse_args()

    strategy = tfdist.ParameterServerStrategy(overlap_exchange=bool(args.overlap),
                                              exchange_every=args.exchange_every)
    with strategy.scope():
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, kernel_initializer="zeros")])
        model.compile(optimizer=keras.optimizers.SGD(LR), loss=lambda y, p: tf.reduce_sum(p, axis=-1))
    x, y = np.ones((64 * args.steps, 4), np.float32), np.zeros((64 * args.steps, 3), np.float32)
    strategy.pull()  # joins the job (the chief initialises the PS)
    wait_for_all(args.out, "ready", strategy.worker_id, strategy.num_workers)  # so that the workers' steps interleave
    runtime, python_ends = strategy._runtime, []
    end_step = runtime.end_step
    runtime.end_step = lambda *a, **k: (python_ends.append(1), end_step(*a, **k))[1]  # steps that ran Python
    begin_step, python_begins = runtime.begin_step, []
    runtime.begin_step = lambda training: (python_begins.append(1) if training else None, begin_step(training))[1]
    model.fit(x, y, batch_size=64, epochs=1, shuffle=False, verbose=0, callbacks=[Pace()])
    runtime.end_step, runtime.begin_step = end_step, begin_step
    strategy.pull()  # also waits for this worker's last update in flight
    wait_for_all(args.out, "done", strategy.worker_id, strategy.num_workers)
    strategy.pull()
    result = {"weights": [w.tolist() for w in model.get_weights()], "sync_stats": strategy.sync_stats,
              "progress": [s["progress"] for s in strategy.ps_status()],
              "expected": -LR * args.steps * strategy.num_workers,
              "steps_per_exchange_at_the_end": strategy._runtime.exchange_every,
              "steps_that_ran_python": len(python_ends), "begins_that_ran_python": len(python_begins)}
    with open(os.path.join(args.out, f"worker-{strategy.worker_id}.json"), "w") as f:  # noqa: SIM115
        json.dump(result, f)


if __name__ == "__main__":
    sys.exit(main())
