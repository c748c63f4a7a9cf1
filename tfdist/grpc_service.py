"""One gRPC service skeleton for every tfdist server (parameter servers, the shared queue).

A :class:`WireService` serves named unary methods whose requests and replies
are :mod:`tfdist.wire` messages. It owns what every tfdist server must do
the same way:

* **Authentication before the body.** The job token is checked by a server
  interceptor from the call's metadata, before gRPC reads the request: an
  unauthenticated caller is refused with ``UNAUTHENTICATED`` and never makes
  the server buffer its message beyond the HTTP/2 flow-control window, which
  :data:`SERVER_OPTIONS` keeps at 512 KiB (no BDP probing): a refused request
  costs the server under 1 MB whatever its size. An oversize message is refused by gRPC from
  its length prefix (``RESOURCE_EXHAUSTED``) before it is buffered. An
  authenticated request of ``n`` bytes costs the server about ``2 n`` while
  it is decoded (gRPC's buffer and the Python bytes), bounded by
  ``max_message_bytes``.
* **One error mapping.** Handlers raise exceptions with a ``grpc_code``
  attribute (a ``grpc.StatusCode`` name) or one listed in ``errors``; the
  caller gets that status and the message. A malformed message is
  ``INVALID_ARGUMENT``. Anything else is a bug: logged with its traceback,
  answered ``INTERNAL``.
* Binding (TCP or TLS), start, stop and wait.

Importing this module does not import TensorFlow.
"""

from __future__ import annotations

import hmac
import logging
import threading
from concurrent import futures
from typing import Any, Callable, Mapping, Sequence

import grpc

from tfdist.auth import check_token
from tfdist.constants import AUTH_METADATA_KEY as _TOKEN_KEY
from tfdist.errors import WireFormatError
from tfdist import wire

__all__ = ["WireService", "Handler", "error_status"]

logger = logging.getLogger(__name__)

#: gRPC channel arguments every tfdist server adds to its own. BDP probing off and a 512 KiB flow-control
#: window: gRPC's BDP probing grows the receive window to many MiB, and a call refused for its token has its
#: body buffered up to that window (a 256 MiB unauthenticated request cost the server 4.4 MB, 64 concurrent
#: 16 MiB ones 177-210 MB); with these, 0.8 MB and 12 MB (0.2 MB each), at a cost of a few percent on
#: authenticated 16 MiB pushes and none measurable on 256 KiB ones (benchmarks/unauth_cost.py,
#: docs/benchmarks.md).
SERVER_OPTIONS: list[tuple[str, int]] = [("grpc.http2.bdp_probe", 0), ("grpc.http2.lookahead_bytes", 512 * 1024)]

#: ``handler(meta, tensors, context) -> (meta, tensors) | bytes`` (already-encoded reply).
Handler = Callable[[dict, dict, grpc.ServicerContext], Any]


class _Authenticate(grpc.ServerInterceptor):
    """Refuses calls without the job token before their request body is read."""

    def __init__(self, token: bytes, what: str, how_to_fix: str):
        self._token, self._what, self._how_to_fix = token, what, how_to_fix

    def intercept_service(self, continuation, details):
        presented = None
        for key, value in details.invocation_metadata or ():
            if key == _TOKEN_KEY:
                presented = value.encode() if isinstance(value, str) else value
        if presented is not None and hmac.compare_digest(presented, self._token):
            return continuation(details)
        what, how_to_fix, token = self._what, self._how_to_fix, self._token

        def refuse(request_iterator, context):  # a streaming handler: gRPC does not read the body for it
            check_token(context, token, what, how_to_fix)

        return grpc.stream_unary_rpc_method_handler(refuse)


class WireService:
    """A gRPC server whose methods take and return wire messages.

    Args:
        service: The gRPC service name (``"tfdist.ParameterServer"``).
        handlers: Method name → :data:`Handler`.
        what: What the server is, for messages ("the parameter server").
        token: The job token every call must present; ``None`` disables the
            check (in-process use only).
        how_to_fix_token: Where a client gets the token, for the refusal message.
        host: Interface to bind. ``"[::]"`` serves other machines.
        port: Port; 0 picks a free one.
        max_message_bytes: Largest request and reply.
        max_threads: Server threads (concurrent calls being handled).
        tls_credentials: ``grpc.ServerCredentials`` for TLS, or ``None``.
        errors: Extra ``(exception type, grpc.StatusCode)`` pairs for handler
            exceptions without a ``grpc_code`` attribute.
        on_malformed: Called with the method name when a request is not a
            valid wire message (refused before any handler runs).
    """

    def __init__(
        self,
        service: str,
        handlers: Mapping[str, Handler],
        *,
        what: str,
        token: str | None,
        how_to_fix_token: str,
        host: str = "127.0.0.1",
        port: int = 0,
        max_message_bytes: int,
        max_threads: int = 32,
        tls_credentials: grpc.ServerCredentials | None = None,
        errors: Sequence[tuple[type, grpc.StatusCode]] = (),
        on_malformed: Callable[[str], None] | None = None,
    ):
        self.what = what
        self._on_malformed = on_malformed
        self._errors = tuple(errors)
        self._token = token.encode() if token else None
        self._stopped = threading.Event()
        options = [
            ("grpc.max_receive_message_length", max_message_bytes),
            ("grpc.max_send_message_length", max_message_bytes),
            ("grpc.so_reuseport", 0),
            *SERVER_OPTIONS,
        ]
        interceptors = [_Authenticate(self._token, what, how_to_fix_token)] if self._token else []
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=max_threads), options=options,
                                   interceptors=interceptors)
        method_handlers = {name: grpc.unary_unary_rpc_method_handler(self._wrap(name, fn))
                           for name, fn in handlers.items()}
        self._server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service, method_handlers),))
        bind = f"{host}:{port}"
        self.tls = tls_credentials is not None
        if self.tls:
            self.port = self._server.add_secure_port(bind, tls_credentials)
        else:
            self.port = self._server.add_insecure_port(bind)
        if self.port == 0:
            raise OSError(f"Could not bind {what} to {bind} (is the port in use?).")
        self.host = host
        #: ``host:port`` clients on this machine dial.
        self.address = f"{'127.0.0.1' if host in ('[::]', '0.0.0.0') else host}:{self.port}"

    @property
    def authenticated(self) -> bool:
        return self._token is not None

    @property
    def listen_description(self) -> str:
        """What the server listens on, for log lines (``every interface, port 2222``)."""
        if self.host in ("[::]", "0.0.0.0", ""):
            return f"every interface, port {self.port}{' (TLS)' if self.tls else ''}"
        return f"{self.address}{' (TLS)' if self.tls else ''}"

    def start(self) -> None:
        self._server.start()

    def stop(self, grace: float | None = 1.0) -> threading.Event | None:
        """Stops serving (idempotent); calls in flight get ``grace`` seconds, then are cancelled."""
        if self._stopped.is_set():
            return None
        self._stopped.set()
        return self._server.stop(grace)

    def wait(self, timeout: float | None = None) -> bool:
        """Blocks until the server is stopped; True if it was."""
        return self._stopped.wait(timeout)

    def _wrap(self, name: str, fn: Handler):
        errors = self._errors

        def handler(request: bytes, context: grpc.ServicerContext) -> bytes:
            try:
                meta, tensors = wire.decode(request)
                result = fn(meta, tensors, context)
                return result if isinstance(result, bytes) else wire.encode(*result)
            except WireFormatError as e:
                if self._on_malformed is not None:
                    self._on_malformed(name)
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"{name}: {e}")
            except Exception as e:  # noqa: BLE001 -- every failure becomes a status the caller can read
                context.abort(*error_status(self.what, name, e, errors))

        return handler


def error_status(what: str, name: str, e: Exception, errors: Sequence[tuple[type, grpc.StatusCode]] = ()
                 ) -> tuple[grpc.StatusCode, str]:
    """The status and message a caller gets for a handler's exception (every tfdist transport alike).

    An exception with a ``grpc_code`` attribute (a ``grpc.StatusCode`` name)
    gets that code; one of the ``errors`` types gets its code; anything else
    is a bug: logged with its traceback, answered ``INTERNAL``.
    """
    code = getattr(e, "grpc_code", None)
    if isinstance(code, str):
        return getattr(grpc.StatusCode, code, grpc.StatusCode.UNKNOWN), f"{name}: {e}"
    for kind, status in errors:
        if isinstance(e, kind):
            return status, f"{name}: {e}"
    logger.exception("%s: internal error in %s", what, name)
    return grpc.StatusCode.INTERNAL, f"{name}: internal error in {what} ({type(e).__name__}); see its log."
