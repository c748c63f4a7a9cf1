"""The data plane's lean transport (tfdist.stream_service) between a real PS server and client, over TCP.

A PS task serves its data-plane methods (pulls, pushes, row lookups) on a
second port it announces in ``Status``; a worker's client learns it, keeps
connections, learns it again when the task restarts elsewhere, and falls
back to gRPC where the port cannot be reached. The stream keeps gRPC's
guarantees: a token before any body, sizes before memory, the same errors,
and a refused request changes nothing (property-based below).
"""

import socket
import struct
import time

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tfdist import wire
from tfdist.errors import AuthError, PSRejectedError, PSUnavailableError
from tfdist.ps.client import PSClient
from tfdist.ps.placement import RoundRobinPlacement, VariableSpec
from tfdist.ps.protocol import STREAM_METHODS, PushPullRequest, PushRequest, StatusRequest
from tfdist.ps.server import PSServer
from tfdist.ps.session import WorkerSession
from tfdist.stream_service import StreamService

TOKEN = "stream-token-0123"
SPECS = [VariableSpec("0000/w", "float32", (64, 32)), VariableSpec("0001/b", "float32", (32,))]


def _values(seed=0):
    rng = np.random.default_rng(seed)
    return {s.key: rng.standard_normal(s.shape).astype("float32") for s in SPECS}


def _session(client, worker=0, chief=True):
    plan = RoundRobinPlacement().place(SPECS, client.num_ps)
    return WorkerSession(client, SPECS, plan, worker, chief, startup_timeout_s=10.0, heartbeat_interval_s=None,
                         num_workers=1)


@pytest.fixture
def server():
    srv = PSServer(None, token=TOKEN, num_workers=1, max_message_bytes=1 << 20).start()
    yield srv
    srv.stop(0)


def _grpc_state(srv):
    """The task's values and version, read over gRPC only."""
    with PSClient([srv.address], TOKEN, stream=False) as c:
        meta, tensors = c.call(0, "Pull", {"worker": -1})
    return meta["version"], {k: v.copy() for k, v in tensors.items()}


def _assert_same(a, b):
    assert a[0] == b[0]
    assert a[1].keys() == b[1].keys()
    for k in a[1]:
        np.testing.assert_array_equal(a[1][k], b[1][k])


def _hello(port, token=TOKEN):
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    secret = token.encode()
    sock.sendall(struct.pack("<4sBH", b"TFDH", 1, len(secret)) + secret)
    magic, status, length = struct.unpack("<4sBI", _recv(sock, 9))
    assert magic == b"TFDA"
    return sock, status, _recv(sock, length).decode()


def _recv(sock, n):
    """Up to ``n`` bytes; fewer when the server closed the connection (a reset counts as closed)."""
    out = b""
    while len(out) < n:
        try:
            chunk = sock.recv(n - len(out))
        except ConnectionResetError:
            break
        if not chunk:
            break
        out += chunk
    return out


def test_the_data_plane_travels_over_the_stream_and_trains_as_grpc_does(server):
    """A session's init, push-pull and pull: the data calls use the stream (connections kept), values alike."""
    assert server.service.stream_port and set(STREAM_METHODS) <= set(server._stream._handlers)
    with PSClient([server.address], TOKEN) as client:
        assert client.request(0, StatusRequest(brief=True)).fields["stream_port"] == server.service.stream_port
        session = _session(client)
        values = _values()
        assert session.initialize(values) is None
        initial_version = _grpc_state(server)[0]
        current = {k: v + 1.0 for k, v in values.items()}
        fresh = session.sync(current)
        assert client._routes[0].port == server.service.stream_port and client._routes[0].idle  # kept for reuse
        for k in values:
            np.testing.assert_allclose(fresh[k], current[k])
        version, stored = _grpc_state(server)  # what the stream pushed is what gRPC reads
        for k in values:
            np.testing.assert_allclose(stored[k], current[k])
        assert version == initial_version + 1


def test_transport_grpc_offers_and_uses_no_stream():
    srv = PSServer(None, token=TOKEN, num_workers=1, stream=False).start()
    try:
        with PSClient([srv.address], TOKEN) as client:
            assert client.request(0, StatusRequest(brief=True)).fields["stream_port"] is None
            session = _session(client)
            session.initialize(_values())
            session.sync({k: v * 2 for k, v in _values().items()})
            assert client._routes[0].port is None and not client._routes[0].idle
    finally:
        srv.stop(0)


def test_a_wrong_or_missing_token_is_refused_at_the_hello_and_changes_nothing(server):
    with PSClient([server.address], TOKEN) as good:
        _session(good).initialize(_values())
    before = _grpc_state(server)
    for token in ("wrong-token-000000", ""):
        sock, status, message = _hello(server.service.stream_port, token)
        assert status != 0 and "token" in message
        try:  # the server closed the connection: a request after the refusal is never read
            sock.sendall(struct.pack("<4sHdQ", b"TFDQ", 4, 0.0, 8) + b"Push" + b"\0" * 8)
            assert _recv(sock, 1) == b""
        except (ConnectionResetError, BrokenPipeError):
            pass
        sock.close()
    # A client with the wrong token: its data calls are refused alike (the hello), as over gRPC.
    with PSClient([server.address], "wrong-token-000000") as bad:
        bad._routes[0].port = server.service.stream_port  # (its Status over gRPC would be refused first)
        with pytest.raises(AuthError, match="token"):
            bad.call(0, "Push", {"worker": 0, "clock": 1}, {"0000/w": np.ones((64, 32), np.float32)})
    _assert_same(before, _grpc_state(server))


def test_an_oversize_request_is_refused_before_its_body_and_the_server_goes_on(server):
    with PSClient([server.address], TOKEN) as client:
        _session(client).initialize(_values())
        before = _grpc_state(server)
        with pytest.raises(PSRejectedError, match="larger than max"):
            client.call(0, "Push", {"worker": 0, "clock": 1}, {"0000/w": np.zeros((512, 1024), np.float32)})
        _assert_same(before, _grpc_state(server))
        meta, _ = client.call(0, "Pull", {"worker": -1})  # a new connection, served
        assert meta["version"] == before[0]


def test_a_silent_connection_is_closed_after_the_hello_timeout():
    service = StreamService({}, what="test", token=TOKEN, how_to_fix_token="x", max_message_bytes=1024,
                            hello_timeout_s=0.3)
    service.start()
    try:
        sock = socket.create_connection(("127.0.0.1", service.port), timeout=5)
        start = time.monotonic()
        assert _recv(sock, 1) == b""  # closed by the server, without a word from us
        assert time.monotonic() - start < 4
        sock.close()
    finally:
        service.stop(0)


def test_connections_beyond_the_limit_are_closed():
    service = StreamService({}, what="test", token=None, how_to_fix_token="x", max_message_bytes=1024,
                            max_connections=2)
    service.start()
    try:
        held = [_hello(service.port, "")[0] for _ in range(2)]
        extra = socket.create_connection(("127.0.0.1", service.port), timeout=5)
        assert _recv(extra, 1) == b""
        for sock in (*held, extra):
            sock.close()
    finally:
        service.stop(0)


def test_a_restarted_task_is_found_on_its_new_stream_port(server):
    """The task restarts (same gRPC port, a new stream port): the kept connections, which the old task closed,
    are never used again; the next call learns the new port and reaches the new task."""
    port = server.port
    with PSClient([server.address], TOKEN) as client:
        _session(client).initialize(_values())
        client.call(0, "Pull", {"worker": -1})
        old_stream, kept = client._routes[0].port, list(client._routes[0].idle)
        assert kept
        server.stop(0)
        again = PSServer(None, token=TOKEN, num_workers=1, port=port).start()
        try:
            assert again.service.stream_port != old_stream
            with PSClient([again.address], TOKEN) as chief:
                _session(chief).initialize(_values(1))
            meta, tensors = client.call(0, "Pull", {"worker": -1})
            assert all(conn.closed for conn in kept)
            assert client._routes[0].port == again.service.stream_port
            np.testing.assert_array_equal(tensors["0000/w"], _values(1)["0000/w"])
        finally:
            again.stop(0)


def test_a_task_that_stops_fails_the_next_call_as_lost(server):
    """Its kept connection closed and its ports closed: the call fails as a lost task (the worker recovers)."""
    with PSClient([server.address], TOKEN) as client:
        _session(client).initialize(_values())
        client.call(0, "Pull", {"worker": -1})
        server.stop(0)
        with pytest.raises(PSUnavailableError):
            client.call(0, "Pull", {"worker": -1})


def test_a_stream_port_that_cannot_be_reached_falls_back_to_grpc(server, caplog):
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        closed_port = unused.getsockname()[1]
    server.service.stream_port = closed_port  # announced, but nothing listens there
    with PSClient([server.address], TOKEN) as client:
        session = _session(client)
        session.initialize(_values())
        fresh = session.sync({k: v + 2 for k, v in _values().items()})
        np.testing.assert_allclose(fresh["0001/b"], _values()["0001/b"] + 2)
        assert client._routes[0].port is None and "cannot be reached" in caplog.text


_METAS = st.dictionaries(st.sampled_from(["worker", "clock", "steps", "loss", "incarnation", "key", "x"]),
                         st.one_of(st.integers(-3, 3), st.none(), st.text(max_size=3)), max_size=5)


def _framed(method, meta, rows):
    body = wire.encode(meta, {"0000/w": np.ones((rows, 32), np.float32)})
    return struct.pack("<4sHdQ", b"TFDQ", len(method), 5.0, len(body)) + method.encode() + body


_FRAME_PARTS = st.one_of(
    st.binary(max_size=64),
    st.builds(lambda m, t, n: struct.pack("<4sHdQ", b"TFDQ", len(m), t, n) + m,
              st.sampled_from([b"Push", b"PushPull", b"Pull", b"Nope", b"", b"Init"]),
              st.floats(allow_nan=True, allow_infinity=True), st.integers(0, 1 << 40)),
    st.builds(lambda meta: wire.encode(meta, {"0000/w": np.ones((64, 32), np.float32)}), _METAS),
    st.builds(_framed, st.sampled_from(["Push", "PushPull", "PushRows", "Lookup"]), _METAS,
              st.sampled_from([1, 63, 65])),  # well framed, always refused: no shape fits the variable
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(parts=st.lists(_FRAME_PARTS, min_size=1, max_size=4))
def test_any_bytes_after_a_valid_hello_change_nothing_and_the_server_goes_on(server, send_and_drain, parts):
    """Whatever an authenticated caller sends (frames, garbage, lies about lengths), the task's values and
    version stay, and it serves the next client."""
    with PSClient([server.address], TOKEN, stream=False) as c:
        if not c.call(0, "Status", {"brief": True})[0]["initialized"]:
            _session(c).initialize(_values())
    before = _grpc_state(server)
    sock, status, _ = _hello(server.service.stream_port)
    assert status == 0
    sock.settimeout(2.0)
    try:
        send_and_drain(sock, parts)
    finally:
        sock.close()
    _assert_same(before, _grpc_state(server))
    with PSClient([server.address], TOKEN) as client:
        assert client.call(0, "Pull", {"worker": -1})[0]["version"] == before[0]


def _declare_512_mib_send_1_kib_and_close(service, sock):
    """Sends a request declaring 512 MiB with 1 KiB of body and closes (a truncated message); once the server
    dropped the connection (bounded wait), the traced peak must be far below the declared size."""
    import tracemalloc

    sock.sendall(struct.pack("<4sHdQ", b"TFDQ", 4, 5.0, 512 << 20) + b"Push" + b"x" * 1024)
    sock.close()
    deadline = time.monotonic() + 10
    while service._connections and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not service._connections
    _, peak = tracemalloc.get_traced_memory()
    assert peak < 64 << 20, peak


def test_a_declared_size_costs_only_the_bytes_that_arrive():
    """A request that declares 512 MiB and sends 1 KiB makes the server hold about what arrived, not 512 MiB."""
    import tracemalloc

    service = StreamService({"Push": lambda meta, tensors, context: ({}, {})}, what="test", token=None,
                            how_to_fix_token="x", max_message_bytes=1 << 30)
    service.start()
    tracemalloc.start()
    try:
        sock, status, _ = _hello(service.port, "")
        assert status == 0
        _declare_512_mib_send_1_kib_and_close(service, sock)
    finally:
        tracemalloc.stop()
        service.stop(0)


def test_a_fixed_stream_port_is_served_announced_kept_across_a_restart_and_refused_when_taken():
    """``ps.stream_port``: every task serves that port (for a firewall that opens it). A task restarted at once
    binds it again while the old connections linger (SO_REUSEADDR); the client's connections to the old task
    are never reused. A second task on the same host cannot bind it: a ConfigError that says what to do,
    and the failed task leaves its gRPC port free."""
    from tfdist.cluster.local import free_port
    from tfdist.errors import ConfigError

    stream_port = free_port()
    srv = PSServer(None, token=TOKEN, num_workers=1, stream_port=stream_port).start()
    try:
        assert srv.service.stream_port == stream_port
        with PSClient([srv.address], TOKEN) as client:
            _session(client).initialize(_values())
            client.call(0, "Pull", {"worker": -1})
            assert client._routes[0].port == stream_port
            kept = list(client._routes[0].idle)
            grpc_port = free_port()
            with pytest.raises(ConfigError, match=r"port \d+ \(ps\.stream_port\).*null for a free port"):
                PSServer(None, token=TOKEN, num_workers=1, port=grpc_port, stream_port=stream_port)
            with socket.socket() as probe:  # the refused task's gRPC port was let go
                probe.bind(("127.0.0.1", grpc_port))
            port = srv.port
            srv.stop(0)
            srv = PSServer(None, token=TOKEN, num_workers=1, port=port, stream_port=stream_port).start()
            assert srv.service.stream_port == stream_port
            with PSClient([srv.address], TOKEN) as chief:
                _session(chief).initialize(_values(2))
            meta, tensors = client.call(0, "Pull", {"worker": -1})
            assert all(conn.closed for conn in kept)
            np.testing.assert_array_equal(tensors["0000/w"], _values(2)["0000/w"])
    finally:
        srv.stop(0)


def _two_task_session(client, worker=0):
    plan = RoundRobinPlacement().place(SPECS, 2)
    assert {plan.shards_of(s.key)[0].ps for s in SPECS} == {0, 1}  # a variable on each task
    return WorkerSession(client, SPECS, plan, worker, worker == 0, startup_timeout_s=10.0, heartbeat_interval_s=None,
                         num_workers=1)


def test_one_thread_calls_several_tasks_over_the_stream_and_over_grpc_where_a_task_offers_none():
    """A call to several tasks sends every request and reads every reply from one thread (no call threads;
    tests/unit/test_stream_call_many.py: each socket as it allows); a task without a stream port is called
    over gRPC after them. The values are those of one call per task."""
    a = PSServer(None, token=TOKEN, num_workers=1).start()
    b = PSServer(None, token=TOKEN, num_workers=1, stream=False).start()
    try:
        with PSClient([a.address, b.address], TOKEN) as client:
            session = _two_task_session(client)
            values = _values()
            session.initialize(values)  # (Init travels over gRPC, on the client's threads)
            on_threads, call_on_pool = [], client._call_on_pool
            client._call_on_pool = lambda *a: on_threads.append(a[:2]) or call_on_pool(*a)
            for step in range(1, 4):
                fresh = session.sync({k: v + step for k, v in values.items()})
                for k in values:
                    np.testing.assert_allclose(fresh[k], values[k] + step)
            assert on_threads == []  # every PushPull ran in this thread
            assert client._routes[0].port == a.service.stream_port and client._routes[0].idle
            assert client._routes[1].port is None and not client._routes[1].idle
            for srv, key in ((a, "0000/w"), (b, "0001/b")):
                np.testing.assert_allclose(_grpc_state(srv)[1][key], values[key] + 3)
    finally:
        a.stop(0)
        b.stop(0)


def test_a_task_lost_during_a_call_to_several_fails_the_call_as_lost_and_the_others_stay_usable():
    a = PSServer(None, token=TOKEN, num_workers=1).start()
    b = PSServer(None, token=TOKEN, num_workers=1).start()
    try:
        with PSClient([a.address, b.address], TOKEN) as client:
            session = _two_task_session(client)
            session.initialize(_values())
            session.sync({k: v + 1 for k, v in _values().items()})
            b.stop(0)
            with pytest.raises(PSUnavailableError):
                client.call_many("Pull", {0: ({"worker": -1}, {}), 1: ({"worker": -1}, {})})
            meta, tensors = client.call(0, "Pull", {"worker": -1})  # task 0's stream still serves
            np.testing.assert_allclose(tensors["0000/w"], _values()["0000/w"] + 1)
    finally:
        a.stop(0)
        b.stop(0)


def test_messages_of_mixed_sizes_on_one_connection_arrive_whole_both_ways():
    """A connection allocates a message whole once it carried one as large (both ends; see _recv_exact):
    larger, equal and smaller messages after it still arrive exact, in both directions, and over call_many."""
    from tfdist.stream_service import StreamConnection, call_many

    def echo(meta, tensors, context):
        return {"n": int(meta["n"])}, {"x": np.full(int(meta["n"]), 7, dtype=np.uint8)}

    service = StreamService({"Push": echo}, what="test", token=None, how_to_fix_token="x", max_message_bytes=1 << 26)
    service.start()
    try:
        # (over the socket: through shared memory, test_stream_shared_memory.py)
        conn = StreamConnection("127.0.0.1", service.port, None, 5.0, 1 << 26, shared_memory=False)
        for n in (6 << 20, 6 << 20, 1000, 9 << 20, 0, 5 << 20):
            body = conn.call("Push", wire.encode_chunks({"n": n}, {"x": np.ones(n, dtype=np.uint8)}), 10.0)
            meta, tensors = wire.decode(body)
            assert meta["n"] == n and tensors["x"].shape == (n,) and (n == 0 or int(tensors["x"].sum()) == 7 * n)
            (again,) = call_many([(conn, "Push", wire.encode_chunks({"n": n // 2}, {}))], time.monotonic() + 10)
            assert wire.decode(again)[1]["x"].shape == (n // 2,)
        assert conn._proven >= 9 << 20
    finally:
        service.stop(0)


def test_a_connection_that_delivered_a_large_message_still_pays_only_for_what_arrives_past_it():
    """After a 6 MiB request delivered whole, the same connection declares 512 MiB and sends 1 KiB: the server
    holds about the 6 MiB it was already shown, not the 512 declared."""
    import tracemalloc

    service = StreamService({"Push": lambda meta, tensors, context: ({}, {})}, what="test", token=None,
                            how_to_fix_token="x", max_message_bytes=1 << 30)
    service.start()
    try:
        sock, status, _ = _hello(service.port, "")
        assert status == 0
        body = wire.encode({}, {"x": np.zeros(6 << 18, dtype=np.float32)})
        sock.sendall(struct.pack("<4sHdQ", b"TFDQ", 4, 5.0, len(body)) + b"Push" + body)
        magic, code, length = struct.unpack("<4sBQ", _recv(sock, 13))
        assert (magic, code) == (b"TFDR", 0)
        _recv(sock, length)
        tracemalloc.start()
        _declare_512_mib_send_1_kib_and_close(service, sock)
    finally:
        tracemalloc.stop()
        service.stop(0)


def test_a_push_pull_over_the_stream_reports_what_serving_it_cost_the_ps_and_over_grpc_nothing(server):
    """``exchange_every: auto`` counts the PS tasks' CPU: each PushPull reply on a stream connection carries the
    CPU the connection's thread spent on PushPulls since the previous report (not on the pulls between them);
    gRPC's pool threads cannot tell, so nothing there."""
    from tfdist.ps.update_session import UpdateSession

    def run(stream):
        with PSClient([server.address], TOKEN, stream=stream) as client:
            plan = RoundRobinPlacement().place(SPECS, client.num_ps)
            session = UpdateSession(client, SPECS, plan, 0, True, startup_timeout_s=10.0, heartbeat_interval_s=None,
                                    num_workers=1)
            values = _values()
            session.initialize(values)
            reports, windows = [], []
            for i in range(20):
                values = {k: v + 1.0 for k, v in values.items()}
                before, start = session.stats["server_cpu_seconds"], time.perf_counter()
                session.sync(values)
                windows.append(time.perf_counter() - start)
                reports.append(session.stats["server_cpu_seconds"] - before)
                for _ in range(30):  # pulls on the same connection between the exchanges: in no report
                    client.call(0, "Pull", {"worker": 0})
            assert client._routes[0].idle or not stream  # (one kept connection served all of it)
            push = PushRequest(0, session.state.clock + 1, {}, None, 1, session.state.incarnations[0], {})
            return reports, windows, client.request(0, PushPullRequest(push, (), None))

    reports, windows, reply = run(stream=True)
    assert sum(reports) > 0 and all(r >= 0 for r in reports)
    # A report holds this exchange's CPU and the previous one's sending: within these two exchanges' wall time
    # (one thread's CPU), far below the 30 pulls' between them.
    assert all(r <= w + w0 + 0.002 for r, w, w0 in zip(reports[1:], windows[1:], windows)), (reports, windows)
    assert isinstance(reply.server_cpu_s, float) and reply.server_cpu_s >= 0
    reports, windows, reply = run(stream=False)
    assert sum(reports) == 0.0 and reply.server_cpu_s is None
