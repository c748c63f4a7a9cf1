"""A queue shared by every worker of a job, served over gRPC by one task.

Run standalone (an "input" task; the token comes from ``TFDIST_TOKEN``)::

    python -m tfdist.data.queue_service --port 7070 --queue shuffle \\
        --capacity 10000 --min-after-dequeue 2000 --seed 0 \\
        --producer mypkg.data:read_shards --num-epochs 10

Methods of service ``tfdist.data.SharedQueue`` (requests and responses are
:mod:`tfdist.wire` messages): ``Describe``, ``Dequeue``, ``Ack``,
``Enqueue``, ``EndEpoch``, ``Close``, ``Stats``. Importing this module does
not import TensorFlow.
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
from tfdist.data.coordinator import Coordinator
from tfdist.data.delivery_ledger import DeliveryLedger
from tfdist.data.errors import QueueClosedError, QueueTimeoutError, SharedQueueError
from tfdist.data.fifo_queue import FIFOQueue
from tfdist.data.queue_base import QueueBase
from tfdist.data.queue_runner import QueueRunner
from tfdist.data.random_shuffle_queue import RandomShuffleQueue
from tfdist.errors import ConfigError, TfdistError
from tfdist.grpc_service import WireService

__all__ = ["SharedQueueServer", "SERVICE", "METHODS", "main"]

logger = logging.getLogger(__name__)

SERVICE = "tfdist.data.SharedQueue"
METHODS = ("Describe", "Dequeue", "Ack", "Enqueue", "EndEpoch", "Close", "Stats")

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
        self._ledger = DeliveryLedger(queue, worker_timeout_s=worker_timeout_s, on_ack=on_ack)
        self._template = queue
        token = token if token is not None else os.environ.get(constants.ENV_TOKEN)
        self._coord = Coordinator()
        self._stopped = threading.Event()
        self._threads: list[threading.Thread] = []
        self._service = WireService(
            SERVICE,
            {name: getattr(self, f"_rpc_{name}") for name in METHODS},
            what="the shared queue",
            token=token,
            how_to_fix_token=f"pass token= to SharedQueue or set {constants.ENV_TOKEN} to this job's token",
            host=host,
            port=port,
            max_message_bytes=max_message_bytes,
            max_threads=max_threads,
            errors=[
                (QueueClosedError, grpc.StatusCode.OUT_OF_RANGE),
                (SharedQueueError, grpc.StatusCode.FAILED_PRECONDITION),
                ((KeyError, TypeError, ValueError, TfdistError), grpc.StatusCode.INVALID_ARGUMENT),
            ],
        )
        self._port = self._service.port
        self._host = host
        self._address = self._service.address

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
        """Per-worker and per-epoch counters (see ``DeliveryLedger.stats``)."""
        return {**self._ledger.stats(), "address": self._address}

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
            produced_epoch, queue = self._ledger.producing_queue()
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
            self._ledger.end_epoch()
        self._ledger.close()  # ends the last epoch and the data together

    # -- RPC plumbing (tfdist.grpc_service.WireService: auth, decoding, error mapping) ---------------

    @staticmethod
    def _budget(meta: dict, context: grpc.ServicerContext, default: float = 1.0) -> float:
        wait = float(meta.get("wait_s", default))
        remaining = context.time_remaining()
        if remaining is not None:
            wait = min(wait, remaining - _MARGIN_S)
        return max(0.0, wait)

    # -- RPCs ------------------------------------------------------------------------

    def _rpc_Describe(self, meta, tensors, context):
        spec = self._ledger.wait_for_element_spec(self._budget(meta, context, 0.0))
        return {
            "spec": None if spec is None else spec.to_dict(),
            "queue": type(self._template).__name__,
            "capacity": self._template.capacity,
            "closed": self._ledger.closed,
        }, {}

    def _rpc_Dequeue(self, meta, tensors, context):
        worker = str(meta["worker"])
        if meta.get("acks"):
            self._ledger.ack(worker, [int(i) for i in meta["acks"]])
        epoch = meta.get("epoch")
        reply = self._ledger.dequeue(
            worker,
            int(meta["n"]),
            epoch=None if epoch is None else int(epoch),
            after=int(meta.get("after", -1)),
            timeout=self._budget(meta, context),
        )
        out = {"status": reply.kind, "epoch": reply.epoch}
        if reply.kind != "batch":
            return out, {}
        spec = self._ledger.element_spec
        out.update(batch_id=reply.batch_id, redelivered=reply.redelivered)
        return out, dict(zip(spec.names, reply.arrays))

    def _rpc_Ack(self, meta, tensors, context):
        accepted = self._ledger.ack(str(meta["worker"]), [int(i) for i in meta.get("acks", [])])
        return {"accepted": accepted}, {}

    def _rpc_Enqueue(self, meta, tensors, context):
        names = list(meta["names"])
        structure = meta.get("structure", "tuple")
        missing = [n for n in names if n not in tensors]
        if missing:
            raise ValueError(f"tensors {missing} named in the header are missing")
        if structure == "dict":
            element: Any = {n: tensors[n] for n in names}
        elif structure == "single":
            element = tensors[names[0]]
        else:
            element = tuple(tensors[n] for n in names)
        _, queue = self._ledger.producing_queue()
        try:
            queue.enqueue_many(element, timeout=self._budget(meta, context))
            done = len(tensors[names[0]])
        except QueueTimeoutError as e:
            done = e.num_enqueued
        return {"enqueued": done}, {}

    def _rpc_EndEpoch(self, meta, tensors, context):
        return {"ended": self._ledger.end_epoch()}, {}

    def _rpc_Close(self, meta, tensors, context):
        self._ledger.close()
        return {"closed": True}, {}

    def _rpc_Stats(self, meta, tensors, context):
        return self.stats(), {}


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
    parser.add_argument("--no-auth", action="store_true", help="accept calls without a token")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=os.environ.get(constants.ENV_LOG_LEVEL, "INFO"),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        token = os.environ.get(constants.ENV_TOKEN)
        if not token and os.environ.get(constants.ENV_CONFIG):  # a pod's mounted token (security.token_file)
            from tfdist.config import JobConfig

            token = JobConfig.from_json(os.environ[constants.ENV_CONFIG]).security.resolve_token()
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
        ).start()
    except (TfdistError, OSError, ImportError, AttributeError) as e:
        logger.error("%s", e)
        return 2

    def _stop(signum, frame):
        logger.info("got signal %d; stopping", signum)
        threading.Thread(target=server.stop, args=(0.5,), daemon=True).start()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    print(f"tfdist.data.queue_service listening on {server.address}", flush=True)
    server.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
