"""Worker-side gRPC client of the parameter-server tasks.

Calls to different PS tasks run in parallel (the first in the calling
thread, the others on a small pool of threads, each a blocking gRPC call);
every call has a deadline, and a failure becomes a tfdist error that names
the task, its address and the setting that controls the timeout.

The data plane (:data:`~tfdist.ps.protocol.STREAM_METHODS`: pulls, pushes,
row lookups) travels over the PS task's lean transport
(:mod:`tfdist.stream_service`) when the task offers one and the job has no
TLS: a few persistent TCP connections per task, learnt from the task's
``Status`` (over gRPC) and learnt again after a connection is lost (a task
that restarted listens on another port). A task whose stream port cannot be
reached from here is called over gRPC. Every other call uses gRPC.

Blocking calls rather than gRPC futures: grpcio completes a future's
response on its channel-polling thread, which for multi-megabyte messages
costs about twice the client CPU of a blocking call (measured with
grpcio 1.85: 16 MiB echo, 41-45 ms vs 18-22 ms of client CPU per call).
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Mapping, Sequence

import grpc
import numpy as np

from tfdist import constants
from tfdist.auth import token_metadata
from tfdist.errors import (AuthError, JobMismatchError, PSRejectedError, PSUnavailableError, PSWaitTimeoutError,
                           TLSConfigError)
from tfdist import tls, wire
from tfdist.ps import memory
from tfdist.ps.protocol import METHODS as _METHODS
from tfdist.ps.protocol import SERVICE, STREAM_METHODS, StatusRequest, method_of
from tfdist.ps.replies import parse_reply
from tfdist.stream_service import StreamConnection, StreamStatusError
from tfdist.stream_service import call_many as stream_call_many

__all__ = ["PSClient"]

logger = logging.getLogger(__name__)

Request = tuple[Mapping[str, Any], Mapping[str, np.ndarray]]
Response = tuple[dict[str, Any], dict[str, np.ndarray]]

#: While a PS task is not ready, how often a TLS probe looks for a mistake waiting cannot fix.
_TLS_PROBE_EVERY_S = 0.5

_UNAVAILABLE = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED)

#: A task's stream port not learnt yet (see :class:`_StreamRoute`); also what ``_call_stream`` returns for "use gRPC".
_UNKNOWN = object()
_USE_GRPC = object()
#: Idle stream connections kept per PS task.
_MAX_IDLE_STREAMS = 8
#: After a task's stream port could not be reached, how long its calls use gRPC before trying again
#: (doubled after each failed try, up to ``_STREAM_RETRY_MAX_S``).
_STREAM_RETRY_S = 30.0
_STREAM_RETRY_MAX_S = 960.0
#: Bound on connecting to a stream port (a firewall that drops the packets costs this, then gRPC).
_STREAM_CONNECT_S = 2.0


class _StreamRoute:
    """How one PS task's data-plane calls reach it: its stream port and the idle connections to it."""

    def __init__(self):
        self.lock = threading.Lock()
        #: The port (int), ``None`` (none offered, or unreachable until ``retry_at``), or ``_UNKNOWN``.
        self.port: object = _UNKNOWN
        self.retry_at = 0.0
        self.retry_after = _STREAM_RETRY_S
        self.idle: list[StreamConnection] = []

    def take(self) -> StreamConnection | None:
        """An idle connection the server has not closed (a task that stopped or restarted closed them), or None."""
        while True:
            with self.lock:
                conn = self.idle.pop() if self.idle else None
            if conn is None or not conn.stale():
                return conn

    def give_back(self, conn: StreamConnection) -> None:
        with self.lock:
            if len(self.idle) < _MAX_IDLE_STREAMS:
                self.idle.append(conn)
                return
        conn.close()

    def forget(self) -> None:
        """The connection to the task was lost: it may have restarted on another port; idle ones are stale."""
        with self.lock:
            stale, self.idle, self.port = self.idle, [], _UNKNOWN
        for conn in stale:
            conn.close()


class PSClient:
    """Talks to every PS task of a job.

    Args:
        addresses: ``host:port`` of PS task 0, 1, ...
        token: The job token sent with every call.
        rpc_timeout_s: Deadline of each call (setting ``ps.rpc_timeout_s``).
        max_message_bytes: Largest message sent or received.
        tls_ca: Path of a PEM root certificate: use TLS and verify the PS.
        tune_malloc: Apply :func:`tfdist.ps.memory.tune_malloc` to this
            process. Defaults to ``True``.
        stream: Send the data plane over the tasks' lean transport where
            they offer it (never with TLS). Defaults to ``True``
            (setting ``ps.transport``).
        shared_memory: Over that transport, pass large bodies to a task on
            this host through shared memory. Defaults to ``True`` (setting
            ``ps.shared_memory``).
    """

    def __init__(
        self,
        addresses: Sequence[str],
        token: str | None,
        rpc_timeout_s: float = constants.DEFAULT_RPC_TIMEOUT_S,
        max_message_bytes: int = constants.DEFAULT_MAX_MESSAGE_BYTES,
        tls_ca: str | None = None,
        tune_malloc: bool = True,
        stream: bool = True,
        shared_memory: bool = True,
    ):
        if tune_malloc:
            memory.tune_malloc()
        self.addresses = list(addresses)
        self._token = token
        self._max_message_bytes = max_message_bytes
        #: Whether data-plane calls may use the tasks' stream transport (never with TLS).
        self.stream = bool(stream) and not tls_ca
        self._shared_memory = bool(shared_memory)
        self._routes = [_StreamRoute() for _ in self.addresses]
        self.rpc_timeout_s = rpc_timeout_s
        self.tls_ca = tls_ca
        self._metadata = token_metadata(token)
        options = [
            ("grpc.max_receive_message_length", max_message_bytes),
            ("grpc.max_send_message_length", max_message_bytes),
            ("grpc.enable_retries", 0),
        ]
        if tls_ca:
            with open(tls_ca, "rb") as f:
                creds = grpc.ssl_channel_credentials(root_certificates=f.read())
            self._channels = [grpc.secure_channel(a, creds, options=options) for a in self.addresses]
        else:
            self._channels = [grpc.insecure_channel(a, options=options) for a in self.addresses]
        self._stubs = [{m: ch.unary_unary(f"/{SERVICE}/{m}") for m in _METHODS} for ch in self._channels]
        self._pool: ThreadPoolExecutor | None = None
        self._pool_lock = threading.Lock()
        #: CPU seconds the client's own threads spent in calls (the calls to every PS task but the first).
        self.pool_cpu_seconds = 0.0

    @property
    def num_ps(self) -> int:
        return len(self.addresses)

    def wait_ready(self, timeout: float) -> None:
        """Waits until every PS task accepts connections.

        While a task is not ready, a TLS probe (:func:`tfdist.tls.diagnose`,
        one handshake every half second) tells a TLS mistake from a task that
        is not up yet, so a wrong or missing CA fails in about a second.

        Raises:
            TLSConfigError: TLS to a task fails in a way waiting cannot fix.
            PSUnavailableError: a task did not answer within ``timeout`` s.
        """
        deadline = time.monotonic() + timeout
        pending = [(i, grpc.channel_ready_future(ch)) for i, ch in enumerate(self._channels)]
        try:
            for i, fut in pending:
                while True:
                    try:
                        fut.result(timeout=max(0.0, min(_TLS_PROBE_EVERY_S, deadline - time.monotonic())))
                        break
                    except grpc.FutureTimeoutError:
                        pass
                    problem = tls.diagnose(self.addresses[i], self.tls_ca, what=f"parameter server ps:{i}",
                                           timeout=min(2.0, max(0.1, deadline - time.monotonic())))
                    if problem:
                        raise TLSConfigError(problem)
                    if time.monotonic() >= deadline:
                        tls_hint = (f" This client uses TLS (security.tls_ca={self.tls_ca!r}): it may be a "
                                    "TLS/certificate problem. Does the PS serve TLS (security.tls_cert, tls_key), "
                                    "with a certificate signed by that CA for the host it is reached at?"
                                    ) if self.tls_ca else ""
                        raise PSUnavailableError(
                            f"Could not reach parameter server ps:{i} at {self.addresses[i]} within "
                            f"{timeout:g} s (setting ps.startup_timeout_s). Is the PS task running and "
                            f"is the address right?{tls_hint}"
                        ) from None
        except BaseException:
            for _, other in pending:
                other.cancel()
            raise

    def request(self, ps: int, request: Any, timeout: float | None = None) -> Any:
        """Sends one typed request (:mod:`tfdist.ps.protocol`) to one PS task; returns its typed reply
        (:mod:`tfdist.ps.replies`)."""
        return self.request_many({ps: request}, timeout)[ps]

    def request_many(self, requests: Mapping[int, Any], timeout: float | None = None,
                     parallel: bool = True) -> dict[int, Any]:
        """Typed requests of one kind, one per PS task, sent in parallel; their typed replies by task."""
        if not requests:
            return {}
        method = method_of(next(iter(requests.values())))
        raw = self.call_many(method, {ps: r.to_wire() for ps, r in requests.items()}, timeout, parallel=parallel)
        return {ps: parse_reply(method, meta, tensors) for ps, (meta, tensors) in raw.items()}

    def request_all(self, request: Any, timeout: float | None = None, parallel: bool = True) -> dict[int, Any]:
        """The same typed request to every PS task (``parallel``: see :meth:`call_many`)."""
        return self.request_many({ps: request for ps in range(self.num_ps)}, timeout, parallel=parallel)

    def call(self, ps: int, method: str, meta: Mapping[str, Any], tensors=None, timeout: float | None = None) -> Response:
        """One raw call to one PS task (wire form: tests and fuzzers; the library sends typed requests)."""
        return self.call_many(method, {ps: (meta, tensors or {})}, timeout)[ps]

    def call_many(self, method: str, requests: Mapping[int, Request], timeout: float | None = None,
                  parallel: bool = True) -> dict[int, Response]:
        """The same method on several PS tasks; waits for all.

        Args:
            parallel: Call the tasks at once (the first in this thread, the
                others on the client's threads). ``False`` calls them one
                after the other in this thread, which is what works at
                interpreter exit: Python stops ``concurrent.futures`` before
                ``atexit`` hooks run, and a call that finds the pool refusing
                work falls back to this. Defaults to ``True``.
        """
        timeout = self.rpc_timeout_s if timeout is None else timeout
        items = list(requests.items())
        if not items:
            return {}
        if len(items) > 1 and parallel and self.stream and method in STREAM_METHODS:
            outcomes = self._call_many_stream(method, items, timeout)
        else:
            outcomes = self._call_many_threads(method, items, timeout, parallel)
        results, first_error = {}, None
        for ps, _ in items:
            outcome = outcomes[ps]
            if isinstance(outcome, Exception):
                first_error = first_error or outcome
            else:
                results[ps] = outcome
        if first_error is not None:
            raise first_error
        return results

    def _call_many_threads(self, method: str, items, timeout: float, parallel: bool) -> dict:
        """The calls at once: the first in this thread, the others on the client's threads (or one by one)."""
        outcomes: dict[int, Response | Exception] = {}
        pending = []
        inline = items
        if len(items) > 1 and parallel:
            try:
                pool = self._executor()
                for ps, (meta, tensors) in items[1:]:
                    pending.append((ps, pool.submit(self._call_on_pool, ps, method, meta, tensors, timeout)))
            except RuntimeError as e:  # "cannot schedule new futures after interpreter shutdown"
                logger.debug("%s: no call threads (%s); calling the other PS tasks one by one", method, e)
            inline = [items[0], *items[1 + len(pending):]]
        for ps, (meta, tensors) in inline:
            outcomes[ps] = self._call_one(ps, method, meta, tensors, timeout)
        for ps, fut in pending:
            outcomes[ps] = fut.result()
        return outcomes

    def _call_many_stream(self, method: str, items, timeout: float) -> dict:
        """The calls at once from this thread (:func:`tfdist.stream_service.call_many`).

        Every request is sent and every reply read as its socket allows: each
        task works on its request while this thread sends the others, and a
        reply is read while the other requests are still going out (on a slow
        link the downlink does not wait for the uploads). No thread hand-off
        per call. A task reached over gRPC (no stream port, or it cannot be
        reached) is called after the others' replies.
        """
        deadline = time.monotonic() + timeout
        outcomes: dict[int, Response | Exception] = {}
        calls: list[tuple[int, StreamConnection, list]] = []
        by_grpc = []
        try:
            for ps, (meta, tensors) in items:
                chunks = wire.encode_chunks(meta, tensors)  # (one that cannot be encoded raises, as over gRPC)
                conn = self._stream_connection(ps, timeout, deadline)
                if isinstance(conn, StreamConnection):
                    calls.append((ps, conn, chunks))
                elif conn is _USE_GRPC:
                    by_grpc.append((ps, meta, tensors))
                else:
                    outcomes[ps] = conn
        except BaseException:
            for ps, conn, _ in calls:  # (unused: idle as they were)
                self._routes[ps].give_back(conn)
            raise
        replies = stream_call_many([(conn, method, chunks) for _, conn, chunks in calls], deadline)
        for (ps, conn, _), reply in zip(calls, replies):
            if isinstance(reply, BaseException):
                outcomes[ps] = self._stream_error(reply, ps, method, timeout)
            else:
                self._routes[ps].give_back(conn)
                outcomes[ps] = wire.decode(reply)
        for ps, meta, tensors in by_grpc:
            outcomes[ps] = self._call_grpc(ps, method, meta, tensors, timeout)
        return outcomes

    def _call_on_pool(self, ps: int, method: str, meta, tensors, timeout: float) -> Response | Exception:
        """:meth:`_call_one` on one of the client's threads, its CPU counted in :attr:`pool_cpu_seconds`."""
        start = time.thread_time()
        try:
            return self._call_one(ps, method, meta, tensors, timeout)
        finally:
            spent = time.thread_time() - start
            with self._pool_lock:
                self.pool_cpu_seconds += spent

    def _call_one(self, ps: int, method: str, meta, tensors, timeout: float) -> Response | Exception:
        """One blocking call; returns (not raises) its translated error."""
        if self.stream and method in STREAM_METHODS:
            outcome = self._call_stream(ps, method, meta, tensors, timeout)
            if outcome is not _USE_GRPC:
                return outcome
        return self._call_grpc(ps, method, meta, tensors, timeout)

    def _call_grpc(self, ps: int, method: str, meta, tensors, timeout: float) -> Response | Exception:
        payload = wire.encode(meta, tensors)
        try:
            reply = self._stubs[ps][method](payload, timeout=timeout, metadata=self._metadata)
        except grpc.RpcError as e:
            return self._translate(e, ps, method, timeout)
        return wire.decode(reply)

    def _call_stream(self, ps: int, method: str, meta, tensors, timeout: float) -> Response | Exception | object:
        """One call over the task's stream transport; ``_USE_GRPC`` when the task is to be called over gRPC."""
        deadline = time.monotonic() + timeout
        sent = self._stream_send(ps, method, meta, tensors, timeout, deadline)
        if not isinstance(sent, StreamConnection):
            return sent
        return self._stream_receive(ps, method, sent, timeout, deadline)

    def _stream_connection(self, ps: int, timeout: float, deadline: float):
        """An idle stream connection to task ``ps`` (kept or new), or the outcome (a translated error, or
        ``_USE_GRPC``)."""
        conn = self._routes[ps].take()
        return conn if conn is not None else self._connect(ps, deadline, timeout)

    def _stream_send(self, ps: int, method: str, meta, tensors, timeout: float, deadline: float):
        """Sends a request over the task's stream: the connection to read the reply from, or the outcome
        (a translated error, or ``_USE_GRPC``)."""
        chunks = wire.encode_chunks(meta, tensors)  # (a message that cannot be encoded raises, as over gRPC)
        conn = self._stream_connection(ps, timeout, deadline)
        if not isinstance(conn, StreamConnection):
            return conn
        try:
            conn.send(method, chunks, max(deadline - time.monotonic(), 1e-3))
        except (OSError, StreamStatusError) as e:
            return self._stream_error(e, ps, method, timeout)
        return conn

    def _stream_receive(self, ps: int, method: str, conn: StreamConnection, timeout: float, deadline: float
                        ) -> Response | Exception:
        """The reply to what :meth:`_stream_send` sent on ``conn`` (the connection is kept for reuse)."""
        try:
            body = conn.receive(max(deadline - time.monotonic(), 1e-3))
        except (OSError, StreamStatusError) as e:
            return self._stream_error(e, ps, method, timeout)
        self._routes[ps].give_back(conn)
        return wire.decode(body)

    def _stream_error(self, e: BaseException, ps: int, method: str, timeout: float) -> Exception:
        if isinstance(e, StreamStatusError):
            return self._translate_status(e.code, e.details, ps, method, timeout)
        if isinstance(e, (socket.timeout, TimeoutError)):
            return self._translate_status(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded", ps, method, timeout)
        # reset, refused, closed: the task died or restarted (a new port, maybe)
        self._routes[ps].forget()
        return self._translate_status(grpc.StatusCode.UNAVAILABLE, f"stream connection lost: {e}", ps, method, timeout)

    def _connect(self, ps: int, deadline: float, timeout: float) -> StreamConnection | Exception | object:
        """A new stream connection to task ``ps``; its port learnt (again) from ``Status`` when needed."""
        route = self._routes[ps]
        host = self.addresses[ps].rsplit(":", 1)[0]
        for _ in range(2):
            with route.lock:
                port, learnt = route.port, False
                if port is None and time.monotonic() >= route.retry_at:
                    port = route.port = _UNKNOWN
            if port is _UNKNOWN:
                port = self._learn_stream_port(ps, deadline, timeout)
                if isinstance(port, Exception):
                    return port
                with route.lock:
                    route.port, learnt = port, True
            if port is None:
                return _USE_GRPC
            try:
                conn = StreamConnection(host, port, self._token,
                                        max(min(deadline - time.monotonic(), _STREAM_CONNECT_S), 1e-3),
                                        self._max_message_bytes, shared_memory=self._shared_memory)
                route.retry_after = _STREAM_RETRY_S
                return conn
            except StreamStatusError as e:  # refused at the hello (the token)
                return self._translate_status(e.code, e.details, ps, "Hello", timeout)
            except OSError as e:
                if learnt:  # just offered, yet not reachable from here (a firewall?): gRPC for a while
                    logger.warning("ps:%d at %s offers its data plane on port %d, which cannot be reached from here "
                                   "(%s); its calls use gRPC (tried again in %.0f s; set ps.transport: grpc to "
                                   "never try)", ps, self.addresses[ps], port, e, route.retry_after)
                    with route.lock:
                        route.port, route.retry_at = None, time.monotonic() + route.retry_after
                        route.retry_after = min(2 * route.retry_after, _STREAM_RETRY_MAX_S)
                    return _USE_GRPC
                route.forget()  # a port from before: the task may have restarted; learn it again
        return _USE_GRPC

    def forget_streams(self) -> None:
        """Drops every kept stream connection and learnt port (tasks restarted: they listen elsewhere now)."""
        for route in self._routes:
            route.forget()

    def _learn_stream_port(self, ps: int, deadline: float, timeout: float) -> int | None | Exception:
        """The task's stream port from its brief ``Status`` (``None``: it offers none)."""
        meta, tensors = StatusRequest(brief=True).to_wire()
        try:
            reply = self._stubs[ps]["Status"](wire.encode(meta, tensors),
                                              timeout=max(min(deadline - time.monotonic(), 5.0), 1e-3),
                                              metadata=self._metadata)
        except grpc.RpcError as e:
            return self._translate(e, ps, "Status", timeout)
        port = wire.decode(reply)[0].get("stream_port")
        return port if isinstance(port, int) and not isinstance(port, bool) and 0 < port < 65536 else None

    def _executor(self) -> ThreadPoolExecutor:
        with self._pool_lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(max_workers=max(self.num_ps - 1, 1),
                                                thread_name_prefix="tfdist-ps-call")
            return self._pool

    def call_all(self, method: str, meta: Mapping[str, Any], timeout: float | None = None,
                 parallel: bool = True) -> dict[int, Response]:
        """The same tensor-less request to every PS task (``parallel``: see :meth:`call_many`)."""
        return self.call_many(method, {i: (meta, {}) for i in range(self.num_ps)}, timeout, parallel=parallel)

    def _translate(self, e: grpc.RpcError, ps: int, method: str, timeout: float) -> Exception:
        return self._translate_status(e.code(), e.details(), ps, method, timeout)

    def _translate_status(self, code: grpc.StatusCode, details: str | None, ps: int, method: str, timeout: float
                          ) -> Exception:
        """The tfdist error for a call's status (gRPC's, or the stream transport's: the same codes)."""
        where = f"ps:{ps} at {self.addresses[ps]}"
        if code == grpc.StatusCode.UNAUTHENTICATED:
            return AuthError(f"{details} ({where})")
        if code == grpc.StatusCode.RESOURCE_EXHAUSTED and "larger than max" in (details or ""):
            return PSRejectedError(
                f"{method} to {where}: {details}. A message is larger than ps.max_message_bytes allows: raise it "
                "(every task reads it from the job's config), split large variables over the PS tasks "
                "(ps.partition_threshold_bytes), or keep a large embedding on the PS (tfdist.layers.ShardedEmbedding).")
        if code == grpc.StatusCode.FAILED_PRECONDITION and method in ("Init", "WaitInit"):
            return JobMismatchError(
                f"This worker cannot join the job: {details} ({where}). Every task must run the same script with "
                "the same config; fix the difference and start the job again.")
        if code == grpc.StatusCode.ABORTED:  # the server's own bound on a policy wait: the PS is fine
            return PSWaitTimeoutError(f"{details} ({where})")
        if code in _UNAVAILABLE:
            return PSUnavailableError(
                f"{method} to {where} failed: {code.name} ({details}). The call's deadline was "
                f"{timeout:g} s (setting ps.rpc_timeout_s); the PS task may have died or be unreachable."
            )
        return PSRejectedError(f"{details} ({where})")

    def close(self) -> None:
        with self._pool_lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False)
        for route in self._routes:
            route.forget()
        for ch in self._channels:
            ch.close()

    def __enter__(self) -> "PSClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

