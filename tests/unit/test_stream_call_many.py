"""``tfdist.stream_service.call_many``: several calls from one thread, each socket written and read as it allows.

The servers here speak the stream's frames from plain sockets (so a test can
decide when a server reads its request), on 127.0.0.1. The property that
matters on a slow link: a reply is read while another request is still
being sent, so a server that will not read its request until the client has
read another server's large reply does not stall the call (sending every
request first, then reading the replies, deadlocks there until a timeout).
"""

import socket
import struct
import threading
import time

import grpc
import pytest

from tfdist.stream_service import StreamConnection, StreamStatusError, call_many

_HELLO = struct.Struct("<4sBH")
_HELLO_ACK = struct.Struct("<4sBI")
_REQUEST = struct.Struct("<4sHdQ")
_REPLY = struct.Struct("<4sBQ")
BIG = 24 << 20  # more than loopback's socket buffers hold: a send of it ends only once the peer reads


def _recv_exact(sock, n):
    buf = bytearray(n)
    view, got = memoryview(buf), 0
    while got < n:
        k = sock.recv_into(view[got:])
        if not k:
            raise ConnectionError("closed")
        got += k
    return buf


class RawServer:
    """One connection: the hello, then ``serve(sock)`` in a thread (bounded by the socket's timeout)."""

    def __init__(self, serve):
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.error = None
        self.thread = threading.Thread(target=self._run, args=(serve,), daemon=True)
        self.thread.start()

    def _run(self, serve):
        try:
            sock, _ = self.listener.accept()
            with sock:
                sock.settimeout(20)
                _, _, n = _HELLO.unpack(_recv_exact(sock, _HELLO.size))
                _recv_exact(sock, n)
                sock.sendall(_HELLO_ACK.pack(b"TFDA", 0, 0))
                serve(sock)
        except Exception as e:  # noqa: BLE001 (reported by the test)
            self.error = e

    def connect(self):
        return StreamConnection("127.0.0.1", self.port, None, 5.0, 1 << 30, shared_memory=False)  # (the socket path)

    def close(self):
        self.thread.join(30)
        self.listener.close()


def _read_request(sock):
    _, name_len, _, length = _REQUEST.unpack(_recv_exact(sock, _REQUEST.size))
    name = bytes(_recv_exact(sock, name_len)).decode()
    return name, _recv_exact(sock, length)


def _reply(sock, body, status=0):
    sock.sendall(_REPLY.pack(b"TFDR", status, len(body)))
    sock.sendall(body)


def test_a_reply_is_read_while_another_request_is_still_being_sent():
    """Server A answers with 24 MiB at once; server B reads its 24 MiB request only after A's reply went out
    whole. One thread calling A then B gets both replies; sending B's request before reading A's would stall
    (A's reply fills the buffers, B's request cannot go out) until B's wait gives up."""
    a_sent = threading.Event()
    waited = {}

    def serve_a(sock):
        name, body = _read_request(sock)
        assert (name, bytes(body)) == ("Pull", b"a?")
        _reply(sock, b"A" * BIG)
        a_sent.set()

    def serve_b(sock):
        waited["in_time"] = a_sent.wait(15)
        name, body = _read_request(sock)
        assert name == "Push" and len(body) == BIG
        _reply(sock, b"b!")

    a, b = RawServer(serve_a), RawServer(serve_b)
    try:
        ca, cb = a.connect(), b.connect()
        start = time.monotonic()
        out = call_many([(ca, "Pull", [b"a?"]), (cb, "Push", [b"\x01" * (BIG // 2), b"\x02" * (BIG // 2)])],
                        time.monotonic() + 30)
        assert waited == {"in_time": True}  # B read its request after A's reply had gone out whole
        assert len(out[0]) == BIG and bytes(out[0][:4]) == b"AAAA" and bytes(out[1]) == b"b!"
        assert time.monotonic() - start < 15
        assert not ca.closed and not cb.closed  # both usable again
    finally:
        a.close()
        b.close()
    assert a.error is None and b.error is None, (a.error, b.error)


def test_a_failed_call_is_returned_as_its_error_and_the_others_complete():
    """One server refuses (a status), one closes mid-reply, one never answers (the deadline), one answers:
    each outcome is its own; the failed connections are closed, the good one is not."""
    release = threading.Event()

    def refuse(sock):
        _read_request(sock)
        _reply(sock, b"no such variable", status=grpc.StatusCode.NOT_FOUND.value[0])

    def cut(sock):
        _read_request(sock)
        sock.sendall(_REPLY.pack(b"TFDR", 0, 1000) + b"x" * 10)

    def silent(sock):
        _read_request(sock)
        release.wait(20)

    def good(sock):
        _, body = _read_request(sock)
        _reply(sock, bytes(body[::-1]))

    servers = [RawServer(f) for f in (refuse, cut, silent, good)]
    try:
        conns = [s.connect() for s in servers]
        start = time.monotonic()
        out = call_many([(c, "Pull", [b"abc"]) for c in conns], time.monotonic() + 1.0)
        elapsed = time.monotonic() - start
        release.set()
        assert isinstance(out[0], StreamStatusError) and out[0].code == grpc.StatusCode.NOT_FOUND
        assert "no such variable" in out[0].details
        assert isinstance(out[1], ConnectionError)
        assert isinstance(out[2], TimeoutError)
        assert bytes(out[3]) == b"cba"
        assert 0.9 <= elapsed < 10
        assert [c.closed for c in conns] == [True, True, True, False]
    finally:
        release.set()
        for s in servers:
            s.close()


def test_a_reply_that_is_not_a_stream_frame_fails_that_call():
    def garbage(sock):
        _read_request(sock)
        sock.sendall(b"HTTP/1.1 200 OK\r\n\r\n")

    server = RawServer(garbage)
    try:
        conn = server.connect()
        (out,) = call_many([(conn, "Pull", [b""])], time.monotonic() + 5)
        assert isinstance(out, ConnectionError) and "not a tfdist stream frame" in str(out)
        assert conn.closed
    finally:
        server.close()


@pytest.mark.parametrize("body", [b"", b"z" * 3, b"q" * (5 << 20)])
def test_replies_of_any_size_arrive_whole_and_the_connection_serves_the_next_call(body):
    """An empty body, a small one and one larger than the first receive buffer (4 MiB, grown as bytes arrive);
    then a blocking call on the same connection (it is left usable)."""
    def serve(sock):
        for reply in (body, b"again"):
            _read_request(sock)
            _reply(sock, reply)

    server = RawServer(serve)
    try:
        conn = server.connect()
        (out,) = call_many([(conn, "Pull", [b"x"])], time.monotonic() + 10)
        assert bytes(out) == body
        assert bytes(conn.call("Pull", [b"y"], 5.0)) == b"again"
    finally:
        server.close()
    assert server.error is None
