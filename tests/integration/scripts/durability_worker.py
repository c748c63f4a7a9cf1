"""Worker script for PS durability tests: a small MLP on digits; the chief pauses mid-fit while the test kills a PS.

Usage: durability_worker.py --out DIR --mode async|ssp|bsp|sync_replicas [--m M] [--steps N]
       [--pause-at K]   the chief, before its K-th step, writes ``paused`` and waits (bounded) for the
                        test to write ``resume`` (the test kills a PS task meanwhile)
       [--pause-worker W]  the worker that pauses (default 0, the chief; the test kills or stops it)
                        the other workers wait for ``resume`` before step K + 30 (so none can finish
                        ``fit`` before the fault, e.g. under SyncReplicas M=1 where nobody waits for the chief)
       [--ballast-mb MB]   an unused non-trainable variable of MB MiB, placed on ps:1 (round robin: it
                        is the model's second variable), so that a checkpoint of ps:1 takes a while to write
       [--crash-chief-at K]  the chief SIGKILLs itself after its K-th step (only the first time: the
                        launcher restarts it and the new process trains to the end)
       [--barrier]      every worker evaluates only once all workers finished ``fit`` (a file barrier,
                        bounded): each measures the job's final model, not the one mid-training
       [--seed S]       the model's initial values (``keras.utils.set_random_seed(S)``) and worker W's
                        shuffle seed (``1000 * S + W``); the default 0 is the fixed seeds of before

The optimizer is Adam, 1e-2; with ``--lr-decay`` its learning rate decays
over the run's steps (cosine, 1e-2 down to 1e-3), so the job ends near a
minimum: under the parallel suite's load two undisturbed async runs then
end within about 2 points of each other (with the constant rate they
differed by up to 4.5 points there: measured with
``benchmarks/fault_accuracy.py`` beside two busy loops, SD 1.36 points
against 0.52). The killed-PS tests use it (their comparison flaked with the
constant rate). The others keep the constant rate: with the decay, a job
that loses a worker's last 91 batches ends measurably lower than one that
trains them all (it converges further), and the killed-worker comparison
failed once against a quiet baseline (0.914 against 0.947, 2026-11-29).

Writes ``worker-<id>.json``: steps done, the wall-clock time at the end of
every step, the final test accuracy of this worker's model (after a pull;
with ``--barrier`` also ``accuracy_after_own_fit``, pulled and evaluated
right after this worker's ``fit``, before the barrier), the session's
recovery count and the PS status after fit.
"""

import argparse
import json
import os
import signal
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import tensorflow as tf  # noqa: E402

import tfdist  # noqa: E402
from tfdist.datasets import load_digits  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from file_barrier import wait_for_all  # noqa: E402  (this script's folder)


class Pause(keras.callbacks.Callback):
    def __init__(self, out, at, crash_at=None, hold_at=None):
        super().__init__()
        self.out, self.at, self.crash_at, self.hold_at, self.steps = out, at, crash_at, hold_at, 0
        self.step_ends: list[float] = []  # time.time() at the end of every step (recovery benchmark)

    def on_train_batch_begin(self, batch, logs=None):
        if self.at is not None and batch + 1 == self.at:
            open(os.path.join(self.out, "paused"), "w").close()
            self._wait_for_resume()
        if self.hold_at is not None and batch + 1 == self.hold_at:
            self._wait_for_resume()

    def _wait_for_resume(self):
        deadline = time.monotonic() + 120
        while not os.path.exists(os.path.join(self.out, "resume")):
            if time.monotonic() > deadline:
                raise TimeoutError("the test did not say resume within 120 s")
            time.sleep(0.02)

    def on_train_batch_end(self, batch, logs=None):
        self.steps += 1
        self.step_ends.append(time.time())
        marker = os.path.join(self.out, "crashed")
        if self.crash_at is not None and batch + 1 == self.crash_at and not os.path.exists(marker):
            open(marker, "w").close()  # the restarted process runs to the end
            print(f"killing myself after step {batch + 1}", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)


class Ballast(keras.layers.Layer):
    """Passes its input through; holds a tiny variable (on ps:0) and a big unused one (on ps:1)."""

    def __init__(self, floats, **kwargs):
        super().__init__(**kwargs)
        self.floats = floats

    def build(self, input_shape):
        # Marked shared: a custom layer's non-trainable state is otherwise local to each worker (README).
        self.tiny = self.add_weight(shape=(1,), initializer="zeros", trainable=False, name="tiny", aggregation="sum")
        self.big = self.add_weight(shape=(self.floats,), initializer="ones", trainable=False, name="big",
                                   aggregation="sum")

    def call(self, x):
        return x


def evaluate_while_training(strategy, out):
    """The evaluator task: one round per new PS version until the job ends; writes ``evaluator.json``."""
    data = load_digits()
    with strategy.scope():
        model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(32, activation="relu"),
                                  keras.layers.Dense(10, activation="softmax")])
        model.compile(loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    rounds = []
    for version in strategy.evaluation_rounds(interval_s=0.2):
        _, accuracy = model.evaluate(data.x_test.reshape(-1, 64), data.y_test, verbose=0)
        try:
            incarnations = [st.get("incarnation") for st in strategy.ps_status()]
        except tfdist.errors.PSUnavailableError:  # the job ended (or a task restarts) since the round began
            incarnations = [None, None]
        rounds.append({"time": time.time(), "version": version, "accuracy": float(accuracy),
                       "incarnations": incarnations})
        open(os.path.join(out, "evaluating"), "a").close()  # the test waits for a first round
    path = os.path.join(out, "evaluator.json")
    with open(path + ".tmp", "w") as f:
        json.dump({"rounds": rounds}, f)
    os.replace(path + ".tmp", path)
    print(f"evaluator done after {len(rounds)} rounds", flush=True)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--mode", required=True, choices=["async", "ssp", "bsp", "sync_replicas"])
    p.add_argument("--m", type=int)
    p.add_argument("--steps", type=int, default=150)
    p.add_argument("--pause-at", type=int)
    p.add_argument("--crash-chief-at", type=int, help="the chief SIGKILLs itself after this step (once)")
    p.add_argument("--pause-worker", type=int, default=0, help="the worker that pauses at --pause-at")
    p.add_argument("--barrier", action="store_true", help="evaluate once every worker finished fit")
    p.add_argument("--seed", type=int, default=0, help="init seed; worker W shuffles with 1000 * seed + W")
    p.add_argument("--ballast-mb", type=float, default=0.0, help="an unused variable of this size on ps:1")
    p.add_argument("--lr-decay", action="store_true", help="cosine decay of the learning rate over --steps")
    args = p.parse_args()

    if args.mode == "bsp":
        strategy = tfdist.BSPStrategy()
    elif args.mode == "sync_replicas":
        strategy = tfdist.SyncReplicasStrategy(replicas_to_aggregate=args.m)
    elif args.mode == "ssp":
        strategy = tfdist.SSPStrategy(staleness=3)
    else:
        strategy = tfdist.ParameterServerStrategy()
    me, n = strategy.worker_id, strategy.num_workers
    if strategy.is_evaluator:
        return evaluate_while_training(strategy, args.out)
    data = load_digits()
    x, y = data.x_train.reshape(-1, 64)[me::n], data.y_train[me::n]
    ds = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(512, seed=1000 * args.seed + me).repeat().batch(32)
    keras.utils.set_random_seed(args.seed)
    with strategy.scope():
        ballast = [Ballast(int(args.ballast_mb * 2 ** 20) // 4)] if args.ballast_mb else []
        model = keras.Sequential([keras.Input((64,)), *ballast, keras.layers.Dense(32, activation="relu"),
                                  keras.layers.Dense(10, activation="softmax")])
        learning_rate = (keras.optimizers.schedules.CosineDecay(1e-2, args.steps, alpha=0.1)  # (the docstring)
                         if args.lr_decay else 1e-2)
        model.compile(optimizer=keras.optimizers.Adam(learning_rate), loss="sparse_categorical_crossentropy",
                      metrics=["accuracy"])
    others_hold = args.pause_at + 30 if args.pause_at is not None and me != args.pause_worker else None
    pause = Pause(args.out, args.pause_at if me == args.pause_worker else None,
                  args.crash_chief_at if me == 0 else None, hold_at=others_hold)
    model.fit(ds, steps_per_epoch=args.steps, epochs=1, verbose=2,
              callbacks=[pause, tfdist.callbacks.LeaveOnTrainEnd()])
    own_fit = None
    if args.barrier:  # the others may still train (a restarted chief trains its steps again)
        strategy.pull()  # the job's model right after this worker's fit (what it evaluated without --barrier)
        _, own_fit = model.evaluate(data.x_test.reshape(-1, 64), data.y_test, verbose=0)
        wait_for_all(args.out, "trained", me, n, timeout=180)
    strategy.pull()
    _, accuracy = model.evaluate(data.x_test.reshape(-1, 64), data.y_test, verbose=0)
    runtime = strategy.extended._runtime
    result = {
        "worker_id": me,
        "seed": args.seed,
        "steps": pause.steps,
        "step_ends": pause.step_ends,
        "accuracy": float(accuracy),
        "accuracy_after_own_fit": None if own_fit is None else float(own_fit),  # --barrier: before it
        "recoveries": runtime.session.stats["recoveries"],
        "syncs": runtime.session.stats["syncs"],
        "steps_per_exchange": getattr(runtime, "exchange_every", None),  # (the update path's schedule, at the end)
        "lone_worker": bool(runtime.local_only() and getattr(runtime, "lone_worker", False)),
        "ps_status": [{k: st.get(k) for k in ("incarnation", "restored_from", "progress", "global_step",
                                              "state_step", "checkpoint", "joins", "worker_batches", "bytes")}
                      for st in strategy.ps_status()],
    }
    path = os.path.join(args.out, f"worker-{me}.json")
    with open(path + ".tmp", "w") as f:
        json.dump(result, f)
    os.replace(path + ".tmp", path)
    print(f"worker {me} done after {result['steps']} steps, accuracy {accuracy:.3f}", flush=True)


if __name__ == "__main__":
    main()
