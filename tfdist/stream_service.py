"""A lean transport for the parameter servers' data plane: wire messages over one TCP connection per call.

gRPC's Python client and server cost about 2 ms of CPU on each side for a
round trip of 0.5 MiB each way on this project's 2-core machine (HTTP/2
framing, copies into and out of its buffers, its polling threads); a plain
TCP connection carrying the same :mod:`tfdist.wire` messages costs about a
fifth of that (``benchmarks/ps_throughput.py``, docs/benchmarks.md). A
training step sends such a round trip to every PS task, so the exchange of
a dense model spends most of its CPU there.

A :class:`StreamService` serves the same handlers as a
:class:`~tfdist.grpc_service.WireService` (``handler(meta, tensors, context)``,
the context answering ``time_remaining()`` and ``is_active()``), with the same
guarantees:

* **Authentication before any body.** A connection starts with a hello that
  carries the job token, compared in constant time; a wrong or missing token
  is answered ``UNAUTHENTICATED`` and the connection closed before any
  request is read. A hello must arrive within ``hello_timeout_s``.
* **Sizes checked before memory is taken.** A request declares its method
  and its length first: an unknown method or a length over
  ``max_message_bytes`` is refused (and the connection closed) without
  reading the body. A body's buffer grows as its bytes arrive, from 4 MiB
  or from the largest message the connection already delivered whole (a
  declared size costs about what arrives, or what arrived before).
* **The same error mapping** (:func:`~tfdist.grpc_service.error_status`): a
  refused request gets the gRPC status code and message it would get over
  gRPC, so clients translate both alike.
* Bounded resources: at most ``max_connections`` connections (one thread
  each); more are closed at once.

Frames (little-endian). Hello: ``b"TFDH"``, version (u8), token length (u16),
token; answered ``b"TFDA"``, status (u8, 0 = accepted), message length (u32),
message. Request: ``b"TFDQ"``, method name length (u16), the caller's
deadline in seconds (f64, 0 = none), body length (u64), method name, body (a
wire message). Reply: ``b"TFDR"``, status (u8: 0 = OK, else a
``grpc.StatusCode`` number), body length (u64), body (a wire message, or the
error's UTF-8 text). One call at a time per connection; a client keeps a few
connections per server and opens another when all are busy.

**Shared memory between the tasks of one host.** Over loopback, moving a
message through the kernel's TCP stack costs far more CPU than copying it
(an 8.6 MB request and reply: 2.4-3.0 ms of CPU on each side, against
1.0-1.3 ms for two copies through a shared file), and a local job's workers and PS tasks share the
host's cores. So a client whose connection ends on its own address
(:func:`_same_host`) creates a file in ``/dev/shm`` (mode 0600, a random
name), writes a random nonce into it and asks the server to attach it
(``AttachSharedMemory``, after the hello). The server attaches it only if it is a
regular file of its own user, mode 0600, one link, named as tfdist names
them, holding that nonce; either side then unlinks it (once attached,
nothing is left in ``/dev/shm``, even when a process is killed; a client
killed in the middle of its attach can leave one page, which the next
process of that user to make a region removes: the name records its
creator's process id). From then on, a message body of
at least :data:`SHARED_MEMORY_MIN_BODY` bytes (and at most
:data:`SHARED_MEMORY_MAX_REGION`) is written into that region and
only its frame crosses the socket (request ``b"TFDM"``, reply ``b"TFDN"``:
the same fields, no body after them). One call at a time per connection:
the client writes a request and sends its frame; the server copies the body
out into a buffer of its own, as a socket read would, before it writes the
reply there; the client copies the reply out. Both copy with
``pwritev``/``preadv`` on the file (:class:`_Region`), never through a
mapping, so what a handler decodes is private, as before; a full
``/dev/shm`` (a container's 64 MB) fails the write and the body goes over the
socket; a file shorter than its frame says is a refused request, never a
``SIGBUS``. A region is one more way
to carry a body, not a new trust: only an authenticated client can attach,
the server checks every declared size as before, and the file is one its own
user made (who can read that process's memory anyway). A refused attach
(another user, another host with the same address, no ``/dev/shm``) leaves
the connection as it was.

There is no TLS on this transport: a job with TLS keeps every call on gRPC
(:class:`~tfdist.ps.client.PSClient` and :class:`~tfdist.ps.server.PSServer`
decide that). Importing this module does not import TensorFlow.
"""

from __future__ import annotations

import errno
import hmac
import logging
import math
import os
import re
import secrets
import select
import socket
import stat
import struct
import threading
import time
from typing import Callable, Mapping, Sequence

import grpc

from tfdist import wire
from tfdist.errors import WireFormatError
from tfdist.grpc_service import error_status

__all__ = ["SHARED_MEMORY_MAX_REGION", "SHARED_MEMORY_MIN_BODY", "StreamService", "StreamConnection",
           "StreamStatusError", "VERSION", "call_many"]

logger = logging.getLogger(__name__)

VERSION = 1
_HELLO = struct.Struct("<4sBH")
_HELLO_ACK = struct.Struct("<4sBI")
_REQUEST = struct.Struct("<4sHdQ")
_REPLY = struct.Struct("<4sBQ")
_MAX_METHOD = 64
_MAX_TOKEN = 4096
#: Buffers per ``sendmsg`` (Linux's IOV_MAX is 1024).
_MAX_IOV = 512
#: The receive buffer a message starts with (it grows as the bytes arrive).
_FIRST_BUFFER = 4 << 20
#: How long a refused request's body is read and dropped before the connection closes.
_DRAIN_S = 5.0
_STATUS_BY_NUMBER = {code.value[0]: code for code in grpc.StatusCode}
#: Message bodies at least this large travel through a connection's shared-memory region when it has one
#: (smaller ones cost less on the socket than the region's bookkeeping).
SHARED_MEMORY_MIN_BODY = 64 << 10
#: The largest a connection's region grows: larger bodies go over the socket. A region keeps its size for the
#: connection's life (a worker keeps a few connections per task), so this bounds what a local job holds in
#: ``/dev/shm``; an 8.6 MB CNN exchange or a 1 MiB MLP one is far below it.
SHARED_MEMORY_MAX_REGION = 64 << 20
_SHM_DIR = "/dev/shm"
_SHM_PREFIX = "tfdist-stream-"
#: A region's name: the creating process's id (so that what a killed one left can be found), a random part.
#: (Before 9086a0a the name had no process id: a client and a server on either side of that change attach no
#: region between them, and bodies go over the socket, as between hosts.)
_SHM_NAME = re.compile(r"tfdist-stream-([1-9][0-9]{0,9})-[0-9a-f]{32}\Z")
#: The stream layer's own method (never a handler's): map the region the request names.
_ATTACH = "/tfdist.stream/AttachSharedMemory"
_NONCE = 32
_MAX_ATTACH_BODY = _NONCE + 80
_REQUEST_MAPPED, _REPLY_MAPPED = b"TFDM", b"TFDN"


class StreamStatusError(Exception):
    """A call refused by the server: its gRPC status code and message."""

    def __init__(self, code: grpc.StatusCode, details: str):
        super().__init__(f"{code.name}: {details}")
        self.code, self.details = code, details


# ------------------------------------------------------------------ framing
def _recv_exact(sock: socket.socket, n: int, proven: int = 0) -> bytearray | None:
    """``n`` bytes, or ``None`` if the peer closed the connection before the first one.

    The buffer grows (doubling) as the bytes arrive, from :data:`_FIRST_BUFFER`, or from ``proven`` when
    larger (the largest message this peer already delivered whole on this connection: it has made us hold
    that much before): a peer that declares a large message and sends little costs at most about twice
    what it sent, or what it sent before, not what it declared. Growing costs copies (an 8.6 MB message
    grown from 4 MiB took 7 ms of CPU where one allocation takes 0.8), so a connection that carries
    messages of one size, as a training job's does, allocates each whole from its second one on.
    """
    buf = bytearray(min(n, max(_FIRST_BUFFER, proven)))
    got = 0
    while got < n:
        if got == len(buf):
            buf.extend(bytes(min(len(buf), n - len(buf))))
        with memoryview(buf) as view:
            k = sock.recv_into(view[got:])
        if k == 0:
            if got == 0:
                return None
            raise ConnectionError(f"the peer closed the connection after {got} of {n} bytes")
        got += k
    return buf


def _recv_whole(sock: socket.socket, n: int) -> bytearray:
    """``n`` bytes (:func:`_recv_exact`); ``ConnectionError`` if the peer closed the connection first."""
    data = _recv_exact(sock, n)
    if data is None:
        raise ConnectionError("the server closed the connection")
    return data


def _consume(pending: list[memoryview], n: int) -> None:
    """Drops the first ``n`` bytes of ``pending`` (buffers in order): what one vectored write took."""
    while n:
        first = pending[0]
        if n >= len(first):
            n -= len(first)
            pending.pop(0)
        else:
            pending[0] = first[n:]
            n = 0


def _send_all(sock: socket.socket, chunks: Sequence[bytes | memoryview]) -> None:
    """Sends every chunk in order with as few system calls as the kernel allows (no copy into one buffer)."""
    pending = [memoryview(c).cast("B") for c in chunks if len(c)]
    while pending:
        _consume(pending, sock.sendmsg(pending[:_MAX_IOV]))


def _status_frame(code: grpc.StatusCode, details: str) -> list[bytes]:
    text = details.encode("utf-8", "replace")
    return [_REPLY.pack(b"TFDR", code.value[0], len(text)), text]


# ------------------------------------------------------------ shared memory
class _Region:
    """The shared-memory file of one connection: the body of the message in flight.

    Used by one side at a time (one call at a time per connection, see the
    module's docstring), through ``pwritev``/``preadv`` on the file, never a
    mapping: each is one copy by the kernel (no page faults on fresh pages,
    nothing to remap as it grows), a peer that truncates the file makes a
    read come back short (refused) instead of a ``SIGBUS``, and a full
    ``/dev/shm`` fails the write with ``ENOSPC`` (the body then goes over the
    socket). The descriptor is a file object, closed when collected.
    """

    __slots__ = ("file",)

    def __init__(self, fd: int):
        self.file = open(fd, "r+b", buffering=0, closefd=True)  # noqa: SIM115 (closed by close() or collection)

    @property
    def size(self) -> int:
        """What the file holds in /dev/shm: the largest body written through it."""
        return os.fstat(self.file.fileno()).st_size

    def write(self, chunks: Sequence[bytes | memoryview], length: int) -> bool:
        """Writes the chunks one after another from the region's start; False if they did not all fit
        (``/dev/shm`` full) or ``length`` is past :data:`SHARED_MEMORY_MAX_REGION`: send the body otherwise."""
        if length > SHARED_MEMORY_MAX_REGION:
            return False
        pending = [memoryview(c).cast("B") for c in chunks if len(c)]
        offset = 0
        try:
            while pending:
                written = os.pwritev(self.file.fileno(), pending[:_MAX_IOV], offset)
                if written <= 0:
                    return False
                offset += written
                _consume(pending, written)
        except OSError as e:  # ENOSPC, EFBIG, a memory limit
            logger.debug("shared-memory region not written (%s): the body goes over the socket", e)
            return False
        return offset == length

    def read(self, n: int) -> bytearray | None:
        """A private copy of the region's first ``n`` bytes; None if the file holds fewer (or ``n`` is past
        :data:`SHARED_MEMORY_MAX_REGION`)."""
        if n > SHARED_MEMORY_MAX_REGION:
            return None
        body = bytearray(n)
        got = 0
        with memoryview(body) as view:
            while got < n:
                k = os.preadv(self.file.fileno(), [view[got:]], got)
                if k <= 0:
                    return None  # (the file is shorter than the frame says)
                got += k
        return body

    def close(self) -> None:
        self.file.close()


def _same_host(sock: socket.socket) -> bool:
    """Whether a connected socket ends on an address of its own (loopback, or this host's own address)."""
    try:
        return sock.getpeername()[0] == sock.getsockname()[0]
    except OSError:
        return False


def _region_name(pid: int | None = None) -> str:
    """A new region's file name: ``tfdist-stream-<pid>-<32 random hex digits>``."""
    return f"{_SHM_PREFIX}{os.getpid() if pid is None else pid}-{secrets.token_hex(16)}"


_swept_in: int | None = None  # the process (id) that swept /dev/shm (a forked child sweeps again)


def _sweep_dead_regions() -> int:
    """Removes region files that processes of this user left in ``/dev/shm`` when they were killed; returns how many.

    A file is removed only if its name is a region's, it is a regular file
    of this user, and the process its name records no longer exists. An
    attached region's name is gone already (the server unlinks it); such a
    file is one a client was killed with in the middle of its attach. (A
    process of another PID namespace that shares this ``/dev/shm`` does not
    look alive here: a file it is attaching in that instant can go, and that
    connection then sends its bodies over the socket for its life: nothing is lost.)
    """
    removed, uid = 0, os.geteuid()
    try:
        entries = list(os.scandir(_SHM_DIR))
    except OSError:
        return 0
    for entry in entries:
        match = _SHM_NAME.match(entry.name)
        if match is None or int(match.group(1)) == os.getpid():
            continue
        try:
            os.kill(int(match.group(1)), 0)
            continue  # alive (or another user's process: not ours to judge)
        except ProcessLookupError:
            pass
        except (OverflowError, OSError):  # (PermissionError: another user's process, alive)
            continue
        try:
            st = entry.stat(follow_symlinks=False)
            if stat.S_ISREG(st.st_mode) and st.st_uid == uid:
                os.unlink(entry.path)
                removed += 1
        except OSError:
            continue
    if removed:
        logger.info("removed %d shared-memory region file(s) of killed processes from %s", removed, _SHM_DIR)
    return removed


def _new_region() -> tuple[_Region, str, bytes] | None:
    """A client's new region: ``(region, its file's name, the nonce written at its start)``; None if none can be.

    A process's first region sweeps what killed processes left (:func:`_sweep_dead_regions`).
    """
    global _swept_in
    if _swept_in != os.getpid():
        _swept_in = os.getpid()
        _sweep_dead_regions()
    name = _region_name()
    path = os.path.join(_SHM_DIR, name)
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as e:  # no /dev/shm (macOS), read-only
        logger.debug("no shared-memory region (%s): message bodies go over the socket", e)
        return None
    region = _Region(fd)
    nonce = secrets.token_bytes(_NONCE)
    if not region.write([nonce], _NONCE):  # (full)
        region.close()
        _unlink(path)
        return None
    return region, name, nonce


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:  # (the other side unlinked it first)
        pass


def _open_region(body: bytes | bytearray) -> _Region:
    """The server's side of an attach: the region the request names, checked. Raises ``ValueError`` (why)."""
    nonce, name = bytes(body[:_NONCE]), bytes(body[_NONCE:]).decode("ascii", "replace")
    if len(nonce) < _NONCE or not _SHM_NAME.match(name):
        raise ValueError("not a tfdist shared-memory region name")
    path = os.path.join(_SHM_DIR, name)
    try:
        fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        raise ValueError(f"cannot open the region ({e.strerror})") from None  # (another host, another user)
    region = _Region(fd)
    try:
        st = os.fstat(fd)
        if (not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o077 or st.st_nlink != 1
                or not _NONCE <= st.st_size <= SHARED_MEMORY_MAX_REGION):
            raise ValueError("the region is not a file of this user's, mode 0600, one link, of a message's size")
        if not hmac.compare_digest(os.pread(fd, _NONCE, 0), nonce):
            raise ValueError("the region does not hold the nonce the request names")
        named = os.stat(path, follow_symlinks=False)
        if (named.st_dev, named.st_ino) == (st.st_dev, st.st_ino):  # (still the file opened: unlink its name)
            _unlink(path)
        return region
    except OSError as e:
        region.close()
        raise ValueError(f"cannot use the region ({e.strerror})") from None
    except BaseException:
        region.close()
        raise


# ------------------------------------------------------------------- server
class _Context:
    """What a handler asks of its call (the part of ``grpc.ServicerContext`` tfdist's handlers use)."""

    __slots__ = ("_deadline", "_sock", "_peer")

    def __init__(self, deadline: float | None, sock: socket.socket, peer: "_Peer"):
        self._deadline, self._sock, self._peer = deadline, sock, peer

    def time_remaining(self) -> float | None:
        return None if self._deadline is None else max(self._deadline - time.monotonic(), 0.0)

    def is_active(self) -> bool:
        """False once the caller closed the connection (it gave up: deadline, or it died)."""
        try:
            return self._sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) != b""
        except BlockingIOError:
            return True
        except OSError:
            return False

    def connection_cpu_s(self) -> float:
        """CPU seconds the requests that read this spent on this connection's thread, not yet reported.

        A stream connection has a thread of its own for its whole life, so
        its thread's CPU clock tells what serving a request cost the
        server. The figure covers the requests that call this (a PS task's
        ``PushPull``): this one's reading, decoding and handling up to now,
        and the rest of the previous such requests (encoding and sending
        their replies); other requests on the connection (pulls, lookups)
        are not in it. gRPC's contexts have no such method: a pool thread
        serves many connections.
        """
        return self._peer.report(time.thread_time())


class _Peer:
    """What the server knows of one connection."""

    __slots__ = ("proven", "region", "_started", "_reported_at", "_unreported")

    def __init__(self):
        #: The largest request body this connection delivered whole over the socket (see _recv_exact).
        self.proven = 0
        #: The connection's shared-memory region, once its client attached one.
        self.region: _Region | None = None
        # CPU accounting of the requests that report it (see _Context.connection_cpu_s), on the serving
        # thread's clock: when the request in hand began, when it reported (None: it did not), and what
        # reporting requests spent after their report (their replies' encoding and sending).
        self._started = 0.0
        self._reported_at: float | None = None
        self._unreported = 0.0

    def begin(self, now: float) -> None:
        """A request begins (its frame is awaited)."""
        self._started = now

    def report(self, now: float) -> float:
        """The request in hand reports: what it spent so far, plus what earlier reporting requests spent after
        reporting."""
        spent = self._unreported + max(now - self._started, 0.0)
        self._unreported, self._reported_at = 0.0, now
        return spent

    def settle(self, now: float) -> None:
        """The request in hand is answered: if it reported, what it spent since counts in the next report."""
        if self._reported_at is not None:
            self._unreported += max(now - self._reported_at, 0.0)
            self._reported_at = None


class StreamService:
    """Serves wire-message handlers over plain TCP connections (see the module's docstring).

    Args:
        handlers: Method name → ``handler(meta, tensors, context)`` returning
            ``(meta, tensors)`` or already-encoded bytes.
        what: What the server is, for messages ("parameter server ps:0").
        token: The job token every connection must present; ``None``: no check.
        how_to_fix_token: Where a client gets the token, for the refusal message.
        host: Interface to bind (``"[::]"``/``"0.0.0.0"``: every interface).
        max_message_bytes: Largest request accepted.
        errors: Extra ``(exception type, grpc.StatusCode)`` pairs, as for
            :class:`~tfdist.grpc_service.WireService`.
        on_malformed: Called with the method name when a request is not a
            valid wire message.
        max_connections: Connections served at once (a thread each).
        hello_timeout_s: How long a new connection has to authenticate.
        port: The port to listen on; ``0`` (the default): a free one.

    Raises:
        OSError: ``port`` is taken (another process listens on it).
    """

    def __init__(self, handlers: Mapping[str, Callable], *, what: str, token: str | None, how_to_fix_token: str,
                 host: str = "127.0.0.1", max_message_bytes: int,
                 errors: Sequence[tuple[type, grpc.StatusCode]] = (),
                 on_malformed: Callable[[str], None] | None = None, max_connections: int = 64,
                 hello_timeout_s: float = 10.0, port: int = 0):
        if _ATTACH in handlers:
            raise ValueError(f"{_ATTACH} is the stream layer's own method, not a handler's")
        self.what = what
        self._handlers = dict(handlers)
        #: Requests whose body came through a connection's shared-memory region (for tests and statistics).
        self.mapped_requests = 0
        self._token = token.encode() if token else None
        self._how_to_fix_token = how_to_fix_token
        self._max_message_bytes = int(max_message_bytes)
        self._errors = tuple(errors)
        self._on_malformed = on_malformed
        self._max_connections = int(max_connections)
        self._hello_timeout_s = float(hello_timeout_s)
        self._listener = _listen(host, port)
        self.port = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._connections: set[socket.socket] = set()
        self._busy = 0
        self._idle = threading.Condition(self._lock)
        self._stopped = threading.Event()
        self._accept_thread: threading.Thread | None = None

    def start(self) -> None:
        self._accept_thread = threading.Thread(target=self._accept_loop, name="tfdist-stream-accept", daemon=True)
        self._accept_thread.start()

    def stop(self, grace: float | None = 1.0) -> None:
        """Stops accepting; calls being handled get ``grace`` seconds, then every connection is closed."""
        if self._stopped.is_set():
            return
        self._stopped.set()
        try:
            self._listener.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._listener.close()
        deadline = time.monotonic() + (grace or 0.0)
        with self._lock:
            while self._busy and time.monotonic() < deadline:
                self._idle.wait(max(deadline - time.monotonic(), 0.0))
            connections = list(self._connections)
        for conn in connections:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    # --------------------------------------------------------------- serving
    def _accept_loop(self) -> None:
        while not self._stopped.is_set():
            try:
                conn, _ = self._listener.accept()
            except OSError:
                if self._stopped.is_set():
                    return
                time.sleep(0.05)  # (EMFILE and the like: try again, not in a tight loop)
                continue
            with self._lock:
                full = len(self._connections) >= self._max_connections
                if not full:
                    self._connections.add(conn)
            if full:
                logger.warning("%s: %d stream connections already open; refusing another", self.what,
                               self._max_connections)
                conn.close()
                continue
            threading.Thread(target=self._serve, args=(conn,), name="tfdist-stream", daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        peer = _Peer()
        try:
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn.settimeout(self._hello_timeout_s)
            if not self._hello(conn):
                return
            conn.settimeout(None)
            while not self._stopped.is_set():
                if not self._one_call(conn, peer):
                    return
        except (OSError, ConnectionError):  # the caller went away (or the server is stopping)
            pass
        finally:
            with self._lock:
                self._connections.discard(conn)
            conn.close()
            if peer.region is not None:
                peer.region.close()

    def _hello(self, conn: socket.socket) -> bool:
        head = _recv_exact(conn, _HELLO.size)
        if head is None:
            return False
        magic, version, token_len = _HELLO.unpack(head)
        if magic != b"TFDH" or version != VERSION or token_len > _MAX_TOKEN:
            self._ack(conn, grpc.StatusCode.FAILED_PRECONDITION,
                      f"{self.what}: not a tfdist stream hello of version {VERSION} (is the client the same "
                      "tfdist version?)")
            return False
        presented = bytes(_recv_exact(conn, token_len) or b"") if token_len else None
        if self._token is not None:
            if presented is None:
                self._ack(conn, grpc.StatusCode.UNAUTHENTICATED, f"No job token presented to {self.what}. Every "
                          f"client must send the job's token: {self._how_to_fix_token}.")
                return False
            if not hmac.compare_digest(presented, self._token):
                self._ack(conn, grpc.StatusCode.UNAUTHENTICATED,
                          f"Wrong job token for {self.what}. {self._how_to_fix_token}.")
                return False
        self._ack(conn, None, "")
        return True

    @staticmethod
    def _ack(conn: socket.socket, code: grpc.StatusCode | None, message: str) -> None:
        text = message.encode("utf-8", "replace")
        _send_all(conn, [_HELLO_ACK.pack(b"TFDA", 0 if code is None else code.value[0], len(text)), text])

    def _one_call(self, conn: socket.socket, peer: _Peer) -> bool:
        """Reads, handles and answers one request; False when the connection is done."""
        peer.begin(time.thread_time())
        head = _recv_exact(conn, _REQUEST.size)
        if head is None:
            return False
        magic, method_len, timeout, body_len = _REQUEST.unpack(head)
        mapped = magic == _REQUEST_MAPPED and peer.region is not None  # (the body is in the region, not here)
        if not (magic == b"TFDQ" or mapped) or method_len > _MAX_METHOD or not timeout >= 0:
            _send_all(conn, _status_frame(grpc.StatusCode.INVALID_ARGUMENT,
                                          f"{self.what}: not a tfdist stream request frame"))
            return False
        method = bytes(_recv_exact(conn, method_len) or b"").decode("ascii", "replace")
        if method == _ATTACH and not mapped:
            return self._attach(conn, peer, body_len)
        handler = self._handlers.get(method)
        on_socket = 0 if mapped else body_len  # what a refusal drains
        if handler is None:
            return self._refuse(conn, on_socket, grpc.StatusCode.UNIMPLEMENTED,
                                f"{self.what} has no method {method!r}")
        if body_len > self._max_message_bytes:
            return self._refuse(conn, on_socket, grpc.StatusCode.RESOURCE_EXHAUSTED,
                                f"Received message larger than max ({body_len} vs. {self._max_message_bytes})")
        if mapped:
            body = peer.region.read(body_len)  # (a private copy, as from the socket)
            if body is None:
                return self._refuse(conn, 0, grpc.StatusCode.INVALID_ARGUMENT,
                                    f"{self.what}: a request body of {body_len} bytes beyond its shared-memory region")
        else:
            body = _recv_exact(conn, body_len, peer.proven) if body_len else bytearray()
            if body is None:
                return False
        deadline = time.monotonic() + timeout if timeout > 0 else None
        with self._lock:
            self._busy += 1
            self.mapped_requests += int(mapped)
        try:
            frame = self._handle(method, handler, body, _Context(deadline, conn, peer))
        finally:
            with self._lock:
                self._busy -= 1
                self._idle.notify_all()
        self._reply(conn, peer, frame)
        peer.settle(time.thread_time())
        if not mapped:
            peer.proven = max(peer.proven, body_len)
        return True

    @staticmethod
    def _reply(conn: socket.socket, peer: _Peer, frame: list) -> None:
        """Sends a reply frame; an accepted reply's large body through the region when the connection has one."""
        region = peer.region
        if region is not None:
            magic, status, length = _REPLY.unpack(frame[0])
            if status == 0 and length >= SHARED_MEMORY_MIN_BODY and region.write(frame[1:], length):
                _send_all(conn, [_REPLY.pack(_REPLY_MAPPED, 0, length)])
                return
        _send_all(conn, frame)

    def _attach(self, conn: socket.socket, peer: _Peer, body_len: int) -> bool:
        """The stream layer's own request: map the client's shared-memory region (see the module's docstring).

        A refusal is a status reply on a connection that goes on as before
        (its body, at most a name and a nonce, was read whole).
        """
        if body_len > _MAX_ATTACH_BODY:
            return self._refuse(conn, body_len, grpc.StatusCode.INVALID_ARGUMENT,
                                f"{self.what}: a shared-memory attach of {body_len} bytes")
        body = _recv_exact(conn, body_len) if body_len else bytearray()
        if body is None:
            return False
        try:
            if peer.region is not None:
                raise ValueError("this connection already has a shared-memory region")
            peer.region = _open_region(body)
        except ValueError as e:
            _send_all(conn, _status_frame(grpc.StatusCode.FAILED_PRECONDITION, f"{self.what}: {e}"))
            return True
        _send_all(conn, [_REPLY.pack(b"TFDR", 0, 0)])
        return True

    def _refuse(self, conn: socket.socket, body_len: int, code: grpc.StatusCode, details: str) -> bool:
        """Answers a request refused before its body is read, then closes the connection.

        The body is read into a small scratch buffer and dropped (for at most
        :data:`_DRAIN_S`) so that the client, still sending it, reads the
        refusal instead of a reset connection. Returns False (the connection is done).
        """
        _send_all(conn, _status_frame(code, details))
        scratch = memoryview(bytearray(1 << 16))
        deadline = time.monotonic() + _DRAIN_S
        try:
            while body_len > 0 and time.monotonic() < deadline:
                conn.settimeout(max(deadline - time.monotonic(), 1e-3))
                k = conn.recv_into(scratch[:min(body_len, len(scratch))])
                if k == 0:
                    break
                body_len -= k
        except OSError:
            pass
        return False

    def _handle(self, name: str, handler: Callable, body: bytearray, context: _Context) -> list:
        try:
            meta, tensors = wire.decode(body)
            result = handler(meta, tensors, context)
            chunks = [result] if isinstance(result, bytes) else wire.encode_chunks(*result)
        except WireFormatError as e:
            if self._on_malformed is not None:
                self._on_malformed(name)
            return _status_frame(grpc.StatusCode.INVALID_ARGUMENT, f"{name}: {e}")
        except Exception as e:  # noqa: BLE001 -- every failure becomes a status the caller can read
            return _status_frame(*error_status(self.what, name, e, self._errors))
        return [_REPLY.pack(b"TFDR", 0, sum(len(c) for c in chunks)), *chunks]


def _listen(host: str, port: int = 0) -> socket.socket:
    """A listening TCP socket on ``host`` and ``port`` (0: a free one); ``[::]``/``0.0.0.0``/``""``: every interface.

    A fixed port is bound with ``SO_REUSEADDR``: a task restarted at once
    binds it again while its predecessor's connections linger in TIME_WAIT
    (another process listening on it still fails the bind).
    """

    def bound(family: int, address: tuple) -> socket.socket:
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            if family == socket.AF_INET6 and address[0] == "::":
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
            if port:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(address)
        except BaseException:
            sock.close()
            raise
        return sock

    host = host.strip("[]")
    if host in ("", "::", "0.0.0.0"):
        try:
            sock = bound(socket.AF_INET6, ("::", port))
        except OSError as e:  # no IPv6 here (a taken port is taken for IPv4 too: the bind below says so)
            if port and e.errno == errno.EADDRINUSE:
                raise
            sock = bound(socket.AF_INET, ("0.0.0.0", port))
    else:
        sock = bound(socket.AF_INET6 if ":" in host else socket.AF_INET, (host, port))
    sock.listen(64)
    return sock


# ------------------------------------------------------------------- client
class StreamConnection:
    """One authenticated connection to a :class:`StreamService`; one call at a time.

    Raises (from the constructor and :meth:`call`): ``OSError`` (and its
    ``ConnectionError``/``TimeoutError``) when the connection fails;
    :class:`StreamStatusError` when the server refuses the hello or a call.
    After any exception the connection is closed and must not be used again.
    """

    def __init__(self, host: str, port: int, token: str | None, timeout: float, max_message_bytes: int,
                 shared_memory: bool = True):
        self._max_message_bytes = int(max_message_bytes)
        #: The largest reply body the server delivered whole over the socket (see _recv_exact).
        self._proven = 0
        #: The shared-memory region large bodies travel through (a server on this host), else None.
        self._region: _Region | None = None
        self.closed = False
        secret = token.encode() if token else b""
        deadline = time.monotonic() + timeout  # (the hello, the attach and a second hello share it)
        self._sock = self._open(host, port, secret, timeout)
        if shared_memory and _same_host(self._sock):
            try:
                self._sock.settimeout(max(deadline - time.monotonic(), 1e-3))
                kept = self._attach()
                if not kept:  # the server closes the connection after such a refusal: a new one, without
                    self._sock.close()
                    self._sock = self._open(host, port, secret, max(deadline - time.monotonic(), 1e-3))
            except BaseException:
                self.close()
                raise

    def _open(self, host: str, port: int, secret: bytes, timeout: float) -> socket.socket:
        """A connected socket past the hello."""
        sock = socket.create_connection((host.strip("[]"), port), timeout=timeout)
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            _send_all(sock, [_HELLO.pack(b"TFDH", VERSION, len(secret)), secret])
            magic, status, length = _HELLO_ACK.unpack(_recv_whole(sock, _HELLO_ACK.size))
            if magic != b"TFDA" or length > 1 << 16:
                raise ConnectionError("not a tfdist stream service")
            message = bytes(_recv_whole(sock, length)).decode("utf-8", "replace") if length else ""
            if status:
                raise StreamStatusError(_STATUS_BY_NUMBER.get(status, grpc.StatusCode.UNKNOWN), message)
        except BaseException:
            self.closed = True
            sock.close()
            raise
        return sock

    @property
    def shared_memory(self) -> bool:
        """Whether large bodies travel through a shared-memory region (see the module's docstring)."""
        return self._region is not None

    def _attach(self) -> bool:
        """Offers the server a shared-memory region; keeps it if the server attached it (else the socket only).

        Returns False when the server refused it otherwise than as a region it cannot use (e.g. as an unknown
        method: a tfdist without shared memory), a refusal after which the server closes the connection.
        """
        made = _new_region()
        if made is None:
            return True
        region, name, nonce = made
        try:
            _send_all(self._sock, self._request(_ATTACH, [nonce + name.encode("ascii")], None))  # (on the socket)
            magic, status, length = _REPLY.unpack(self._recv(_REPLY.size))
            if magic != b"TFDR" or length > 1 << 16:
                raise ConnectionError("the server's reply is not a tfdist stream frame")
            text = bytes(self._recv(length)).decode("utf-8", "replace") if length else ""
        except BaseException:
            region.close()
            raise
        finally:
            _unlink(os.path.join(_SHM_DIR, name))
        if status:
            logger.debug("no shared memory with the stream server (%s): message bodies go over the socket", text)
            region.close()
            return status == grpc.StatusCode.FAILED_PRECONDITION.value[0]
        self._region = region
        return True

    def _request(self, method: str, chunks: Sequence[bytes | memoryview], timeout: float | None) -> list:
        """A request's buffers to send: its frame, and its body unless the body went into the region."""
        name = method.encode("ascii")
        length = sum(len(c) for c in chunks)
        region = self._region
        if (region is not None and SHARED_MEMORY_MIN_BODY <= length <= self._max_message_bytes
                and region.write(chunks, length)):
            return [_REQUEST.pack(_REQUEST_MAPPED, len(name), float(timeout or 0.0), length), name]
        return [_REQUEST.pack(b"TFDQ", len(name), float(timeout or 0.0), length), name, *chunks]

    def _mapped_reply(self, length: int) -> bytearray:
        """The body of a ``TFDN`` reply: copied out of the region."""
        body = self._region.read(length) if self._region is not None else None
        if body is None:
            raise ConnectionError("the server's reply is not a tfdist stream frame")
        return body

    def _recv(self, n: int) -> bytearray:
        return _recv_whole(self._sock, n)

    def call(self, method: str, chunks: Sequence[bytes | memoryview], timeout: float | None) -> bytearray:
        """Sends one request (the chunks of a wire message) and returns the reply's body."""
        self.send(method, chunks, timeout)
        return self.receive(timeout)

    def send(self, method: str, chunks: Sequence[bytes | memoryview], timeout: float | None) -> None:
        """The first half of :meth:`call`: sends the request; :meth:`receive` reads its reply.

        Between the two, the caller may send to other servers (one thread
        calling several tasks at once: each works on its request meanwhile).
        """
        try:
            self._sock.settimeout(timeout)
            _send_all(self._sock, self._request(method, chunks, timeout))
        except BaseException:
            self.close()
            raise

    def receive(self, timeout: float | None) -> bytearray:
        """The second half of :meth:`call`: the reply's body to the request :meth:`send` sent."""
        try:
            self._sock.settimeout(timeout)
            magic, status, length = _REPLY.unpack(self._recv(_REPLY.size))
            if length > max(self._max_message_bytes, 1 << 20):
                raise ConnectionError("the server's reply is not a tfdist stream frame")
            if magic == _REPLY_MAPPED and not status:
                return self._mapped_reply(length)
            if magic != b"TFDR":
                raise ConnectionError("the server's reply is not a tfdist stream frame")
            body = _recv_exact(self._sock, length, self._proven) if length else bytearray()
            if body is None:
                raise ConnectionError("the server closed the connection")
        except BaseException:
            self.close()
            raise
        if status:
            self.close()  # (the server may close after a refusal: never reuse the connection)
            raise StreamStatusError(_STATUS_BY_NUMBER.get(status, grpc.StatusCode.UNKNOWN),
                                    bytes(body).decode("utf-8", "replace"))
        self._proven = max(self._proven, length)
        return body

    def _begin(self, method: str, chunks: Sequence[bytes | memoryview], timeout: float | None) -> list[memoryview]:
        """The bytes of a request as buffers for :func:`call_many` (which sends them without blocking)."""
        return [memoryview(c).cast("B") for c in self._request(method, chunks, timeout) if len(c)]

    def stale(self) -> bool:
        """Whether the server closed this idle connection (it stopped, died or restarted): not to be used."""
        if self.closed:
            return True
        try:
            self._sock.settimeout(0)  # (with a timeout, Python would wait for data before the peek)
            self._sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
        except BlockingIOError:
            return False  # open, nothing to read: as an idle connection should be
        except OSError:
            pass
        self.close()  # closed by the server (b""), reset, or bytes nobody asked for
        return True

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._sock.close()
            if self._region is not None:
                self._region.close()
                self._region = None


class _Call:
    """One request of :func:`call_many` in flight: what is left to send, and the reply read so far.

    :meth:`send` and :meth:`receive` each make one system call's worth of
    progress at a time and stop at the first short one (the socket's buffer
    is full, or empty): the caller waits in ``poll`` for the next event.
    """

    __slots__ = ("body", "conn", "got", "head", "length", "out", "outcome", "status")

    def __init__(self, conn: StreamConnection, out: list[memoryview]):
        self.conn, self.out = conn, out
        self.head, self.body, self.got, self.length, self.status = bytearray(_REPLY.size), None, 0, 0, 0
        self.outcome: bytearray | BaseException | None = None

    def send(self) -> None:
        """Sends what the socket takes now."""
        while self.out:
            batch = self.out[:_MAX_IOV]
            try:
                sent = self.conn._sock.sendmsg(batch)
            except BlockingIOError:
                return
            full = sent == sum(len(b) for b in batch)
            _consume(self.out, sent)
            if not full:  # the socket's buffer is full: wait for POLLOUT
                return

    def receive(self) -> None:
        """Reads what has arrived; sets :attr:`outcome` once the reply is whole.

        Raises what :meth:`StreamConnection.receive` raises (the caller closes the connection).
        """
        while self.outcome is None:
            target = self.head if self.body is None else self.body
            need = _REPLY.size if self.body is None else self.length
            if self.got < need:
                if self.got == len(target):  # (the body's buffer grows as its bytes arrive, as _recv_exact's)
                    target.extend(bytes(min(len(target), need - len(target))))
                want = len(target) - self.got
                try:
                    with memoryview(target) as view:
                        k = self.conn._sock.recv_into(view[self.got:])
                except BlockingIOError:
                    return
                if k == 0:
                    raise ConnectionError("the server closed the connection during its reply")
                self.got += k
                if k < want:  # all there was: wait for POLLIN
                    return
                continue
            if self.body is None:  # the frame's head is whole: its body next
                magic, self.status, length = _REPLY.unpack(self.head)
                if length > max(self.conn._max_message_bytes, 1 << 20):
                    raise ConnectionError("the server's reply is not a tfdist stream frame")
                if magic == _REPLY_MAPPED and not self.status:
                    self.outcome = self.conn._mapped_reply(length)
                    return
                if magic != b"TFDR":
                    raise ConnectionError("the server's reply is not a tfdist stream frame")
                first = max(_FIRST_BUFFER, self.conn._proven)  # (as _recv_exact)
                self.body, self.got, self.length = bytearray(min(length, first)), 0, length
                continue
            if self.status:
                raise StreamStatusError(_STATUS_BY_NUMBER.get(self.status, grpc.StatusCode.UNKNOWN),
                                        bytes(self.body).decode("utf-8", "replace"))
            self.conn._proven = max(self.conn._proven, self.length)
            self.outcome = self.body

    def step(self, events: int) -> None:
        """Progress on what ``poll`` reported; on failure, closes the connection and keeps the error."""
        try:
            if events & select.POLLOUT and self.out:
                self.send()
            if events & (select.POLLIN | select.POLLERR | select.POLLHUP):
                self.receive()
        except Exception as e:  # noqa: BLE001 (the call's outcome: OSError, StreamStatusError)
            self.conn.close()
            self.outcome = e


def call_many(calls: Sequence[tuple[StreamConnection, str, Sequence[bytes | memoryview]]], deadline: float
              ) -> list[bytearray | BaseException]:
    """Several calls at once from this thread, each on its own connection: the reply bodies (or what failed).

    Every socket is written while it takes bytes and read while it has
    some (``poll`` says which), so one server's reply is read while the
    requests to the others are still being sent: on a slow link the
    downlink does not wait for the other uploads (sending every request
    first, then reading each reply, keeps the receive window small and the
    downlink idle). A call that fails (the connection lost, a refusal,
    ``deadline`` passed) closes its connection and is returned as its
    exception (``OSError``, ``TimeoutError``, :class:`StreamStatusError`);
    the others go on.
    """
    outcomes: list[bytearray | BaseException | None] = [None] * len(calls)
    pending: dict[int, tuple[int, _Call]] = {}  # fd -> (index, call)
    poller = select.poll()
    try:
        for i, (conn, method, chunks) in enumerate(calls):
            try:
                out = conn._begin(method, chunks, max(deadline - time.monotonic(), 1e-3))
                conn._sock.settimeout(0)  # non-blocking: an EAGAIN returns at once (no poll before each call)
            except Exception as e:  # noqa: BLE001 (the call's outcome)
                conn.close()
                outcomes[i] = e
                continue
            call = _Call(conn, out)
            call.step(select.POLLOUT)  # as much of the request as the socket takes now
            if call.outcome is not None:
                outcomes[i] = call.outcome
                continue
            fd = conn._sock.fileno()
            pending[fd] = (i, call)
            poller.register(fd, select.POLLIN | (select.POLLOUT if call.out else 0))
        while pending:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                for i, call in pending.values():
                    call.conn.close()
                    outcomes[i] = TimeoutError("timed out: the call's deadline passed")
                pending.clear()
                break
            for fd, events in poller.poll(max(1, math.ceil(remaining * 1000))):
                i, call = pending[fd]
                sending = bool(call.out)
                call.step(events)
                if call.outcome is not None:
                    outcomes[i] = call.outcome
                    del pending[fd]
                    poller.unregister(fd)
                elif sending and not call.out:  # the request went out whole: its reply only
                    poller.modify(fd, select.POLLIN)
    finally:
        for _, call in pending.values():  # (interrupted: these replies are unread, the connections cannot be reused)
            call.conn.close()
    return outcomes
