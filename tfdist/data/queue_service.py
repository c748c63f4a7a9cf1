"""A queue shared by every worker of a job, served over gRPC by one task.

Run standalone (an "input" task; the token comes from ``TFDIST_TOKEN``)::

    python -m tfdist.data.queue_service --port 7070 --queue shuffle \\
        --capacity 10000 --min-after-dequeue 2000 --seed 0 \\
        --producer mypkg.data:read_shards --num-epochs 10

Methods of service ``tfdist.data.SharedQueue`` (requests and responses are
:mod:`tfdist.wire` messages, the requests typed and validated whole by
:mod:`tfdist.data.queue_protocol`): ``Describe``, ``Dequeue``, ``Ack``,
``Enqueue``, ``EndEpoch``, ``Close``, ``Stats``. SIGTERM or SIGINT stops it
(exit 143 or 130). Importing this module does not import TensorFlow.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import inspect
import logging
import os
import signal
import sys
import threading
import traceback
from typing import Any, Callable, Sequence

import grpc

from tfdist import constants
from tfdist.data import queue_protocol
from tfdist.data.coordinator import Coordinator
from tfdist.data.delivery_ledger import DeliveryLedger
from tfdist.data.errors import QueueClosedError, SharedQueueError
from tfdist.data.fifo_queue import FIFOQueue
from tfdist.data.queue_base import QueueBase
from tfdist.data.queue_runner import QueueRunner
from tfdist.data.random_shuffle_queue import RandomShuffleQueue
from tfdist.errors import ConfigError, TfdistError
from tfdist.grpc_service import WireService
from tfdist.tls import server_credentials as _server_credentials

__all__ = ["SharedQueueServer", "QueueService", "SERVICE", "METHODS", "main"]

logger = logging.getLogger(__name__)

SERVICE = queue_protocol.SERVICE
METHODS = queue_protocol.METHODS

#: Seconds kept back from a call's deadline to answer in time.
_MARGIN_S = 0.2


def _bind_epoch(producer: Any, epoch: int, num_epochs: int | None) -> Any:
    """Turns a server producer into a zero-argument producer for one epoch."""
    if not callable(producer):
        if num_epochs != 1:
            raise ConfigError(
                "A producer that is an iterable can run only one epoch. Received: "
                f"{type(producer).__name__} with num_epochs={num_epochs}. Pass a "
                "callable: producers=[lambda epoch: read_shard(path)]."
            )
        return producer
    try:
        params = inspect.signature(producer).parameters.values()
    except (TypeError, ValueError):  # no signature (builtins): call it bare
        return producer
    required = [
        p for p in params
        if p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
    ]
    # f(epoch) if it requires one argument; f() if all have defaults.
    return functools.partial(producer, epoch) if required else producer


class SharedQueueServer:
    """Hosts one shared queue; every worker dequeues batches from it.

    The old TF1 pattern was a queue on a PS task (``shared_name``) filled by
    one client and drained by every worker. Here one task serves the queue
    and its data comes from either side:

    * **server producers**: ``producers`` run in this process (threads, or
      processes with ``use_processes=True``) once per epoch, like a
      ``QueueRunner``; each is a callable ``f(epoch) -> iterable`` (one
      required argument) or ``f() -> iterable`` (none). After
      ``num_epochs`` epochs the queue closes.
    * **remote producers**: any client calls ``SharedQueue.enqueue_many``,
      ``end_epoch`` and ``close``.

    Workers pull batches (``SharedQueue.as_dataset``), so a fast worker takes
    more of them. A delivered batch is leased to its worker until the worker
    acknowledges it; if the worker goes silent for ``worker_timeout_s``, its
    un-acknowledged batches go to the next worker that asks, so each example
    is acknowledged exactly once per epoch. When an epoch is fully produced
    and acknowledged, every worker's dataset for that epoch ends.

    Args:
        queue: the queue of epoch 0 and the model for later epochs (a
            ``RandomShuffleQueue`` reseeds with ``seed + epoch``). Defaults to
            ``FIFOQueue(capacity=10_000)`` with the element structure of the
            first element enqueued. Its elements must have numeric dtypes.
        producers: server-side producers. Defaults to ``None`` (remote ones).
        num_threads: producer threads (or processes). Defaults to one per producer.
        num_epochs: epochs the producers run; ``None`` runs them forever.
            Defaults to 1.
        enqueue_many: producer items are batches. Defaults to ``False``.
        use_processes: run producers in processes. Defaults to ``False``.
        port: port to bind (0 picks a free one). Defaults to 0.
        host: interface to bind. Defaults to "127.0.0.1"; "[::]" serves
            other machines.
        token: job token every call must carry; defaults to the environment
            variable ``TFDIST_TOKEN``; with neither, calls are not checked.
        worker_timeout_s: silence after which a worker's leases are
            re-delivered. Defaults to 10.
        on_ack: ``on_ack(worker, epoch, arrays)`` for every acknowledged batch
            (auditing). Defaults to ``None``.
        max_message_bytes: largest message. Defaults to 512 MiB.
        tls_cert: PEM certificate chain to serve TLS with (with ``tls_key``;
            clients verify it with ``SharedQueue(tls_ca=...)``). Defaults to
            ``None``: plain TCP.
        tls_key: PEM private key of ``tls_cert``. Defaults to ``None``.

    Example:
        >>> server = SharedQueueServer(
        ...     RandomShuffleQueue(capacity=10_000, min_after_dequeue=2_000, seed=0),
        ...     producers=[functools.partial(read_shard, f) for f in files],
        ...     num_epochs=5, port=7070, host="[::]").start()
        >>> # on every worker:
        >>> ds = SharedQueue("input-host:7070").as_dataset(batch_size=64)
    """

    def __init__(
        self,
        queue: QueueBase | None = None,
        *,
        producers: Sequence[Any] | None = None,
        num_threads: int | None = None,
        num_epochs: int | None = 1,
        enqueue_many: bool = False,
        use_processes: bool = False,
        port: int = 0,
        host: str = "127.0.0.1",
        token: str | None = None,
        worker_timeout_s: float = 10.0,
        on_ack: Callable[[str, int, list], None] | None = None,
        max_message_bytes: int = constants.DEFAULT_MAX_MESSAGE_BYTES,
        max_threads: int = 32,
        max_wait_s: float = 5.0,
        max_workers: int = 10_000,
        tls_cert: str | None = None,
        tls_key: str | None = None,
    ):
        if queue is None:
            queue = FIFOQueue(capacity=10_000, name="SharedQueue")
        if not isinstance(queue, QueueBase):
            raise ConfigError(
                f"queue must be a tfdist.data queue. Received: queue={type(queue).__name__}."
            )
        if num_epochs is not None and (not isinstance(num_epochs, int) or num_epochs < 1):
            raise ConfigError(
                f"num_epochs must be a positive integer or None (forever). Received: num_epochs={num_epochs!r}."
            )
        for name, value in (("max_wait_s", max_wait_s), ("max_threads", max_threads), ("max_workers", max_workers)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise ConfigError(f"{name} must be a positive number. Received: {name}={value!r}.")
        if max_threads < 4:
            raise ConfigError(f"max_threads must be at least 4. Received: max_threads={max_threads!r}.")
        if worker_timeout_s <= 0:
            raise ConfigError(
                f"worker_timeout_s must be positive. Received: worker_timeout_s={worker_timeout_s!r}."
            )
        if producers is not None:
            if not isinstance(producers, (list, tuple)) or not producers:
                raise ConfigError(
                    "producers must be a non-empty list. Received: "
                    f"producers={type(producers).__name__}. Wrap one in a list."
                )
            for p in producers:
                _bind_epoch(p, 0, num_epochs)  # validates early
        self._producers = list(producers) if producers else None
        self._num_threads = num_threads
        self._num_epochs = num_epochs
        self._enqueue_many = enqueue_many
        self._use_processes = use_processes
        self._worker_timeout_s = worker_timeout_s
        self._ledger = DeliveryLedger(queue, worker_timeout_s=worker_timeout_s, on_ack=on_ack,
                                      max_workers=max_workers)
        self._template = queue
        token = token if token is not None else os.environ.get(constants.ENV_TOKEN)
        if bool(tls_cert) != bool(tls_key):
            raise ConfigError("TLS needs both tls_cert and tls_key (the queue's certificate and its private key). "
                              f"Received: tls_cert={tls_cert!r}, tls_key={tls_key!r}.")
        self._coord = Coordinator()
        self._stopped = threading.Event()
        self._threads: list[threading.Thread] = []
        self._service = WireService(
            SERVICE,
            {name: self._rpc(name) for name in METHODS},
            what="the shared queue",
            token=token,
            how_to_fix_token=f"pass token= to SharedQueue or set {constants.ENV_TOKEN} to this job's token",
            host=host,
            port=port,
            max_message_bytes=max_message_bytes,
            max_threads=max_threads,
            tls_credentials=_server_credentials(tls_cert, tls_key) if tls_cert else None,
            errors=[  # a QueueRequestError carries its own code
                (QueueClosedError, grpc.StatusCode.OUT_OF_RANGE),
                (SharedQueueError, grpc.StatusCode.FAILED_PRECONDITION),
            ],
        )
        self._port = self._service.port
        self._host = host
        self._address = self._service.address
        # Waiting calls may hold at most half the threads: the rest always serve acks, enqueues and stops.
        self._requests = QueueService(self._ledger, queue, max_wait_s=max_wait_s,
                                      max_waiters=max(1, max_threads // 2), stats_extra={"address": self._address})

    # -- control -----------------------------------------------------------------

    @property
    def address(self) -> str:
        """``host:port`` clients connect to."""
        return self._address

    @property
    def port(self) -> int:
        return self._port

    @property
    def ledger(self) -> DeliveryLedger:
        return self._ledger

    def start(self) -> "SharedQueueServer":
        """Starts serving (and the producers, if any). Returns ``self``."""
        self._service.start()
        self._spawn(self._reap, "reaper")
        if self._producers:
            self._spawn(self._produce, "producers")
        logger.info(
            "shared queue serving on %s (queue=%s, capacity=%d, producers=%s, num_epochs=%s, "
            "worker_timeout_s=%g, auth=%s)",
            self._address, type(self._template).__name__, self._template.capacity,
            len(self._producers) if self._producers else "remote", self._num_epochs,
            self._worker_timeout_s, "token" if self._service.authenticated else "none",
        )
        if not self._service.authenticated:
            logger.warning(
                "shared queue runs without a token: any client that reaches %s can use it. "
                "Set %s.", self._address, constants.ENV_TOKEN,
            )
        return self

    def _spawn(self, target: Callable[[], None], name: str) -> None:
        t = threading.Thread(target=target, name=f"shared-queue-{name}", daemon=True)
        self._threads.append(t)
        t.start()

    def stop(self, grace: float | None = 1.0) -> None:
        """Stops the producers and the server (idempotent)."""
        if self._stopped.is_set():
            return
        self._stopped.set()
        self._coord.request_stop()
        self._ledger.shutdown()  # waiting calls answer now
        stopping = self._service.stop(grace)
        if stopping is not None:
            stopping.wait(5.0)
        for t in self._threads:
            t.join(5.0)
        logger.info("shared queue on %s stopped", self._address)

    def wait(self, timeout: float | None = None) -> bool:
        """Blocks until the server is stopped; True if it was."""
        return self._stopped.wait(timeout)

    def stats(self) -> dict:
        """Per-worker and per-epoch counters (see ``DeliveryLedger.stats``), calls waiting and refused."""
        return self._requests.handle("Stats", {}, {})[0]

    def __enter__(self) -> "SharedQueueServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop(0)

    # -- background work -----------------------------------------------------------

    def _reap(self) -> None:
        interval = min(0.5, self._worker_timeout_s / 4)
        while not self._stopped.wait(interval):
            self._ledger.expire()

    def _produce(self) -> None:
        coord = self._coord

        def on_stop(error):
            if error is not None:
                text = "".join(traceback.format_exception(error))
                self._ledger.fail(f"A producer of the shared queue failed:\n{text}")

        coord.add_stop_callback(on_stop)
        epoch = 0
        while self._num_epochs is None or epoch < self._num_epochs:
            try:
                produced_epoch, queue = self._ledger.producing_queue()
            except QueueClosedError:
                logger.info("the shared queue was closed by a client; its producers stop")
                return
            runner = QueueRunner(
                queue,
                [_bind_epoch(p, epoch, self._num_epochs) for p in self._producers],
                self._num_threads,
                enqueue_many=self._enqueue_many,
                use_processes=self._use_processes,
                close_on_end=False,
                name=f"epoch{produced_epoch}",
            )
            threads = runner.start(coord)
            for t in threads:
                while t.is_alive() and not coord.should_stop():
                    t.join(0.5)
            if coord.should_stop():
                return
            epoch += 1
            if self._num_epochs is not None and epoch == self._num_epochs:
                break
            try:
                self._ledger.end_epoch()
            except QueueClosedError:
                logger.info("the shared queue was closed by a client; its producers stop")
                return
        self._ledger.close()  # ends the last epoch and the data together

    # -- RPCs: tfdist.grpc_service.WireService (auth, decoding, error mapping) -> QueueService ---------

    def _rpc(self, method: str):
        def handler(meta, tensors, context):
            remaining = context.time_remaining()
            return self._requests.handle(method, meta, tensors,
                                         None if remaining is None else remaining - _MARGIN_S)

        return handler


class QueueService:
    """What each RPC does, without gRPC: protocol → ledger.

    :class:`SharedQueueServer` calls :meth:`handle` for every call; tests
    call it in-process to drive the exact request path. A request is parsed
    whole (:func:`tfdist.data.queue_protocol.parse`) before the ledger sees
    it, and the ledger checks the rest before it changes anything: a refused
    request changes nothing.

    Every wait is bounded by the server, whatever a request asks: by
    ``max_wait_s``, by the call's deadline, and by ``max_waiters`` (calls
    beyond it answer at once, "retry", so waiting calls can never hold every
    server thread and starve acknowledgements, enqueues or a stop).

    Args:
        ledger: the queue's epochs, leases and acknowledgements.
        template: the queue of epoch 0 (for ``Describe``).
        max_wait_s: longest a call is held waiting. Defaults to 5.
        max_waiters: most calls held waiting at once. Defaults to 16.
        stats_extra: added to every ``Stats`` reply.
    """

    def __init__(self, ledger: DeliveryLedger, template: QueueBase, *, max_wait_s: float = 5.0,
                 max_waiters: int = 16, stats_extra: dict | None = None):
        self.ledger = ledger
        self._template = template
        self.max_wait_s = max_wait_s
        self._waiters = threading.BoundedSemaphore(max(1, max_waiters))
        self._stats_extra = stats_extra or {}
        #: Requests refused, by method.
        self.rejected: dict[str, int] = {}
        self._waiting = 0
        self._lock = threading.Lock()

    @property
    def waiting_calls(self) -> int:
        """Calls held waiting now (at most ``max_waiters``)."""
        with self._lock:
            return self._waiting

    def handle(self, method: str, meta: Any, tensors: dict, budget: float | None = None) -> tuple[dict, dict]:
        """Parses, validates and applies one request.

        Args:
            budget: seconds left of the call (``None``: no deadline); waits end before it.

        Returns:
            The reply as ``(meta, tensors)``.

        Raises:
            QueueRequestError: the request was refused; nothing changed.
            QueueClosedError: data or an epoch end after ``Close``; nothing changed.
            SharedQueueError: a producer failed.
        """
        try:
            request = queue_protocol.parse(method, meta, tensors)
            wait = getattr(request, "wait_s", 0.0)
            wait = min(wait, self.max_wait_s, wait if budget is None else budget)
            if wait <= 0:
                return self._apply(request, 0.0)
            if not self._waiters.acquire(blocking=False):
                return self._apply(request, 0.0)  # every waiting slot is taken: answer now
            with self._lock:
                self._waiting += 1
            try:
                return self._apply(request, wait)
            finally:
                with self._lock:
                    self._waiting -= 1
                self._waiters.release()
        except (SharedQueueError, QueueClosedError):
            with self._lock:
                self.rejected[method] = self.rejected.get(method, 0) + 1
            raise

    def _apply(self, req, wait: float) -> tuple[dict, dict]:
        ledger = self.ledger
        if isinstance(req, queue_protocol.DequeueRequest):
            reply = ledger.dequeue(req.worker, req.n, epoch=req.epoch, after=req.after, timeout=wait, acks=req.acks)
            out = {"status": reply.kind, "epoch": reply.epoch}
            if reply.kind != "batch":
                return out, {}
            spec = ledger.element_spec
            out.update(batch_id=reply.batch_id, redelivered=reply.redelivered)
            return out, dict(zip(spec.names, reply.arrays))
        if isinstance(req, queue_protocol.AckRequest):
            return {"accepted": ledger.ack(req.worker, req.acks)}, {}
        if isinstance(req, queue_protocol.EnqueueRequest):
            return {"enqueued": ledger.enqueue(req.element(), timeout=wait)}, {}
        if isinstance(req, queue_protocol.DescribeRequest):
            spec = ledger.wait_for_element_spec(wait)
            return {
                "spec": None if spec is None else spec.to_dict(),
                "queue": type(self._template).__name__,
                "capacity": self._template.capacity,
                "closed": ledger.closed,
            }, {}
        if isinstance(req, queue_protocol.EndEpochRequest):
            return {"ended": ledger.end_epoch()}, {}
        if isinstance(req, queue_protocol.CloseRequest):
            ledger.close()
            return {"closed": True}, {}
        with self._lock:
            service = {"waiting_calls": self._waiting, "refused": dict(self.rejected)}
        return {**ledger.stats(), **service, **self._stats_extra}, {}


# -- command line ---------------------------------------------------------------------


def _load_producers(spec: str) -> list:
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise ConfigError(
            f"--producer must be MODULE:ATTRIBUTE. Received: {spec!r}. "
            "Example: --producer mypkg.data:read_shards"
        )
    obj = getattr(importlib.import_module(module_name), attr)
    return list(obj) if isinstance(obj, (list, tuple)) else [obj]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m tfdist.data.queue_service",
        description="Serves a tfdist shared input queue (token from $" + constants.ENV_TOKEN + ").",
    )
    parser.add_argument("--port", type=int, default=0, help="port (0: a free one, printed on stdout)")
    parser.add_argument("--host", default="[::]", help="interface to bind (default: all)")
    parser.add_argument("--queue", choices=("fifo", "shuffle"), default="fifo")
    parser.add_argument("--capacity", type=int, default=10_000)
    parser.add_argument("--min-after-dequeue", type=int, default=0)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--producer", help="MODULE:ATTR of a producer f(epoch) or a list of them")
    parser.add_argument("--num-threads", type=int, default=None)
    parser.add_argument("--num-epochs", type=int, default=1, help="0 runs the producers forever")
    parser.add_argument("--enqueue-many", action="store_true", help="producer items are batches")
    parser.add_argument("--use-processes", action="store_true")
    parser.add_argument("--worker-timeout-s", type=float, default=10.0)
    parser.add_argument("--max-wait-s", type=float, default=5.0,
                        help="longest the server holds a call waiting, whatever the call asks")
    parser.add_argument("--no-auth", action="store_true", help="accept calls without a token")
    parser.add_argument("--tls-cert", help="PEM certificate chain to serve TLS with (default: the job config's "
                        "security.tls_cert, from $" + constants.ENV_CONFIG + ")")
    parser.add_argument("--tls-key", help="PEM private key of --tls-cert (default: security.tls_key)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=os.environ.get(constants.ENV_LOG_LEVEL, "INFO"),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        token = os.environ.get(constants.ENV_TOKEN)
        tls_cert, tls_key = args.tls_cert, args.tls_key
        if os.environ.get(constants.ENV_CONFIG):  # a launched task: the job's token file and TLS files
            from tfdist.config import JobConfig

            security = JobConfig.from_json(os.environ[constants.ENV_CONFIG]).security
            if not token:  # a pod's mounted token (security.token_file)
                token = security.resolve_token()
            if not tls_cert and not tls_key and security.tls_cert:
                security.check_tls_files(job="input")  # a missing or non-PEM file: a ConfigError naming it
                tls_cert, tls_key = security.tls_cert, security.tls_key
        if not token and not args.no_auth:
            raise ConfigError(
                f"No job token: set {constants.ENV_TOKEN} (the same value on every task), "
                "or pass --no-auth for a queue only trusted hosts can reach."
            )
        if args.queue == "shuffle":
            queue: QueueBase = RandomShuffleQueue(args.capacity, args.min_after_dequeue, seed=args.seed)
        else:
            queue = FIFOQueue(args.capacity)
        server = SharedQueueServer(
            queue,
            producers=_load_producers(args.producer) if args.producer else None,
            num_threads=args.num_threads,
            num_epochs=None if args.num_epochs == 0 else args.num_epochs,
            enqueue_many=args.enqueue_many,
            use_processes=args.use_processes,
            port=args.port,
            host=args.host,
            token=token or None,
            worker_timeout_s=args.worker_timeout_s,
            max_wait_s=args.max_wait_s,
            tls_cert=tls_cert,
            tls_key=tls_key,
        ).start()
    except (TfdistError, OSError, ImportError, AttributeError) as e:
        logger.error("%s", e)
        return 2

    stopped_by: list[int] = []
    stoppers: list[threading.Thread] = []

    def _stop(signum, frame):
        logger.info("got signal %d; stopping", signum)
        stopped_by.append(signum)
        stopper = threading.Thread(target=server.stop, args=(0.5,), daemon=True)
        stoppers.append(stopper)
        stopper.start()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    print(f"tfdist.data.queue_service listening on {server.address}", flush=True)
    server.wait()
    # Every wait inside the server is bounded (max_wait_s) and the ledger's stop wakes them, so the
    # server's threads end within seconds; the stop itself is bounded too.
    server.stop(0.5)
    for stopper in stoppers:
        stopper.join(15.0)
    return 128 + stopped_by[0] if stopped_by else 0


if __name__ == "__main__":
    sys.exit(main())
