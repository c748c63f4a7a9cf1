"""A command-line consumer of a shared queue, for checks, tests and benchmarks.

``python -m tfdist.data.queue_consumer --address HOST:PORT --batch-size 32``
drains epochs of a running :class:`~tfdist.data.SharedQueueServer` without
TensorFlow and prints one JSON line per event on stdout::

    {"event": "batch", "size": 32, "t": 1795295144.65, "values": [...]}   # values with --report NAME
    {"event": "epoch_end", "epoch": 0, "batches": 10, "examples": 320}
    {"event": "done", "batches": 10, "examples": 320, "seconds": 0.41}

``--delay-s`` injects a per-batch compute time (a slow worker);
``--hold-after K`` stops after K batches without acknowledging the last one
and waits to be killed (a worker dying mid-epoch). The token comes from
``TFDIST_TOKEN``.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time

from tfdist.data.shared_queue import SharedQueue

__all__ = ["main"]


def _emit(**event) -> None:
    print(json.dumps(event), flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tfdist.data.queue_consumer", description=__doc__.splitlines()[0])
    parser.add_argument("--address", required=True)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--epochs", type=int, default=1, help="dataset iterations (epochs) to run")
    parser.add_argument("--delay-s", type=float, default=0.0, help="injected compute time per batch")
    parser.add_argument("--report", help="component whose values are printed with each batch")
    parser.add_argument("--hold-after", type=int, default=None, help="stop after K batches, unacknowledged")
    parser.add_argument("--hold-timeout-s", type=float, default=120.0)
    parser.add_argument("--worker", default=None, help="name in the server's statistics")
    parser.add_argument("--heartbeat-interval-s", type=float, default=1.0)
    args = parser.parse_args(argv)

    queue = SharedQueue(args.address, worker=args.worker, heartbeat_interval_s=args.heartbeat_interval_s)
    total_batches = total_examples = 0
    start = time.perf_counter()
    report = None
    if args.report is not None:
        report = queue.element_spec().names.index(args.report)
    for _ in range(args.epochs):
        batches = examples = 0
        for arrays in queue.batch_arrays(args.batch_size):
            if args.delay_s:
                time.sleep(args.delay_s)  # injected compute time, not synchronisation
            size = len(arrays[0])
            batches += 1
            examples += size
            event = {"event": "batch", "size": size, "t": round(time.time(), 4)}
            if report is not None:
                event["values"] = arrays[report].tolist()
            _emit(**event)
            if args.hold_after is not None and batches >= args.hold_after:
                _emit(event="holding", batches=batches)
                threading.Event().wait(args.hold_timeout_s)  # until killed (bounded)
                return 3
        total_batches += batches
        total_examples += examples
        _emit(event="epoch_end", epoch=queue.last_epoch, batches=batches, examples=examples)
    _emit(
        event="done",
        worker=queue.worker,
        batches=total_batches,
        examples=total_examples,
        seconds=round(time.perf_counter() - start, 4),
    )
    queue.disconnect()
    return 0


if __name__ == "__main__":
    sys.exit(main())
