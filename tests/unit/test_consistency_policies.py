"""Pure consistency policies, driven with scripted clocks and losses."""

import math

import pytest

from tfdist.consistency import (
    AsyncPolicy,
    BSPPolicy,
    DTSSPPolicy,
    GradientAction,
    PolicyContext,
    SSPPolicy,
    SyncReplicasPolicy,
    cache_is_fresh_enough,
    learning_progress_ratio,
    make_policy,
    next_staleness,
    policy_from_spec,
)
from tfdist.errors import ConfigError


def ctx(*live, now=0.0):
    return PolicyContext(now, frozenset(live))


def test_ssp_waits_exactly_when_ahead_by_more_than_s():
    p = SSPPolicy(2)
    live = ctx(0, 1, 2)
    for w, c in ((0, 5), (1, 3), (2, 4)):
        p.on_applied(w, c, live)
    assert p.min_clock(live) == 3
    assert not p.on_pull(0, 5, live).wait  # 5 - 3 = 2 <= 2 (clock = completed steps)
    d = p.on_pull(0, 6, live)
    assert d.wait and "3 ahead" in d.reason
    # the slow worker dies: it no longer holds the others back
    assert not p.on_pull(0, 6, ctx(0, 2)).wait


def test_ssp_zero_is_lockstep_and_asp_never_waits():
    p = SSPPolicy(0)
    live = ctx(0, 1)
    p.on_applied(0, 1, live)
    assert p.on_pull(0, 1, live).wait  # worker 1 has not finished clock 1
    p.on_applied(1, 1, live)
    assert not p.on_pull(0, 1, live).wait
    a = AsyncPolicy()
    assert math.isinf(a.staleness) and a.refresh_every_step
    assert not a.on_pull(0, 10**6, live).wait


def test_cache_guarantee():
    # a cache pulled when everyone had completed 4 steps serves clocks <= 4 + s
    assert cache_is_fresh_enough(7, 4, 3) and not cache_is_fresh_enough(8, 4, 3)
    assert cache_is_fresh_enough(10**9, 0, math.inf)
    assert cache_is_fresh_enough(4, 4, 0) and not cache_is_fresh_enough(5, 4, 0)


def test_sync_replicas_first_m_of_n():
    p = SyncReplicasPolicy(3)
    live = ctx(0, 1, 2, 3)
    assert p.on_gradient(0, 5, 5, frozenset(), live).action is GradientAction.ACCUMULATE
    assert not p.step_complete(frozenset({0, 1}), live)
    assert p.step_complete(frozenset({0, 1, 2}), live)
    assert p.on_gradient(3, 4, 5, frozenset(), live).action is GradientAction.STALE
    assert p.on_gradient(3, 6, 5, frozenset(), live).action is GradientAction.FUTURE
    assert p.on_gradient(0, 5, 5, frozenset({0}), live).action is GradientAction.DUPLICATE


def test_sync_replicas_never_waits_for_the_dead():
    p = SyncReplicasPolicy(3)
    assert p.step_complete(frozenset({0, 1}), ctx(0, 1))  # only two live workers left
    bsp = BSPPolicy(4)
    assert not bsp.step_complete(frozenset({0, 1, 2}), ctx(0, 1, 2, 3))
    assert bsp.step_complete(frozenset({0, 1, 2}), ctx(0, 1, 2))  # worker 3 died
    # a contributor that died after sending still counts
    assert bsp.step_complete(frozenset({0, 1}), ctx(0))


def test_lpr_rule():
    assert learning_progress_ratio(2.0, 1.5) == pytest.approx(0.25)
    assert learning_progress_ratio(0.0, 1.0) == 0.0
    assert next_staleness(3, 0.25, 0.01, 3, 10) == 4
    assert next_staleness(10, 0.25, 0.01, 3, 10) == 10
    assert next_staleness(5, -0.05, 0.01, 3, 10) == 4
    assert next_staleness(3, -0.05, 0.01, 3, 10) == 3
    assert next_staleness(5, 0.005, 0.01, 3, 10) == 5


def _drive(policy, losses_per_window, workers=2):
    """Every worker reports the scripted loss of each window at every clock."""
    live = ctx(*range(workers))
    clock = 0
    trace = []
    for loss in losses_per_window:
        for _ in range(policy.window):
            clock += 1
            for w in range(workers):
                policy.on_applied(w, clock, live, loss=loss)
        trace.append(int(policy.staleness))
    return trace


def test_dtssp_widens_while_loss_falls_and_narrows_when_it_rises():
    p = DTSSPPolicy(3, 6, window=5)
    trace = _drive(p, [2.0, 1.6, 1.3, 1.1, 1.0, 0.95, 0.95, 1.05, 1.2])
    # window 0 sets the baseline; each later window applies the rule once
    assert trace == [3, 4, 5, 6, 6, 6, 6, 5, 4]
    assert len(p.changes) == 8
    first = p.changes[0]
    assert (first.window, first.old_staleness, first.new_staleness) == (1, 3, 4)
    assert (first.previous_loss, first.loss) == (pytest.approx(2.0), pytest.approx(1.6))
    assert first.lpr == pytest.approx(0.2)
    assert p.describe()["staleness"] == 4


def test_dtssp_window_closes_only_when_the_slowest_live_worker_passes_it():
    p = DTSSPPolicy(3, 10, window=2)
    live = ctx(0, 1)
    for c in (1, 2, 3, 4):
        p.on_applied(0, c, live, loss=1.0 if c <= 2 else 0.5)
    assert p.changes == []  # worker 1 has not finished window 0
    for c in (1, 2, 3, 4):
        p.on_applied(1, c, live, loss=1.0 if c <= 2 else 0.5)
    assert [c.new_staleness for c in p.changes] == [4]


def test_dtssp_validation():
    with pytest.raises(ValueError, match="min_staleness"):
        DTSSPPolicy(5, 3)
    with pytest.raises(ValueError, match="window"):
        DTSSPPolicy(window=0)


def test_specs_round_trip():
    for p in (AsyncPolicy(), SSPPolicy(3), DTSSPPolicy(3, 10), SyncReplicasPolicy(3), BSPPolicy(4)):
        again = policy_from_spec(p.spec(), num_workers=4)
        assert type(again) is type(p) and again.spec() == p.spec()
    assert make_policy("bsp", num_workers=3).replicas_to_aggregate == 3
    with pytest.raises(ConfigError, match="sideways"):
        make_policy("sideways")
    with pytest.raises(ConfigError, match="replicas_to_aggregate"):
        make_policy("sync_replicas", replicas_to_aggregate=0)


def test_detected_stragglers_are_not_waited_for():
    bsp = BSPPolicy(3)
    live = frozenset({0, 1, 2})
    assert not bsp.step_complete(frozenset({0, 1}), PolicyContext(0.0, live))
    assert bsp.step_complete(frozenset({0, 1}), PolicyContext(0.0, live, frozenset({2})))
    # an excluded worker's gradient still counts when it arrives first
    assert bsp.required(frozenset({2}), PolicyContext(0.0, live, frozenset({2}))) == 3
    ssp = SSPPolicy(1)
    for w, c in ((0, 5), (1, 5), (2, 1)):
        ssp.on_applied(w, c, ctx(0, 1, 2))
    assert ssp.on_pull(0, 5, PolicyContext(0.0, live)).wait
    assert not ssp.on_pull(0, 5, PolicyContext(0.0, live, frozenset({2}))).wait
