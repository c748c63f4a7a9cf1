"""DynamicThresholdDetector with scripted timings: detection, recovery, bounds, jitter, limits."""

import numpy as np
import pytest

from tfdist.straggler import (
    DynamicThresholdConfig,
    DynamicThresholdDetector,
    EventKind,
    default_limit,
)

BASE = 0.10  # seconds per iteration of a normal worker


def run_epoch(det, rows, epoch=None, iterations=None, now0=0.0):
    """Feeds rows of per-worker times; returns the verdicts."""
    det.start_epoch(epoch, iterations=iterations if iterations is not None else len(rows))
    out = [det.observe(row, now=now0 + i) for i, row in enumerate(rows)]
    return out, det.end_epoch()


def events_of(verdicts, kind=None):
    return [e for v in verdicts for e in v.events if kind is None or e.kind is kind]


def test_threshold_is_k_times_mean_of_per_iteration_minima():
    det = DynamicThresholdDetector(3, limit=3)
    rows = [[0.10, 0.30, 0.20], [0.12, 0.11, 0.50], [0.40, 0.09, 0.30], [0.10, 0.10, 0.10], [0.20, 0.30, 0.14]]
    verdicts, summary = run_epoch(det, rows + [[0.1] * 3] * 5)
    minima = [0.10, 0.11, 0.09, 0.10, 0.14]
    assert summary.profile_minima == pytest.approx(minima)
    assert summary.threshold == pytest.approx(2.0 * np.mean(minima))
    assert [v.threshold_set for v in verdicts[:6]] == [False, False, False, False, True, False]
    # no threshold before the n-th iteration of the first epoch: nothing is counted
    assert all(v.threshold is None and v.counters == (0, 0, 0) for v in verdicts[:4])


def test_first_epoch_counter_starts_at_one_when_threshold_is_set():
    det = DynamicThresholdDetector(2, limit=4)
    rows = [[BASE, 5 * BASE]] * 10
    verdicts, _ = run_epoch(det, rows)
    assert verdicts[4].counters == (0, 1)  # the paper's counters start at 1 with the threshold
    detected = events_of(verdicts, EventKind.DETECTED)
    assert [(e.worker, e.iteration, e.counter, e.limit) for e in detected] == [(1, 7, 4, 4)]
    assert detected[0].value == pytest.approx(5 * BASE) and detected[0].threshold == pytest.approx(2 * BASE)
    assert detected[0].time == 7.0


def test_detection_after_limit_slow_iterations_mid_epoch():
    det = DynamicThresholdDetector(4, limit=5)
    rows = [[BASE] * 4] * 20 + [[BASE, BASE, 5 * BASE, BASE]] * 20
    verdicts, summary = run_epoch(det, rows)
    detected = events_of(verdicts, EventKind.DETECTED)
    assert [(e.worker, e.iteration) for e in detected] == [(2, 24)]  # 5 slow iterations: 20..24
    assert summary.stragglers == frozenset({2}) and summary.counters == (0, 0, 5, 0)
    assert summary.detections == 1


def test_recovery_on_first_fast_iteration_and_counter_reaches_zero():
    det = DynamicThresholdDetector(2, limit=3)
    rows = [[BASE, BASE]] * 5 + [[BASE, 5 * BASE]] * 10 + [[BASE, BASE]] * 10
    verdicts, _ = run_epoch(det, rows)
    rec = events_of(verdicts, EventKind.RECOVERED)
    assert [(e.worker, e.iteration, e.counter) for e in rec] == [(1, 15, 2)]
    assert verdicts[-1].counters == (0, 0) and verdicts[-1].stragglers == frozenset()


def test_counter_bounded_to_zero_and_limit():
    det = DynamicThresholdDetector(2, limit=3)
    rows = [[BASE, BASE]] * 5 + [[BASE, 10 * BASE]] * 50 + [[BASE, BASE]] * 50
    verdicts, _ = run_epoch(det, rows)
    counters = np.array([v.counters for v in verdicts])
    assert counters.min() == 0 and counters.max() == 3
    assert counters[5:55, 1].max() == 3 and counters[5:55, 0].max() == 0
    # bounded: one fast iteration after 50 slow ones is enough to leave the straggler state
    assert verdicts[55].counters[1] == 2 and 1 not in verdicts[55].stragglers


def test_time_equal_to_threshold_leaves_counter_unchanged():
    det = DynamicThresholdDetector(2, limit=3)
    rows = [[BASE, BASE]] * 5 + [[BASE, 0.5]] * 2 + [[BASE, 2 * BASE]] * 3
    verdicts, _ = run_epoch(det, rows)
    assert [v.counters[1] for v in verdicts[5:]] == [1, 2, 2, 2, 2]


@pytest.mark.parametrize("seed", range(5))
def test_jitter_of_20_percent_never_triggers(seed):
    rng = np.random.default_rng(seed)
    det = DynamicThresholdDetector(4)  # default limit
    for epoch in range(10):
        rows = BASE * rng.uniform(0.8, 1.2, size=(100, 4))
        verdicts, summary = run_epoch(det, rows.tolist(), epoch=epoch)
        assert not events_of(verdicts)
        assert max(max(v.counters) for v in verdicts) == 0
        assert summary.threshold >= 2 * 0.8 * BASE


def test_occasional_spikes_below_limit_frequency_do_not_trigger():
    # every 4th iteration a normal worker is 5x slow: +1, -1, -1, -1 ... never reaches the limit
    det = DynamicThresholdDetector(2, limit=3)
    rows = [[BASE, 5 * BASE if i % 4 == 0 else BASE] for i in range(5, 200)]
    verdicts, _ = run_epoch(det, [[BASE, BASE]] * 5 + rows)
    assert not events_of(verdicts)
    assert max(v.counters[1] for v in verdicts) == 1


def test_stragglers_excluded_outside_profiling_and_take_part_again_each_epoch():
    det = DynamicThresholdDetector(2, limit=3, profile_iterations=5)
    rows = [[BASE, BASE]] * 5 + [[BASE, 5 * BASE]] * 5
    verdicts, _ = run_epoch(det, rows)
    assert verdicts[-1].excluded == frozenset({1})
    assert det.excluded() == frozenset({1})
    # next epoch: everyone takes part in iterations 0..4; the straggler recovered, and the engine
    # that left it out (None) for the rest of the last epoch sees it in the profiling iterations
    det.start_epoch(1, iterations=10)
    assert det.excluded() == frozenset()
    v = [det.observe([BASE, BASE], now=100.0 + i) for i in range(5)]
    assert [x.excluded for x in v] == [frozenset()] * 4 + [frozenset()]
    rec = events_of(v, EventKind.RECOVERED)
    assert [(e.worker, e.epoch, e.iteration) for e in rec] == [(1, 1, 0)]  # previous threshold in force
    assert v[0].threshold == pytest.approx(2 * BASE) and v[0].profiling


def test_excluded_worker_none_keeps_its_counter():
    det = DynamicThresholdDetector(3, limit=3)
    rows = [[BASE] * 3] * 5 + [[BASE, BASE, 5 * BASE]] * 3 + [[BASE, BASE, None]] * 10
    verdicts, _ = run_epoch(det, rows)
    assert verdicts[-1].counters == (0, 0, 3) and verdicts[-1].stragglers == frozenset({2})


def test_straggler_during_profiling_does_not_move_threshold():
    # the minimum across workers ignores the slow one, as in the paper
    det = DynamicThresholdDetector(3, limit=3)
    _, summary = run_epoch(det, [[BASE, 10 * BASE, BASE]] * 10)
    assert summary.threshold == pytest.approx(2 * BASE)
    assert summary.stragglers == frozenset({1})


def test_threshold_follows_system_across_epochs():
    det = DynamicThresholdDetector(2, limit=3)
    run_epoch(det, [[BASE, BASE]] * 10, epoch=0)
    # the whole system is 3x slower in epoch 1: a new threshold, and no false straggler even though
    # the profiling iterations exceed the old threshold (it may only lower counters)
    verdicts, summary = run_epoch(det, [[3 * BASE, 3 * BASE]] * 10, epoch=1)
    assert summary.threshold == pytest.approx(6 * BASE)
    assert not events_of(verdicts)
    assert all(v.counters == (0, 0) for v in verdicts)


def test_profiling_iterations_only_lower_counters():
    det = DynamicThresholdDetector(2, limit=5)
    run_epoch(det, [[BASE, BASE]] * 5 + [[BASE, 5 * BASE]] * 3, epoch=0)
    assert det.counters == (0, 3)
    det.start_epoch(1, iterations=10)
    v = [det.observe(row) for row in [[BASE, 5 * BASE], [BASE, BASE], [BASE, 5 * BASE], [BASE, BASE]]]
    assert [x.counters[1] for x in v] == [3, 2, 2, 1]


def test_limit_defaults_to_fraction_of_epoch_iterations():
    assert default_limit(390) == 10 and default_limit(195) == 5  # paper: 10 and 6 iterations to detect
    assert default_limit(40) == 3 and default_limit(1000) == 25
    assert default_limit(None) == 10
    assert default_limit(100, fraction=0.1, min_limit=2) == 10
    det = DynamicThresholdDetector(2)
    det.start_epoch(0, iterations=400)
    assert det.limit == 10
    det.observe([BASE, BASE])
    det.end_epoch()
    det.start_epoch(1)  # unknown length: the previous epoch's (1 iteration) -> min limit
    assert det.limit == 3
    det2 = DynamicThresholdDetector(2)
    det2.start_epoch(0)  # unknown, nothing known yet
    assert det2.limit == 10
    assert DynamicThresholdDetector(2, limit=7).limit == 7


def test_larger_limit_keeps_straggler_shrinking_limit_clips_counters():
    det = DynamicThresholdDetector(2)
    _, s = run_epoch(det, [[BASE, BASE]] * 5 + [[BASE, 5 * BASE]] * 35, epoch=0, iterations=40)  # limit 3
    assert s.limit == 3 and s.stragglers == frozenset({1})
    det.start_epoch(1, iterations=400)  # limit 10
    assert det.limit == 10 and det.counters == (0, 10) and det.stragglers == frozenset({1})
    det.end_epoch()
    det.start_epoch(2, iterations=40)
    assert det.counters == (0, 3)


def test_short_epoch_sets_threshold_from_minima_it_has():
    det = DynamicThresholdDetector(2, limit=3)
    verdicts, summary = run_epoch(det, [[BASE, 2 * BASE], [BASE, BASE]])
    assert summary.threshold == pytest.approx(2 * BASE)
    assert det.threshold == pytest.approx(2 * BASE)
    assert all(v.threshold is None for v in verdicts)


def test_event_and_verdict_serialise_to_json_ready_dicts():
    import json

    det = DynamicThresholdDetector(2, limit=3)
    verdicts, summary = run_epoch(det, [[BASE, BASE]] * 5 + [[BASE, 5 * BASE]] * 3)
    data = json.loads(json.dumps([v.to_dict() for v in verdicts] + [summary.to_dict()]))
    assert data[-2]["events"][0]["kind"] == "detected"
    assert data[-2]["events"][0]["detector"] == "dynamic_threshold"
    assert data[-2]["stragglers"] == [1] and data[-1]["stragglers"] == [1]


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"profile_iterations": 0}, "profile_iterations"),
        ({"factor": 1.0}, "factor"),
        ({"factor": "2"}, "factor"),
        ({"limit": 0}, "limit"),
        ({"limit_fraction": 0}, "limit_fraction"),
        ({"min_limit": 0}, "min_limit"),
    ],
)
def test_bad_settings_fail_fast_naming_the_field(kwargs, field):
    with pytest.raises(ValueError, match=f"`{field}`.*Received: {field}="):
        DynamicThresholdConfig(**kwargs)


def test_bad_observations_are_rejected():
    det = DynamicThresholdDetector(2)
    with pytest.raises(ValueError, match="one time per worker"):
        det.observe([0.1])
    with pytest.raises(ValueError, match="finite and >= 0"):
        det.observe([0.1, -1.0])
    with pytest.raises(ValueError, match="num_workers"):
        DynamicThresholdDetector(0)
