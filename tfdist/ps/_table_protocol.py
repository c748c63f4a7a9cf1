"""The parameter-server protocol's table requests: ``Lookup``, ``PushRows``, ``WriteRows`` (part of :mod:`tfdist.ps.protocol`).

Requests on PS-resident tables (:mod:`tfdist.ps.sparse`), parsed and
validated whole like every request. Import them from :mod:`tfdist.ps.protocol`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tfdist.ps._protocol_fields import (
    MAX_COUNT,
    ProtocolError,
    short,
    _Fields,
    _row_ids,
    _also_tables,
    _check_key,
    MAX_INCARNATION,
)


@dataclass(frozen=True)
class LookupRequest:
    """Rows of a PS-resident table (this task's shard; ``rows`` are local row indices, int64).

    ``clock`` (update path): the step the worker is about to start, as for a
    ``Pull`` (SSP may make it wait). ``worker`` -1: an evaluator's read.
    ``also``: more tables read at the same rows in the same request (a wide
    and a deep table looked up by the same ids), distinct, not ``key``.
    Reply: ``version``; tensor ``values`` (one row per requested index, in
    order) and ``values.<i>`` for ``also[i - 1]``.
    """

    worker: int
    key: str
    rows: np.ndarray = field(repr=False)
    clock: int | None = None
    also: tuple[str, ...] = ()

    def to_wire(self):
        meta: dict[str, Any] = {"worker": self.worker, "key": self.key}
        if self.clock is not None:
            meta["clock"] = self.clock
        if self.also:
            meta["also"] = list(self.also)
        return meta, {"rows": self.rows}

    @classmethod
    def parse(cls, f: _Fields, tensors):
        if set(tensors) != {"rows"}:
            raise ProtocolError(f"Lookup: exactly one tensor, `rows`. Received: {short(sorted(tensors))}.")
        key = _check_key("Lookup", f.get("key"))
        also = _also_tables("Lookup", f, key)
        return cls(f.worker(allow_reader=True), key, _row_ids("Lookup", tensors),
                   f.int("clock", 0, MAX_COUNT, None), also)

    @staticmethod
    def values_name(i: int) -> str:
        """The reply tensor of the ``i``-th table read (0: ``key``; ``i``: ``also[i - 1]``)."""
        return "values" if i == 0 else f"values.{i}"


@dataclass(frozen=True)
class PushRowsRequest:
    """Row gradients of a PS-resident table (``rows`` local int64, ``grads`` one row each; repeats add up).

    Update path: applied at once with the table's optimizer. Gradient path:
    counted towards global step ``step`` (required) with this worker's dense
    gradient, and applied when that step completes. ``learning_rate``: the
    worker's optimizer's current value (schedules); ``None``: the table's.
    ``incarnation`` as for ``Push``. ``also``: more tables' gradients at the
    same rows (tensor ``grads.<i>`` for ``also[i - 1]``), all checked before
    any is applied. Reply: ``applied``, ``dropped``.
    """

    worker: int
    key: str
    rows: np.ndarray = field(repr=False)
    grads: np.ndarray = field(repr=False)
    learning_rate: float | None = None
    step: int | None = None
    incarnation: int | None = None
    also: tuple[str, ...] = ()
    also_grads: tuple[np.ndarray, ...] = field(default=(), repr=False)

    def to_wire(self):
        meta: dict[str, Any] = {"worker": self.worker, "key": self.key}
        for name in ("learning_rate", "step", "incarnation"):
            if getattr(self, name) is not None:
                meta[name] = getattr(self, name)
        tensors = {"rows": self.rows, "grads": self.grads}
        if self.also:
            meta["also"] = list(self.also)
            tensors.update({self.grads_name(i + 1): g for i, g in enumerate(self.also_grads)})
        return meta, tensors

    @staticmethod
    def grads_name(i: int) -> str:
        """The tensor of the ``i``-th table's gradients (0: ``key``; ``i``: ``also[i - 1]``)."""
        return "grads" if i == 0 else f"grads.{i}"

    def tables(self) -> list[tuple[str, np.ndarray]]:
        """(key, gradients) of every table the request names, ``key`` first."""
        return [(self.key, self.grads), *zip(self.also, self.also_grads)]

    @classmethod
    def parse(cls, f: _Fields, tensors):
        key = _check_key("PushRows", f.get("key"))
        also = _also_tables("PushRows", f, key)
        names = [cls.grads_name(i) for i in range(len(also) + 1)]
        if set(tensors) != {"rows", *names}:
            raise ProtocolError(f"PushRows: exactly the tensors `rows` and {', '.join(f'`{n}`' for n in names)}. "
                                f"Received: {short(sorted(tensors))}.")
        rows = _row_ids("PushRows", tensors)
        for name in names:
            grads = tensors[name]
            if grads.ndim != 2 or grads.shape[0] != rows.shape[0]:
                raise ProtocolError(f"PushRows: `{name}` must be 2-D with one row per index: {list(grads.shape)} "
                                    f"for {rows.shape[0]} rows.")
        return cls(f.worker(), key, rows, tensors["grads"],
                   f.number("learning_rate", 0.0, 1e6, None), f.int("step", 0, MAX_COUNT, None),
                   f.int("incarnation", 0, MAX_INCARNATION, None), also,
                   tuple(tensors[name] for name in names[1:]))


@dataclass(frozen=True)
class WriteRowsRequest:
    """Sets rows of a PS-resident table (``rows`` local int64, distinct; ``values`` one float32 row each).

    Loading weights into a table (``load_weights``, ``load_model`` under the
    strategy): the rows take the values, the optimizer's slots are kept.
    ``incarnation`` as for ``Push``. Reply: ``written`` (rows set).
    """

    worker: int
    key: str
    rows: np.ndarray = field(repr=False)
    values: np.ndarray = field(repr=False)
    incarnation: int | None = None

    def to_wire(self):
        meta: dict[str, Any] = {"worker": self.worker, "key": self.key}
        if self.incarnation is not None:
            meta["incarnation"] = self.incarnation
        return meta, {"rows": self.rows, "values": self.values}

    @classmethod
    def parse(cls, f: _Fields, tensors):
        if set(tensors) != {"rows", "values"}:
            raise ProtocolError(f"WriteRows: exactly two tensors, `rows` and `values`. Received: "
                                f"{short(sorted(tensors))}.")
        rows, values = _row_ids("WriteRows", tensors), tensors["values"]
        if values.ndim != 2 or values.shape[0] != rows.shape[0]:
            raise ProtocolError(f"WriteRows: `values` must be 2-D with one row per index: {list(values.shape)} for "
                                f"{rows.shape[0]} rows.")
        if len(np.unique(rows)) != len(rows):
            raise ProtocolError("WriteRows: a row is named twice (which value would it keep?).")
        return cls(f.worker(), _check_key("WriteRows", f.get("key")), rows, values,
                   f.int("incarnation", 0, MAX_INCARNATION, None))
