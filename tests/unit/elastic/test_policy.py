"""ScalingPolicy with scripted throughput curves: knee, back-off, bounds, samples, utility vs price."""

import json
import math

import pytest

from tfdist.elastic import (
    Action,
    DeadlineUtility,
    LinearUtility,
    ScalingConfig,
    ScalingDecision,
    ScalingPolicy,
    scaling_efficiency,
    utility_from_dict,
)
from tfdist.errors import ConfigError


def knee_at_4(k):
    return 10.0 * min(k, 4)


def drops_after_3(k):
    return 10.0 * k if k <= 3 else 30.0 - 6.0 * (k - 3)


def amdahl(k, a=0.15):
    return 10.0 * k / (1 + a * (k - 1))


def drive(policy, curve, remaining=None, rounds=300):
    """decide -> applied -> observe, until the policy settles and says STAY. Returns every decision."""
    decisions = []
    for _ in range(rounds):
        d = policy.decide(remaining)
        decisions.append(d)
        if d.action is not Action.STAY:
            policy.applied(d.target)
        elif d.settled:
            return decisions
        policy.observe(policy.current, curve(policy.current), batches=50)
    raise AssertionError(f"the policy did not settle: {policy.describe()}")


def moves(decisions):
    return [(d.action, d.current, d.target) for d in decisions if d.action is not Action.STAY]


# --------------------------------------------------------------------------- convergence
def test_converges_to_the_knee_of_a_linear_then_flat_curve():
    policy = ScalingPolicy(ScalingConfig(max_workers=8))
    decisions = drive(policy, knee_at_4)
    assert moves(decisions) == [
        (Action.ADD, 1, 2), (Action.ADD, 2, 3), (Action.ADD, 3, 4), (Action.ADD, 4, 5), (Action.REMOVE, 5, 4),
    ]
    assert policy.current == 4 and policy.settled and policy.settled_size == 4
    final = decisions[-1]
    assert final.action is Action.STAY and final.settled and final.target == 4
    # every size was judged after exactly min_samples windows; 4 got one more window after the move back
    assert [tuple(s) for s in policy.history] == [(1, 10.0, 2), (2, 20.0, 2), (3, 30.0, 2), (4, 40.0, 3), (5, 40.0, 2)]
    # settled: more windows, even bad ones, do not reopen the search
    for _ in range(5):
        policy.observe(4, 1.0)
        assert policy.decide().action is Action.STAY


def test_backs_off_after_a_failed_step_with_the_numbers_behind_it():
    policy = ScalingPolicy(ScalingConfig(max_workers=8))
    decisions = drive(policy, drops_after_3)
    back = [d for d in decisions if d.action is Action.REMOVE]
    assert len(back) == 1
    d = back[0]
    assert (d.current, d.target, d.settled) == (4, 3, True)
    n = d.numbers
    assert (n["k_old"], n["k_new"], n["R_old"], n["R_new"]) == (3, 4, 30.0, 24.0)
    assert n["s"] == pytest.approx(-0.6) and n["s"] <= n["threshold"] == 0.1
    assert n["efficiency_passed"] is False
    assert n["best"] == 3 and n["best_by"] == "throughput" and n["candidates"] == {1: 10.0, 2: 20.0, 3: 30.0}
    assert "failed" in d.reason and "3" in d.reason
    logged = json.loads(json.dumps(d.to_dict()))
    assert logged["action"] == "remove" and logged["numbers"]["candidates"] == {"1": 10.0, "2": 20.0, "3": 30.0}
    assert ScalingDecision.from_dict(logged).action is Action.REMOVE
    assert policy.current == 3


def test_a_small_gain_below_the_threshold_is_not_kept():
    # 3 -> 4 still raises the throughput (30 -> 30.5) but s = 0.05 <= 0.1: go back to 3
    policy = ScalingPolicy(ScalingConfig(max_workers=8, min_samples=1))
    drive(policy, lambda k: 10.0 * k if k <= 3 else 30.5)
    assert policy.current == 3 and policy.settled_size == 3
    assert policy.throughput(4) > policy.throughput(3)
    assert policy.best_size() == 3


def test_efficiency_equal_to_the_threshold_fails():
    # 1 -> 2 gains exactly a tenth of a worker: s == 0.1 is not > 0.1
    policy = ScalingPolicy(ScalingConfig(max_workers=8, min_samples=1))
    decisions = drive(policy, lambda k: 10.0 + (k - 1))
    assert decisions[-2].numbers["s"] == 0.1 and moves(decisions) == [(Action.ADD, 1, 2), (Action.REMOVE, 2, 1)]


def test_amdahl_curve_stops_where_efficiency_drops_below_threshold():
    # s(k -> k+1) for a=0.15: 0.739, 0.654, 0.586, 0.531, 0.486, ...
    policy = ScalingPolicy(ScalingConfig(max_workers=8, efficiency_threshold=0.5))
    decisions = drive(policy, amdahl)
    back = moves(decisions)[-1]
    assert back == (Action.REMOVE, 6, 5)
    judged = [d for d in decisions if "s" in d.numbers]
    assert [round(d.numbers["s"], 3) for d in judged] == [0.739, 0.654, 0.586, 0.531, 0.486]
    assert policy.current == 5


def test_mean_of_windows_is_the_throughput_of_a_size():
    policy = ScalingPolicy(ScalingConfig(min_samples=2))
    policy.observe(1, 9.0)
    policy.observe(1, 11.0)
    assert policy.decide().action is Action.ADD
    policy.applied(2)
    policy.observe(2, 19.0)
    policy.observe(2, 23.0)
    d = policy.decide()
    assert d.numbers["R_old"] == 10.0 and d.numbers["R_new"] == 21.0
    assert d.numbers["s"] == pytest.approx(scaling_efficiency(1, 10.0, 2, 21.0)) == pytest.approx(1.1)


# --------------------------------------------------------------------------- bounds
def test_respects_max_workers_and_settles_there():
    policy = ScalingPolicy(ScalingConfig(max_workers=5))
    decisions = drive(policy, lambda k: 10.0 * k)  # scales forever
    assert max(d.target for d in decisions) == 5
    assert moves(decisions) == [(Action.ADD, k, k + 1) for k in range(1, 5)]
    last = decisions[-1]
    assert last.settled and last.action is Action.STAY and "max_workers" in last.reason
    assert last.numbers["s"] == pytest.approx(1.0)
    # the verdict is final: later windows at 5 that would fail the step do not make it move
    policy.observe(5, 1.0)
    policy.observe(5, 1.0)
    assert policy.decide().action is Action.STAY and policy.current == 5


def test_step_of_k_workers_capped_at_max_workers():
    policy = ScalingPolicy(ScalingConfig(max_workers=6, step=2))
    decisions = drive(policy, lambda k: 10.0 * k)
    assert moves(decisions) == [(Action.ADD, 1, 3), (Action.ADD, 3, 5), (Action.ADD, 5, 6)]
    assert policy.current == 6 and policy.settled


def test_step_of_k_workers_backs_off_past_the_knee():
    policy = ScalingPolicy(ScalingConfig(max_workers=8, step=2))
    decisions = drive(policy, lambda k: 10.0 * min(k, 5))
    assert moves(decisions) == [(Action.ADD, 1, 3), (Action.ADD, 3, 5), (Action.ADD, 5, 7), (Action.REMOVE, 7, 5)]
    remove = [d for d in decisions if d.action is Action.REMOVE][0]
    assert (remove.numbers["k_old"], remove.numbers["k_new"], remove.numbers["s"]) == (5, 7, 0.0)


def test_respects_min_workers():
    policy = ScalingPolicy(ScalingConfig(min_workers=3, max_workers=8))
    assert policy.current == 3  # initial_workers defaults to min_workers
    decisions = drive(policy, lambda k: 30.0)  # adding workers never helps
    assert moves(decisions) == [(Action.ADD, 3, 4), (Action.REMOVE, 4, 3)]
    assert min(d.target for d in decisions) == 3
    policy.applied(2)  # a worker crashed
    d = policy.decide()
    assert (d.action, d.target) == (Action.ADD, 3) and "min_workers" in d.reason


def test_start_at_max_workers_settles_at_once():
    policy = ScalingPolicy(ScalingConfig(min_workers=1, max_workers=4, min_samples=1), initial_workers=4)
    assert policy.decide().action is Action.STAY and not policy.decide().settled
    policy.observe(4, 40.0)
    d = policy.decide()
    assert d.action is Action.STAY and d.settled


# --------------------------------------------------------------------------- samples
def test_does_not_decide_before_min_samples():
    policy = ScalingPolicy(ScalingConfig(min_samples=3))
    for seen in range(3):
        d = policy.decide()
        assert (d.action, d.settled) == (Action.STAY, False)
        assert f"{seen} of 3" in d.reason and d.numbers["samples"] == seen
        policy.observe(1, 10.0)
    d = policy.decide()
    assert (d.action, d.target) == (Action.ADD, 2)
    policy.applied(2)
    policy.observe(1, 10.0)  # a window at another size does not count for 2
    for _ in range(2):
        policy.observe(2, 20.0)
        assert policy.decide().action is Action.STAY
    policy.observe(2, 20.0)
    assert policy.decide().action is Action.ADD


def test_a_verdict_is_final_until_applied():
    policy = ScalingPolicy(ScalingConfig(min_samples=1))
    policy.observe(1, 10.0)
    policy.decide()
    policy.applied(2)
    policy.observe(2, 20.0)
    first = policy.decide()
    assert first.action is Action.ADD
    policy.observe(2, 0.5)  # a terrible window arrives before the engine carried out the ADD
    assert policy.decide() == first


def test_a_crash_during_exploration_returns_to_the_accepted_size():
    policy = ScalingPolicy(ScalingConfig(min_samples=1, max_workers=8))
    for k, r in ((1, 10.0), (2, 20.0), (3, 30.0)):
        policy.observe(k, r)
        d = policy.decide()
        policy.applied(d.target)
    assert policy.current == 4
    policy.applied(3)  # a worker crashed: 3 was accepted already, no need to measure it again
    d = policy.decide()
    assert (d.action, d.current, d.target) == (Action.ADD, 3, 4)


def test_a_settled_policy_moves_back_after_a_crash():
    policy = ScalingPolicy(ScalingConfig(max_workers=8))
    drive(policy, knee_at_4)
    policy.applied(3)
    d = policy.decide()
    assert (d.action, d.target, d.settled) == (Action.ADD, 4, True)


# --------------------------------------------------------------------------- utility and price
@pytest.mark.parametrize("price, settled_at", [(0.0, 8), (0.2, 5), (0.5, 3)])
def test_with_a_utility_expensive_workers_stop_earlier(price, settled_at):
    # Amdahl a=0.15: every step passes the efficiency test (s >= 0.415 > 0.1); with b batches left,
    # k * T_k grows by b * a / R_1 = 540 worker-seconds per step, so dC = 540 * P, while the time
    # saved falls: 1530, 510, 255, 153, 102, 72.9, 54.6 s (LinearUtility(1): dU = time saved).
    config = ScalingConfig(max_workers=8, utility=LinearUtility(value_per_s=1.0), price_per_worker_s=price)
    policy = ScalingPolicy(config)
    drive(policy, amdahl, remaining=36000)
    assert policy.current == settled_at == policy.settled_size


def test_utility_numbers_of_the_failed_step():
    config = ScalingConfig(max_workers=8, utility=LinearUtility(value_per_s=1.0), price_per_worker_s=0.5)
    policy = ScalingPolicy(config)
    decisions = drive(policy, amdahl, remaining=36000)
    d = [d for d in decisions if d.action is Action.REMOVE][0]
    n = d.numbers
    assert (n["k_old"], n["k_new"], d.target) == (3, 4, 3)
    assert n["efficiency_passed"] is True and n["utility_passed"] is False
    assert n["T_old"] == pytest.approx(36000 / amdahl(3)) == pytest.approx(1560.0)
    assert n["T_new"] == pytest.approx(1305.0)
    assert n["C_old"] == pytest.approx(1560.0 * 3 * 0.5) and n["C_new"] == pytest.approx(1305.0 * 4 * 0.5)
    assert n["dU"] == pytest.approx(255.0) and n["dC"] == pytest.approx(270.0)
    assert n["U_new"] - n["U_old"] == n["dU"]
    # best by U - C over the accepted sizes 1, 2, 3
    assert n["best_by"] == "utility_minus_cost" and set(n["candidates"]) == {1, 2, 3}
    assert max(n["candidates"], key=n["candidates"].get) == 3
    json.dumps(d.to_dict())


def test_utility_test_is_skipped_without_remaining_batches():
    config = ScalingConfig(max_workers=8, utility=LinearUtility(value_per_s=1.0), price_per_worker_s=0.5)
    policy = ScalingPolicy(config)
    decisions = drive(policy, amdahl)  # remaining_batches unknown
    assert policy.current == 8  # efficiency alone: every step passes
    judged = [d for d in decisions if "s" in d.numbers]
    assert judged and all(d.numbers["utility_skipped"] for d in judged)
    assert all("utility test skipped" in d.reason for d in judged)
    assert all("U_old" not in d.numbers for d in judged)


def test_price_without_utility_is_logged_not_used():
    policy = ScalingPolicy(ScalingConfig(max_workers=8, price_per_worker_s=100.0))
    decisions = drive(policy, knee_at_4, remaining=1000)
    assert policy.current == 4
    d = [d for d in decisions if d.action is Action.REMOVE][0]
    assert d.numbers["C_new"] == pytest.approx(1000 / 40 * 5 * 100.0) and "U_new" not in d.numbers


def test_linear_and_deadline_utilities():
    u = LinearUtility(value_per_s=2.0)
    assert u(10.0) == -20.0 and u(5.0) - u(10.0) == 10.0
    hard = DeadlineUtility(deadline_s=100.0, value=50.0)
    assert [hard(50.0), hard(100.0), hard(100.5)] == [50.0, 50.0, 0.0]
    soft = DeadlineUtility(deadline_s=100.0, value=50.0, decay_s=200.0)
    assert [soft(100.0), soft(200.0), soft(300.0), soft(1000.0)] == [50.0, 25.0, 0.0, 0.0]
    assert utility_from_dict(soft.to_dict()).to_dict() == soft.to_dict()
    assert utility_from_dict({"kind": "linear", "value_per_s": 3}).value_per_s == 3.0


def test_a_deadline_makes_the_step_that_meets_it_pay():
    # 1 worker would finish in 3600 s, 2 in 2070 s: only the second meets a 2500 s deadline worth 1000
    config = ScalingConfig(max_workers=8, utility=DeadlineUtility(2500.0, 1000.0), price_per_worker_s=0.1)
    policy = ScalingPolicy(config)
    decisions = drive(policy, amdahl, remaining=36000)
    assert moves(decisions) == [(Action.ADD, 1, 2), (Action.ADD, 2, 3), (Action.REMOVE, 3, 2)]
    assert decisions[-2].numbers["dU"] == 0.0  # both 2 and 3 workers meet the deadline


# --------------------------------------------------------------------------- config and inputs
@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"min_workers": 0}, "min_workers"),
        ({"min_workers": 4, "max_workers": 2}, "max_workers"),
        ({"step": 0}, "step"),
        ({"step": 1.5}, "step"),
        ({"interval_batches": 0}, "interval_batches"),
        ({"min_samples": 0}, "min_samples"),
        ({"min_samples": True}, "min_samples"),
        ({"efficiency_threshold": 2.0}, "efficiency_threshold"),
        ({"efficiency_threshold": math.nan}, "efficiency_threshold"),
        ({"price_per_worker_s": -1.0}, "price_per_worker_s"),
        ({"utility": "fast"}, "utility"),
        ({"utility": {"kind": "exponential"}}, "utility"),
        ({"utility": {"kind": "linear", "value_per_s": -1}}, "utility.value_per_s"),
        ({"utility": {"kind": "deadline", "deadline_s": 0, "value": 1}}, "utility.deadline_s"),
    ],
)
def test_config_errors_name_the_field_and_the_value(kwargs, field):
    with pytest.raises(ConfigError) as err:
        ScalingConfig(**kwargs)
    message = str(err.value)
    assert f"`{field}`" in message and "Received:" in message
    assert "Give" in message or "Write" in message  # says what to write instead


def test_initial_workers_must_be_within_bounds():
    with pytest.raises(ConfigError, match="initial_workers.*Received: initial_workers=9"):
        ScalingPolicy(ScalingConfig(max_workers=8), initial_workers=9)
    assert ScalingPolicy(ScalingConfig(max_workers=8), initial_workers=3).current == 3


def test_config_round_trips_through_dicts():
    config = ScalingConfig(max_workers=16, step=4, price_per_worker_s=0.01,
                           utility={"kind": "deadline", "deadline_s": 3600, "value": 10.0})
    assert isinstance(config.utility, DeadlineUtility)
    data = json.loads(json.dumps(config.to_dict()))
    assert ScalingConfig.from_dict(data).to_dict() == config.to_dict()
    with pytest.raises(ConfigError, match="max_worker"):
        ScalingConfig.from_dict({"max_worker": 4})
    elastic_section = {**data, "enabled": True, "max_spares": 1}
    assert ScalingConfig.from_dict(elastic_section, strict=False).step == 4


def test_observe_and_decide_reject_bad_inputs():
    policy = ScalingPolicy()
    for bad in ({"workers": 0, "throughput": 1.0}, {"workers": 1, "throughput": 0.0},
                {"workers": 1, "throughput": math.inf}, {"workers": 1, "throughput": 1.0, "batches": -1}):
        with pytest.raises(ValueError):
            policy.observe(**bad)
    with pytest.raises(ValueError, match="remaining_batches"):
        policy.decide(remaining_batches=-5)
    assert policy.history == []


def test_state_dict_round_trips_through_json():
    policy = ScalingPolicy(ScalingConfig(max_workers=8))
    drive(policy, knee_at_4)
    state = json.loads(json.dumps(policy.state_dict()))
    restored = ScalingPolicy(ScalingConfig(max_workers=8))
    restored.load_state_dict(state)
    assert restored.history == policy.history and restored.settled_size == 4
    assert restored.decide() == policy.decide()
    restored.applied(2)
    assert (restored.decide().action, restored.decide().target) == (Action.ADD, 4)
    assert "settled at 4" in policy.describe()
