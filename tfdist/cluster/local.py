"""A whole job of local processes: ports, environments, start, watch, tear down.

Used by ``python -m tfdist.launch`` and by :class:`tfdist.testing.LocalCluster`.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import random
import secrets
import socket
import sys
import time
from typing import IO, Callable, Sequence

from tfdist import constants, exit_status
from tfdist.cluster.failure import FailureDecision, decide_chief_restart, decide_worker_failure
from tfdist.cluster.process import TaskProcess
from tfdist.config import JOB_NAMES, UNASSIGNED, ClusterConfig, JobConfig, TaskSpec
from tfdist.errors import ConfigError, LaunchError, TaskConfigError, TfdistError

__all__ = ["LocalJob", "assign_ports", "task_environment", "free_port", "free_ports", "local_task_limit",
           "check_local_task_count"]

logger = logging.getLogger(__name__)

#: Jobs whose tasks end the job when they all finish.
TRAINING_JOBS = ("chief", "worker")
#: Jobs whose tasks serve the others (:meth:`LocalJob.check_servers` watches them).
SERVER_JOBS = ("ps", "input")


#: A training task failed and no PS task answers whether it said ``Done``: how long the launcher waits for the PS
#: tasks to exit (they end by themselves once every worker said ``Done``, and may be doing so right then).
PS_END_GRACE_S = 10.0
#: Memory budgeted per task of a local launch: a TensorFlow worker process needs about this much or more.
LOCAL_TASK_MEMORY_BYTES = 256 * 1024 * 1024
#: Open files the launcher holds per task (two pipes, a log file) with room to spare.
LOCAL_TASK_OPEN_FILES = 8
#: Open files the launcher keeps for itself.
_LAUNCHER_OPEN_FILES = 64


#: The lowest port :func:`free_ports` picks when it can stay below the kernel's ephemeral range.
LISTEN_PORT_MIN = 10000
#: Random candidates :func:`free_ports` tries below the ephemeral range before it lets the kernel pick.
_LISTEN_PORT_TRIES = 64
_EPHEMERAL_RANGE_FILE = "/proc/sys/net/ipv4/ip_local_port_range"


#: ``LOW-HIGH``: :func:`free_ports` picks from ``[LOW, HIGH)`` only. Processes that pick ports at the same time
#: (the test suite's pytest-xdist workers: tests/conftest.py gives each a slice) then never pick the same one in
#: the moment between a pick and the task's bind (seen: a test's PS port bound first by another worker's job,
#: whose PS answered with the wrong token).
ENV_LISTEN_PORTS = "TFDIST_LISTEN_PORTS"


def listen_port_range() -> tuple[int, int] | None:
    """Ports ``[LISTEN_PORT_MIN, first ephemeral port)``: where the kernel never puts an outgoing connection.

    ``None`` where the range cannot be read (not Linux) or leaves fewer than 1,000 ports. ``TFDIST_LISTEN_PORTS``
    (``LOW-HIGH``, at least 100 ports within 1024..65535) replaces it.

    Raises:
        LaunchError: ``TFDIST_LISTEN_PORTS`` is set but not such a range.
    """
    override = os.environ.get(ENV_LISTEN_PORTS, "").strip()
    if override:
        try:
            low, high = (int(x) for x in override.split("-"))
        except ValueError:
            low = high = 0
        if not 1024 <= low < high <= 65536 or high - low < 100:
            raise LaunchError(f"{ENV_LISTEN_PORTS}={override!r}: give LOW-HIGH, at least 100 ports within 1024..65535 "
                              "(e.g. 20000-21000), or unset it.")
        return low, high
    try:
        with open(_EPHEMERAL_RANGE_FILE) as f:
            low = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return (LISTEN_PORT_MIN, low) if low - LISTEN_PORT_MIN >= 1000 else None


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago on ``host`` (see :func:`free_ports`)."""
    return free_ports(1, host)[0]


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """``count`` distinct TCP ports that were free a moment ago on ``host``, for tasks to listen on.

    Each port is bound here (and released when all are chosen), so none is handed out twice. The ports
    come from below the kernel's ephemeral range (:func:`listen_port_range`, 10000..32767 on a default
    Linux): a port the kernel picked (``bind`` to port 0) lies inside that range, where any process's
    next outgoing connection may take it before the task that is to listen on it starts (seen: a PS task
    of a local job failing to bind its port while other jobs' workers were connecting). Where that range
    cannot be used, or ``_LISTEN_PORT_TRIES`` random candidates in it are taken, the kernel picks.

    Raises:
        LaunchError: the machine has not that many free ports (or file descriptors).
    """
    sockets: list[socket.socket] = []
    span = listen_port_range()
    candidates = random.SystemRandom()  # not the random module's state: forked tasks share it
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            try:
                _bind_listen_port(s, host, span, candidates)
            except OSError:
                s.close()
                raise
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    except OSError as e:
        raise LaunchError(f"Could not find {count} free ports on {host} ({e.strerror or e}; {len(sockets)} "
                          "found). Use fewer tasks.") from None
    finally:
        for s in sockets:
            s.close()


def _bind_listen_port(s: socket.socket, host: str, span: tuple[int, int] | None, candidates) -> None:
    """Binds ``s`` to a random free port of ``span``, or to one the kernel picks (no span, or none free)."""
    for _ in range(_LISTEN_PORT_TRIES if span else 0):
        try:
            return s.bind((host, candidates.randrange(*span)))
        except OSError:
            continue  # in use: another candidate
    s.bind((host, 0))


def assign_ports(config: JobConfig) -> JobConfig:
    """A copy of ``config`` whose ``127.0.0.1:0`` tasks have distinct free ports."""
    config = dataclasses.replace(config, cluster=dataclasses.replace(config.cluster))
    wanted = sum(addr == UNASSIGNED for job in JOB_NAMES for addr in getattr(config.cluster, job))
    ports = iter(free_ports(wanted))
    jobs = {job: [f"127.0.0.1:{next(ports)}" if addr == UNASSIGNED else addr for addr in getattr(config.cluster, job)]
            for job in JOB_NAMES}
    config.cluster = ClusterConfig(**jobs)
    return config


def _physical_memory_bytes() -> int | None:
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        return None


def _open_file_limit() -> int | None:
    try:
        import resource

        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    except (ImportError, OSError, ValueError):
        return None
    return None if soft == resource.RLIM_INFINITY else soft


def local_task_limit(memory_bytes: int | None = None, open_files: int | None = None) -> int:
    """Most tasks a local launch starts on this machine.

    Each task is budgeted :data:`LOCAL_TASK_MEMORY_BYTES` (256 MiB) of the
    physical memory and :data:`LOCAL_TASK_OPEN_FILES` of the launcher's open
    files: a job past that cannot run here, and starting it would swap, fail
    half-way or (picking ports for 100000 tasks) hang.

    Args:
        memory_bytes: Physical memory. Defaults to this machine's.
        open_files: The launcher's open-file limit. Defaults to this process's soft ``RLIMIT_NOFILE``.
    """
    memory_bytes = _physical_memory_bytes() if memory_bytes is None else memory_bytes
    open_files = _open_file_limit() if open_files is None else open_files
    limits = []
    if memory_bytes:
        limits.append(memory_bytes // LOCAL_TASK_MEMORY_BYTES)
    if open_files:
        limits.append((open_files - _LAUNCHER_OPEN_FILES) // LOCAL_TASK_OPEN_FILES)
    return max(1, min(limits)) if limits else 1024


def check_local_task_count(config: JobConfig, limit: int | None = None) -> None:
    """Refuses a local launch of more tasks than :func:`local_task_limit` (or ``limit``).

    Raises:
        ConfigError: naming the field with the most tasks (``elastic.max_workers``
            when the elastic section sized the cluster), how many tasks, and the limit.
    """
    limit = local_task_limit() if limit is None else limit
    counts = {job: len(getattr(config.cluster, job)) for job in JOB_NAMES}
    total = sum(counts.values())
    if total <= limit:
        return
    if config.elastic.enabled and config.elastic.max_workers >= max(counts.values()):
        field, value = "elastic.max_workers", config.elastic.max_workers
    else:
        job = max(counts, key=counts.get)
        field, value = f"cluster.{job}", counts[job]
    raise ConfigError(
        f"Invalid config field `{field}`. Received: {field}={value} ({total} tasks in all). A local launch runs "
        f"every task on this machine, which runs at most {limit} (each task is budgeted "
        f"{LOCAL_TASK_MEMORY_BYTES // 2 ** 20} MiB of memory and {LOCAL_TASK_OPEN_FILES} open files). Use fewer "
        "tasks, or list host:port addresses and start one task per machine with --task."
    )


def check_local_stream_port(config: JobConfig) -> None:
    """Refuses a fixed ``ps.stream_port`` for a local launch of several PS tasks: each would bind the same port."""
    ps = len(config.cluster.ps)
    if ps < 2 or config.ps.stream_port is None or config.ps.transport != "auto" or config.security.tls:
        return
    raise ConfigError(
        f"Invalid config field `ps.stream_port`. Received: ps.stream_port={config.ps.stream_port}. Every PS task "
        f"serves its data plane on this port, and a local launch runs all {ps} PS tasks on this machine. Give "
        "null (each task picks a free port), or set ps.transport: grpc; or start one PS task per machine with --task."
    )


def task_environment(config: JobConfig, task: TaskSpec, token: str, base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment a task runs with: TF_CONFIG, TFDIST_CONFIG, token."""
    env = dict(os.environ if base is None else base)
    env.update(config.launch.env)
    env[constants.ENV_TF_CONFIG] = json.dumps(config.tf_config(task))
    public = config.to_dict()
    public["security"]["token"] = None  # the token travels only in its own variable
    env[constants.ENV_CONFIG] = json.dumps(public)
    env[config.security.token_env] = token
    if config.launch.slowdown:
        env[constants.ENV_SLOWDOWN] = json.dumps(config.launch.slowdown)
    env.setdefault("PYTHONUNBUFFERED", "1")
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    return env


#: Jobs whose tasks run TensorFlow (PS and input tasks do not).
_TF_JOBS = ("chief", "worker", "evaluator")


def local_cpu_count() -> int:
    """Cores this process may run on (its CPU affinity), at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def training_task_count(config: JobConfig) -> int:
    """Tasks of ``config`` that run TensorFlow (chief, workers, evaluator)."""
    return sum(len(getattr(config.cluster, job)) for job in _TF_JOBS)


def local_threads_per_task(config: JobConfig, cpus: int | None = None) -> int | None:
    """TensorFlow intra-op threads for each training task of a local launch (``launch.threads_per_task``).

    ``None`` means: leave TensorFlow's default. With ``"auto"``, a job of
    several training tasks (chief, workers, evaluator) on one machine gets
    ``max(1, cores // tasks)`` threads per task, so the tasks do not
    oversubscribe the cores (every TensorFlow process otherwise starts one
    intra-op thread per core and they all contend).
    """
    setting = config.launch.threads_per_task
    if setting is None:
        return None
    if setting != "auto":
        return int(setting)
    tasks = training_task_count(config)
    if tasks <= 1:
        return None
    return max(1, (cpus or local_cpu_count()) // tasks)


def task_argv(task: TaskSpec, script: str | None, script_args: Sequence[str],
              config: JobConfig | None = None) -> list[str]:
    """What a task runs: PS and input tasks need no user code; the rest run the script."""
    if task.job == "ps":
        return [sys.executable, "-m", "tfdist.ps"]
    if task.job == "input":
        if config is None:
            raise LaunchError("An input task needs the job config (its address).")
        host, _, port = config.cluster.input[task.index].rpartition(":")
        bind = host if config.cluster.is_local() else "[::]"
        return [sys.executable, "-m", "tfdist.data.queue_service", "--port", port, "--host", bind,
                *config.launch.input_args]
    if script is None:
        raise LaunchError(f"Task {task} needs a script to run, and none was given.")
    # Through tfdist.run: every way the script ends is seen before the exit hooks (a failed one never says Done)
    return [sys.executable, "-m", "tfdist.run", script, *script_args]


def _make_log_dir(path: str, setting: str) -> None:
    """Creates the job's log folder before any task starts; a folder that cannot be made is a config error."""
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as e:
        raise ConfigError(
            f"Cannot create the log folder {path!r} ({e.strerror or e}); it is set by {setting}. Give a folder "
            "path that can be created (not a file, nor under one) and written by this user."
        ) from None


class LocalJob:
    """Starts every task of ``config`` on this machine and watches them.

    Args:
        config: The job; tasks at ``127.0.0.1:0`` get free ports.
        script: The training script run by chief/worker/evaluator tasks.
        script_args: Its arguments.
        token: Job token. Defaults to the config's, else a fresh random one.
        log_dir: Directory for one log file per task. Defaults to
            ``launch.log_dir`` or ``runs/<name>-<time>``.
        out: Where forwarded output goes. Defaults to ``sys.stdout``.
        forward: Forward task output at all (tests turn it off).
        env: Extra environment per task, ``{"worker:1": {...}}``.
        fast_start: Fork the TensorFlow tasks (chief, workers, evaluator)
            from a process that imported TensorFlow and Keras once, so each
            starts in a fraction of a second instead of seconds
            (:mod:`tfdist.cluster.zygote`). Defaults to the environment
            variable ``TFDIST_FAST_START`` (off unless set to 1).
    """

    def __init__(
        self,
        config: JobConfig,
        script: str | None = None,
        script_args: Sequence[str] = (),
        token: str | None = None,
        log_dir: str | None = None,
        out: IO[str] | None = None,
        forward: bool = True,
        env: dict[str, dict[str, str]] | None = None,
        fast_start: bool | None = None,
    ):
        from tfdist.cluster.zygote import fast_start_enabled

        check_local_task_count(config)
        check_local_stream_port(config)
        #: Fork TensorFlow tasks from a zygote that imported TensorFlow once (``TFDIST_FAST_START=1``).
        self.fast_start = fast_start_enabled(fast_start)
        self.config = assign_ports(config)
        self.script = script
        self.script_args = list(script_args)
        self.token = token or self.config.security.resolve_token() or secrets.token_hex(16)
        stamp = time.strftime("%Y%m%d-%H%M%S")
        self.log_dir = log_dir or self.config.launch.log_dir or os.path.join("runs", f"{self.config.name}-{stamp}")
        _make_log_dir(self.log_dir, "--log-dir" if log_dir else "launch.log_dir" if self.config.launch.log_dir
                      else "the default log folder (runs/)")
        self.out = out
        self.forward = forward
        self.extra_env = env or {}
        self.tasks: dict[str, TaskProcess] = {}
        #: Training tasks that failed and that the job went on without (``launch.on_worker_failure``).
        self.failed_workers: list[TaskSpec] = []
        #: Restarts of each task after it died (``launch.restart_ps``, ``launch.restart_chief``).
        self.restarts: dict[str, int] = {}
        #: Training tasks that exited non-zero after their work was done (they had said ``Done``, or the PS
        #: tasks had ended the job): the job counts them as finished, not failed, and never restarts them.
        self.finished_with_error: list[TaskSpec] = []
        #: Why a dead chief was not restarted (``decide_chief_restart``), for the error that stops the job.
        self._no_restart_reason: dict[str, str] = {}
        #: TF intra-op threads per training task (``launch.threads_per_task``); None: TF's default.
        self.threads_per_task = local_threads_per_task(self.config)
        if self.threads_per_task is not None and "TF_NUM_INTRAOP_THREADS" not in {**os.environ, **self.config.launch.env}:
            logger.info("local launch: %d training task(s) share %d core(s); TensorFlow intra-op threads per task: %d "
                        "(launch.threads_per_task)", training_task_count(self.config),
                        local_cpu_count(), self.threads_per_task)

    # ---------------------------------------------------------------- tasks
    def all_tasks(self) -> list[TaskSpec]:
        order = ("ps", "input", "chief", "worker", "evaluator")
        return [TaskSpec(job, i) for job in order for i in range(len(getattr(self.config.cluster, job)))]

    @property
    def main_task(self) -> TaskSpec:
        """The task whose stdout (progress bar) is shown by default."""
        return TaskSpec("chief", 0) if self.config.cluster.chief else TaskSpec("worker", 0)

    def _make(self, task: TaskSpec) -> TaskProcess:
        env = task_environment(self.config, task, self.token)
        if task.job in _TF_JOBS and self.threads_per_task is not None:
            env.setdefault("TF_NUM_INTRAOP_THREADS", str(self.threads_per_task))
        env.update(self.extra_env.get(str(task), {}))
        show_stdout = self.forward and (self.config.launch.log_all_tasks or task == self.main_task)
        return TaskProcess(
            task,
            task_argv(task, self.script, self.script_args, self.config),
            env,
            log_path=os.path.join(self.log_dir, f"{task.job}-{task.index}.log"),
            forward_stdout=show_stdout,
            forward_stderr=self.forward,
            out=self.out,
            fast_start=self.fast_start and task.job in _TF_JOBS,
        )

    def start(self, tasks: Sequence[TaskSpec] | None = None) -> "LocalJob":
        """Starts ``tasks`` (default: all), parameter servers first."""
        for task in tasks or self.all_tasks():
            self.start_task(task)
        return self

    def start_task(self, task: TaskSpec) -> TaskProcess:
        key = str(task)
        if key in self.tasks and self.tasks[key].running:
            raise LaunchError(f"Task {task} is already running (pid {self.tasks[key].pid}).")
        proc = self._make(task).start()
        self.tasks[key] = proc
        self.failed_workers = [t for t in self.failed_workers if t != task]  # a restarted worker is back
        return proc

    def wait_servers_ready(self, client, timeout: float) -> None:
        """Waits (bounded) until ``client`` reaches every PS task, failing fast if one exits.

        Raises:
            LaunchError: a PS (or input) task exited during the wait (the message
                names it and shows its last lines); every task is stopped.
            PSUnavailableError: no answer within ``timeout`` seconds.
        """
        from tfdist.errors import PSUnavailableError

        deadline = time.monotonic() + timeout
        while True:
            self.check_servers()
            try:
                client.wait_ready(min(1.0, max(deadline - time.monotonic(), 0.01)))
                return
            except PSUnavailableError:
                if time.monotonic() >= deadline:
                    raise

    def check_servers(self, clean_exit_ok: bool = False) -> None:
        """Raises if a PS (or input) task has exited; returns at once otherwise.

        Args:
            clean_exit_ok: Let a task that exited 0 pass (a PS exits 0 by
                itself once every worker said it is done). Defaults to
                ``False``: any exit counts, as while the servers start.

        Raises:
            LaunchError: a server task exited (the message names it and shows
                its last lines); every task is stopped.
        """
        for proc in list(self.tasks.values()):
            if proc.task.job in SERVER_JOBS:
                code = proc.poll()
                if code is not None and not (clean_exit_ok and code == 0):
                    self._fail(proc)

    def kill(self, task: TaskSpec | str) -> None:
        """SIGKILL one task (a crash)."""
        self.tasks[str(task)].kill()

    def restart(self, task: TaskSpec | str) -> TaskProcess:
        """Kills (if running) and starts one task again, same address."""
        key = str(task)
        if key in self.tasks:
            self.tasks[key].kill()
        return self.start_task(self.tasks[key].task if key in self.tasks else TaskSpec(*key.split(":")))

    # ---------------------------------------------------------------- watch
    def wait(self, timeout: float | None = None, poll_s: float = 0.1,
             timeout_setting: str = "launch.job_timeout_s", progress: Callable[[], object] | None = None,
             stall_s: float | None = None) -> None:
        """Returns when every training task has exited 0 or failed and been left out.

        A training task that exits non-zero is judged by
        :func:`~tfdist.cluster.failure.decide_worker_failure`
        (``launch.on_worker_failure``): a worker the job can do without is
        logged at WARNING, reported gone to the parameter servers and listed
        in :attr:`failed_workers`; the job goes on. Any other failed task
        (the chief, a PS, an input task, an evaluator, a worker the mode
        needs) stops the job.

        Args:
            timeout: Bound on the wait in seconds. Defaults to ``launch.job_timeout_s``.
            poll_s: How often the tasks are polled.
            timeout_setting: The setting ``timeout`` came from, named when it expires.
            progress: Called at every poll; the job made progress when its
                value changed (e.g. the number of result files the tasks
                wrote). Only with ``stall_s``.
            stall_s: A hang guard that scales with the job: fail when
                ``progress()`` kept its value this many seconds (counted
                from the start of the wait, then from its last change),
                however much of ``timeout`` is left.

        Raises:
            LaunchError: a task failed that the job cannot do without (the
                message names it, says why and shows the last lines of its
                output), ``timeout`` passed, or the job made no progress
                within ``stall_s``; every other task has been stopped by then.
        """
        if (progress is None) != (stall_s is None):
            raise ValueError("wait(): progress and stall_s go together (a hang guard needs both)")
        timeout = timeout if timeout is not None else self.config.launch.job_timeout_s
        deadline = None if timeout is None else time.monotonic() + timeout
        seen = progress() if progress is not None else None
        stalled_at = None if stall_s is None else time.monotonic() + stall_s
        training = [k for k, p in self.tasks.items() if p.task.job in TRAINING_JOBS]
        while True:
            left_out = {str(t) for t in self.failed_workers} | {str(t) for t in self.finished_with_error}
            codes = {k: self.tasks[k].poll() for k in training}
            if training and all(code == 0 or (code is not None and k in left_out) for k, code in codes.items()):
                return
            for key, proc in self.tasks.items():
                code = proc.poll()
                # A PS exits 0 by itself once every worker said it is done.
                if code is None or code == 0 or key in left_out:
                    continue
                decision = None
                if exit_status.is_deterministic_failure(code):
                    self._fail(proc, config_error=True)
                if proc.task.job in TRAINING_JOBS and self._finished_its_work(proc.task):
                    self._count_finished(proc)
                    left_out.add(key)
                    continue
                if self._restart(proc):
                    continue
                if proc.task.job in TRAINING_JOBS:
                    decision = self._worker_failure_decision(proc.task)
                    if not decision.stop:
                        self._leave_out(proc, decision)
                        left_out.add(key)
                        continue
                self._fail(proc, decision)
            now = time.monotonic()
            if deadline is not None and now > deadline:
                self._stop_and_fail(f"The job did not finish within {timeout:g} s ({timeout_setting})")
            if progress is not None:
                value = progress()
                if value != seen:
                    seen, stalled_at = value, now + stall_s
                elif now > stalled_at:
                    self._stop_and_fail(f"The job made no progress for {stall_s:g} s (progress stayed at {seen!r})")
            time.sleep(poll_s)

    def _stop_and_fail(self, why: str) -> None:
        """Stops every task and raises ``LaunchError``: ``why``, the tasks that were still running, the logs."""
        running = [k for k, p in self.tasks.items() if p.running]
        self.stop()
        raise LaunchError(f"{why}; still running: {running}. Stopped all tasks. Logs: {self.log_dir}")

    def _restart(self, proc: TaskProcess) -> bool:
        """Starts a dead PS task or chief again (``launch.restart_ps``/``restart_chief``); False when it may not be.

        A chief that is not restarted leaves the reason in
        :attr:`_no_restart_reason` for the error that stops the job.
        """
        launch, cluster = self.config.launch, self.config.cluster
        task = proc.task
        key = str(task)
        done = self.restarts.get(key, 0)
        if task.job == "ps":
            if not launch.restart_ps or done >= launch.max_restarts:
                return False
            what = (f"it restores its newest checkpoint from {self.config.ps.checkpoint_dir}"
                    if self.config.ps.checkpoint_dir else
                    "no ps.checkpoint_dir: the chief initialises it again from its current values")
            what += f"; workers reconnect within ps.reconnect_timeout_s={self.config.ps.reconnect_timeout_s:g} s"
        elif task.job in TRAINING_JOBS and cluster.worker_id(task.job, task.index) == 0:
            # (A chief that finished its work was counted as finished before: wait() asks that first.)
            decision = decide_chief_restart(self.config, proc.poll(), False, done)
            if not decision.restart:
                self._no_restart_reason[key] = decision.reason
                return False
            what = decision.reason
        else:
            return False
        self.restarts[key] = done + 1
        logger.warning("Task %s; restarting it (%d of at most %d, launch.max_restarts): %s.", proc.describe_exit(),
                       done + 1, launch.max_restarts, what)
        self.start_task(task)
        return True

    def _servers_ended_the_job(self) -> bool:
        """Whether every PS task of this launch exited 0: they do so by themselves once every worker said ``Done``."""
        ps = [p for p in self.tasks.values() if p.task.job == "ps"]
        return bool(ps) and all(p.poll() == 0 for p in ps)

    def _finished_its_work(self, task: TaskSpec) -> bool:
        """Whether training task ``task`` ended its training: it said ``Done``, or the PS tasks ended the job.

        A task says ``Done`` only when its script ended cleanly
        (:mod:`tfdist.exit_status`), so a non-zero exit after it is the
        interpreter's shutdown (e.g. the exit watchdog), not lost training.
        """
        if not self.config.cluster.ps or self.config.elastic.enabled:
            return False
        if self._servers_ended_the_job():
            return True
        said = self._said_done(self.config.cluster.worker_id(task.job, task.index))
        if said is None:  # no PS task answers: they may be ending the job right now (every worker said Done)
            return self._servers_ended_the_job_within(PS_END_GRACE_S)
        return said

    def _servers_ended_the_job_within(self, within_s: float) -> bool:
        """Waits (at most ``within_s``) while a PS task still runs; whether they all exited 0 (ended the job)."""
        deadline = time.monotonic() + within_s
        ps = [p for p in self.tasks.values() if p.task.job == "ps"]
        while any(p.poll() is None for p in ps) and time.monotonic() < deadline:
            time.sleep(0.05)
        return self._servers_ended_the_job()

    def _count_finished(self, proc: TaskProcess) -> None:
        """Counts a training task that exited non-zero after its work was done as finished (never restarted)."""
        self.finished_with_error.append(proc.task)
        why = ("the parameter servers had ended the job (every worker said Done)" if self._servers_ended_the_job()
               else "it had told the parameter servers it was done")
        tail = "\n".join("    " + line for line in list(proc.tail)[-5:])
        logger.warning("Task %s after its training finished (%s); not restarting it, and the job counts it as "
                       "finished.\n  Last lines of %s:\n%s\n  Full log: %s", proc.describe_exit(), why, proc.task,
                       tail, proc.log_path)

    def _said_done(self, worker: int) -> bool | None:
        """Whether a PS task reports ``worker`` done (it ended its training); None when none answers."""
        try:
            from tfdist.ps.admin import AdminClient

            with AdminClient.for_job(self.config, self.token, first_only=True, rpc_timeout_s=2.0) as admin:
                return worker in admin.status(0, brief=True, timeout=2.0).done_workers
        except (TfdistError, OSError):
            return None

    def _worker_failure_decision(self, task: TaskSpec) -> FailureDecision:
        cluster = self.config.cluster
        failed = [cluster.worker_id(t.job, t.index) for t in self.failed_workers]
        return decide_worker_failure(self.config, cluster.worker_id(task.job, task.index), failed)

    def _leave_out(self, proc: TaskProcess, decision: FailureDecision) -> None:
        """Goes on without a failed worker: warn, remember it, tell the parameter servers."""
        self.failed_workers.append(proc.task)
        tail = "\n".join("    " + line for line in list(proc.tail)[-5:])
        logger.warning("Task %s; the job goes on without it (%s).\n  Last lines of %s:\n%s\n  Full log: %s",
                       proc.describe_exit(), decision.reason, proc.task, tail, proc.log_path)
        self.report_gone([self.config.cluster.worker_id(proc.task.job, proc.task.index)])

    def report_gone(self, workers: Sequence[int]) -> None:
        """Tells every PS task that ``workers`` ended, so barriers stop waiting for them now.

        The elastic engine does the same for the workers it runs. Best effort:
        if the parameter servers cannot be reached, liveness still drops the
        workers after ``ps.heartbeat_timeout_s``.
        """
        if not self.config.cluster.ps:
            return
        try:
            from tfdist.ps.admin import AdminClient

            with AdminClient.for_job(self.config, self.token, rpc_timeout_s=5.0) as admin:
                admin.control(gone=workers, timeout=5.0)
        except (TfdistError, OSError) as e:
            logger.info("could not tell the parameter servers that worker(s) %s ended (%s); they stop waiting "
                        "for them after ps.heartbeat_timeout_s", list(workers), e)

    def _fail(self, proc: TaskProcess, decision: FailureDecision | None = None, config_error: bool = False) -> None:
        what = proc.describe_exit()
        why = f" ({decision.reason})" if decision is not None else ""
        if config_error:
            why = (f" (exit code {exit_status.EXIT_CONFIG_ERROR}: its script or config raised a ConfigError, which "
                   "fails the same way every time, so it is not restarted; fix what its last lines name and launch "
                   "again)")
        elif str(proc.task) in self._no_restart_reason:
            why += f"; not restarted: {self._no_restart_reason[str(proc.task)]}"
        tail = "\n".join("    " + line for line in list(proc.tail)[-15:])
        others = [k for k, p in self.tasks.items() if p.running]
        self.stop()
        error = TaskConfigError if config_error else LaunchError
        raise error(
            f"Task {what}{why}; stopped the other tasks ({', '.join(others) or 'none running'}).\n"
            f"  Last lines of {proc.task}:\n{tail}\n  Full log: {proc.log_path}"
        )

    def stop(self, grace: float = 5.0) -> None:
        """Stops every task: workers first, then the servers."""
        order = {"chief": 0, "worker": 0, "evaluator": 0, "input": 1, "ps": 2}
        procs = sorted(self.tasks.values(), key=lambda p: order[p.task.job])
        for p in procs:
            p.signal(15)  # SIGTERM all at once, then wait
        for p in procs:
            p.stop(grace)

    def run(self, timeout: float | None = None) -> None:
        """Starts everything, waits for the training tasks, stops the rest."""
        self.start()
        try:
            self.wait(timeout)
        finally:
            self.stop()

    def __enter__(self) -> "LocalJob":
        return self

    def __exit__(self, *exc) -> None:
        self.stop(grace=2.0)
