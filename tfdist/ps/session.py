"""A worker's exchange with the parameter servers, in numpy (no TensorFlow).

The session owns the placement plan, the cache snapshot and the protocol:

* :meth:`WorkerSession.initialize` — the chief stores its values on every PS
  (in parallel); any other worker waits (bounded) and pulls.
* :meth:`WorkerSession.sync` — pushes the *update* made locally since the last
  sync (``current - snapshot``, an additive delta, so any Keras optimizer
  works) and pulls fresh values in the same call, one call per PS task, all
  tasks in parallel.
* :meth:`WorkerSession.pull` — fresh values without pushing.

Strategies call these from ``tf.py_function``; tests call them directly.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Mapping, Sequence

import numpy as np

from tfdist.errors import PSRejectedError, PSUnavailableError
from tfdist.ps.client import PSClient
from tfdist.ps.placement import PlacementPlan, VariableSpec

__all__ = ["WorkerSession"]

logger = logging.getLogger(__name__)


class WorkerSession:
    """One worker's view of the parameter servers.

    Args:
        client: Connected :class:`PSClient`.
        specs: The variables kept on the PS, in creation order.
        plan: Where each variable (or piece) lives.
        worker_id: This worker's id (chief = 0 when there is a chief).
        is_chief: Whether this worker initialises the PS.
        startup_timeout_s: Bound on waiting for the chief's initialisation.
        heartbeat_interval_s: Heart-beat period; ``None`` disables the thread.
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
    ):
        self.client = client
        self.specs = list(specs)
        self.plan = plan
        self.worker_id = worker_id
        self.is_chief = is_chief
        self.startup_timeout_s = startup_timeout_s
        self.clock = 0
        self.version = [0] * plan.num_ps
        self._snapshot: dict[str, np.ndarray] = {}
        self._by_key = {s.key: s for s in self.specs}
        self.stats = {"syncs": 0, "pulls": 0, "bytes_pushed": 0, "bytes_pulled": 0, "sync_seconds": 0.0}
        self._hb_stop = threading.Event()
        self._hb_thread = None
        if heartbeat_interval_s:
            self._hb_thread = threading.Thread(
                target=self._heartbeat_loop, args=(heartbeat_interval_s,), name="tfdist-heartbeat", daemon=True
            )

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

    def _spec_meta(self, ps: int) -> list[dict]:
        out = []
        for shard in self.plan.shards:
            if shard.ps != ps:
                continue
            spec = self._by_key[shard.var_key]
            shape = list(spec.shape)
            if shard.rows is not None:
                shape[0] = shard.rows[1] - shard.rows[0]
            out.append({"key": shard.key, "dtype": spec.dtype, "shape": shape})
        return out

    # ---------------------------------------------------------- protocol
    def initialize(self, local_values: Mapping[str, np.ndarray]) -> dict[str, np.ndarray] | None:
        """Makes the PS and this worker agree on initial values.

        Returns:
            The values this worker must load into its variables, or ``None``
            when its own values became the PS's (the chief on a fresh job).
        """
        self.client.wait_ready(self.startup_timeout_s)
        if self.is_chief:
            parts = self._split({k: np.asarray(v) for k, v in local_values.items()})
            requests = {
                ps: ({"worker": self.worker_id, "specs": self._spec_meta(ps)}, parts[ps])
                for ps in range(self.plan.num_ps)
            }
            replies = self.client.call_many("Init", requests)
            fresh = all(meta["initialized_here"] for meta, _ in replies.values())
            if fresh:
                self._snapshot = {k: np.array(v, copy=True) for k, v in local_values.items()}
                self.version = [meta["version"] for meta, _ in (replies[i] for i in range(self.plan.num_ps))]
                logger.info("worker %d initialised %d PS task(s)", self.worker_id, self.plan.num_ps)
                self._start_heartbeat()
                return None
            logger.warning(
                "worker %d: parameter servers already held values (job restarted?); using theirs", self.worker_id
            )
        else:
            deadline = time.monotonic() + self.startup_timeout_s
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
                    meta, _ = self.client.call(
                        ps, "WaitInit", {"timeout_s": wait, "specs": self._spec_meta(ps)}, timeout=wait + 5.0
                    )
                    if meta["initialized"]:
                        break
        values = self.pull()
        self._start_heartbeat()
        return values

    def pull(self) -> dict[str, np.ndarray]:
        """Fresh values of every variable; resets the snapshot to them."""
        start = time.perf_counter()
        replies = self.client.call_many(
            "Pull",
            {ps: ({"worker": self.worker_id, "clock": self.clock, "keys": self.plan.keys_on(ps)}, {})
             for ps in range(self.plan.num_ps)},
        )
        values = self._absorb(replies)
        self.stats["pulls"] += 1
        self.stats["sync_seconds"] += time.perf_counter() - start
        return values

    def sync(self, current: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Pushes ``current - snapshot`` and returns fresh values (one round trip)."""
        if not self._snapshot:
            raise PSRejectedError("sync() before initialize(): the worker has no snapshot to diff against.")
        start = time.perf_counter()
        deltas = {k: np.subtract(np.asarray(current[k]), self._snapshot[k]) for k in self._snapshot}
        parts = self._split(deltas)
        requests = {
            ps: ({"worker": self.worker_id, "clock": self.clock, "keys": self.plan.keys_on(ps)}, parts[ps])
            for ps in range(self.plan.num_ps)
        }
        replies = self.client.call_many("PushPull", requests)
        self.stats["bytes_pushed"] += sum(d.nbytes for d in deltas.values())
        values = self._absorb(replies)
        self.clock += 1
        self.stats["syncs"] += 1
        self.stats["sync_seconds"] += time.perf_counter() - start
        return values

    def _absorb(self, replies) -> dict[str, np.ndarray]:
        self.version = [replies[i][0]["version"] for i in range(self.plan.num_ps)]
        values = self._join({ps: tensors for ps, (_, tensors) in replies.items()})
        self.stats["bytes_pulled"] += sum(v.nbytes for v in values.values())
        self._snapshot = values
        return values

    def status(self) -> list[dict]:
        """Status of every PS task (version, live workers, counters)."""
        return [meta for _, (meta, _) in sorted(self.client.call_all("Status", {}).items())]

    # ----------------------------------------------------------- liveness
    def _start_heartbeat(self) -> None:
        if self._hb_thread is not None and not self._hb_thread.is_alive() and not self._hb_stop.is_set():
            self._hb_thread.start()

    def _heartbeat_loop(self, interval: float) -> None:
        while not self._hb_stop.wait(interval):
            try:
                self.client.call_all("Heartbeat", {"worker": self.worker_id}, timeout=interval * 2)
            except Exception as e:  # a missed beat is not fatal; the next call reports a dead PS
                logger.debug("heartbeat failed: %s", e)

    def close(self, done: bool = True) -> None:
        """Stops heart-beating and tells the PS tasks this worker is done."""
        self._hb_stop.set()
        if done:
            try:
                self.client.call_all("Done", {"worker": self.worker_id}, timeout=5.0)
            except Exception as e:
                logger.debug("could not send Done: %s", e)
        self.client.close()
