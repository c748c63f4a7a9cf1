"""A worker session's requests for PS-resident tables: lookups, row pushes, row writes (one slice of the session).

Rows are sharded over the PS tasks by id (:func:`tfdist.ps.sparse.shard_of`; a
dynamic table's by a hash of the id, :func:`tfdist.ps.dynamic.shard_of_ids`, and
its requests name the ids themselves);
each call sends one request per PS task holding any of the rows, all tasks in
parallel. Where a path differs (a lookup's clock, a row push's step) the
session's hooks ``_lookup_clock`` / ``_row_step`` say.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from tfdist.ps.dynamic import shard_of_ids
from tfdist.ps.protocol import LookupRequest, PushRowsRequest, WriteRowsRequest
from tfdist.ps.sparse import shard_of

__all__ = ["SessionTables"]


class SessionTables:
    """``lookup_rows``, ``lookup_tables``, ``push_rows``, ``push_tables``, ``write_rows`` of a worker session."""

    def _route(self, key: str, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(PS task, what the request names) of each id of table ``key``: its local row, or a dynamic table's id."""
        if self.tables[key].dynamic is not None:
            return shard_of_ids(ids, self.plan.num_ps), np.asarray(ids, np.int64)
        return shard_of(ids, self.plan.num_ps)

    def lookup_rows(self, key: str, ids: np.ndarray, as_reader: bool = False) -> np.ndarray:
        """Rows ``ids`` (unique global ids, int64) of PS-resident table ``key``: one request per PS task holding any."""
        return self.lookup_tables([key], ids, as_reader)[key]

    def lookup_tables(self, keys: Sequence[str], ids: np.ndarray, as_reader: bool = False) -> dict[str, np.ndarray]:
        """Rows ``ids`` of several tables at once (tables looked up by the same ids): one request per PS task."""
        shard, local = self._route(keys[0], ids)
        worker = -1 if as_reader else self.worker_id
        clock = None if as_reader else self._lookup_clock()
        first, also = keys[0], tuple(keys[1:])
        requests = {ps: LookupRequest(worker, first, local[shard == ps], clock, also)
                    for ps in range(self.plan.num_ps) if (shard == ps).any()}
        out = {key: np.empty((len(ids), self.tables[key].dim), np.float32) for key in keys}
        for ps, reply in self._request_many(requests).items():
            mine = shard == ps
            for i, key in enumerate(keys):
                out[key][mine] = reply.values[LookupRequest.values_name(i)]
        self.stats["rows_pulled"] += len(ids) * len(keys)
        return out

    def push_rows(self, key: str, ids: np.ndarray, grads: np.ndarray, learning_rate: float | None) -> None:
        """Row gradients of table ``key`` (``ids`` global, may repeat) to the tasks holding those rows."""
        self.push_tables([key], ids, [grads], learning_rate)

    def push_tables(self, keys: Sequence[str], ids: np.ndarray, grads: Sequence[np.ndarray],
                    learning_rate: float | None) -> None:
        """Row gradients of several tables at the same ``ids`` (one ``grads`` each): one request per PS task."""
        shard, local = self._route(keys[0], ids)
        step = self._row_step()
        grads = [np.ascontiguousarray(g, np.float32) for g in grads]
        requests = {}
        for ps in range(self.plan.num_ps):
            mine = shard == ps
            if mine.any():
                requests[ps] = PushRowsRequest(self.worker_id, keys[0], local[mine], grads[0][mine], learning_rate,
                                               step, self.state.incarnations[ps], tuple(keys[1:]),
                                               tuple(g[mine] for g in grads[1:]))
        self._request_many(requests)
        self.stats["rows_pushed"] += len(ids) * len(keys)

    def write_rows(self, key: str, ids: np.ndarray, values: np.ndarray) -> int:
        """Sets rows ``ids`` (distinct global ids) of table ``key`` to ``values`` on the tasks holding them."""
        shard, local = self._route(key, np.asarray(ids, np.int64))
        values = np.ascontiguousarray(values, np.float32)
        requests = {ps: WriteRowsRequest(self.worker_id, key, local[shard == ps], values[shard == ps],
                                         self.state.incarnations[ps])
                    for ps in range(self.plan.num_ps) if (shard == ps).any()}
        replies = self._request_many(requests)
        return sum(reply.written for reply in replies.values())
