"""Requests on PS-resident tables (``Lookup``, ``PushRows``, ``WriteRows``): one slice of :class:`ParameterStore`.

Mixed into :class:`~tfdist.ps.store.ParameterStore`: the same lock, the same
order (every table a request names is checked before any is read or
changed); the tables themselves are :class:`~tfdist.ps._table_shards.TableShards`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from tfdist.ps._waits import Cancelled, StoreError, never
from tfdist.ps.protocol import LookupRequest, PushRowsRequest, WriteRowsRequest, short
from tfdist.ps.replies import LookupReply, PushRowsReply, WriteRowsReply

__all__ = ["TableRequests"]


class TableRequests:
    """``lookup``, ``push_rows``, ``write_rows``, ``table_arrays`` of :class:`ParameterStore`."""

    def lookup(self, req: LookupRequest, consumer: Callable[[LookupReply], Any],
               timeout: float | None = None, cancelled: Cancelled = never) -> Any:
        """Calls ``consumer(reply)`` (rows as ``values``, ``values.<i>``) once they may be read (update path: SSP's
        rule).

        Every table the request names (``key`` and ``also``) is checked before any is read.
        """
        with self._cond:
            self._require_initialized()
            if req.worker >= 0:
                self.members.check_member(req.worker)
            tables = [self.table_shards.get(key) for key in (req.key, *req.also)]
            _check_same_kind("Lookup", tables)
            for table in tables:
                self.table_shards.check_rows(table, req.rows)
            self.table_shards.check_reply_size(tables, req.rows, self.max_reply_bytes)
            if self.policy.exchange.reads_carry_clock and req.worker >= 0 and req.clock is not None:
                self._read_wait(req.worker, req.clock, timeout, cancelled)
            self._touch(req.worker)
            values = {LookupRequest.values_name(i): table.lookup(req.rows) for i, table in enumerate(tables)}
            self.stats["pulls"] += 1
            self.stats["bytes_out"] += sum(v.nbytes for v in values.values())
            return consumer(LookupReply(self.version, self.incarnation, values))

    def push_rows(self, req: PushRowsRequest) -> PushRowsReply:
        """Row gradients (of every table the request names): applied now (update path) or counted towards
        ``req.step`` (gradient path). Every table's part is checked before any is applied."""
        parts = req.tables()
        for key, grads in parts:
            self._check_row_array(req, grads, "Row gradients of", "row gradient", key)
        with self._cond:
            tables = [self._row_request_table(req, grads, "Row gradients of", key) for key, grads in parts]
            _check_same_kind("PushRows", tables)
            if self.policy.exchange.row_pushes_name_step:
                if req.step is None:
                    raise StoreError("PushRows on the gradient path names the global step (`step`).")
                if req.step > self.global_step:
                    raise StoreError(f"Row gradients for step {req.step} refused: the job is at step "
                                     f"{self.global_step}.", grpc_code="FAILED_PRECONDITION")
                self._touch(req.worker)
                if req.step < self.global_step:  # that step is over: dropped, like a stale dense gradient
                    self.stats["dropped"] += 1
                    return PushRowsReply(False, True)
                self.barrier.add_rows(req.worker, parts, req.rows, req.learning_rate)
                return PushRowsReply(False, False)
            self.table_shards.apply(tables, req.rows, [g for _, g in parts], req.learning_rate, self.nonfinite,
                                    req.worker)
            self._touch(req.worker)
            self.stats["bytes_in"] += sum(g.nbytes for _, g in parts) + req.rows.nbytes
            self.stats["row_pushes"] += len(parts)
            return PushRowsReply(True, False)

    def _check_row_array(self, req, array: np.ndarray, what: str, finite_what: str, key: str | None = None) -> None:
        """A row request's array (before the lock: it reads only the array): float32, finite per policy."""
        key = req.key if key is None else key
        if array.dtype != np.float32:
            raise StoreError(f"{what} {short(key)} must be float32. Received: {array.dtype.name}.")
        self.variables.check_finite({key: array}, req.worker, finite_what)

    def _row_request_table(self, req, array: np.ndarray, what: str, key: str | None = None):
        """The table (``key``, default the request's) a row request names, once the request fits it (lock held)."""
        key = req.key if key is None else key
        self._check_worker_request(req.worker, req.incarnation)
        table = self.table_shards.get(key)
        if array.shape[1] != table.spec.dim:
            raise StoreError(f"{what} {short(key)} are {array.shape[1]} wide; its rows are {table.spec.dim}.")
        self.table_shards.check_rows(table, req.rows)
        return table

    def write_rows(self, req: WriteRowsRequest) -> WriteRowsReply:
        """Sets rows of a table (a worker loading weights into it), all or nothing."""
        self._check_row_array(req, req.values, "Rows written to", "row value")
        with self._cond:
            table = self._row_request_table(req, req.values, "Rows written to")
            if table.dynamic and table.capacity and len(req.rows) > table.capacity:
                raise StoreError(f"{len(req.rows)} rows written to dynamic table {short(req.key)}, whose capacity "
                                 f"is {table.capacity} rows per PS task.", grpc_code="OUT_OF_RANGE")
            self._touch(req.worker)
            table.write(req.rows, req.values)
            self.stats["bytes_in"] += req.values.nbytes + req.rows.nbytes
            self.stats["row_writes"] += 1
            return WriteRowsReply(len(req.rows))

    def table_arrays(self) -> dict[str, np.ndarray]:
        """Every table's values and slots, keyed ``table/<key>/<array>`` (copies: checkpoints, status)."""
        with self._cond:
            return self.table_shards.arrays()


def _check_same_kind(method: str, tables) -> None:
    """A request naming several tables names fixed ones or dynamic ones (their ids are not the same kind of row)."""
    if len({t.dynamic for t in tables}) > 1:
        raise StoreError(f"{method} names fixed and dynamic tables ({short([t.spec.key for t in tables][:4])}): a "
                         "fixed table's rows are local row indices, a dynamic table's are ids; send one request "
                         "per kind.")
