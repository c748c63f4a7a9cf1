"""Keras callback: measure every iteration, exchange times across workers, detect stragglers.

A thin shell (STYLE habit 8) over :mod:`tfdist.straggler` (the rules) and
:mod:`tfdist.collective` (the exchange).
"""

from __future__ import annotations

import logging
import math
import os
import pickle
import time
from typing import Any, Callable

import keras
import numpy as np

from tfdist import constants
from tfdist.collective.errors import CollectiveError, CollectiveSetupError
from tfdist.straggler import (
    DynamicThresholdConfig,
    DynamicThresholdDetector,
    EventDispatcher,
    EwmaConfig,
    EwmaDetector,
    ExchangeFailure,
    StragglerEvent,
    StragglerHistory,
    StragglerListener,
)
from tfdist.straggler.membership import Participation, ParticipationEngine, plan_members
from tfdist.straggler.verdicts import json_ready
from tfdist.callbacks.verdict_log import JsonLinesLog

__all__ = ["StragglerDetector"]

logger = logging.getLogger(__name__)

_ON_FAILURE = ("report", "raise")


class _LocalGroup:
    """The group of a single process: collectives return the input."""

    size = 1
    worker_id = 0

    def all_gather(self, values, timeout_s=None):
        return np.asarray(values, dtype=np.float64)[None, :]


class StragglerDetector(keras.callbacks.Callback, StragglerListener):
    """Detects straggling workers during ``model.fit`` and tells whoever listens.

    On every worker the callback measures each training iteration (from
    ``on_train_batch_begin`` to ``on_train_batch_end``: the step, gradient
    exchange included), gathers all workers' times with a TF collective
    (every call with a timeout), and feeds them to two pure detectors, so all
    workers reach the same verdicts:

    * :class:`~tfdist.straggler.DynamicThresholdDetector` — per epoch,
      threshold = ``factor`` x mean fastest time of the first
      ``profile_iterations`` iterations; a counter per worker bounded to
      ``[0, limit]``; a straggler at ``limit``.
    * :class:`~tfdist.straggler.EwmaDetector` (``ewma=True``) — persistent
      stragglers: EWMA of throughput / median throughput below
      ``ewma_threshold``.

    Verdicts go to :attr:`history`, to the epoch logs (so ``History``,
    ``TensorBoard`` and the progress bar get them; put this callback before
    ``TensorBoard`` in the list), to an optional JSON-lines file, and to the
    hooks :meth:`on_straggler_detected` / :meth:`on_straggler_recovered`
    (override them, pass callables, or :meth:`subscribe` a
    :class:`~tfdist.straggler.StragglerListener`, e.g. a strategy).

    Epoch log keys: ``straggler_threshold`` (seconds), ``straggler_limit``,
    ``straggler_count``, ``straggler_detections``, ``straggler_recoveries``,
    ``straggler_counter_w{i}`` per worker and, with ``ewma``,
    ``persistent_straggler_count``.

    **Partial all-reduce.** Under a strategy that offers a
    :class:`~tfdist.straggler.ParticipationEngine` as ``straggler_engine``
    (``tfdist.AllReduceStrategy``), the callback also decides, at every
    iteration boundary and identically on every worker, who takes part in the
    next iteration (:func:`~tfdist.straggler.plan_members`): stragglers are
    left out, and everybody takes part again in the first
    ``profile_iterations`` of each epoch. Times are then exchanged among the
    members only, so nobody waits for a worker that is out; a re-admitted
    worker first receives the detectors' state and (from the engine) the
    training state of the lowest-id member. Each worker's time is its own
    compute: the time it waited for peers in the engine's all-reduce is
    subtracted.

    In a multi-worker job call :func:`tfdist.collective.init_worker_group`
    at the top of the script on every training task. Every worker must run
    the same number of iterations per epoch (one collective per
    ``exchange_every`` iterations and one at each epoch end).

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
        engine: The :class:`~tfdist.straggler.ParticipationEngine` to drive.
            Defaults to ``model.distribute_strategy.straggler_engine`` if the
            strategy has one, else none.

    Attributes:
        history: :class:`tfdist.straggler.StragglerHistory`.
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
        engine: ParticipationEngine | None = None,
    ):
        super().__init__()
        self.threshold_config = DynamicThresholdConfig(
            profile_iterations=profile_iterations, factor=factor, limit=limit,
            limit_fraction=limit_fraction, min_limit=min_limit,
        )
        self.ewma_config = EwmaConfig(alpha=ewma_alpha, threshold=ewma_threshold, window=ewma_window) if ewma else None
        if isinstance(exchange_every, bool) or not isinstance(exchange_every, int) or exchange_every < 1:
            raise ValueError(f"`exchange_every` must be an integer >= 1. Received: exchange_every={exchange_every!r}.")
        if on_failure not in _ON_FAILURE:
            raise ValueError(f"`on_failure` must be one of {list(_ON_FAILURE)}. Received: on_failure={on_failure!r}.")
        if timeout_s is not None and (isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or timeout_s <= 0):
            raise ValueError(f"`timeout_s` must be a positive number of seconds. Received: timeout_s={timeout_s!r}.")
        if isinstance(warmup_iterations, bool) or not isinstance(warmup_iterations, int) or warmup_iterations < 0:
            raise ValueError(
                f"`warmup_iterations` must be an integer >= 0. Received: warmup_iterations={warmup_iterations!r}."
            )
        self.warmup_iterations = warmup_iterations
        self.exchange_every = exchange_every
        self.on_failure = on_failure
        self.timeout_s = timeout_s
        self.log_path = None if log_path is None else os.fspath(log_path)
        self.record_iterations = record_iterations
        self.history = StragglerHistory()
        self.events = EventDispatcher()
        self.events.subscribe(self)  # the overridable hooks below
        if on_straggler_detected is not None or on_straggler_recovered is not None:
            self.events.subscribe(on_detected=on_straggler_detected, on_recovered=on_straggler_recovered)
        self._group_arg = group
        self.group = None
        self.threshold_detector: DynamicThresholdDetector | None = None
        self.ewma_detector: EwmaDetector | None = None
        self._log: JsonLinesLog | None = None
        self._pending: list[float] = []
        self._t0: float | None = None
        self._epoch = 0
        self._disabled = False
        self._warmup_left = warmup_iterations
        self._engine_arg = engine
        self.engine: ParticipationEngine | None = None
        self._members: frozenset[int] = frozenset()

    # ------------------------------------------------------------ public API
    def subscribe(self, listener: StragglerListener | None = None, **hooks) -> StragglerListener:
        """Adds a listener (e.g. a strategy) or ``on_detected=`` / ``on_recovered=`` callables."""
        return self.events.subscribe(listener, **hooks)

    def on_straggler_detected(self, worker: int, info: StragglerEvent) -> None:
        """Called on every worker when ``worker`` becomes a straggler. Override to act."""

    def on_straggler_recovered(self, worker: int, info: StragglerEvent) -> None:
        """Called on every worker when straggler ``worker`` is normal again. Override to act."""

    def on_exchange_failed(self, failure: ExchangeFailure) -> None:
        """Called when the timing exchange failed (a peer died or hung). Override to act."""

    @property
    def stragglers(self) -> frozenset[int]:
        """Workers the dynamic-threshold rule classifies as stragglers now (same on every worker)."""
        return self.threshold_detector.stragglers if self.threshold_detector else frozenset()

    @property
    def persistent_stragglers(self) -> frozenset[int]:
        """Workers the EWMA rule classifies as persistent stragglers now."""
        return self.ewma_detector.stragglers if self.ewma_detector else frozenset()

    def excluded(self) -> frozenset[int]:
        """Workers a strategy may leave out of the next iteration (stragglers, except during the
        first ``profile_iterations`` of an epoch, when everyone takes part so recovery is seen)."""
        return self.threshold_detector.excluded() if self.threshold_detector and self.active else frozenset()

    @property
    def members(self) -> frozenset[int]:
        """Workers taking part in the current iteration (all of them unless an engine leaves some out).

        On a worker that is out, the others it lists may be out of date; it
        learns the true members when it is re-admitted."""
        return self._members

    @property
    def active(self) -> bool:
        """Whether detection is running (``False`` after a failed exchange)."""
        return not self._disabled

    # ------------------------------------------------------------ Keras hooks
    def on_train_begin(self, logs=None):
        self.group = self._resolve_group()
        n = self.group.size
        self.threshold_detector = DynamicThresholdDetector(n, self.threshold_config)
        self.ewma_detector = EwmaDetector(n, self.ewma_config) if self.ewma_config else None
        self._disabled = False
        self._pending = []
        self._warmup_left = self.warmup_iterations
        self._members = frozenset(range(n))
        self.engine = self._resolve_engine()
        if self._excluding and self.exchange_every != 1:
            raise ValueError(
                "A strategy that leaves stragglers out needs the times of every iteration to decide the next "
                f"one's members. Received: exchange_every={self.exchange_every}. Use exchange_every=1."
            )
        if self.log_path and self._log is None:
            if "{worker}" in self.log_path:
                self._log = JsonLinesLog(self.log_path.format(worker=self.group.worker_id))
            elif self.group.worker_id == 0:
                self._log = JsonLinesLog(self.log_path)
        self._write({
            "type": "config", "time": time.time(), "worker": self.group.worker_id, "num_workers": n,
            "dynamic_threshold": self.threshold_config.to_dict(),
            "ewma": self.ewma_config.to_dict() if self.ewma_config else None,
            "exchange_every": self.exchange_every, "timeout_s": self._timeout(),
            "warmup_iterations": self.warmup_iterations,
        })
        logger.info(
            "StragglerDetector on worker %d of %d: %s, ewma=%s, exchange_every=%d, timeout_s=%s, log=%s",
            self.group.worker_id, n, self.threshold_config, self.ewma_config, self.exchange_every,
            self._timeout(), self.log_path,
        )

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = int(epoch)
        self._pending = []
        steps = (self.params or {}).get("steps")
        if self.threshold_detector is not None:
            self.threshold_detector.start_epoch(self._epoch, iterations=steps)
        if self.ewma_detector is not None:
            self.ewma_detector.start_epoch(self._epoch)

    def on_train_batch_begin(self, batch, logs=None):
        if self._excluding and not self._disabled:
            self._begin_participation()
        self._t0 = time.perf_counter()

    def on_train_batch_end(self, batch, logs=None):
        if self._t0 is None:
            return
        elapsed = time.perf_counter() - self._t0
        # Time the worker's own work, not the wait for others (sync strategies
        # make every worker as slow as the slowest otherwise): tfdist
        # strategies report how long the step was blocked on the exchange.
        blocked = getattr(getattr(self.model, "distribute_strategy", None), "last_step_wait_seconds", 0.0)
        self._pending.append(max(elapsed - float(blocked or 0.0), 0.0))
        self._t0 = None
        if self._warmup_left > 0:  # the same iterations on every worker: nothing to exchange
            self._warmup_left -= 1
            self._pending.pop()
            if not self._disabled:  # counted (steps stay Keras iterations), observed as "nobody took part"
                self._observe([None] * self.group.size, time.time())
            return
        if self.group.worker_id not in self._members:  # left out: nothing computed, nothing to exchange
            self._pending = []
            if not self._disabled:
                self._observe([None] * self.group.size, time.time())
            return
        if len(self._pending) >= self.exchange_every:
            self._exchange()

    def on_epoch_end(self, epoch, logs=None):
        if self._pending:
            self._exchange()
        det = self.threshold_detector
        if det is None:
            return
        summary = det.end_epoch()
        self.history.epochs.append(summary)
        record = {"type": "epoch", "time": time.time(), **summary.to_dict(), "active": self.active}
        if self.ewma_detector is not None:
            record["ewma"] = list(self.ewma_detector.ewma)
            record["persistent_stragglers"] = sorted(self.ewma_detector.stragglers)
        self._write(record)
        if logs is not None:
            logs["straggler_threshold"] = float("nan") if summary.threshold is None else summary.threshold
            logs["straggler_limit"] = summary.limit
            logs["straggler_count"] = len(summary.stragglers)
            logs["straggler_detections"] = summary.detections
            logs["straggler_recoveries"] = summary.recoveries
            for w, c in enumerate(summary.counters):
                logs[f"straggler_counter_w{w}"] = c
            if self.ewma_detector is not None:
                logs["persistent_straggler_count"] = len(self.ewma_detector.stragglers)

    def on_train_end(self, logs=None):
        if self._log is not None:
            self._log.close()
            self._log = None

    # -------------------------------------------------------------- internals
    def _timeout(self) -> float | None:
        return self.timeout_s if self.timeout_s is not None else getattr(self.group, "timeout_s", None)

    @property
    def _excluding(self) -> bool:
        return bool(self.engine is not None and self.engine.exclude_stragglers and self.group is not None
                    and self.group.size > 1)

    def _resolve_engine(self) -> ParticipationEngine | None:
        if self._engine_arg is not None:
            return self._engine_arg
        strategy = getattr(self.model, "distribute_strategy", None) if self.model is not None else None
        return getattr(strategy, "straggler_engine", None)

    def _begin_participation(self) -> None:
        """Decides the members of the coming iteration; re-admits workers (state sync) when needed."""
        n, me = self.group.size, self.group.worker_id
        det = self.threshold_detector
        step = det.step
        excluded = det.excluded()
        members = plan_members(n, self._members, excluded)
        previous = self._members
        if not members - previous:
            participation = Participation(step=step, members=members, left=previous - members)
        else:
            # Re-admission. Only the members of the last iteration know exactly who they were (a worker
            # that was out may have missed later exclusions), so everyone says whether it took part.
            try:
                flags = self.group.all_gather([1.0 if me in previous else 0.0], timeout_s=self.timeout_s,
                                              members=members if len(members) < n else None)
                ids = sorted(members)
                previous = frozenset(w for w, f in zip(ids, flags[:, 0]) if f > 0) or frozenset(ids[:1])
                source = min(previous)
                state = None
                if me == source:
                    state = pickle.dumps({"threshold": det.state_dict(),
                                          "ewma": self.ewma_detector.state_dict() if self.ewma_detector else None})
                state = pickle.loads(self.group.broadcast_bytes(
                    state, source, members if len(members) < n else None, timeout_s=self.timeout_s))
            except CollectiveError as e:
                self._failed(e, step)
                return
            det.load_state_dict(state["threshold"])
            if self.ewma_detector is not None and state["ewma"] is not None:
                self.ewma_detector.load_state_dict(state["ewma"])
            participation = Participation(step=step, members=members, joined=members - previous,
                                          left=previous - members, source=source)
        self.engine.begin_iteration(participation)
        if participation.joined or participation.left:
            self.history.participation.append(participation)
            self._write({"type": "participation", "time": time.time(), **participation.to_dict()})
            logger.info("iteration %d: members %s (joined %s from worker %s, left %s)", step,
                        sorted(participation.members), sorted(participation.joined), participation.source,
                        sorted(participation.left))
        self._members = participation.members

    def _resolve_group(self):
        if self._group_arg is not None:
            return self._group_arg
        from tfdist.collective import get_worker_group

        group = get_worker_group()
        if group is not None:
            return group
        training = _training_tasks_in_tf_config()
        if training > 1:
            raise CollectiveSetupError(
                f"TF_CONFIG lists {training} training tasks but this process has no worker group, so the "
                "workers cannot exchange their times. Call tfdist.collective.init_worker_group() at the top of "
                "the training script (before any TensorFlow op), or pass group=... to StragglerDetector."
            )
        return _LocalGroup()

    def _exchange(self) -> None:
        times, self._pending = self._pending, []
        if self._disabled:
            return
        k = self.exchange_every
        payload = np.full(2 + k, np.nan)
        payload[0], payload[1] = self._epoch, len(times)
        payload[2:2 + len(times)] = times
        step = self.threshold_detector.step if self.threshold_detector else 0
        n = self.group.size
        partial = self._excluding and len(self._members) < n
        try:
            if partial:
                table = np.asarray(self.group.all_gather(payload, timeout_s=self.timeout_s, members=self._members))
            else:
                table = np.asarray(self.group.all_gather(payload, timeout_s=self.timeout_s))
        except CollectiveError as e:
            self._failed(e, step)
            return
        epochs, counts = table[:, 0], table[:, 1]
        if not (np.all(epochs == self._epoch) and np.all(counts == counts[0])):
            self._failed(CollectiveError(
                f"Workers are out of step: epochs {epochs.tolist()}, iterations per exchange {counts.tolist()}. "
                "Every worker must run the same number of iterations per epoch (give fit() steps_per_epoch, or "
                "shard the data equally)."
            ), step)
            return
        now = time.time()
        rows = table[:, 2:2 + int(counts[0])].T  # [iterations, workers (members)]
        if partial:  # the workers that were out did not take part
            full = np.full((rows.shape[0], n), np.nan)
            full[:, sorted(self._members)] = rows
            rows = full
        for row in rows:
            self._observe([None if math.isnan(t) else float(t) for t in row], now)

    def _observe(self, times: list[float | None], now: float) -> None:
        verdict = self.threshold_detector.observe(times, now=now)
        events = list(verdict.events)
        if verdict.threshold_set:
            self._write({"type": "threshold", "time": now, "epoch": verdict.epoch, "iteration": verdict.iteration,
                         "step": verdict.step, "threshold": verdict.threshold, "limit": self.threshold_detector.limit})
        if self.ewma_detector is not None:
            ev = self.ewma_detector.observe_times(times, now=now)
            events += ev.events
            if ev.updated and self.record_iterations:
                self.history.ewma.append(ev.ewma)
        if self.record_iterations:
            self.history.times.append(tuple(times))
            self.history.counters.append(verdict.counters)
        for e in events:
            self.history.events.append(e)
            self._write({"type": "event", **e.to_dict()})
            logger.warning(
                "straggler %s: worker %d (%s) at epoch %d iteration %d: value %.4g vs threshold %.4g%s",
                e.kind.value, e.worker, e.detector.value, e.epoch, e.iteration, e.value, e.threshold,
                "" if e.counter is None else f", counter {e.counter}/{e.limit}",
            )
        self.events.dispatch(events)

    def _failed(self, error: CollectiveError, step: int) -> None:
        failure = ExchangeFailure(
            epoch=self._epoch, step=step, time=time.time(), error=type(error).__name__,
            message=str(error), peers=tuple(getattr(error, "peers", ())),
        )
        self.history.failures.append(failure)
        self._disabled = True
        self._write({"type": "failure", **failure.to_dict()})
        logger.error(
            "StragglerDetector: the timing exchange failed at epoch %d step %d; straggler detection stops on "
            "this worker (training goes on unless on_failure='raise'). %s", self._epoch, step, error,
        )
        self.on_exchange_failed(failure)
        if self.on_failure == "raise":
            raise error

    def _write(self, record: dict[str, Any]) -> None:
        if self._log is not None:
            self._log.write(json_ready(record))


def _training_tasks_in_tf_config() -> int:
    """Training tasks of the job this process belongs to (0 without a cluster or with an unreadable one)."""
    from tfdist.cluster.resolver import resolve_cluster
    from tfdist.errors import ConfigError

    try:
        resolved = resolve_cluster()
    except ConfigError:
        return 0
    return 0 if resolved.is_single_process else resolved.num_workers
