"""One Keras 3 worker of ``benchmarks/stragglers_vs_peers.py``: trains until the driver stops the job.

Modes: ``tfdist`` (``tfdist.ParameterServerStrategy()``, its cluster and
consistency from the environment ``tfdist.testing.LocalCluster`` sets) and
``mwms`` (``tf.distribute.MultiWorkerMirroredStrategy`` with the Keras 3.15
work-arounds of ``keras_worker.py``). Every worker trains the benchmark MLP
(Adam 1e-4, batch 64 per worker) on its own stream of the teacher task
(``benchmarks/_teacher.py``). Worker 0 (never the slow one) copies its model's
weights every ``--interval`` seconds until ``--until`` (wall time) into
``--snapshots``: what a user reading the chief's model would see.

Usage: tta_worker.py --mode tfdist|mwms --snapshots DIR --until WALL [--interval S]
"""

from __future__ import annotations

import argparse
import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))
sys.path.insert(0, HERE)

from benchmarks import _common, _teacher  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mode", required=True, choices=["tfdist", "mwms"])
    p.add_argument("--snapshots", required=True)
    p.add_argument("--until", type=float, required=True, help="wall time (time.time()) of the last snapshot")
    p.add_argument("--interval", type=float, default=0.5)
    args = p.parse_args()

    import keras
    import tensorflow as tf

    batch = _common.BATCH
    if args.mode == "tfdist":
        import tfdist

        strategy = tfdist.ParameterServerStrategy()
        worker = strategy.worker_id
    else:
        from keras_worker import patch_keras_for_mwms

        patch_keras_for_mwms()
        strategy = tf.distribute.MultiWorkerMirroredStrategy()
        worker = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
        batch = _common.BATCH * strategy.num_replicas_in_sync  # the global batch: 64 per worker
    with strategy.scope():
        model = _common.make_model(keras, "mlp")
        _teacher.compile_model(keras, model)
    # Under MWMS each worker's own stream (sharding off) makes the global batch; 64 of it per worker.
    ds = _teacher.dataset(worker, batch)
    if worker == 0:
        _teacher.Snapshots(model.get_weights, args.snapshots, args.interval, args.until).start()
    # Trains until the driver ends the job (after worker 0's last snapshot).
    model.fit(ds, epochs=1_000_000, steps_per_epoch=100, verbose=0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
