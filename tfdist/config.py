"""Job configuration: YAML file ↔ dataclasses ↔ ``tf.train.ClusterSpec`` ↔ ``TF_CONFIG``.

A config file in ``configs/`` maps one to one onto :class:`JobConfig`::

    name: digits-async
    cluster:            # a count per job (local launch, free ports) ...
      ps: 2
      worker: 2
    # cluster:          # ... or explicit addresses (one task per machine)
    #   chief: ["10.0.0.1:2222"]
    #   worker: ["10.0.0.2:2222"]
    #   ps: ["10.0.0.3:2222", "10.0.0.4:2222"]
    strategy: {consistency: async}
    ps: {placement: round_robin, partition_threshold_bytes: null, rpc_timeout_s: 30}
    security: {token_env: TFDIST_TOKEN, tls_cert: null, tls_key: null, tls_ca: null}
    launch: {log_all_tasks: false, on_worker_failure: auto}

Every value is validated when the dataclass is built; a bad value raises
:class:`tfdist.errors.ConfigError` naming the field, the value received and
the fix. Durations (``*_timeout_s``, ``*_interval_s``, ``poll_s``) are finite
numbers of seconds above 0 and at most :data:`MAX_SECONDS` (booleans are not
numbers). Files are read by :func:`read_config_file`: at most
:data:`MAX_CONFIG_BYTES`, UTF-8, YAML whose aliases expand to at most
:data:`MAX_CONFIG_NODES` nodes.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import json
import math
import os
import re
from dataclasses import dataclass, field
from typing import Any, Mapping

from tfdist import constants
from tfdist.errors import ConfigError

__all__ = [
    "ClusterConfig",
    "StrategyConfig",
    "PSConfig",
    "SecurityConfig",
    "LaunchConfig",
    "ElasticConfig",
    "TaskSpec",
    "JobConfig",
    "load_config",
    "read_config_file",
    "parse_task",
    "MAX_SECONDS",
    "MAX_CONFIG_BYTES",
    "MAX_CONFIG_NODES",
]

#: Jobs a cluster may have, in TF_CONFIG (Kubeflow TFJob) spelling.
JOB_NAMES = ("chief", "worker", "ps", "evaluator", "input")
#: Placeholder address for a task whose port the local launcher will choose.
UNASSIGNED = "127.0.0.1:0"
_LOCAL_HOSTS = ("127.0.0.1", "localhost", "::1", "[::1]")
#: Longest duration a ``*_timeout_s`` / ``*_interval_s`` field accepts: one year (longer is a typo, and
#: larger values overflow thread and gRPC deadlines).
MAX_SECONDS = 365 * 24 * 3600
#: Most tasks a job given as a count may have: a count means tasks on 127.0.0.1, one port each, and a
#: host has 64511 non-privileged ports. (A local launch has a lower limit: ``tfdist.cluster.local``.)
MAX_TASK_COUNT = 65535 - 1024
#: Largest config file read (a job config is a few KiB; a bigger file is the wrong file or an attack).
MAX_CONFIG_BYTES = 1024 * 1024
#: Most YAML nodes a config file may expand to, every use of an alias counted in full ("billion laughs").
MAX_CONFIG_NODES = 100_000
#: An environment variable's name (POSIX portable: what ``launch.env`` may set).
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
#: Variables the launcher sets for each task (``launch.env`` may not override them).
_LAUNCHER_ENV = ("TF_CONFIG", "TFDIST_CONFIG", "TFDIST_TOKEN")
#: The policies of ``launch.on_worker_failure`` (see ``tfdist.cluster.failure``).
ON_WORKER_FAILURE = ("auto", "continue", "stop")


def _fail(path: str, value: Any, fix: str) -> ConfigError:
    return ConfigError(f"Invalid config field `{path}`. Received: {path}={value!r}. {fix}")


#: Largest integer a config field takes (exact in a float64 and in JSON); beyond it is a typo, and a
#: larger value overflows float conversions, thread counts and gRPC options where the task starts.
MAX_CONFIG_INT = 2**53


def _is_number(value: Any) -> bool:
    """A real int or float (``True`` is not a number of seconds; 10**400 is not a finite number)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and (
        not isinstance(value, int) or abs(value) <= MAX_CONFIG_INT)


def _check_integers(path: str, value: Any) -> None:
    """Refuses any integer beyond ``MAX_CONFIG_INT`` anywhere in a config mapping, naming its field."""
    if isinstance(value, int) and not isinstance(value, bool):
        if abs(value) > MAX_CONFIG_INT:
            raise ConfigError(
                f"Invalid config field `{path}`. Received: an integer of {value.bit_length()} bits. Integers in a "
                f"config are at most 2**53 ({MAX_CONFIG_INT}); give a value in the field's range."
            )
    elif isinstance(value, Mapping):
        for key, item in value.items():
            _check_integers(f"{path}.{key}" if path else str(key), item)
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            _check_integers(f"{path}[{i}]", item)


def _check_number(path: str, value: Any, low: float | None = None, high: float | None = None,
                  low_open: bool = False) -> None:
    """Raises unless ``value`` is a finite number within ``[low, high]`` (``(low, high]`` with ``low_open``)."""
    ok = _is_number(value) and math.isfinite(value) and (
        low is None or (value > low if low_open else value >= low)) and (high is None or value <= high)
    if not ok:
        bounds = []
        if low is not None:
            bounds.append(f"{'>' if low_open else '>='} {low:g}")
        if high is not None:
            bounds.append(f"<= {high:g}")
        raise _fail(path, value, "Give a finite number" + (f" {' and '.join(bounds)}" if bounds else "") + ".")


def _check_seconds(path: str, value: Any, nullable: bool = False) -> None:
    """Raises unless ``value`` is a finite number of seconds in ``(0, MAX_SECONDS]`` (or null when allowed)."""
    if value is None and nullable:
        return
    if not (_is_number(value) and math.isfinite(value) and 0 < value <= MAX_SECONDS):
        raise _fail(path, value, f"Give a number of seconds above 0 and at most {MAX_SECONDS} (one year)"
                    + (", or null for no limit." if nullable else "."))


def _address_key(address: str) -> str:
    """``host:port`` with the host spelled one way (case, brackets, ``localhost``), to find duplicates."""
    host, _, port = address.rpartition(":")
    host = host.strip("[]").lower()
    return f"{'127.0.0.1' if host == 'localhost' else host}:{port}"


def _check_address(path: str, address: Any) -> str:
    if not isinstance(address, str) or ":" not in address:
        raise _fail(path, address, 'Write each task address as "host:port", e.g. "127.0.0.1:2222".')
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit() or not 0 <= int(port) < 65536:
        raise _fail(path, address, 'Write each task address as "host:port" with a port in 0..65535.')
    return address


@dataclass
class ClusterConfig:
    """The tasks of a job, by job name, as lists of ``host:port`` addresses.

    In a YAML file a job may be given as a count (``ps: 2``); its tasks then
    get the address ``127.0.0.1:0`` and the local launcher picks free ports.

    Attributes:
        chief: Zero or one chief. The chief trains like a worker and also
            initialises the parameter servers. Defaults to none (worker 0
            initialises them).
        worker: Worker tasks. At least one chief or worker is required.
        ps: Parameter-server tasks (the parameter-server strategies need at
            least one; an all-reduce job needs none).
        evaluator: Side-car evaluators (read parameters, never push).
        input: Shared input-queue tasks (see ``tfdist.data``).
    """

    chief: list[str] = field(default_factory=list)
    worker: list[str] = field(default_factory=list)
    ps: list[str] = field(default_factory=list)
    evaluator: list[str] = field(default_factory=list)
    input: list[str] = field(default_factory=list)

    def __post_init__(self):
        for job in JOB_NAMES:
            value = getattr(self, job)
            if isinstance(value, bool):
                raise _fail(f"cluster.{job}", value, "Give a task count or a list of addresses.")
            if isinstance(value, int):
                if value < 0:
                    raise _fail(f"cluster.{job}", value, "A task count must be >= 0.")
                if value > MAX_TASK_COUNT:
                    raise _fail(f"cluster.{job}", value,
                                f"A count means tasks on this machine, each on its own port, and a machine has "
                                f"{MAX_TASK_COUNT} ports to give (a local launch runs far fewer tasks). Use fewer, or "
                                "list host:port addresses and start one task per machine with --task.")
                value = [UNASSIGNED] * value
            elif value is None:
                value = []
            elif isinstance(value, (list, tuple)):
                value = [_check_address(f"cluster.{job}[{i}]", a) for i, a in enumerate(value)]
            else:
                raise _fail(f"cluster.{job}", value, "Give a task count or a list of addresses.")
            setattr(self, job, list(value))
        if len(self.chief) > 1:
            raise _fail("cluster.chief", self.chief, "A cluster has at most one chief.")
        if not self.chief and not self.worker:
            raise _fail("cluster.worker", self.worker, "Give at least one chief or worker task.")
        self._check_distinct_addresses()

    def _check_distinct_addresses(self) -> None:
        """Two tasks cannot listen on one ``host:port`` (port 0, chosen later, may repeat)."""
        seen: dict[str, str] = {}
        for job in JOB_NAMES:
            for i, address in enumerate(getattr(self, job)):
                if address.endswith(":0"):
                    continue
                key, where = _address_key(address), f"cluster.{job}[{i}]"
                if key in seen:
                    raise _fail(where, address,
                                f"{seen[key]} has the same address; two tasks cannot listen on one host:port. "
                                "Give every task its own port (or write a count, e.g. `worker: 2`, and let the "
                                "local launcher pick free ports).")
                seen[key] = where

    # ------------------------------------------------------------------ views
    def jobs(self) -> dict[str, list[str]]:
        """Non-empty jobs as ``{job: [address, ...]}`` (TF_CONFIG ``cluster``)."""
        return {job: list(getattr(self, job)) for job in JOB_NAMES if getattr(self, job)}

    @property
    def num_workers(self) -> int:
        """Training tasks: the chief (if any) plus the workers."""
        return len(self.chief) + len(self.worker)

    def training_tasks(self) -> list[tuple[str, int]]:
        """``[(job, index), ...]`` of training tasks in worker-id order."""
        return [("chief", 0)] * len(self.chief) + [("worker", i) for i in range(len(self.worker))]

    def worker_id(self, job: str, index: int) -> int:
        """The global worker id of a training task (chief is 0 when present)."""
        try:
            return self.training_tasks().index((job, index))
        except ValueError:
            raise ConfigError(
                f"Task {job}:{index} is not a training task of this cluster. "
                f"Training tasks: {self.training_tasks()}."
            ) from None

    def is_unassigned(self) -> bool:
        """True if any task still needs a port chosen by the local launcher."""
        return any(a.endswith(":0") for addrs in self.jobs().values() for a in addrs)

    def is_local(self) -> bool:
        """True if every task runs on this machine."""
        return all(a.rpartition(":")[0] in _LOCAL_HOSTS for addrs in self.jobs().values() for a in addrs)

    # ------------------------------------------------------------- conversion
    def to_cluster_spec(self):
        """Returns the equivalent ``tf.train.ClusterSpec``."""
        import tensorflow as tf

        return tf.train.ClusterSpec(self.jobs())

    @classmethod
    def from_cluster_spec(cls, spec) -> "ClusterConfig":
        """Builds a config from a ``tf.train.ClusterSpec`` (or its dict)."""
        jobs = spec.as_dict() if hasattr(spec, "as_dict") else dict(spec)
        unknown = set(jobs) - set(JOB_NAMES)
        if unknown:
            raise ConfigError(
                f"ClusterSpec has unknown job names {sorted(unknown)}. "
                f"tfdist understands {list(JOB_NAMES)}."
            )
        fixed = {}
        for job, tasks in jobs.items():
            if isinstance(tasks, dict):  # sparse ClusterSpec: {index: address}
                tasks = [tasks[i] for i in sorted(tasks)]
            fixed[job] = list(tasks)
        return cls(**fixed)


@dataclass
class StrategyConfig:
    """How workers exchange parameters (DESIGN.md §4).

    Attributes:
        consistency: ``"async"`` (ASP: push every step, never wait),
            ``"bsp"`` (every live worker's gradient, every step),
            ``"sync_replicas"`` (first ``replicas_to_aggregate`` gradients of
            every step; later ones dropped), ``"ssp"`` (bounded staleness
            ``staleness``) or ``"dtssp"`` (SSP whose bound moves within
            ``[min_staleness, max_staleness]`` by learning progress).
            Defaults to ``"async"``.
        staleness: SSP bound ``s``. Defaults to ``None``: the mode's (3).
        replicas_to_aggregate: SyncReplicas ``M``. Defaults to ``None``
            (all workers).
        min_staleness: DTSSP lower bound (and start). Defaults to ``None``: the mode's (3).
        max_staleness: DTSSP upper bound. Defaults to ``None``: the mode's (10).
        window: DTSSP loss window in global clocks. Defaults to ``None``: the mode's (10).
        delta: DTSSP dead band of the learning-progress ratio. Defaults to ``None``: the mode's (0.01).

    The modes and their parameters' defaults are the registered descriptors'
    (:mod:`tfdist.consistency.modes`); a field left ``None`` takes the mode's.
        overlap_exchange: Async (ASP) only: send each step's update and pull
            fresh values in the background while the next step computes on
            the local values; the fresh values are folded in when they arrive
            (no local update is lost; a step may compute on values one
            exchange older). Defaults to ``True``.
        exchange_every: Async (ASP) only: exchange with the PS after every
            ``k``-th step instead of every step (local SGD with a
            communication period of ``k``). The ``k`` local updates travel as
            one summed delta, so none is lost, and the PS counts them as ``k``
            batches; steps compute on values up to ``k`` exchanges stale.
            Worth it where the exchange costs about as much as a step (large
            models, few cores, slow links). Pending updates are sent before
            every evaluation/prediction pull and when the worker stops.
            ``"auto"``: each worker chooses ``k`` as it trains, from the CPU
            its exchanges and its steps take: the fewest steps per exchange
            that keep an exchange's CPU (the worker's, plus what serving it
            cost the PS tasks, which report it over their stream
            connections) within a tenth of its steps'
            (:class:`~tfdist.strategies._schedules.Adaptive`; it steps
            down only with half a step to spare, so that a measure near a
            boundary does not flip it), from 1 to
            ``exchange_every_max``, and never more steps than keep one
            exchange's update within 1 % of the weights it changes (local
            steps cost accuracy when the weights move fast: a digits job
            with Adam 1e-2 lost about 0.1 of held-out accuracy at a fixed
            k = 4; the bound keeps such a job at 1-2 steps per exchange; see
            docs/benchmarks.md). Defaults to ``"auto"`` under ``async`` and
            ``1`` (the only value they take) under the other modes.
        exchange_every_max: The most steps per exchange ``exchange_every:
            auto`` may choose: the bound on how many steps a worker's update
            may wait before it reaches the PS. Defaults to ``8``.
        lone_worker_exchange_s: Async (ASP) only, a job with exactly one
            training worker (not elastic): nobody else writes to the PS, so
            the worker's steps run without any exchange (Keras's own step and
            a step counter) and a background thread sends their summed update
            every this many seconds (and before every pull, checkpoint, local
            write and at the end). The PS, an evaluator and the PS checkpoints
            see the job at most this long (plus one exchange) behind; a PS
            task lost in between loses those steps as it loses the steps
            since its checkpoint. ``0``: exchange as a job with several
            workers does (``exchange_every``). Defaults to ``0.1``.
    """

    consistency: str = "async"
    staleness: int | None = None
    replicas_to_aggregate: int | None = None
    min_staleness: int | None = None
    max_staleness: int | None = None
    window: int | None = None
    delta: float | None = None
    overlap_exchange: bool = True
    exchange_every: int | str | None = None
    exchange_every_max: int = 8
    lone_worker_exchange_s: float = 0.1

    def __post_init__(self):
        _check_number("strategy.lone_worker_exchange_s", self.lone_worker_exchange_s, 0, MAX_SECONDS)
        if not isinstance(self.overlap_exchange, bool):
            raise _fail("strategy.overlap_exchange", self.overlap_exchange, "Give true or false.")
        from tfdist.consistency import MODES

        if not isinstance(self.consistency, str) or self.consistency not in MODES:
            raise _fail("strategy.consistency", self.consistency, f"Use one of {list(MODES)}.")
        mode = MODES[self.consistency]
        k = self.exchange_every
        if k is None:
            k = self.steps_per_exchange  # the mode's default
        if k != "auto" and (isinstance(k, bool) or not isinstance(k, int) or k < 1):
            raise _fail("strategy.exchange_every", k,
                        'Give an integer >= 1 (steps per exchange with the PS), or "auto".')
        m = self.exchange_every_max
        if isinstance(m, bool) or not isinstance(m, int) or not 1 <= m <= 1000:
            raise _fail("strategy.exchange_every_max", m, "Give an integer from 1 to 1000 (steps per exchange).")
        if (k == "auto" or k > 1) and not mode.local_steps:
            local = [name for name, m in MODES.items() if m.local_steps]
            raise _fail("strategy.exchange_every", k,
                        f"Only consistency {local} can exchange less often than every step; {self.consistency!r} "
                        f"counts or aggregates every step. Use 1, or consistency: {local[0]}.")
        for name in ("staleness", "min_staleness", "max_staleness"):
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
                raise _fail(f"strategy.{name}", v, "Give an integer >= 0.")
        low, high = self._param("min_staleness"), self._param("max_staleness")
        if low is not None and high is not None and low > high:
            raise _fail("strategy.min_staleness", low, f"It must not exceed strategy.max_staleness ({high}).")
        if self.replicas_to_aggregate is not None and (
            isinstance(self.replicas_to_aggregate, bool) or not isinstance(self.replicas_to_aggregate, int)
            or self.replicas_to_aggregate < 1
        ):
            raise _fail("strategy.replicas_to_aggregate", self.replicas_to_aggregate,
                        "Give an integer >= 1, or null for all workers.")
        if self.window is not None and (isinstance(self.window, bool) or not isinstance(self.window, int)
                                        or self.window < 1):
            raise _fail("strategy.window", self.window, "Give an integer >= 1 (global clocks per loss window).")
        if self.delta is not None:
            _check_number("strategy.delta", self.delta, low=0)

    @property
    def steps_per_exchange(self) -> int | str:
        """``exchange_every``, or the mode's default when it is ``None``: ``"auto"`` where local steps exist."""
        if self.exchange_every is not None:
            return self.exchange_every
        from tfdist.consistency import MODES

        return "auto" if MODES[self.consistency].local_steps else 1

    def _param(self, name: str) -> Any:
        """A parameter of the chosen mode: this section's field, or the mode's default when it is ``None``."""
        from tfdist.consistency import MODES

        value = getattr(self, name, None)
        if value is None:
            value = MODES[self.consistency].params.get(name)
        return value

    def policy_spec(self, num_workers: int) -> dict[str, Any]:
        """The policy spec (see ``tfdist.consistency``) this section describes, checked against the job's size."""
        from tfdist.consistency import MODES

        mode = MODES[self.consistency]
        params = {p: getattr(self, p) if getattr(self, p, None) is not None else default
                  for p, default in mode.params.items()}
        if "replicas_to_aggregate" in params:
            params["replicas_to_aggregate"] = params["replicas_to_aggregate"] or num_workers
        mode.check_workers(params, num_workers)
        return mode.policy(params, num_workers).spec()


@dataclass
class PSConfig:
    """Parameter-server behaviour.

    Attributes:
        placement: ``"round_robin"`` (TF1 ``replica_device_setter``: variables
            in creation order over PS tasks) or ``"greedy"`` (largest first
            onto the least-loaded task). Defaults to ``"round_robin"``.
        partition_threshold_bytes: Variables larger than this are split by rows
            across all PS tasks. Defaults to ``None`` (never split).
        resident_threshold_bytes: A ``keras.layers.Embedding`` whose table is
            at least this large lives only on the PS tasks, as a
            ``tfdist.layers.ShardedEmbedding`` would (rows split over the tasks,
            looked up and updated per row), without changing the model.
            Defaults to ``None`` (only ``ShardedEmbedding`` layers do).
        rpc_timeout_s: Deadline of every worker→PS call. Defaults to 30.
        startup_timeout_s: How long a worker waits for a PS to answer at start
            and for the chief to initialise the variables. Defaults to 120.
        max_message_bytes: Largest message a PS accepts. Defaults to 512 MiB.
        heartbeat_interval_s: How often workers heart-beat. Must be below
            ``heartbeat_timeout_s``. Defaults to 2.
        heartbeat_timeout_s: A worker silent this long is not live. Keep it
            well below ``rpc_timeout_s``: survivors wait this long for a
            dead worker's part of a barrier. Defaults to 10.
        max_updates_per_s: Caps how many pushes (update path) or gradients
            (gradient path) each PS task applies per second; further ones
            queue. ``None`` (the default) is no cap. Use it to emulate a
            parameter server of limited capacity, e.g. the throughput knee an
            autoscaler must find.
        tune_malloc: Keep multi-MB message buffers in the heap of PS and
            worker processes instead of a fresh ``mmap`` per message (glibc
            only; see :mod:`tfdist.ps.memory`). Defaults to ``True``.
        nonfinite: What a PS does with an update, gradient or value that
            holds NaN or Inf: ``"refuse"`` (the default: the request is
            refused with an error naming the variable and the worker, and
            the stored values stay finite) or ``"allow"`` (stored as sent).
            The chief's setting holds for the job.
        checkpoint_dir: Where every PS task writes checkpoints of its shard
            (``<dir>/ps-<i>/``) and, when it starts, restores the newest one
            from: a local path (a volume every restart of the task sees) or
            a URL ``tf.io.gfile`` writes (``gs://``, ``s3://``). ``None``
            (the default): no checkpoints; a PS task that restarts is
            initialised again from the chief's current values (async, SSP,
            DTSSP) — see docs/fault_tolerance.md.
        checkpoint_every_s: With ``checkpoint_dir``: write a checkpoint this
            often (when the shard changed). Defaults to 60; ``null``: not by time.
        checkpoint_every_steps: With ``checkpoint_dir``: also write one each
            time the shard's step (batches applied on the update path, the
            global step on the gradient path) reaches a multiple of this;
            on the gradient path every task then checkpoints the same steps
            (a consistent cut). Defaults to ``None``.
        checkpoint_keep: Checkpoints kept per PS task. Defaults to 3.
        reconnect_timeout_s: How long a worker that lost a PS task keeps
            trying to reach it again (a restart) before it fails. Defaults
            to 60.
        transport: How the data plane (pulls, pushes, row lookups) travels:
            ``"auto"`` (the default) over each PS task's lean TCP transport
            (:mod:`tfdist.stream_service`, a second port the task picks and
            announces; about a fifth of gRPC's CPU per megabyte), falling
            back to gRPC for a task whose port cannot be reached; ``"grpc"``:
            every call over gRPC (one port per task, e.g. behind a firewall
            that opens only that one). A job with TLS always uses gRPC.
        shared_memory: With ``transport: auto``, a worker and a PS task on
            the same host pass large message bodies through a shared-memory
            region (``/dev/shm``) instead of the loopback TCP stack, which
            costs both processes several times the CPU of a copy (see
            :mod:`tfdist.stream_service`); the frames still travel over the
            connection, so deadlines, lost tasks and refusals are as before.
            Where no region can be made (no ``/dev/shm``, full, another user)
            the bodies go over the socket; bodies over 64 MiB always do (a
            kept connection holds a region the size of its largest body).
            Defaults to ``True``.
        stream_port: The port each PS task serves its lean transport on
            (``transport: auto``), the same on every task, e.g. to open it in
            a firewall or a Kubernetes ``NetworkPolicy`` (the manifests then
            declare it). ``None`` (the default): a free port each task picks
            and announces. A fixed port needs each PS task on a host of its
            own: a local launch (every task on one host) refuses it with
            more than one PS task.
    """

    placement: str = "round_robin"
    partition_threshold_bytes: int | None = None
    resident_threshold_bytes: int | None = None
    rpc_timeout_s: float = constants.DEFAULT_RPC_TIMEOUT_S
    startup_timeout_s: float = constants.DEFAULT_STARTUP_TIMEOUT_S
    max_message_bytes: int = constants.DEFAULT_MAX_MESSAGE_BYTES
    heartbeat_interval_s: float = constants.DEFAULT_HEARTBEAT_INTERVAL_S
    heartbeat_timeout_s: float = constants.DEFAULT_HEARTBEAT_TIMEOUT_S
    max_updates_per_s: float | None = None
    tune_malloc: bool = True
    nonfinite: str = "refuse"
    checkpoint_dir: str | None = None
    checkpoint_every_s: float | None = 60.0
    checkpoint_every_steps: int | None = None
    checkpoint_keep: int = 3
    reconnect_timeout_s: float = constants.DEFAULT_RECONNECT_TIMEOUT_S
    transport: str = "auto"
    shared_memory: bool = True
    stream_port: int | None = None

    def __post_init__(self):
        if self.checkpoint_dir is not None and (not isinstance(self.checkpoint_dir, str) or not self.checkpoint_dir):
            raise _fail("ps.checkpoint_dir", self.checkpoint_dir,
                        "Give a directory path or URL (gs://..., s3://...), or null for no checkpoints.")
        _check_seconds("ps.checkpoint_every_s", self.checkpoint_every_s, nullable=True)
        _check_seconds("ps.reconnect_timeout_s", self.reconnect_timeout_s)
        for name, value, nullable in (("checkpoint_every_steps", self.checkpoint_every_steps, True),
                                      ("checkpoint_keep", self.checkpoint_keep, False)):
            if (value is None and nullable) or (isinstance(value, int) and not isinstance(value, bool) and value >= 1):
                continue
            raise _fail(f"ps.{name}", value, "Give a whole number >= 1" + (", or null." if nullable else "."))
        if self.transport not in ("auto", "grpc"):
            raise _fail("ps.transport", self.transport, 'Use "auto" (the default) or "grpc".')
        if not isinstance(self.shared_memory, bool):
            raise _fail("ps.shared_memory", self.shared_memory, "Give true or false.")
        p = self.stream_port
        if p is not None and (not isinstance(p, int) or isinstance(p, bool) or not 1 <= p <= 65535):
            raise _fail("ps.stream_port", p, "Give a TCP port from 1 to 65535, or null for a free port per task.")
        if self.nonfinite not in ("refuse", "allow"):
            raise _fail("ps.nonfinite", self.nonfinite, 'Use "refuse" (the default) or "allow".')
        if not isinstance(self.tune_malloc, bool):
            raise _fail("ps.tune_malloc", self.tune_malloc, "Give true or false.")
        if self.max_updates_per_s is not None and not (
            _is_number(self.max_updates_per_s) and math.isfinite(self.max_updates_per_s) and self.max_updates_per_s > 0
        ):
            raise _fail("ps.max_updates_per_s", self.max_updates_per_s,
                        "Give a finite positive number of updates per second, or null for no cap.")
        if self.placement not in ("round_robin", "greedy"):
            raise _fail("ps.placement", self.placement, 'Use "round_robin" or "greedy".')
        if self.resident_threshold_bytes is not None and (
            not isinstance(self.resident_threshold_bytes, int) or isinstance(self.resident_threshold_bytes, bool)
            or self.resident_threshold_bytes <= 0
        ):
            raise _fail("ps.resident_threshold_bytes", self.resident_threshold_bytes,
                        "Give a positive number of bytes (an Embedding table at least this large lives on the PS "
                        "tasks), or null.")
        if self.partition_threshold_bytes is not None and (
            not _is_number(self.partition_threshold_bytes) or not isinstance(self.partition_threshold_bytes, int)
            or self.partition_threshold_bytes <= 0
        ):
            raise _fail(
                "ps.partition_threshold_bytes",
                self.partition_threshold_bytes,
                "Give a positive number of bytes, or null to never partition.",
            )
        for name in ("rpc_timeout_s", "startup_timeout_s", "heartbeat_interval_s", "heartbeat_timeout_s"):
            _check_seconds(f"ps.{name}", getattr(self, name))
        if self.heartbeat_interval_s >= self.heartbeat_timeout_s:
            raise ConfigError(
                "Invalid config fields `ps.heartbeat_interval_s` and `ps.heartbeat_timeout_s`: workers would "
                "heart-beat no more often than the silence that declares them dead. Received: "
                f"ps.heartbeat_interval_s={self.heartbeat_interval_s!r}, "
                f"ps.heartbeat_timeout_s={self.heartbeat_timeout_s!r}. Make the interval smaller than the timeout "
                "(a third of it or less leaves room for a late heart-beat), e.g. 2 and 30."
            )
        if isinstance(self.max_message_bytes, bool) or not isinstance(self.max_message_bytes, int) \
                or not 1024 <= self.max_message_bytes <= 2**31 - 1:
            raise _fail("ps.max_message_bytes", self.max_message_bytes,
                        "Give a number of bytes from 1024 to 2147483647 (gRPC's largest message, 2 GiB - 1).")

    def check_checkpoint_dir(self) -> None:
        """Checks that a local ``checkpoint_dir`` is, or can become, a directory on this machine.

        A URL (``gs://``, ``s3://``, ...) is left to ``tf.io.gfile``. Called
        where a PS task starts (``python -m tfdist.ps``) and by a local launch
        before anything starts, not when a config loads: ``--emit`` writes a
        path inside the pods.

        Raises:
            ConfigError: the path, or a folder above it, is an existing file
                (every checkpoint would fail), naming ``ps.checkpoint_dir``.
        """
        path = self.checkpoint_dir
        if not path or "://" in path:
            return
        probe = os.path.abspath(path)
        while not os.path.exists(probe):
            parent = os.path.dirname(probe)
            if parent == probe:
                return
            probe = parent
        if not os.path.isdir(probe):
            where = "is a file" if probe == os.path.abspath(path) else f"is under {probe!r}, which is a file"
            raise _fail("ps.checkpoint_dir", path,
                        f"The checkpoint directory {where}, so every checkpoint would fail. Give a directory "
                        "path (it is created if missing) or a URL (gs://..., s3://...), or null for no checkpoints.")


#: PEM block each TLS file must hold, by field.
_PEM_BLOCKS = {
    "tls_cert": ("CERTIFICATE", re.compile(rb"-----BEGIN (?:TRUSTED )?CERTIFICATE-----")),
    "tls_key": ("PRIVATE KEY", re.compile(rb"-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY-----")),
    "tls_ca": ("CERTIFICATE", re.compile(rb"-----BEGIN (?:TRUSTED )?CERTIFICATE-----")),
}
_ANY_PEM_BLOCK = re.compile(rb"-----BEGIN ([A-Z0-9 ]+)-----")
#: TLS files each kind of task reads (``check_tls_files(job=...)``); ``None``: a local launch reads them all.
_TLS_FILES_BY_JOB = {"ps": ("tls_cert", "tls_key"), "chief": ("tls_ca",), "worker": ("tls_ca",),
                     "evaluator": ("tls_ca",), "input": ("tls_cert", "tls_key"),
                    None: ("tls_cert", "tls_key", "tls_ca")}
_MAX_PEM_BYTES = 1024 * 1024


@dataclass
class SecurityConfig:
    """Access to the parameter servers.

    Every PS call must carry the job's secret token. The local launcher makes
    a fresh one per job; for multi-machine jobs put the same token in the
    environment variable named by ``token_env`` on every machine.

    TLS is all or nothing: the PS serves with ``tls_cert`` and ``tls_key``
    and the workers verify it with ``tls_ca``, so give all three or none.
    The files are checked (they exist, can be read and hold the right PEM
    block) by :meth:`check_tls_files`, which ``python -m tfdist.launch`` calls
    before starting anything; each machine of a ``--task`` launch checks only
    the files its task reads.

    Attributes:
        token: The token itself. Prefer ``token_env``: a token in a file ends
            up in version control. Defaults to ``None``.
        token_env: Environment variable holding the token. Defaults to
            ``"TFDIST_TOKEN"``.
        token_file: File holding the token (its first line), read when
            neither ``token`` nor the ``token_env`` variable is set: a
            mounted Kubernetes Secret (``--emit`` sets it to
            ``/etc/tfdist/token/token``, mode 0400). Defaults to ``None``.
        tls_cert: PEM certificate chain of the PS (enables TLS with ``tls_key``).
        tls_key: PEM private key of the PS.
        tls_ca: PEM root certificate workers use to verify the PS (the PS's own
            certificate when it is self-signed).
    """

    token: str | None = None
    token_env: str = constants.ENV_TOKEN
    token_file: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None
    tls_ca: str | None = None

    def __post_init__(self):
        if self.token_file is not None and (not isinstance(self.token_file, str) or not self.token_file):
            raise _fail("security.token_file", self.token_file,
                        "Give the path of a file holding the job token (e.g. a mounted Secret), or null.")
        if not isinstance(self.token_env, str) or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", self.token_env):
            raise _fail("security.token_env", self.token_env,
                        f"Give the name of an environment variable, e.g. {constants.ENV_TOKEN!r}.")
        if self.token is not None and (not isinstance(self.token, str) or len(self.token) < 8):
            raise ConfigError(
                "Invalid config field `security.token`: it must be a string of at "
                "least 8 characters (value not shown). Prefer setting it in the "
                f"environment variable named by `security.token_env` ({self.token_env})."
            )
        for name in ("tls_cert", "tls_key", "tls_ca"):
            path = getattr(self, name)
            if path is not None and (not isinstance(path, str) or not path):
                raise _fail(f"security.{name}", path, "Give the path of a PEM file for TLS, or null.")
        if bool(self.tls_cert) != bool(self.tls_key):
            given, missing = ("tls_cert", "tls_key") if self.tls_cert else ("tls_key", "tls_cert")
            raise _fail(f"security.{given}", getattr(self, given),
                        f"TLS needs both `security.tls_cert` and `security.tls_key` (the PS's certificate and its "
                        f"private key), and `security.{missing}` is missing. Give both, or neither.")
        if bool(self.tls_cert) != bool(self.tls_ca):
            if self.tls_ca:
                raise _fail("security.tls_ca", self.tls_ca,
                            "TLS needs both sides: workers verify the PS with `security.tls_ca`, but the PS has no "
                            "certificate to serve TLS with. Give `security.tls_cert` and `security.tls_key` too, "
                            "or remove `security.tls_ca`.")
            raise _fail("security.tls_ca", None,
                        "TLS needs both sides: the PS serves TLS with `security.tls_cert`/`tls_key`, and workers "
                        "need `security.tls_ca` (the CA that signed that certificate, or the certificate itself "
                        "when it is self-signed) to verify it. Give it, or remove tls_cert and tls_key.")

    def tls_fields(self, job: str | None = None) -> tuple[str, ...]:
        """The TLS fields (``"tls_cert"``, ``"tls_key"``, ``"tls_ca"``) set here that a task of ``job`` reads.

        Args:
            job: The kind of task: ``"ps"`` reads ``tls_cert`` and ``tls_key``;
                ``"chief"``, ``"worker"``, ``"evaluator"`` read ``tls_ca``;
                ``"input"`` (the shared queue, served with TLS like the PS)
                reads ``tls_cert`` and ``tls_key``. Defaults to ``None``: every file (a
                local launch runs every task on one machine).
        """
        return tuple(name for name in _TLS_FILES_BY_JOB.get(job, _TLS_FILES_BY_JOB[None]) if getattr(self, name))

    def check_tls_files(self, job: str | None = None) -> None:
        """Checks that the TLS files a task reads exist, can be read and are PEM.

        Args:
            job: The kind of task on this machine (``"ps"`` reads ``tls_cert``
                and ``tls_key``; ``"chief"``, ``"worker"``, ``"evaluator"``
                read ``tls_ca``). Defaults to ``None``: every file (a local
                launch runs every task here).

        Raises:
            ConfigError: naming the field and the file, and saying what is wrong.
        """
        for name in self.tls_fields(job):
            path = getattr(self, name)
            what, pattern = _PEM_BLOCKS[name]
            role = {"tls_cert": "the PS's TLS certificate", "tls_key": "the PS's TLS private key",
                    "tls_ca": "the TLS root certificate workers verify the PS with"}[name]

            def bad(problem: str) -> ConfigError:
                return _fail(f"security.{name}", path,
                             f"The TLS file {problem}. Give the path of a PEM file with {role} "
                             f"(a '-----BEGIN {what}-----' block), readable on every machine whose task uses it.")

            try:
                with open(path, "rb") as f:
                    data = f.read(_MAX_PEM_BYTES + 1)
            except FileNotFoundError:
                raise bad("does not exist") from None
            except IsADirectoryError:
                raise bad("is not a file (a directory)") from None
            except PermissionError:
                raise bad("cannot be read (permission denied)") from None
            except OSError as e:
                raise bad(f"cannot be read ({e.strerror or e})") from None
            if len(data) > _MAX_PEM_BYTES:
                raise bad("is not PEM (it is larger than 1 MiB)")
            if pattern.search(data) is None:
                found = _ANY_PEM_BLOCK.search(data)
                if found is None:
                    raise bad("is not PEM (no '-----BEGIN ...-----' block)")
                block = found.group(1).decode("ascii")
                hint = " (did you swap `security.tls_cert` and `security.tls_key`?)" \
                    if name in ("tls_cert", "tls_key") else ""
                raise bad(f"holds a {block} block but no {what}{hint}")

    @property
    def tls(self) -> bool:
        return bool(self.tls_cert or self.tls_ca)

    def resolve_token(self) -> str | None:
        """The token: explicit value first, then the environment, then ``token_file``.

        Raises:
            ConfigError: ``token_file`` is needed and cannot be read, or is empty.
        """
        token = self.token or os.environ.get(self.token_env)
        if token or not self.token_file:
            return token or None
        try:
            with open(self.token_file, encoding="utf-8") as f:
                token = f.read(4096).strip().splitlines()[0:1]
        except (OSError, UnicodeDecodeError) as e:
            raise _fail("security.token_file", self.token_file,
                        f"The token file cannot be read ({getattr(e, 'strerror', None) or e}). Mount the token "
                        f"Secret there (readable by this process's user or group), or set {self.token_env}.") from None
        if not token or not token[0]:
            raise _fail("security.token_file", self.token_file, "The token file is empty. Put the job token in it.")
        return token[0]

    def __repr__(self) -> str:  # never show the token
        shown = "***" if self.token else None
        return (
            f"SecurityConfig(token={shown!r}, token_env={self.token_env!r}, token_file={self.token_file!r}, "
            f"tls_cert={self.tls_cert!r}, tls_key={self.tls_key!r}, tls_ca={self.tls_ca!r})"
        )


@dataclass
class LaunchConfig:
    """Local launcher options.

    Attributes:
        log_all_tasks: Forward every task's stdout (progress bars) instead of
            the chief's only. Logs (stderr) of all tasks are always forwarded,
            prefixed. Defaults to ``False``.
        log_dir: Where each task's full output is written. Defaults to
            ``runs/<name>``.
        job_timeout_s: Stop the whole job after this many seconds. Defaults to
            ``None`` (no limit).
        env: Extra environment variables for every task.
        input_args: Extra arguments for ``input`` tasks (``python -m
            tfdist.data.queue_service``), e.g. ``["--producer", "mymod:make",
            "--queue", "shuffle"]``; the launcher adds ``--port``/``--host``.
        slowdown: Tasks to slow down on purpose (experiments), e.g.
            ``{"worker:2": {"factor": 3, "schedule": "first_half",
            "steps_per_epoch": 40}}``; see ``tfdist.slowdown.Slowdown``.
        threads_per_task: TensorFlow intra-op threads of each training task
            (chief, worker, evaluator) of a *local* launch, where all tasks
            share one machine's cores. ``"auto"`` (the default) divides the
            cores among those tasks when there are several (at least 1 each);
            a number sets it; ``null`` leaves TensorFlow's default (every task
            uses every core). A ``TF_NUM_INTRAOP_THREADS`` already in the
            environment or in ``launch.env`` wins. ``--task`` launches (one
            task per machine) are never changed.
        on_worker_failure: What a local launch does when a training task
            exits non-zero. ``"auto"`` (the default) goes on without a worker
            the consistency mode can do without — any worker but the chief
            (worker 0) under ``async``, ``ssp``, ``dtssp`` and ``bsp``; under
            ``sync_replicas`` while at least ``replicas_to_aggregate``
            workers remain; any worker of an elastic job — and stops the job
            otherwise. ``"continue"`` never stops for a worker other than the
            chief; ``"stop"`` stops the whole job when any task fails. A
            parameter server or the chief is first restarted
            (``restart_ps``, ``restart_chief``, ``max_restarts``); their
            failure beyond that, and an input task's, stops the job; a job
            that went on exits 0 when the chief (and every worker not left
            out) exited 0. See
            :func:`tfdist.cluster.failure.decide_worker_failure`.
        restart_ps: A local launch starts a parameter-server task that died
            again at the same address (it restores its newest checkpoint
            when ``ps.checkpoint_dir`` is set; workers reconnect within
            ``ps.reconnect_timeout_s``). Defaults to ``True``.
        restart_chief: A local launch of a parameter-server job starts the
            chief (worker 0) again when it is killed (a signal): the new
            process runs the script from its start and joins the running job
            (it loads the job's values from the parameter servers instead of
            initialising them). A chief that ends by itself with an error (a
            Python exception, exit codes 1-127) is not restarted: its error
            is the job's result (see
            :func:`tfdist.cluster.failure.decide_chief_restart`). Defaults to
            ``True``. Elastic jobs and jobs without parameter servers never
            restart it.
        max_restarts: Restarts allowed per task (each PS task, the chief)
            before a death stops the job. Defaults to 3.
    """

    log_all_tasks: bool = False
    log_dir: str | None = None
    job_timeout_s: float | None = None
    env: dict[str, str] = field(default_factory=dict)
    input_args: list[str] = field(default_factory=list)
    slowdown: dict[str, dict] = field(default_factory=dict)
    threads_per_task: int | str | None = "auto"
    on_worker_failure: str = "auto"
    restart_ps: bool = True
    restart_chief: bool = True
    max_restarts: int = 3

    def __post_init__(self):
        for name in ("restart_ps", "restart_chief"):
            if not isinstance(getattr(self, name), bool):
                raise _fail(f"launch.{name}", getattr(self, name), "Give true or false.")
        if isinstance(self.max_restarts, bool) or not isinstance(self.max_restarts, int) or self.max_restarts < 0:
            raise _fail("launch.max_restarts", self.max_restarts, "Give a whole number >= 0.")
        t = self.threads_per_task
        if not (t is None or t == "auto" or (isinstance(t, int) and not isinstance(t, bool) and 0 < t <= 4096)):
            raise _fail("launch.threads_per_task", t,
                        'Give "auto" (divide the cores among local training tasks), a number from 1 to 4096, or null.')
        if not isinstance(self.log_all_tasks, bool):
            raise _fail("launch.log_all_tasks", self.log_all_tasks, "Give true or false.")
        if self.log_dir is not None and (not isinstance(self.log_dir, str) or not self.log_dir):
            raise _fail("launch.log_dir", self.log_dir, "Give a directory path, or null for runs/<name>-<time>.")
        _check_seconds("launch.job_timeout_s", self.job_timeout_s, nullable=True)
        if not isinstance(self.on_worker_failure, str) or self.on_worker_failure not in ON_WORKER_FAILURE:
            raise _fail("launch.on_worker_failure", self.on_worker_failure,
                        f"Use one of {list(ON_WORKER_FAILURE)}: auto goes on without a worker the consistency mode "
                        "can do without, continue goes on without any worker but the chief, stop stops the job.")
        if not isinstance(self.env, dict) or not all(isinstance(k, str) for k in self.env):
            raise _fail("launch.env", self.env, "Give a mapping of variable names to values.")
        for name, value in self.env.items():
            if not _ENV_NAME.fullmatch(name):
                raise _fail(f"launch.env.{name}", value, "An environment variable's name is letters, digits and "
                            "underscores, not starting with a digit (no '=', no spaces, not empty).")
            if name in _LAUNCHER_ENV:
                raise _fail(f"launch.env.{name}", value, f"The launcher sets {name} for each task itself; "
                            "remove it from launch.env (the token: security.token_env or security.token_file).")
            if value is None or isinstance(value, (dict, list)) or "\0" in str(value):
                raise _fail(f"launch.env.{name}", value, "Give a string, number or boolean (no NUL character).")
        self.env = {k: str(v) for k, v in self.env.items()}
        if not isinstance(self.input_args, list):
            raise _fail("launch.input_args", self.input_args, "Give a list of command-line arguments.")
        for i, arg in enumerate(self.input_args):
            if arg is None or isinstance(arg, (dict, list)) or "\0" in str(arg):
                raise _fail(f"launch.input_args[{i}]", arg, "Give each argument as a string or number (no NUL).")
        self.input_args = [str(a) for a in self.input_args]
        if not isinstance(self.slowdown, dict):
            raise _fail("launch.slowdown", self.slowdown, 'Map tasks to settings, e.g. {"worker:1": {"factor": 3}}.')
        for task, spec in self.slowdown.items():
            try:
                parse_task(task)
            except ConfigError as e:
                raise ConfigError(f"Invalid config field `launch.slowdown`: {e}") from None
            from tfdist.slowdown import Slowdown

            if not isinstance(spec, Mapping):
                raise _fail(f"launch.slowdown.{task}", spec, 'Give its settings as a mapping, e.g. {"factor": 3}.')
            try:
                Slowdown(**spec)
            except (TypeError, ValueError) as e:
                raise _fail(f"launch.slowdown.{task}", spec, str(e)) from None


#: Jobs whose pods ``--emit`` writes resources for.
_K8S_JOBS = ("chief", "worker", "ps", "evaluator", "input")
#: ``kubernetes.resources`` defaults: requests so no pod is BestEffort (and a namespace whose ResourceQuota has
#: no LimitRange accepts it), a memory limit well above them; no CPU limit (throttling slows the exchange).
DEFAULT_K8S_RESOURCES: dict[str, dict[str, dict[str, str]]] = {
    "chief": {"requests": {"cpu": "1", "memory": "2Gi"}, "limits": {"memory": "8Gi"}},
    "worker": {"requests": {"cpu": "1", "memory": "2Gi"}, "limits": {"memory": "8Gi"}},
    "evaluator": {"requests": {"cpu": "1", "memory": "2Gi"}, "limits": {"memory": "8Gi"}},
    "ps": {"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"memory": "8Gi"}},
    "input": {"requests": {"cpu": "500m", "memory": "512Mi"}, "limits": {"memory": "2Gi"}},
}
_K8S_QUANTITY = re.compile(r"[0-9]+(\.[0-9]+)?(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?")
_K8S_RESOURCE_NAME = re.compile(r"([a-z0-9.-]+/)?[a-zA-Z0-9]([-a-zA-Z0-9_.]*[a-zA-Z0-9])?")
_PULL_POLICIES = ("Always", "IfNotPresent", "Never")


@dataclass
class KubernetesConfig:
    """What ``python -m tfdist.launch --emit`` writes into the pods beyond the tasks (docs/kubernetes.md).

    A local launch ignores this section.

    Attributes:
        resources: ``{job: {"requests": {...}, "limits": {...}}}`` per job
            (``chief``, ``worker``, ``ps``, ``evaluator``, ``input``); a job
            given here replaces its default, the others keep theirs. Defaults:
            requests of 1 CPU and 2Gi (training pods), 1 CPU and 1Gi (PS),
            500m and 512Mi (input), memory limits 8Gi (2Gi for input), no
            CPU limit. ``{}`` for a job writes no resources for it.
        image_pull_policy: ``imagePullPolicy`` of every container:
            ``Always``, ``IfNotPresent`` or ``Never``. Defaults to ``"IfNotPresent"``.
        ttl_seconds_after_finished: Kubernetes deletes a finished job (and
            its pods' logs) this long after it ended (``ttlSecondsAfterFinished``);
            ``None`` keeps it until deleted. Defaults to 86400 (a day).
        run_as_user: User (and group, and ``fsGroup``) id every container runs
            as; the pods are "restricted" under Pod Security (non-root,
            no privilege escalation, every capability dropped,
            ``RuntimeDefault`` seccomp). Defaults to 1000.
    """

    resources: dict[str, dict] = field(default_factory=lambda: copy.deepcopy(DEFAULT_K8S_RESOURCES))
    image_pull_policy: str = "IfNotPresent"
    ttl_seconds_after_finished: int | None = 86400
    run_as_user: int = 1000

    def __post_init__(self):
        if not isinstance(self.resources, Mapping):
            raise _fail("kubernetes.resources", self.resources,
                        'Map jobs to their resources, e.g. {worker: {requests: {cpu: "2", memory: 4Gi}}}.')
        unknown = sorted(set(self.resources) - set(_K8S_JOBS), key=str)
        if unknown:
            raise _fail(f"kubernetes.resources.{unknown[0]}", self.resources[unknown[0]],
                        f"Resources are given per job: {list(_K8S_JOBS)}.")
        merged = copy.deepcopy(DEFAULT_K8S_RESOURCES)
        for job, spec in self.resources.items():
            path = f"kubernetes.resources.{job}"
            if not isinstance(spec, Mapping) or set(spec) - {"requests", "limits"}:
                raise _fail(path, spec, 'Give {requests: {cpu: "1", memory: 2Gi}, limits: {memory: 8Gi}} (or {}).')
            out = {}
            for kind, values in spec.items():
                if not isinstance(values, Mapping):
                    raise _fail(f"{path}.{kind}", values, 'Map resource names to quantities, e.g. {cpu: "500m"}.')
                checked = {}
                for name, quantity in values.items():
                    text = str(quantity) if isinstance(quantity, (int, float)) and not isinstance(quantity, bool) \
                        else quantity
                    if not isinstance(name, str) or not _K8S_RESOURCE_NAME.fullmatch(name) or \
                            not isinstance(text, str) or not _K8S_QUANTITY.fullmatch(text):
                        raise _fail(f"{path}.{kind}.{name}", quantity,
                                    'Give a Kubernetes quantity, e.g. cpu: "500m", memory: 2Gi, nvidia.com/gpu: 1.')
                    checked[name] = text
                out[kind] = checked
            merged[job] = out
        self.resources = merged
        if self.image_pull_policy not in _PULL_POLICIES:
            raise _fail("kubernetes.image_pull_policy", self.image_pull_policy, f"Use one of {list(_PULL_POLICIES)}.")
        ttl = self.ttl_seconds_after_finished
        if ttl is not None and (isinstance(ttl, bool) or not isinstance(ttl, int) or not 0 <= ttl <= 2 ** 31 - 1):
            raise _fail("kubernetes.ttl_seconds_after_finished", ttl,
                        "Give whole seconds >= 0 after which Kubernetes deletes the finished job, or null to keep it.")
        uid = self.run_as_user
        if isinstance(uid, bool) or not isinstance(uid, int) or not 1 <= uid <= 2 ** 31 - 1:
            raise _fail("kubernetes.run_as_user", uid,
                        "Give a non-root user id (1 or more; Pod Security 'restricted' refuses root), e.g. 1000.")


_UTILITY_KINDS = ("linear", "deadline")


@dataclass
class ElasticConfig:
    """Elastic membership and the autoscaling engine (``tfdist.elastic``).

    With this section present (``enabled`` defaults to true then), the
    cluster lists ``max_workers`` training tasks, the launcher starts
    ``initial_workers`` of them, and the engine adds, removes and replaces
    workers while the job runs. See docs/elastic.md.

    Attributes:
        enabled: Run the job elastically. Defaults to ``False`` when the
            section is absent, ``True`` when it is written.
        min_workers: Fewest training workers. Defaults to 1.
        max_workers: Most training workers (the cluster gets this many
            ``worker`` slots). Defaults to 8.
        initial_workers: Workers at start. Defaults to ``min_workers``.
        step: ``K``, workers added per scale-up. Defaults to 1.
        interval_batches: ``N``, global batches per measurement window.
            Defaults to 50.
        min_samples: Measurement windows at a size before it is judged.
            Defaults to 2.
        efficiency_threshold: A scale-up is kept only while its scaling
            efficiency exceeds this. Defaults to 0.1 (Or et al.).
        price_per_worker_s: ``P``, cost of one worker-second (same unit as the
            utility). Defaults to 0 (workers are free: only efficiency counts).
        utility: ``None``, ``{"kind": "linear", "value_per_s": v}`` or
            ``{"kind": "deadline", "deadline_s": d, "value": v}``: the value of
            finishing after ``T`` seconds.
        autoscale: Let the engine change the number of workers. ``False``
            keeps the size fixed (membership and straggler replacement still
            work). Defaults to ``True``.
        warmup_batches: Batches a joining worker trains locally (building and
            tracing its model) before it joins the job. Defaults to 3.
        total_batches: The job's work in global batches; workers stop when
            the parameter servers have applied this many. Defaults to
            ``None`` (the workers' own ``fit`` decides).
        replace_stragglers: Replace persistent stragglers. Defaults to ``True``.
        max_spares: Most replacement workers starting at once. Defaults to 1.
        straggler_threshold: Persistent straggler while the EWMA of its
            throughput ÷ the median is below this. Defaults to 0.8.
        ewma_alpha: EWMA weight of the newest window. Defaults to 0.1.
        poll_s: How often the engine reads the PS counters. Defaults to 0.5.
        drain_timeout_s: How long a worker asked to leave may take before it
            is stopped. Defaults to 30.
    """

    enabled: bool = False
    min_workers: int = 1
    max_workers: int = 8
    initial_workers: int | None = None
    step: int = 1
    interval_batches: int = 50
    min_samples: int = 2
    efficiency_threshold: float = 0.1
    price_per_worker_s: float = 0.0
    utility: dict[str, Any] | None = None
    autoscale: bool = True
    warmup_batches: int = 3
    total_batches: int | None = None
    replace_stragglers: bool = True
    max_spares: int = 1
    straggler_threshold: float = 0.8
    ewma_alpha: float = 0.1
    poll_s: float = 0.5
    drain_timeout_s: float = 30.0

    def __post_init__(self):
        def integer(name, low, value=None):
            value = getattr(self, name) if value is None else value
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise _fail(f"elastic.{name}", value, f"Give an integer >= {low}.")

        def number(name, low, high=None):
            _check_number(f"elastic.{name}", getattr(self, name), low=low, high=high)

        for name in ("enabled", "autoscale", "replace_stragglers"):
            if not isinstance(getattr(self, name), bool):
                raise _fail(f"elastic.{name}", getattr(self, name), "Write true or false.")
        integer("min_workers", 1)
        integer("max_workers", 1)
        if self.max_workers > MAX_TASK_COUNT:
            raise _fail("elastic.max_workers", self.max_workers,
                        f"The cluster gets a worker slot for each, and a machine has {MAX_TASK_COUNT} ports to give. "
                        "Use fewer.")
        if self.max_workers < self.min_workers:
            raise _fail("elastic.max_workers", self.max_workers,
                        f"Give at least min_workers ({self.min_workers}).")
        if self.initial_workers is None:
            self.initial_workers = self.min_workers
        integer("initial_workers", 1)
        if not self.min_workers <= self.initial_workers <= self.max_workers:
            raise _fail("elastic.initial_workers", self.initial_workers,
                        f"Give a number between min_workers ({self.min_workers}) and max_workers ({self.max_workers}).")
        integer("step", 1)
        integer("interval_batches", 1)
        integer("min_samples", 1)
        integer("warmup_batches", 0)
        integer("max_spares", 0)
        if self.total_batches is not None:
            integer("total_batches", 1)
        number("efficiency_threshold", -1.0, 1.0)
        number("price_per_worker_s", 0.0)
        number("straggler_threshold", 0.0, 1.0)
        number("ewma_alpha", 0.0, 1.0)
        for name in ("poll_s", "drain_timeout_s"):
            _check_seconds(f"elastic.{name}", getattr(self, name))
        if self.utility is not None:
            kind = self.utility.get("kind") if isinstance(self.utility, Mapping) else None
            if kind not in _UTILITY_KINDS:
                raise _fail("elastic.utility", self.utility,
                            'Write {kind: linear, value_per_s: V} or {kind: deadline, deadline_s: D, value: V}, or null.')
            from tfdist.elastic.policy import utility_from_dict

            try:
                utility_from_dict(self.utility)
            except ConfigError as e:  # it names `utility.<field>`: say which section
                raise ConfigError(str(e).replace("`utility", "`elastic.utility").replace(
                    "Received: utility", "Received: elastic.utility")) from None


@dataclass(frozen=True)
class TaskSpec:
    """One task of a cluster: ``job`` and ``index``."""

    job: str
    index: int = 0

    def __post_init__(self):
        if self.job not in JOB_NAMES:
            raise ConfigError(f"Unknown task type. Received: job={self.job!r}. Use one of {list(JOB_NAMES)}.")
        if not isinstance(self.index, int) or self.index < 0:
            raise ConfigError(f"Task index must be an integer >= 0. Received: index={self.index!r}.")

    def __str__(self) -> str:
        return f"{self.job}:{self.index}"


def parse_task(text: str) -> TaskSpec:
    """Parses ``"worker:1"`` into a :class:`TaskSpec`."""
    job, sep, index = str(text).partition(":")
    if not sep or not index.isdigit():
        raise ConfigError(f'Write a task as JOB:INDEX, e.g. "worker:1". Received: {text!r}.')
    return TaskSpec(job, int(index))


_SECTIONS = {
    "cluster": ClusterConfig,
    "strategy": StrategyConfig,
    "ps": PSConfig,
    "security": SecurityConfig,
    "launch": LaunchConfig,
    "elastic": ElasticConfig,
    "kubernetes": KubernetesConfig,
}


def _build(cls, data: Any, path: str):
    if data is None:
        data = {}
    if not isinstance(data, Mapping):
        raise _fail(path, data, "Write this section as a mapping of fields.")
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - names, key=str)
    if unknown:
        raise ConfigError(
            f"Unknown config field `{path}.{unknown[0]}`. Received: {_short_repr(dict(data))}. "
            f"Fields of `{path}` are: {sorted(names)}."
        )
    return cls(**dict(data))


def _short_repr(value: Any, limit: int = 300) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "...(cut)"


def _kind(value: Any) -> str:
    """``"a list"``, ``"an int"``: how a value's type reads in a message."""
    name = type(value).__name__
    return f"{'an' if name[:1] in 'aeiou' else 'a'} {name}"


@dataclass
class JobConfig:
    """Everything a tfdist job needs to know, in one object.

    Example:

    >>> cfg = JobConfig.from_dict({"cluster": {"ps": 1, "worker": 2}})
    >>> cfg.cluster.num_workers
    2
    """

    name: str = "tfdist"
    cluster: ClusterConfig = field(default_factory=lambda: ClusterConfig(worker=1, ps=1))
    strategy: StrategyConfig = field(default_factory=StrategyConfig)
    ps: PSConfig = field(default_factory=PSConfig)
    security: SecurityConfig = field(default_factory=SecurityConfig)
    launch: LaunchConfig = field(default_factory=LaunchConfig)
    elastic: ElasticConfig = field(default_factory=ElasticConfig)
    kubernetes: KubernetesConfig = field(default_factory=KubernetesConfig)

    def __post_init__(self):
        if not isinstance(self.name, str) or not self.name or any(c in self.name for c in "/\\ "):
            raise _fail("name", self.name, "Give a short job name without spaces or slashes.")
        if self.elastic.enabled:
            self._check_elastic_cluster()
        self._check_replicas_to_aggregate()

    def _check_replicas_to_aggregate(self) -> None:
        """SyncReplicas cannot aggregate more gradients per step than the job has workers at its start."""
        from tfdist.consistency import MODES

        have = self.starting_workers
        m = MODES[self.strategy.consistency].aggregation_size(
            {"replicas_to_aggregate": self.strategy.replicas_to_aggregate}, have)
        if m is None or m <= have:
            return
        counted = (f"elastic.initial_workers={have}" if self.elastic.enabled
                   else f"{len(self.cluster.chief)} chief + {len(self.cluster.worker)} worker task(s)")
        raise _fail("strategy.replicas_to_aggregate", m,
                    f"The job starts with {have} worker(s) ({counted}); a step cannot aggregate more gradients than "
                    "there are workers (accumulating across steps is not supported). Use at most "
                    f"{have}, or add workers.")

    def _check_elastic_cluster(self) -> None:
        """An elastic job needs a training-task slot for each of ``max_workers``."""
        need = self.elastic.max_workers
        have = self.cluster.num_workers
        if have >= need:
            return
        if self.cluster.is_unassigned() and self.cluster.is_local():
            self.cluster.worker = list(self.cluster.worker) + [UNASSIGNED] * (need - have)
            return
        raise _fail(
            "cluster.worker", self.cluster.worker,
            f"An elastic job with elastic.max_workers={need} needs {need} training-task addresses "
            f"(the cluster has {have}). List one per possible worker, or lower elastic.max_workers.",
        )

    @property
    def starting_workers(self) -> int:
        """Training workers the job starts with (and BSP/SyncReplicas count at the start)."""
        return self.elastic.initial_workers if self.elastic.enabled else self.cluster.num_workers

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "JobConfig":
        """Builds and validates a config from a (YAML/JSON) mapping."""
        if not isinstance(data, Mapping):
            raise ConfigError(
                f"A config must be a mapping of sections (name, cluster, strategy, ...). Received: {_kind(data)}, "
                f"{_short_repr(data, 100)}. Write e.g. `cluster: {{ps: 1, worker: 2}}`."
            )
        top = {"name"} | set(_SECTIONS)
        unknown = sorted(set(data) - top, key=str)
        if unknown:
            raise ConfigError(
                f"Unknown config field `{unknown[0]}`. Top-level fields are: {sorted(top)}."
            )
        _check_integers("", data)
        kwargs = {key: _build(cls_, data.get(key), key) for key, cls_ in _SECTIONS.items() if key in data}
        if isinstance(data.get("elastic"), Mapping) and "enabled" not in data["elastic"]:
            kwargs["elastic"] = dataclasses.replace(kwargs["elastic"], enabled=True)
        if "name" in data:
            kwargs["name"] = data["name"]
        return cls(**kwargs)

    def to_dict(self) -> dict[str, Any]:
        """A plain mapping that :meth:`from_dict` turns back into this config."""
        return dataclasses.asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "JobConfig":
        return cls.from_dict(json.loads(text))

    def tf_config(self, task: TaskSpec) -> dict[str, Any]:
        """The ``TF_CONFIG`` mapping for ``task`` (Kubeflow TFJob format)."""
        jobs = self.cluster.jobs()
        if task.job not in jobs or task.index >= len(jobs[task.job]):
            raise ConfigError(
                f"Task {task} is not in the cluster. Received: task={task}. "
                f"The cluster has {({j: len(a) for j, a in jobs.items()})}."
            )
        return {"cluster": jobs, "task": {"type": task.job, "index": task.index}}

    @classmethod
    def from_tf_config(
        cls, tf_config: str | Mapping[str, Any] | None = None, *, base: "JobConfig | None" = None
    ) -> tuple["JobConfig", TaskSpec]:
        """Reads ``TF_CONFIG`` (the argument, else the environment variable).

        The ``TF_CONFIG`` format only; which cluster a process belongs to is
        decided by :func:`tfdist.cluster.resolve_cluster`, which calls this.

        Args:
            tf_config: ``TF_CONFIG`` as JSON text or a mapping. Defaults to the
                environment variable.
            base: The config whose cluster is replaced by ``TF_CONFIG``'s.
                Defaults to ``TFDIST_CONFIG``, else the defaults.

        Returns:
            ``(config, task)``; options other than the cluster keep defaults
            unless ``base`` is given or ``TFDIST_CONFIG`` is also set.
        """
        if tf_config is None:
            tf_config = os.environ.get(constants.ENV_TF_CONFIG)
            if not tf_config:
                raise ConfigError(
                    "TF_CONFIG is not set. Set it (Kubeflow TFJob format) or start "
                    "the job with `python -m tfdist.launch --config FILE script.py`."
                )
        if isinstance(tf_config, str):
            try:
                tf_config = json.loads(tf_config)
            except ValueError as e:
                raise ConfigError(f"TF_CONFIG is not valid JSON: {e}. Received: {tf_config[:200]!r}.") from e
        if not isinstance(tf_config, Mapping) or "cluster" not in tf_config:
            raise ConfigError(
                'TF_CONFIG needs a "cluster" field, e.g. {"cluster": {"worker": [...], '
                f'"ps": [...]}}, "task": {{"type": "worker", "index": 0}}}}. Received: {tf_config!r}.'
            )
        if base is None:
            options = os.environ.get(constants.ENV_CONFIG)
            base = cls.from_json(options) if options else cls()
        config = base
        config.cluster = ClusterConfig.from_cluster_spec(tf_config["cluster"])
        task_info = tf_config.get("task") or {}
        task = TaskSpec(task_info.get("type", "worker"), int(task_info.get("index", 0)))
        return config, task


@functools.lru_cache(maxsize=1)
def _config_loader():
    """A ``yaml.SafeLoader`` that refuses documents whose aliases expand past :data:`MAX_CONFIG_NODES` nodes."""
    import yaml

    class ConfigLoader(yaml.SafeLoader):
        def compose_document(self):
            node = super().compose_document()
            _check_expanded_size(node, MAX_CONFIG_NODES)
            return node

    return ConfigLoader


def _check_expanded_size(root, limit: int) -> None:
    """Raises if the YAML node graph, aliases expanded, has more than ``limit`` nodes, or a cycle.

    PyYAML shares an aliased node instead of copying it, so a few hundred bytes
    of nested aliases ("billion laughs") describe billions of nodes that every
    later walk over the data (validation, ``repr``, ``asdict``) expands.
    """
    import yaml

    def children(node):
        if isinstance(node, yaml.SequenceNode):
            return node.value
        if isinstance(node, yaml.MappingNode):
            return [n for pair in node.value for n in pair]
        return ()

    size: dict[int, int] = {}
    open_nodes: set[int] = set()
    stack = [(root, False)]
    while stack:
        node, done = stack.pop()
        key = id(node)
        if done:
            open_nodes.discard(key)
            size[key] = 1 + sum(size[id(c)] for c in children(node))
            if size[key] > limit:
                raise ConfigError(
                    f"The YAML aliases (*name) expand to more than {limit} values: a config needs a few dozen. "
                    "Write the values out, or use fewer nested aliases."
                )
            continue
        if key in size:
            continue
        if key in open_nodes:
            raise ConfigError("A YAML alias (*name) refers to a value that contains it (a cycle). Remove the cycle.")
        open_nodes.add(key)
        stack.append((node, True))
        stack.extend((c, False) for c in children(node) if id(c) not in size)


def read_config_file(path: str | os.PathLike) -> Any:
    """Reads a YAML (or JSON) config file into plain Python data, refusing what no config looks like.

    Refused, with a :class:`ConfigError` naming the file: a file that cannot
    be read, one over :data:`MAX_CONFIG_BYTES`, text that is not UTF-8, YAML
    that does not parse, nests too deeply, or whose aliases expand past
    :data:`MAX_CONFIG_NODES` values. (The federated experiment loader uses it too.)
    """
    path = os.fspath(path)
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_CONFIG_BYTES + 1)
    except OSError as e:
        raise ConfigError(f"Cannot read config file {path!r}: {e.strerror or e}.") from None
    if len(raw) > MAX_CONFIG_BYTES:
        raise ConfigError(f"Config file {path!r} is larger than {MAX_CONFIG_BYTES // 1024} KiB; a config is a few "
                          "KiB. Check the path.")
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = raw.count(b"\n", 0, e.start) + 1
        raise ConfigError(f"Config file {path!r} is not UTF-8 text: byte 0x{raw[e.start]:02x} on line {line} "
                          "cannot be decoded. Save the file as UTF-8.") from None
    import yaml

    try:
        return yaml.load(text, Loader=_config_loader())  # noqa: S506 (a SafeLoader)
    except ConfigError as e:
        raise ConfigError(f"Config file {path!r}: {e}") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"Config file {path!r} is not valid YAML: {e}") from None
    except RecursionError:
        raise ConfigError(f"Config file {path!r} nests too deeply to be a config. Check the file.") from None


def load_config(source: str | os.PathLike | Mapping[str, Any]) -> JobConfig:
    """Loads a :class:`JobConfig` from a YAML/JSON file path or a mapping.

    Raises:
        ConfigError: the file is missing, not UTF-8, not YAML, too big, not a
            mapping, or has a bad field (see :func:`read_config_file`).
    """
    if isinstance(source, Mapping):
        return JobConfig.from_dict(source)
    path = os.fspath(source)
    data = read_config_file(path)
    try:
        return JobConfig.from_dict({} if data is None else data)
    except ConfigError as e:
        raise ConfigError(f"{path}: {e}") from None
