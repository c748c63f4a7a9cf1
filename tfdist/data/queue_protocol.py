"""The shared-queue protocol: one typed request per RPC, parsed and validated whole.

:func:`parse` turns a decoded wire message (``meta``, ``tensors``; see
:mod:`tfdist.wire`) into one of the request dataclasses below, or raises
:class:`QueueProtocolError` (gRPC ``INVALID_ARGUMENT``). Everything that can
be checked without the ledger's state is checked here: field types and
ranges (booleans are not numbers, numbers are finite, ids and counters fit
their ranges, strings and lists are bounded), unknown or missing fields,
tensors where none belong. The ledger (:mod:`tfdist.data.delivery_ledger`)
checks the rest (a producer's failure, the number of workers, an element
that does not match the queue's) before it changes anything, so a refused
request changes nothing, acknowledgements included. This is the parameter
server's rule (:mod:`tfdist.ps.protocol`) applied to the queue service.

Requests go the other way with :meth:`to_wire`; the client
(:class:`~tfdist.data.SharedQueue`) builds the same dataclasses.

Importing this module does not import TensorFlow or gRPC.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np

from tfdist.data.element_spec import STRUCTURES
from tfdist.data.errors import SharedQueueError

__all__ = [
    "SERVICE",
    "METHODS",
    "QueueRequestError",
    "QueueProtocolError",
    "DescribeRequest",
    "DequeueRequest",
    "AckRequest",
    "EnqueueRequest",
    "EndEpochRequest",
    "CloseRequest",
    "StatsRequest",
    "parse",
]

#: gRPC service name of the shared queue.
SERVICE = "tfdist.data.SharedQueue"

#: Longest worker name (the client's default is ``host:pid:random``).
MAX_WORKER_CHARS = 256
#: Largest batch one ``Dequeue`` may ask for.
MAX_BATCH = 1 << 20
#: Largest epoch number, ``after`` or batch id (exact in a float64 and in JSON).
MAX_COUNT = 2**53
#: Most batch ids one request may acknowledge.
MAX_ACKS = 4096
#: Longest wait a request may ask for, in seconds; the server bounds it further (``max_wait_s``).
MAX_WAIT_S = 3600.0
#: Most components an element may have; longest component name.
MAX_COMPONENTS = 256
MAX_NAME_CHARS = 256


class QueueRequestError(SharedQueueError):
    """A request the shared queue refuses; nothing was changed.

    ``grpc_code`` names the gRPC status the server answers with.
    """

    grpc_code = "INVALID_ARGUMENT"

    def __init__(self, message: str, grpc_code: str | None = None):
        super().__init__(message)
        if grpc_code:
            self.grpc_code = grpc_code

    def __reduce__(self):
        return (type(self), (str(self), self.grpc_code))


class QueueProtocolError(QueueRequestError):
    """A malformed request: a field of the wrong type or range, unknown or missing."""


def short(value: Any, limit: int = 80) -> str:
    """``repr(value)`` cut to ``limit`` characters: error messages never echo a whole request."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


_MISSING = object()


class _Fields:
    """Reads a request's ``meta``; every field read is remembered so unknown ones can be refused."""

    def __init__(self, method: str, meta: Any):
        if not isinstance(meta, dict):
            raise QueueProtocolError(f"{method}: the request's meta must be an object. Received: {short(meta)}.")
        self.method = method
        self.meta = meta
        self.read: set[str] = set()

    def _fail(self, name: str, value: Any, want: str) -> QueueProtocolError:
        return QueueProtocolError(f"{self.method}: field `{name}` must be {want}. Received: {name}={short(value)}.")

    def get(self, name: str, default: Any = _MISSING) -> Any:
        self.read.add(name)
        if name not in self.meta:
            if default is _MISSING:
                raise QueueProtocolError(f"{self.method}: required field `{name}` is missing.")
            return default
        return self.meta[name]

    def int(self, name: str, low: int, high: int, default: Any = _MISSING, allow_none: bool = False) -> Any:
        value = self.get(name, default)
        if value is None and allow_none:
            return None
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise self._fail(name, value, f"an integer in [{low}, {high}]" + (" or null" if allow_none else ""))
        return value

    def number(self, name: str, low: float, high: float, default: Any = _MISSING) -> float:
        value = self.get(name, default)
        # Range first: an integer too large for a float (10**400) is refused, not an OverflowError.
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high \
                or not math.isfinite(value):
            raise self._fail(name, value, f"a finite number in [{low:g}, {high:g}]")
        return float(value)

    def text(self, name: str, max_chars: int, default: Any = _MISSING) -> str:
        value = self.get(name, default)
        if not isinstance(value, str) or not 0 < len(value) <= max_chars:
            raise self._fail(name, value, f"a string of 1 to {max_chars} characters")
        return value

    def ids(self, name: str) -> tuple[int, ...]:
        value = self.get(name, [])
        if not isinstance(value, list) or len(value) > MAX_ACKS or any(
                isinstance(i, bool) or not isinstance(i, int) or not 0 <= i <= MAX_COUNT for i in value):
            raise self._fail(name, value, f"a list of at most {MAX_ACKS} batch ids (integers in [0, {MAX_COUNT}])")
        if len(set(value)) != len(value):
            raise QueueProtocolError(f"{self.method}: `{name}` names a batch twice: {short(value)}. Name each once.")
        return tuple(value)

    def finish(self) -> None:
        unknown = sorted(set(self.meta) - self.read)
        if unknown:
            raise QueueProtocolError(
                f"{self.method}: unknown field(s) {short(unknown)}. Are client and server the same tfdist version?"
            )


def _no_tensors(method: str, tensors: Mapping[str, np.ndarray]) -> None:
    if tensors:
        raise QueueProtocolError(f"{method} carries no tensors. Received {len(tensors)}: {short(sorted(tensors)[:4])}.")


# ------------------------------------------------------------------------ requests
@dataclass(frozen=True)
class DescribeRequest:
    """The element structure, waiting up to ``wait_s`` for a first element.

    Reply: ``spec`` (``ElementSpec.to_dict()`` or null), ``queue``, ``capacity``, ``closed``.
    """

    wait_s: float = 0.0

    def to_wire(self):
        return {"wait_s": self.wait_s}, {}

    @classmethod
    def parse(cls, f: _Fields, tensors):
        _no_tensors("Describe", tensors)
        return cls(f.number("wait_s", 0.0, MAX_WAIT_S, 0.0))


@dataclass(frozen=True)
class DequeueRequest:
    """Acknowledge ``acks``, then lease the next batch of up to ``n`` examples.

    ``epoch``: the caller's epoch, or null to join the oldest epoch after
    ``after`` (the last epoch the caller saw end, -1 before the first) that
    is not over. ``wait_s``: how long the server may hold the call waiting
    for data (bounded by its ``max_wait_s``). Reply: ``status`` ("batch",
    "end", "retry"), ``epoch``; with a batch ``batch_id``, ``redelivered``
    and the components as tensors.
    """

    worker: str
    n: int
    epoch: int | None = None
    after: int = -1
    acks: tuple[int, ...] = ()
    wait_s: float = 1.0

    def to_wire(self):
        return {"worker": self.worker, "n": self.n, "epoch": self.epoch, "after": self.after,
                "acks": list(self.acks), "wait_s": self.wait_s}, {}

    @classmethod
    def parse(cls, f: _Fields, tensors):
        _no_tensors("Dequeue", tensors)
        return cls(f.text("worker", MAX_WORKER_CHARS), f.int("n", 1, MAX_BATCH),
                   f.int("epoch", 0, MAX_COUNT, None, allow_none=True), f.int("after", -1, MAX_COUNT, -1),
                   f.ids("acks"), f.number("wait_s", 0.0, MAX_WAIT_S, 1.0))


@dataclass(frozen=True)
class AckRequest:
    """Acknowledge batches (an empty list is a heart-beat). Reply: ``accepted``."""

    worker: str
    acks: tuple[int, ...] = ()

    def to_wire(self):
        return {"worker": self.worker, "acks": list(self.acks)}, {}

    @classmethod
    def parse(cls, f: _Fields, tensors):
        _no_tensors("Ack", tensors)
        return cls(f.text("worker", MAX_WORKER_CHARS), f.ids("acks"))


@dataclass(frozen=True)
class EnqueueRequest:
    """Add a batch of elements to the producing epoch, waiting up to ``wait_s`` for room.

    ``names``: the components in order (tensors of those names, one leading
    batch dimension of at least one row, the same in every component);
    ``structure``: how an element is packed ("tuple", "dict", "single").
    Reply: ``enqueued`` (leading rows that went in; fewer when the queue
    stayed full for ``wait_s``: send the rest again).
    """

    names: tuple[str, ...]
    arrays: tuple[np.ndarray, ...] = field(repr=False)
    structure: str = "tuple"
    wait_s: float = 1.0

    @property
    def rows(self) -> int:
        return int(self.arrays[0].shape[0])

    def element(self) -> Any:
        """The batch as the queue's ``enqueue_many`` takes it."""
        if self.structure == "dict":
            return dict(zip(self.names, self.arrays))
        if self.structure == "single":
            return self.arrays[0]
        return tuple(self.arrays)

    def to_wire(self):
        return ({"names": list(self.names), "structure": self.structure, "wait_s": self.wait_s},
                dict(zip(self.names, self.arrays)))

    @classmethod
    def parse(cls, f: _Fields, tensors):
        names = f.get("names")
        if not isinstance(names, list) or not 0 < len(names) <= MAX_COMPONENTS or any(
                not isinstance(n, str) or not 0 < len(n) <= MAX_NAME_CHARS for n in names):
            raise f._fail("names", names, f"a list of 1 to {MAX_COMPONENTS} component names "
                                          f"(strings of 1 to {MAX_NAME_CHARS} characters)")
        if len(set(names)) != len(names):
            raise QueueProtocolError(f"Enqueue: `names` names a component twice: {short(names)}.")
        structure = f.get("structure", "tuple")
        if not isinstance(structure, str) or structure not in STRUCTURES:
            raise f._fail("structure", structure, f"one of {list(STRUCTURES)}")
        if structure == "single" and len(names) != 1:
            raise QueueProtocolError(f"Enqueue: a 'single' element has one component. Received: names={short(names)}.")
        if set(tensors) != set(names):
            raise QueueProtocolError(
                f"Enqueue: the tensors do not match `names`: missing {short(sorted(set(names) - set(tensors))[:4])}, "
                f"unexpected {short(sorted(set(tensors) - set(names))[:4])}."
            )
        arrays = tuple(tensors[n] for n in names)
        for name, a in zip(names, arrays):
            if a.ndim == 0 or a.shape[0] == 0:
                raise QueueProtocolError(f"Enqueue: component {short(name)} needs a leading batch dimension of at "
                                         f"least one row. Received: shape {list(a.shape)}.")
        rows = {int(a.shape[0]) for a in arrays}
        if len(rows) != 1:
            raise QueueProtocolError(f"Enqueue: every component needs the same leading dimension. Received: "
                                     f"{short([int(a.shape[0]) for a in arrays])}.")
        return cls(tuple(names), arrays, structure, f.number("wait_s", 0.0, MAX_WAIT_S, 1.0))


@dataclass(frozen=True)
class EndEpochRequest:
    """End the producing epoch; later elements go to the next one. Reply: ``ended``."""

    def to_wire(self):
        return {}, {}

    @classmethod
    def parse(cls, f: _Fields, tensors):
        _no_tensors("EndEpoch", tensors)
        return cls()


@dataclass(frozen=True)
class CloseRequest:
    """No more data: the producing epoch is the last. Reply: ``closed``."""

    def to_wire(self):
        return {}, {}

    @classmethod
    def parse(cls, f: _Fields, tensors):
        _no_tensors("Close", tensors)
        return cls()


@dataclass(frozen=True)
class StatsRequest:
    """Per-worker and per-epoch counters (``DeliveryLedger.stats``)."""

    def to_wire(self):
        return {}, {}

    @classmethod
    def parse(cls, f: _Fields, tensors):
        _no_tensors("Stats", tensors)
        return cls()


_REQUESTS = {
    "Describe": DescribeRequest,
    "Dequeue": DequeueRequest,
    "Ack": AckRequest,
    "Enqueue": EnqueueRequest,
    "EndEpoch": EndEpochRequest,
    "Close": CloseRequest,
    "Stats": StatsRequest,
}
METHODS = tuple(_REQUESTS)


def parse(method: str, meta: Any, tensors: Mapping[str, np.ndarray]):
    """Parses one request whole.

    Returns:
        The method's request dataclass, every field checked.

    Raises:
        QueueProtocolError: the method is unknown or a field is malformed, missing or unknown.
    """
    kind = _REQUESTS.get(method)
    if kind is None:
        raise QueueProtocolError(f"Unknown method {short(method)}; the shared queue serves {list(METHODS)}.")
    f = _Fields(method, meta)
    request = kind.parse(f, tensors)
    f.finish()
    return request
