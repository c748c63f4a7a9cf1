"""The stream transport's shared-memory regions between a client and a server on one host (tfdist.stream_service).

A client whose connection ends on its own address offers the server a file
in ``/dev/shm``; once the server mapped it, message bodies of at least
``SHARED_MEMORY_MIN_BODY`` bytes travel through it and only their frames
cross the socket. Real servers and clients over 127.0.0.1; raw sockets where
a test plays a client that lies. The attach maps only a file of the server's
own user, mode 0600, named as tfdist names them, holding the nonce the
request names; a mapped frame without a region, or beyond it, is refused;
whatever an authenticated client puts in its region and frames changes
nothing on a PS task (property-based); a full ``/dev/shm`` sends the bodies
over the socket.
"""

import errno
import mmap
import os
import secrets
import socket
import struct
import time

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tfdist import wire
from tfdist import stream_service as ss
from tfdist.ps.client import PSClient
from tfdist.ps.placement import RoundRobinPlacement, VariableSpec
from tfdist.ps.server import PSServer
from tfdist.ps.session import WorkerSession
from tfdist.stream_service import SHARED_MEMORY_MIN_BODY, StreamConnection, StreamService, call_many

pytestmark = pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="no /dev/shm on this system")

TOKEN = "shm-token-0123456"
#: A 256x512 float32 kernel (512 KiB: through the region) and a bias (over the socket).
SPECS = [VariableSpec("0000/w", "float32", (256, 512)), VariableSpec("0001/b", "float32", (512,))]
REQUEST, REPLY = struct.Struct("<4sHdQ"), struct.Struct("<4sBQ")


def _echo(meta, tensors, context):
    """Replies ``n`` bytes of 7s; checks that the request's ``x`` arrived whole (its sum is ``3 * size``)."""
    x = tensors.get("x")
    assert x is None or int(x.astype(np.int64).sum()) == 3 * x.size
    return {"n": int(meta["n"])}, {"x": np.full(int(meta["n"]), 7, dtype=np.uint8)}


@pytest.fixture
def echo_service():
    service = StreamService({"Echo": _echo}, what="test", token=None, how_to_fix_token="x", max_message_bytes=1 << 26)
    service.start()
    yield service
    service.stop(0)


def _round_trips(conn, sizes):
    for n in sizes:
        body = conn.call("Echo", wire.encode_chunks({"n": n}, {"x": np.full(n, 3, dtype=np.uint8)}), 10.0)
        meta, tensors = wire.decode(body)
        assert meta["n"] == n and tensors["x"].shape == (n,) and (n == 0 or int(tensors["x"].sum()) == 7 * n)
        (again,) = call_many([(conn, "Echo", wire.encode_chunks({"n": n // 2}, {"x": np.full(n, 3, np.uint8)}))],
                             time.monotonic() + 10)
        assert not isinstance(again, BaseException), again
        assert wire.decode(again)[1]["x"].shape == (n // 2,)


SIZES = (6 << 20, 0, 1000, SHARED_MEMORY_MIN_BODY - 200, SHARED_MEMORY_MIN_BODY, 9 << 20, 5 << 20, 9 << 20)


def test_large_bodies_travel_through_the_region_both_ways_and_no_file_is_left(echo_service):
    conn = StreamConnection("127.0.0.1", echo_service.port, None, 5.0, 1 << 26)
    region = conn._region
    try:
        assert conn.shared_memory
        assert os.fstat(region.file.fileno()).st_nlink == 0  # unlinked once both ends had it: nothing in /dev/shm
        _round_trips(conn, SIZES)
        # every request of 64 KiB or more came through the region (2 calls per size, call and call_many)...
        assert echo_service.mapped_requests == 2 * sum(n >= SHARED_MEMORY_MIN_BODY for n in SIZES)
        assert conn._proven < SHARED_MEMORY_MIN_BODY  # ...and no reply of 64 KiB or more crossed the socket
        assert region.size >= 9 << 20
        # A small request whose reply is larger than anything the region carried: the server writes past it.
        for n in (12 << 20, 14 << 20):
            body = conn.call("Echo", wire.encode_chunks({"n": n}, {}), 10.0)
            assert int(wire.decode(body)[1]["x"].sum()) == 7 * n
            (again,) = call_many([(conn, "Echo", wire.encode_chunks({"n": n + 1}, {}))], time.monotonic() + 10)
            assert int(wire.decode(again)[1]["x"].sum()) == 7 * (n + 1)
        assert conn._proven < SHARED_MEMORY_MIN_BODY and region.size >= (14 << 20) + 1
    finally:
        conn.close()
    assert region.file.closed and conn._region is None and not conn.shared_memory


def test_without_shared_memory_the_same_bodies_cross_the_socket(echo_service):
    conn = StreamConnection("127.0.0.1", echo_service.port, None, 5.0, 1 << 26, shared_memory=False)
    try:
        assert not conn.shared_memory
        _round_trips(conn, SIZES)
        assert conn._proven >= 9 << 20 and echo_service.mapped_requests == 0
    finally:
        conn.close()


def test_bodies_past_the_largest_region_go_over_the_socket(echo_service, monkeypatch):
    """A region carries at most SHARED_MEMORY_MAX_REGION (what a local job holds in /dev/shm stays bounded)."""
    monkeypatch.setattr(ss, "SHARED_MEMORY_MAX_REGION", 2 << 20)
    conn = StreamConnection("127.0.0.1", echo_service.port, None, 5.0, 1 << 26)
    try:
        _round_trips(conn, (1 << 20, 3 << 20))
        assert (3 << 20) <= conn._proven < (4 << 20)  # the 3 MiB reply crossed the socket
        assert echo_service.mapped_requests == 2  # the 1 MiB requests (call, call_many) used the region
        assert (1 << 20) <= conn._region.size <= (2 << 20)
    finally:
        conn.close()


def test_a_full_dev_shm_sends_the_bodies_over_the_socket(echo_service, monkeypatch):
    """Nothing past the first page can be written (a container's small /dev/shm): calls go on over the socket."""
    real = os.pwritev

    def full(fd, buffers, offset):
        if offset + sum(len(b) for b in buffers) > mmap.PAGESIZE:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(fd, buffers, offset)

    monkeypatch.setattr(ss.os, "pwritev", full)
    conn = StreamConnection("127.0.0.1", echo_service.port, None, 5.0, 1 << 26)
    try:
        assert conn.shared_memory
        _round_trips(conn, (6 << 20, 1000, 6 << 20))
        assert conn._proven >= 6 << 20  # the 6 MiB replies came over the socket
        assert echo_service.mapped_requests == 0  # and the requests
    finally:
        conn.close()

    def none(fd, buffers, offset):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(ss.os, "pwritev", none)
    before = set(os.listdir("/dev/shm"))
    conn = StreamConnection("127.0.0.1", echo_service.port, None, 5.0, 1 << 26)
    try:
        assert not conn.shared_memory
        _round_trips(conn, (1 << 20,))
    finally:
        conn.close()
    assert not {n for n in set(os.listdir("/dev/shm")) - before if n.startswith(ss._SHM_PREFIX)}


# --------------------------------------------------------------- a lying client
def _hello(port, token=""):
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    secret = token.encode()
    sock.sendall(struct.pack("<4sBH", b"TFDH", 1, len(secret)) + secret)
    magic, status, length = struct.unpack("<4sBI", _recv(sock, 9))
    assert (magic, status) == (b"TFDA", 0)
    _recv(sock, length)
    return sock


def _recv(sock, n):
    """Up to ``n`` bytes; fewer when the server closed the connection (a reset counts as closed)."""
    out = b""
    while len(out) < n:
        try:
            chunk = sock.recv(n - len(out))
        except (ConnectionResetError, socket.timeout):
            break
        if not chunk:
            break
        out += chunk
    return out


def _reply(sock, fd=None):
    """(magic, status, body) of the next reply, a mapped one's body read from the region ``fd``; None when the
    server closed the connection."""
    head = _recv(sock, REPLY.size)
    if len(head) < REPLY.size:
        return None
    magic, status, length = REPLY.unpack(head)
    if magic == b"TFDN":
        return magic, status, os.pread(fd, length, 0) if fd is not None else b""
    return magic, status, _recv(sock, length)


def _attach(sock, name, nonce):
    body = nonce + name.encode()
    sock.sendall(REQUEST.pack(b"TFDQ", len(ss._ATTACH), 0.0, len(body)) + ss._ATTACH.encode() + body)
    return _reply(sock)


def _region_file(mode=0o600, nonce=None, size=mmap.PAGESIZE, keep_open=False):
    """A region file as a client makes it: (path, name, nonce), and its descriptor with ``keep_open``."""
    name = ss._region_name()
    path = os.path.join("/dev/shm", name)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, mode)
    os.fchmod(fd, mode)
    nonce = nonce or secrets.token_bytes(ss._NONCE)
    os.posix_fallocate(fd, 0, size)
    os.pwrite(fd, nonce, 0)
    if keep_open:
        return path, name, nonce, fd
    os.close(fd)
    return path, name, nonce


def _echo_call(sock, n=10, fd=None):
    """An echo of ``n`` bytes; its reply through the region ``fd`` (a mapped frame) when given."""
    body = wire.encode({"n": n}, {})
    sock.sendall(REQUEST.pack(b"TFDQ", 4, 5.0, len(body)) + b"Echo" + body)
    magic, status, text = _reply(sock, fd)
    assert (magic, status) == (b"TFDN" if fd is not None else b"TFDR", 0), text
    x = wire.decode(text)[1]["x"]
    assert x.shape == (n,) and int(x.sum()) == 7 * n


def test_an_attach_maps_only_this_users_own_file_with_the_nonce_and_a_refusal_keeps_the_connection(echo_service):
    sock = _hello(echo_service.port)
    made, good_fd = [], None
    try:
        # Names that are not a region's (a path, a traversal, the wrong pattern) are never opened.
        target = f"/dev/shm/precious-{secrets.token_hex(4)}"
        made.append(target)
        with open(target, "wb") as f:
            f.write(b"keep me")
        for name in (target, "../shm/" + os.path.basename(target), "tfdist-stream-XYZ", "tfdist-stream-" + "0" * 31,
                     ss._SHM_PREFIX + "0" * 32, ss._SHM_PREFIX + "0-" + "0" * 32, ss._region_name() + "/x", ""):
            magic, status, text = _attach(sock, name, secrets.token_bytes(ss._NONCE))
            assert (magic, status) == (b"TFDR", 9), (name, text)  # FAILED_PRECONDITION
            assert b"not a tfdist shared-memory region name" in text or b"cannot open" in text, text
            _echo_call(sock)  # the connection goes on
        with open(target, "rb") as f:
            assert f.read() == b"keep me"
        # A missing file; a file others may read; the wrong nonce; a symlink to a good region: refused.
        missing = ss._region_name()
        path, name, nonce = _region_file(mode=0o644)
        made.append(path)
        good_path, good_name, good_nonce, good_fd = _region_file(keep_open=True)
        made.append(good_path)
        link_name = ss._region_name()
        os.symlink(good_path, os.path.join("/dev/shm", link_name))
        made.append(os.path.join("/dev/shm", link_name))
        linked_path, linked_name, linked_nonce = _region_file()  # a second name for it: two links
        hard_name = ss._region_name()
        os.link(linked_path, os.path.join("/dev/shm", hard_name))
        made += [linked_path, os.path.join("/dev/shm", hard_name)]
        big_path, big_name, big_nonce = _region_file()
        os.truncate(big_path, ss.SHARED_MEMORY_MAX_REGION + 1)  # (sparse: no pages taken)
        made.append(big_path)
        dir_name = ss._region_name()
        os.mkdir(os.path.join("/dev/shm", dir_name))
        for name, nonce_sent, why in ((missing, good_nonce, b"cannot open"), (name, nonce, b"mode 0600"),
                                      (good_name, secrets.token_bytes(ss._NONCE), b"nonce"),
                                      (link_name, good_nonce, b"cannot open"),
                                      (hard_name, linked_nonce, b"one link"), (big_name, big_nonce, b"size"),
                                      (dir_name, good_nonce, b"cannot open"),
                                      (good_name, good_nonce[:-1], b"not a tfdist shared-memory region name")):
            magic, status, text = _attach(sock, name, nonce_sent)
            assert (magic, status) == (b"TFDR", 9) and why in text, (name, text)
            _echo_call(sock)
        os.rmdir(os.path.join("/dev/shm", dir_name))
        assert all(os.path.lexists(p) for p in (path, good_path, linked_path, big_path))  # left to their owner
        # The good one, named with its nonce: mapped, and unlinked by the server.
        assert _attach(sock, good_name, good_nonce) == (b"TFDR", 0, b"")
        assert not os.path.exists(good_path)
        # A second attach on the same connection: refused, the first region kept.
        path2, name2, nonce2 = _region_file()
        made.append(path2)
        magic, status, text = _attach(sock, name2, nonce2)
        assert status == 9 and b"already has" in text
        _echo_call(sock, SHARED_MEMORY_MIN_BODY, good_fd)  # a large reply comes through the region
        _echo_call(sock, 10)  # a small one over the socket
    finally:
        sock.close()
        if good_fd is not None:
            os.close(good_fd)
        for p in made:
            if os.path.lexists(p):
                os.unlink(p)


def test_an_attach_body_too_long_is_refused_and_the_connection_closed(echo_service):
    sock = _hello(echo_service.port)
    try:
        body = b"x" * (ss._MAX_ATTACH_BODY + 1)
        sock.sendall(REQUEST.pack(b"TFDQ", len(ss._ATTACH), 0.0, len(body)) + ss._ATTACH.encode() + body)
        magic, status, text = _reply(sock)
        assert status == 3 and b"attach" in text  # INVALID_ARGUMENT
        assert _reply(sock) is None  # closed
    finally:
        sock.close()


def test_mapped_frames_without_a_region_or_past_it_are_refused_and_the_server_goes_on(echo_service):
    body = wire.encode({"n": 5}, {})
    sock = _hello(echo_service.port)  # no region: a mapped frame is not a frame
    try:
        sock.sendall(REQUEST.pack(b"TFDM", 4, 5.0, len(body)) + b"Echo")
        magic, status, text = _reply(sock)
        assert status == 3 and b"not a tfdist stream request frame" in text
        assert _reply(sock) is None
    finally:
        sock.close()
    for declared, code, why in ((3 * mmap.PAGESIZE, 3, b"beyond its shared-memory region"),
                                ((1 << 26) + 1, 8, b"larger than max")):
        sock = _hello(echo_service.port)
        path, name, nonce = _region_file()
        try:
            assert _attach(sock, name, nonce) == (b"TFDR", 0, b"")
            sock.sendall(REQUEST.pack(b"TFDM", 4, 5.0, declared) + b"Echo")
            magic, status, text = _reply(sock)
            assert status == code and why in text, text
            assert _reply(sock) is None
        finally:
            sock.close()
            if os.path.exists(path):
                os.unlink(path)
    sock = _hello(echo_service.port)
    try:
        _echo_call(sock)  # the server goes on
    finally:
        sock.close()


def test_a_region_truncated_under_a_mapped_frame_is_refused_and_the_server_goes_on(echo_service):
    """The client shrinks its file after it wrote a body (a buggy or hostile client): the server's read comes
    back short and the request is refused; the server process (this one) is not killed by a SIGBUS."""
    path, name, nonce, fd = _region_file(keep_open=True)
    sock = _hello(echo_service.port)
    try:
        assert _attach(sock, name, nonce) == (b"TFDR", 0, b"")
        body = wire.encode({"n": 5}, {"x": np.full(1 << 20, 3, np.uint8)})
        os.pwrite(fd, body, 0)
        os.ftruncate(fd, 4096)
        sock.sendall(REQUEST.pack(b"TFDM", 4, 5.0, len(body)) + b"Echo")
        magic, status, text = _reply(sock)
        assert status == 3 and b"beyond its shared-memory region" in text, text
        assert _reply(sock) is None
    finally:
        sock.close()
        os.close(fd)
        if os.path.exists(path):
            os.unlink(path)
    sock = _hello(echo_service.port)
    try:
        _echo_call(sock)
    finally:
        sock.close()


def test_the_attach_method_is_not_a_handlers_name():
    with pytest.raises(ValueError, match="stream layer's own method"):
        StreamService({ss._ATTACH: _echo}, what="test", token=None, how_to_fix_token="x", max_message_bytes=1 << 20)


# ----------------------------------------------------------- a PS task behind it
@pytest.fixture
def ps_server():
    srv = PSServer(None, token=TOKEN, num_workers=1, max_message_bytes=4 << 20).start()
    yield srv
    srv.stop(0)


def _values(seed=0):
    rng = np.random.default_rng(seed)
    return {s.key: rng.standard_normal(s.shape).astype("float32") for s in SPECS}


def _session(client):
    plan = RoundRobinPlacement().place(SPECS, client.num_ps)
    return WorkerSession(client, SPECS, plan, 0, True, startup_timeout_s=10.0, heartbeat_interval_s=None,
                         num_workers=1)


def _grpc_state(srv):
    with PSClient([srv.address], TOKEN, stream=False) as c:
        meta, tensors = c.call(0, "Pull", {"worker": -1})
    return meta["version"], {k: v.copy() for k, v in tensors.items()}


def test_a_session_trains_through_the_region_as_over_grpc(ps_server):
    """Init, push-pulls and a pull of a 512 KiB kernel through the region: the PS holds what gRPC reads."""
    values = _values()
    with PSClient([ps_server.address], TOKEN) as client:
        session = _session(client)
        session.initialize(values)
        current = values
        for step in range(3):
            current = {k: v + (step + 1) * 0.5 for k, v in current.items()}
            fresh = session.sync(current)
            for k in values:
                np.testing.assert_array_equal(fresh[k], current[k])
        assert client._routes[0].idle and all(c.shared_memory for c in client._routes[0].idle)
        version, stored = _grpc_state(ps_server)
        for k in values:
            np.testing.assert_array_equal(stored[k], current[k])
    with PSClient([ps_server.address], TOKEN, shared_memory=False) as client:  # the setting turns it off
        meta, tensors = client.call(0, "Pull", {"worker": -1})
        assert meta["version"] == version and not any(c.shared_memory for c in client._routes[0].idle)


_FRAME = st.one_of(
    st.binary(max_size=48),
    st.builds(lambda magic, m, t, n: REQUEST.pack(magic, len(m), t, n) + m,
              st.sampled_from([b"TFDM", b"TFDQ"]),
              st.sampled_from([b"Push", b"PushPull", b"Pull", b"Init", b"Nope", ss._ATTACH.encode(), b""]),
              st.floats(allow_nan=True, allow_infinity=True), st.integers(0, 1 << 40)),
    st.builds(lambda m, n: REQUEST.pack(b"TFDM", len(m), 5.0, n) + m,
              st.sampled_from([b"Push", b"PushPull", b"PushRows"]), st.integers(0, 3 * mmap.PAGESIZE)),
)
#: What the lying client writes into its region before its frames: garbage, or well-formed pushes that no
#: variable takes (a wrong shape, an unknown key, a NaN).
_REGION = st.one_of(
    st.binary(max_size=2048),
    st.builds(lambda meta, rows: wire.encode(meta, {"0000/w": np.ones((rows, 512), np.float32)}),
              st.fixed_dictionaries({"worker": st.integers(-2, 3), "clock": st.integers(-1, 5)}),
              st.sampled_from([1, 255, 257])),
    st.just(wire.encode({"worker": 0, "clock": 1}, {"9999/nope": np.ones(4, np.float32)})),
    st.just(wire.encode({"worker": 0, "clock": 1}, {"0001/b": np.full(512, np.nan, np.float32)})),
)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(region=_REGION, frames=st.lists(st.one_of(_FRAME, st.sampled_from([b"Push", b"PushPull", b"PushRows"])),
                                       min_size=1, max_size=3))
def test_whatever_a_client_puts_in_its_region_and_frames_changes_nothing(ps_server, send_and_drain, region, frames):
    """An authenticated client with a region: any region contents the PS refuses (garbage, or pushes no
    variable takes) and any frames (mapped or not, any declared size; a bare method name stands for a mapped
    frame of exactly the region's contents): the task's values and version stay, and it serves the next client
    through shared memory. (An accepted push through the region: the session test above.)"""
    with PSClient([ps_server.address], TOKEN, stream=False) as c:
        if not c.call(0, "Status", {"brief": True})[0]["initialized"]:
            _session(c).initialize(_values())
    before = _grpc_state(ps_server)
    path, name, nonce, fd = _region_file(size=3 * mmap.PAGESIZE, keep_open=True)
    sock = _hello(ps_server.service.stream_port, TOKEN)
    sock.settimeout(2.0)
    try:
        assert _attach(sock, name, nonce) == (b"TFDR", 0, b"")
        os.pwrite(fd, region, 0)  # (after the attach: the server checked the nonce, then the client rewrote it)
        send_and_drain(sock, [REQUEST.pack(b"TFDM", len(f), 5.0, len(region)) + f
                              if f in (b"Push", b"PushPull", b"PushRows") else f for f in frames])
    finally:
        sock.close()
        os.close(fd)
        if os.path.exists(path):
            os.unlink(path)
    after = _grpc_state(ps_server)
    assert after[0] == before[0]
    for k in before[1]:
        np.testing.assert_array_equal(after[1][k], before[1][k])
    with PSClient([ps_server.address], TOKEN) as client:
        assert client.call(0, "Pull", {"worker": -1})[0]["version"] == before[0]
        assert all(c.shared_memory for c in client._routes[0].idle)


def test_a_server_that_does_not_know_the_attach_is_called_over_the_socket_on_a_new_connection():
    """A server of a tfdist without shared memory refuses the attach as an unknown method and closes the
    connection (as any refusal before a body): the client connects again, without a region, and its calls work."""
    import threading

    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(10)
    port, seen = listener.getsockname()[1], []

    def old_server():
        for _ in range(2):
            conn, _ = listener.accept()
            with conn:
                conn.settimeout(10)
                _, _, n = struct.unpack("<4sBH", _recv(conn, 5 + 2))
                _recv(conn, n)
                conn.sendall(struct.pack("<4sBI", b"TFDA", 0, 0))
                while True:
                    head = _recv(conn, REQUEST.size)
                    if len(head) < REQUEST.size:
                        break
                    magic, name_len, _, length = REQUEST.unpack(head)
                    method = _recv(conn, name_len).decode()
                    seen.append((magic, method))
                    body = _recv(conn, length)
                    if method != "Echo":  # (the old server: an unknown method is refused, the connection closed)
                        text = f"no method {method!r}".encode()
                        conn.sendall(REPLY.pack(b"TFDR", 12, len(text)) + text)
                        break
                    reply = wire.encode(*_echo(*wire.decode(body), None))
                    conn.sendall(REPLY.pack(b"TFDR", 0, len(reply)) + reply)

    thread = threading.Thread(target=old_server, daemon=True)
    thread.start()
    try:
        conn = StreamConnection("127.0.0.1", port, None, 5.0, 1 << 26)
        try:
            assert not conn.shared_memory
            body = conn.call("Echo", wire.encode_chunks({"n": 1 << 20}, {"x": np.full(1 << 20, 3, np.uint8)}), 10.0)
            assert wire.decode(body)[1]["x"].shape == (1 << 20,)
        finally:
            conn.close()
        thread.join(10)
        assert not thread.is_alive()
        assert seen == [(b"TFDQ", ss._ATTACH), (b"TFDQ", "Echo")]
    finally:
        listener.close()


def test_region_files_killed_clients_left_are_swept_by_the_next_region_and_nothing_else(echo_service, monkeypatch):
    """A client killed between creating its region and the server's unlink leaves a file; the next process to make
    a region removes it: only region files of this user whose creating process is gone."""
    import subprocess
    import sys

    dead = subprocess.Popen([sys.executable, "-c", "import os; print(os.getpid())"], stdout=subprocess.PIPE)
    dead_pid = int(dead.communicate(timeout=30)[0])
    live_child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    made = []

    def put(name, uid=None):
        path = os.path.join("/dev/shm", name)
        with open(path, "wb") as f:
            f.write(b"x" * 4096)
        os.chmod(path, 0o600)
        if uid is not None:
            os.chown(path, uid, -1)
        made.append(path)
        return path

    try:
        left = put(ss._region_name(dead_pid))  # a killed client's
        not_mine = put(ss._region_name(dead_pid), uid=65534) if os.geteuid() == 0 else None  # another user's
        alive = put(ss._region_name(live_child.pid))  # a live process's, in the middle of its attach
        own = put(ss._region_name())  # this process's own
        other = put(f"tfdist-stream-{dead_pid}-not-a-region")  # not a region's name
        link = os.path.join("/dev/shm", ss._region_name(dead_pid))
        os.symlink(left, link)  # a link: not a regular file
        made.append(link)
        monkeypatch.setattr(ss, "_swept_in", None)  # as in a process that has made no region yet
        conn = StreamConnection("127.0.0.1", echo_service.port, None, 5.0, 1 << 26)
        try:
            assert conn.shared_memory
            _round_trips(conn, (1 << 20,))
        finally:
            conn.close()
        assert not os.path.exists(left) and os.path.islink(link)
        assert all(os.path.exists(p) for p in (alive, own, other) + ((not_mine,) if not_mine else ()))
    finally:
        live_child.kill()
        live_child.wait(timeout=30)
        for p in made:
            if os.path.lexists(p):
                os.unlink(p)
