"""Errors raised by tfdist's queue input pipeline (all are ``TfdistError``)."""

from __future__ import annotations

from tfdist.errors import TfdistError

__all__ = [
    "QueueClosedError",
    "QueueTimeoutError",
    "SharedQueueError",
    "SharedQueueUnavailableError",
]


class QueueClosedError(TfdistError):
    """A queue is closed: nothing more can be enqueued, or it has run dry.

    Raised by ``enqueue*`` after ``close()`` (TF1 raised ``CancelledError``)
    and by ``dequeue*`` when the queue is closed and holds too few elements
    (TF1 raised ``OutOfRangeError``). Input pipelines treat it as a clean end
    of data.
    """


class QueueTimeoutError(TfdistError, TimeoutError):
    """A blocking queue call did not complete within its ``timeout``.

    Nothing was removed from the queue. For ``enqueue_many``,
    ``num_enqueued`` says how many leading elements did go in.
    """

    def __init__(self, message: str, num_enqueued: int = 0):
        super().__init__(message)
        self.num_enqueued = num_enqueued

    def __reduce__(self):
        return (type(self), (str(self), self.num_enqueued))


class SharedQueueError(TfdistError):
    """The shared-queue service refused a request (bad spec, producer failed...)."""


class SharedQueueUnavailableError(SharedQueueError):
    """The shared-queue service did not answer within its deadline.

    The message names the address and the setting (``timeout_s``) that expired.
    """
