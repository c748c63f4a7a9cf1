"""Epochs, leases and acknowledgements of a shared queue (no I/O, no TensorFlow).

The shared-queue service keeps one queue per epoch. A worker's dequeue takes
a batch from its epoch's queue and *leases* it to that worker; the worker
acknowledges it later. A lease of a worker that stops calling (no dequeue,
ack or heartbeat for ``worker_timeout_s``) is put back at the front of the
epoch, whole, for the next worker that asks: every example is acknowledged
exactly once per epoch. An epoch is over when its producers are done, its
queue is empty and no lease is outstanding; every worker that asks for it
then gets END, so all of them see the same end of epoch.

Every method that serves a request checks everything first and changes
nothing when it refuses (a producer's failure, too many workers, an element
that does not match the queue's, data after ``close``): the queue service's
validate-then-apply rule (:mod:`tfdist.data.queue_protocol`).
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import threading
import time
from typing import Any, Callable

import numpy as np

from tfdist.data.errors import QueueClosedError, QueueTimeoutError, SharedQueueError
from tfdist.data.queue_base import QueueBase
from tfdist.data.queue_protocol import QueueRequestError, short

__all__ = ["DeliveryLedger", "Reply"]

logger = logging.getLogger(__name__)

#: Longest single wait inside ``dequeue``; bounds the delay before a lease
#: expiry or an abort is noticed by a waiting dequeuer.
_SLICE_S = 0.05


@dataclasses.dataclass
class Reply:
    """Outcome of a dequeue: a batch, the end of an epoch, or "ask again"."""

    kind: str  # "batch" | "end" | "retry"
    epoch: int | None = None
    batch_id: int | None = None
    arrays: list | None = None
    redelivered: bool = False


@dataclasses.dataclass
class _Lease:
    worker: str
    epoch: int
    arrays: list


@dataclasses.dataclass
class _WorkerStats:
    last_seen: float
    alive: bool = True
    delivered_batches: int = 0
    delivered_examples: int = 0
    acked_batches: int = 0
    acked_examples: int = 0
    late_acks: int = 0
    epoch: int | None = None  # the epoch it last asked for
    leases: set = dataclasses.field(default_factory=set)


@dataclasses.dataclass
class _Epoch:
    index: int
    queue: QueueBase
    producing_done: bool = False
    redeliver: collections.deque = dataclasses.field(default_factory=collections.deque)
    leases: set = dataclasses.field(default_factory=set)
    acked_examples: int = 0
    redelivered_batches: int = 0


class DeliveryLedger:
    """Per-epoch queues with leases, acks and re-delivery.

    Args:
        template: the queue of epoch 0; later epochs get
            ``template._fresh_copy(epoch)`` (a shuffle queue's seed is
            ``seed + epoch``).
        worker_timeout_s: a worker silent this long loses its leases.
            Defaults to 10.
        on_ack: ``on_ack(worker, epoch, arrays)`` for every acknowledged
            batch (e.g. to audit delivery). Called without the lock held.
        clock: returns seconds, for worker liveness; injectable for tests.
            Defaults to ``time.monotonic``.
        max_workers: most distinct worker names it keeps statistics for; a
            request from one more is refused (``RESOURCE_EXHAUSTED``), so no
            client can grow its memory without bound. Defaults to 10,000.
    """

    def __init__(
        self,
        template: QueueBase,
        worker_timeout_s: float = 10.0,
        on_ack: Callable[[str, int, list], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
        max_workers: int = 10_000,
    ):
        self._template = template
        self._max_workers = max_workers
        self._stopping = False
        self._worker_timeout_s = worker_timeout_s
        self._on_ack = on_ack
        self._clock = clock
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._epochs: dict[int, _Epoch] = {}
        self._finished: set[int] = set()
        self._producing = 0
        self._last_epoch: int | None = None  # set by close()
        self._lease_epoch: dict[int, int] = {}
        self._leases: dict[int, _Lease] = {}
        self._workers: dict[str, _WorkerStats] = {}
        self._next_batch_id = 0
        self._error: str | None = None
        self._epoch_locked(0)

    # -- epochs ------------------------------------------------------------------

    def _notify(self) -> None:
        with self._lock:
            self._changed.notify_all()

    def _epoch_locked(self, index: int) -> _Epoch:
        ep = self._epochs.get(index)
        if ep is None:
            base = self._epochs.get(index - 1)
            queue = self._template if index == 0 else (base.queue if base else self._template)._fresh_copy(index)
            queue._on_put = self._notify
            ep = self._epochs[index] = _Epoch(index, queue)
        return ep

    @property
    def element_spec(self):
        """The element structure, once any epoch's queue knows it (else ``None``)."""
        with self._lock:
            return self._element_spec_locked()

    def _element_spec_locked(self):
        for _, ep in sorted(self._epochs.items()):
            if ep.queue.element_spec is not None:
                return ep.queue.element_spec
        return None

    def wait_for_element_spec(self, timeout: float):
        """The element structure, waiting up to ``timeout`` s for a first element."""
        deadline = time.monotonic() + timeout
        with self._lock:
            while True:
                spec = self._element_spec_locked()
                remaining = deadline - time.monotonic()
                if spec is not None or remaining <= 0 or self._stopping:
                    return spec
                self._changed.wait(min(_SLICE_S * 4, remaining))

    def producing_queue(self) -> tuple[int, QueueBase]:
        """The epoch that new elements go to, and its queue.

        Raises:
            QueueClosedError: the ledger is closed (no epoch takes elements).
        """
        with self._lock:
            self._check_open_locked("take more elements")
            return self._producing, self._epoch_locked(self._producing).queue

    def _check_open_locked(self, what: str) -> None:
        if self._last_epoch is not None:
            raise QueueClosedError(
                f"The shared queue is closed (its last epoch is {self._last_epoch}); it cannot {what}. "
                "Close it only after the last element went in."
            )

    def enqueue(self, element: Any, timeout: float) -> int:
        """Adds a batch of elements to the producing epoch, waiting up to ``timeout`` for room.

        Checked before anything goes in: the ledger is open, and the batch's
        components match the queue's element (names, structure, per-example
        shapes, dtypes that cast without changing kind).

        Returns:
            How many leading elements went in (fewer than the batch when the
            queue stayed full for ``timeout``).

        Raises:
            QueueClosedError: the ledger is closed.
            QueueRequestError: the batch does not match the queue's element.
        """
        with self._lock:
            if self._stopping:
                raise QueueRequestError("The shared queue is stopping.", "UNAVAILABLE")
            self._check_open_locked("take more elements")
            queue = self._epoch_locked(self._producing).queue
            self._check_element_locked(queue, element)
        try:
            queue.enqueue_many(element, timeout=timeout)
        except QueueTimeoutError as e:
            return e.num_enqueued
        except ValueError as e:  # a shape fixed by another producer in between
            raise QueueRequestError(f"Enqueue: {e}") from None
        return len(next(iter(element.values())) if isinstance(element, dict) else
                   element[0] if isinstance(element, tuple) else element)

    def _check_element_locked(self, queue: QueueBase, element: Any) -> None:
        from tfdist.data.element_spec import ElementSpec

        got = ElementSpec.infer(element, batched=True)
        spec = queue.element_spec or self._element_spec_locked()
        if spec is None:
            return
        same_names = (set(got.names) == set(spec.names) if spec.structure == "dict"  # a dict's key order is free
                      else tuple(got.names) == tuple(spec.names))
        if got.structure != spec.structure or not same_names:
            raise QueueRequestError(
                f"Enqueue: the queue holds {spec.structure} elements with components {short(list(spec.names))}. "
                f"Received: a {got.structure} with {short(list(got.names))}. Send elements structured as the first."
            )
        received = {name: (dtype, shape) for name, dtype, shape in zip(got.names, got.dtypes, got.shapes)}
        for name, want, want_shape in zip(spec.names, spec.dtypes, spec.shapes):
            have, have_shape = received[name]
            if not np.can_cast(have, want, casting="same_kind"):
                raise QueueRequestError(
                    f"Enqueue: component {short(name)} is {np.dtype(have).name}; the queue holds "
                    f"{np.dtype(want).name}. Send {np.dtype(want).name} (or a type that casts to it)."
                )
            if want_shape is not None and (len(want_shape) != len(have_shape) or any(
                    d is not None and d != g for d, g in zip(want_shape, have_shape))):
                raise QueueRequestError(
                    f"Enqueue: component {short(name)} has per-example shape {list(have_shape)}; the queue holds "
                    f"{list(want_shape)}."
                )

    def end_epoch(self) -> int:
        """Marks the producing epoch complete; later elements go to the next one.

        Returns:
            The epoch that was ended.

        Raises:
            QueueClosedError: the ledger is closed (its last epoch is ended already).
        """
        with self._lock:
            self._check_open_locked("end another epoch")
            ep = self._epoch_locked(self._producing)
            ep.producing_done = True
            ep.queue.close()
            self._producing += 1
            self._epoch_locked(self._producing)
            self._changed.notify_all()
            logger.info("epoch %d fully produced (%d examples)", ep.index, ep.queue.num_enqueued)
            return ep.index

    def close(self) -> None:
        """No more data: the producing epoch is the last (dropped if empty)."""
        with self._lock:
            if self._last_epoch is not None:
                return
            ep = self._epoch_locked(self._producing)
            ep.producing_done = True
            ep.queue.close()
            if ep.queue.num_enqueued == 0 and self._producing > 0:
                del self._epochs[self._producing]
                self._last_epoch = self._producing - 1
            else:
                self._last_epoch = self._producing
            self._changed.notify_all()
            logger.info("queue closed after epoch %d", self._last_epoch)

    def fail(self, message: str) -> None:
        """A producer failed: every later dequeue raises with ``message``."""
        with self._lock:
            if self._error is None:
                self._error = message
            self._changed.notify_all()

    @property
    def closed(self) -> bool:
        return self._last_epoch is not None

    def shutdown(self) -> None:
        """The service is stopping: every wait returns now and new waits do not start."""
        with self._lock:
            self._stopping = True
            self._changed.notify_all()

    # -- workers -------------------------------------------------------------------

    def _check_worker_locked(self, worker: str) -> None:
        """Refuses a new worker beyond ``max_workers`` (before anything changes)."""
        if worker not in self._workers and len(self._workers) >= self._max_workers:
            raise QueueRequestError(
                f"The shared queue already keeps {self._max_workers} workers (max_workers); refused a new one "
                f"({short(worker)}). Reuse worker names, or raise max_workers.", "RESOURCE_EXHAUSTED",
            )

    def _seen_locked(self, worker: str) -> _WorkerStats:
        now = self._clock()
        w = self._workers.get(worker)
        if w is None:
            w = self._workers[worker] = _WorkerStats(last_seen=now)
            logger.info("worker %s connected", short(worker))
        elif not w.alive:
            logger.warning("worker %s is back after its leases were re-delivered", short(worker))
            w.alive = True
        w.last_seen = now
        return w

    def heartbeat(self, worker: str) -> None:
        with self._lock:
            self._check_worker_locked(worker)
            self._seen_locked(worker)

    def expire(self) -> list[str]:
        """Re-delivers the leases of workers silent for ``worker_timeout_s``.

        Returns:
            The workers found dead now.
        """
        now = self._clock()
        dead = []
        with self._lock:
            for name, w in self._workers.items():
                # only a worker holding batches can hold up an epoch; an idle
                # one that went quiet (finished, disconnected) is left alone
                if w.alive and w.leases and now - w.last_seen > self._worker_timeout_s:
                    w.alive = False
                    dead.append(name)
                    for batch_id in sorted(w.leases, reverse=True):
                        lease = self._leases.pop(batch_id)
                        ep = self._epochs[lease.epoch]
                        ep.leases.discard(batch_id)
                        ep.redeliver.appendleft((batch_id, lease.arrays))
                        ep.redelivered_batches += 1
                    logger.warning(
                        "worker %s silent for %.1f s (worker_timeout_s=%g); re-delivering "
                        "its %d un-acknowledged batch(es)",
                        name, now - w.last_seen, self._worker_timeout_s, len(w.leases),
                    )
                    w.leases.clear()
            if dead:
                self._changed.notify_all()
        return dead

    # -- dequeue / ack ---------------------------------------------------------------

    def _resolve_epoch_locked(self, epoch: int | None, after: int) -> int | None:
        if epoch is not None:
            return epoch
        e = after + 1
        while e in self._finished:
            e += 1
        if self._last_epoch is not None and e > self._last_epoch:
            return None
        return e

    def _lease_locked(self, worker: str, ep: _Epoch, batch_id: int, arrays: list, redelivered: bool) -> Reply:
        w = self._workers[worker]
        self._leases[batch_id] = _Lease(worker, ep.index, arrays)
        self._lease_epoch[batch_id] = ep.index
        ep.leases.add(batch_id)
        w.leases.add(batch_id)
        w.delivered_batches += 1
        w.delivered_examples += len(arrays[0])
        return Reply("batch", ep.index, batch_id, arrays, redelivered)

    def _maybe_finish_locked(self, ep: _Epoch) -> bool:
        if (
            ep.index in self._finished
            or not ep.producing_done
            or ep.leases
            or ep.redeliver
            or ep.queue.size() > 0
        ):
            return ep.index in self._finished
        self._finished.add(ep.index)
        logger.info("epoch %d complete: %d examples acknowledged", ep.index, ep.acked_examples)
        self._changed.notify_all()
        return True

    def dequeue(
        self,
        worker: str,
        n: int,
        epoch: int | None = None,
        after: int = -1,
        timeout: float = 1.0,
        acks: tuple[int, ...] | list[int] = (),
    ) -> Reply:
        """Acknowledges ``acks``, then leases the next batch of up to ``n`` examples of an epoch.

        Args:
            worker: the caller's name.
            n: batch size wanted (a re-delivered batch keeps its size, and
                the last batch of an epoch may be smaller).
            epoch: the caller's epoch, or ``None`` to join the oldest epoch
                after ``after`` that is not over. An epoch not produced yet
                is waited for (then "retry"); it is not created.
            after: the last epoch the caller finished. Defaults to -1.
            timeout: seconds to wait before answering "retry".
            acks: batches to acknowledge first (see :meth:`ack`).

        Raises:
            SharedQueueError: a producer failed (nothing was changed, acks
                included, when it had failed before the call).
            QueueRequestError: one worker too many (``max_workers``).
        """
        if not isinstance(n, (int, np.integer)) or isinstance(n, bool) or n < 1:
            raise QueueRequestError(f"n must be a positive integer. Received: n={short(n)}.")
        deadline = time.monotonic() + timeout
        with self._lock:
            if self._error is not None:
                raise SharedQueueError(self._error)
            self._check_worker_locked(worker)
            accepted = self._ack_locked(worker, acks) if acks else []
            w = self._seen_locked(worker)
            e = self._resolve_epoch_locked(epoch, after)
            if e is None:
                reply = Reply("end", None)
            else:
                w.epoch = e
                reply = self._dequeue_locked(worker, n, e, deadline)
        self._report_acks(worker, accepted)
        return reply

    def _dequeue_locked(self, worker: str, n: int, e: int, deadline: float) -> Reply:
        while True:
            if self._error is not None:
                raise SharedQueueError(self._error)
            if self._last_epoch is not None and e > self._last_epoch:
                return Reply("end", None)  # no such epoch: the data has ended
            if e in self._finished:
                return Reply("end", e)
            if e <= self._producing:  # an epoch not begun yet is not created by asking for it
                ep = self._epoch_locked(e)
                if ep.redeliver:
                    batch_id, arrays = ep.redeliver.popleft()
                    return self._lease_locked(worker, ep, batch_id, arrays, redelivered=True)
                try:
                    rows = ep.queue._take(n, allow_smaller=True, timeout=0)
                except QueueTimeoutError:
                    rows = None
                except QueueClosedError:
                    rows = None
                    if self._maybe_finish_locked(ep):
                        return Reply("end", e)
                except Exception as err:  # noqa: BLE001 - a producer's abort
                    raise SharedQueueError(f"The queue of epoch {e} failed: {err!r}") from err
                if rows is not None:
                    batch_id = self._next_batch_id
                    self._next_batch_id += 1
                    return self._lease_locked(worker, ep, batch_id, ep.queue._stack(rows), False)
            remaining = deadline - time.monotonic()
            if remaining <= 0 or self._stopping:
                return Reply("retry", e)
            self._changed.wait(min(_SLICE_S, remaining))

    def ack(self, worker: str, batch_ids: list[int] | tuple[int, ...]) -> int:
        """Acknowledges batches; returns how many were accepted.

        An ack for a lease that already expired is accepted if the batch is
        still waiting for re-delivery (it is then withdrawn); otherwise it is
        counted as late and ignored (another worker has the batch now). An
        empty list is a heart-beat.

        Raises:
            QueueRequestError: one worker too many (``max_workers``); nothing changed.
        """
        with self._lock:
            self._check_worker_locked(worker)
            accepted = self._ack_locked(worker, batch_ids)
        self._report_acks(worker, accepted)
        return len(accepted)

    def _report_acks(self, worker: str, accepted: list) -> None:
        if self._on_ack is not None:
            for epoch, arrays in accepted:
                self._on_ack(worker, epoch, arrays)

    def _ack_locked(self, worker: str, batch_ids) -> list:
        accepted = []
        w = self._seen_locked(worker)
        for batch_id in batch_ids:
            lease = self._leases.get(batch_id)
            if lease is not None and lease.worker == worker:
                del self._leases[batch_id]
                ep = self._epochs[lease.epoch]
                ep.leases.discard(batch_id)
                w.leases.discard(batch_id)
                arrays = lease.arrays
            else:
                ep = self._epochs.get(self._lease_epoch.get(batch_id, -1))
                found = None
                for item in ep.redeliver if ep else ():
                    if item[0] == batch_id:
                        found = item
                if found is None:
                    w.late_acks += 1
                    logger.warning(
                        "late ack from %s for batch %d (it was re-delivered to another worker)",
                        short(worker), batch_id,
                    )
                    continue
                ep.redeliver.remove(found)
                arrays = found[1]
            examples = len(arrays[0])
            w.acked_batches += 1
            w.acked_examples += examples
            ep.acked_examples += examples
            self._lease_epoch.pop(batch_id, None)
            accepted.append((ep.index, arrays))
            self._maybe_finish_locked(ep)
        self._changed.notify_all()
        return accepted

    # -- introspection -------------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        """JSON-able counters: per worker and per epoch."""
        with self._lock:
            return {
                "producing_epoch": self._producing,
                "last_epoch": self._last_epoch,
                "finished_epochs": sorted(self._finished),
                "error": self._error,
                "epochs": {
                    str(i): {
                        "enqueued": ep.queue.num_enqueued,
                        "size": ep.queue.size(),
                        "producing_done": ep.producing_done,
                        "leases": len(ep.leases),
                        "acked_examples": ep.acked_examples,
                        "redelivered_batches": ep.redelivered_batches,
                    }
                    for i, ep in sorted(self._epochs.items())
                },
                "workers": {
                    name: {
                        "alive": w.alive,
                        "epoch": w.epoch,
                        "delivered_batches": w.delivered_batches,
                        "delivered_examples": w.delivered_examples,
                        "acked_batches": w.acked_batches,
                        "acked_examples": w.acked_examples,
                        "late_acks": w.late_acks,
                        "leases": len(w.leases),
                    }
                    for name, w in self._workers.items()
                },
            }

    def state(self) -> dict[str, Any]:
        """Everything a request can change, as plain values (tests compare two of these).

        Unlike :meth:`stats` it holds the queued rows, the leases and the
        batches waiting for re-delivery, by batch id and content.
        """
        def rows(arrays):
            return [(a.dtype.name, a.shape, a.tobytes()) for a in arrays]

        with self._lock:
            epochs = {}
            for i, ep in sorted(self._epochs.items()):
                q = ep.queue
                with q._lock:
                    queued = [rows(r) for r in getattr(q, "_rows", ())]
                    closed = q._closed
                spec = q.element_spec
                epochs[i] = {
                    "queued": queued, "closed": closed, "enqueued": q.num_enqueued,
                    "spec": None if spec is None else spec.to_dict(), "producing_done": ep.producing_done,
                    "leases": sorted(ep.leases), "redeliver": [(b, rows(a)) for b, a in ep.redeliver],
                    "acked_examples": ep.acked_examples, "redelivered_batches": ep.redelivered_batches,
                }
            return {
                "producing": self._producing, "last_epoch": self._last_epoch, "finished": sorted(self._finished),
                "error": self._error, "next_batch_id": self._next_batch_id, "epochs": epochs,
                "leases": {b: (l.worker, l.epoch, rows(l.arrays)) for b, l in sorted(self._leases.items())},
                "lease_epoch": dict(sorted(self._lease_epoch.items())),
                "workers": {name: dataclasses.asdict(w) for name, w in sorted(self._workers.items())},
            }
