"""PS-resident tables (``tfdist.layers.ShardedEmbedding``) as a parameter-server worker sees them.

One slice of :class:`~tfdist.strategies._ps_runtime.PSRuntime`: the tables'
specs and row optimizers, row lookups (grouped with companion tables read by
the same ids), row pushes (in the background under async with overlap), and
loading whole tables. The rows themselves live on the PS tasks
(:class:`~tfdist.ps._table_shards.TableShards`).
"""

from __future__ import annotations

import collections
import logging
import threading
from typing import TYPE_CHECKING

import numpy as np

from tfdist.errors import ClusterError, PSUnavailableError
from tfdist.ps.protocol import MAX_LOOKUP_TABLES
from tfdist.ps.sparse import TableSpec

if TYPE_CHECKING:
    from tfdist.ps.session import WorkerSession

__all__ = ["MAX_ROW_PUSHES_IN_FLIGHT", "RuntimeTables"]

logger = logging.getLogger(__name__)

#: Async: row pushes of PS-resident tables a worker may have in flight (its next steps' lookups do not wait
#: for them; the push before those waits for the oldest).
MAX_ROW_PUSHES_IN_FLIGHT = 4


class RuntimeTables:
    """The table methods of :class:`~tfdist.strategies._ps_runtime.PSRuntime` (same lock, same session)."""

    def _init_tables(self) -> None:
        #: PS-resident tables: key → (name, rows, dim, initializer, optimizer or None, seed, dynamic options or None).
        self._tables: dict[str, tuple] = {}
        #: The Keras optimizer built under the scope (the row optimizer of tables without their own).
        self.keras_optimizer = None
        #: Tables loaded (load_weights) before the PS was initialised: written once the chief initialises it.
        self._pending_table_writes: dict[str, np.ndarray] = {}
        #: Row pushes in flight (``background_row_pushes``), oldest first, with the recovery count when sent.
        self._row_pushes: collections.deque = collections.deque()
        self._row_pusher = None
        self._row_push_lock = threading.RLock()
        #: Table lookups (see :meth:`lookup_rows`): lead table → tables read with it; rows read ahead for this
        #: step (key → (ids, rows)); the step's last requested lookup (key, ids).
        self._companions: dict[str, list[str]] = {}
        self._prefetched: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        self._last_lookup: tuple[str, np.ndarray] | None = None
        #: Tables read in this step; tables read more than once in a step (never grouped).
        self._looked_up: set[str] = set()
        self._solo: set[str] = set()
        self._lookup_lock = threading.Lock()
        #: Background row pushes of a table group waiting for the group's other members (key → ids, grads, lr).
        self._held_pushes: dict[str, tuple[np.ndarray, np.ndarray, float | None]] = {}

    def register_table(self, name: str, rows: int, dim: int, initializer: dict, optimizer: dict | None,
                       seed: int, dynamic: dict | None = None) -> str:
        """A PS-resident table (``tfdist.layers.ShardedEmbedding``; ``DynamicEmbedding`` with ``dynamic``
        options and ``rows`` 0); returns its key.

        Its row optimizer is fixed when the parameter servers are initialised:
        ``optimizer`` if given, else the Keras optimizer this worker builds
        under the strategy's scope (see :meth:`note_optimizer`).
        """
        if self.session is not None:
            raise ClusterError(f"Table {name!r} was created after the parameter servers were initialised: create "
                               "every ShardedEmbedding before the first fit/evaluate/predict step.")
        key = f"t{len(self._tables):03d}/{name}"
        TableSpec(key, rows, dim, initializer=initializer, seed=seed, dynamic=dynamic)  # refused here if wrong
        self._tables[key] = (name, rows, dim, initializer, optimizer, seed, dynamic)
        return key

    def note_optimizer(self, optimizer) -> None:
        """The Keras optimizer whose variables are created under the scope: tables without their own use it.

        Keras's base ``Optimizer`` (``load_model`` creates one to read the
        saved optimizer variables into) is not a user's optimizer.
        """
        if type(optimizer).__name__ == "Optimizer":
            return
        self.keras_optimizer = optimizer

    def _table_specs(self) -> list[TableSpec]:
        from tfdist.strategies._row_optimizer import row_optimizer_spec

        specs = []
        for key, (name, rows, dim, initializer, optimizer, seed, dynamic) in self._tables.items():
            if optimizer is None:
                if self.keras_optimizer is None:
                    logger.warning("table %r: no optimizer known yet (the first step is not a training step); its rows "
                                   "are trained with SGD(0.01). Give ShardedEmbedding(optimizer=...) to choose.", name)
                    optimizer = {"kind": "sgd"}
                else:
                    optimizer = row_optimizer_spec(self.keras_optimizer)
            specs.append(TableSpec(key, rows, dim, initializer=initializer, optimizer=optimizer, seed=seed,
                                   dynamic=dynamic))
        return specs

    def lookup_rows(self, key: str, ids: np.ndarray) -> np.ndarray:
        """The rows ``ids`` (unique) of table ``key``, for the step running now (a lost PS task is recovered).

        Tables looked up by the same ids in one step (a wide and a deep table
        of the same features) are learnt as companions: from the next step on
        the first one's request reads the others' rows too (one request per
        PS task instead of one per table), and their own lookups in that step
        take those rows if their ids are the same (else they ask, and the
        companionship is forgotten). Nothing read is kept past its step.
        """
        session = self.ensure_session()
        as_reader = self.lifecycle.reads_as_reader
        with self._lookup_lock:  # the bookkeeping only: requests of several lookups may overlap
            if key in self._looked_up:  # read twice in one step (a shared table): never grouped
                self._ungroup(key)
            self._looked_up.add(key)
            held = self._prefetched.pop(key, None)
            if held is not None:
                if np.array_equal(held[0], ids):
                    return held[1]
                self._forget_companion(key)
            keys = [key, *self._companions.get(key, ())]
        try:
            rows = session.lookup_tables(keys, ids, as_reader=as_reader)
        except PSUnavailableError as e:
            self._recover(e, as_reader)
            rows = session.lookup_tables(keys, ids, as_reader=as_reader)
        with self._lookup_lock:
            for other in keys[1:]:
                if other not in self._looked_up:
                    self._prefetched[other] = (ids, rows[other])
            self._learn_companion(key, ids)
        return rows[key]

    def _ungroup(self, key: str) -> None:
        """``key`` is read more than once in a step: it never shares a request (its reads are not one set of ids)."""
        self._solo.add(key)
        self._companions.pop(key, None)
        self._forget_companion(key)

    def _learn_companion(self, key: str, ids: np.ndarray) -> None:
        """``key`` was just read by a request of its own: a companion of the step's previous lookup if same ids."""
        last, self._last_lookup = self._last_lookup, (key, ids)
        if last is None:
            return
        lead, lead_ids = last
        read_with_another = {k for companions in self._companions.values() for k in companions}
        if lead == key or key in self._companions or key in read_with_another or lead in read_with_another:
            return
        if key in self._solo or lead in self._solo or len(self._companions.get(lead, ())) >= MAX_LOOKUP_TABLES - 1:
            return
        if (self._tables[lead][6] is None) != (self._tables[key][6] is None):  # fixed and dynamic rows route apart
            return
        if lead_ids.shape != ids.shape or not np.array_equal(lead_ids, ids):
            return
        self._companions.setdefault(lead, []).append(key)
        self._last_lookup = last  # a third table with the same ids joins the same lead
        logger.info("worker %d: %s and %s are looked up by the same ids: one request per PS task serves both from "
                    "now on", self.worker_id, lead, key)

    def _forget_companion(self, key: str) -> None:
        for lead, companions in list(self._companions.items()):
            if key in companions:
                companions.remove(key)
                if not companions:
                    del self._companions[lead]

    def _new_step_for_lookups(self) -> None:
        """A step begins: rows read ahead for the step before are dropped (unused: that companionship is wrong)."""
        self._send_held_pushes()
        with self._lookup_lock:
            for key in list(self._prefetched):
                self._forget_companion(key)
            self._prefetched.clear()
            self._last_lookup = None
            self._looked_up.clear()

    def read_rows(self, key: str, ids: np.ndarray) -> np.ndarray:
        """Rows of table ``key`` outside a step (saving, inspection): read as an evaluator reads."""
        session = self.ensure_session()
        self.wait_row_pushes()
        return session.lookup_rows(key, ids, as_reader=True)

    def table_specs(self) -> list[TableSpec]:
        """The job's PS-resident tables (their row optimizers as the PS runs them, once the job started)."""
        return list(self.session.tables.values()) if self.session is not None else self._table_specs()

    def push_rows(self, key: str, ids: np.ndarray, grads: np.ndarray) -> None:
        """The step's row gradients of table ``key`` (dropped, after recovering, if a PS task was lost).

        With :attr:`background_row_pushes` (async with ``overlap_exchange``)
        the push is sent by a background thread, in order, while the step
        goes on (at most :data:`MAX_ROW_PUSHES_IN_FLIGHT` in flight; a
        failure surfaces, and is recovered from, at the next push or
        :meth:`wait_row_pushes`).
        """
        self._require_training_task()
        if self.in_warmup:
            return
        lr = None
        if self.keras_optimizer is not None:
            lr = float(self.keras_optimizer.learning_rate)  # (np.asarray of a Keras variable: 3-4x slower)
        session = self.session
        if not self.background_row_pushes:
            self._recovering(lambda: session.push_rows(key, ids, grads, lr))
            return
        ids, grads = np.array(ids, copy=True), np.array(grads, copy=True)  # the step's buffers are reused
        group = self._push_group(key)
        if group is None:
            self._submit_row_push([key], ids, [grads], lr)
            return
        # Tables read together (see lookup_rows) also push together: held until the group's last one arrives
        # in this step, then one request per PS task when their ids agree.
        with self._row_push_lock:
            earlier = self._held_pushes.pop(key, None)
            if earlier is None:
                self._held_pushes[key] = (ids, grads, lr)
                if not all(k in self._held_pushes for k in group):
                    return
                held = [self._held_pushes.pop(k) for k in group]
        if earlier is not None:  # pushed twice in one step: each on its own, and the table is grouped no more
            with self._lookup_lock:
                self._ungroup(key)
            self._submit_row_push([key], earlier[0], [earlier[1]], earlier[2])
            self._submit_row_push([key], ids, [grads], lr)
            return
        if all(np.array_equal(held[0][0], h[0]) for h in held[1:]):
            self._submit_row_push(group, held[0][0], [h[1] for h in held], lr)
        else:
            for k, (k_ids, k_grads, k_lr) in zip(group, held):
                self._submit_row_push([k], k_ids, [k_grads], k_lr)

    def _push_group(self, key: str) -> list[str] | None:
        """The tables ``key`` is read with (lead first), or None."""
        for lead, companions in self._companions.items():
            if key == lead or key in companions:
                return [lead, *companions]
        return None

    def _submit_row_push(self, keys: list[str], ids: np.ndarray, grads: list[np.ndarray], lr: float | None) -> None:
        self._reap_row_pushes(block_until=MAX_ROW_PUSHES_IN_FLIGHT - 1)
        if self._row_pusher is None:
            import concurrent.futures

            self._row_pusher = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="tfdist-row-push")
        try:
            future = self._row_pusher.submit(self.session.push_tables, keys, ids, grads, lr)
        except RuntimeError:  # the interpreter is ending (no new futures): push in this thread
            self._recovering(lambda: self.session.push_tables(keys, ids, grads, lr))
            return
        with self._row_push_lock:
            self._row_pushes.append((future, self._recoveries()))

    def _send_held_pushes(self) -> None:
        """Row pushes held for a group whose other members did not push in their step: each on its own now."""
        if not self._held_pushes:
            return
        with self._row_push_lock:
            held, self._held_pushes = self._held_pushes, {}
        for key, (ids, grads, lr) in held.items():
            self._submit_row_push([key], ids, [grads], lr)

    #: Row pushes of a table may travel in the background (set by the exchange path).
    background_row_pushes = False

    def _reap_row_pushes(self, block_until: int = 0) -> None:
        """Waits until at most ``block_until`` background row pushes are in flight; recovers from a failed one.

        A push that failed because a PS task was lost is recovered from here
        (in the calling thread, which may write the variables), unless the
        job recovered since it was sent (the lookup of a later step usually
        has): the push is then one of the steps a recovery loses.
        """
        with self._row_push_lock:
            while self._row_pushes and (len(self._row_pushes) > block_until or self._row_pushes[0][0].done()):
                future, recoveries = self._row_pushes.popleft()
                error = future.exception()
                if isinstance(error, PSUnavailableError):
                    if self._recoveries() == recoveries and not self.lifecycle.closed:
                        self._recover(error, as_reader=self.lifecycle.reads_as_reader)
                elif error is not None:
                    raise error

    def wait_row_pushes(self) -> None:
        """Every row push sent (before reads of the PS, checkpoints, leaving, closing)."""
        self._send_held_pushes()
        self._reap_row_pushes(block_until=0)

    def write_table(self, key: str, values: np.ndarray) -> None:
        """Loads a whole PS-resident table (``load_weights``/``load_model`` under the strategy).

        Before the PS is initialised: kept, and written by the worker that
        initialises it (the chief's load becomes the job's, like its other
        weights). After: written to the PS tasks now (every worker reads
        the new rows at its next lookup).
        """
        if key not in self._tables:
            raise ClusterError(f"Unknown table {key!r}.")
        name, rows, dim = self._tables[key][:3]
        if self._tables[key][6] is not None:
            raise ClusterError(f"Table {name!r} is dynamic: write its rows by id (tfdist.checkpoint's export and "
                               "load_into), not as a whole array.")
        values = np.asarray(values, np.float32)
        if values.shape != (rows, dim):
            raise ValueError(f"Table {name!r} is {rows} x {dim}; the weights loaded into it are "
                             f"{' x '.join(map(str, values.shape))}.")
        if self.config.ps.nonfinite == "refuse" and not np.isfinite(values).all():  # refused before any row is sent
            raise ValueError(f"Table {name!r}: the weights loaded into it hold NaN or Inf (ps.nonfinite: refuse).")
        with self._lock:
            if self.session is None:
                self._pending_table_writes[key] = values
                return
        self.wait_row_pushes()  # a push sent before the load lands before it
        self._write_table(self.session, key, values)

    def _write_table(self, session: WorkerSession, key: str, values: np.ndarray, chunk_rows: int = 65536) -> None:
        for start in range(0, len(values), chunk_rows):
            ids = np.arange(start, min(start + chunk_rows, len(values)), dtype=np.int64)
            session.write_rows(key, ids, values[start:start + len(ids)])
        logger.info("worker %d: wrote table %s (%d rows) to the PS tasks", self.worker_id, key, len(values))
