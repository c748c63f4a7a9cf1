"""Coordinator of the TF ParameterServerStrategy baseline of the sparse-table benchmark (tf-keras).

Connects to running ``tfpss_server.py`` tasks (1 PS + 1 worker), builds
``Embedding(rows, dim)`` + ``GlobalAveragePooling1D`` + ``Dense(1)`` under
``tf.distribute.experimental.ParameterServerStrategy`` (the table is a PS
variable: the lookup gathers its rows there and SGD applies the sparse
gradient there) and runs tf-keras ``fit`` on a ``DatasetCreator`` of batches
of uniform random ids. tf-keras refuses batch-level callbacks under PSS, so
steps are timed between epoch ends: the first epoch is the warm-up.

Usage: tfpss_sparse_coordinator.py --cluster JSON --rows N --out FILE [--dim 32] [--batch 64] [--ids 8]
       [--steps-per-epoch 20] [--timed-epochs 1]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys

os.environ["TF_USE_LEGACY_KERAS"] = "1"
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from benchmarks import _common  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cluster", required=True)
    p.add_argument("--rows", type=int, required=True)
    p.add_argument("--dim", type=int, default=32)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--ids", type=int, default=8)
    p.add_argument("--out", required=True)
    p.add_argument("--steps-per-epoch", type=int, default=20)
    p.add_argument("--timed-epochs", type=int, default=1)
    args = p.parse_args()

    import tensorflow as tf

    import tf_keras

    keras = tf.keras
    if not keras.__name__.startswith("tf_keras"):
        raise RuntimeError(f"expected tf-keras under TF_USE_LEGACY_KERAS=1, got {keras.__name__}")
    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
        tf.train.ClusterSpec(json.loads(args.cluster)), task_type="chief", task_id=0, rpc_layer="grpc")
    strategy = tf.distribute.experimental.ParameterServerStrategy(resolver)
    with strategy.scope():
        model = keras.Sequential([keras.Input((args.ids,), dtype="int64"), keras.layers.Embedding(args.rows, args.dim),
                                  keras.layers.GlobalAveragePooling1D(), keras.layers.Dense(1, activation="sigmoid")])
        model.compile(optimizer=keras.optimizers.SGD(0.1), loss="binary_crossentropy")

    rows, batch, ids = args.rows, args.batch, args.ids

    def dataset_fn(input_context):
        def make(_):
            x = tf.random.uniform((batch, ids), 0, rows, dtype=tf.int64)
            y = tf.cast(tf.random.uniform((batch, 1), 0, 2, dtype=tf.int32), tf.float32)
            return x, y

        return tf.data.Dataset.from_tensors(0).repeat().map(make).prefetch(2)

    timer = _common.epoch_timer_class(keras)()
    model.fit(keras.utils.experimental.DatasetCreator(dataset_fn), epochs=1 + args.timed_epochs,
              steps_per_epoch=args.steps_per_epoch, verbose=0, callbacks=[timer])
    steps = args.steps_per_epoch * args.timed_epochs
    seconds = timer.epoch_times[-1] - timer.epoch_times[0]
    result = {"mode": "tf_pss", "rows": rows, "dim": args.dim, "keras": f"tf_keras {tf_keras.__version__}",
              "warmup_steps": args.steps_per_epoch, "timed_steps": steps, "seconds": seconds,
              "ms_per_step": 1e3 * seconds / steps, "steps_per_s": steps / seconds,
              "examples_per_s": steps * batch / seconds, "batch": batch,
              "coordinator_max_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
              "table_mb": rows * args.dim * 4 / 1e6}
    _common.write_result(args.out, result)
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
