"""TF1 queue semantics in plain Python: the base class of tfdist's queues.

Why not ``tf.queue.FIFOQueue`` and friends? Checked on TF 2.21:

* an eager ``dequeue``/``enqueue`` on a ``tf.queue`` op takes no timeout and
  blocks until the queue changes (TF1 bounded it with the session's
  ``RunOptions.timeout_in_ms``, which has no eager equivalent);
* the end of data cannot end a ``tf.data.Dataset`` from graph code: an
  ``OutOfRangeError`` raised inside ``Dataset.map`` becomes an
  ``InvalidArgumentError`` (cardinality is preserved), so the last partial
  batch would be an error rather than a clean end;
* the shared queue service must hold the same queues without importing
  TensorFlow (a small, fast-starting process).

So the queues are bounded containers of numpy rows guarded by one lock and two
condition variables, with TF1's semantics (capacity, ``min_after_dequeue``,
``close(cancel_pending_enqueues)``, ``dequeue_up_to`` after close) and a
``timeout`` on every blocking call. ``as_dataset`` turns one into a
``tf.data.Dataset``.
"""

from __future__ import annotations

import atexit
import logging
import threading
import time
import weakref
from typing import Any, Callable, Sequence

import numpy as np

from tfdist.data.element_spec import ElementSpec
from tfdist.data.errors import QueueClosedError, QueueTimeoutError
from tfdist.errors import ConfigError

__all__ = ["QueueBase"]

logger = logging.getLogger(__name__)

_LIVE_QUEUES: "weakref.WeakSet[QueueBase]" = weakref.WeakSet()


@atexit.register
def _close_live_queues() -> None:
    # Input-pipeline threads blocked in a dequeue must not outlive the
    # interpreter: closing every queue lets them return.
    for queue in list(_LIVE_QUEUES):
        queue.close(cancel_pending_enqueues=True)


class QueueBase:
    """A bounded, thread-safe queue of elements with declared dtypes/shapes.

    Use a subclass: :class:`~tfdist.data.FIFOQueue`,
    :class:`~tfdist.data.RandomShuffleQueue` or
    :class:`~tfdist.data.PaddingFIFOQueue`.

    An element is one tensor, a tuple of tensors or (with ``names``) a dict of
    tensors; tensors are stored as numpy arrays (``tf.Tensor`` inputs are
    converted). Every blocking method takes ``timeout`` (seconds, ``None``
    waits until the queue changes) and raises
    :class:`~tfdist.data.QueueTimeoutError` when it expires, having removed
    nothing.

    Args:
        capacity: the most elements the queue holds; ``enqueue`` blocks when full.
        dtypes: one dtype (single-tensor elements) or a list (tuples).
            Defaults to ``None``: structure, dtypes and shapes are taken from
            the first element enqueued.
        shapes: per-example shapes, one per dtype. Defaults to ``None``: fixed
            by the first element enqueued.
        names: component names; elements are then dicts. Defaults to ``None``.
        name: used in messages and logs. Defaults to the class name.
    """

    def __init__(
        self,
        capacity: int,
        dtypes: Any = None,
        shapes: Any = None,
        names: Sequence[str] | None = None,
        name: str | None = None,
    ):
        if not isinstance(capacity, (int, np.integer)) or isinstance(capacity, bool) or capacity < 1:
            raise ConfigError(
                f"capacity must be a positive integer. Received: capacity={capacity!r}."
            )
        self._capacity = int(capacity)
        if dtypes is None:
            if shapes is not None or names is not None:
                raise ConfigError(
                    "shapes and names need dtypes. Received: dtypes=None, "
                    f"shapes={shapes!r}, names={names!r}. Declare dtypes too, or "
                    "nothing (then the first element sets all three)."
                )
            self._spec: ElementSpec | None = None
        else:
            self._spec = ElementSpec.from_declaration(dtypes, shapes, names)
        self._spec_known = threading.Event()
        if self._spec is not None:
            self._spec_known.set()
        self._name = name or type(self).__name__
        self._lock = threading.Lock()
        self._not_empty = threading.Condition(self._lock)
        self._not_full = threading.Condition(self._lock)
        self._closed = False
        self._cancelled = False
        self._abort_error: BaseException | None = None
        self._num_enqueued = 0
        self._pending_enqueues = 0  # enqueuers waiting for room (for tests/stats)
        #: Called (without the lock) after elements went in; the shared-queue
        #: service uses it to wake dequeuers that wait on its own condition.
        self._on_put: Callable[[], None] | None = None
        _LIVE_QUEUES.add(self)

    def _fresh_copy(self, seed_offset: int) -> "QueueBase":
        """An empty queue like this one (same spec), for the next epoch."""
        raise NotImplementedError

    # -- storage hooks for subclasses ------------------------------------------

    def _store_len(self) -> int:
        raise NotImplementedError

    def _store_put(self, rows: list) -> None:
        raise NotImplementedError

    def _store_take(self, n: int) -> list:
        raise NotImplementedError

    def _available(self) -> int:
        """How many elements a dequeue may take now (lock held)."""
        return self._store_len()

    def _stack(self, rows: list) -> list:
        return [np.stack([row[j] for row in rows]) for j in range(len(self._spec.names))]

    # -- properties --------------------------------------------------------------

    @property
    def name(self) -> str:
        return self._name

    @property
    def capacity(self) -> int:
        return self._capacity

    @property
    def element_spec(self) -> ElementSpec | None:
        """Names, dtypes and per-example shapes of an element.

        ``None`` while undeclared and nothing was enqueued yet.
        """
        return self._spec

    def wait_for_element_spec(self, timeout: float | None = 60.0) -> ElementSpec:
        """Returns the element spec, waiting for a first element if undeclared.

        Raises:
            QueueTimeoutError: nothing was enqueued within ``timeout``.
        """
        if not self._spec_known.wait(timeout):
            raise QueueTimeoutError(
                f"{self._name} was built without dtypes and nothing was enqueued "
                f"within {timeout} s, so its element structure is unknown. "
                "Declare dtypes=/shapes= or start the producers first."
            )
        return self._spec

    @property
    def dtypes(self) -> list | None:
        return None if self._spec is None else list(self._spec.dtypes)

    @property
    def shapes(self) -> list | None:
        return None if self._spec is None else list(self._spec.shapes)

    @property
    def names(self) -> list | None:
        if self._spec is None or self._spec.structure != "dict":
            return None
        return list(self._spec.names)

    def _spec_for(self, vals: Any, batched: bool) -> ElementSpec:
        spec = self._spec
        if spec is None:
            with self._lock:
                if self._spec is None:
                    self._spec = ElementSpec.infer(vals, batched=batched)
                    self._spec_known.set()
                spec = self._spec
        return spec

    def size(self) -> int:
        """Number of elements in the queue now."""
        with self._lock:
            return self._store_len()

    @property
    def num_enqueued(self) -> int:
        """Elements enqueued since the queue was built."""
        return self._num_enqueued

    def is_closed(self) -> bool:
        with self._lock:
            return self._closed

    # -- enqueue -------------------------------------------------------------------

    def enqueue(self, vals: Any, timeout: float | None = None) -> None:
        """Adds one element, blocking while the queue is full.

        Args:
            vals: a tensor, a tuple of tensors, or a dict (as declared).
            timeout: seconds to wait for room. Defaults to ``None`` (no bound).

        Raises:
            QueueClosedError: the queue is closed (or closed while waiting,
                with ``cancel_pending_enqueues=True``).
            QueueTimeoutError: no room within ``timeout``.
            ValueError: wrong structure, dtype or shape.
        """
        spec = self._spec_for(vals, batched=False)
        arrays = spec.convert(spec.flatten(vals), batched=False)
        self._put_rows([arrays], timeout)

    def enqueue_many(self, vals: Any, timeout: float | None = None) -> None:
        """Adds the elements of a batch (split along the first dimension).

        Elements go in as room appears, so a batch larger than ``capacity``
        is fine. On a timeout, ``QueueTimeoutError.num_enqueued`` tells how
        many leading elements went in.

        Example:
            >>> q = FIFOQueue(4, ["float32", "int64"], shapes=[[2], []])
            >>> q.enqueue_many((np.zeros((3, 2)), np.arange(3)))
            >>> q.size()
            3
        """
        spec = self._spec_for(vals, batched=True)
        comps = spec.convert(spec.flatten(vals), batched=True)
        n = comps[0].shape[0]
        if any(c.shape[0] != n for c in comps):
            raise ValueError(
                "All components of enqueue_many need the same leading dimension. "
                f"Received: {[c.shape[0] for c in comps]}."
            )
        self._put_rows([[c[i] for c in comps] for i in range(n)], timeout)

    def _fix_shapes(self, row: list) -> None:
        # Shapes left undeclared are fixed by the first element (lock held).
        if any(s is None for s in self._spec.shapes):
            self._spec = self._spec.with_shapes(
                [a.shape if s is None else s for s, a in zip(self._spec.shapes, row)]
            )

    def _put_rows(self, rows: list, timeout: float | None) -> None:
        try:
            self._put_rows_locked(rows, timeout)
        finally:
            if self._on_put is not None:
                self._on_put()  # outside the lock: the hook takes its own

    def _put_rows_locked(self, rows: list, timeout: float | None) -> None:
        deadline = None if timeout is None else time.monotonic() + timeout
        done = 0
        with self._lock:
            if self._closed:
                raise QueueClosedError(
                    f"Cannot enqueue into {self._name}: it is closed. Enqueue "
                    "before close(), or use a new queue."
                )
            if rows:
                # convert() checked the shapes outside the lock; check again
                # against shapes another thread may have fixed meanwhile.
                self._fix_shapes(rows[0])
                self._check_row_shapes(rows[0])
            while done < len(rows):
                free = self._capacity - self._store_len()
                if free > 0:
                    chunk = rows[done : done + free]
                    self._store_put(chunk)
                    done += len(chunk)
                    self._num_enqueued += len(chunk)
                    self._not_empty.notify_all()
                    continue
                if self._cancelled:
                    raise QueueClosedError(
                        f"Enqueue into {self._name} cancelled by "
                        f"close(cancel_pending_enqueues=True) after {done} of "
                        f"{len(rows)} elements."
                    )
                self._pending_enqueues += 1
                try:
                    waited = self._wait(self._not_full, deadline)
                finally:
                    self._pending_enqueues -= 1
                if not waited:
                    raise QueueTimeoutError(
                        f"Enqueue into {self._name} timed out: the queue stayed "
                        f"full ({self._capacity} elements) for {timeout} s; "
                        f"{done} of {len(rows)} elements went in. Received: "
                        f"timeout={timeout}. Dequeue faster, raise capacity or "
                        "the timeout.",
                        num_enqueued=done,
                    )

    def _check_row_shapes(self, row: list) -> None:
        for s, a, n in zip(self._spec.shapes, row, self._spec.names):
            if s is not None and (
                a.ndim != len(s) or any(d is not None and d != g for d, g in zip(s, a.shape))
            ):
                raise ValueError(
                    f"Component {n!r} has shape {list(a.shape)}, but the queue "
                    f"holds shape {list(s)}."
                )

    @staticmethod
    def _wait(cond: threading.Condition, deadline: float | None) -> bool:
        if deadline is None:
            cond.wait()
            return True
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return False
        cond.wait(remaining)
        return True

    # -- dequeue -------------------------------------------------------------------

    def dequeue(self, timeout: float | None = None) -> Any:
        """Removes and returns one element, blocking while none is available.

        Raises:
            QueueClosedError: the queue is closed and empty.
            QueueTimeoutError: nothing arrived within ``timeout``.
        """
        rows = self._take(1, allow_smaller=False, timeout=timeout)
        return self._spec.pack(rows[0])  # (the spec is set once rows exist)

    def dequeue_many(self, n: int, timeout: float | None = None) -> Any:
        """Removes ``n`` elements and returns them stacked along a new axis 0.

        Raises:
            QueueClosedError: the queue is closed with fewer than ``n``
                elements left (none are removed; use :meth:`dequeue_up_to`).
            QueueTimeoutError: ``n`` elements did not arrive within ``timeout``.
        """
        batch = self._stack(self._take(n, allow_smaller=False, timeout=timeout))
        return self._spec.pack(batch)

    def dequeue_up_to(self, n: int, timeout: float | None = None) -> Any:
        """Like :meth:`dequeue_many`, but returns what is left once closed.

        While the queue is open it waits for ``n`` elements; once closed it
        returns between 1 and ``n`` elements, and raises
        :class:`~tfdist.data.QueueClosedError` when none are left.
        """
        batch = self._stack(self._take(n, allow_smaller=True, timeout=timeout))
        return self._spec.pack(batch)

    def _take(
        self, n: int, allow_smaller: bool, timeout: float | None, up_to: int | None = None
    ) -> list:
        """Removes ``n`` rows (or, with ``up_to``, as many whole multiples of
        ``n`` as are available now, at most ``up_to``)."""
        if not isinstance(n, (int, np.integer)) or n < 1:
            raise ValueError(f"n must be a positive integer. Received: n={n!r}.")
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            while True:
                if self._abort_error is not None:
                    raise self._abort_error
                available = self._available()
                if available >= n:
                    k = n if up_to is None else max(n, min(available, up_to) // n * n)
                    rows = self._store_take(k)
                    self._not_full.notify_all()
                    return rows
                if self._closed:
                    left = self._store_len()
                    if allow_smaller and left > 0:
                        rows = self._store_take(min(n, left))
                        self._not_full.notify_all()
                        return rows
                    raise QueueClosedError(
                        f"{self._name} is closed and holds {left} element(s), "
                        f"fewer than the {n} requested."
                        + ("" if allow_smaller else " Use dequeue_up_to for the rest.")
                    )
                if not self._wait(self._not_empty, deadline):
                    raise QueueTimeoutError(
                        f"Dequeue of {n} element(s) from {self._name} timed out "
                        f"after {timeout} s ({self._store_len()} element(s) "
                        f"there, {self._available()} available). Received: "
                        f"timeout={timeout}. Start the producers (QueueRunner.start) "
                        "or raise the timeout."
                    )

    # -- close ---------------------------------------------------------------------

    def close(self, cancel_pending_enqueues: bool = False) -> None:
        """Closes the queue: no more enqueues; dequeues drain what is left.

        Args:
            cancel_pending_enqueues: also fail enqueues now blocked on a full
                queue. Defaults to ``False`` (they complete as room appears).
        """
        with self._lock:
            if not self._closed:
                logger.debug("closing %s (%d elements left)", self._name, self._store_len())
            self._closed = True
            self._cancelled = self._cancelled or cancel_pending_enqueues
            self._not_empty.notify_all()
            self._not_full.notify_all()

    def abort(self, error: BaseException) -> None:
        """Closes the queue and makes every dequeue raise ``error`` at once.

        Used by a :class:`~tfdist.data.Coordinator` when a producer fails, so
        that training stops on the error instead of draining the queue.
        """
        with self._lock:
            self._abort_error = error
        self.close(cancel_pending_enqueues=True)

    # -- tf.data -------------------------------------------------------------------

    def as_dataset(
        self,
        batch_size: int | None = None,
        *,
        drop_remainder: bool = False,
        timeout: float | None = None,
        prefetch: int | None = None,
    ):
        """Returns a ``tf.data.Dataset`` that dequeues from this queue.

        The dataset yields batches of ``batch_size`` (``dequeue_many``) or, with
        ``batch_size=None``, single elements. It ends cleanly when the queue is
        closed and drained; the last batch is smaller unless ``drop_remainder``.
        A producer's error (see :class:`~tfdist.data.Coordinator`) ends
        iteration with that error. Each iteration of the dataset continues
        where the queue is: elements are consumed, not replayed.

        Args:
            batch_size: elements per batch. Defaults to ``None`` (unbatched).
            drop_remainder: drop a final batch smaller than ``batch_size``
                (its elements are still removed). Defaults to ``False``.
            timeout: seconds to wait for one batch before raising
                :class:`~tfdist.data.QueueTimeoutError`. Defaults to ``None``:
                wait while the queue is open (a producer may be slow, e.g. an
                environment generating data).
            prefetch: ``Dataset.prefetch`` buffer to add. Defaults to ``None``
                (none; add your own, elements in it are already dequeued).

        Whole batches already in the queue are dequeued together (up to 4
        batches, or 256 elements unbatched) to save Python calls; like a
        prefetch buffer, they are then out of the queue. Under a strategy,
        Keras's ``fit``/``evaluate`` build the model from the element spec
        instead of reading (and losing) a batch; see
        :mod:`tfdist.data.symbolic_build`.

        Example:
            >>> q = FIFOQueue(100, ["float32", "int64"], shapes=[[4], []])
            >>> q.enqueue_many((np.ones((10, 4)), np.arange(10))); q.close()
            >>> [int(x.shape[0]) for x, y in q.as_dataset(batch_size=4)]
            [4, 4, 2]
        """
        from tfdist.data.dataset import dataset_from_blocks

        spec = self.wait_for_element_spec()
        n = 1 if batch_size is None else batch_size
        if not isinstance(n, (int, np.integer)) or n < 1:
            raise ConfigError(
                f"batch_size must be a positive integer or None. Received: batch_size={batch_size!r}."
            )

        # Whole batches that are already there are taken together: one Python
        # call per block instead of per batch (tf.data then splits the block).
        # A padding queue pads per dequeue, so it takes one batch (or element).
        if batch_size is None:
            up_to = 256 if self._block_batches > 1 else 1
        else:
            up_to = n * self._block_batches

        def make_blocks():
            while True:
                block = self._next_block(n, not drop_remainder, timeout, up_to, batch_size is None)
                if block is None:
                    return
                yield block

        return dataset_from_blocks(
            make_blocks,
            spec,
            batch_size=batch_size,
            drop_remainder=drop_remainder,
            prefetch=prefetch,
        )

    #: Most whole batches ``as_dataset`` takes in one go when they are available.
    _block_batches = 4

    def _next_block(
        self, n: int, allow_smaller: bool, timeout: float | None, up_to: int, unbatched: bool
    ):
        """A block of k batches as arrays shaped ``(k, n, ...)``; ``None`` at the end.

        ``unbatched``: a block of k elements, ``(k, ...)`` (then ``n == 1``).
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            # Wait in slices so that interpreter exit (which closes every
            # queue) or an abort is seen within a second.
            slice_s = 1.0 if deadline is None else max(0.0, min(1.0, deadline - time.monotonic()))
            try:
                rows = self._take(n, allow_smaller=allow_smaller, timeout=slice_s, up_to=up_to)
            except QueueClosedError:
                return None
            except QueueTimeoutError:
                if deadline is not None and time.monotonic() >= deadline:
                    raise QueueTimeoutError(
                        f"No batch of {n} from {self._name} within {timeout} s. "
                        f"Received: timeout={timeout}. Check that producers run "
                        "(QueueRunner.start) or raise the timeout."
                    ) from None
                continue
            if unbatched:
                return self._stack(rows)
            if len(rows) < n:  # the last, smaller batch
                return [a[None] for a in self._stack(rows)]
            return [a.reshape((len(rows) // n, n) + a.shape[1:]) for a in self._stack(rows)]

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(name={self._name!r}, capacity={self._capacity}, "
            f"size={self.size()}, closed={self.is_closed()})"
        )
