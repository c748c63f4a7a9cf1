"""Execution back-ends: train workers and the test worker, in-process or as processes.

The process back-end is the seed paper's layout (Algorithms 2 and 3): a pool
of train-worker processes that take :class:`ClientTask` s from one queue and
put results on the main process's inbox, and a test process that evaluates
the snapshots the main process sends it. Every wait is bounded; a dead or
failing child stops the run with its traceback and no child outlives
:meth:`ProcessBackend.close`.
"""

from __future__ import annotations

import dataclasses
import logging
import multiprocessing as mp
import os
import queue
import sys
import time
import traceback

import numpy as np

from tfdist.federated._model import ModelSpec, evaluate_weights, limit_tf_threads
from tfdist.federated.client import ClientConfig, ClientTask, ClientUpdate, _output_is_logits
from tfdist.federated.errors import SimulationTimeoutError, WorkerCrashedError

logger = logging.getLogger(__name__)

__all__ = ["WorkerSpec", "ClientOutput", "InlineBackend", "ProcessBackend"]


@dataclasses.dataclass
class WorkerSpec:
    """Everything a worker needs, sent once when it starts."""

    model: ModelSpec
    client_update: ClientUpdate
    client_config: ClientConfig
    client_data: tuple  # ((x, y), ...) per client
    test_data: tuple | None  # (x, y)
    threads: int = 1


@dataclasses.dataclass
class ClientOutput:
    """What a train worker returns for one task."""

    job_id: int
    client_id: int
    weights: list
    metrics: dict
    busy_s: float
    worker: str


class _TrainRunner:
    def __init__(self, spec: WorkerSpec):
        self.model = spec.model.build()
        self.update = spec.client_update
        self.update.setup(self.model, spec.client_config, spec.model.build)
        self.data = spec.client_data
        x, y = self.data[0]
        cfg = spec.client_config
        self.update.warm_up(
            ClientTask(-1, 0, 0, list(spec.model.initial_weights), 1, cfg.batch_size_of(0), 0), x, y
        )

    def run(self, task: ClientTask, worker: str) -> ClientOutput:
        start = time.perf_counter()
        x, y = self.data[task.client_id]
        weights, metrics = self.update.train(task, x, y)
        return ClientOutput(task.job_id, task.client_id, weights, metrics, time.perf_counter() - start, worker)


class _Evaluator:
    def __init__(self, spec: WorkerSpec):
        import tensorflow as tf

        self.model = spec.model.build()
        self.vars = list(self.model.weights)
        self.from_logits = (
            _output_is_logits(self.model) if spec.client_config.from_logits is None else spec.client_config.from_logits
        )
        self.x, self.y = spec.test_data
        model = self.model
        self.predict = tf.function(
            lambda xs: model(xs, training=False),
            input_signature=[tf.TensorSpec([None, *self.x.shape[1:]], tf.as_dtype(self.x.dtype))],
        )
        self.predict(self.x[:1])  # trace now, not in the first round

    def evaluate(self, payload: dict) -> dict:
        if payload["kind"] == "global":
            return evaluate_weights(self.predict, self.vars, payload["weights"], self.x, self.y, self.from_logits)
        per_node = [evaluate_weights(self.predict, self.vars, w, self.x, self.y, self.from_logits) for w in payload["weights"]]
        honest = payload.get("honest") or [True] * len(per_node)
        acc = np.array([m["accuracy"] for m in per_node])
        loss = np.array([m["loss"] for m in per_node])
        mask = np.asarray(honest, bool)
        return {
            "accuracy": float(acc[mask].mean()),
            "loss": float(loss[mask].mean()),
            "accuracy_min": float(acc[mask].min()),
            "accuracy_max": float(acc[mask].max()),
            "accuracy_all_nodes": float(acc.mean()),
        }


#: What the pool's fork server imports once: each worker forked from it starts without importing TensorFlow.
FORKSERVER_PRELOAD = ("numpy", "tensorflow", "keras", "tfdist.federated._backend", "tfdist.federated._preloaded")


def _context():
    """The pool's start method: with fast start on (``TFDIST_FAST_START=1``, as for local clusters) and on
    Linux, a fork server that imported TensorFlow once (it never runs an op, so its forks copy no
    TensorFlow runtime, as with ``tfdist.cluster.zygote``); else ``spawn``, a fresh interpreter per worker."""
    from tfdist.cluster.zygote import fast_start_enabled

    forkserver = sys.platform.startswith("linux") and "forkserver" in mp.get_all_start_methods()
    if not (forkserver and fast_start_enabled()):
        return mp.get_context("spawn")
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(list(FORKSERVER_PRELOAD))  # read when the fork server starts (once per process)
    return ctx


#: A pid file descriptor of the main process, opened by a forked worker the first time it looks.
_main_pidfd: int | None = None
#: Whether this worker's parent is the main process (spawned): then its parent changes when it ends.
_spawned = False


def _parent_alive(parent_pid: int) -> bool:
    """Whether the main process ``parent_pid`` is still there.

    A spawned worker's parent is the main process. A worker forked from the fork server is the fork
    server's child, and the fork server outlives the main process as long as a worker does (each
    worker holds the fd whose end tells it to stop): such a worker watches the main process through
    a pid file descriptor (Linux 5.3+), opened while the main process waits for it to start.
    """
    global _main_pidfd, _spawned
    if _spawned or os.getppid() == parent_pid:
        _spawned = True
        return os.getppid() == parent_pid
    if _main_pidfd is None:
        try:
            _main_pidfd = os.pidfd_open(parent_pid)
        except ProcessLookupError:
            return False
        except (AttributeError, OSError):  # no pidfd_open (old kernel): whether that pid exists at all
            try:
                os.kill(parent_pid, 0)
            except ProcessLookupError:
                return False
            except PermissionError:  # pragma: no cover - someone else's process took the pid
                return False
            return True
    import select

    return not select.select([_main_pidfd], [], [], 0)[0]  # readable once the process has ended


def _get_spec(q, parent_pid, poll_s):
    # The spec (model, data) comes through the queue, not as a Process argument:
    # CPython writes Process arguments into a pipe that blocks forever once the
    # payload exceeds the pipe buffer and the child died during start-up.
    while True:
        try:
            return q.get(timeout=poll_s)
        except queue.Empty:
            if not _parent_alive(parent_pid):
                raise SystemExit(0)


def _train_worker_main(name, task_q, inbox, parent_pid, poll_s):
    """Algorithm 2 (train worker): take a client, train it, return the weights."""
    try:
        np.random.seed()  # forked from the fork server: its own NumPy global state, as a spawned worker has
        spec = _get_spec(task_q, parent_pid, poll_s)
        limit_tf_threads(spec.threads)
        runner = _TrainRunner(spec)
        inbox.put(("ready", name, None))
        while True:
            try:
                task = task_q.get(timeout=poll_s)
            except queue.Empty:
                if not _parent_alive(parent_pid):
                    return
                continue
            if task is None:
                return
            inbox.put(("result", name, runner.run(task, name)))
    except KeyboardInterrupt:
        return
    except BaseException:  # noqa: BLE001 - reported to the main process, which stops the run
        inbox.put(("error", name, traceback.format_exc()))
        raise SystemExit(1)


def _test_worker_main(name, test_q, inbox, parent_pid, poll_s):
    """Algorithm 3 (test worker): evaluate the snapshots the main process sends."""
    try:
        np.random.seed()
        spec = _get_spec(test_q, parent_pid, poll_s)
        limit_tf_threads(spec.threads)
        evaluator = _Evaluator(spec)
        inbox.put(("ready", name, None))
        while True:
            try:
                msg = test_q.get(timeout=poll_s)
            except queue.Empty:
                if not _parent_alive(parent_pid):
                    return
                continue
            if msg is None:
                return
            eval_id, payload = msg
            inbox.put(("metrics", name, (eval_id, evaluator.evaluate(payload))))
    except KeyboardInterrupt:
        return
    except BaseException:  # noqa: BLE001
        inbox.put(("error", name, traceback.format_exc()))
        raise SystemExit(1)


class InlineBackend:
    """Runs clients and evaluations in the main process (``num_workers=0``).

    Tasks run lazily when their result is asked for, i.e. in simulated-arrival
    order. Used for debugging and as the sequential reference.
    """

    num_workers = 0

    def __init__(self, spec: WorkerSpec, evaluate: bool):
        self._spec = spec
        self._evaluate = evaluate
        self._pending: dict[int, ClientTask] = {}
        self.metrics: dict[int, dict] = {}
        self.busy_s: dict[str, float] = {"inline": 0.0}
        self.startup_s = 0.0

    def start(self) -> None:
        t0 = time.perf_counter()
        self._runner = _TrainRunner(self._spec)
        self._evaluator = _Evaluator(self._spec) if self._evaluate else None
        self.startup_s = time.perf_counter() - t0

    def submit(self, task: ClientTask) -> None:
        self._pending[task.job_id] = task

    def wait_result(self, job_id: int) -> ClientOutput:
        out = self._runner.run(self._pending.pop(job_id), "inline")
        self.busy_s["inline"] += out.busy_s
        return out

    def submit_eval(self, eval_id: int, payload: dict) -> None:
        self.metrics[eval_id] = self._evaluator.evaluate(payload)

    def poll(self) -> None:
        pass

    def finish_evals(self) -> None:
        pass

    def close(self) -> None:
        self._pending.clear()


class ProcessBackend:
    """A pool of train-worker processes plus a test process (spawned, or, with ``TFDIST_FAST_START=1`` on
    Linux, forked from a fork server that imported TensorFlow once).

    Args:
        spec: what every worker needs.
        num_workers: train-worker processes (several per core are fine; each
            runs TF with ``spec.threads`` threads).
        evaluate: start the test process.
        start_timeout_s: bound on start-up (process start + TF import + model build).
        task_timeout_s: bound on waiting for any one result.
        poll_s: how often waits wake up to check that the children are alive.
    """

    def __init__(self, spec: WorkerSpec, num_workers: int, evaluate: bool, start_timeout_s: float = 300.0,
                 task_timeout_s: float = 300.0, poll_s: float = 0.5):
        self._spec = spec
        self.num_workers = num_workers
        self._evaluate = evaluate
        self.start_timeout_s = start_timeout_s
        self.task_timeout_s = task_timeout_s
        self._poll_s = poll_s
        self._procs: list = []
        self._results: dict[int, ClientOutput] = {}
        self.metrics: dict[int, dict] = {}
        self._pending_evals = 0
        self.busy_s: dict[str, float] = {}
        self._closing = False
        self.startup_s = 0.0

    # -- life cycle ---------------------------------------------------------
    def start(self) -> None:
        t0 = time.perf_counter()
        ctx = _context()
        self._task_q, self._test_q, self._inbox = ctx.Queue(), ctx.Queue(), ctx.Queue()
        pid = os.getpid()
        try:
            for i in range(self.num_workers):
                name = f"train-worker-{i}"
                self.busy_s[name] = 0.0
                p = ctx.Process(target=_train_worker_main, name=name, daemon=True,
                                args=(name, self._task_q, self._inbox, pid, self._poll_s))
                p.start()
                self._procs.append(p)
                self._task_q.put(self._spec)  # each worker takes exactly one spec before any task
            if self._evaluate:
                p = ctx.Process(target=_test_worker_main, name="test-worker", daemon=True,
                                args=("test-worker", self._test_q, self._inbox, pid, self._poll_s))
                p.start()
                self._procs.append(p)
                self._test_q.put(self._spec)
            ready: set = set()
            deadline = time.monotonic() + self.start_timeout_s
            while len(ready) < len(self._procs):
                if time.monotonic() > deadline:
                    raise SimulationTimeoutError(
                        f"Only {len(ready)} of {len(self._procs)} worker processes started within "
                        f"start_timeout_s={self.start_timeout_s}. Raise start_timeout_s or use fewer workers."
                    )
                msg = self._receive(self._poll_s)
                if msg is not None and msg[0] == "ready":
                    ready.add(msg[1])
        except BaseException:
            self.close()
            raise
        self.startup_s = time.perf_counter() - t0
        logger.info("Started %d train workers%s in %.1f s", self.num_workers,
                    " and a test worker" if self._evaluate else "", self.startup_s)

    def close(self, timeout_s: float = 10.0) -> None:
        """Stops every child: sentinel, bounded join, terminate, kill."""
        if self._closing or not self._procs:
            self._closing = True
            return
        self._closing = True
        for p in self._procs:
            try:
                (self._test_q if p.name == "test-worker" else self._task_q).put(None)
            except (OSError, ValueError):
                pass
        deadline = time.monotonic() + timeout_s
        while any(p.is_alive() for p in self._procs) and time.monotonic() < deadline:
            try:  # keep draining so no child blocks flushing its last message
                self._inbox.get(timeout=0.05)
            except (queue.Empty, OSError, ValueError, EOFError):
                pass
        for p in self._procs:
            if p.is_alive():
                logger.warning("Terminating %s (pid %s), it did not stop in %.0f s", p.name, p.pid, timeout_s)
                p.terminate()
                p.join(2.0)
            if p.is_alive():
                p.kill()
                p.join(2.0)
        for q in (self._task_q, self._test_q, self._inbox):
            q.cancel_join_thread()
            q.close()

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self._procs]

    # -- messages -----------------------------------------------------------
    def _receive(self, timeout: float):
        try:
            msg = self._inbox.get(timeout=timeout)
        except queue.Empty:
            self._check_alive()
            return None
        self._handle(msg)
        return msg

    def _handle(self, msg) -> None:
        kind, name, body = msg
        if kind == "result":
            self._results[body.job_id] = body
            self.busy_s[name] = self.busy_s.get(name, 0.0) + body.busy_s
        elif kind == "metrics":
            eval_id, metrics = body
            self.metrics[eval_id] = metrics
            self._pending_evals -= 1
        elif kind == "error":
            raise WorkerCrashedError(
                f"{name} failed; the simulation was stopped. Its traceback:\n{body}", worker=name, remote_traceback=body
            )

    def _check_alive(self) -> None:
        for p in self._procs:
            if p.exitcode is not None and not self._closing:
                # It may have reported an error just before exiting: read that first.
                end = time.monotonic() + 2.0
                while time.monotonic() < end:
                    try:
                        self._handle(self._inbox.get(timeout=0.1))
                    except queue.Empty:
                        break
                raise WorkerCrashedError(
                    f"{p.name} (pid {p.pid}) died with exit code {p.exitcode} without reporting an error "
                    "(killed, out of memory, a crash in native code, or a failure while starting). "
                    "The simulation was stopped. If its log says 'An attempt has been made to start a new "
                    "process before the current process has finished its bootstrapping phase', put the code "
                    "of your script under `if __name__ == \"__main__\":`.",
                    worker=p.name,
                )

    # -- work ---------------------------------------------------------------
    def submit(self, task: ClientTask) -> None:
        self._task_q.put(task)

    def wait_result(self, job_id: int) -> ClientOutput:
        deadline = time.monotonic() + self.task_timeout_s
        while job_id not in self._results:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise SimulationTimeoutError(
                    f"No result for client update {job_id} within task_timeout_s={self.task_timeout_s}. "
                    "Raise task_timeout_s if clients are this slow, or check the workers."
                )
            self._receive(min(self._poll_s, remaining))
        return self._results.pop(job_id)

    def submit_eval(self, eval_id: int, payload: dict) -> None:
        self._pending_evals += 1
        self._test_q.put((eval_id, payload))

    def poll(self) -> None:
        """Reads whatever has arrived without waiting (metrics, errors)."""
        while True:
            try:
                msg = self._inbox.get_nowait()
            except queue.Empty:
                self._check_alive()
                return
            self._handle(msg)

    def finish_evals(self) -> None:
        deadline = time.monotonic() + self.task_timeout_s
        while self._pending_evals > 0:
            if time.monotonic() > deadline:
                raise SimulationTimeoutError(
                    f"{self._pending_evals} evaluations did not finish within task_timeout_s={self.task_timeout_s}."
                )
            self._receive(self._poll_s)
