"""Worker script for fault-tolerance tests: a tiny MLP on digits, a fixed number of steps, faults on request.

Usage: fault_worker.py --out DIR --mode bsp|sync_replicas [--m M] [--steps N]
       [--crash-worker W --crash-at K]      worker W SIGKILLs itself after its K-th step
       [--stop-worker W --stop-at K]        worker W ends fit after K steps (as EarlyStopping does)
       [--leave-on-train-end]               add tfdist.callbacks.LeaveOnTrainEnd to fit
       [--linger-for-others]                the stopping worker, after fit, waits (bounded) until every
                                            other worker wrote its result, then evaluates (its process
                                            outlives their fit)
       [--hold-worker H --hold-at K]        worker H waits (bounded) before its K-th step until the
                                            crashing worker has crashed, so the crash happens while H
                                            trains (SyncReplicas: the others would not wait for a
                                            worker that is still tracing its first step)

Writes ``worker-<id>.json``: steps done, step durations, a hash of the final
state (weights + optimizer variables) and the PS status after fit.
"""

import argparse
import json
import os
import signal
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import tensorflow as tf  # noqa: E402

import tfdist  # noqa: E402
from tfdist.datasets import load_digits  # noqa: E402
from model_state import state_hash  # noqa: E402  (this script's folder)


class Faults(keras.callbacks.Callback):
    """Times every step; crashes or stops this worker after a given step."""

    def __init__(self, out, crash_at=None, stop_at=None, hold_at=None, crash_worker=None):
        super().__init__()
        self.out, self.crash_at, self.stop_at, self.hold_at = out, crash_at, stop_at, hold_at
        self.crash_marker = os.path.join(out, f"crashed-{crash_worker}")
        self.durations, self._start = [], None

    def on_train_batch_begin(self, batch, logs=None):
        if self.hold_at is not None and batch + 1 == self.hold_at:
            deadline = time.monotonic() + 120
            while not os.path.exists(self.crash_marker):
                if time.monotonic() > deadline:
                    raise TimeoutError("the crashing worker did not crash within 120 s")
                time.sleep(0.02)
        self._start = time.monotonic()

    def on_train_batch_end(self, batch, logs=None):
        self.durations.append(time.monotonic() - self._start)
        if self.crash_at is not None and batch + 1 >= self.crash_at:
            print(f"killing myself after step {batch + 1}", flush=True)
            open(self.crash_marker, "w").close()
            os.kill(os.getpid(), signal.SIGKILL)
        if self.stop_at is not None and batch + 1 >= self.stop_at:
            print(f"stopping fit after step {batch + 1}", flush=True)
            self.model.stop_training = True


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--mode", required=True, choices=["bsp", "sync_replicas"])
    p.add_argument("--m", type=int)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--crash-worker", type=int, default=-1)
    p.add_argument("--crash-at", type=int)
    p.add_argument("--stop-worker", type=int, default=-1)
    p.add_argument("--stop-at", type=int)
    p.add_argument("--hold-worker", type=int, default=-1)
    p.add_argument("--hold-at", type=int)
    p.add_argument("--leave-on-train-end", action="store_true")
    p.add_argument("--linger-for-others", action="store_true")
    args = p.parse_args()

    if args.mode == "bsp":
        strategy = tfdist.BSPStrategy()
    else:
        strategy = tfdist.SyncReplicasStrategy(replicas_to_aggregate=args.m)
    me, n = strategy.worker_id, strategy.num_workers
    data = load_digits()
    x, y = data.x_train.reshape(-1, 64)[me::n], data.y_train[me::n]
    ds = tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(16)
    keras.utils.set_random_seed(0)
    with strategy.scope():
        model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(16, activation="relu"),
                                  keras.layers.Dense(10, activation="softmax")])
        model.compile(optimizer=keras.optimizers.Adam(3e-3), loss="sparse_categorical_crossentropy")
    faults = Faults(args.out, crash_at=args.crash_at if me == args.crash_worker else None,
                    stop_at=args.stop_at if me == args.stop_worker else None,
                    hold_at=args.hold_at if me == args.hold_worker else None, crash_worker=args.crash_worker)
    callbacks = [faults] + ([tfdist.callbacks.LeaveOnTrainEnd()] if args.leave_on_train_end else [])
    start = time.monotonic()
    hist = model.fit(ds, steps_per_epoch=args.steps, epochs=1, verbose=2, callbacks=callbacks)
    result = {
        "worker_id": me,
        "fit_seconds": time.monotonic() - start,
        "steps": len(faults.durations),
        "durations": faults.durations,
        "loss": [float(v) for v in hist.history["loss"]],
        "state_hash": state_hash(model),
        "ps_status": [{k: st[k] for k in ("global_step", "state_step", "stats", "live_workers", "done_workers",
                                          "worker_batches")} for st in strategy.ps_status()],
    }
    if args.linger_for_others and me == args.stop_worker:  # outlive the others' fit, then still evaluate
        deadline = time.monotonic() + 120
        others = [os.path.join(args.out, f"worker-{w}.json") for w in range(n) if w != me]
        while not all(os.path.exists(f) for f in others):
            if time.monotonic() > deadline:
                raise TimeoutError("the other workers did not finish within 120 s")
            time.sleep(0.05)
        result["eval_after_linger"] = float(model.evaluate(data.x_test.reshape(-1, 64), data.y_test, verbose=0))
    path = os.path.join(args.out, f"worker-{me}.json")
    with open(path + ".tmp", "w") as f:
        json.dump(result, f)
    os.replace(path + ".tmp", path)
    print(f"worker {me} done after {result['steps']} steps", flush=True)


if __name__ == "__main__":
    main()
