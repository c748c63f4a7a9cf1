"""A request without the job token costs a tfdist server under 1 MB, whatever its size (issue 26 item 6).

Each server (a PS task, the shared queue) runs in its own process started by
``benchmarks/unauth_cost.py --serve`` with tfdist's server options; the test
reads the growth of the process's peak resident memory (``VmHWM``, reset
through ``/proc/PID/clear_refs``) while the server refuses one 64 MiB request
and 16 concurrent 16 MiB requests. With gRPC's default options (BDP probing)
the concurrent case cost the server about 3 MB a request, up to 280 MB for 64;
``benchmarks/unauth_cost.py`` measures both and the throughput cost
(docs/benchmarks.md).
"""

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(not os.path.exists("/proc/self/clear_refs"), reason="needs Linux /proc")]

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MIB = 1 << 20
MB = 1_000_000


def _status(pid, field):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(field)


@pytest.fixture(params=["ps", "queue"])
def server(request):
    proc = subprocess.Popen([sys.executable, os.path.join(ROOT, "benchmarks", "unauth_cost.py"), "--serve",
                             request.param, "--variant", "tfdist"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True, cwd=ROOT, env={**os.environ, "TFDIST_LOG_LEVEL": "ERROR"})
    try:
        line = proc.stdout.readline()  # bounded: the process exits (EOF) if it cannot start
        assert line, "the server did not start"
        info = json.loads(line)
        info["service"] = {"ps": "tfdist.ParameterServer/Push", "queue": "tfdist.data.SharedQueue/Enqueue"}[request.param]
        yield info
    finally:
        proc.stdin.close()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def _peak_growth(pid, stub, payload, concurrent):
    with open(f"/proc/{pid}/clear_refs", "w") as f:
        f.write("5")  # VmHWM := VmRSS
    base = _status(pid, "VmRSS")

    def call(_):
        with pytest.raises(grpc.RpcError) as info:
            stub(payload, timeout=60)  # no token
        assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED

    with ThreadPoolExecutor(concurrent) as pool:
        list(pool.map(call, range(concurrent)))
    return _status(pid, "VmHWM") - base


def test_unauthenticated_requests_cost_the_server_under_1_mb_each(server):
    options = [("grpc.max_send_message_length", 512 * MIB)]
    with grpc.insecure_channel(server["address"], options=options) as channel:
        grpc.channel_ready_future(channel).result(timeout=60)
        stub = channel.unary_unary("/" + server["service"])
        one = _peak_growth(server["pid"], stub, b"\0" * (64 * MIB), 1)
        many = _peak_growth(server["pid"], stub, b"\0" * (16 * MIB), 16)
    assert one < 1 * MB, f"a refused 64 MiB request cost the server {one / MB:.2f} MB"
    assert many < 16 * MB, f"16 refused 16 MiB requests cost the server {many / MB:.2f} MB"
