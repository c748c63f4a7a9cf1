"""Raw grpcio unary echo server (bytes in, the same bytes out): the loopback ceiling.

It uses the same server options as ``tfdist.ps.PSServer`` (message limits,
thread pool, the malloc settings of ``tfdist.ps.memory``) and identity
(de)serialisers, so a call costs only what grpcio itself costs. Prints
``PORT <n>`` on stdout once it serves; stops on SIGTERM.

Usage: grpc_echo.py [--port 0]
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from concurrent import futures

import grpc

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from tfdist.ps import memory  # noqa: E402  (no TensorFlow)

SERVICE = "bench.Echo"
METHOD = f"/{SERVICE}/Echo"
MAX_MESSAGE_BYTES = 512 * 1024 * 1024
OPTIONS = [
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.so_reuseport", 0),
]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--port", type=int, default=0)
    args = p.parse_args()
    memory.tune_malloc()  # as PSServer does, so the ceiling is measured under the same settings
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=32), options=OPTIONS)
    handler = grpc.unary_unary_rpc_method_handler(lambda request, context: request)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, {"Echo": handler}),))
    port = server.add_insecure_port(f"127.0.0.1:{args.port}")
    server.start()
    stopped = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopped.set())
    signal.signal(signal.SIGINT, lambda *_: stopped.set())
    print(f"PORT {port}", flush=True)
    stopped.wait()
    server.stop(0.5)
    return 0


if __name__ == "__main__":
    sys.exit(main())
