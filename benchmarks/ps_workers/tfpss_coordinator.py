"""Coordinator of the TF ParameterServerStrategy baseline (tf-keras, ``TF_USE_LEGACY_KERAS=1``).

Connects to running ``tfpss_server.py`` tasks (1 PS + N workers), builds the
benchmark model under ``tf.distribute.experimental.ParameterServerStrategy``
and runs tf-keras ``fit`` on a ``DatasetCreator`` (batch 64 per worker,
``steps_per_execution=1`` by default, ``--steps-per-execution`` to change it). The coordinator dispatches steps
asynchronously and tf-keras refuses batch-level callbacks under PSS, so
throughput is timed between epoch ends instead (tf-keras joins the coordinator at every
epoch end): the first epoch is the warm-up, the following ones are timed.

Usage: tfpss_coordinator.py --cluster JSON --model mlp|cnn --out FILE --steps-per-epoch N [--timed-epochs 2]
       [--steps-per-execution K]
"""

from __future__ import annotations

import argparse
import json
import os
import sys

os.environ["TF_USE_LEGACY_KERAS"] = "1"
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from benchmarks import _common  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cluster", required=True)
    p.add_argument("--model", required=True, choices=sorted(_common.MODELS))
    p.add_argument("--out", required=True)
    p.add_argument("--steps-per-epoch", type=int, required=True)
    p.add_argument("--timed-epochs", type=int, default=2)
    p.add_argument("--steps-per-execution", type=int, default=1,
                   help="steps each dispatched function runs (tf-keras compile); must divide --steps-per-epoch")
    args = p.parse_args()
    if args.steps_per_execution < 1 or args.steps_per_epoch % args.steps_per_execution:
        p.error(f"--steps-per-execution {args.steps_per_execution} must be >= 1 and divide "
                f"--steps-per-epoch {args.steps_per_epoch}")

    import tensorflow as tf

    import tf_keras

    keras = tf.keras
    if not keras.__name__.startswith("tf_keras"):
        raise RuntimeError(f"expected tf-keras under TF_USE_LEGACY_KERAS=1, got {keras.__name__}")
    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
        tf.train.ClusterSpec(json.loads(args.cluster)), task_type="chief", task_id=0, rpc_layer="grpc"
    )
    strategy = tf.distribute.experimental.ParameterServerStrategy(resolver)
    with strategy.scope():
        model = _common.make_model(keras, args.model)
        _common.compile_model(keras, model, steps_per_execution=args.steps_per_execution)

    def dataset_fn(input_context):
        return _common.synthetic_dataset(args.model, _common.BATCH, seed=input_context.input_pipeline_id)

    timer = _common.epoch_timer_class(keras)()
    model.fit(
        keras.utils.experimental.DatasetCreator(dataset_fn),
        epochs=1 + args.timed_epochs,
        steps_per_epoch=args.steps_per_epoch,
        verbose=0,
        callbacks=[timer],
    )
    steps = args.steps_per_epoch * args.timed_epochs
    seconds = timer.epoch_times[-1] - timer.epoch_times[0]
    result = {
        "mode": "tf_pss",
        "model": args.model,
        "keras": f"tf_keras {tf_keras.__version__}",
        "num_workers": strategy.extended._num_workers if hasattr(strategy.extended, "_num_workers") else None,
        "warmup_steps": args.steps_per_epoch,
        "timed_steps": steps,
        "seconds": seconds,
        "steps_per_s": steps / seconds,
        "examples_per_s": steps * _common.BATCH / seconds,
        "batch": _common.BATCH,
        "steps_per_execution": args.steps_per_execution,
        "params": int(model.count_params()),
        "epoch_seconds": [b - a for a, b in zip(timer.epoch_times, timer.epoch_times[1:])],
    }
    _common.write_result(args.out, result)
    print(json.dumps({k: result[k] for k in ("mode", "model", "examples_per_s")}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
