"""Worker-side gRPC client of the parameter-server tasks.

Calls to different PS tasks run in parallel (one gRPC future each); every
call has a deadline, and a failure becomes a tfdist error that names the
task, its address and the setting that controls the timeout.
"""

from __future__ import annotations

import logging
from typing import Any, Mapping, Sequence

import grpc
import numpy as np

from tfdist import constants
from tfdist.auth import token_metadata
from tfdist.errors import AuthError, PSRejectedError, PSUnavailableError
from tfdist.ps import wire
from tfdist.ps.server import METHODS as _METHODS
from tfdist.ps.server import SERVICE

__all__ = ["PSClient"]

logger = logging.getLogger(__name__)

Request = tuple[Mapping[str, Any], Mapping[str, np.ndarray]]
Response = tuple[dict[str, Any], dict[str, np.ndarray]]

_UNAVAILABLE = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED)


class PSClient:
    """Talks to every PS task of a job.

    Args:
        addresses: ``host:port`` of PS task 0, 1, ...
        token: The job token sent with every call.
        rpc_timeout_s: Deadline of each call (setting ``ps.rpc_timeout_s``).
        max_message_bytes: Largest message sent or received.
        tls_ca: Path of a PEM root certificate: use TLS and verify the PS.
    """

    def __init__(
        self,
        addresses: Sequence[str],
        token: str | None,
        rpc_timeout_s: float = constants.DEFAULT_RPC_TIMEOUT_S,
        max_message_bytes: int = constants.DEFAULT_MAX_MESSAGE_BYTES,
        tls_ca: str | None = None,
    ):
        self.addresses = list(addresses)
        self.rpc_timeout_s = rpc_timeout_s
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

    @property
    def num_ps(self) -> int:
        return len(self.addresses)

    def wait_ready(self, timeout: float) -> None:
        """Waits until every PS task accepts connections.

        Raises:
            PSUnavailableError: a task did not answer within ``timeout`` s.
        """
        pending = [(i, grpc.channel_ready_future(ch)) for i, ch in enumerate(self._channels)]
        for i, fut in pending:
            try:
                fut.result(timeout=timeout)
            except grpc.FutureTimeoutError:
                for _, other in pending:
                    other.cancel()
                raise PSUnavailableError(
                    f"Could not reach parameter server ps:{i} at {self.addresses[i]} within "
                    f"{timeout:g} s (setting ps.startup_timeout_s). Is the PS task running and "
                    "is the address right?"
                ) from None

    def call(self, ps: int, method: str, meta: Mapping[str, Any], tensors=None, timeout: float | None = None) -> Response:
        """One call to one PS task."""
        return self.call_many(method, {ps: (meta, tensors or {})}, timeout)[ps]

    def call_many(self, method: str, requests: Mapping[int, Request], timeout: float | None = None) -> dict[int, Response]:
        """The same method on several PS tasks at once; waits for all."""
        timeout = self.rpc_timeout_s if timeout is None else timeout
        futures = {}
        for ps, (meta, tensors) in requests.items():
            payload = wire.encode(meta, tensors)
            futures[ps] = self._stubs[ps][method].future(payload, timeout=timeout, metadata=self._metadata)
        results, first_error = {}, None
        for ps, fut in futures.items():
            try:
                results[ps] = wire.decode(fut.result())
            except grpc.RpcError as e:
                first_error = first_error or self._translate(e, ps, method, timeout)
        if first_error is not None:
            raise first_error
        return results

    def call_all(self, method: str, meta: Mapping[str, Any], timeout: float | None = None) -> dict[int, Response]:
        """The same tensor-less request to every PS task."""
        return self.call_many(method, {i: (meta, {}) for i in range(self.num_ps)}, timeout)

    def _translate(self, e: grpc.RpcError, ps: int, method: str, timeout: float) -> Exception:
        code, details = e.code(), e.details()
        where = f"ps:{ps} at {self.addresses[ps]}"
        if code == grpc.StatusCode.UNAUTHENTICATED:
            return AuthError(f"{details} ({where})")
        if code in _UNAVAILABLE:
            return PSUnavailableError(
                f"{method} to {where} failed: {code.name} ({details}). The call's deadline was "
                f"{timeout:g} s (setting ps.rpc_timeout_s); the PS task may have died or be unreachable."
            )
        return PSRejectedError(f"{details} ({where})")

    def close(self) -> None:
        for ch in self._channels:
            ch.close()

    def __enter__(self) -> "PSClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

