"""The framework-free core of the straggler detector callback: measure, exchange, decide, record, act.

:class:`StragglerMonitor` runs on every worker. The callback (or any
training loop) tells it when iterations and epochs begin and end and how long
each iteration took; the monitor exchanges the times with the worker group
(:mod:`~tfdist.straggler.exchange`), feeds the detectors, records verdicts in
a :class:`~tfdist.straggler.StragglerHistory` and a JSON-lines file
(:mod:`~tfdist.straggler.verdict_log`), hands events to listeners, and drives
the strategy's :class:`~tfdist.straggler.StragglerEngine`: the members of
each iteration when it leaves stragglers out
(:mod:`~tfdist.straggler.readmission`), and the flagged set, reported by one
worker (:func:`~tfdist.straggler.reporter`). No Keras, no TensorFlow.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Callable

from tfdist.straggler.dynamic_threshold import DynamicThresholdConfig, DynamicThresholdDetector
from tfdist.straggler.events import EventDispatcher
from tfdist.straggler.ewma import EwmaConfig, EwmaDetector
from tfdist.straggler.exchange import TimingsOutOfStep, pack_times, unpack_times
from tfdist.straggler.history import ExchangeFailure, StragglerHistory
from tfdist.straggler.membership import StragglerEngine, flagged_after, reporter
from tfdist.straggler.readmission import agree_participation
from tfdist.straggler.verdict_log import JsonLinesLog
from tfdist.straggler.verdicts import json_ready

__all__ = ["StragglerMonitor"]

logger = logging.getLogger(__name__)


class StragglerMonitor:
    """Straggler detection on one worker of a group (the callback's arguments are documented there).

    Args:
        threshold_config: The dynamic-threshold rule.
        ewma_config: The EWMA rule, or ``None`` for none.
        exchange_every: Iterations whose times travel in one gather.
        timeout_s: Timeout of each exchange; ``None``: the group's.
        log_path: JSON-lines file (``{worker}`` is replaced), or ``None``.
        record_iterations: Keep every iteration's times and counters.
        warmup_iterations: Iterations at the start that are neither measured nor exchanged.
        error_class: What the group raises when an exchange fails (a dead or
            hung peer); the monitor then records the failure and stops. A
            table out of step is reported as one too.
        on_failed: Called with the :class:`ExchangeFailure` after it is recorded.
        raise_on_failure: Re-raise the error after reporting it.
    """

    def __init__(self, threshold_config: DynamicThresholdConfig, ewma_config: EwmaConfig | None = None, *,
                 exchange_every: int = 1, timeout_s: float | None = None, log_path: str | None = None,
                 record_iterations: bool = True, warmup_iterations: int = 1,
                 error_class: type[Exception] = RuntimeError,
                 on_failed: Callable[[ExchangeFailure], None] | None = None, raise_on_failure: bool = False):
        if isinstance(exchange_every, bool) or not isinstance(exchange_every, int) or exchange_every < 1:
            raise ValueError(f"`exchange_every` must be an integer >= 1. Received: exchange_every={exchange_every!r}.")
        if timeout_s is not None and (isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float))
                                      or timeout_s <= 0):
            raise ValueError(f"`timeout_s` must be a positive number of seconds. Received: timeout_s={timeout_s!r}.")
        if isinstance(warmup_iterations, bool) or not isinstance(warmup_iterations, int) or warmup_iterations < 0:
            raise ValueError(
                f"`warmup_iterations` must be an integer >= 0. Received: warmup_iterations={warmup_iterations!r}."
            )
        self.threshold_config, self.ewma_config = threshold_config, ewma_config
        self.exchange_every, self.timeout_s, self.log_path = exchange_every, timeout_s, log_path
        self.record_iterations, self.warmup_iterations = record_iterations, warmup_iterations
        self.error_class, self.on_failed, self.raise_on_failure = error_class, on_failed, raise_on_failure
        self.history = StragglerHistory()
        self.events = EventDispatcher()
        self.group: Any = None
        self.engine: StragglerEngine | None = None
        self.threshold_detector: DynamicThresholdDetector | None = None
        self.ewma_detector: EwmaDetector | None = None
        self.members: frozenset[int] = frozenset()
        self.flagged: frozenset[int] = frozenset()
        self.active = True
        self._log: JsonLinesLog | None = None
        self._pending: list[float] = []
        self._epoch = 0
        self._warmup_left = warmup_iterations

    @property
    def excluding(self) -> bool:
        """Whether the engine leaves stragglers out, so every iteration's members are decided here."""
        return bool(self.engine is not None and self.engine.exclude_stragglers and self.group is not None
                    and self.group.size > 1)

    @property
    def stragglers(self) -> frozenset[int]:
        """Workers the dynamic-threshold rule classifies as stragglers now."""
        return self.threshold_detector.stragglers if self.threshold_detector else frozenset()

    @property
    def persistent_stragglers(self) -> frozenset[int]:
        """Workers the EWMA rule classifies as persistent stragglers now."""
        return self.ewma_detector.stragglers if self.ewma_detector else frozenset()

    def excluded(self) -> frozenset[int]:
        """Workers an engine may leave out of the next iteration (none once detection stopped)."""
        return self.threshold_detector.excluded() if self.threshold_detector and self.active else frozenset()

    def timeout(self) -> float | None:
        return self.timeout_s if self.timeout_s is not None else getattr(self.group, "timeout_s", None)

    def start(self, group: Any, engine: StragglerEngine | None) -> None:
        """Starts a run (``fit``) on ``group`` driving ``engine``."""
        self.group, self.engine = group, engine
        n = group.size
        self.threshold_detector = DynamicThresholdDetector(n, self.threshold_config)
        self.ewma_detector = EwmaDetector(n, self.ewma_config) if self.ewma_config else None
        self.active, self._pending, self._warmup_left = True, [], self.warmup_iterations
        self.members, self.flagged = frozenset(range(n)), frozenset()
        if self.excluding and self.exchange_every != 1:
            raise ValueError(
                "A strategy that leaves stragglers out needs the times of every iteration to decide the next "
                f"one's members. Received: exchange_every={self.exchange_every}. Use exchange_every=1."
            )
        if self.log_path and self._log is None:
            if "{worker}" in self.log_path:
                self._log = JsonLinesLog(self.log_path.format(worker=group.worker_id))
            elif group.worker_id == 0:
                self._log = JsonLinesLog(self.log_path)
        self._write({
            "type": "config", "time": time.time(), "worker": group.worker_id, "num_workers": n,
            "dynamic_threshold": self.threshold_config.to_dict(),
            "ewma": self.ewma_config.to_dict() if self.ewma_config else None,
            "exchange_every": self.exchange_every, "timeout_s": self.timeout(),
            "warmup_iterations": self.warmup_iterations,
        })
        logger.info("StragglerDetector on worker %d of %d: %s, ewma=%s, exchange_every=%d, timeout_s=%s, log=%s",
                    group.worker_id, n, self.threshold_config, self.ewma_config, self.exchange_every,
                    self.timeout(), self.log_path)

    def start_epoch(self, epoch: int, iterations: int | None) -> None:
        self._epoch, self._pending = int(epoch), []
        if self.threshold_detector is not None:
            self.threshold_detector.start_epoch(self._epoch, iterations=iterations)
        if self.ewma_detector is not None:
            self.ewma_detector.start_epoch(self._epoch)

    def begin_iteration(self) -> None:
        """Before an iteration: under an excluding engine, agree on its members (re-admitting with state)."""
        if not (self.excluding and self.active):
            return
        det, ewma = self.threshold_detector, self.ewma_detector
        step = det.step
        try:
            participation, state = agree_participation(
                self.group, step, self.members, det.excluded(), timeout_s=self.timeout_s,
                state=lambda: {"threshold": det.state_dict(), "ewma": ewma.state_dict() if ewma else None})
        except self.error_class as e:
            self.fail(e, step)
            return
        if state is not None:
            det.load_state_dict(state["threshold"])
            if ewma is not None and state["ewma"] is not None:
                ewma.load_state_dict(state["ewma"])
        self.engine.begin_iteration(participation)
        if participation.joined or participation.left:
            self.history.participation.append(participation)
            self._write({"type": "participation", "time": time.time(), **participation.to_dict()})
            logger.info("iteration %d: members %s (joined %s from worker %s, left %s)", step,
                        sorted(participation.members), sorted(participation.joined), participation.source,
                        sorted(participation.left))
        self.members = participation.members

    def end_iteration(self, seconds: float) -> None:
        """After an iteration that took ``seconds`` of this worker's own time: exchange when due."""
        self._pending.append(max(seconds, 0.0))
        if self._warmup_left > 0 or self.group.worker_id not in self.members:
            # warm-up (the same iterations on every worker), or left out: nothing computed, nothing to exchange;
            # counted all the same (steps stay Keras iterations) as an iteration nobody took part in
            self._warmup_left = max(self._warmup_left - 1, 0)
            self._pending = []
            if self.active:
                self._observe([None] * self.group.size, time.time())
            return
        if len(self._pending) >= self.exchange_every:
            self.exchange()

    def end_epoch(self) -> dict[str, Any]:
        """Exchanges what is pending, closes the epoch; returns its log entries (empty before :meth:`start`)."""
        if self._pending:
            self.exchange()
        det = self.threshold_detector
        if det is None:
            return {}
        summary = det.end_epoch()
        self.history.epochs.append(summary)
        record = {"type": "epoch", "time": time.time(), **summary.to_dict(), "active": self.active}
        logs = {"straggler_threshold": float("nan") if summary.threshold is None else summary.threshold,
                "straggler_limit": summary.limit, "straggler_count": len(summary.stragglers),
                "straggler_detections": summary.detections, "straggler_recoveries": summary.recoveries,
                **{f"straggler_counter_w{w}": c for w, c in enumerate(summary.counters)}}
        if self.ewma_detector is not None:
            record["ewma"] = list(self.ewma_detector.ewma)
            record["persistent_stragglers"] = sorted(self.ewma_detector.stragglers)
            logs["persistent_straggler_count"] = len(self.ewma_detector.stragglers)
        self._write(record)
        return logs

    def close(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None

    def exchange(self) -> None:
        """Gathers the pending times of the members and observes them."""
        times, self._pending = self._pending, []
        if not self.active:
            return
        step = self.threshold_detector.step if self.threshold_detector else 0
        n = self.group.size
        partial = self.excluding and len(self.members) < n
        payload = pack_times(self._epoch, times, self.exchange_every)
        try:
            if partial:
                table = self.group.all_gather(payload, timeout_s=self.timeout_s, members=self.members)
            else:
                table = self.group.all_gather(payload, timeout_s=self.timeout_s)
            rows = unpack_times(table, self._epoch, n, self.members if partial else None)
        except TimingsOutOfStep as e:
            self.fail(self.error_class(str(e)), step)
            return
        except self.error_class as e:
            self.fail(e, step)
            return
        now = time.time()
        for row in rows:
            self._observe(row, now)

    def fail(self, error: Exception, step: int) -> None:
        """Records a failed exchange and stops detecting (raises it again if asked to)."""
        failure = ExchangeFailure(epoch=self._epoch, step=step, time=time.time(), error=type(error).__name__,
                                  message=str(error), peers=tuple(getattr(error, "peers", ())))
        self.history.failures.append(failure)
        self.active = False
        self._write({"type": "failure", **failure.to_dict()})
        logger.error(
            "StragglerDetector: the timing exchange failed at epoch %d step %d; straggler detection stops on "
            "this worker (training goes on unless on_failure='raise'). %s", self._epoch, step, error,
        )
        if self.on_failed is not None:
            self.on_failed(failure)
        if self.raise_on_failure:
            raise error

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
        flagged = flagged_after(self.flagged, events)
        if flagged != self.flagged:
            self.flagged = flagged
            set_stragglers = getattr(self.engine, "set_stragglers", None)  # engines written before it may lack it
            if set_stragglers is not None:
                set_stragglers(flagged, self.group.worker_id == reporter(self.members))

    def _write(self, record: dict[str, Any]) -> None:
        if self._log is not None:
            self._log.write(json_ready(record))
