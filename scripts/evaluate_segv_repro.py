"""Counts worker processes that die with SIGSEGV in Keras ``evaluate`` under a tf.distribute strategy.

TensorFlow 2.21 / Keras 3.15: under any ``tf.distribute`` strategy, Keras's
``fit``/``evaluate`` take one batch from a throwaway iterator to build the
model (``TensorFlowTrainer._maybe_symbolic_build``) and then drop it
(``EpochIterator.reset``). A few processes in a hundred die with SIGSEGV
there. This script runs many short training processes (one batch evaluate,
``fit`` with validation, evaluate, predict: the integration tests' worker
sequence), several at a time so they compete for the cores, and counts exit
codes.

Modes (the child's strategy):

* ``none`` — Keras's default strategy (no peek: Keras defers building).
* ``onedevice`` — ``tf.distribute.OneDeviceStrategy`` (no tfdist code runs).
* ``onedevice_spec`` — the same, with tfdist's element-spec build installed
  for it (``tfdist.data.symbolic_build``): Keras builds from the dataset's
  ``element_spec`` and never opens the throwaway iterator.
* ``tfdist`` — ``tfdist.ParameterServerStrategy()`` with its in-process PS
  (which builds from the element spec, like ``onedevice_spec``).
* ``tfdist_peek`` — the same strategy with the element-spec build switched
  off again: what tfdist did before.

The modes' children are interleaved, so every mode meets the same load.
Example (prints one JSON line per mode)::

    python scripts/evaluate_segv_repro.py --modes onedevice onedevice_spec --runs 200 --parallel 4

Slow (minutes): not part of the test suite.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import time

MODES = ("none", "onedevice", "onedevice_spec", "tfdist", "tfdist_peek")


def child(mode: str, epochs: int) -> None:
    import faulthandler

    faulthandler.enable()  # a SIGSEGV prints the Python stack to stderr
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import keras
    import numpy as np
    import tensorflow as tf

    from tfdist.datasets import load_digits

    if mode == "none":
        strategy = tf.distribute.get_strategy()
    elif mode in ("onedevice", "onedevice_spec"):
        strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
        if mode == "onedevice_spec":
            from tfdist.data import symbolic_build

            symbolic_build.build_from_element_spec(strategy)
    elif mode in ("tfdist", "tfdist_peek"):
        import tfdist

        strategy = tfdist.ParameterServerStrategy()
        if mode == "tfdist_peek":
            from tfdist.data import symbolic_build

            setattr(strategy, symbolic_build._SPEC_BUILD, False)  # Keras peeks again
    else:
        raise SystemExit(f"unknown mode {mode!r}")
    data = load_digits()
    x_train, y_train = data.x_train.reshape(len(data.x_train), -1), data.y_train
    x_test, y_test = data.x_test.reshape(len(data.x_test), -1), data.y_test
    with strategy.scope():
        model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(32, activation="relu"),
                                  keras.layers.Dense(10, activation="softmax")])
        model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    model.evaluate(x_test, y_test, batch_size=len(x_test), verbose=0)
    model.fit(x_train, y_train, batch_size=32, epochs=epochs, validation_data=(x_test, y_test), verbose=0)
    _, acc = model.evaluate(x_test, y_test, verbose=0)
    model.predict(x_test[:5], verbose=0)
    assert np.isfinite(acc)


def run(modes: list[str], runs: int, parallel: int, epochs: int, log_dir: str | None) -> list[dict]:
    """``runs`` children per mode, the modes interleaved so they share the machine's load alike."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", TF_NUM_INTRAOP_THREADS="1", PYTHONUNBUFFERED="1")
    for name in ("TF_CONFIG", "TFDIST_CONFIG"):
        env.pop(name, None)
    queue = [(i, mode) for i in range(runs) for mode in modes]
    codes = {mode: collections.Counter() for mode in modes}
    failed_logs: dict[str, list[str]] = {mode: [] for mode in modes}
    running: list[tuple[subprocess.Popen, str, str]] = []
    t0 = time.monotonic()
    while queue or running:
        while queue and len(running) < parallel:
            i, mode = queue.pop(0)
            log = os.path.join(log_dir, f"{mode}-{i}.log") if log_dir else ""
            out = open(log, "w") if log else subprocess.DEVNULL  # noqa: SIM115
            proc = subprocess.Popen([sys.executable, __file__, "--child", mode, "--epochs", str(epochs)],
                                    env=env, stdout=out, stderr=subprocess.STDOUT)
            if log:
                out.close()
            running.append((proc, mode, log))
        time.sleep(0.2)
        for item in list(running):
            proc, mode, log = item
            code = proc.poll()
            if code is None:
                continue
            running.remove(item)
            codes[mode][code] += 1
            if code != 0 and log:
                failed_logs[mode].append(log)
    seconds = round(time.monotonic() - t0, 1)
    return [{"mode": mode, "runs": runs, "parallel": parallel, "epochs": epochs,
             "exit_codes": {str(k): v for k, v in sorted(codes[mode].items())}, "sigsegv": codes[mode].get(-11, 0),
             "seconds_all_modes": seconds, "failed_logs": failed_logs[mode][:20]} for mode in modes]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--modes", nargs="+", default=["onedevice", "onedevice_spec"], choices=MODES)
    p.add_argument("--runs", type=int, default=100, help="processes per mode")
    p.add_argument("--parallel", type=int, default=4, help="processes running at once")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--log-dir", help="keep every child's output here")
    p.add_argument("--child", choices=MODES, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        child(args.child, args.epochs)
        return
    if args.log_dir:
        os.makedirs(args.log_dir, exist_ok=True)
    for result in run(args.modes, args.runs, args.parallel, args.epochs, args.log_dir):
        print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
