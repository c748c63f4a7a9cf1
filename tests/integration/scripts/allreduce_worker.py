"""Worker script for the AllReduceStrategy integration tests (every training task runs it).

It joins the collective worker group first (before any TF op), trains a small
MLP on its shard of scikit-learn's digits under ``tfdist.AllReduceStrategy``
and writes ``worker-<id>.json``: per step whether it took part and a hash of
its training state (weights + optimizer state), the detector's history and the
strategy's counters.

Compute is emulated (2 shared cores): every worker sleeps ``--base`` seconds
per step it computes, the slow worker ``--factor`` times as long for steps in
``[--slow-from, --slow-until)``. The sleep happens inside the strategy's step,
so a worker left out of a step does not sleep.

Phases, in one run (process start-up dominates on 2 shared cores):
  mean   — no detector, SGD: step 0 with every worker, step 1 with workers {0, 1}
           (``strategy.set_members``); each update vs lr x the mean gradient of
           the members, computed independently with GradientTape.
  train  — Adam + StragglerDetector + partial all-reduce; per-step member set
           and training-state hash.
  kill   — (``--kill-worker W``) a further fit during which worker W kills
           itself with SIGKILL at step ``--kill-at``; the others report the
           error they get (translated by the strategy) and when.
"""

import argparse
import hashlib
import json
import os
import signal
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tfdist.collective  # noqa: E402  (no TF op yet)


def parse():
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--kill-worker", type=int, default=-1)
    p.add_argument("--kill-at", type=int, default=10)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--base", type=float, default=0.03)
    p.add_argument("--factor", type=float, default=3.0)
    p.add_argument("--slow-worker", type=int, default=-1)
    p.add_argument("--slow-from", type=int, default=0)
    p.add_argument("--slow-until", type=int, default=10**9)
    p.add_argument("--limit", type=int, default=3)
    p.add_argument("--timeout", type=float, default=20.0)
    p.add_argument("--no-exclusion", action="store_true")
    return p.parse_args()


class EmulatedCompute:
    """``sleep_for(step, compute_s)``: the strategy sleeps this long at the start of each step it computes."""

    def __init__(self, wid, args):
        self.wid, self.args = wid, args
        self.offset = None  # strategy step at which the train phase starts (off before)

    def sleep_for(self, step, compute_s):
        a = self.args
        if self.offset is None:
            return 0.0
        step -= self.offset
        slow = self.wid == a.slow_worker and a.slow_from <= step < a.slow_until
        return a.base * (a.factor if slow else 1.0)


def state_hash(variables):
    h = hashlib.sha256()
    for v in variables:
        h.update(v.numpy().tobytes())
    return h.hexdigest()[:16]


def main():
    args = parse()
    group = tfdist.collective.init_worker_group(timeout_s=args.timeout)
    wid = group.worker_id
    print(f"GROUP worker {wid} of {group.size}", flush=True)

    import keras
    import numpy as np
    import tensorflow as tf
    from sklearn.datasets import load_digits

    from tfdist import AllReduceStrategy
    from tfdist.callbacks import StragglerDetector

    keras.utils.set_random_seed(0)  # identical initial weights on every worker
    x, y = load_digits(return_X_y=True)
    x = (x / 16.0).astype("float32")
    y = y.astype("int32")
    xs, ys = x[wid::group.size], y[wid::group.size]  # this worker's shard

    emulated = EmulatedCompute(wid, args)
    strategy = AllReduceStrategy(exclude_stragglers=not args.no_exclusion, slowdown=emulated)

    def build(make_optimizer):
        with strategy.scope():  # the optimizer too: its variables belong to the strategy
            optimizer = make_optimizer()
            model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(32, activation="relu"),
                                      keras.layers.Dense(10, activation="softmax")])
            model.compile(optimizer=optimizer, loss="sparse_categorical_crossentropy")
        return model, optimizer

    result = {"worker_id": wid, "size": group.size}
    result["mean"] = check_mean(args, group, strategy, build(lambda: keras.optimizers.SGD(0.1))[0], xs, ys, keras, np, tf)
    strategy.set_members(range(group.size))  # everyone again (worker 2 copies worker 0's state)

    steps = []

    class Record(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            steps.append({"members": sorted(strategy.members), "hash": state_hash(model.weights + opt.variables)})
            print(f"STEP {len(steps) - 1}", flush=True)

    keras.utils.set_random_seed(1)
    model, opt = build(lambda: keras.optimizers.Adam(0.01))
    detector = StragglerDetector(limit=args.limit, log_path=os.path.join(args.out, "verdicts-{worker}.jsonl"))
    ds = tf.data.Dataset.from_tensor_slices((xs, ys)).repeat().batch(args.batch)
    emulated.offset = strategy.stats["steps"] + strategy.stats["skipped"]
    hist = model.fit(ds, epochs=args.epochs, steps_per_epoch=args.steps, verbose=0, callbacks=[detector, Record()])
    emulated.offset = None
    result["keras_history"] = {k: [float(v) for v in vals] for k, vals in hist.history.items()}
    result["steps"] = steps
    result["straggler_history"] = detector.history.to_dict()
    result["stats"] = strategy.stats
    result["variables"] = len(strategy.training_state_variables())
    write(args, wid, result)

    if args.kill_worker >= 0:
        class Killer(keras.callbacks.Callback):
            def on_train_batch_begin(self, batch, logs=None):
                if wid == args.kill_worker and batch == args.kill_at:
                    with open(os.path.join(args.out, "killed.json"), "w") as f:
                        json.dump({"worker": wid, "time": time.time()}, f)
                    os.kill(os.getpid(), signal.SIGKILL)
                print(f"KILLPHASE {batch}", flush=True)

        try:
            model.fit(ds, epochs=1, steps_per_epoch=10 * args.kill_at, verbose=0,
                      callbacks=[StragglerDetector(limit=args.limit), Killer()])
            result["raised"] = None
        except Exception as e:  # noqa: BLE001  (the dead peer: report it, translated)
            err = strategy.translate_error(e)
            result["raised"] = {"type": type(err).__name__, "tf_type": type(e).__name__, "message": str(err),
                                "peers": list(getattr(err, "peers", ())), "time": time.time()}
            print(f"RAISED {type(err).__name__}: {err}", flush=True)
        write(args, wid, result)
    print(f"DONE worker {wid}", flush=True)


def write(args, wid, result):
    with open(os.path.join(args.out, f"worker-{wid}.json"), "w") as f:
        json.dump(result, f)


def check_mean(args, group, strategy, model, xs, ys, keras, np, tf):
    """Two SGD steps (all workers, then {0, 1}); each update vs lr x mean of the members' own gradients."""
    lr = 0.1
    loss_fn = keras.losses.SparseCategoricalCrossentropy()
    out = {"checks": []}

    class Members(keras.callbacks.Callback):
        def __init__(self, members):
            super().__init__()
            self.members = members

        def on_train_batch_begin(self, batch, logs=None):
            strategy.set_members(self.members)

    for step, members in enumerate([range(group.size), (0, 1)]):
        xb, yb = xs[step * args.batch:(step + 1) * args.batch], ys[step * args.batch:(step + 1) * args.batch]
        before = [v.numpy().copy() for v in model.trainable_variables]
        with tf.GradientTape() as tape:  # outside the strategy: this worker's plain mean-loss gradient
            loss = loss_fn(yb, model(xb, training=True))
        grads = tape.gradient(loss, model.trainable_variables)
        flat = np.concatenate([g.numpy().ravel() for g in grads]).astype(np.float64)
        table = group.all_gather(flat)  # every worker's gradient
        mean = table[sorted(members)].mean(axis=0)
        model.fit(xb, yb, batch_size=args.batch, epochs=1, shuffle=False, verbose=0, callbacks=[Members(members)])
        after = np.concatenate([v.numpy().ravel() for v in model.trainable_variables]).astype(np.float64)
        start = np.concatenate([b.ravel() for b in before]).astype(np.float64)
        member = group.worker_id in members
        expected = start - lr * mean if member else start
        out["checks"].append({"step": step, "members": sorted(members), "member": member,
                              "max_abs_error": float(np.max(np.abs(after - expected))),
                              "max_abs_update": float(np.max(np.abs(after - start))),
                              "hash": state_hash(model.trainable_variables)})
    return out


if __name__ == "__main__":
    sys.exit(main())
