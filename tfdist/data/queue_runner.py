"""QueueRunner: producer threads (or processes) that fill a queue.

TF1's ``tf.train.QueueRunner`` for TF2: instead of enqueue ops, producers are
Python iterables (or callables returning one) whose items are enqueued.
"""

from __future__ import annotations

import logging
import multiprocessing
import pickle
import sys
import threading
import traceback
from typing import Any, Iterable, Sequence

from tfdist.data.coordinator import Coordinator
from tfdist.data.errors import QueueClosedError
from tfdist.data.queue_base import QueueBase
from tfdist.errors import ConfigError, TfdistError

__all__ = ["QueueRunner", "ProducerProcessError"]

logger = logging.getLogger(__name__)

Producer = Any  # an iterable, or a callable returning one

#: Seconds between checks of the stop flag while waiting on a child process.
_POLL_S = 0.2


class ProducerProcessError(TfdistError):
    """A producer process died, or raised an exception that cannot be pickled.

    The message carries the child's traceback when there was one.
    """


def _iterate(producer: Producer) -> Iterable:
    return producer() if callable(producer) else producer


class QueueRunner:
    """Runs producers in threads (or processes) that enqueue into a queue.

    Each producer is an iterable, or a callable returning one. Its items are
    elements (``enqueue``) or, with ``enqueue_many=True``, batches of
    elements (``enqueue_many``; fewer Python calls per element, faster).
    ``num_threads`` threads share the producers: each takes the next producer
    not yet started and exhausts it (like TF1's reader threads over a
    filename queue). When every producer is exhausted the queue is closed,
    so the input ends cleanly after the last (possibly smaller) batch.

    The first exception in a producer stops the coordinator with it: the
    queue is aborted, consumers (``as_dataset``, ``model.fit``) fail with
    that exception, and the ``Coordinator`` re-raises it with its traceback.

    With ``use_processes=True`` each of the ``num_threads`` workers is a
    process (``multiprocessing``, ``start_method``) that runs its share of the
    producers and sends items to a feeder thread here, for Python-heavy
    decoding that the GIL would serialise. Producers must then be picklable
    (module-level functions, ``functools.partial``, lists), and a script
    must guard its entry point with ``if __name__ == "__main__":``.

    A producer that never ends (e.g. an environment generating episodes)
    feeds training as it runs: this is the case ``tf.data`` cannot serve.

    Args:
        queue: the queue to fill.
        producers: a list of iterables or zero-argument callables.
        num_threads: worker threads (or processes). Defaults to
            ``len(producers)``; more than that is capped.
        enqueue_many: items are batches. Defaults to ``False``.
        use_processes: run producers in processes. Defaults to ``False``.
        close_on_end: close the queue when all producers are exhausted.
            Defaults to ``True``.
        start_method: multiprocessing start method. Defaults to "spawn"
            (safe with TensorFlow's threads in the parent).
        name: for thread names and logs. Defaults to the queue's name.

    Example:
        >>> queue = RandomShuffleQueue(capacity=10_000, min_after_dequeue=2_000, seed=0)
        >>> runner = QueueRunner(queue, producers=[read_shard(f) for f in files], num_threads=4)
        >>> with Coordinator() as coord:
        ...     runner.start(coord)
        ...     model.fit(queue.as_dataset(batch_size=64), epochs=1)
    """

    def __init__(
        self,
        queue: QueueBase,
        producers: Sequence[Producer],
        num_threads: int | None = None,
        *,
        enqueue_many: bool = False,
        use_processes: bool = False,
        close_on_end: bool = True,
        start_method: str = "spawn",
        name: str | None = None,
    ):
        if not isinstance(queue, QueueBase):
            raise ConfigError(
                "QueueRunner needs a tfdist.data queue. Received: "
                f"queue={type(queue).__name__}. Use FIFOQueue, RandomShuffleQueue "
                "or PaddingFIFOQueue."
            )
        if not isinstance(producers, (list, tuple)) or not producers:
            raise ConfigError(
                "producers must be a non-empty list of iterables or callables. "
                f"Received: producers={type(producers).__name__}. Wrap a single "
                "producer in a list: producers=[gen]."
            )
        if num_threads is None:
            num_threads = len(producers)
        if not isinstance(num_threads, int) or num_threads < 1:
            raise ConfigError(
                f"num_threads must be a positive integer. Received: num_threads={num_threads!r}."
            )
        if use_processes:
            for p in producers:
                try:
                    pickle.dumps(p)
                except Exception as e:  # noqa: BLE001 - reported with advice
                    raise ConfigError(
                        "With use_processes=True every producer must be picklable "
                        f"(a module-level function, functools.partial, a list). "
                        f"Received: {p!r} ({e}). Pass e.g. "
                        "functools.partial(read_shard, path) instead of read_shard(path)."
                    ) from e
        self._queue = queue
        self._producers = list(producers)
        self._num_threads = min(num_threads, len(self._producers))
        self._enqueue_many = enqueue_many
        self._use_processes = use_processes
        self._close_on_end = close_on_end
        self._start_method = start_method
        self._name = name or queue.name
        self._lock = threading.Lock()
        self._next_producer = 0
        self._running = 0
        self._threads: list[threading.Thread] = []
        self._coord: Coordinator | None = None

    @property
    def queue(self) -> QueueBase:
        return self._queue

    @property
    def threads(self) -> list[threading.Thread]:
        return list(self._threads)

    def start(self, coord: Coordinator | None = None, daemon: bool = True) -> list[threading.Thread]:
        """Starts the producer threads (and processes).

        Args:
            coord: the coordinator that stops them and keeps their first
                error. Defaults to a new one (``runner.coordinator``).
            daemon: make the threads daemons. Defaults to ``True``.

        Returns:
            The started threads (registered with ``coord``).
        """
        if self._threads:
            raise TfdistError(
                f"QueueRunner {self._name!r} was already started; build a new one."
            )
        coord = coord or Coordinator()
        self._coord = coord
        coord.add_stop_callback(self._on_stop)
        self._running = self._num_threads
        logger.info(
            "starting %d producer %s for %s (%d producers, enqueue_many=%s)",
            self._num_threads,
            "processes" if self._use_processes else "threads",
            self._name,
            len(self._producers),
            self._enqueue_many,
        )
        for i in range(self._num_threads):
            if self._use_processes:
                share = self._producers[i :: self._num_threads]
                target, args = self._run_process, (coord, share, i)
            else:
                target, args = self._run_thread, (coord,)
            t = threading.Thread(
                target=target, args=args, name=f"{self._name}-producer-{i}", daemon=daemon
            )
            coord.register_thread(t)
            self._threads.append(t)
        for t in self._threads:
            t.start()
        return list(self._threads)

    @property
    def coordinator(self) -> Coordinator | None:
        return self._coord

    # -- internals ---------------------------------------------------------------

    def _on_stop(self, error: BaseException | None) -> None:
        if error is None:
            self._queue.close(cancel_pending_enqueues=True)
        else:
            self._queue.abort(error)

    def _put(self, item: Any) -> None:
        if self._enqueue_many:
            self._queue.enqueue_many(item)
        else:
            self._queue.enqueue(item)

    def _take_producer(self) -> Producer | None:
        with self._lock:
            if self._next_producer >= len(self._producers):
                return None
            p = self._producers[self._next_producer]
            self._next_producer += 1
            return p

    def _finish(self, coord: Coordinator) -> None:
        with self._lock:
            self._running -= 1
            last = self._running == 0
        if last and self._close_on_end and not coord.should_stop():
            logger.info("all producers of %s are done; closing it", self._name)
            self._queue.close()

    def _run_thread(self, coord: Coordinator) -> None:
        try:
            while not coord.should_stop():
                producer = self._take_producer()
                if producer is None:
                    break
                for item in _iterate(producer):
                    if coord.should_stop():
                        break
                    self._put(item)
        except QueueClosedError:
            if not coord.should_stop():
                coord.request_stop(sys.exc_info())
        except BaseException:  # noqa: BLE001 - handed to the coordinator
            coord.request_stop(sys.exc_info())
        finally:
            self._finish(coord)

    def _run_process(self, coord: Coordinator, producers: list, index: int) -> None:
        ctx = multiprocessing.get_context(self._start_method)
        recv_conn, send_conn = ctx.Pipe(duplex=False)
        stop = ctx.Event()
        proc = ctx.Process(
            target=_process_main,
            args=(send_conn, producers, stop),
            name=f"{self._name}-producer-{index}",
            daemon=True,
        )
        try:
            proc.start()
            send_conn.close()
            while True:
                if coord.should_stop():
                    break
                if not recv_conn.poll(_POLL_S):
                    continue
                try:
                    kind, payload = recv_conn.recv()
                except EOFError:
                    proc.join(_POLL_S * 5)
                    raise ProducerProcessError(
                        f"Producer process {proc.name} (pid {proc.pid}) exited with "
                        f"code {proc.exitcode} before finishing its producers."
                    ) from None
                if kind == "item":
                    self._put(payload)
                elif kind == "done":
                    break
                else:  # "error"
                    raise _rebuild_error(payload, proc)
        except QueueClosedError:
            if not coord.should_stop():
                coord.request_stop(sys.exc_info())
        except BaseException:  # noqa: BLE001 - handed to the coordinator
            coord.request_stop(sys.exc_info())
        finally:
            stop.set()
            recv_conn.close()
            proc.join(2.0)
            if proc.is_alive():
                proc.kill()
                proc.join(2.0)
            self._finish(coord)


def _rebuild_error(payload: tuple, proc) -> BaseException:
    blob, text = payload
    try:
        error = pickle.loads(blob) if blob is not None else None
    except Exception:  # noqa: BLE001 - fall back to the text
        error = None
    if error is None:
        return ProducerProcessError(f"Producer process {proc.name} failed:\n{text}")
    error.add_note(f"Traceback in producer process {proc.name} (pid {proc.pid}):\n{text}")
    return error


def _process_main(conn, producers: list, stop) -> None:
    """Entry point of a producer process: sends ("item", x), then ("done", None)."""
    try:
        for producer in producers:
            for item in _iterate(producer):
                if stop.is_set():
                    return
                conn.send(("item", item))
        conn.send(("done", None))
    except BaseException as e:  # noqa: BLE001 - sent to the parent
        text = traceback.format_exc()
        try:
            blob = pickle.dumps(e)
        except Exception:  # noqa: BLE001
            blob = None
        try:
            conn.send(("error", (blob, text)))
        except (BrokenPipeError, OSError):
            pass
    finally:
        conn.close()
