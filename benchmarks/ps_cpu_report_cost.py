"""What a PS task's CPU report costs it: ``PushPull`` handled with and without ``server_cpu_s``.

Since 6f9a95f a ``PushPull`` reply over the stream transport carries the
CPU its connection's server thread spent (``exchange_every: auto`` counts
it). The PS then reads ``time.thread_time()`` and rebuilds the reply with
one more field before encoding it. This measures that cost where it is
paid: :meth:`tfdist.ps.server.ParameterService.handle` in one process (no
transport), ``--calls`` push-pulls of a small variable (so the report is a
large share of the call), in ``--rounds`` interleaved rounds, without the
report (``cpu=None``, as over gRPC) and with it (as over the stream).

Prints one JSON object: microseconds per call of each round, the medians,
and their difference.

Usage: ``python benchmarks/ps_cpu_report_cost.py [--calls 20000] [--rounds 3] [--size 16]``
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import numpy as np  # noqa: E402

from benchmarks import _common  # noqa: E402
from tfdist.consistency import AsyncPolicy  # noqa: E402
from tfdist.ps.placement import VariableSpec  # noqa: E402
from tfdist.ps.protocol import PushPullRequest, PushRequest  # noqa: E402
from tfdist.ps.server import ParameterService  # noqa: E402
from tfdist.ps.store import ParameterStore  # noqa: E402


def measure(calls: int, rounds: int, size: int) -> dict:
    spec = VariableSpec("w", "float32", (size,))
    service = ParameterService(ParameterStore(AsyncPolicy(), num_workers=1))
    service.call("Init", {"w": np.zeros(size, np.float32)}, worker=0, specs=[spec.to_dict()])
    incarnation = service.call("Pull", worker=0)[0]["incarnation"]
    delta = {"w": np.full(size, 1e-3, np.float32)}
    clock = 0
    per_round: dict[str, list[float]] = {"without": [], "with": []}
    for _ in range(rounds):
        for label, cpu in (("without", None), ("with", time.thread_time)):
            start = time.perf_counter()
            for _ in range(calls):
                clock += 1
                meta, tensors = PushPullRequest(PushRequest(0, clock, delta, None, 1, incarnation, {}), ("w",),
                                                None).to_wire()
                service.handle("PushPull", meta, tensors, None, lambda: False, cpu)
            per_round[label].append(round(1e6 * (time.perf_counter() - start) / calls, 2))
    medians = {k: statistics.median(v) for k, v in per_round.items()}
    return {"us_per_call": per_round, "median_us_per_call": medians,
            "added_us_per_call": round(medians["with"] - medians["without"], 2)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--calls", type=int, default=20000)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--size", type=int, default=16, help="float32 elements of the one variable")
    args = p.parse_args(argv)
    result = {"benchmark": "ps_cpu_report_cost", "command": "python " + " ".join(sys.argv),
              "git": _common.git_info(ROOT), "machine": _common.machine(),
              "calls": args.calls, "rounds": args.rounds, "size": args.size,
              **measure(args.calls, args.rounds, args.size)}
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
