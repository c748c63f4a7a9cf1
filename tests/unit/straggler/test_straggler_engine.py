"""StragglerEngine: one interface for both strategy families; the flagged set is reported by one worker only."""

import numpy as np
import pytest

keras = pytest.importorskip("keras")

from tfdist.callbacks import StragglerDetector  # noqa: E402
from tfdist.straggler import (  # noqa: E402
    DynamicThresholdConfig,
    StragglerEngine,
    StragglerListener,
    StragglerMonitor,
    flagged_after,
    reporter,
)
from tfdist.straggler.verdicts import DetectorName, EventKind, StragglerEvent  # noqa: E402


def event(kind, worker, detector=DetectorName.DYNAMIC_THRESHOLD):
    return StragglerEvent(kind, worker, detector, 0, 0, 0, None, 1.0, 0.5)


def test_flagged_set_follows_the_events_of_both_detectors_in_order():
    d, r = EventKind.DETECTED, EventKind.RECOVERED
    assert flagged_after({1}, [event(d, 2), event(r, 1)]) == {2}
    assert flagged_after(set(), [event(d, 2), event(d, 2, DetectorName.EWMA), event(r, 2)]) == frozenset()
    assert reporter({3, 1, 2}) == 1


class Group:
    """Worker ``worker_id`` of 3; every gather returns the scripted times of all three (worker 2 slow from step 8)."""

    def __init__(self, worker_id):
        self.size, self.worker_id, self.timeout_s, self.step = 3, worker_id, 5.0, 0

    def all_gather(self, values, timeout_s=None):
        values = np.asarray(values, dtype=np.float64)
        table = np.repeat(values[None, :], 3, axis=0)
        table[:, 2] = [0.01, 0.011, 5.0 if 8 <= self.step < 20 else 0.012]
        self.step += 1
        return table


class RecordingEngine(StragglerEngine):
    def __init__(self):
        self.calls = []

    def set_stragglers(self, stragglers, report):
        self.calls.append((sorted(stragglers), report))


def run(worker_id, steps=30, engine=None):
    engine = engine or RecordingEngine()
    monitor = StragglerMonitor(DynamicThresholdConfig(profile_iterations=3, limit=2), warmup_iterations=0)
    monitor.start(Group(worker_id), engine)
    monitor.start_epoch(0, steps)
    for _ in range(steps):
        monitor.begin_iteration()
        monitor.end_iteration(0.0)  # the scripted table replaces this worker's own time
    monitor.end_epoch()
    return monitor, engine


def test_every_worker_hears_each_change_and_only_the_lowest_member_reports():
    reports = []
    for worker_id in range(3):
        monitor, engine = run(worker_id)
        assert [s for s, _ in engine.calls] == [[2], []]  # detected, then recovered: two changes, no repeats
        assert monitor.flagged == frozenset()
        reports += [report for _, report in engine.calls]
    assert reports.count(True) == 2  # one report per change in the whole job, not one per worker


class FakePSStrategy:
    """What the PS strategies' engine calls: exclude_workers (one SetExcluded to every PS task)."""

    def __init__(self, fail=False):
        self.sent, self.fail = [], fail

    def exclude_workers(self, workers):
        if self.fail:
            raise OSError("ps:0 unreachable")
        self.sent.append(sorted(workers))


def test_parameter_server_engine_sends_set_excluded_from_the_reporter_only():
    from tfdist.strategies.parameter_server import ParameterServerStrategy, _ExcludeStragglers

    for worker_id, expected in ((0, [[2], []]), (1, []), (2, [])):
        strategy = FakePSStrategy()
        run(worker_id, engine=_ExcludeStragglers(strategy))
        assert strategy.sent == expected, worker_id
    _ExcludeStragglers(FakePSStrategy(fail=True)).set_stragglers(frozenset({1}), True)  # logged, never raised
    # the old wiring still works and adds no second sender
    listener = ParameterServerStrategy.straggler_listener(None)
    assert type(listener) is StragglerListener
    StragglerDetector().subscribe(listener)


def test_the_callback_finds_the_strategy_engine():
    class Strategy:  # stands for model.distribute_strategy
        straggler_engine = RecordingEngine()

    class Model:
        distribute_strategy = Strategy()

    detector = StragglerDetector(group=Group(0), warmup_iterations=0)
    detector.set_model(Model())
    detector.on_train_begin()
    assert detector.engine is Strategy.straggler_engine


def test_store_counts_set_excluded_requests():
    from tfdist.consistency import SyncReplicasPolicy
    from tfdist.ps.store import ParameterStore

    store = ParameterStore(SyncReplicasPolicy(2), heartbeat_timeout_s=10, num_workers=2)
    assert store.status()["stats"]["set_excluded"] == 0
    store.set_excluded(0, [1])
    store.set_excluded(0, [])
    assert store.status()["stats"]["set_excluded"] == 2
