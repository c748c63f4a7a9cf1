"""Coordinator of the TF ParameterServerStrategy side of the CTR throughput benchmark (tf-keras).

Connects to running ``tfpss_server.py`` tasks (``--cluster``: 2 PS + 2
workers in the benchmark) and builds ``examples/train_ctr.py``'s wide-and-deep
model with tf-keras (``TF_USE_LEGACY_KERAS=1``) under
``tf.distribute.ParameterServerStrategy`` as TF's own tutorial sets it up:
``variable_partitioner=MinSizePartitioner(min_shard_bytes=256 KiB,
max_shards=number of PS)``, so each table of at least 512 KiB is a
``ShardedVariable`` split by rows over the PS tasks, looked up there and
updated there (Adagrad's sparse apply on the PS). The 26 features share one
table per part, shifted by per-feature offsets (a ``Lambda``: the example's
``FeatureOffsets`` is a Keras 3 layer). Each worker's ``tf.data`` pipeline
holds its own examples (``make_data`` with seed ``1000 + worker index``, as
the example and the tfdist side), batched per worker, repeated. tf-keras
refuses batch-level callbacks under PSS, so steps are timed between epoch
ends: the first epoch (the same length) is the warm-up. A step is one
worker's batch; ``--steps-per-epoch`` counts the steps of all workers.

Usage: tfpss_ctr_coordinator.py --cluster JSON --scale S --out FILE [--batch 256] [--emb-dim 16]
       [--steps-per-epoch 400] [--timed-epochs 1] [--steps-per-execution 1] [--learning-rate 0.05]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time

os.environ["TF_USE_LEGACY_KERAS"] = "1"
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "examples"))

from benchmarks import _common  # noqa: E402

#: TF's ParameterServerStrategy tutorial's partitioner setting.
MIN_SHARD_BYTES = 256 << 10


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cluster", required=True)
    p.add_argument("--scale", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--emb-dim", type=int, default=16)
    p.add_argument("--examples-per-worker", type=int, default=220 * 256,
                   help="distinct examples in each worker's pipeline (repeated)")
    p.add_argument("--steps-per-epoch", type=int, default=400)
    p.add_argument("--timed-epochs", type=int, default=1)
    p.add_argument("--steps-per-execution", type=int, default=1)
    p.add_argument("--learning-rate", type=float, default=0.05)
    args = p.parse_args()

    import tensorflow as tf

    import tf_keras
    import train_ctr

    keras = tf.keras
    if not keras.__name__.startswith("tf_keras"):
        raise RuntimeError(f"expected tf-keras under TF_USE_LEGACY_KERAS=1, got {keras.__name__}")
    cluster = json.loads(args.cluster)
    num_ps, num_workers = len(cluster["ps"]), len(cluster["worker"])
    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
        tf.train.ClusterSpec(cluster), task_type="chief", task_id=0, rpc_layer="grpc")
    partitioner = tf.distribute.experimental.partitioners.MinSizePartitioner(
        min_shard_bytes=MIN_SHARD_BYTES, max_shards=num_ps)
    strategy = tf.distribute.ParameterServerStrategy(resolver, variable_partitioner=partitioner)

    def embedding(rows, dim, seed, name):
        init = keras.initializers.RandomUniform(-0.05, 0.05, seed=seed)  # Keras's "uniform", as ShardedEmbedding's
        return keras.layers.Embedding(rows, dim, embeddings_initializer=init, name=name)

    def feature_offsets(vocabs, name):
        import numpy as np

        offsets = np.concatenate([[0], np.cumsum(vocabs)[:-1]]).astype(np.int64)
        return keras.layers.Lambda(lambda ids: tf.cast(ids, tf.int64) + offsets, name=name)

    vocabs = train_ctr.vocabularies(args.scale)
    with strategy.scope():
        model = train_ctr.make_model(vocabs, args.emb_dim, "shared", keras_module=keras, embedding=embedding,
                                     feature_offsets=feature_offsets)
        model.compile(optimizer=keras.optimizers.Adagrad(args.learning_rate), loss="binary_crossentropy",
                      metrics=[keras.metrics.AUC(name="auc")], steps_per_execution=args.steps_per_execution)
    tables = {layer.name: {"shape": list(layer.embeddings.shape),
                           "shards": [list(v.shape)
                                      for v in getattr(layer.embeddings, "variables", [layer.embeddings])]}
              for layer in model.layers if isinstance(layer, keras.layers.Embedding)}

    batch, n = args.batch, args.examples_per_worker

    def dataset_fn(input_context):
        x, y, _ = train_ctr.make_data(vocabs, n, seed=1000 + input_context.input_pipeline_id)
        return tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(batch, drop_remainder=True).prefetch(2)

    class EpochWall(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.perf: list[float] = []
            self.wall: list[float] = []

        def on_epoch_end(self, epoch, logs=None):
            self.perf.append(time.perf_counter())
            self.wall.append(time.time())

    timer = EpochWall()
    t_fit = time.perf_counter()
    history = model.fit(keras.utils.experimental.DatasetCreator(dataset_fn), epochs=1 + args.timed_epochs,
                        steps_per_epoch=args.steps_per_epoch, verbose=0, callbacks=[timer])
    fit_s = time.perf_counter() - t_fit
    steps = args.steps_per_epoch * args.timed_epochs
    seconds = timer.perf[-1] - timer.perf[0]
    result = {"keras": f"tf_keras {tf_keras.__version__}", "num_workers": num_workers, "num_ps": num_ps,
              "scale": args.scale, "rows": sum(vocabs), "batch": batch,
              "steps_per_execution": args.steps_per_execution, "warmup_steps": args.steps_per_epoch,
              "timed_steps": steps, "seconds": seconds, "steps_per_s": steps / seconds,
              "examples_per_s": steps * batch / seconds, "ms_per_step_all_workers": 1e3 * seconds / steps,
              "window_wall": [timer.wall[0], timer.wall[-1]], "tables": tables,
              "loss_last": float(history.history["loss"][-1]), "fit_s": fit_s,
              "coordinator_max_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}
    _common.write_result(args.out, result)
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # The ClusterCoordinator's threads sometimes hold the interpreter's exit after fit (seen once in 16 runs on
    # 2 busy cores: 2 min+, until killed); the result is written, so leave at once.
    os._exit(code)
