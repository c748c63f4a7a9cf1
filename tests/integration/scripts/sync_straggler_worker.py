"""BSP + StragglerDetector: the detected straggler stops being waited for, then is re-admitted.

The detector finds the strategy's straggler engine itself (worker 1 also
subscribes the old ``straggler_listener()``, which must add nothing).

Every worker sleeps ``--base-sleep`` per step (emulated compute); worker
``--slow-worker`` sleeps ``--delay`` more during steps [slow_from, slow_until).
Records, per step: PS global step, the PS's excluded set, the state hash.
"""

import argparse
import hashlib
import json
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from tfdist.collective import init_worker_group  # noqa: E402


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--base-sleep", type=float, default=0.03)
    p.add_argument("--delay", type=float, default=0.09)
    p.add_argument("--slow-worker", type=int, default=2)
    p.add_argument("--slow-from", type=int, default=8)
    p.add_argument("--slow-until", type=int, default=30)
    args = p.parse_args()
    group = init_worker_group(timeout_s=30)
    wid = group.worker_id

    import keras
    import numpy as np

    import tfdist
    from tfdist.callbacks import StragglerDetector
    from tfdist.datasets import load_digits

    strategy = tfdist.BSPStrategy()
    data = load_digits()
    n = strategy.num_workers
    x, y = data.x_train.reshape(-1, 64)[wid::n][:32 * 20], data.y_train[wid::n][:32 * 20]
    keras.utils.set_random_seed(0)
    with strategy.scope():
        model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(32, activation="relu"),
                                  keras.layers.Dense(10, activation="softmax")])
        model.compile(optimizer=keras.optimizers.Adam(3e-3), loss="sparse_categorical_crossentropy")

    records, events = [], []

    class Emulate(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.step = 0

        def on_train_batch_begin(self, batch, logs=None):
            slow = wid == args.slow_worker and args.slow_from <= self.step < args.slow_until
            time.sleep(args.base_sleep + (args.delay if slow else 0.0))

        def on_train_batch_end(self, batch, logs=None):
            h = hashlib.sha1()
            for v in list(model.trainable_weights) + list(model.optimizer.variables):
                h.update(np.ascontiguousarray(v.numpy()).tobytes())
            records.append([int(logs["ps_step"]), strategy.ps_status()[0]["excluded"], h.hexdigest(), self.step])
            self.step += 1

    detector = StragglerDetector(profile_iterations=3, factor=2.0, limit=2, ewma=False, timeout_s=30)
    if wid == 1:  # old scripts wired the strategy by hand; it is found by itself now and this adds no sender
        detector.subscribe(strategy.straggler_listener())
    detector.subscribe(on_detected=lambda w, info: events.append(["detected", w, len(records)]),
                       on_recovered=lambda w, info: events.append(["recovered", w, len(records)]))
    model.fit(x, y, batch_size=32, epochs=args.epochs, shuffle=False, verbose=2, callbacks=[detector, Emulate()])
    with open(os.path.join(args.out, f"worker-{wid}.json"), "w") as f:
        json.dump({"worker_id": wid, "records": records, "events": events, "sync_stats": strategy.sync_stats,
                   "ps_stats": strategy.ps_status()[0]["stats"]}, f)
    print(f"worker {wid} done", flush=True)


if __name__ == "__main__":
    sys.exit(main())
