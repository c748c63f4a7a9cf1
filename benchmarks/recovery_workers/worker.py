"""One training worker of the recovery benchmark: the benchmark MLP on synthetic data, step ends timed.

Usage: worker.py --mode async|bsp --out DIR [--model mlp|cnn] [--steps N]

Trains up to ``--steps`` steps (batch 64) and stops early once ``DIR/stop``
exists (the driver ends the run when it has what it measures). Writes
``DIR/worker-<id>.json``: ``time.time()`` at the end of every step, the
session's recovery count and the PS tasks' status after fit. Writes
``DIR/started`` after the first step. Exits with ``os._exit(0)`` after
``strategy.shutdown()`` (see the comment at the end).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from benchmarks import _common  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--mode", required=True, choices=["async", "bsp"])
    p.add_argument("--out", required=True)
    p.add_argument("--model", default="mlp", choices=sorted(_common.MODELS))
    p.add_argument("--steps", type=int, default=3000)
    args = p.parse_args()

    import keras

    import tfdist

    strategy = tfdist.BSPStrategy() if args.mode == "bsp" else tfdist.ParameterServerStrategy()
    me = strategy.worker_id
    keras.utils.set_random_seed(me)
    with strategy.scope():
        model = _common.make_model(keras, args.model)
        _common.compile_model(keras, model)
    timer = _common.step_timer_class(keras)()
    stop_path, started_path = os.path.join(args.out, "stop"), os.path.join(args.out, "started")

    class StopOnFile(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if batch == 0 and me == 0:
                open(started_path, "w").close()
            if os.path.exists(stop_path):
                self.model.stop_training = True

    model.fit(_common.synthetic_dataset(args.model, _common.BATCH, seed=me), steps_per_epoch=args.steps, epochs=1,
              verbose=0, callbacks=[timer, StopOnFile(), tfdist.callbacks.LeaveOnTrainEnd()])
    result = {
        "worker_id": me,
        "step_ends": timer.wall,
        "recoveries": strategy.extended._runtime.session.stats["recoveries"],
        "ps_status": [{k: st.get(k) for k in ("incarnation", "restored_from", "progress", "global_step",
                                              "state_step", "checkpoint")} for st in strategy.ps_status()],
    }
    path = os.path.join(args.out, f"worker-{me}.json")
    with open(path + ".tmp", "w") as f:
        json.dump(result, f)
    os.replace(path + ".tmp", path)
    # A worker that stopped fit early can hang at interpreter exit in a tf.data iterator's destructor (see
    # tfdist.strategies.parameter_server._arm_exit_watchdog): the watchdog then exits 1 after 20 s and the
    # launcher would restart the chief. Say Done to the PS tasks and leave without finalising.
    strategy.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
