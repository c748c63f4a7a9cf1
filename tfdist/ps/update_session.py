"""The update path's session (ASP, SSP, DTSSP): SSP clocks, pushes of updates, the overlapped exchange.

The worker side's slice of the update path in numpy, between the runtime
(:mod:`tfdist.strategies._update_path`) and the store's handlers
(:mod:`tfdist.ps._update_requests`). Updates of large variables that changed
few rows travel row-sparse (``session._row_sparse``).
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import functools
import logging
import math
import time
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np

from tfdist.consistency.ssp import cache_is_fresh_enough
from tfdist.errors import PSRejectedError
from tfdist.ps.session import AUDIT_STEPS, WorkerSession
from tfdist.wire import ALIGNMENT, aligned_empty

logger = logging.getLogger(__name__)

__all__ = ["Corrections", "FlatLayout", "UpdateSession", "relative_update"]


def relative_update(deltas: Mapping[str, np.ndarray], values: Mapping[str, np.ndarray], keys) -> float:
    """How large an update is against the values it changes: the largest ``|delta| / |value|`` (L2) of ``keys``.

    Only the keys in both mappings count (a key's norm over its whole
    array). A variable whose values are all zero counts as changed without
    bound when its delta is not zero. 0 when no key counts.

    >>> relative_update({"w": np.full(4, 0.01)}, {"w": np.ones(4)}, {"w"})
    0.01
    """
    largest = 0.0
    for key in keys:
        delta, value = deltas.get(key), values.get(key)
        if delta is None or value is None:
            continue
        d = np.asarray(delta).ravel()
        v = np.asarray(value).ravel()
        d2, v2 = float(np.vdot(d, d)), float(np.vdot(v, v))
        if d2 > 0:
            largest = max(largest, math.sqrt(d2 / v2) if v2 > 0 else math.inf)
    return largest


@dataclasses.dataclass(frozen=True)
class FlatLayout:
    """Where each variable's correction lies in one flat buffer (the end of a step built to fold in its graph).

    Every slot starts at a multiple of :data:`~tfdist.wire.ALIGNMENT` bytes,
    so the step's graph can slice it without a copy. Built by the runtime
    when it traces a training step (one dtype, fully known shapes); the
    session writes an overlapped exchange's corrections straight into such a
    buffer (:class:`Corrections`), and the step hands it to its graph as one
    tensor instead of one per variable.
    """

    keys: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]
    dtype: np.dtype

    @functools.cached_property
    def slots(self) -> tuple[tuple[int, int], ...]:
        """``(start, size)`` in elements, per key."""
        slots, start, step = [], 0, max(1, ALIGNMENT // self.dtype.itemsize)
        for shape in self.shapes:
            size = math.prod(shape)
            slots.append((start, size))
            start += -(-size // step) * step
        return tuple(slots)

    @functools.cached_property
    def size(self) -> int:
        start, size = self.slots[-1] if self.keys else (0, 0)
        return start + size

    @functools.cached_property
    def _shape_of(self) -> dict[str, tuple[int, ...]]:
        return dict(zip(self.keys, self.shapes))

    def fits(self, key: str, array: np.ndarray) -> bool:
        """Whether ``array`` can be ``key``'s correction in this layout (its dtype and shape)."""
        return array.dtype == self.dtype and array.shape == self._shape_of.get(key)

    def views(self, flat: np.ndarray) -> dict[str, np.ndarray]:
        """Each key's slot of ``flat`` (a buffer of :attr:`size` elements), shaped as the key's array."""
        return {key: flat[start:start + size].reshape(shape)
                for key, shape, (start, size) in zip(self.keys, self.shapes, self.slots)}

    def pack(self, corrections: Mapping[str, np.ndarray], into: np.ndarray | None = None) -> np.ndarray:
        """One aligned buffer: each key's correction in its slot, zeros where a key has none."""
        flat = into if into is not None else aligned_empty((self.size,), self.dtype)
        for key, view in self.views(flat).items():
            value = corrections.get(key)
            if value is None:
                view[...] = 0
            elif not np.may_share_memory(view, value):
                view[...] = value
        return flat


class Corrections(dict):
    """An overlapped exchange's corrections (variable key → array), also packed in ``flat`` when it has one.

    ``flat`` (laid out as ``layout``) holds the same arrays: the corrections
    of the keys in the layout are views into it, the other slots are zero.
    """

    def __init__(self, values, flat: np.ndarray | None = None, layout: FlatLayout | None = None):
        super().__init__(values)
        self.flat, self.layout = flat, layout


class UpdateSession(WorkerSession):
    """The update path with SSP clocks: ASP, SSP(s) and DTSSP.

    ``clock`` counts completed steps, which is also the (0-based) index of
    the step about to start. Before step ``clock`` starts, :meth:`begin`
    refreshes the cache only if the SSP read guarantee needs it
    (the PS then makes the read wait while this worker is more than ``s``
    clocks ahead of the slowest live worker); :meth:`end` pushes the step's
    update. ASP (``refresh_every_step``) pulls with every push instead.

    ASP may also overlap the exchange with the next step
    (:meth:`end_overlapped`): the step's update goes out in the background
    and the next step starts on the local values; when the reply arrives the
    local variables become ``fresh + (local_now - local_at_send)``, so every
    local update is pushed exactly once and none is lost.
    """

    def __init__(self, *args, staleness: float = float("inf"), refresh_every_step: bool = True, **kwargs):
        super().__init__(*args, **kwargs)
        self.state.staleness = staleness
        self.refresh_every_step = refresh_every_step
        self.push_pull = math.isinf(staleness)
        self._exchange: Future | None = None
        #: Set by the runtime: overlapped exchanges write corrections into one buffer laid out so (or None).
        self.flat_layout: FlatLayout | None = None
        self._exchange_thread: ThreadPoolExecutor | None = None
        #: Set by ``exchange_every: auto``: the variables whose update size each push measures (or None).
        self.update_size_keys: frozenset[str] | None = None
        #: The last push's update, relative to the values it was taken from (see :func:`relative_update`).
        self.last_update_size: float | None = None
        self.stats.update({"refreshes": 0, "waits": 0, "wait_seconds": 0.0, "overlap_wait_seconds": 0.0,
                           "exchange_cpu_seconds": 0.0, "server_cpu_seconds": 0.0})
        #: ``(clock started, min clock the cache is guaranteed to include)`` per step, for audits:
        #: the last :data:`AUDIT_STEPS` steps (bounded, so a long job does not grow it forever).
        self.starts: collections.deque[tuple[int, int]] = collections.deque(maxlen=AUDIT_STEPS)

    def _note(self, replies) -> None:
        super()._note(replies)
        ordered = [replies[i] for i in range(self.plan.num_ps)]
        # what serving this worker's exchanges cost the PS tasks (stream connections report it): see Adaptive
        self.stats["server_cpu_seconds"] += sum(getattr(r, "server_cpu_s", None) or 0.0 for r in ordered)
        mins = [r.min_clock for r in ordered if r.min_clock is not None]
        if mins:
            self.state.min_clock = min(mins)
        clocks = [r.clock for r in ordered if getattr(r, "clock", None) is not None]
        if clocks and max(clocks) > self.state.clock:  # joined a running job: adopt the clock the PS gave us
            logger.info("worker %d starts at clock %d (adopted on join)", self.worker_id, max(clocks))
            self.state.clock = max(clocks)
            self.state.cache_min_clock = max(self.state.cache_min_clock, self.state.min_clock)
        clocked = [r for r in ordered if r.global_step is not None]  # replies that carry the clock information
        if clocked and len(clocked) == len(ordered):  # DTSSP moves the bound; every PS task runs the same rule
            bounds = [r.staleness for r in clocked]
            self.state.staleness = float("inf") if None in bounds else min(bounds)

    def needs_refresh(self) -> bool:
        """Whether starting step ``clock`` requires a fresher cache."""
        return not cache_is_fresh_enough(self.state.clock, self.state.cache_min_clock, self.state.staleness)

    def begin(self) -> dict[str, np.ndarray] | None:
        """Makes the cache fit to start step ``clock``; returns new values or None."""
        if self.refresh_every_step or not self.needs_refresh():
            self.starts.append((self.state.clock, self.state.cache_min_clock))
            return None
        start = time.perf_counter()
        values = self.pull(clock=self.state.clock)
        waited = time.perf_counter() - start
        self.state.cache_min_clock = self.state.min_clock
        self.starts.append((self.state.clock, self.state.cache_min_clock))
        self.stats["refreshes"] += 1
        if waited > 0.05:
            self.stats["waits"] += 1
        self.stats["wait_seconds"] += waited
        return values

    def end(self, current: Mapping[str, np.ndarray], loss: float | None = None, steps: int = 1
            ) -> dict[str, np.ndarray] | None:
        """Pushes the step's update (``steps`` local steps summed); returns fresh values when it also pulled."""
        self.flush()  # an overlapped exchange in flight: its fresh values come back with this pull
        with self._counting_exchange_cpu():
            values = self._push(current, loss, pull=self.refresh_every_step, steps=steps)
        if values is not None:
            self.state.cache_min_clock = self.state.min_clock
            self.stats["refreshes"] += 1
        return values

    # ------------------------------------------------ overlapped exchange (ASP)
    def end_overlapped(self, current: Mapping[str, np.ndarray], loss: float | None = None, steps: int = 1
                       ) -> dict[str, np.ndarray] | None:
        """ASP without waiting: sends this step's update in the background.

        Waits only for the *previous* step's exchange, if it is still in
        flight, then starts this step's (push the update, pull fresh values)
        and returns at once.

        The update pushed is ``current - base``: ``base`` is what the PS holds
        after this worker's previous update if nothing else landed, i.e. the
        local values as they were at the previous send, plus the correction
        returned now. Every local change is therefore pushed exactly once.

        Returns:
            Corrections to *add* to the local variables now (variable key →
            array): ``fresh - base`` for every variable on which another
            worker's update arrived. ``None`` when there is none.
        """
        if not self.refresh_every_step:
            raise PSRejectedError("end_overlapped() is for ASP (refresh_every_step); SSP/DTSSP use end().")
        if not self._snapshot:
            raise PSRejectedError("push before initialize(): the worker has no snapshot to diff against.")
        start = time.perf_counter()
        with self._counting_exchange_cpu(client_threads=False):  # (the exchange in flight counts its own calls)
            corrections = self._finish_exchange()
            base = self._base if self._base is not None else self._snapshot
            deltas = {k: np.subtract(np.asarray(current[k]), base[k]) for k in self._snapshot}
            self._measure_update(deltas, current)
            self.state.clock += 1
            args = (deltas, loss, self.state.clock, self._snapshot, list(self.state.versions), steps)
            try:
                if self._exchange_thread is None:
                    self._exchange_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tfdist-exchange")
                self._exchange = self._exchange_thread.submit(self._exchange_in_background, *args)
            except RuntimeError:  # the interpreter is ending (no new futures): exchange in this thread
                self._exchange = Future()
                try:
                    self._exchange.set_result(self._exchange_in_background(*args))
                except BaseException as e:  # read by _finish_exchange, as a failed background exchange would be
                    self._exchange.set_exception(e)
        self.stats["syncs"] += 1
        self.stats["sync_seconds"] += time.perf_counter() - start
        return corrections

    def _measure_update(self, deltas: Mapping[str, np.ndarray], current: Mapping[str, np.ndarray]) -> None:
        """Records :attr:`last_update_size` of an update about to be pushed (when ``update_size_keys`` asks)."""
        if self.update_size_keys is not None:
            self.last_update_size = relative_update(deltas, current, self.update_size_keys)

    @contextlib.contextmanager
    def _counting_exchange_cpu(self, client_threads: bool = True):
        """Adds this thread's CPU inside the block (and the client threads' calls) to ``exchange_cpu_seconds``."""
        cpu, pool_cpu = time.thread_time(), self.client.pool_cpu_seconds
        try:
            yield
        finally:
            spent = time.thread_time() - cpu
            if client_threads:
                spent += self.client.pool_cpu_seconds - pool_cpu
            self.stats["exchange_cpu_seconds"] += spent

    def flush(self) -> dict[str, np.ndarray] | None:
        """Waits for an overlapped exchange still in flight; returns its corrections (or None).

        The next update is still taken against what the PS holds without them
        (the caller loads fresh values next, or drops them): see :meth:`land`.
        """
        return self._finish_exchange()

    def land(self) -> dict[str, np.ndarray] | None:
        """Waits for an overlapped exchange still in flight; returns its corrections, which the caller *adds*.

        The next update is taken against the values the PS returned (the
        corrections included), so the caller must add the corrections to its
        local values now: they are not pushed back as this worker's own.
        """
        corrections = self._finish_exchange()
        if corrections:
            self._base = None  # base = snapshot: the PS's values, which the corrections bring the local ones to
        return corrections

    def _finish_exchange(self) -> dict[str, np.ndarray] | None:
        if self._exchange is None:
            return None
        exchange, self._exchange = self._exchange, None
        start = time.perf_counter()
        try:
            result = exchange.result()
        finally:
            self.stats["overlap_wait_seconds"] += time.perf_counter() - start
        self._snapshot, self._base, self.state.versions = result.snapshot, result.base, result.version
        self._note(result.replies)
        self.state.cache_min_clock = self.state.min_clock
        self.stats["refreshes"] += 1
        return result.corrections

    def _exchange_in_background(self, deltas, loss, clock, snapshot, version, steps: int = 1) -> _Exchange:
        """One PushPull per PS task; computes the new snapshot and the corrections (no session state touched).

        Its thread's CPU (and the client threads' calls) count in ``stats["exchange_cpu_seconds"]``.
        """
        with self._counting_exchange_cpu():
            return self._exchange_once(deltas, loss, clock, snapshot, version, steps)

    def _exchange_once(self, deltas, loss, clock, snapshot, version, steps: int) -> _Exchange:
        # What every PS task holds after this update if no other update landed:
        # the same float additions the PS makes.
        expected = {k: np.add(snapshot[k], d) for k, d in deltas.items()}
        parts = self._split(deltas)
        replies = self._request_many(self._push_requests(parts, clock, loss, True, steps, version))
        shards, expected_parts, changed = {}, None, set()
        for ps, reply in replies.items():
            tensors = reply.values
            if reply.unchanged:
                if expected_parts is None:
                    expected_parts = self._split(expected)
                shards[ps] = expected_parts[ps]
                self.stats["unchanged_replies"] += 1
            else:
                shards[ps] = tensors
                changed.add(ps)
                self.stats["bytes_pulled"] += sum(v.nbytes for v in tensors.values())
        fresh = self._join(shards) if changed else expected
        corrections, new_snapshot = {}, {}
        layout = self.flat_layout
        flat, slots = None, {}
        if changed and layout is not None and all(k in expected and layout.fits(k, expected[k]) for k in layout.keys):
            flat = aligned_empty((layout.size,), layout.dtype)
            slots = layout.views(flat)
        for key in deltas:
            if changed and any(sh.ps in changed for sh in self.plan.shards_of(key)):
                new_snapshot[key] = fresh[key]
                # Aligned: the training thread adds it to the variable without a copy (VariableRegistry.add),
                # or the step's graph does (from the flat buffer, one tensor for every variable).
                out = slots.get(key)
                if out is None:
                    out = aligned_empty(expected[key].shape, expected[key].dtype)
                corrections[key] = np.subtract(fresh[key], expected[key], out=out)
            else:
                new_snapshot[key] = expected[key]
        if flat is not None and corrections:
            layout.pack(corrections, into=flat)  # (zeros the slots of the keys that got none)
        return _Exchange(
            snapshot=new_snapshot, base=expected,
            corrections=Corrections(corrections, flat, layout) if corrections else None,
            version=[replies[i].version for i in range(self.plan.num_ps)], replies=replies,
        )

    def pull(self, clock: int | None = None, min_state_step: int | None = None, as_reader: bool = False
             ) -> dict[str, np.ndarray]:
        self.flush()  # the update in flight first; the pulled values replace the local ones anyway
        return super().pull(clock=clock, min_state_step=min_state_step, as_reader=as_reader)

    def recover(self, cause: Exception, local_values: Mapping[str, np.ndarray] | None = None,
                as_reader: bool = False) -> dict[str, np.ndarray]:
        self._exchange = None  # an overlapped exchange in flight is lost with the task
        values = super().recover(cause, local_values, as_reader)
        self.state.cache_min_clock = self.state.min_clock
        return values

    def close(self, done: bool = True) -> None:
        try:
            self.flush()  # the last update must land before this worker says it is done
        except Exception as e:
            logger.warning("worker %d: the last update in flight failed: %s", self.worker_id, e)
        finally:
            if self._exchange_thread is not None:
                self._exchange_thread.shutdown(wait=False)
        super().close(done=done)


@dataclasses.dataclass
class _Exchange:
    """Outcome of one overlapped exchange, applied by the training thread."""

    snapshot: dict[str, np.ndarray]
    base: dict[str, np.ndarray]
    corrections: Corrections | None
    version: list[int]
    replies: dict
