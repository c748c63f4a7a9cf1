"""What an unauthenticated request costs a tfdist server, and what ``grpc.http2.bdp_probe = 0`` costs the job.

Issue 26: a 256 MiB request without the job token cost the PS ~4 MiB, and 64
concurrent unauthenticated 16 MiB requests 55-280 MiB: the token is checked
before the body is read, but gRPC's BDP probing grows the HTTP/2 receive window
and the refused call's body is buffered up to it.

Each server (a parameter server and the shared queue, each in its own
process) is measured with each option set of :data:`VARIANTS` (gRPC's
defaults; tfdist's: ``grpc.http2.bdp_probe = 0`` and a 512 KiB window;
``bdp_probe = 0`` alone; with a 1 MiB window), set through
``tfdist.grpc_service.SERVER_OPTIONS``, in the same run:

* ``unauth_1x256MiB_bytes`` / ``unauth_64x16MiB_bytes``: growth of the server
  process's peak resident memory (``VmHWM``, reset through
  ``/proc/PID/clear_refs`` before each case) while the requests are refused;
* ``push_*_MBps``: authenticated throughput of the body path, the PS
  receiving ``Push`` requests of 16 MiB and of 256 KiB, one PS process per
  option set, in ``--repeats`` interleaved rounds; ratios of medians to
  gRPC's defaults.

Prints one JSON object. Linux only (``/proc``).

Usage: ``python benchmarks/unauth_cost.py [--repeats 5] [--pushes 20]``
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

TOKEN = "unauth-cost-benchmark-token"
MIB = 1 << 20


# ------------------------------------------------------------------ child: one server
#: Server option sets compared: gRPC's defaults; tfdist's (``tfdist.grpc_service.SERVER_OPTIONS``: BDP
#: probing off, a 512 KiB flow-control window); BDP probing off alone (the window stays at
#: ``grpc.http2.lookahead_bytes``' 64 KiB default); BDP probing off with a 1 MiB window.
VARIANTS = {
    "grpc_default": [],
    "tfdist": None,
    "bdp_probe_off": [("grpc.http2.bdp_probe", 0)],
    "bdp_probe_off_lookahead_1MiB": [("grpc.http2.bdp_probe", 0), ("grpc.http2.lookahead_bytes", MIB)],
}


def serve(kind: str, variant: str) -> None:
    from tfdist import grpc_service

    if VARIANTS[variant] is not None:
        grpc_service.SERVER_OPTIONS[:] = VARIANTS[variant]  # replaces tfdist's own choice
    if kind == "ps":
        from tfdist.consistency import AsyncPolicy
        from tfdist.ps.server import PSServer

        server = PSServer(AsyncPolicy(), token=TOKEN).start()
    else:
        from tfdist.data.queue_service import SharedQueueServer

        server = SharedQueueServer(token=TOKEN).start()
    print(json.dumps({"address": server.address, "pid": os.getpid()}), flush=True)
    sys.stdin.read()  # until the parent closes it
    server.stop(0)


# ------------------------------------------------------------------ parent: measurements
def _status(pid: int, field: str) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(field)


def _reset_peak(pid: int) -> None:
    with open(f"/proc/{pid}/clear_refs", "w") as f:
        f.write("5")  # resets VmHWM to the current RSS


def _start(kind: str, variant: str):
    proc = subprocess.Popen([sys.executable, __file__, "--serve", kind, "--variant", variant],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT,
                            env={**os.environ, "TFDIST_LOG_LEVEL": "ERROR"})
    line = proc.stdout.readline()
    if not line:
        proc.kill()
        raise RuntimeError(f"the {kind} server did not start")
    return proc, json.loads(line)


def _unauthenticated_peak(pid: int, stub, payload: bytes, concurrent: int) -> int:
    import grpc

    time.sleep(0.2)  # lets the previous case's buffers go back (not synchronisation: memory settles)
    _reset_peak(pid)
    base = _status(pid, "VmRSS")

    def call(_):
        try:
            stub(payload, timeout=60)  # no token
        except grpc.RpcError as e:
            assert e.code() == grpc.StatusCode.UNAUTHENTICATED, e
            return
        raise AssertionError("an unauthenticated call was answered")

    with ThreadPoolExecutor(concurrent) as pool:
        list(pool.map(call, range(concurrent)))
    return max(0, _status(pid, "VmHWM") - base)


def _stop(proc) -> None:
    proc.stdin.close()
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)


def measure_unauthenticated(kind: str, variant: str) -> dict:
    """Peak memory growth of a fresh server process while it refuses the unauthenticated requests."""
    import grpc

    proc, info = _start(kind, variant)
    try:
        service = "tfdist.ParameterServer" if kind == "ps" else "tfdist.data.SharedQueue"
        method = "Push" if kind == "ps" else "Enqueue"
        options = [("grpc.max_send_message_length", 512 * MIB), ("grpc.max_receive_message_length", 512 * MIB)]
        channel = grpc.insecure_channel(info["address"], options=options)
        stub = channel.unary_unary(f"/{service}/{method}")
        grpc.channel_ready_future(channel).result(timeout=60)
        out = {"server_rss_bytes": _status(info["pid"], "VmRSS")}
        out["unauth_1x256MiB_bytes"] = _unauthenticated_peak(info["pid"], stub, b"\0" * (256 * MIB), 1)
        out["unauth_64x16MiB_bytes"] = _unauthenticated_peak(info["pid"], stub, b"\0" * (16 * MIB), 64)
        channel.close()
        return out
    finally:
        _stop(proc)


def measure_authenticated(repeats: int, pushes: int) -> dict:
    """Push throughput into one PS process per variant, in interleaved rounds (the same run, the same load)."""
    from tfdist.ps.client import PSClient

    big, small = 16 * MIB, 256 * 1024
    specs = [{"key": "big", "dtype": "float32", "shape": [big // 4], "trainable": True},
             {"key": "small", "dtype": "float32", "shape": [small // 4], "trainable": True}]
    servers = {name: _start("ps", name) for name in VARIANTS}
    clients = {}
    try:
        for name, (_, info) in servers.items():
            clients[name] = PSClient([info["address"]], TOKEN, rpc_timeout_s=60, tune_malloc=False)
            clients[name].call(0, "Init", {"worker": 0, "specs": specs, "num_workers": 1},
                               {"big": np.zeros(big // 4, np.float32), "small": np.zeros(small // 4, np.float32)})
        rounds = {size: {name: [] for name in VARIANTS} for size in ("16MiB", "256KiB")}
        clock = {name: 0 for name in VARIANTS}
        for _ in range(repeats):
            for name in VARIANTS:
                for size, nbytes, key, count in (("16MiB", big, "big", pushes), ("256KiB", small, "small", pushes * 10)):
                    delta = np.full(nbytes // 4, 1e-6, np.float32)
                    t0 = time.perf_counter()
                    for _ in range(count):
                        clock[name] += 1
                        clients[name].call(0, "Push", {"worker": 0, "clock": clock[name]}, {key: delta}, timeout=60)
                    rounds[size][name].append(nbytes * count / (time.perf_counter() - t0) / 1e6)
        out: dict = {}
        for size, by_variant in rounds.items():
            base = statistics.median(by_variant["grpc_default"])
            for name, values in by_variant.items():
                out[f"push_{size}_MBps_{name}"] = [round(v, 1) for v in values]
                out[f"push_{size}_median_over_default_{name}"] = round(statistics.median(values) / base, 3)
        return out
    finally:
        for client in clients.values():
            client.close()
        for proc, _ in servers.values():
            _stop(proc)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--serve", choices=("ps", "queue"))
    p.add_argument("--variant", choices=sorted(VARIANTS), default="grpc_default")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--pushes", type=int, default=20)
    args = p.parse_args(argv)
    if args.serve:
        serve(args.serve, args.variant)
        return 0
    results: dict = {"host": platform.node(), "cpus": os.cpu_count(), "python": platform.python_version()}
    import grpc

    results["grpcio"] = grpc.__version__
    for kind in ("ps", "queue"):
        for variant in VARIANTS:
            results[f"{kind}_{variant}"] = measure_unauthenticated(kind, variant)
    results["authenticated"] = measure_authenticated(args.repeats, args.pushes)
    print(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
