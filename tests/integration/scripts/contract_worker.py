"""Worker script of the tf.distribute contract test (issue #25): what a tutorial's script asks of its strategy.

Usage: contract_worker.py --strategy mwms|all_reduce|bsp|async --out DIR

Runs in each worker process of a ``LocalCluster``. For ``mwms`` the strategy
is TF's ``MultiWorkerMirroredStrategy`` (the reference); the tfdist strategies
get the same probes. Writes ``<out>/<strategy>-worker-<i>.json``: the values
of ``strategy.reduce`` (SUM/MEAN, eager and in ``tf.function``, with and
without ``axis``), ``replica_id_in_sync_group``, ``num_replicas_in_sync``,
the cluster resolver's answers, ``should_checkpoint``, ``strategy.run`` of a
function returning ``None`` and a nested structure, and (tfdist only) a
barrier and a model built after the first training step.
"""

import argparse
import json
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def make_strategy(name):
    import tensorflow as tf

    import tfdist

    if name == "mwms":
        return tf.distribute.MultiWorkerMirroredStrategy()
    if name == "all_reduce":
        return tfdist.AllReduceStrategy()
    return {"bsp": tfdist.BSPStrategy, "async": tfdist.ParameterServerStrategy}[name]()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--strategy", required=True)
    p.add_argument("--out", required=True)
    args = p.parse_args()
    strategy = make_strategy(args.strategy)  # before any TF op (collectives)
    import keras
    import numpy as np
    import tensorflow as tf

    r = {}
    resolver = strategy.cluster_resolver
    me = resolver.task_id
    r["resolver"] = {"task_type": resolver.task_type, "task_id": resolver.task_id,
                     "workers": len(resolver.cluster_spec().as_dict().get("worker", []))}
    r["num_replicas_in_sync"] = int(strategy.num_replicas_in_sync)
    r["should_checkpoint"] = bool(strategy.extended.should_checkpoint)
    r["should_save_summary"] = bool(strategy.extended.should_save_summary)

    def replica_value():
        ctx = tf.distribute.get_replica_context()
        return tf.cast(ctx.replica_id_in_sync_group, tf.float32) + 1.0

    def ids():
        return tf.distribute.get_replica_context().replica_id_in_sync_group

    local = lambda v: [float(x) for x in strategy.experimental_local_results(v)]  # noqa: E731
    r["replica_id"] = [int(x) for x in strategy.experimental_local_results(strategy.run(ids))]
    per_replica = strategy.run(replica_value)
    r["eager"] = {"sum": float(strategy.reduce("SUM", per_replica, axis=None)),
                  "mean": float(strategy.reduce("MEAN", per_replica, axis=None)), "local": local(per_replica)}

    @tf.function
    def in_graph():
        v = strategy.run(replica_value)
        return strategy.reduce(tf.distribute.ReduceOp.SUM, v, axis=None), strategy.reduce("MEAN", v, axis=None)

    total, mean = in_graph()
    r["graph"] = {"sum": float(total), "mean": float(mean)}

    def batch_value():  # a per-example value: 2 examples on worker 0, 3 elsewhere (axis=0, MEAN's denominator)
        rid = tf.distribute.get_replica_context().replica_id_in_sync_group
        n = tf.where(rid == 0, 2, 3)
        return tf.fill([n], tf.cast(rid, tf.float32) + 1.0)

    per_example = strategy.run(batch_value)
    r["axis0"] = {"sum": float(strategy.reduce("SUM", per_example, axis=0)),
                  "mean": float(strategy.reduce("MEAN", per_example, axis=0))}

    @tf.function
    def returns_none():
        strategy.run(lambda: None)
        nested = strategy.run(lambda: {"a": tf.constant(1.0), "b": (tf.constant([2.0, 3.0]), tf.constant(4))})
        return tf.nest.map_structure(lambda v: strategy.experimental_local_results(v)[0], nested)

    nested = returns_none()
    r["run_none_ok"] = True
    r["nested"] = {"a": float(nested["a"]), "b0": [float(x) for x in nested["b"][0]], "b1": int(nested["b"][1])}
    r["none_eager"] = strategy.run(lambda: None) is None

    def elements(ds):
        return [[int(v) for v in strategy.experimental_local_results(b)[0].numpy()]
                for b in strategy.experimental_distribute_dataset(ds)]

    data = tf.data.Dataset.range(8).batch(4)  # a global batch of 4
    r["dataset_default"] = elements(data)
    for policy in ("DATA", "OFF"):
        options = tf.data.Options()
        options.experimental_distribute.auto_shard_policy = getattr(tf.data.experimental.AutoShardPolicy, policy)
        r[f"dataset_{policy}"] = elements(data.with_options(options))

    if args.strategy != "mwms":
        r["is_chief"] = bool(strategy.is_chief)
        strategy.barrier("probes-done")
        r["barrier"] = True
        # A model trained, then a second model built after the job's first step (a new seed per worker):
        # its weights start from worker 0's before its own first step.
        x = np.random.default_rng(0).normal(size=(32, 4)).astype("float32")
        y = (x.sum(axis=1) > 0).astype("int32")
        for i in range(2):
            keras.utils.set_random_seed(100 + 10 * i + me)  # different initial weights on every worker
            with strategy.scope():
                model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, name=f"late_{i}")])
                model.compile(keras.optimizers.SGD(0.1), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
            model.fit(x, y, batch_size=8, epochs=1, verbose=0, shuffle=False)
            r[f"model_{i}_kernel"] = [float(v) for v in np.ravel(model.get_weights()[0])]

    with open(os.path.join(args.out, f"{args.strategy}-worker-{me}.json"), "w") as f:
        json.dump(r, f)


if __name__ == "__main__":
    main()
