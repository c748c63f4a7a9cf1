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
    launch: {log_all_tasks: false}

Every value is validated when the dataclass is built; a bad value raises
:class:`tfdist.errors.ConfigError` naming the field, the value received and
the fix.
"""

from __future__ import annotations

import dataclasses
import json
import os
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
    "parse_task",
]

#: Jobs a cluster may have, in TF_CONFIG (Kubeflow TFJob) spelling.
JOB_NAMES = ("chief", "worker", "ps", "evaluator", "input")
#: Placeholder address for a task whose port the local launcher will choose.
UNASSIGNED = "127.0.0.1:0"
_LOCAL_HOSTS = ("127.0.0.1", "localhost", "::1", "[::1]")


def _fail(path: str, value: Any, fix: str) -> ConfigError:
    return ConfigError(f"Invalid config field `{path}`. Received: {path}={value!r}. {fix}")


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
        staleness: SSP bound ``s``. Defaults to 3.
        replicas_to_aggregate: SyncReplicas ``M``. Defaults to ``None``
            (all workers).
        min_staleness: DTSSP lower bound (and start). Defaults to 3.
        max_staleness: DTSSP upper bound. Defaults to 10.
        window: DTSSP loss window in global clocks. Defaults to 10.
        delta: DTSSP dead band of the learning-progress ratio. Defaults to 0.01.
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
            Defaults to ``1``.
    """

    consistency: str = "async"
    staleness: int = 3
    replicas_to_aggregate: int | None = None
    min_staleness: int = 3
    max_staleness: int = 10
    window: int = 10
    delta: float = 0.01
    overlap_exchange: bool = True
    exchange_every: int = 1

    def __post_init__(self):
        if not isinstance(self.overlap_exchange, bool):
            raise _fail("strategy.overlap_exchange", self.overlap_exchange, "Give true or false.")
        allowed = ("async", "bsp", "sync_replicas", "ssp", "dtssp")
        if self.consistency not in allowed:
            raise _fail("strategy.consistency", self.consistency, f"Use one of {list(allowed)}.")
        k = self.exchange_every
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise _fail("strategy.exchange_every", k, "Give an integer >= 1 (steps per exchange with the PS).")
        if k > 1 and self.consistency != "async":
            raise _fail("strategy.exchange_every", k,
                        f"Only consistency: async can exchange less often than every step; {self.consistency!r} "
                        "counts or aggregates every step. Use 1, or consistency: async.")
        for name in ("staleness", "min_staleness", "max_staleness"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise _fail(f"strategy.{name}", v, "Give an integer >= 0.")
        if self.min_staleness > self.max_staleness:
            raise _fail("strategy.min_staleness", self.min_staleness,
                        f"It must not exceed strategy.max_staleness ({self.max_staleness}).")
        if self.replicas_to_aggregate is not None and (
            isinstance(self.replicas_to_aggregate, bool) or not isinstance(self.replicas_to_aggregate, int)
            or self.replicas_to_aggregate < 1
        ):
            raise _fail("strategy.replicas_to_aggregate", self.replicas_to_aggregate,
                        "Give an integer >= 1, or null for all workers.")
        if isinstance(self.window, bool) or not isinstance(self.window, int) or self.window < 1:
            raise _fail("strategy.window", self.window, "Give an integer >= 1 (global clocks per loss window).")
        if not isinstance(self.delta, (int, float)) or self.delta < 0:
            raise _fail("strategy.delta", self.delta, "Give a number >= 0.")

    def policy_spec(self, num_workers: int) -> dict[str, Any]:
        """The policy spec (see ``tfdist.consistency``) this section describes."""
        name = self.consistency
        if name == "async":
            return {"policy": "async"}
        if name == "ssp":
            return {"policy": "ssp", "staleness": self.staleness, "refresh_every_step": False}
        if name == "dtssp":
            return {"policy": "dtssp", "min_staleness": self.min_staleness, "max_staleness": self.max_staleness,
                    "window": self.window, "delta": self.delta}
        m = self.replicas_to_aggregate or num_workers
        if m > num_workers:
            raise _fail(
                "strategy.replicas_to_aggregate", m,
                f"The job has {num_workers} worker(s); aggregating more gradients than workers per step "
                "(accumulation across steps) is not supported. Use at most the number of workers.",
            )
        return {"policy": name, "replicas_to_aggregate": m}


@dataclass
class PSConfig:
    """Parameter-server behaviour.

    Attributes:
        placement: ``"round_robin"`` (TF1 ``replica_device_setter``: variables
            in creation order over PS tasks) or ``"greedy"`` (largest first
            onto the least-loaded task). Defaults to ``"round_robin"``.
        partition_threshold_bytes: Variables larger than this are split by rows
            across all PS tasks. Defaults to ``None`` (never split).
        rpc_timeout_s: Deadline of every worker→PS call. Defaults to 30.
        startup_timeout_s: How long a worker waits for a PS to answer at start
            and for the chief to initialise the variables. Defaults to 120.
        max_message_bytes: Largest message a PS accepts. Defaults to 512 MiB.
        heartbeat_interval_s: How often workers heart-beat. Defaults to 2.
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
    """

    placement: str = "round_robin"
    partition_threshold_bytes: int | None = None
    rpc_timeout_s: float = constants.DEFAULT_RPC_TIMEOUT_S
    startup_timeout_s: float = constants.DEFAULT_STARTUP_TIMEOUT_S
    max_message_bytes: int = constants.DEFAULT_MAX_MESSAGE_BYTES
    heartbeat_interval_s: float = constants.DEFAULT_HEARTBEAT_INTERVAL_S
    heartbeat_timeout_s: float = constants.DEFAULT_HEARTBEAT_TIMEOUT_S
    max_updates_per_s: float | None = None
    tune_malloc: bool = True

    def __post_init__(self):
        if not isinstance(self.tune_malloc, bool):
            raise _fail("ps.tune_malloc", self.tune_malloc, "Give true or false.")
        if self.max_updates_per_s is not None and (
            isinstance(self.max_updates_per_s, bool) or not isinstance(self.max_updates_per_s, (int, float))
            or self.max_updates_per_s <= 0
        ):
            raise _fail("ps.max_updates_per_s", self.max_updates_per_s,
                        "Give a positive number of updates per second, or null for no cap.")
        if self.placement not in ("round_robin", "greedy"):
            raise _fail("ps.placement", self.placement, 'Use "round_robin" or "greedy".')
        if self.partition_threshold_bytes is not None and (
            not isinstance(self.partition_threshold_bytes, int) or self.partition_threshold_bytes <= 0
        ):
            raise _fail(
                "ps.partition_threshold_bytes",
                self.partition_threshold_bytes,
                "Give a positive number of bytes, or null to never partition.",
            )
        for name in ("rpc_timeout_s", "startup_timeout_s", "heartbeat_interval_s", "heartbeat_timeout_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
                raise _fail(f"ps.{name}", value, "Give a positive number of seconds.")
        if isinstance(self.max_message_bytes, bool) or not isinstance(self.max_message_bytes, int) or self.max_message_bytes < 1024:
            raise _fail("ps.max_message_bytes", self.max_message_bytes, "Give a number of bytes >= 1024.")


@dataclass
class SecurityConfig:
    """Access to the parameter servers.

    Every PS call must carry the job's secret token. The local launcher makes
    a fresh one per job; for multi-machine jobs put the same token in the
    environment variable named by ``token_env`` on every machine.

    Attributes:
        token: The token itself. Prefer ``token_env``: a token in a file ends
            up in version control. Defaults to ``None``.
        token_env: Environment variable holding the token. Defaults to
            ``"TFDIST_TOKEN"``.
        tls_cert: PEM certificate chain of the PS (enables TLS with ``tls_key``).
        tls_key: PEM private key of the PS.
        tls_ca: PEM root certificate workers use to verify the PS.
    """

    token: str | None = None
    token_env: str = constants.ENV_TOKEN
    tls_cert: str | None = None
    tls_key: str | None = None
    tls_ca: str | None = None

    def __post_init__(self):
        if self.token is not None and (not isinstance(self.token, str) or len(self.token) < 8):
            raise ConfigError(
                "Invalid config field `security.token`: it must be a string of at "
                "least 8 characters (value not shown). Prefer setting it in the "
                f"environment variable named by `security.token_env` ({self.token_env})."
            )
        if bool(self.tls_cert) != bool(self.tls_key):
            raise _fail(
                "security.tls_cert",
                self.tls_cert,
                "Give both `security.tls_cert` and `security.tls_key`, or neither.",
            )
        for name in ("tls_cert", "tls_key", "tls_ca"):
            path = getattr(self, name)
            if path is not None and not isinstance(path, str):
                raise _fail(f"security.{name}", path, "Give a path to a PEM file.")

    @property
    def tls(self) -> bool:
        return bool(self.tls_cert or self.tls_ca)

    def resolve_token(self) -> str | None:
        """The token: explicit value first, then the environment."""
        return self.token or os.environ.get(self.token_env) or None

    def __repr__(self) -> str:  # never show the token
        shown = "***" if self.token else None
        return (
            f"SecurityConfig(token={shown!r}, token_env={self.token_env!r}, "
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
            "steps_per_epoch": 40}}``; see ``tfdist.testing.Slowdown``.
        threads_per_task: TensorFlow intra-op threads of each training task
            (chief, worker, evaluator) of a *local* launch, where all tasks
            share one machine's cores. ``"auto"`` (the default) divides the
            cores among those tasks when there are several (at least 1 each);
            a number sets it; ``null`` leaves TensorFlow's default (every task
            uses every core). A ``TF_NUM_INTRAOP_THREADS`` already in the
            environment or in ``launch.env`` wins. ``--task`` launches (one
            task per machine) are never changed.
    """

    log_all_tasks: bool = False
    log_dir: str | None = None
    job_timeout_s: float | None = None
    env: dict[str, str] = field(default_factory=dict)
    input_args: list[str] = field(default_factory=list)
    slowdown: dict[str, dict] = field(default_factory=dict)
    threads_per_task: int | str | None = "auto"

    def __post_init__(self):
        t = self.threads_per_task
        if not (t is None or t == "auto" or (isinstance(t, int) and not isinstance(t, bool) and t > 0)):
            raise _fail("launch.threads_per_task", t,
                        'Give "auto" (divide the cores among local training tasks), a positive number, or null.')
        if self.job_timeout_s is not None and (not isinstance(self.job_timeout_s, (int, float)) or self.job_timeout_s <= 0):
            raise _fail("launch.job_timeout_s", self.job_timeout_s, "Give a positive number of seconds or null.")
        if not isinstance(self.env, dict) or not all(isinstance(k, str) for k in self.env):
            raise _fail("launch.env", self.env, "Give a mapping of variable names to values.")
        self.env = {k: str(v) for k, v in self.env.items()}
        if not isinstance(self.input_args, list):
            raise _fail("launch.input_args", self.input_args, "Give a list of command-line arguments.")
        self.input_args = [str(a) for a in self.input_args]
        if not isinstance(self.slowdown, dict):
            raise _fail("launch.slowdown", self.slowdown, 'Map tasks to settings, e.g. {"worker:1": {"factor": 3}}.')
        for task, spec in self.slowdown.items():
            parse_task(task)
            from tfdist.testing.slowdown import Slowdown

            try:
                Slowdown(**spec)
            except (TypeError, ValueError) as e:
                raise _fail(f"launch.slowdown.{task}", spec, str(e)) from None


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
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < low or (
                    high is not None and value > high):
                raise _fail(f"elastic.{name}", value,
                            f"Give a number >= {low}" + (f" and <= {high}." if high is not None else "."))

        for name in ("enabled", "autoscale", "replace_stragglers"):
            if not isinstance(getattr(self, name), bool):
                raise _fail(f"elastic.{name}", getattr(self, name), "Write true or false.")
        integer("min_workers", 1)
        integer("max_workers", 1)
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
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
                raise _fail(f"elastic.{name}", value, "Give a positive number of seconds.")
        if self.utility is not None:
            kind = self.utility.get("kind") if isinstance(self.utility, Mapping) else None
            if kind not in _UTILITY_KINDS:
                raise _fail("elastic.utility", self.utility,
                            'Write {kind: linear, value_per_s: V} or {kind: deadline, deadline_s: D, value: V}, or null.')


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
}


def _build(cls, data: Any, path: str):
    if data is None:
        data = {}
    if not isinstance(data, Mapping):
        raise _fail(path, data, "Write this section as a mapping of fields.")
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - names)
    if unknown:
        raise ConfigError(
            f"Unknown config field `{path}.{unknown[0]}`. Received: {dict(data)!r}. "
            f"Fields of `{path}` are: {sorted(names)}."
        )
    return cls(**dict(data))


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

    def __post_init__(self):
        if not isinstance(self.name, str) or not self.name or any(c in self.name for c in "/\\ "):
            raise _fail("name", self.name, "Give a short job name without spaces or slashes.")
        if self.elastic.enabled:
            self._check_elastic_cluster()

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
            raise ConfigError(f"A config must be a mapping. Received: {type(data).__name__}.")
        top = {"name"} | set(_SECTIONS)
        unknown = sorted(set(data) - top)
        if unknown:
            raise ConfigError(
                f"Unknown config field `{unknown[0]}`. Top-level fields are: {sorted(top)}."
            )
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
    def from_tf_config(cls, tf_config: str | Mapping[str, Any] | None = None) -> tuple["JobConfig", TaskSpec]:
        """Reads ``TF_CONFIG`` (the argument, else the environment variable).

        Returns:
            ``(config, task)``; options other than the cluster keep defaults
            unless ``TFDIST_CONFIG`` is also set.
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
        base = os.environ.get(constants.ENV_CONFIG)
        config = cls.from_json(base) if base else cls()
        config.cluster = ClusterConfig.from_cluster_spec(tf_config["cluster"])
        task_info = tf_config.get("task") or {}
        task = TaskSpec(task_info.get("type", "worker"), int(task_info.get("index", 0)))
        return config, task


def load_config(source: str | os.PathLike | Mapping[str, Any]) -> JobConfig:
    """Loads a :class:`JobConfig` from a YAML/JSON file path or a mapping.

    Raises:
        ConfigError: the file is missing, not YAML, or has a bad field.
    """
    if isinstance(source, Mapping):
        return JobConfig.from_dict(source)
    path = os.fspath(source)
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        raise ConfigError(f"Cannot read config file {path!r}: {e.strerror}.") from e
    import yaml

    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ConfigError(f"Config file {path!r} is not valid YAML: {e}") from e
    try:
        return JobConfig.from_dict(data or {})
    except ConfigError as e:
        raise ConfigError(f"{path}: {e}") from e
