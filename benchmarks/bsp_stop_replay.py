"""Replays, in one process without tfdist, the step schedule of the BSP job with a stopped worker (issue #13).

``benchmarks/fault_accuracy.py --modes bsp --faults stop`` runs the fault
matrix's job (``tests/integration/scripts/durability_worker.py``: 2
workers, MLP on digits, Adam(1e-2), 32 examples per worker and step, 150
steps per worker) and SIGSTOPs worker 1 before its step 60. What the job
then does, read from its runs (global steps, ``ps_dropped``,
``ps_refreshes``): 59 steps with both workers; the chief alone for k + 2
global steps (k: ``steps_without_it`` of the run, the global steps it made
between ps:0 giving up on worker 1 and the SIGCONT; +2: worker 1's first
gradients after the SIGCONT were computed on old values and dropped); both
again until the chief's 150th batch; worker 1 alone for its last k
batches. This script trains the same model on the same batches with that
schedule (``--seed S`` as ``durability_worker.py --seed S``: the same
initial values and shuffle orders) and reports the final test accuracy; a
step with both workers applies the mean of their gradients (the PS's sum of
losses each scaled by 1/2), a lone step one worker's gradient (the PS
scales a lone gradient to the mean), a dropped batch is drawn and not
used. It reproduces the undisturbed job exactly, and the faulted job's
accuracy where k is the run's.

Variants (``--variants``, each a schedule; the difference to ``undisturbed``
per seed is printed, then its mean ± SE over the seeds):

* ``undisturbed``: 150 steps with both workers.
* ``stopped``: the schedule above (what the job's final model went through).
* ``stopped_at_chief_end``: ``stopped`` without worker 1's last k lone steps
  (what the chief evaluated right after its ``fit``; also a job that ends at
  global step 150, as TF1's ``StopAtStepHook``, worker 1's last k batches
  untrained).
* ``stopped_lone_lr_half``: ``stopped`` with half the learning rate on lone steps.
* ``stopped_keep_global_batch``: ``stopped`` where a lone worker computes two
  batches per step (the global batch stays 64; half as many lone steps).
* ``undisturbed_2_dropped``: 150 steps with both, but the chief alone for 2
  steps at step 60 while worker 1's batches 60 and 61 are dropped (the
  dropped gradients alone).

Usage::

    python benchmarks/bsp_stop_replay.py [--seeds 0-19] [--steps-alone 24,13,21,...] [--variants ...]

``--steps-alone``: one k per seed (cycled), default the k of the 16 BSP and
SyncReplicas stopped runs of docs/benchmarks.md's first paired invocation.
Prints one JSON line per seed, then a JSON summary. About 2-3 s per
schedule on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import keras  # noqa: E402
import tensorflow as tf  # noqa: E402

from tfdist.datasets import load_digits  # noqa: E402

STEPS, PAUSE_AT, LR = 150, 60, 1e-2
#: steps_without_it of the BSP then the SyncReplicas (M=2) stopped runs of seeds 0-7 (fault_accuracy, 2026-11-24)
DEFAULT_K = [24, 13, 21, 19, 15, 11, 25, 14, 16, 30, 17, 16, 18, 19, 11, 14]


def schedule(variant: str, k: int) -> list[str]:
    both = PAUSE_AT - 1
    stopped = ["both"] * both + ["w0"] * (k + 2) + ["drop1", "drop1"] + ["both"] * (STEPS - both - 2 - k) + ["w1"] * k
    if variant == "undisturbed":
        return ["both"] * STEPS
    if variant == "stopped":
        return stopped
    if variant == "stopped_at_chief_end":
        return stopped[:len(stopped) - k]
    if variant == "stopped_lone_lr_half":
        return [s + "_half" if s in ("w0", "w1") else s for s in stopped]
    if variant == "stopped_keep_global_batch":
        return (["both"] * both + ["w0x2"] * ((k + 2) // 2) + ["drop1", "drop1"] + ["both"] * (STEPS - both - 2 - k)
                + ["w1x2"] * (k // 2))
    if variant == "undisturbed_2_dropped":
        return ["both"] * both + ["w0"] * 2 + ["drop1", "drop1"] + ["both"] * (STEPS - both - 2)
    raise ValueError(f"Unknown variant {variant!r}.")


VARIANTS = ("undisturbed", "stopped", "stopped_at_chief_end", "stopped_lone_lr_half", "stopped_keep_global_batch",
            "undisturbed_2_dropped")


class Replay:
    def __init__(self):
        data = load_digits()
        self.x, self.y = data.x_train.reshape(-1, 64), data.y_train
        self.x_test, self.y_test = data.x_test.reshape(-1, 64), data.y_test

    def streams(self, seed: int):
        """Both workers' batches, built as durability_worker.py builds them (before the global seed is set)."""
        tf.random.set_seed(None)
        return [iter(tf.data.Dataset.from_tensor_slices((self.x[me::2], self.y[me::2]))
                     .shuffle(512, seed=1000 * seed + me).repeat().batch(32)) for me in (0, 1)]

    def run(self, seed: int, steps: list[str]) -> float:
        its = self.streams(seed)
        keras.utils.set_random_seed(seed)
        model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(32, activation="relu"),
                                  keras.layers.Dense(10, activation="softmax")])
        opt = keras.optimizers.Adam(LR)
        model.compile(optimizer=opt, loss="sparse_categorical_crossentropy", metrics=["accuracy"])
        loss_fn = keras.losses.SparseCategoricalCrossentropy()

        @tf.function
        def grad(x, y):
            with tf.GradientTape() as tape:
                loss = loss_fn(y, model(x, training=True))
            return tape.gradient(loss, model.trainable_variables)

        for what in steps:
            if what == "drop1":
                next(its[1])
                continue
            half = what.endswith("_half")
            workers = {"both": (0, 1), "w0": (0,), "w1": (1,), "w0x2": (0, 0),
                       "w1x2": (1, 1)}[what.replace("_half", "")]
            grads = [grad(*next(its[w])) for w in workers]
            opt.learning_rate = LR * (0.5 if half else 1.0)
            opt.apply([sum(g) / len(grads) for g in zip(*grads)], model.trainable_variables)
        return float(model.evaluate(self.x_test, self.y_test, verbose=0)[1])


def _seeds(text: str) -> list[int]:
    if "-" in text:
        a, b = text.split("-")
        return list(range(int(a), int(b) + 1))
    return [int(s) for s in text.split(",")]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", default="0-19", help="e.g. 0-19 or 0,3,5")
    p.add_argument("--steps-alone", default=",".join(map(str, DEFAULT_K)), help="k per seed, cycled")
    p.add_argument("--variants", default=",".join(VARIANTS))
    args = p.parse_args()
    seeds, ks = _seeds(args.seeds), [int(k) for k in args.steps_alone.split(",")]
    variants = [v for v in args.variants.split(",") if v]
    if "undisturbed" not in variants:
        variants.insert(0, "undisturbed")
    replay, rows = Replay(), []
    for i, seed in enumerate(seeds):
        k = ks[i % len(ks)]
        row = {"seed": seed, "k": k, **{v: replay.run(seed, schedule(v, k)) for v in variants}}
        rows.append(row)
        print(json.dumps(row), flush=True)
    summary = {"seeds": len(rows), "mean_undisturbed": statistics.mean(r["undisturbed"] for r in rows)}
    for v in variants[1:]:
        d = [100 * (r[v] - r["undisturbed"]) for r in rows]
        summary[v] = {"mean": statistics.mean(r[v] for r in rows), "mean_difference_points": statistics.mean(d),
                      "standard_error_points": statistics.stdev(d) / math.sqrt(len(d)) if len(d) > 1 else None}
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
