"""Keras callback: measure every iteration, exchange times across workers, detect stragglers.

A thin shell (STYLE habit 8) over :class:`tfdist.straggler.StragglerMonitor`
(exchange, detectors, participation, records) and :mod:`tfdist.collective`
(the worker group).
"""

from __future__ import annotations

import os
import time
from typing import Any, Callable

import keras

from tfdist.collective.errors import CollectiveError
from tfdist.collective import get_worker_group
from tfdist.straggler import (
    DynamicThresholdConfig,
    EwmaConfig,
    ExchangeFailure,
    StragglerEngine,
    StragglerEvent,
    StragglerListener,
    StragglerMonitor,
)
from tfdist.straggler.exchange import LocalTimingGroup

__all__ = ["StragglerDetector"]

_ON_FAILURE = ("report", "raise")
#: Attributes of the callback that live on its :class:`~tfdist.straggler.StragglerMonitor`.
_MONITOR_ATTRIBUTES = frozenset({
    "history", "events", "group", "engine", "threshold_detector", "ewma_detector", "threshold_config",
    "ewma_config", "exchange_every", "timeout_s", "log_path", "record_iterations", "warmup_iterations",
})


class StragglerDetector(keras.callbacks.Callback, StragglerListener):
    """Detects straggling workers during ``model.fit`` and tells whoever listens.

    On every worker the callback times each training iteration (its own
    compute: the time a tfdist strategy reports blocked on peers,
    ``last_step_wait_seconds``, is subtracted), gathers all workers' times
    with a TF collective (every call with a timeout) and feeds two pure
    detectors, so all workers reach the same verdicts: the dynamic threshold
    (``factor`` x mean fastest time of the first ``profile_iterations``
    iterations of each epoch, a counter bounded to ``[0, limit]``) and, with
    ``ewma``, persistent stragglers (EWMA of throughput / median below
    ``ewma_threshold``). The work is done by a framework-free
    :class:`~tfdist.straggler.StragglerMonitor`.

    Verdicts go to :attr:`history`, to the epoch logs (``straggler_threshold``,
    ``straggler_limit``, ``straggler_count``, ``straggler_detections``,
    ``straggler_recoveries``, ``straggler_counter_w{i}``,
    ``persistent_straggler_count``; put this callback before ``TensorBoard``),
    to an optional JSON-lines file, to the hooks :meth:`on_straggler_detected`
    / :meth:`on_straggler_recovered` (override them, pass callables, or
    :meth:`subscribe` a :class:`~tfdist.straggler.StragglerListener`), and to
    the strategy's ``straggler_engine`` (a :class:`~tfdist.straggler.StragglerEngine`,
    found through ``model.distribute_strategy``): the parameter-server
    strategies stop waiting for flagged workers (one worker tells the
    parameter servers), ``tfdist.AllReduceStrategy`` leaves them out of its
    all-reduce until the next epoch's profiling iterations (see
    docs/straggler_detection.md).

    In a multi-worker job call :func:`tfdist.collective.init_worker_group`
    at the top of the script on every training task. Every worker must run
    the same number of iterations per epoch.

    Example:

    ```python
    import tfdist.collective, tfdist.callbacks
    tfdist.collective.init_worker_group()          # first thing: before any TF op
    ...
    detector = tfdist.callbacks.StragglerDetector(profile_iterations=5, factor=2.0, limit=None)
    model.fit(ds, epochs=10, callbacks=[detector])
    detector.history.detections()                  # events with epoch, iteration, time
    ```

    Args:
        profile_iterations: ``n``, iterations at each epoch start that set the
            threshold. Defaults to 5.
        factor: ``k``, threshold = k x mean fastest time. Defaults to 2.0.
        limit: Counter value that makes a straggler. Defaults to ``None``:
            ``max(min_limit, ceil(limit_fraction x iterations per epoch))``.
        limit_fraction: Defaults to 0.025.
        min_limit: Defaults to 3.
        ewma: Also run the EWMA persistent-straggler detector. Defaults to ``True``.
        ewma_alpha: Defaults to 0.1.
        ewma_threshold: Defaults to 0.8.
        ewma_window: Iterations per EWMA window. Defaults to 10.
        group: The :class:`tfdist.collective.WorkerGroup` (or any object with
            ``size``, ``worker_id`` and ``all_gather(values, timeout_s)``).
            Defaults to the one set up by ``init_worker_group``, else a
            single-process group.
        timeout_s: Timeout of each exchange. Defaults to the group's (30 s).
        exchange_every: Iterations whose times travel in one collective.
            Every exchange is a barrier across the workers; under an
            asynchronous strategy a larger value lets fast workers run ahead
            between exchanges (verdicts then come in batches). Defaults to 1.
        on_failure: What a failed exchange (dead or hung peer) does:
            ``"report"`` records it in :attr:`history`, the log and the
            JSON-lines file, calls :meth:`on_exchange_failed`, and stops
            detecting while training goes on; ``"raise"`` does the same and
            then raises the :class:`tfdist.collective.CollectiveError` (ending
            ``fit``). Defaults to ``"report"``.
        log_path: JSON-lines file of every verdict (events, epoch summaries,
            failures). ``{worker}`` in the path is replaced by the worker id;
            without it only worker 0 writes. Defaults to ``None`` (no file).
        record_iterations: Keep every iteration's times and counters in
            :attr:`history`. Defaults to ``True``.
        warmup_iterations: Iterations at the start of each ``fit`` that are
            neither measured nor exchanged (they still count, as iterations
            no worker took part in): the first one traces and compiles the
            train step (often 100x a normal step) and would inflate the first
            epoch's threshold. Defaults to 1.
        on_straggler_detected: Callable ``hook(worker, info)``.
        on_straggler_recovered: Callable ``hook(worker, info)``.
        engine: The :class:`~tfdist.straggler.StragglerEngine` to drive.
            Defaults to ``model.distribute_strategy.straggler_engine`` if the
            strategy has one, else none.

    Attributes:
        history: :class:`tfdist.straggler.StragglerHistory`.
        monitor: The :class:`tfdist.straggler.StragglerMonitor` doing the work
            (``group``, ``engine``, the detectors and the settings read through).
    """

    def __init__(
        self,
        profile_iterations: int = 5,
        factor: float = 2.0,
        limit: int | None = None,
        limit_fraction: float = 0.025,
        min_limit: int = 3,
        ewma: bool = True,
        ewma_alpha: float = 0.1,
        ewma_threshold: float = 0.8,
        ewma_window: int = 10,
        group: Any = None,
        timeout_s: float | None = None,
        exchange_every: int = 1,
        on_failure: str = "report",
        log_path: str | os.PathLike | None = None,
        record_iterations: bool = True,
        warmup_iterations: int = 1,
        on_straggler_detected: Callable[[int, StragglerEvent], None] | None = None,
        on_straggler_recovered: Callable[[int, StragglerEvent], None] | None = None,
        engine: StragglerEngine | None = None,
    ):
        super().__init__()
        threshold_config = DynamicThresholdConfig(profile_iterations=profile_iterations, factor=factor, limit=limit,
                                                  limit_fraction=limit_fraction, min_limit=min_limit)
        ewma_config = EwmaConfig(alpha=ewma_alpha, threshold=ewma_threshold, window=ewma_window) if ewma else None
        if on_failure not in _ON_FAILURE:
            raise ValueError(f"`on_failure` must be one of {list(_ON_FAILURE)}. Received: on_failure={on_failure!r}.")
        self.on_failure = on_failure
        self.monitor = StragglerMonitor(
            threshold_config, ewma_config, exchange_every=exchange_every, timeout_s=timeout_s,
            log_path=None if log_path is None else os.fspath(log_path), record_iterations=record_iterations,
            warmup_iterations=warmup_iterations, error_class=CollectiveError,
            on_failed=lambda failure: self.on_exchange_failed(failure), raise_on_failure=on_failure == "raise",
        )
        self.monitor.events.subscribe(self)  # the overridable hooks below
        if on_straggler_detected is not None or on_straggler_recovered is not None:
            self.monitor.events.subscribe(on_detected=on_straggler_detected, on_recovered=on_straggler_recovered)
        self._group_arg, self._engine_arg = group, engine
        self._t0: float | None = None

    def __getattr__(self, name: str):  # the settings and state the monitor holds, read through
        if name in _MONITOR_ATTRIBUTES and "monitor" in self.__dict__:
            return getattr(self.monitor, name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    # ------------------------------------------------------------ public API
    def subscribe(self, listener: StragglerListener | None = None, **hooks) -> StragglerListener:
        """Adds a listener or ``on_detected=`` / ``on_recovered=`` callables."""
        return self.monitor.events.subscribe(listener, **hooks)

    def on_straggler_detected(self, worker: int, info: StragglerEvent) -> None:
        """Called on every worker when ``worker`` becomes a straggler. Override to act."""

    def on_straggler_recovered(self, worker: int, info: StragglerEvent) -> None:
        """Called on every worker when straggler ``worker`` is normal again. Override to act."""

    def on_exchange_failed(self, failure: ExchangeFailure) -> None:
        """Called when the timing exchange failed (a peer died or hung). Override to act."""

    @property
    def stragglers(self) -> frozenset[int]:
        """Workers the dynamic-threshold rule classifies as stragglers now (same on every worker)."""
        return self.monitor.stragglers

    @property
    def persistent_stragglers(self) -> frozenset[int]:
        """Workers the EWMA rule classifies as persistent stragglers now."""
        return self.monitor.persistent_stragglers

    def excluded(self) -> frozenset[int]:
        """Workers a strategy may leave out of the next iteration (stragglers, except in an epoch's profiling
        iterations, when everyone takes part so recovery is seen)."""
        return self.monitor.excluded()

    @property
    def members(self) -> frozenset[int]:
        """Workers taking part in the current iteration (all of them unless an engine leaves some out).

        On a worker that is out, the others it lists may be out of date; it
        learns the true members when it is re-admitted."""
        return self.monitor.members

    @property
    def active(self) -> bool:
        """Whether detection is running (``False`` after a failed exchange)."""
        return self.monitor.active

    # ------------------------------------------------------------ Keras hooks
    def on_train_begin(self, logs=None):
        strategy = getattr(self.model, "distribute_strategy", None) if self.model is not None else None
        engine = self._engine_arg if self._engine_arg is not None else getattr(strategy, "straggler_engine", None)
        group = self._group_arg if self._group_arg is not None else get_worker_group(required_by="StragglerDetector")
        self.monitor.start(group if group is not None else LocalTimingGroup(), engine)

    def on_epoch_begin(self, epoch, logs=None):
        self.monitor.start_epoch(epoch, (self.params or {}).get("steps"))

    def on_train_batch_begin(self, batch, logs=None):
        self.monitor.begin_iteration()
        self._t0 = time.perf_counter()

    def on_train_batch_end(self, batch, logs=None):
        if self._t0 is None:
            return
        # Time the worker's own work, not the wait for others (sync strategies make every worker as slow as the
        # slowest otherwise): tfdist strategies report how long the step was blocked on the exchange.
        blocked = getattr(getattr(self.model, "distribute_strategy", None), "last_step_wait_seconds", 0.0)
        self.monitor.end_iteration(time.perf_counter() - self._t0 - float(blocked or 0.0))
        self._t0 = None

    def on_epoch_end(self, epoch, logs=None):
        entries = self.monitor.end_epoch()
        if logs is not None:
            logs.update(entries)

    def on_train_end(self, logs=None):
        self.monitor.close()
