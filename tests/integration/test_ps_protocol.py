"""A real PS process refuses every malformed or unauthorised request with a clear status,
changes nothing, bounds every wait, and keeps answering valid callers."""

import json
import os
import signal
import struct
import threading
import time

import grpc
import numpy as np
import psutil
import pytest

from tfdist import constants, wire
from tfdist.config import JobConfig
from tfdist.errors import PSRejectedError, PSWaitTimeoutError
from tfdist.ps.placement import RoundRobinPlacement, VariableSpec
from tfdist.ps.protocol import SERVICE
from tfdist.ps.session import WorkerSession
from tfdist.testing import LocalCluster

SPECS = [VariableSpec("0000/w", "float32", (4, 3)), VariableSpec("0001/b", "float32", (3,))]


@pytest.fixture
def cluster():
    cfg = JobConfig.from_dict({"ps": {"startup_timeout_s": 20, "rpc_timeout_s": 3}})
    with LocalCluster(workers=2, ps=1, config=cfg) as c:
        c.start_ps()
        yield c


def _initialised(cluster):
    plan = RoundRobinPlacement().place(SPECS, 1)
    chief = WorkerSession(cluster.client(), SPECS, plan, 0, True, startup_timeout_s=20, heartbeat_interval_s=None,
                         num_workers=2)
    chief.initialize({s.key: np.ones(s.shape, np.float32) for s in SPECS})
    return chief


def _raw(cluster, method: str, payload: bytes, timeout: float = 10.0, token: bool = True):
    """Sends raw bytes to the PS (what a buggy or hostile client could send)."""
    channel = grpc.insecure_channel(cluster.config.cluster.ps[0])
    try:
        md = ((constants.AUTH_METADATA_KEY, cluster.token),) if token else ()
        return wire.decode(channel.unary_unary(f"/{SERVICE}/{method}")(payload, timeout=timeout, metadata=md))
    finally:
        channel.close()


def _header_message(header) -> bytes:
    text = header if isinstance(header, bytes) else json.dumps(header).encode()
    message = wire.MAGIC + struct.pack("<I", len(text)) + text
    return message + b"\0" * ((-len(message)) % 8)


def _status(cluster):
    with cluster.client() as c:
        return c.call(0, "Status", {})[0]


@pytest.mark.parametrize("payload", [
    _header_message({"meta": [1, 2], "tensors": []}),  # non-object meta
    _header_message({"meta": {"worker": 1}, "tensors": 5}),
    _header_message(b'{"meta":{"worker":1},"tensors":[{"name":"b","dtype":"float32","shape":[Infinity],'
                    b'"offset":0,"nbytes":4}]}'),
    _header_message({"meta": {"worker": 1}, "tensors": [{"name": "b", "dtype": "float32", "shape": [2**70],
                                                         "offset": 0, "nbytes": 4}]}),
    _header_message({"meta": {"worker": 1}, "tensors": [{"name": ["b"], "dtype": {"x": 1}, "shape": [1],
                                                         "offset": 0, "nbytes": 4}]}),
    _header_message(b"[" * 2000 + b"]" * 2000),
    _header_message({"meta": {"worker": 1, "clock": 1, "keys": ["0000/w", "nope"]}, "tensors": []}),
    wire.encode({"worker": 1, "clock": 1}, {"x" * 100_000: np.zeros(1, np.float32)}),
])
def test_malformed_requests_get_invalid_argument_or_not_found_and_change_nothing(cluster, payload):
    chief = _initialised(cluster)
    before = _status(cluster)
    with pytest.raises(grpc.RpcError) as e:
        _raw(cluster, "PushPull", payload)
    assert e.value.code() in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND), e.value.details()
    assert len(e.value.details()) < 1000  # no request is echoed back whole
    after = _status(cluster)
    assert (after["version"], after["progress"], after["live_workers"]) == \
        (before["version"], before["progress"], before["live_workers"])
    assert after["stats"]["rejected"] == before["stats"]["rejected"] + 1
    chief.close(done=False)


def test_the_issues_refusals_over_the_real_rpc(cluster):
    with cluster.client() as c:
        # a refused Init leaves the PS uninitialised
        with pytest.raises(PSRejectedError, match="num_workers"):
            c.call(0, "Init", {"worker": 0, "specs": [s.to_dict() for s in SPECS], "num_workers": 2.5},
                   {s.key: np.ones(s.shape, np.float32) for s in SPECS})
        assert c.call(0, "WaitInit", {"timeout_s": 0})[0]["initialized"] is False
        chief = _initialised(cluster)
        # a push+pull whose pull part names an unknown variable applies nothing
        with pytest.raises(PSRejectedError, match="Unknown variable"):
            c.call(0, "PushPull", {"worker": 1, "clock": 1, "keys": ["0001/b", "nope"]},
                   {"0001/b": np.ones(3, np.float32)})
        # a NaN update is refused, naming the variable and the worker
        with pytest.raises(PSRejectedError, match=r"Non-finite update.*0001/b.*worker 1"):
            c.call(0, "Push", {"worker": 1, "clock": 1}, {"0001/b": np.array([0, np.nan, 0], np.float32)})
        # a refused Control does not mark anyone done; Done from non-members does not stop the PS
        with pytest.raises(PSRejectedError, match="gone"):
            c.call(0, "Control", {"gone": [47, "x"]})
        for worker in (1000, 1001):
            with pytest.raises(PSRejectedError, match="not a worker of this job"):
                c.call(0, "Done", {"worker": worker})
        status = c.call(0, "Status", {})[0]
        assert status["done_workers"] == [] and status["version"] == 1 and status["progress"] == 0
        assert cluster.process("ps:0").running
        values = c.call(0, "Pull", {"worker": -1})[1]
        np.testing.assert_array_equal(values["0001/b"], np.ones(3, np.float32))
    chief.close(done=False)


def test_an_unauthenticated_large_request_is_refused_before_it_is_buffered():
    cfg = JobConfig.from_dict({"ps": {"startup_timeout_s": 20}})  # max_message_bytes: the 512 MiB default
    with LocalCluster(workers=1, ps=1, config=cfg) as cluster:
        cluster.start_ps()
        proc = psutil.Process(cluster.process("ps:0").pid)
        base = proc.memory_info().rss
        peak, stop = [base], threading.Event()

        def sample():
            while not stop.is_set():
                peak[0] = max(peak[0], proc.memory_info().rss)
                stop.wait(0.002)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        body = b"\0" * (256 * 1024 * 1024)
        try:
            with pytest.raises(grpc.RpcError) as e:
                _raw(cluster, "Push", body, timeout=60, token=False)
        finally:
            stop.set()
            sampler.join(5)
        assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert peak[0] - base < 64 * 1024 * 1024, f"PS grew by {(peak[0] - base) / 2**20:.0f} MiB"
        assert _status(cluster)["initialized"] is False  # still serving


def test_stuck_callers_never_starve_valid_ones_and_sigterm_still_stops_the_ps(cluster):
    """More callers than server threads wait (no client deadline) for an Init that never comes."""
    callers, outcomes = 48, []
    lock = threading.Lock()

    def stuck():
        try:
            with cluster.client() as c:  # no client deadline on the wait itself: the server bounds it
                meta, _ = c.call(0, "WaitInit", {"timeout_s": 3600.0}, timeout=60)
                outcome = "initialized" if meta["initialized"] else "not yet"
        except Exception as e:  # recorded: refused at once, or released by the server's bound
            outcome = type(e).__name__ + ":" + str(e)[:60]
        with lock:
            outcomes.append(outcome)

    threads = [threading.Thread(target=stuck) for _ in range(callers)]
    for t in threads:
        t.start()
    start = time.monotonic()
    status = _status(cluster)  # answered while the others wait
    assert time.monotonic() - start < 5 and status["initialized"] is False
    for t in threads:
        t.join(30)
    assert not any(t.is_alive() for t in threads)
    refused = [o for o in outcomes if "Too many calls are waiting" in o]
    waited = [o for o in outcomes if o == "not yet"]  # released by the server's bound (ps.rpc_timeout_s = 3)
    assert len(refused) + len(waited) == callers and refused and waited, outcomes[:5]
    # SIGTERM stops a PS that has callers waiting
    for t in (threads := [threading.Thread(target=stuck) for _ in range(4)]):
        t.start()
    time.sleep(0.5)  # let the callers reach the server (not a synchronisation: the outcome is checked below)
    os.kill(cluster.process("ps:0").pid, signal.SIGTERM)
    assert cluster.process("ps:0").wait(10) == 143  # 128 + SIGTERM: stopped, not done (the launcher restarts it)
    for t in threads:
        t.join(30)
    assert not any(t.is_alive() for t in threads)


def test_a_barrier_that_times_out_says_what_it_waited_for(cluster):
    """BSP with two workers, only one pushes: the PS answers with its own bound, not a dead-PS error."""
    from tfdist.ps.gradient_session import GradientSession

    plan = RoundRobinPlacement().place(SPECS, 1)
    chief = GradientSession(cluster.client(), SPECS, plan, 0, True, startup_timeout_s=20, heartbeat_interval_s=None,
                            policy_spec={"policy": "bsp", "replicas_to_aggregate": 2}, num_workers=2)
    chief.initialize({s.key: np.ones(s.shape, np.float32) for s in SPECS})
    with pytest.raises(PSWaitTimeoutError, match=r"waiting to complete step 0.*not yet heard.*\[1\].*healthy"):
        chief.exchange({s.key: np.ones(s.shape, np.float32) for s in SPECS})
    assert cluster.process("ps:0").running
    chief.close(done=False)
