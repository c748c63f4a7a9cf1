"""Errors of the collective group (to be merged into ``tfdist.errors``)."""

from __future__ import annotations

from tfdist.errors import TfdistError

__all__ = ["CollectiveError", "CollectiveTimeoutError", "CollectivePeerError", "CollectiveSetupError"]


class CollectiveError(TfdistError):
    """A collective operation across the worker group failed.

    Attributes:
        peers: Worker ids the error names as unreachable (may be empty).
    """

    def __init__(self, message: str, peers: tuple[int, ...] = ()):
        super().__init__(message)
        self.peers = tuple(peers)

    def __reduce__(self):  # picklable with its peers
        return (type(self), (str(self), self.peers))


class CollectiveTimeoutError(CollectiveError):
    """A collective did not complete within its timeout (a peer hangs or is too slow)."""


class CollectivePeerError(CollectiveError):
    """A peer of the group is gone (its process died or its address is unreachable)."""


class CollectiveSetupError(CollectiveError):
    """The group cannot be set up (called too late, bad addresses, ...)."""
