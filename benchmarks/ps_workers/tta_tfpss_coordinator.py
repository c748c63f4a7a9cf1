"""Coordinator of TF's ParameterServerStrategy (tf-keras) in ``benchmarks/stragglers_vs_peers.py``.

Connects to running ``tfpss_server.py`` tasks (PS + workers), builds the
benchmark MLP under ``tf.distribute.experimental.ParameterServerStrategy``
(Adam 1e-4, batch 64 per worker, ``--steps-per-execution``) and trains with
tf-keras ``fit`` on a ``DatasetCreator`` whose every worker reads its own
stream of the teacher task (``input_pipeline_id`` is the worker's index),
until the driver stops the job. A thread copies the model's weights (read from
the PS) every ``--interval`` seconds until ``--until`` into ``--snapshots``.

Usage: tta_tfpss_coordinator.py --cluster JSON --snapshots DIR --until WALL [--interval S]
       [--steps-per-execution N]
"""

from __future__ import annotations

import argparse
import json
import os
import sys

os.environ["TF_USE_LEGACY_KERAS"] = "1"
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from benchmarks import _common, _teacher  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cluster", required=True)
    p.add_argument("--snapshots", required=True)
    p.add_argument("--until", type=float, required=True)
    p.add_argument("--interval", type=float, default=0.5)
    p.add_argument("--steps-per-execution", type=int, default=1)
    args = p.parse_args()

    import tensorflow as tf

    keras = tf.keras
    if not keras.__name__.startswith("tf_keras"):
        raise RuntimeError(f"expected tf-keras under TF_USE_LEGACY_KERAS=1, got {keras.__name__}")
    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
        tf.train.ClusterSpec(json.loads(args.cluster)), task_type="chief", task_id=0, rpc_layer="grpc")
    strategy = tf.distribute.experimental.ParameterServerStrategy(resolver)
    with strategy.scope():
        model = _common.make_model(keras, "mlp")
        _teacher.compile_model(keras, model, steps_per_execution=args.steps_per_execution)

    def dataset_fn(input_context):
        return _teacher.dataset(input_context.input_pipeline_id, _common.BATCH)

    _teacher.Snapshots(model.get_weights, args.snapshots, args.interval, args.until).start()
    # Trains until the driver ends the job (after the last snapshot).
    model.fit(keras.utils.experimental.DatasetCreator(dataset_fn), epochs=1_000_000,
              steps_per_epoch=100 * args.steps_per_execution, verbose=0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
