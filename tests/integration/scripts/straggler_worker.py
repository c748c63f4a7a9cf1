"""Worker script for the straggler-detection integration tests.

Every training task runs it. It joins the collective worker group first
(before any TF op), checks gather and all-reduce-min across the workers,
trains a small Keras model with ``StragglerDetector`` and an injected
slow-down, and writes ``worker-<id>.json``.

Usage: straggler_worker.py --out DIR [--epochs N] [--steps N] [--base-sleep S]
       [--delay S --slow-worker W --slow-from STEP --slow-until STEP]
       [--timeout S] [--strategy none|ps] [--on-failure report|raise] [--width N]
"""

import argparse
import json
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tfdist.collective  # noqa: E402  (no TF op yet)


class _Args(argparse.Namespace):
    pass


def parse():
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--base-sleep", type=float, default=0.02)
    p.add_argument("--delay", type=float, default=0.0, help="extra seconds per slow iteration")
    p.add_argument("--slow-worker", type=int, default=-1)
    p.add_argument("--slow-from", type=int, default=0)
    p.add_argument("--slow-until", type=int, default=10**9)
    p.add_argument("--timeout", type=float, default=20.0)
    p.add_argument("--strategy", default="none", choices=["none", "ps"])
    p.add_argument("--on-failure", default="report")
    p.add_argument("--limit", type=int, default=None)
    p.add_argument("--width", type=int, default=16, help="hidden units (a wide layer makes every exchange big)")
    return p.parse_args(namespace=_Args())


def main():
    args = parse()
    started = time.time()
    group = tfdist.collective.init_worker_group(timeout_s=args.timeout)
    wid = group.worker_id
    print(f"GROUP worker {wid} of {group.size} ready after {time.time() - started:.1f}s", flush=True)
    gathered = group.all_gather([wid * 10.0, 1.0]).tolist()
    minimum = group.all_reduce_min([wid + 1.0, 5.0 - wid]).tolist()
    print(f"GATHER {gathered} MIN {minimum}", flush=True)

    import keras
    import numpy as np

    from tfdist.collective import CollectiveError
    from tfdist.strategies import ParameterServerStrategy
    from tfdist.callbacks import StragglerDetector

    class SlowDown(keras.callbacks.Callback):
        """Sleeps inside the measured interval (runs after the detector's batch_begin)."""

        def __init__(self):
            super().__init__()
            self.step = 0

        def on_train_batch_begin(self, batch, logs=None):
            slow = wid == args.slow_worker and args.slow_from <= self.step < args.slow_until
            time.sleep(args.base_sleep + (args.delay if slow else 0.0))

        def on_train_batch_end(self, batch, logs=None):
            print(f"STEP {self.step}", flush=True)
            self.step += 1

    if args.strategy == "ps":
        # Every step exchanged, so every step costs the same: under exchange_every auto (the default) a step that
        # exchanges carries the held steps' update and takes longer, which near the detector's limit can flip a
        # verdict for one step (seen once under load); the test asserts the exact steps of the verdicts.
        strategy = ParameterServerStrategy(exchange_every=1)
        scope = strategy.scope()
    else:
        import contextlib

        strategy, scope = None, contextlib.nullcontext()
    rng = np.random.default_rng(wid)
    x = rng.normal(size=(args.steps * 16, 8)).astype("float32")
    y = (x[:, 0] + x[:, 1] > 0).astype("int32")
    with scope:
        model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(args.width, activation="relu"),
                                  keras.layers.Dense(2, activation="softmax")])
        model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    detected_hooks = []
    detector = StragglerDetector(
        limit=args.limit, on_failure=args.on_failure,
        log_path=os.path.join(args.out, "verdicts-{worker}.jsonl"),
        on_straggler_detected=lambda w, info: detected_hooks.append(["detected", w, info.step, info.detector.value]),
        on_straggler_recovered=lambda w, info: detected_hooks.append(["recovered", w, info.step, info.detector.value]),
    )
    result = {"worker_id": wid, "size": group.size, "gathered": gathered, "minimum": minimum}
    try:
        hist = model.fit(x, y, batch_size=16, epochs=args.epochs, verbose=0, shuffle=False,
                         callbacks=[detector, SlowDown()])
        result["keras_history"] = {k: [None if v != v else v for v in vals] for k, vals in hist.history.items()}
    except CollectiveError as e:
        result["raised"] = {"type": type(e).__name__, "message": str(e), "peers": list(e.peers)}
        print(f"RAISED {type(e).__name__}: {e}", flush=True)
    result["straggler_history"] = detector.history.to_dict()
    result["hooks"] = detected_hooks
    if strategy is not None:
        result["sync_stats"] = strategy.sync_stats
        # a read of the PS: the steps the exchange held back (exchange_every: auto) reach it first
        result["own_batches_on_ps"] = strategy.ps_status()[0]["worker_batches"].get(str(wid))
    with open(os.path.join(args.out, f"worker-{wid}.json"), "w") as f:
        json.dump(result, f)
    print(f"DONE worker {wid} failures={len(detector.history.failures)}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
