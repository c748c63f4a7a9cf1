"""gRPC front of one parameter-server task: protocol → store → policy.

Methods (service ``tfdist.ParameterServer``; every request and reply is a
:mod:`tfdist.wire` message, every request one dataclass of
:mod:`tfdist.ps.protocol`): ``Init``, ``WaitInit``, ``Pull``, ``Push``,
``PushPull`` (update path), ``PushGradients``, ``PutState`` (gradient path),
``SetExcluded`` (detected stragglers), ``Heartbeat``, ``Status`` (with
``{"brief": true}`` without the per-variable specs), ``Done``, ``Leave``
(stop counting for barriers, not for the task's exit), ``Shutdown``,
``Control`` (the elastic engine: drain, undrain, gone, total batches).

The consistency policy arrives with the initialising worker's ``Init`` (the
chief's strategy decides), so a PS task needs no user code and no mode
setting; workers whose strategy differs are refused.

What the server guarantees (tested property by property in
``tests/unit/test_protocol_properties.py``):

* Every call carries the job token, checked before the request body is read
  (:mod:`tfdist.grpc_service`); oversize messages are refused by gRPC.
* Every request is parsed and validated whole before the store is touched,
  and the store applies it all-or-nothing: a refused request changes nothing.
  Refusals are counted in ``stats.rejected`` of ``Status`` (the server's
  counter, not the store's state).
* Every wait is bounded by the caller's deadline and by ``max_wait_s`` (the
  job's RPC timeout), ends when the caller cancels or the server stops, and
  at most ``max_waiters`` calls wait at once; the server keeps threads for
  the calls that do not wait.
* ``Done`` and ``Shutdown`` are honoured only from workers of the job; the
  task stops by itself once every worker of the job is done
  (``exit_when_done``).

Importing this module does not import TensorFlow.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from typing import Any, Callable, Mapping

import grpc
import numpy as np

from tfdist import constants
from tfdist.errors import ConfigError
from tfdist.consistency.base import ConsistencyPolicy
from tfdist.grpc_service import WireService
from tfdist.stream_service import StreamService
from tfdist import wire
from tfdist.ps import memory, protocol, replies
from tfdist.ps.checkpoint import CheckpointError
from tfdist.ps.checkpointer import ShardCheckpointer
from tfdist.ps.protocol import METHODS, SERVICE, STREAM_METHODS
from tfdist.ps.store import ParameterStore

__all__ = ["PSServer", "ParameterService", "SERVICE", "METHODS", "load_tls_server_credentials"]

logger = logging.getLogger(__name__)

#: Seconds kept back from a caller's deadline so the answer reaches it in time.
_MARGIN_S = 0.1
#: Server threads kept for calls that never wait (heart-beats, pushes, status).
_SPARE_THREADS = 8


def load_tls_server_credentials(cert_path: str, key_path: str) -> grpc.ServerCredentials:
    """Reads a PEM certificate chain and key into gRPC server credentials."""
    from tfdist.tls import server_credentials

    return server_credentials(cert_path, key_path)


#: The methods whose replies carry the CPU serving them cost (``cpu`` of :meth:`ParameterService.handle`).
_REPORTS_CPU = frozenset({"PushPull"})


def _encode(reply) -> bytes:
    """Encodes a read's reply under the store's lock (its values are the live arrays: one copy, into the message)."""
    return wire.encode(*reply.to_wire())


class ParameterService:
    """What each RPC does, without gRPC: protocol → store.

    :class:`PSServer` calls :meth:`handle` for every call; tests call it
    in-process to drive the exact request path of a PS task.

    Args:
        store: The task's store.
        task_index: This PS task's index (logs, ``Status``).
        exit_when_done: Call ``on_stop`` once every worker of the job is done.
        on_stop: Stops the task (``Done`` of the last worker, ``Shutdown``).
    """

    def __init__(self, store: ParameterStore, task_index: int = 0, exit_when_done: bool = False,
                 on_stop: Callable[[], None] | None = None, checkpointer: ShardCheckpointer | None = None):
        self.store = store
        self.task_index = task_index
        self.exit_when_done = exit_when_done
        self._on_stop = on_stop
        #: Writes this task's checkpoints (``ps.checkpoint_dir``); ``None``: none.
        self.checkpointer = checkpointer
        #: Requests refused (malformed, or refused by the store), by method.
        self.rejected: dict[str, int] = {}
        self._lock = threading.Lock()
        self._rpcs = {name: getattr(self, f"_rpc_{name}") for name in METHODS}
        #: The port of this task's :mod:`~tfdist.stream_service` (set by :class:`PSServer`); ``None``: gRPC only.
        self.stream_port: int | None = None

    def handle(self, method: str, meta: Any, tensors: Mapping[str, np.ndarray], budget: float | None = None,
               cancelled: Callable[[], bool] = lambda: False, cpu: Callable[[], float] | None = None):
        """Parses, validates and applies one request.

        ``cpu``: what serving the caller's ``PushPull`` requests cost this
        task and was not reported yet (a stream connection's
        :meth:`~tfdist.stream_service._Context.connection_cpu_s`); a
        ``PushPull`` reply carries it (``server_cpu_s``) for ``exchange_every: auto``.

        Returns:
            The reply (a :mod:`tfdist.ps.replies` type) as ``(meta, tensors)``,
            or bytes already encoded (reads encode the values under the store lock).

        Raises:
            RequestError: the request was refused; nothing changed.
        """
        try:
            request = protocol.parse(method, meta, tensors)
            rpc = self._rpcs[method]
            reply = (rpc(request, budget, cancelled, cpu) if cpu is not None and method in _REPORTS_CPU
                     else rpc(request, budget, cancelled))
            return reply if isinstance(reply, bytes) else reply.to_wire()
        except protocol.RequestError:
            self.count_refused(method)
            raise

    def count_refused(self, method: str) -> None:
        """Counts a refused request (also those refused before parsing: not a wire message)."""
        with self._lock:
            self.rejected[method] = self.rejected.get(method, 0) + 1

    def call(self, method: str, tensors: Mapping[str, np.ndarray] | None = None, *, timeout: float | None = None,
             **meta) -> tuple[dict, dict]:
        """One in-process call (tests, experiments): ``call("Push", deltas, worker=1, clock=3)``.

        Returns:
            ``(meta, tensors)`` of the reply (encoded replies are decoded).
        """
        reply = self.handle(method, meta, tensors or {}, timeout)
        return wire.decode(reply) if isinstance(reply, bytes) else reply

    def _stop(self) -> None:
        if self._on_stop is not None:
            threading.Thread(target=self._on_stop, daemon=True).start()

    # ------------------------------------------------------------------ RPCs
    def _rpc_Init(self, req: protocol.InitRequest, budget, cancelled):
        reply = self.store.init(req)
        if req.reset and self.checkpointer is not None:
            self.checkpointer.discard_after(req.step)  # the job goes on from the chief's step
        return reply

    def _rpc_Extend(self, req: protocol.ExtendRequest, budget, cancelled):
        reply = self.store.extend(req)
        self._after_update()
        return reply

    def _rpc_WaitInit(self, req: protocol.WaitInitRequest, budget, cancelled):
        return self.store.wait_init(req, budget, cancelled)

    def _rpc_Pull(self, req: protocol.PullRequest, budget, cancelled):
        return self.store.read(req, _encode, budget, cancelled)

    def _rpc_Push(self, req: protocol.PushRequest, budget, cancelled):
        reply = self.store.push(req, budget, cancelled)
        self._after_update()
        return reply

    def _rpc_PushPull(self, req: protocol.PushPullRequest, budget, cancelled, cpu=None):
        encode = _encode if cpu is None else (lambda r: _encode(dataclasses.replace(r, server_cpu_s=cpu())))
        reply = self.store.push_pull(req, encode, budget, cancelled)
        self._after_update()
        return reply

    def _after_update(self) -> None:
        if self.checkpointer is not None:
            self.checkpointer.after_update()

    def _rpc_PushGradients(self, req: protocol.PushGradientsRequest, budget, cancelled):
        return self.store.push_gradients(req, budget, cancelled)

    def _rpc_PutState(self, req: protocol.PutStateRequest, budget, cancelled):
        reply = self.store.put_state(req)
        self._after_update()
        return reply

    def _rpc_Lookup(self, req: protocol.LookupRequest, budget, cancelled):
        return self.store.lookup(req, _encode, budget, cancelled)

    def _rpc_PushRows(self, req: protocol.PushRowsRequest, budget, cancelled):
        return self.store.push_rows(req)

    def _rpc_WriteRows(self, req: protocol.WriteRowsRequest, budget, cancelled):
        return self.store.write_rows(req)

    def _rpc_EpochLogs(self, req: protocol.EpochLogsRequest, budget, cancelled):
        return self.store.epoch_logs(req, budget, cancelled)

    def _rpc_Rendezvous(self, req: protocol.RendezvousRequest, budget, cancelled):
        from tfdist.ps._rendezvous import rendezvous

        return rendezvous(self.store, req, budget, cancelled)

    def _rpc_Restore(self, req: protocol.RestoreRequest, budget, cancelled):
        self.store.check_path(req.worker, "gradient")  # a roll-back is the gradient path's recovery
        if self.checkpointer is None:
            raise protocol.RequestError(f"ps:{self.task_index} has no ps.checkpoint_dir: nothing to restore.",
                                        grpc_code="FAILED_PRECONDITION")
        step = self.checkpointer.restore(step=req.step, replace=True)
        if step is None:
            raise protocol.RequestError(f"ps:{self.task_index} has no valid checkpoint of step {req.step} in "
                                        f"{self.checkpointer.directory}.", grpc_code="FAILED_PRECONDITION")
        logger.warning("ps:%d rolled back to its checkpoint of step %d by worker %d (incarnation %d)",
                       self.task_index, step, req.worker, self.store.incarnation)
        return replies.RestoreReply(step, self.store.incarnation)

    def _rpc_Checkpoint(self, req: protocol.CheckpointRequest, budget, cancelled):
        self.store.check_member(req.worker)
        if req.at_step is not None:  # the chief's time-based checkpoints of a gradient-path job
            self.store.check_path(req.worker, "gradient")
        if self.checkpointer is None:
            return replies.CheckpointReply()
        if req.at_step is not None:
            scheduled = self.store.capture_at(req.worker, req.at_step)
            self.checkpointer.after_update(always=True)
            return replies.CheckpointReply(scheduled=scheduled)
        try:
            step, path = self.checkpointer.checkpoint_now(timeout=budget)
        except CheckpointError as e:
            raise protocol.RequestError(str(e), grpc_code="INTERNAL") from e
        return replies.CheckpointReply(step, path)

    def _rpc_SetExcluded(self, req: protocol.SetExcludedRequest, budget, cancelled):
        return replies.SetExcludedReply(tuple(self.store.set_excluded(req.worker, req.excluded)))

    def _rpc_Heartbeat(self, req: protocol.HeartbeatRequest, budget, cancelled):
        return replies.LiveWorkersReply(tuple(self.store.heartbeat(req.worker)))

    def _rpc_Status(self, req: protocol.StatusRequest, budget, cancelled):
        status = self.store.status(brief=req.brief)
        with self._lock:
            status["stats"]["rejected"] = sum(self.rejected.values())
        if self.checkpointer is not None:
            status["checkpoint"] = self.checkpointer.describe()
        return replies.StatusReply({**status, "task_index": self.task_index, "stream_port": self.stream_port})

    def _rpc_Done(self, req: protocol.DoneRequest, budget, cancelled):
        done = self.store.mark_done(req.worker)
        n = self.store.num_workers
        if self.exit_when_done and n and set(range(n)) <= done:
            logger.info("ps:%d all %d workers are done; stopping", self.task_index, n)
            self._stop()
        return replies.DoneReply(tuple(sorted(done)))

    def _rpc_Leave(self, req: protocol.LeaveRequest, budget, cancelled):
        return replies.LiveWorkersReply(tuple(self.store.leave(req.worker)))

    def _rpc_Control(self, req: protocol.ControlRequest, budget, cancelled):
        return self.store.control(req)

    def _rpc_Shutdown(self, req: protocol.ShutdownRequest, budget, cancelled):
        self.store.check_member(req.worker)
        logger.info("ps:%d shutdown requested by worker %d", self.task_index, req.worker)
        self._stop()
        return replies.ShutdownReply(True)


class PSServer:
    """Serves one :class:`ParameterStore` over gRPC.

    Args:
        policy: Consistency policy of this task's store; ``None`` (the usual
            case) adopts the policy the initialising worker sends.
        port: Port to bind on ``host`` (0 picks a free one). Defaults to 0.
        host: Interface to bind. Defaults to ``"127.0.0.1"``; use ``"[::]"``
            to serve other machines.
        token: The job token every call must present; ``None`` disables the
            check (only for in-process use). Never logged.
        max_message_bytes: Largest request accepted. Defaults to 512 MiB.
        num_workers: Worker slots of the job (ids ``0 .. num_workers - 1``):
            requests from other ids are refused, and when all of them have
            sent ``Done`` the server stops by itself (``exit_when_done``).
            ``None``: taken from the chief's ``Init``.
        heartbeat_timeout_s: See :class:`ParameterStore`.
        tls_credentials: Optional ``grpc.ServerCredentials`` for TLS.
        task_index: This PS task's index (for log lines).
        exit_when_done: Stop when all ``num_workers`` workers are done.
            Defaults to ``True``; elastic jobs turn it off (workers come and
            go; the launcher stops the PS at the end).
        max_threads: Server threads. Defaults to enough for every worker to
            wait on one call plus spares (at least 32).
        max_wait_s: Longest any call waits on the server (set it to the job's
            ``ps.rpc_timeout_s``). Defaults to 30 s.
        max_updates_per_s: See :class:`ParameterStore`.
        tune_malloc: Apply :func:`tfdist.ps.memory.tune_malloc` to this
            process. Defaults to ``True``.
        checkpoint_dir: Where this task writes its checkpoints and restores
            the newest one from at start (``ps.checkpoint_dir``); ``None``:
            no checkpoints.
        checkpoint_every_s, checkpoint_every_steps, checkpoint_keep: See
            :class:`~tfdist.ps.checkpointer.ShardCheckpointer`.
        num_ps: PS tasks of the job (a checkpoint of a job with another
            number is not restored). Defaults to 1.
        starting_workers: Workers the job starts with (``JobConfig.starting_workers``);
            an ``Init`` that says more is refused. ``None``: up to ``num_workers``.

    Every start of a task gets a new random ``incarnation`` (in replies and
    ``Status``): workers see a restarted task by it.
    """

    def __init__(
        self,
        policy: ConsistencyPolicy | None = None,
        port: int = 0,
        host: str = "127.0.0.1",
        token: str | None = None,
        max_message_bytes: int = constants.DEFAULT_MAX_MESSAGE_BYTES,
        num_workers: int | None = None,
        heartbeat_timeout_s: float = constants.DEFAULT_HEARTBEAT_TIMEOUT_S,
        tls_credentials: grpc.ServerCredentials | None = None,
        task_index: int = 0,
        exit_when_done: bool = True,
        max_threads: int | None = None,
        startup_grace_s: float = constants.DEFAULT_STARTUP_TIMEOUT_S,
        max_updates_per_s: float | None = None,
        tune_malloc: bool = True,
        max_wait_s: float = constants.DEFAULT_RPC_TIMEOUT_S,
        checkpoint_dir: str | None = None,
        checkpoint_every_s: float | None = None,
        checkpoint_every_steps: int | None = None,
        checkpoint_keep: int = 3,
        num_ps: int = 1,
        starting_workers: int | None = None,
        stream: bool = True,
        stream_port: int = 0,
    ):
        if tune_malloc:
            memory.tune_malloc()
        slots = num_workers or 12
        max_waiters = slots + 4
        if max_threads is None:
            max_threads = max(32, max_waiters + slots + _SPARE_THREADS)
        max_waiters = min(max_waiters, max(1, max_threads - slots - _SPARE_THREADS))
        self.store = ParameterStore(policy, heartbeat_timeout_s=heartbeat_timeout_s, startup_grace_s=startup_grace_s,
                                    max_updates_per_s=max_updates_per_s, num_workers=num_workers,
                                    max_wait_s=max_wait_s, max_waiters=max_waiters,
                                    starting_workers=starting_workers, max_reply_bytes=max_message_bytes)
        self.task_index = task_index
        self.exit_when_done = exit_when_done
        self.max_message_bytes = max_message_bytes
        self.checkpointer = None
        if checkpoint_dir:
            self.checkpointer = ShardCheckpointer(self.store, checkpoint_dir, task_index, num_ps,
                                                  every_s=checkpoint_every_s, every_steps=checkpoint_every_steps,
                                                  keep=checkpoint_keep)
            step = self.checkpointer.restore()
            if step is None:
                logger.info("ps:%d: no checkpoint in %s; the chief initialises this task", task_index, checkpoint_dir)
            else:
                logger.warning("ps:%d: restarted from the checkpoint of step %d in %s (incarnation %d)",
                               task_index, step, checkpoint_dir, self.store.incarnation)
        self._stopped = threading.Event()
        self.service = ParameterService(self.store, task_index, exit_when_done, on_stop=lambda: self.stop(0.5),
                                        checkpointer=self.checkpointer)
        handlers = {name: self._handler(name) for name in METHODS}
        #: The data plane's lean transport (:mod:`tfdist.stream_service`): none with TLS (gRPC carries all).
        #: Bound first: a fixed port (``ps.stream_port``) that is taken fails the task before gRPC binds its own.
        self._stream = None
        if stream and tls_credentials is None:
            try:
                self._stream = StreamService(
                    {name: handlers[name] for name in STREAM_METHODS}, what=f"parameter server ps:{task_index}",
                    token=token, how_to_fix_token=f"set {constants.ENV_TOKEN} (or security.token) to this job's token",
                    host=host, max_message_bytes=max_message_bytes, on_malformed=self.service.count_refused,
                    max_connections=max(64, 4 * slots), port=stream_port)
            except OSError as e:
                raise ConfigError(
                    f"ps:{task_index} cannot serve its data plane on port {stream_port} (ps.stream_port): {e}. "
                    "Another process on this host listens on it (another PS task of the job?): give a free port, "
                    "null for a free port per task, or ps.transport: grpc.") from e
            self.service.stream_port = self._stream.port
        try:
            self._service = WireService(
                SERVICE, handlers, what=f"parameter server ps:{task_index}", token=token,
                how_to_fix_token=f"set {constants.ENV_TOKEN} (or security.token) to this job's token",
                host=host, port=port, max_message_bytes=max_message_bytes, max_threads=max_threads,
                tls_credentials=tls_credentials, on_malformed=self.service.count_refused,
            )
        except BaseException:
            if self._stream is not None:
                self._stream.stop(0)
            raise
        self.port = self._service.port
        self.host = host
        self.address = self._service.address

    # --------------------------------------------------------------- control
    def start(self) -> "PSServer":
        if self.checkpointer is not None:
            self.checkpointer.start()
        self._service.start()
        if self._stream is not None:
            self._stream.start()
        logger.info(
            "ps:%d serving on %s%s (policy=%s, workers=%s, max_message_bytes=%d, auth=%s)",
            self.task_index,
            self._service.listen_description,
            f", data plane also on port {self._stream.port}" if self._stream is not None else "",
            self.store.policy.name if self.store.policy else "chosen by the chief",
            self.store.num_workers if self.store.num_workers is not None else "from the chief",
            self.max_message_bytes,
            "token" if self._service.authenticated else "none",
        )
        return self

    def stop(self, grace: float | None = 1.0, final_checkpoint: bool = True) -> None:
        """Stops serving (idempotent): waiting calls are released, others get ``grace`` seconds.

        With a checkpoint directory, the state is written first if it moved
        since the last checkpoint (``final_checkpoint``), so a job that ends,
        or a task stopped with SIGTERM, loses nothing.
        """
        if self._stopped.is_set():
            return
        self._stopped.set()
        if self.checkpointer is not None:
            self.checkpointer.close(final=final_checkpoint)
        self.store.close()
        if self._stream is not None:
            self._stream.stop(grace)
        self._service.stop(grace)

    def wait(self, timeout: float | None = None) -> bool:
        """Blocks until the server is stopped; True if it was."""
        return self._service.wait(timeout)

    def __enter__(self) -> "PSServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop(0)

    # ------------------------------------------------------------- plumbing
    def _handler(self, name: str):
        service = self.service

        def handle(meta, tensors, context: grpc.ServicerContext):
            remaining = context.time_remaining()
            budget = None if remaining is None else max(remaining - _MARGIN_S, 0.0)
            return service.handle(name, meta, tensors, budget, lambda: not context.is_active(),
                                  getattr(context, "connection_cpu_s", None))

        return handle
