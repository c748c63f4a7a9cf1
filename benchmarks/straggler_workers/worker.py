"""Worker of ``benchmarks/straggler_detection.py``: runs every scenario of a plan, in order, on one task.

Every training task of the benchmark's local cluster runs this script. It joins
the collective worker group (before any TF op), builds one
``tfdist.AllReduceStrategy`` and then, per scenario, a fresh MLP (scikit-learn
digits, 64-32-10) and a fresh ``StragglerDetector``, and trains with
``model.fit``. Compute is emulated by a sleep inside the strategy's step
(``base_s x batch/32``, x ``factor`` on a straggler's slow iterations, x a
uniform +-``jitter`` factor on every worker), so four processes fit two cores
and a worker that is left out of a step does not sleep. Worker 0 writes
``<out>/results.json`` (per scenario: wall time, detector history, per-step
begin/end wall-clock times, strategy counters).

Usage: worker.py --plan PLAN.json --out DIR
"""

import argparse
import json
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tfdist.collective  # noqa: E402  (no TF op yet)


class EmulatedCompute:
    """``sleep_for(step, compute_s)`` for one scenario (the strategy sleeps it inside the step)."""

    def __init__(self, scenario, wid, offset):
        import numpy as np

        self.s, self.wid, self.offset = scenario, wid, offset
        self.rng = np.random.default_rng([scenario.get("seed", 0), wid])

    def slow(self, step):
        s = self.s
        if self.wid not in s["stragglers"]:
            return False
        if s["schedule"] == "always":
            return True
        return (step % s["steps"]) < s["steps"] / 2  # first half of every epoch

    def sleep_for(self, step, compute_s):
        step -= self.offset
        s = self.s
        jitter = self.rng.uniform(1 - s["jitter"], 1 + s["jitter"]) if s["jitter"] else 1.0
        return s["base_s"] * s["batch"] / 32 * (s["factor"] if self.slow(step) else 1.0) * jitter


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--plan", required=True)
    p.add_argument("--out", required=True)
    args = p.parse_args()
    plan = json.load(open(args.plan))
    group = tfdist.collective.init_worker_group(timeout_s=plan.get("timeout_s", 60.0))
    wid = group.worker_id

    import keras
    import tensorflow as tf
    from sklearn.datasets import load_digits

    from tfdist import AllReduceStrategy
    from tfdist.callbacks import StragglerDetector

    x, y = load_digits(return_X_y=True)
    x = (x / 16.0).astype("float32")
    y = y.astype("int32")
    xs, ys = x[wid::group.size], y[wid::group.size]
    strategy = AllReduceStrategy()
    results = []
    for scenario in plan["scenarios"]:
        keras.utils.set_random_seed(scenario.get("seed", 0))
        with strategy.scope():
            model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(32, activation="relu"),
                                      keras.layers.Dense(10, activation="softmax")])
            model.compile(optimizer=keras.optimizers.Adam(0.01), loss="sparse_categorical_crossentropy")
        ds = tf.data.Dataset.from_tensor_slices((xs, ys)).repeat().batch(scenario["batch"])
        strategy.exclude_stragglers = scenario["exclude"]
        stats0 = strategy.stats
        strategy.slowdown = EmulatedCompute(scenario, wid, stats0["steps"] + stats0["skipped"])
        detector = StragglerDetector(profile_iterations=scenario.get("profile_iterations", 5),
                                     factor=scenario.get("k", 2.0), limit=scenario.get("limit"), ewma=False)
        begins, ends = [], []

        class Timeline(keras.callbacks.Callback):
            def on_train_batch_begin(self, batch, logs=None):
                begins.append(time.time())

            def on_train_batch_end(self, batch, logs=None):
                ends.append(time.time())

        group.all_gather([0.0])  # start together
        start = time.perf_counter()
        model.fit(ds, epochs=scenario["epochs"], steps_per_epoch=scenario["steps"], verbose=0,
                  callbacks=[detector, Timeline()])
        group.all_gather([0.0])  # the job ends when the last worker ends
        wall = time.perf_counter() - start
        strategy.slowdown = None
        stats = {k: v - stats0[k] for k, v in strategy.stats.items()}
        history = detector.history.to_dict()
        results.append({"name": scenario["name"], "wall_s": wall, "history": history, "begins": begins,
                        "ends": ends, "stats": stats})
        print(f"SCENARIO {scenario['name']} {wall:.2f}s stats={stats}", flush=True)
    if wid == 0:
        with open(os.path.join(args.out, "results.json"), "w") as f:
            json.dump({"size": group.size, "results": results}, f)
    print(f"DONE worker {wid}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
