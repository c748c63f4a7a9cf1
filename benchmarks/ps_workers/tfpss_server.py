"""A ``tf.distribute.Server`` task (ps or worker) for the TF ParameterServerStrategy baseline.

Inter-op threads are 2: with 1, TF's PSS hangs on its first step (DESIGN.md §1).

Usage: tfpss_server.py --cluster JSON --job ps|worker --index N
"""

from __future__ import annotations

import argparse
import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cluster", required=True, help='{"chief": [...], "worker": [...], "ps": [...]}')
    p.add_argument("--job", required=True, choices=["ps", "worker"])
    p.add_argument("--index", type=int, required=True)
    args = p.parse_args()

    import tensorflow as tf

    config = tf.compat.v1.ConfigProto(inter_op_parallelism_threads=2)
    server = tf.distribute.Server(
        tf.train.ClusterSpec(json.loads(args.cluster)),
        job_name=args.job,
        task_index=args.index,
        protocol="grpc",
        config=config,
        start=True,
    )
    print(f"{args.job}:{args.index} serving at {server.target}", flush=True)
    server.join()  # until the benchmark terminates this process
    return 0


if __name__ == "__main__":
    sys.exit(main())
