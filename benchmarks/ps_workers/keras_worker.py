"""One Keras 3 training process of the PS benchmark; writes its throughput as JSON.

Modes:

* ``plain``  — single-process Keras 3 ``fit``, no strategy.
* ``tfdist`` — ``tfdist.ParameterServerStrategy()`` (cluster from TF_CONFIG /
  TFDIST_CONFIG, as set by ``tfdist.testing.LocalCluster``).
* ``mwms``   — ``tf.distribute.MultiWorkerMirroredStrategy`` (TF_CONFIG with a
  ``worker`` job), with the two Keras 3.15 monkey-patches of DESIGN.md §1
  applied *here only*: build from the first local replica's batch, and reduce
  scalars with ``axis=None``.
* ``allreduce`` — ``tfdist.AllReduceStrategy()`` (TF_CONFIG with a ``worker``
  job; the collective group is joined before any TF op), no straggler detector.

Every mode trains the same model on the same synthetic data with batch 64
per worker for ``warmup + steps`` steps in one epoch and reports examples/s
over the ``steps`` after the warm-up, timed at batch ends.

With ``--net-iface eth0`` (benchmarks/multihost.py, one worker per network
namespace) the worker also reads that interface's byte counters
(``/sys/class/net/IFACE/statistics/{tx,rx}_bytes``) at the two batch ends that
bound the timed window, so the bytes of the timed steps are counted the same
way for every strategy.

With ``--start-barrier DIR --num-workers N`` every worker waits at the end of
its first step until all N have finished theirs, so that the workers' timed
windows overlap even when one took longer to start (asynchronous PS training
does not line them up by itself).

Usage: keras_worker.py --mode plain|tfdist|tfdist_single|onedevice|mwms|allreduce --model mlp|cnn --out FILE [--warmup N]
       [--steps N] [--net-iface IFACE] [--start-barrier DIR --num-workers N]
"""

from __future__ import annotations

import argparse
import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from benchmarks import _common  # noqa: E402


def patch_keras_for_mwms() -> None:
    """The two Keras 3.15 work-arounds for MWMS fit (keras-team/keras#20585, tensorflow#72388)."""
    import tensorflow as tf
    from keras.src import tree
    from keras.src.backend.tensorflow import trainer as tf_trainer

    def _maybe_symbolic_build(self, iterator=None, data_batch=None):
        if self._distribute_strategy is None:
            return
        if iterator is not None:
            for _, _, it in iterator:
                batch = next(it)
                if all(isinstance(x, tf.distribute.DistributedValues) for x in tree.flatten(batch)):
                    # Build from the first local replica's batch instead of reducing a PerReplica.
                    batch = tree.map_structure(lambda x: self.distribute_strategy.experimental_local_results(x)[0], batch)
                data_batch = batch
                break
        with self.distribute_strategy.scope():
            self._symbolic_build(data_batch=data_batch)

    original_reduce = tf_trainer.reduce_per_replica

    def reduce_per_replica(values, strategy, reduction):
        if reduction in ("auto", "mean") and tf_trainer._collective_all_reduce_multi_worker(strategy):

            def _reduce(v):
                if not tf_trainer._is_per_replica_instance(v):
                    return v
                rank = strategy.experimental_local_results(v)[0].shape.rank
                return strategy.reduce("MEAN", v, axis=None if rank == 0 else 0)

            return tree.map_structure(_reduce, values)
        return original_reduce(values, strategy, reduction)

    tf_trainer.TensorFlowTrainer._maybe_symbolic_build = _maybe_symbolic_build
    tf_trainer.reduce_per_replica = reduce_per_replica


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mode", required=True, choices=["plain", "tfdist", "tfdist_single", "onedevice", "mwms", "allreduce"])
    p.add_argument("--model", required=True, choices=sorted(_common.MODELS))
    p.add_argument("--out", required=True, help="result JSON file (for tfdist: a directory)")
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--net-iface", help="also count this interface's bytes over the timed window (e.g. eth0)")
    p.add_argument("--start-barrier", help="directory of a file barrier at the end of the first step")
    p.add_argument("--num-workers", type=int, default=1, help="workers that meet at --start-barrier")
    args = p.parse_args()

    if args.mode == "allreduce":
        import tfdist.collective

        tfdist.collective.init_worker_group()  # before any TF op (cluster from TF_CONFIG)

    import keras
    import tensorflow as tf

    result = {"mode": args.mode, "model": args.model, "pid": os.getpid()}
    batch = _common.BATCH
    if args.mode == "plain":
        strategy = None
        worker_id = 0
    elif args.mode in ("tfdist", "tfdist_single"):
        import tfdist

        if args.mode == "tfdist_single":  # no cluster: one process, an in-process PS
            os.environ.pop("TF_CONFIG", None)
            os.environ.pop("TFDIST_CONFIG", None)
        strategy = tfdist.ParameterServerStrategy()
        worker_id = strategy.worker_id
    elif args.mode == "onedevice":  # TF's own single-device strategy: the floor of any tf.distribute strategy
        strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
        worker_id = 0
    elif args.mode == "allreduce":
        import tfdist

        strategy = tfdist.AllReduceStrategy()
        worker_id = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
    else:
        patch_keras_for_mwms()
        strategy = tf.distribute.MultiWorkerMirroredStrategy()
        worker_id = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
        batch = _common.BATCH * strategy.num_replicas_in_sync  # global batch; 64 per worker
    result["worker_id"] = worker_id

    def build():
        model = _common.make_model(keras, args.model)
        _common.compile_model(keras, model)
        return model

    if strategy is None:
        model = build()
    else:
        with strategy.scope():
            model = build()
    ds = _common.synthetic_dataset(args.model, batch, seed=worker_id)
    timer = _common.step_timer_class(keras)()
    callbacks = [timer]
    if args.start_barrier:
        callbacks.insert(0, _common.start_barrier_class(keras)(args.start_barrier, worker_id, args.num_workers))
    if args.net_iface:
        counter = _common.net_counter_class(keras)(args.net_iface, (args.warmup - 1, args.warmup + args.steps - 1))
        callbacks.append(counter)
    model.fit(ds, epochs=1, steps_per_epoch=args.warmup + args.steps, verbose=0, callbacks=callbacks)
    result.update(_common.timed_window(timer.times, args.warmup, args.steps, _common.BATCH))
    # Wall-clock stamps of the timed window, to check how the workers' windows overlap.
    result["wall_window"] = [timer.wall[args.warmup - 1], timer.wall[args.warmup + args.steps - 1]]
    # Every batch end of the timed window (and the one before it): the examples all workers finished
    # inside the window in which every one of them trains (benchmarks/ps_throughput.py's aggregate).
    result["batch_end_wall"] = timer.wall[args.warmup - 1:args.warmup + args.steps]
    # CPU time of this process (all threads) per timed step: on a machine with few cores the
    # exchange competes with the computation for them.
    result["cpu_ms_per_step"] = 1e3 * (timer.cpu[args.warmup + args.steps - 1] - timer.cpu[args.warmup - 1]) / args.steps
    result["params"] = int(model.count_params())
    if args.net_iface:
        (tx0, rx0), (tx1, rx1) = (counter.counts[b] for b in counter.batches)
        result["net"] = {"iface": args.net_iface, "tx_bytes": tx1 - tx0, "rx_bytes": rx1 - rx0,
                         "bytes_per_step": (tx1 - tx0 + rx1 - rx0) / args.steps}
    if args.mode == "tfdist_single":
        out = args.out
    elif args.mode == "tfdist":
        stats = strategy.sync_stats
        result["sync_stats"] = stats
        result["sync_ms_per_step"] = 1e3 * stats["sync_seconds"] / max(stats["syncs"], 1)
        result["placement"] = [[k, ps, rows] for k, ps, rows in strategy.placement_table()]
        result["steps_per_exchange"] = strategy._runtime.exchange_every  # exchange_every: auto's choice at the end
        out = os.path.join(args.out, f"worker-{worker_id}.json")
    elif args.mode in ("mwms", "allreduce"):
        out = os.path.join(args.out, f"worker-{worker_id}.json")
    else:
        out = args.out
    _common.write_result(out, result)
    print(json.dumps({k: result[k] for k in ("mode", "model", "worker_id", "examples_per_s")}), flush=True)
    if args.mode in ("tfdist", "tfdist_single"):
        strategy.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
