"""ReplacementPlanner with scripted per-worker throughputs: spare first, removal after join, cap, blips, churn."""

import json

import pytest

from tfdist.elastic import KEEP_SPARE, REMOVE, START_SPARE, ReplacementPlanner
from tfdist.errors import ConfigError
from tfdist.straggler import EwmaConfig


def kinds(actions):
    return [(a.kind, a.worker) for a in actions]


def windows(planner, rates, n, joined=None):
    """n windows of the same rates; returns the actions planned after each window."""
    joined = set(rates) if joined is None else joined
    out = []
    for _ in range(n):
        planner.observe(rates)
        out.append(planner.plan(joined))
    return out


NORMAL = {0: 10.0, 1: 10.0, 2: 10.0}


def test_persistent_straggler_gets_a_spare_and_is_removed_only_after_it_joined():
    planner = ReplacementPlanner(max_spares=1)
    rates = {**NORMAL, 3: 4.0}  # worker 3 at 0.4x the median
    # EWMA from 1.0 with alpha 0.1 at ratio 0.4: 0.94, 0.886, 0.837, 0.794 -> flagged in window 4
    plans = windows(planner, rates, 4)
    assert plans[:3] == [[], [], []]
    assert kinds(plans[3]) == [(START_SPARE, 3)]
    start = plans[3][0]
    assert start.numbers["ewma"] == pytest.approx(1 - 0.6 * (1 - 0.9**4)) and start.numbers["ewma"] < 0.8
    assert start.numbers["ratio"] == pytest.approx(0.4) and start.numbers["max_spares"] == 1
    assert planner.pending_spares == 1
    assert planner.plan(set(rates)) == []  # asked once, not again
    planner.spare_started(7, replaces=3)
    assert planner.pending_spares == 1
    # the spare warms up for a while: the straggler is not removed yet
    assert windows(planner, rates, 5) == [[]] * 5
    actions = planner.plan(joined={0, 1, 2, 3, 7})
    assert kinds(actions) == [(REMOVE, 3)]
    assert actions[0].numbers["spare"] == 7 and "Spare 7 has joined" in actions[0].reason
    json.dumps(actions[0].to_dict())
    assert planner.pending_spares == 0
    assert planner.plan(joined={0, 1, 2, 3, 7}) == []  # removal asked once
    planner.forget(3)
    after = windows(planner, {**NORMAL, 7: 10.0}, 10)
    assert after == [[]] * 10 and planner.stragglers == frozenset()


def test_never_more_than_max_spares_pending():
    planner = ReplacementPlanner(max_spares=2)
    rates = {w: 10.0 for w in range(5)}
    rates.update({5: 4.0, 6: 5.0, 7: 3.0})  # three stragglers; median stays 10
    next_id, warming, log = 100, {}, []
    for window in range(40):
        planner.observe(rates)
        joined = set(rates) | {s for s, left in warming.items() if left <= 0}
        for action in planner.plan(joined):
            log.append((window, action.kind, action.worker))
            if action.kind == START_SPARE:
                planner.spare_started(next_id, replaces=action.worker)
                warming[next_id] = 3  # joins after three windows of warm-up
                next_id += 1
            elif action.kind == REMOVE:
                spare = action.numbers["spare"]
                assert spare in joined  # removal only once the straggler's spare counts
                planner.forget(action.worker)
                del rates[action.worker]
        for spare in list(warming):
            warming[spare] -= 1
            if warming[spare] < 0:  # joined: now counts and reports its throughput
                rates[spare] = 10.0
                del warming[spare]
        assert planner.pending_spares <= 2
    starts = [(w, worker) for w, kind, worker in log if kind == START_SPARE]
    removes = [worker for _, kind, worker in log if kind == REMOVE]
    # 5 and 7 are flagged in window 3 (worst first), 6 in window 4 but waits for a free spare slot
    assert starts[:2] == [(3, 7), (3, 5)]
    # the first spare joins in window 6, which frees a slot for 6 (flagged since window 4)
    assert starts[2] == (6, 6)
    assert sorted(removes) == [5, 6, 7]
    assert not any(w in rates for w in (5, 6, 7)) and planner.stragglers == frozenset()


def test_a_one_window_blip_is_not_replaced():
    planner = ReplacementPlanner()
    plans = windows(planner, {**NORMAL, 3: 1.0}, 1) + windows(planner, {**NORMAL, 3: 10.0}, 30)
    assert all(p == [] for p in plans)
    assert planner.stragglers == frozenset() and min(planner.ewma.values()) > 0.8


def test_a_straggler_that_recovers_before_its_spare_starts_is_not_replaced():
    planner = ReplacementPlanner()
    plans = windows(planner, {**NORMAL, 3: 4.0}, 10)
    assert [kinds(p) for p in plans if p] == [[(START_SPARE, 3)]]
    assert planner.pending_spares == 1
    plans = windows(planner, {**NORMAL, 3: 10.0}, 10)  # recovers: EWMA back over 0.8 after 7 windows
    assert all(p == [] for p in plans)
    assert 3 not in planner.stragglers and planner.pending_spares == 0


def test_a_straggler_that_recovers_after_its_spare_started_keeps_its_place_and_the_spare_stays():
    planner = ReplacementPlanner()
    windows(planner, {**NORMAL, 3: 4.0}, 10)
    planner.spare_started(4, replaces=3)
    windows(planner, {**NORMAL, 3: 10.0}, 10)
    actions = planner.plan(joined={0, 1, 2, 3, 4})
    assert kinds(actions) == [(KEEP_SPARE, 4)]
    assert "recovered" in actions[0].reason and "extra worker" in actions[0].reason
    assert planner.pending_spares == 0
    assert windows(planner, {**NORMAL, 3: 10.0, 4: 10.0}, 5) == [[]] * 5


def test_cap_zero_turns_replacement_off():
    planner = ReplacementPlanner(max_spares=0)
    plans = windows(planner, {**NORMAL, 3: 2.0}, 20)
    assert planner.stragglers == frozenset({3}) and all(p == [] for p in plans)


def test_a_cancelled_spare_is_asked_for_again():
    planner = ReplacementPlanner()
    windows(planner, {**NORMAL, 3: 4.0}, 4)
    planner.cancel_spare(3)
    assert planner.pending_spares == 0
    assert kinds(planner.plan({0, 1, 2, 3})) == [(START_SPARE, 3)]


def test_ewma_config_is_honoured():
    planner = ReplacementPlanner(ewma=EwmaConfig(alpha=0.5, window=1))
    # alpha 0.5 at ratio 0.4: 0.7 < 0.8 after one window
    assert kinds(windows(planner, {**NORMAL, 3: 4.0}, 1)[0]) == [(START_SPARE, 3)]
    planner = ReplacementPlanner(ewma=EwmaConfig(window=2))  # the averages move every second window
    plans = windows(planner, {**NORMAL, 3: 4.0}, 8)
    assert [i for i, p in enumerate(plans) if p] == [7]


# --------------------------------------------------------------------------- workers coming and going
def test_a_new_worker_starts_as_normal():
    planner = ReplacementPlanner()
    windows(planner, NORMAL, 10)
    plans = windows(planner, {**NORMAL, 5: 2.0}, 1)  # first window of a new worker is slow
    assert plans == [[]] and planner.ewma[5] == pytest.approx(0.9 + 0.1 * 0.2)
    assert 5 not in planner.stragglers


def test_a_worker_missing_from_a_window_keeps_its_average():
    planner = ReplacementPlanner()
    windows(planner, {**NORMAL, 3: 4.0}, 3)
    before = planner.ewma[3]
    windows(planner, {**NORMAL, 3: None}, 5)
    windows(planner, NORMAL, 5)
    assert planner.ewma[3] == before


def test_straggler_that_leaves_before_its_spare_joined_is_replaced_by_it_without_a_remove():
    planner = ReplacementPlanner()
    windows(planner, {**NORMAL, 3: 4.0}, 4)
    planner.spare_started(9, replaces=3)
    planner.forget(3)  # crashed
    windows(planner, NORMAL, 2)
    actions = planner.plan(joined={0, 1, 2, 9})
    assert kinds(actions) == [(KEEP_SPARE, 9)] and "takes its place" in actions[0].reason
    assert planner.pending_spares == 0


def test_spare_that_leaves_before_joining_frees_its_straggler_for_a_new_one():
    planner = ReplacementPlanner()
    rates = {**NORMAL, 3: 4.0}
    windows(planner, rates, 4)
    planner.spare_started(9, replaces=3)
    planner.observe(rates)
    assert planner.plan(set(rates)) == []
    planner.forget(9)  # the spare crashed while warming up
    assert kinds(planner.plan(set(rates))) == [(START_SPARE, 3)]
    planner.spare_started(10, replaces=3)
    assert kinds(planner.plan(set(rates) | {9, 10})) == [(REMOVE, 3)]  # 9 is gone: only 10 counts


def test_a_forgotten_id_seen_again_is_a_new_worker():
    planner = ReplacementPlanner()
    windows(planner, {**NORMAL, 3: 4.0}, 6)
    assert 3 in planner.stragglers
    planner.forget(3)
    assert 3 not in planner.ewma
    assert windows(planner, {**NORMAL, 3: 10.0}, 1) == [[]]
    assert planner.ewma[3] == pytest.approx(1.0) and 3 not in planner.stragglers


def test_many_workers_joining_keep_the_averages_of_the_others():
    planner = ReplacementPlanner()
    windows(planner, {**NORMAL, 3: 4.0}, 4)
    flagged = planner.ewma[3]
    assert planner.stragglers == frozenset({3})
    rates = {w: 10.0 for w in range(30)}
    rates[3] = 4.0
    rates[25] = 4.0
    planner.observe(rates)  # 26 new workers: the detector grows past its first 8 slots
    assert planner.ewma[3] == pytest.approx(0.9 * flagged + 0.1 * 0.4)
    assert planner.ewma[25] == pytest.approx(0.94) and planner.stragglers == frozenset({3})
    assert set(planner.ewma) == set(range(30))
    windows(planner, rates, 3)
    assert planner.stragglers == frozenset({3, 25})


# --------------------------------------------------------------------------- validation
def test_bad_arguments_are_refused():
    with pytest.raises(ConfigError, match="max_spares.*Received: max_spares=-1"):
        ReplacementPlanner(max_spares=-1)
    with pytest.raises(ConfigError, match="EwmaConfig"):
        ReplacementPlanner(ewma={"alpha": 0.1})
    planner = ReplacementPlanner()
    with pytest.raises(ValueError, match="throughputs\\[1\\]"):
        planner.observe({0: 1.0, 1: -1.0})
    with pytest.raises(ValueError, match="worker id"):
        planner.observe({"w0": 1.0})
    windows(planner, {**NORMAL, 3: 4.0}, 4)
    planner.spare_started(9, replaces=3)
    with pytest.raises(ValueError, match="already has a spare"):
        planner.spare_started(10, replaces=3)
