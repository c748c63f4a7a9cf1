"""A training task that fits a small MLP on digits under ParameterServerStrategy, then may raise.

Usage: crash_after_fit.py [--raise-after-fit | --exit-after-fit CODE | --raise-system-exit CODE]

With ``--raise-after-fit`` the script raises an uncaught RuntimeError once
``fit`` is over (a failing save or evaluation after training), so the task
exits 1; with ``--exit-after-fit CODE`` it calls ``sys.exit(CODE)`` there, with
``--raise-system-exit CODE`` it writes out ``raise SystemExit(CODE)``.
Prints ``fit done, worker N`` after fit.
"""

import argparse
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tfdist  # noqa: E402
from digits_mlp import sgd_mlp  # noqa: E402  (this script's folder)
from tfdist.datasets import load_digits  # noqa: E402


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--raise-after-fit", action="store_true")
    p.add_argument("--exit-after-fit", type=int, default=None)
    p.add_argument("--raise-system-exit", type=int, default=None)
    args = p.parse_args()
    strategy = tfdist.ParameterServerStrategy()
    data = load_digits()
    x = data.x_train.reshape(len(data.x_train), 64)[strategy.worker_id::strategy.num_workers][:256]
    y = data.y_train[strategy.worker_id::strategy.num_workers][:256]
    with strategy.scope():
        model = sgd_mlp()
    model.fit(x, y, batch_size=32, epochs=1, verbose=0)
    print(f"fit done, worker {strategy.worker_id}", flush=True)
    if args.raise_after_fit:
        raise RuntimeError("failing after fit on purpose (a save that fails)")
    if args.exit_after_fit is not None:
        sys.exit(args.exit_after_fit)
    if args.raise_system_exit is not None:
        raise SystemExit(args.raise_system_exit)


if __name__ == "__main__":
    main()
