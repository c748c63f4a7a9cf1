"""gRPC front of one parameter-server task.

Methods (service ``tfdist.ParameterServer``; every request and response is a
:mod:`tfdist.ps.wire` message): ``Init``, ``WaitInit``, ``Pull``, ``Push``,
``PushPull`` (update path), ``PushGradients``, ``PutState`` (gradient path),
``SetExcluded`` (detected stragglers), ``Heartbeat``, ``Status`` (with
``{"brief": true}`` without the per-variable specs), ``Done``, ``Shutdown``,
``Control`` (the elastic engine: drain, undrain, gone, total batches).

The consistency policy arrives with the initialising worker's ``Init`` (the
chief's strategy decides), so a PS task needs no user code and no mode
setting; workers whose strategy differs are refused.

Every call must carry the job token in metadata; requests are decoded and
validated before the store is touched, and a refused request returns a gRPC
error with a message that says what was wrong. Importing this module does not
import TensorFlow.
"""

from __future__ import annotations

import logging
import threading
from concurrent import futures
from typing import Callable

import grpc

from tfdist import constants
from tfdist.auth import check_token
from tfdist.consistency import policy_from_spec
from tfdist.consistency.base import ConsistencyPolicy
from tfdist.errors import ConfigError, WireFormatError
from tfdist.ps import memory, wire
from tfdist.ps.placement import VariableSpec
from tfdist.ps.store import ParameterStore, StoreError

__all__ = ["PSServer", "SERVICE", "METHODS", "load_tls_server_credentials"]

logger = logging.getLogger(__name__)

SERVICE = "tfdist.ParameterServer"
METHODS = ("Init", "WaitInit", "Pull", "Push", "PushPull", "PushGradients", "PutState", "SetExcluded",
           "Heartbeat", "Status", "Done", "Shutdown", "Control")


def load_tls_server_credentials(cert_path: str, key_path: str) -> grpc.ServerCredentials:
    """Reads a PEM certificate chain and key into gRPC server credentials."""
    with open(cert_path, "rb") as f:
        cert = f.read()
    with open(key_path, "rb") as f:
        key = f.read()
    return grpc.ssl_server_credentials([(key, cert)])


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
        num_workers: Training workers of the job; when all of them have sent
            ``Done`` the server stops by itself (``exit_when_done``).
        heartbeat_timeout_s: See :class:`ParameterStore`.
        tls_credentials: Optional ``grpc.ServerCredentials`` for TLS.
        task_index: This PS task's index (for log lines).
        exit_when_done: Stop when all ``num_workers`` workers are done.
            Defaults to ``True``; elastic jobs turn it off (workers come and
            go; the launcher stops the PS at the end).
        max_updates_per_s: See :class:`ParameterStore`.
        tune_malloc: Apply :func:`tfdist.ps.memory.tune_malloc` to this
            process. Defaults to ``True``.
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
        max_threads: int = 32,
        startup_grace_s: float = constants.DEFAULT_STARTUP_TIMEOUT_S,
        max_updates_per_s: float | None = None,
        tune_malloc: bool = True,
    ):
        if tune_malloc:
            memory.tune_malloc()
        self.store = ParameterStore(policy, heartbeat_timeout_s=heartbeat_timeout_s, startup_grace_s=startup_grace_s,
                                    max_updates_per_s=max_updates_per_s)
        self._token = token.encode() if token else None
        self.num_workers = num_workers
        self.task_index = task_index
        self.exit_when_done = exit_when_done
        self.max_message_bytes = max_message_bytes
        self._stopped = threading.Event()
        options = [
            ("grpc.max_receive_message_length", max_message_bytes),
            ("grpc.max_send_message_length", max_message_bytes),
            ("grpc.so_reuseport", 0),
        ]
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=max_threads), options=options)
        handlers = {
            name: grpc.unary_unary_rpc_method_handler(self._wrap(name, getattr(self, f"_rpc_{name}")))
            for name in METHODS
        }
        self._server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))
        bind = f"{host}:{port}"
        if tls_credentials is not None:
            self.port = self._server.add_secure_port(bind, tls_credentials)
        else:
            self.port = self._server.add_insecure_port(bind)
        if self.port == 0:
            raise OSError(f"Could not bind the parameter server to {bind} (is the port in use?).")
        self.host = host
        self.address = f"{'127.0.0.1' if host in ('[::]', '0.0.0.0') else host}:{self.port}"

    # --------------------------------------------------------------- control
    def start(self) -> "PSServer":
        self._server.start()
        logger.info(
            "ps:%d serving on %s (policy=%s, max_message_bytes=%d, auth=%s)",
            self.task_index,
            self.address,
            self.store.policy.name if self.store.policy else "chosen by the chief",
            self.max_message_bytes,
            "token" if self._token else "none",
        )
        return self

    def stop(self, grace: float | None = 1.0) -> None:
        if not self._stopped.is_set():
            self._stopped.set()
            self._server.stop(grace)

    def wait(self, timeout: float | None = None) -> bool:
        """Blocks until the server is stopped; True if it was."""
        return self._stopped.wait(timeout)

    def __enter__(self) -> "PSServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop(0)

    # ------------------------------------------------------------- plumbing
    def _wrap(self, name: str, fn: Callable[[dict, dict, grpc.ServicerContext], tuple[dict, dict]]):
        def handler(request: bytes, context: grpc.ServicerContext) -> bytes:
            self._authenticate(context)
            try:
                meta, tensors = wire.decode(request)
            except WireFormatError as e:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"{name}: {e}")
            try:
                result = fn(meta, tensors, context)
                if isinstance(result, bytes):  # already encoded (pulls)
                    return result
                return wire.encode(*result)
            except StoreError as e:
                context.abort(getattr(grpc.StatusCode, e.grpc_code), f"{name} refused: {e}")
            except (KeyError, TypeError, ValueError) as e:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"{name}: malformed request ({type(e).__name__}: {e}).")

        return handler

    def _authenticate(self, context: grpc.ServicerContext) -> None:
        check_token(context, self._token, "the parameter server",
                    f"set {constants.ENV_TOKEN} (or security.token) to this job's token")

    @staticmethod
    def _timeout(context: grpc.ServicerContext) -> float | None:
        remaining = context.time_remaining()
        return None if remaining is None else max(remaining - 0.05, 0.0)

    # ------------------------------------------------------------------ RPCs
    @staticmethod
    def _policy(meta) -> ConsistencyPolicy | None:
        spec = meta.get("policy")
        if spec is None:
            return None
        try:
            return policy_from_spec(spec, int(meta.get("num_workers") or 1))
        except ConfigError as e:
            raise StoreError(str(e)) from e

    def _rpc_Init(self, meta, tensors, context):
        specs = [VariableSpec.from_dict(d) for d in meta["specs"]]
        created = self.store.init(
            int(meta["worker"]), specs, tensors, policy=self._policy(meta),
            num_workers=meta.get("num_workers"), step=int(meta.get("step", 0)),
        )
        return {"initialized_here": created, "version": self.store.version,
                "global_step": self.store.global_step}, {}

    def _rpc_WaitInit(self, meta, tensors, context):
        if meta.get("worker") is not None:
            self.store.rejoin(int(meta["worker"]))
        timeout = float(meta.get("timeout_s", 0.0))
        budget = self._timeout(context)
        ready = self.store.wait_initialized(min(timeout, budget) if budget is not None else timeout)
        if ready and meta.get("specs") is not None:
            self.store.check_compatible([VariableSpec.from_dict(d) for d in meta["specs"]], self._policy(meta))
        return {"initialized": ready, "version": self.store.version, "global_step": self.store.global_step}, {}

    def _pull(self, meta, context, extra: dict | None = None, unchanged_at: int | None = None) -> bytes:
        """Encodes the requested values under the store lock (one copy).

        With ``unchanged_at``, a read that finds the store still at that
        version answers ``unchanged: True`` without the values (the caller
        knows them: see :class:`tfdist.ps.session.WorkerSession`).
        """
        keys = meta.get("keys")
        worker, clock = int(meta.get("worker", -1)), int(meta.get("clock", 0))
        min_state_step = meta.get("min_state_step")

        def consume(info: dict, values: dict) -> bytes:
            if unchanged_at is not None and info["version"] == unchanged_at:
                return wire.encode({**info, **(extra or {}), "unchanged": True})
            return wire.encode({**info, **(extra or {})}, values)

        return self.store.read(worker, clock, keys, consume, timeout=self._timeout(context),
                               min_state_step=None if min_state_step is None else int(min_state_step))

    def _push(self, meta, tensors, context) -> dict:
        loss = meta.get("loss")
        return self.store.push(int(meta["worker"]), int(meta.get("clock", 0)), tensors,
                               timeout=self._timeout(context), loss=None if loss is None else float(loss),
                               steps=meta.get("steps", 1))

    def _rpc_Pull(self, meta, tensors, context):
        return self._pull(meta, context)

    def _rpc_Push(self, meta, tensors, context):
        return self._push(meta, tensors, context), {}

    def _rpc_PushPull(self, meta, tensors, context):
        result = self._push(meta, tensors, context)
        # "base_version": the version the worker's snapshot holds. If this push
        # landed right on it and nothing landed after it by the time of the
        # read, the values are snapshot + delta, which the worker computes.
        base = meta.get("base_version")
        unchanged_at = None
        if base is not None and result.get("applied") and result.get("previous_version") == int(base):
            unchanged_at = result["version"]
        return self._pull(meta, context, {"push": result}, unchanged_at=unchanged_at)

    def _rpc_PushGradients(self, meta, tensors, context):
        return self.store.push_gradients(int(meta["worker"]), int(meta["step"]), tensors, timeout=self._timeout(context))

    def _rpc_PutState(self, meta, tensors, context):
        return self.store.put_state(int(meta["worker"]), int(meta["step"]), tensors), {}

    def _rpc_SetExcluded(self, meta, tensors, context):
        return {"excluded": self.store.set_excluded(int(meta["worker"]), meta["excluded"])}, {}

    def _rpc_Heartbeat(self, meta, tensors, context):
        return {"live_workers": self.store.heartbeat(int(meta["worker"]))}, {}

    def _rpc_Status(self, meta, tensors, context):
        status = self.store.status(brief=bool(meta.get("brief", False)))  # brief: no per-variable specs
        return {**status, "task_index": self.task_index, "num_workers": self.num_workers}, {}

    def _rpc_Done(self, meta, tensors, context):
        done = self.store.mark_done(int(meta["worker"]))
        if self.exit_when_done and self.num_workers and len(done) >= self.num_workers:
            logger.info("ps:%d all %d workers are done; stopping", self.task_index, self.num_workers)
            threading.Thread(target=self.stop, args=(0.5,), daemon=True).start()
        return {"done_workers": sorted(done)}, {}

    def _rpc_Control(self, meta, tensors, context):
        total = meta.get("total_batches")
        return self.store.control(drain=meta.get("drain"), undrain=meta.get("undrain"), gone=meta.get("gone"),
                                  total_batches=None if total is None else int(total)), {}

    def _rpc_Shutdown(self, meta, tensors, context):
        logger.info("ps:%d shutdown requested", self.task_index)
        threading.Thread(target=self.stop, args=(0.5,), daemon=True).start()
        return {"stopping": True}, {}
