"""EwmaDetector with scripted timings: persistent stragglers, recovery, jitter, windows."""

import numpy as np
import pytest

from tfdist.straggler import EventKind, EwmaConfig, EwmaDetector, throughput_ratios

BASE = 0.1


def feed(det, rows, **kw):
    return [det.observe_times(row, **kw) for row in rows]


def test_ratios_to_median():
    assert throughput_ratios([10.0, 20.0, 5.0]).tolist() == [1.0, 2.0, 0.5]
    r = throughput_ratios([10.0, np.nan, 5.0, 10.0])
    assert np.isnan(r[1]) and r[[0, 2, 3]].tolist() == [1.0, 0.5, 1.0]
    assert np.isnan(throughput_ratios([np.nan, np.nan])).all()


def test_five_x_straggler_flagged_after_three_windows_with_default_alpha():
    det = EwmaDetector(4, window=1)  # alpha 0.1, threshold 0.8
    verdicts = feed(det, [[BASE, BASE, BASE, 5 * BASE]] * 5)
    assert [sorted(v.stragglers) for v in verdicts] == [[], [], [3], [3], [3]]
    ev = [e for v in verdicts for e in v.events]
    assert [(e.kind, e.worker, e.step, e.detector.value) for e in ev] == [(EventKind.DETECTED, 3, 2, "ewma")]
    assert ev[0].value == pytest.approx(0.2 + 0.8 * 0.9**3) and ev[0].threshold == 0.8


def test_single_slow_window_is_not_persistent():
    det = EwmaDetector(3, window=1)
    verdicts = feed(det, [[BASE, BASE, 10 * BASE]] + [[BASE] * 3] * 50)
    assert not any(v.events for v in verdicts)
    assert min(min(v.ewma) for v in verdicts) > 0.8


def test_recovery_when_average_climbs_back():
    det = EwmaDetector(3, window=1, alpha=0.5)
    verdicts = feed(det, [[BASE, BASE, 5 * BASE]] * 10 + [[BASE] * 3] * 10)
    kinds = [(e.kind, e.step) for v in verdicts for e in v.events]
    assert kinds[0][0] is EventKind.DETECTED and kinds[-1][0] is EventKind.RECOVERED
    assert kinds[-1][1] >= 10 and verdicts[-1].stragglers == frozenset()


def test_recovery_threshold_gives_hysteresis():
    det = EwmaDetector(2, window=1, alpha=1.0, threshold=0.8, recovery_threshold=0.95)
    # with alpha=1 the average is the last ratio; 2 workers: median = mean of the two
    v = feed(det, [[BASE, 3 * BASE], [BASE, 1.15 * BASE], [BASE, BASE]])
    assert [sorted(x.stragglers) for x in v] == [[1], [1], []]


@pytest.mark.parametrize("seed", range(5))
def test_jitter_of_20_percent_never_triggers(seed):
    rng = np.random.default_rng(seed)
    det = EwmaDetector(4)  # window 10
    rows = BASE * rng.uniform(0.8, 1.2, size=(2000, 4))
    verdicts = feed(det, rows.tolist())
    assert not any(v.events for v in verdicts)
    # and even window=1 (every iteration) does not trigger
    det1 = EwmaDetector(4, window=1)
    assert not any(v.events for v in feed(det1, rows.tolist()))


def test_window_averages_before_updating():
    det = EwmaDetector(2, window=4, alpha=1.0)
    v = feed(det, [[BASE, BASE], [BASE, BASE], [BASE, BASE], [BASE, 7 * BASE]])
    assert [x.updated for x in v] == [False, False, False, True]
    # worker 1 did 4 iterations in 1.0 s, worker 0 in 0.4 s; median of two = mean
    assert v[-1].ratios[1] == pytest.approx((4 / 1.0) / ((4 / 0.4 + 4 / 1.0) / 2))


def test_missing_worker_keeps_its_average():
    det = EwmaDetector(3, window=1)
    feed(det, [[BASE, BASE, 5 * BASE]] * 3)
    before = det.ewma[2]
    feed(det, [[BASE, BASE, None]] * 5)
    assert det.ewma[2] == before and det.stragglers == frozenset({2})


def test_throughputs_and_batch_sizes():
    det = EwmaDetector(3, window=1)
    v = [det.observe_throughputs([100.0, 100.0, 20.0]) for _ in range(3)]
    assert v[-1].stragglers == frozenset({2})
    det2 = EwmaDetector(2, window=1, alpha=1.0)
    # same time, but worker 1 processes half the batch: half the throughput
    v2 = det2.observe_times([BASE, BASE], batch_sizes=[64, 32])
    assert v2.ratios == pytest.approx((4 / 3, 2 / 3))


@pytest.mark.parametrize(
    "kwargs, field",
    [({"alpha": 0}, "alpha"), ({"alpha": 1.5}, "alpha"), ({"threshold": 0}, "threshold"),
     ({"window": 0}, "window"), ({"threshold": 0.8, "recovery_threshold": 0.5}, "recovery_threshold")],
)
def test_bad_settings_fail_fast(kwargs, field):
    with pytest.raises(ValueError, match=f"`{field}`"):
        EwmaConfig(**kwargs)


def test_bad_observations_rejected():
    det = EwmaDetector(2)
    with pytest.raises(ValueError, match="one time per worker"):
        det.observe_times([0.1])
    with pytest.raises(ValueError, match="finite"):
        det.observe_times([0.1, float("inf")])
