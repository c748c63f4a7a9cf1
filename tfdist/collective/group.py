"""The worker group: TF collective ops between a job's training processes, with timeouts.

Call :func:`init_worker_group` at the top of the training script, before any
TensorFlow op runs (TF fixes a process's collective set-up when its eager
context starts). Every training task of the job calls it; the group is then
available anywhere in the process through :func:`get_worker_group`:

```python
import tfdist
import tfdist.collective

group = tfdist.collective.init_worker_group()   # cluster and task from TF_CONFIG
strategy = tfdist.ParameterServerStrategy()
...
model.fit(ds, callbacks=[tfdist.callbacks.StragglerDetector()])
```

Every collective carries ``timeout_seconds``: a peer that hangs raises
:class:`CollectiveTimeoutError`, a peer that died raises
:class:`CollectivePeerError` (usually at once, the socket closes). After a
failure TF aborts all collectives of the process, so the group is marked
broken and later calls raise immediately.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Mapping, Sequence

import numpy as np

from tfdist import constants
from tfdist.collective.errors import (
    CollectiveError,
    CollectivePeerError,
    CollectiveSetupError,
    CollectiveTimeoutError,
)
from tfdist.collective.membership import GroupSpec, peers_in_message, resolve_group

__all__ = [
    "WorkerGroup", "init_worker_group", "get_worker_group", "subgroup_key", "DEFAULT_TIMEOUT_S", "GROUP_KEY",
    "MAX_SUBGROUP_WORKERS", "PURPOSE_EXCHANGE", "PURPOSE_GRADIENTS", "PURPOSE_REDUCE",
]

logger = logging.getLogger(__name__)

#: Default timeout of every collective, seconds.
DEFAULT_TIMEOUT_S = 30.0
#: TF collective group key of the tfdist worker group (any int32 other groups do not use).
GROUP_KEY = 7_301
#: Subsets of the group (partial all-reduce) exist for jobs of at most this many workers.
MAX_SUBGROUP_WORKERS = 24
#: ``purpose`` of :func:`subgroup_key`: host-side exchanges (gather, broadcast) of a member set.
PURPOSE_EXCHANGE = 0
#: ``purpose`` of :func:`subgroup_key`: in-graph gradient all-reduce of a member set.
PURPOSE_GRADIENTS = 1
#: ``purpose`` of :func:`subgroup_key`: ``strategy.reduce`` of a script (in or out of a graph).
PURPOSE_REDUCE = 2
_SUBGROUP_BASE = 1 << 26


def subgroup_key(members, purpose: int = PURPOSE_EXCHANGE) -> int:
    """The TF collective group key of a set of worker ids, for one ``purpose``.

    Every set of members gets its own key (TF fixes a group key's size and
    devices the first time it is used), derived from the member bit mask, so
    every worker computes the same key without talking to the others.

    >>> subgroup_key({0, 2}) == subgroup_key([2, 0]) != subgroup_key({0, 1})
    True
    """
    members = sorted({int(m) for m in members})
    if not members or members[0] < 0 or members[-1] >= MAX_SUBGROUP_WORKERS:
        raise CollectiveError(
            f"Member sets are non-empty sets of worker ids in 0..{MAX_SUBGROUP_WORKERS - 1}. Received: {members!r}."
        )
    if not 0 <= purpose < 16:
        raise CollectiveError(f"`purpose` must be in 0..15. Received: purpose={purpose!r}.")
    return _SUBGROUP_BASE + (purpose << MAX_SUBGROUP_WORKERS) + sum(1 << m for m in members)

_lock = threading.Lock()
_group: "WorkerGroup | None" = None


class WorkerGroup:
    """All training tasks of a job, exchanging small tensors with TF collectives.

    Build it with :func:`init_worker_group`. Calls must be made in the same
    order on every task (each call is one collective instance); they are
    serialised by a lock, so they may come from any thread.

    Attributes:
        spec: The resolved :class:`~tfdist.collective.membership.GroupSpec`.
        timeout_s: Default timeout of each collective.
    """

    def __init__(self, spec: GroupSpec, timeout_s: float = DEFAULT_TIMEOUT_S, enabled: bool = True):
        self.spec = spec
        self.timeout_s = float(timeout_s)
        self._enabled = enabled  # False: one task, no TF set-up, collectives are local
        self._instance_key = 0
        self._instance_keys: dict[int, int] = {}  # group key of a subset -> last instance key used
        self._lock = threading.Lock()
        self.broken: CollectiveError | None = None

    @property
    def size(self) -> int:
        """Number of tasks in the group."""
        return self.spec.size

    @property
    def worker_id(self) -> int:
        """This task's worker id (chief = 0 when there is a chief)."""
        return self.spec.worker_id

    def __repr__(self) -> str:
        return f"WorkerGroup(worker_id={self.worker_id}, size={self.size}, timeout_s={self.timeout_s:g})"

    # ------------------------------------------------------------ collectives
    def all_gather(
        self, values: Sequence[float] | np.ndarray, timeout_s: float | None = None, members=None
    ) -> np.ndarray:
        """Every task's ``values`` (same length everywhere), as ``[size, len]`` in worker-id order.

        With ``members`` (a set of worker ids including this one) only those
        tasks take part, each calling with the same set; the result then has
        one row per member, in worker-id order. The others are not waited for.

        Raises:
            CollectiveTimeoutError: not every task joined within the timeout.
            CollectivePeerError: a peer is gone.
            CollectiveError: the group failed earlier, or tasks sent different lengths.
        """
        row = np.concatenate([[float(self.worker_id)], np.asarray(values, dtype=np.float64).ravel()])
        ids = self._members(members)
        if not self._enabled or len(ids) == 1:
            return row[None, 1:]
        flat = self._run("CollectiveGatherV2", row, timeout_s, members=ids)
        if flat.size != len(ids) * row.size:
            raise self._fail(CollectiveError(
                f"all_gather: tasks sent different lengths (got {flat.size} values for {len(ids)} tasks x "
                f"{row.size}). Every task must call the same collectives in the same order."
            ))
        table = flat.reshape(len(ids), row.size)
        order = np.argsort(table[:, 0], kind="stable")
        table = table[order]
        if table[:, 0].tolist() != [float(i) for i in ids]:
            raise self._fail(CollectiveError(f"all_gather: worker ids {table[:, 0].tolist()} are not {list(ids)}."))
        return table[:, 1:]

    def broadcast(
        self,
        values: np.ndarray | None,
        source: int,
        members=None,
        *,
        shape: Sequence[int] | None = None,
        dtype: str | np.dtype = "float64",
        timeout_s: float | None = None,
    ) -> np.ndarray:
        """Worker ``source``'s ``values`` on every member (``members``: defaults to all).

        The source passes ``values``; the others pass ``shape`` and ``dtype``
        (which must match the source's). Dtypes: bool, float32/64, int32/64.
        """
        ids = self._members(members)
        if source not in ids:
            raise CollectiveError(f"broadcast: source {source} is not among the members {list(ids)}.")
        sending = self.worker_id == source
        if sending:
            arr = np.asarray(values)
        else:
            if shape is None:
                raise CollectiveError("broadcast: a receiving worker must pass `shape=` (and `dtype=`).")
            arr = np.zeros(tuple(shape), dtype=np.dtype(dtype))
        if not self._enabled or len(ids) == 1:
            return arr.copy()
        return self._run("CollectiveBcastSendV2" if sending else "CollectiveBcastRecvV2", arr, timeout_s, members=ids)

    def broadcast_bytes(self, data: bytes | None, source: int, members=None, timeout_s: float | None = None) -> bytes:
        """Worker ``source``'s ``data`` (any bytes, e.g. a pickle) on every member."""
        ids = self._members(members)
        length = np.array([len(data) if self.worker_id == source else 0], dtype=np.int64)
        n = int(self.broadcast(length if self.worker_id == source else None, source, ids, shape=(1,),
                               dtype="int64", timeout_s=timeout_s)[0])
        words = (n + 7) // 8
        payload = None
        if self.worker_id == source:
            payload = np.frombuffer(data + b"\0" * (words * 8 - n), dtype=np.int64)
        out = self.broadcast(payload, source, ids, shape=(words,), dtype="int64", timeout_s=timeout_s)
        return out.tobytes()[:n]

    def reserve(self, members=None, purpose: int = PURPOSE_GRADIENTS, count: int = 1) -> tuple[int, int, int]:
        """``(group_size, group_key, first instance_key)`` for ``count`` collectives a caller runs itself
        (in a graph), with instance keys ``first .. first + count - 1``.

        Every member must reserve for the same member set and purpose in the
        same order; instance keys count per group key, so workers outside the
        set do not fall out of step.
        """
        ids = self._members(members)
        with self._lock:
            if self.broken is not None:
                raise CollectiveError(f"The worker group failed earlier ({self.broken}).", peers=self.broken.peers)
            key = subgroup_key(ids, purpose)
            instance = self._instance_keys.get(key, 0) + 1
            self._instance_keys[key] = instance + count - 1
            return len(ids), key, instance

    def translate(self, error: BaseException, what: str = "collective") -> CollectiveError:
        """A TF error raised by a collective (e.g. from a graph) as a :class:`CollectiveError`.

        Marks the group broken (TF aborts every later collective of the process).
        """
        import tensorflow as tf

        if isinstance(error, CollectiveError):
            return error
        if isinstance(error, tf.errors.DeadlineExceededError):
            return self._fail(CollectiveTimeoutError(
                f"{what} of worker {self.worker_id} did not complete within {self.timeout_s:g} s (setting "
                f"`timeout_s`): a peer hangs or is far slower. TF: {_first_line(error)}"
            ))
        msg = getattr(error, "message", str(error))
        peers = peers_in_message(msg, self.spec)
        named = ", ".join(f"worker {p} ({self.spec.members[p].job}:{self.spec.members[p].index})" for p in peers)
        return self._fail(CollectivePeerError(
            f"{what} of worker {self.worker_id} failed: {named or 'a peer'} is unreachable (its process died or "
            f"its collective port is closed). TF: {_first_line(error)}", peers=peers
        ))

    def _members(self, members) -> tuple[int, ...]:
        if members is None:
            return tuple(range(self.size))
        ids = tuple(sorted({int(m) for m in members}))
        if not ids or ids[0] < 0 or ids[-1] >= self.size or self.worker_id not in ids:
            raise CollectiveError(
                f"`members` must be worker ids in 0..{self.size - 1} including this worker ({self.worker_id}). "
                f"Received: members={members!r}."
            )
        return ids

    def all_reduce_min(self, values: Sequence[float] | np.ndarray, timeout_s: float | None = None) -> np.ndarray:
        """Element-wise minimum of every task's ``values``."""
        arr = np.asarray(values, dtype=np.float64).ravel()
        if not self._enabled:
            return arr.copy()
        return self._run("CollectiveReduceV2", arr, timeout_s, merge_op="Min")

    def _run(self, op: str, values: np.ndarray, timeout_s: float | None, members: tuple[int, ...] | None = None,
             **attrs) -> np.ndarray:
        import tensorflow as tf

        timeout = self.timeout_s if timeout_s is None else float(timeout_s)
        with self._lock:
            if self.broken is not None:
                raise CollectiveError(
                    f"The worker group failed earlier ({self.broken}); TF aborts every collective of the "
                    "process after a failure. Restart the task to exchange again.",
                    peers=self.broken.peers,
                )
            if members is None or len(members) == self.size:
                self._instance_key += 1
                key, group_key, size = self._instance_key, GROUP_KEY, self.size
            else:  # a subset: its own group key and instance counter
                group_key, size = subgroup_key(members, PURPOSE_EXCHANGE), len(members)
                key = self._instance_keys.get(group_key, 0) + 1
                self._instance_keys[group_key] = key
            start = time.monotonic()
            try:
                with tf.device(self.spec.me.device):
                    common = dict(group_size=size, group_key=group_key, instance_key=key, timeout_seconds=timeout)
                    if op == "CollectiveBcastSendV2":
                        out = tf.raw_ops.CollectiveBcastSendV2(input=tf.constant(values), **common)
                    elif op == "CollectiveBcastRecvV2":
                        out = tf.raw_ops.CollectiveBcastRecvV2(
                            shape=tf.constant(values.shape, dtype=tf.int64), T=tf.as_dtype(values.dtype), **common)
                    else:
                        x = tf.constant(values, dtype=tf.float64)
                        if op == "CollectiveGatherV2":
                            out = tf.raw_ops.CollectiveGatherV2(input=x, ordering_token=[], **common)
                        else:
                            out = tf.raw_ops.CollectiveReduceV2(input=x, ordering_token=[], final_op="Id", **attrs,
                                                                **common)
                    return out.numpy()
            except tf.errors.DeadlineExceededError as e:
                raise self._fail(CollectiveTimeoutError(
                    f"{op} #{key} of worker {self.worker_id} did not complete within {timeout:g} s "
                    "(setting `timeout_s`): a peer hangs, is far slower, or called a different sequence of "
                    f"collectives. TF: {_first_line(e)}"
                ), start) from e
            except tf.errors.OpError as e:
                msg = getattr(e, "message", str(e))
                peers = peers_in_message(msg, self.spec)
                named = ", ".join(f"worker {p} ({self.spec.members[p].job}:{self.spec.members[p].index} at "
                                  f"{self.spec.members[p].address})" for p in peers) or "a peer"
                raise self._fail(CollectivePeerError(
                    f"{op} #{key} of worker {self.worker_id} failed: {named} is unreachable (its process died "
                    f"or its collective port is closed). TF: {_first_line(e)}", peers=peers
                ), start) from e

    def _fail(self, error: CollectiveError, start: float | None = None) -> CollectiveError:
        self.broken = error
        took = "" if start is None else f" after {time.monotonic() - start:.2f} s"
        logger.error("worker group failed%s: %s", took, error)
        return error


def _first_line(e: Exception) -> str:
    text = getattr(e, "message", None) or str(e)
    lines = [ln for ln in text.splitlines() if ln.strip() and not ln.startswith(("Graph execution error", "Detected at node"))]
    lines = [ln for ln in lines if not ln.lstrip().startswith(("File ", "[["))] or lines
    return (lines[0] if lines else type(e).__name__)[:400]


def get_worker_group(*, required_by: str | None = None) -> WorkerGroup | None:
    """The group :func:`init_worker_group` set up in this process, or ``None``.

    Args:
        required_by: Who needs the group (named in the error). When given and
            this process set up no group although its job has several training
            tasks, raise instead of returning ``None``. Defaults to ``None``.

    Raises:
        CollectiveSetupError: ``required_by`` and a multi-worker job without a group.
    """
    if _group is not None or required_by is None:
        return _group
    training = _training_tasks()
    if training > 1:
        raise CollectiveSetupError(
            f"TF_CONFIG lists {training} training tasks but this process has no worker group, so the "
            "workers cannot exchange their times. Call tfdist.collective.init_worker_group() at the top of "
            f"the training script (before any TensorFlow op), or pass group=... to {required_by}."
        )
    return None


def _training_tasks() -> int:
    """Training tasks of the job this process belongs to (0 without a cluster or with an unreadable one)."""
    from tfdist.cluster.resolver import resolve_cluster
    from tfdist.errors import ConfigError

    try:
        resolved = resolve_cluster()
    except ConfigError:
        return 0
    return 0 if resolved.is_single_process else resolved.num_workers


def init_worker_group(
    cluster: Mapping[str, Sequence[str]] | object | None = None,
    task: str | object | None = None,
    *,
    addresses: Sequence[str] | None = None,
    port_offset: int = 0,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    coordination_service: bool = True,
    startup_timeout_s: float = constants.DEFAULT_STARTUP_TIMEOUT_S,
    heartbeat_timeout_s: float = 30.0,
    shutdown_timeout_s: float = 5.0,
) -> WorkerGroup | None:
    """Sets up this process as a member of its job's TF collective group.

    Call it at the top of the training script, before any TensorFlow op. It
    starts this task's TF gRPC server on its collective address (see
    :mod:`tfdist.collective.membership` for the address scheme) and, with
    ``coordination_service``, waits until every training task has started.

    Args:
        cluster: ``{job: [host:port, ...]}``, a ``tf.train.ClusterSpec`` or a
            :class:`tfdist.config.ClusterConfig`. Defaults to ``TF_CONFIG``.
        task: This task, ``"worker:1"`` / ``TaskSpec``. Defaults to ``TF_CONFIG``.
        addresses: Collective addresses in worker-id order. Defaults to
            ``TFDIST_COLLECTIVE_ADDRESSES``, else the tasks' cluster addresses.
        port_offset: Added to the cluster ports when no address is given.
            Defaults to 0.
        timeout_s: Default timeout of every collective. Defaults to 30.
        coordination_service: Run TF's coordination service (start-up
            barrier, heart-beats naming a dead task). Defaults to ``True``.
        startup_timeout_s: How long start-up waits for all tasks. Defaults to 120.
        heartbeat_timeout_s: A task silent this long is reported dead.
            Defaults to 30.
        shutdown_timeout_s: How long exit waits for the other tasks. Defaults to 5.

    Returns:
        The :class:`WorkerGroup`, also returned by :func:`get_worker_group`
        later. ``None`` when there is no cluster (no ``TF_CONFIG``) or this
        task is not a training task (ps, evaluator): there is nothing to join.
        With a single training task the group has size 1 and needs no TF set-up.

    Raises:
        CollectiveSetupError: TF already ran an op in this process, the group
            was set up before with other settings, or the addresses are wrong.
    """
    global _group
    from tfdist.cluster.resolver import resolve_cluster
    from tfdist.errors import ConfigError

    for name, value in (("timeout_s", timeout_s), ("startup_timeout_s", startup_timeout_s),
                        ("heartbeat_timeout_s", heartbeat_timeout_s), ("shutdown_timeout_s", shutdown_timeout_s)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
            raise CollectiveSetupError(f"`{name}` must be a positive number of seconds. Received: {name}={value!r}.")
    try:
        resolved = resolve_cluster(cluster, task)
    except ConfigError as e:
        if cluster is None and task is None:  # TF_CONFIG itself is wrong: the config error says how
            raise
        raise CollectiveSetupError(str(e)) from None  # the arguments are wrong
    task = resolved.task
    if task is None:
        logger.info("no cluster (no TF_CONFIG): no worker group (single process)")
        return None
    if task.job not in ("chief", "worker"):
        logger.info("task %s is not a training task: it joins no worker group", task)
        return None
    jobs = resolved.config.cluster.jobs()
    spec = resolve_group(jobs, task.job, task.index, addresses=addresses, port_offset=port_offset)

    with _lock:
        if _group is not None:
            if _group.spec == spec:
                return _group
            raise CollectiveSetupError(
                f"The worker group was already set up in this process as {_group!r} with other members; "
                f"a process joins one group. Received: {spec!r}."
            )
        if spec.size == 1:
            _group = WorkerGroup(spec, timeout_s, enabled=False)
            logger.info("worker group: a single training task, collectives are local")
            return _group
        from tfdist import _tf_compat

        if _tf_compat.context_initialized():
            raise CollectiveSetupError(
                "TensorFlow already ran an op in this process, so its collective set-up is fixed. Call "
                "tfdist.collective.init_worker_group() at the top of the training script, before building "
                "the strategy, the model or any tensor."
            )
        start = time.monotonic()
        try:
            devices = _tf_compat.enable_collective_group(
                spec.jobs(), task.job, task.index, spec.leader,
                coordination_service=coordination_service,
                register_timeout_ms=int(startup_timeout_s * 1000),
                heartbeat_timeout_ms=int(heartbeat_timeout_s * 1000),
                shutdown_barrier_timeout_ms=int(shutdown_timeout_s * 1000),
            )
        except Exception as e:  # TF raises several types here (bind failure, registration timeout)
            raise CollectiveSetupError(
                f"Could not start the collective server of {task} at {spec.me.address} or reach the group "
                f"within {startup_timeout_s:g} s (setting `startup_timeout_s`): {_first_line(e)}. Check that every "
                "training task runs and that the collective ports are free and reachable."
            ) from e
        _group = WorkerGroup(spec, timeout_s)
        logger.info(
            "worker group: worker %d of %d (%s) at %s, leader %s, timeout_s=%g, coordination_service=%s, "
            "members=%s, set up in %.1f s; devices=%s",
            spec.worker_id, spec.size, task, spec.me.address, spec.leader, timeout_s, coordination_service,
            [m.address for m in spec.members], time.monotonic() - start, devices,
        )
        return _group


def _reset_for_tests() -> None:
    """Forgets the group (unit tests only; TF's set-up itself cannot be undone)."""
    global _group
    _group = None
