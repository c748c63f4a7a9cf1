"""A worker's exchange with the parameter servers, in numpy (no TensorFlow).

The session owns the placement plan, the cache snapshot and the protocol:

* :meth:`WorkerSession.initialize` — the chief stores its values (and the
  consistency policy) on every PS in parallel; any other worker waits
  (bounded) and pulls.
* :meth:`WorkerSession.sync` — pushes the *update* made locally since the last
  sync (``current - snapshot``, an additive delta, so any Keras optimizer
  works) and pulls fresh values in the same call, one call per PS task, all
  tasks in parallel.
* :meth:`WorkerSession.pull` — fresh values without pushing.

:class:`~tfdist.ps.update_session.UpdateSession` adds SSP clocks (ASP, SSP,
DTSSP) and :class:`~tfdist.ps.gradient_session.GradientSession` the gradient
path (BSP, SyncReplicas): one module per exchange path. Strategies call these
from ``tf.py_function``; tests call them directly.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from typing import Callable, Mapping, Sequence

import numpy as np

from tfdist.errors import PSRejectedError, PSRestartedError, PSUnavailableError
from tfdist.ps.client import PSClient
from tfdist.ps.exchange_state import ExchangeState
from tfdist.ps.placement import PlacementPlan, VariableSpec
from tfdist.ps.sparse import TableSpec
from tfdist.ps.protocol import (
    DoneRequest,
    HeartbeatRequest,
    InitRequest,
    LeaveRequest,
    TableShard,
    PullRequest,
    PushPullRequest,
    PushRequest,
    SetExcludedRequest,
    StatusRequest,
    WaitInitRequest,
)
from tfdist.ps.replies import StatusReply
from tfdist.ps._session_joins import SessionJoins
from tfdist.ps._session_recovery import SessionRecovery
from tfdist.ps._session_tables import SessionTables

__all__ = ["WorkerSession"]

logger = logging.getLogger(__name__)


#: How many steps' start records an update-path session keeps for audits.
AUDIT_STEPS = 100_000


class WorkerSession(SessionJoins, SessionRecovery, SessionTables):
    """One worker's view of the parameter servers.

    Args:
        client: Connected :class:`PSClient`.
        specs: The variables kept on the PS, in creation order.
        plan: Where each variable (or piece) lives.
        worker_id: This worker's id (chief = 0 when there is a chief).
        is_chief: Whether this worker initialises the PS.
        startup_timeout_s: Bound on waiting for the chief's initialisation.
        heartbeat_interval_s: Heart-beat period; ``None`` disables the thread.
        policy_spec: The consistency policy (``policy.spec()``) the chief
            installs on the PS and the others check. Defaults to async.
        num_workers: Training workers of the job (BSP waits for all of them).
        conditional_pull: On push+pull, tell each PS task the version this
            worker's snapshot holds; a task on which no other update landed
            since then answers "unchanged" instead of sending the values back,
            and the worker computes them (snapshot + its delta, the same
            float additions the PS made). Defaults to ``True``.
        nonfinite: What the PS does with NaN/Inf values: ``"refuse"``
            (default) or ``"allow"``; the chief's choice holds for the job.
        reconnect_timeout_s: How long :meth:`recover` tries to reach a lost
            PS task again (``ps.reconnect_timeout_s``). Defaults to 60.
        tables: PS-resident tables (:class:`~tfdist.ps.sparse.TableSpec`):
            the chief's ``Init`` gives each task its shard; see
            :meth:`lookup_rows` and :meth:`push_rows`.

    Every reply names the PS task's *incarnation* (one per start of the
    task); a reply from another incarnation than the one this worker knows
    raises :class:`~tfdist.errors.PSRestartedError`, and the runtime calls
    :meth:`recover`.
    """

    def __init__(
        self,
        client: PSClient,
        specs: Sequence[VariableSpec],
        plan: PlacementPlan,
        worker_id: int,
        is_chief: bool,
        startup_timeout_s: float = 120.0,
        heartbeat_interval_s: float | None = 2.0,
        policy_spec: dict | None = None,
        num_workers: int = 1,
        conditional_pull: bool = True,
        nonfinite: str = "refuse",
        reconnect_timeout_s: float = 60.0,
        tables: Sequence[TableSpec] = (),
    ):
        self.client = client
        #: PS-resident tables (rows sharded mod the PS tasks), by key.
        self.tables = {t.key: t for t in tables}
        self.reconnect_timeout_s = reconnect_timeout_s
        self.nonfinite = nonfinite
        #: Whether a push and the following read may travel as one PushPull (reads that never wait: ASP).
        self.push_pull = True
        self.conditional_pull = conditional_pull
        self.policy_spec = policy_spec or {"policy": "async"}
        self.num_workers = num_workers
        #: Every fact this worker knows of the exchange (clock, steps, versions, incarnations, membership).
        self.state = ExchangeState(plan.num_ps)
        self.specs = list(specs)
        self.plan = plan
        self.worker_id = worker_id
        self.is_chief = is_chief
        self.startup_timeout_s = startup_timeout_s
        self._snapshot: dict[str, np.ndarray] = {}
        #: What a push diffs against when it is not the snapshot (after an overlapped exchange).
        self._base: dict[str, np.ndarray] | None = None
        self._by_key = {s.key: s for s in self.specs}
        #: A piece's key on its PS task → its variable's key.
        self._var_key = {sh.key: sh.var_key for sh in plan.shards}
        #: Keys of the variables that joined the job after its first step (sent again in a re-``Init``).
        self.joined: list[str] = []
        #: This worker's current values (set by the runtime): what a task that lost joined variables gets again.
        self.local_values: Callable[[], Mapping[str, np.ndarray]] | None = None
        self.stats = {"syncs": 0, "pulls": 0, "bytes_pushed": 0, "bytes_pulled": 0, "sync_seconds": 0.0,
                      "unchanged_replies": 0, "recoveries": 0, "rows_pulled": 0, "rows_pushed": 0}
        self._hb_interval = heartbeat_interval_s
        self._hb_stop = threading.Event()
        self._hb_thread = None
        if heartbeat_interval_s:
            self._hb_thread = self._heartbeat_thread()

    # --------------------------------------------------------------- split
    def _split(self, values: Mapping[str, np.ndarray]) -> dict[int, dict[str, np.ndarray]]:
        per_ps: dict[int, dict[str, np.ndarray]] = {i: {} for i in range(self.plan.num_ps)}
        for shard in self.plan.shards:
            if shard.var_key not in values:
                continue
            value = values[shard.var_key]
            per_ps[shard.ps][shard.key] = value if shard.rows is None else value[shard.rows[0] : shard.rows[1]]
        return per_ps

    def _join(self, per_ps: Mapping[int, Mapping[str, np.ndarray]]) -> dict[str, np.ndarray]:
        found = {k: v for part in per_ps.values() for k, v in part.items()}
        out = {}
        for spec in self.specs:
            shards = self.plan.shards_of(spec.key)
            if len(shards) == 1 and shards[0].rows is None:
                out[spec.key] = found[shards[0].key]
            else:
                out[spec.key] = np.concatenate([found[s.key] for s in shards], axis=0)
        return out

    def _init_request(self, ps: int, values: Mapping[str, np.ndarray], step: int = 0, reset: bool = False
                      ) -> InitRequest:
        """The chief's ``Init`` of task ``ps``: its variables, the policy, and its shard of every table."""
        specs = self._shard_specs(ps)
        joined = set(self.joined)
        return InitRequest(self.worker_id, specs, values, self.policy_spec, self.num_workers,
                           step=step, nonfinite=self.nonfinite, reset=reset,
                           tables=tuple(TableShard(t, ps, self.plan.num_ps) for t in self.tables.values()),
                           joined=tuple(s.key for s in specs if self._var_key[s.key] in joined))

    # ------------------------------------------------------------- tables
    def _lookup_clock(self) -> int | None:
        """Update path: a lookup is a read at the step about to start (SSP's rule applies)."""
        return self.state.clock

    def _row_step(self) -> int | None:
        """Update path: row gradients are applied at once (no step)."""
        return None

    def _shard_specs(self, ps: int) -> tuple[VariableSpec, ...]:
        """The variables (or row pieces) PS task ``ps`` holds, as it sees them."""
        out = []
        for shard in self.plan.shards:
            if shard.ps != ps:
                continue
            spec = self._by_key[shard.var_key]
            shape = list(spec.shape)
            if shard.rows is not None:
                shape[0] = shard.rows[1] - shard.rows[0]
            out.append(VariableSpec(shard.key, spec.dtype, tuple(shape), spec.trainable))
        return tuple(out)

    # ---------------------------------------------------------- protocol
    def _request_many(self, requests, timeout: float | None = None):
        """``client.request_many`` whose replies must come from the PS incarnations this worker knows."""
        replies = self.client.request_many(requests, timeout)
        self._check_incarnations(replies)
        return replies

    def _check_incarnations(self, replies: Mapping[int, object]) -> None:
        for ps, reply in replies.items():
            incarnation = getattr(reply, "incarnation", None)
            if incarnation is None:
                continue
            known = self.state.incarnations[ps]
            if known is None:
                self.state.incarnations[ps] = incarnation
            elif incarnation != known:
                raise PSRestartedError(
                    f"Parameter server ps:{ps} at {self.client.addresses[ps]} restarted (incarnation {known} → "
                    f"{incarnation}) since worker {self.worker_id} last talked to it.", ps=ps)

    def initialize(self, local_values: Mapping[str, np.ndarray]) -> dict[str, np.ndarray] | None:
        """Makes the PS and this worker agree on initial values.

        A PS task lost while this worker starts (killed, restarted by the
        launcher) does not fail the start: the worker waits for every task to
        answer again and starts over (within ``startup_timeout_s``; a task
        that restarts from its checkpoint holds the job's state, one that
        restarts empty is initialised by the chief as on a fresh job).

        Returns:
            The values this worker must load into its variables, or ``None``
            when its own values became the PS's (the chief on a fresh job).
        """
        deadline, delay = time.monotonic() + self.startup_timeout_s, 0.2
        while True:
            try:
                return self._initialize_once(local_values, deadline)
            except PSUnavailableError as e:
                if time.monotonic() + delay >= deadline:
                    raise
                logger.warning("worker %d: a parameter server was lost while this worker started (%s); waiting for "
                               "it to answer again, then starting over", self.worker_id, e)
                time.sleep(delay)  # (a call that times out every time is not sent again at once)
                delay = min(2 * delay, 2.0)
                self._wait_all_answer(deadline, e, "startup_timeout_s")
                self.state.forget_incarnations()

    def _initialize_once(self, local_values: Mapping[str, np.ndarray], deadline: float
                         ) -> dict[str, np.ndarray] | None:
        self.client.wait_ready(max(deadline - time.monotonic(), 0.0))
        if self.is_chief:
            parts = self._split({k: np.asarray(v) for k, v in local_values.items()})
            requests = {ps: self._init_request(ps, parts[ps]) for ps in range(self.plan.num_ps)}
            replies = self._request_many(requests)
            held = sorted(ps for ps, reply in replies.items() if not reply.initialized_here)
            if held and len(held) < self.plan.num_ps:
                replies = {**replies, **self._reinitialize_held(held, parts, replies)}
                held = []
            fresh = not held
            if fresh:
                self._snapshot = {k: np.array(v, copy=True) for k, v in local_values.items()}
                self.state.versions = [replies[i].version for i in range(self.plan.num_ps)]
                logger.info("worker %d initialised %d PS task(s)", self.worker_id, self.plan.num_ps)
                self._start_heartbeat()
                return None
            logger.warning(
                "worker %d: parameter servers already held values (job restarted?); using theirs", self.worker_id
            )
        else:
            for ps in range(self.plan.num_ps):
                while True:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        raise PSUnavailableError(
                            f"Parameter server ps:{ps} at {self.client.addresses[ps]} was not initialised by "
                            f"the chief within {self.startup_timeout_s:g} s (setting ps.startup_timeout_s). "
                            "Is the chief (or worker 0) running?"
                        )
                    wait = min(remaining, 10.0)
                    reply = self.client.request(
                        ps,
                        WaitInitRequest(self.worker_id if self.worker_id >= 0 else None, wait,
                                        self._shard_specs(ps), self.policy_spec, self.num_workers),
                        timeout=wait + 5.0,
                    )
                    if reply.initialized:
                        break
        values = self.pull()
        self._start_heartbeat()
        return values

    def _reinitialize_held(self, held: list[int], parts, replies) -> dict:
        """The chief found some tasks holding values and others empty: it sets the held ones to its values.

        Taking the held values would start training from a model that is
        part one state, part another (the empty tasks just took this
        worker's values): a PS task restarted without ``ps.checkpoint_dir``,
        or a job started again on tasks of different states. Every task then
        holds this worker's values (the held ones under a new incarnation,
        so any other worker that read them re-syncs).
        """
        empty = sorted(set(range(self.plan.num_ps)) - set(held))
        steps = {ps: replies[ps].global_step for ps in held}
        logger.warning(
            "worker %d: ps:%s held values (at steps %s) while ps:%s started empty (a PS task restarted without "
            "ps.checkpoint_dir, or the job started again on tasks of different states). Taking the held values "
            "would mix two states of the model: every task is set to this worker's values instead, and training "
            "starts from them. Give ps.checkpoint_dir to resume a job whose PS tasks restart.",
            self.worker_id, held, [steps[ps] for ps in held], empty)
        self.state.forget_incarnations()
        return self._request_many({ps: self._init_request(ps, parts[ps], reset=True) for ps in held})

    def pull(self, clock: int | None = None, min_state_step: int | None = None, as_reader: bool = False
             ) -> dict[str, np.ndarray]:
        """Fresh values of every variable; resets the snapshot to them.

        Args:
            clock: The clock the worker is about to start (SSP may make the
                PS wait until the read is allowed). Defaults to the current.
            min_state_step: Gradient path: wait for a state snapshot at least
                this recent.
            as_reader: Read as an evaluator does (no worker id, clock 0): the
                read neither waits for other workers nor counts as a sign of
                life, so a worker that left the barriers can still evaluate.
                Defaults to ``False``.
        """
        start = time.perf_counter()
        if as_reader:
            worker, clock = -1, 0
        else:
            worker, clock = self.worker_id, self.state.clock if clock is None else clock
        replies = self._request_many(
            {ps: PullRequest(worker, clock, tuple(self.plan.keys_on(ps)), min_state_step)
             for ps in range(self.plan.num_ps)}
        )
        values = self._absorb(replies)
        self.stats["pulls"] += 1
        self.stats["sync_seconds"] += time.perf_counter() - start
        return values

    def sync(self, current: Mapping[str, np.ndarray], loss: float | None = None, steps: int = 1
             ) -> dict[str, np.ndarray]:
        """Pushes ``current - snapshot`` (the sum of ``steps`` local steps) and returns fresh values."""
        return self._push(current, loss, pull=True, steps=steps)

    def _measure_update(self, deltas: Mapping[str, np.ndarray], current: Mapping[str, np.ndarray]) -> None:
        """A hook for the update about to be pushed (the update path measures its size)."""

    def _push(self, current: Mapping[str, np.ndarray], loss: float | None, pull: bool, steps: int = 1
              ) -> dict[str, np.ndarray] | None:
        if not self._snapshot:
            raise PSRejectedError("push before initialize(): the worker has no snapshot to diff against.")
        start = time.perf_counter()
        base = self._base if self._base is not None else self._snapshot
        deltas = {k: np.subtract(np.asarray(current[k]), base[k]) for k in self._snapshot}
        self._measure_update(deltas, current)
        parts = self._split(deltas)
        requests = self._push_requests(parts, self.state.clock + 1, loss, pull and self.push_pull, steps)
        replies = self._request_many(requests)
        self.state.clock += 1
        self.stats["syncs"] += 1
        if pull and not self.push_pull:  # reads may wait (SSP): the push, then a read at the next clock
            self._note(replies)
            replies = self._request_many(
                {ps: PullRequest(self.worker_id, self.state.clock, tuple(self.plan.keys_on(ps)))
                 for ps in range(self.plan.num_ps)})
            values = self._absorb(replies)
        elif pull:
            values = self._absorb(replies, pushed=parts)
        else:
            self._snapshot = {k: np.array(current[k], copy=True) for k in self._snapshot}
            self._base = None
            self._note(replies)
            values = None
        self.stats["sync_seconds"] += time.perf_counter() - start
        return values

    def _push_requests(self, parts, clock: int, loss: float | None, pull: bool, steps: int = 1,
                       version: Sequence[int] | None = None) -> dict:
        """One Push (or PushPull, when ``pull``) per PS task; a non-finite loss is not reported."""
        loss = float(loss) if loss is not None and math.isfinite(loss) else None
        version = self.state.versions if version is None else version
        requests = {}
        for ps in range(self.plan.num_ps):
            deltas, rows = _row_sparse(parts[ps])
            self.stats["bytes_pushed"] += sum(d.nbytes for d in deltas.values()) + sum(r.nbytes for r in rows.values())
            push = PushRequest(self.worker_id, clock, deltas, loss, int(steps), self.state.incarnations[ps], rows)
            if pull:
                base = version[ps] if self.conditional_pull else None
                requests[ps] = PushPullRequest(push, tuple(self.plan.keys_on(ps)), base)
            else:
                requests[ps] = push
        return requests

    def _note(self, replies) -> None:
        """Hook: what replies say of membership; subclasses read their path's clock information too."""
        self._note_membership([replies[i] for i in range(self.plan.num_ps)])

    def _note_membership(self, replies) -> None:
        self.state.note_membership(replies, self.worker_id)

    def _fresh_shards(self, replies, snapshot, pushed) -> dict[int, dict[str, np.ndarray]]:
        """Per PS task, the values it holds: sent back, or snapshot + delta where it said "unchanged"."""
        per_ps, snap_parts = {}, None
        for ps, reply in replies.items():
            tensors = reply.values
            if getattr(reply, "unchanged", False):
                if snap_parts is None:
                    snap_parts = self._split(snapshot)
                mine = pushed[ps] if pushed else {}
                tensors = {k: np.add(v, mine[k]) if k in mine else v for k, v in snap_parts[ps].items()}
                self.stats["unchanged_replies"] += 1
            else:
                self.stats["bytes_pulled"] += sum(v.nbytes for v in tensors.values())
            per_ps[ps] = tensors
        return per_ps

    def _absorb(self, replies, pushed=None) -> dict[str, np.ndarray]:
        self.state.versions = [replies[i].version for i in range(self.plan.num_ps)]
        values = self._join(self._fresh_shards(replies, self._snapshot, pushed))
        self._snapshot = values
        self._base = None
        self._note(replies)
        return values

    def flush(self) -> dict[str, np.ndarray] | None:
        """Waits for an exchange still in flight (none on this path); returns its corrections."""
        return None

    def set_excluded(self, excluded) -> None:
        """Tells every PS task which detected stragglers barriers should not wait for."""
        request = SetExcludedRequest(self.worker_id, frozenset(int(w) for w in excluded))
        self.client.request_many({ps: request for ps in range(self.plan.num_ps)})

    def status(self, brief: bool = False) -> list[dict]:
        """Status of every PS task (version, live workers, counters); ``brief``: without the specs."""
        return [reply.to_dict() for reply in self.statuses(brief)]

    def statuses(self, brief: bool = True) -> list[StatusReply]:
        """Every PS task's ``Status``, typed, in task order."""
        replies = self.client.request_all(StatusRequest(brief))
        return [replies[ps] for ps in range(self.plan.num_ps)]

    # ----------------------------------------------------------- liveness
    def _start_heartbeat(self) -> None:
        if self._hb_thread is not None and not self._hb_thread.is_alive() and not self._hb_stop.is_set():
            self._hb_thread.start()

    def _heartbeat_thread(self) -> threading.Thread:
        return threading.Thread(target=self._heartbeat_loop, args=(self._hb_interval, self._hb_stop),
                                name="tfdist-heartbeat", daemon=True)

    def _heartbeat_loop(self, interval: float, stop: threading.Event) -> None:
        while not stop.wait(interval):
            try:
                # One task after the other in this thread: on the client's call threads a beat would queue
                # behind a blocking call (an SSP pull waiting for a stopped worker) and stop every beat, so
                # the PS would count this worker gone too.
                self.client.request_all(HeartbeatRequest(self.worker_id), timeout=interval * 2, parallel=False)
            except Exception as e:  # a missed beat is not fatal; the next call reports a dead PS
                logger.debug("heartbeat failed: %s", e)

    def stop_heartbeat(self) -> None:
        self._hb_stop.set()

    def leave(self) -> None:
        """Stops heart-beating, then tells every PS task this worker leaves the barriers now.

        The heart-beat thread is joined first (bounded), so no late heart-beat
        counts the worker as live again after its ``Leave``.
        """
        self.stop_heartbeat()
        thread = self._hb_thread
        if thread is not None and thread.is_alive():
            thread.join(timeout=2 * (self._hb_interval or 0) + 1.0)
        request = LeaveRequest(self.worker_id)
        self.client.request_many({ps: request for ps in range(self.plan.num_ps)}, timeout=5.0)

    def rejoin(self) -> None:
        """Takes part again after :meth:`stop_heartbeat` (a worker that left trains again).

        Every PS task forgets that this worker said ``Done`` (if it did) and
        the heart-beat resumes; the PS counts the worker as live from its
        next call on (as a joiner if it had dropped it meanwhile).
        """
        self.client.request_all(WaitInitRequest(self.worker_id, 0.0))
        if self._hb_interval and self._hb_stop.is_set():
            self._hb_stop = threading.Event()
            self._hb_thread = self._heartbeat_thread()
            self._hb_thread.start()

    def close(self, done: bool = True) -> None:
        """Stops heart-beating and tells the PS tasks this worker is done.

        ``Done`` goes to the PS tasks one after the other from the calling
        thread: ``close`` often runs at interpreter exit, when no new thread
        can be started. A PS task waits for every worker's ``Done`` before it
        exits, so a failure is logged as a warning.
        """
        self._hb_stop.set()
        if done:
            try:
                self.client.request_all(DoneRequest(self.worker_id), timeout=5.0, parallel=False)
            except Exception as e:
                logger.warning("worker %d could not tell the parameter servers it is done (they exit once every "
                               "worker is): %s", self.worker_id, e)
        self.client.close()


#: Variables with at least this many rows may travel row-sparse (only their changed rows).
ROW_SPARSE_MIN_ROWS = 64
#: Rows :func:`_row_sparse` looks at before it counts the changed rows of a whole delta.
ROW_SPARSE_SAMPLE = 32


def _row_sparse(deltas: Mapping[str, np.ndarray]) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """``(deltas, rows)``: a delta that changed at most half of its rows travels as those rows only.

    An embedding trained by SGD (or any optimizer that leaves rows without
    a gradient alone) changes only the rows its batch touched: those rows and
    their indices are sent, not the whole table. Others stay dense.

    A delta whose evenly spaced sample of :data:`ROW_SPARSE_SAMPLE` rows
    has more than three quarters changed is sent dense without counting all
    its rows (a dense layer's every step: the count would cost a pass over
    the whole delta for nothing). The sample can only err towards sending
    dense, which is always correct.
    """
    out, rows = {}, {}
    for key, delta in deltas.items():
        if delta.ndim >= 2 and delta.shape[0] >= ROW_SPARSE_MIN_ROWS:
            flat = delta.reshape(delta.shape[0], -1)
            sample = flat[:: max(delta.shape[0] // ROW_SPARSE_SAMPLE, 1)]
            if 4 * np.count_nonzero(np.any(sample != 0, axis=1)) > 3 * sample.shape[0]:
                out[key] = delta
                continue
            changed = np.flatnonzero(np.any(flat != 0, axis=1))
            if 2 * changed.size <= delta.shape[0]:
                out[key], rows[key] = delta[changed], changed.astype(np.int64)
                continue
        out[key] = delta
    return out, rows
