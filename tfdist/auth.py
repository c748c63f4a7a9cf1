"""The job token check shared by every tfdist gRPC service (PS, shared queue).

Clients send the token in gRPC metadata under ``tfdist.constants.AUTH_METADATA_KEY``;
servers compare it in constant time and answer ``UNAUTHENTICATED`` with a
message that says how to fix it. The token itself is never logged.
"""

from __future__ import annotations

import hmac

import grpc

from tfdist import constants

__all__ = ["check_token", "token_metadata"]


def token_metadata(token: str | None) -> tuple[tuple[str, str], ...]:
    """gRPC call metadata carrying ``token`` (empty without one)."""
    return ((constants.AUTH_METADATA_KEY, token),) if token else ()


def check_token(context: grpc.ServicerContext, expected: bytes | None, service: str, how_to_fix: str) -> None:
    """Aborts the call unless it carries ``expected`` (no check when ``expected`` is None).

    Args:
        context: The call's servicer context.
        expected: The job token as bytes.
        service: What is refusing, for the message ("the parameter server").
        how_to_fix: Where the client gets the token from, for the message.
    """
    if expected is None:
        return
    presented = None
    for key, value in context.invocation_metadata() or ():
        if key == constants.AUTH_METADATA_KEY:
            presented = value.encode() if isinstance(value, str) else value
    if presented is None:
        context.abort(grpc.StatusCode.UNAUTHENTICATED,
                      f"No job token presented to {service}. Every client must send the job's token: {how_to_fix}.")
    if not hmac.compare_digest(presented, expected):
        context.abort(grpc.StatusCode.UNAUTHENTICATED, f"Wrong job token for {service}. {how_to_fix}.")
