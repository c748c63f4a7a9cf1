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
import os
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

__all__ = ["WorkerGroup", "init_worker_group", "get_worker_group", "DEFAULT_TIMEOUT_S", "GROUP_KEY"]

logger = logging.getLogger(__name__)

#: Default timeout of every collective, seconds.
DEFAULT_TIMEOUT_S = 30.0
#: TF collective group key of the tfdist worker group (any int32 other groups do not use).
GROUP_KEY = 7_301

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
    def all_gather(self, values: Sequence[float] | np.ndarray, timeout_s: float | None = None) -> np.ndarray:
        """Every task's ``values`` (same length everywhere), as ``[size, len]`` in worker-id order.

        Raises:
            CollectiveTimeoutError: not every task joined within the timeout.
            CollectivePeerError: a peer is gone.
            CollectiveError: the group failed earlier, or tasks sent different lengths.
        """
        row = np.concatenate([[float(self.worker_id)], np.asarray(values, dtype=np.float64).ravel()])
        if not self._enabled:
            return row[None, 1:]
        flat = self._run("CollectiveGatherV2", row, timeout_s)
        if flat.size != self.size * row.size:
            raise self._fail(CollectiveError(
                f"all_gather: tasks sent different lengths (got {flat.size} values for {self.size} tasks x "
                f"{row.size}). Every task must call the same collectives in the same order."
            ))
        table = flat.reshape(self.size, row.size)
        order = np.argsort(table[:, 0], kind="stable")
        table = table[order]
        if table[:, 0].tolist() != list(range(self.size)):
            raise self._fail(CollectiveError(f"all_gather: worker ids {table[:, 0].tolist()} are not 0..{self.size - 1}."))
        return table[:, 1:]

    def all_reduce_min(self, values: Sequence[float] | np.ndarray, timeout_s: float | None = None) -> np.ndarray:
        """Element-wise minimum of every task's ``values``."""
        arr = np.asarray(values, dtype=np.float64).ravel()
        if not self._enabled:
            return arr.copy()
        return self._run("CollectiveReduceV2", arr, timeout_s, merge_op="Min")

    def _run(self, op: str, values: np.ndarray, timeout_s: float | None, **attrs) -> np.ndarray:
        import tensorflow as tf

        timeout = self.timeout_s if timeout_s is None else float(timeout_s)
        with self._lock:
            if self.broken is not None:
                raise CollectiveError(
                    f"The worker group failed earlier ({self.broken}); TF aborts every collective of the "
                    "process after a failure. Restart the task to exchange again.",
                    peers=self.broken.peers,
                )
            self._instance_key += 1
            key = self._instance_key
            start = time.monotonic()
            try:
                with tf.device(self.spec.me.device):
                    x = tf.constant(values, dtype=tf.float64)
                    kwargs = dict(input=x, group_size=self.size, group_key=GROUP_KEY, instance_key=key,
                                  ordering_token=[], timeout_seconds=timeout)
                    if op == "CollectiveGatherV2":
                        out = tf.raw_ops.CollectiveGatherV2(**kwargs)
                    else:
                        out = tf.raw_ops.CollectiveReduceV2(final_op="Id", **attrs, **kwargs)
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
    lines = [ln for ln in text.splitlines() if ln.strip()]
    return (lines[0] if lines else type(e).__name__)[:400]


def get_worker_group() -> WorkerGroup | None:
    """The group :func:`init_worker_group` set up in this process, or ``None``."""
    return _group


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
    from tfdist.config import ClusterConfig, JobConfig, TaskSpec, parse_task

    for name, value in (("timeout_s", timeout_s), ("startup_timeout_s", startup_timeout_s),
                        ("heartbeat_timeout_s", heartbeat_timeout_s), ("shutdown_timeout_s", shutdown_timeout_s)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
            raise CollectiveSetupError(f"`{name}` must be a positive number of seconds. Received: {name}={value!r}.")
    if cluster is None:
        if not os.environ.get(constants.ENV_TF_CONFIG):
            logger.info("no TF_CONFIG: no worker group (single process)")
            return None
        config, env_task = JobConfig.from_tf_config()
        jobs = config.cluster.jobs()
        task = task if task is not None else env_task
    else:
        if isinstance(cluster, ClusterConfig):
            jobs = cluster.jobs()
        elif hasattr(cluster, "as_dict"):
            jobs = {j: list(t.values()) if isinstance(t, dict) else list(t) for j, t in cluster.as_dict().items()}
        else:
            jobs = {j: list(t) for j, t in dict(cluster).items()}
        if task is None:
            raise CollectiveSetupError("A cluster was given without the task of this process. Pass task='worker:0'.")
    task = parse_task(task) if isinstance(task, str) else task
    if not isinstance(task, TaskSpec):
        raise CollectiveSetupError(f"`task` must be 'job:index' or a TaskSpec. Received: task={task!r}.")
    if task.job not in ("chief", "worker"):
        logger.info("task %s is not a training task: it joins no worker group", task)
        return None
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
