"""Variables that join a running job (issue 21 item 8), the pure parts: placement, the store's rules, schedules.

The join itself, with real PS tasks and Keras models in every mode, is
``tests/integration/test_variables_join.py``.
"""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tfdist.config import JobConfig
from tfdist.consistency import AsyncPolicy, policy_from_spec
from tfdist.ps import checkpoint as ckpt
from tfdist.ps.checkpointer import ShardCheckpointer
from tfdist.ps.placement import GreedyPlacement, RoundRobinPlacement, VariableSpec
from tfdist.ps.protocol import RequestError
from tfdist.ps.server import ParameterService
from tfdist.ps.store import ParameterStore
from tfdist.ps.update_session import relative_update
from tfdist.strategies._schedules import (Adaptive, Blocking, EveryK, LocalOnly, LoneWorker, Overlapped, choose_schedule,
                                          measured_keys, steps_per_exchange, steps_within_bound)

BASE = [VariableSpec("0000/a", "float32", (4, 2)), VariableSpec("0001/b", "float32", (3,))]
NEW = [VariableSpec("0002/head/kernel", "float32", (2, 2)), VariableSpec("0003/head/bias", "float32", (2,))]


def call(store, method, tensors=None, **meta):
    return ParameterService(store).call(method, tensors, **meta)


def started_store(**kwargs):
    store = ParameterStore(AsyncPolicy(), num_workers=2, **kwargs)
    call(store, "Init", {s.key: np.ones(s.shape, np.float32) for s in BASE}, worker=0,
         specs=[s.to_dict() for s in BASE], num_workers=2)
    return store


# ------------------------------------------------------------------ placement
@pytest.mark.parametrize("placement", [RoundRobinPlacement(), RoundRobinPlacement(16), GreedyPlacement(),
                                       GreedyPlacement(16)])
def test_placement_goes_on_after_the_variables_placed_already_and_does_not_depend_on_the_grouping(placement):
    plan = placement.place(BASE, 3)
    at_once = placement.extend(plan, BASE, NEW)
    one_by_one = placement.extend(placement.extend(plan, BASE, NEW[:1]), BASE + NEW[:1], NEW[1:])
    assert at_once == one_by_one
    assert at_once.shards[: len(plan.shards)] == plan.shards  # the old variables stay where they are
    assert {s.var_key for s in at_once.shards} == {s.key for s in BASE + NEW}
    if isinstance(placement, RoundRobinPlacement):
        assert at_once == placement.place(BASE + NEW, 3)  # round robin: as if they had been there from the start


# ------------------------------------------------------------------ the store
def test_the_first_sender_gives_the_job_its_value_and_a_later_one_gets_it():
    store = started_store()
    first = {s.key: np.full(s.shape, 1.5, np.float32) for s in NEW}
    meta, values = call(store, "Extend", first, worker=1, specs=[s.to_dict() for s in NEW])
    assert sorted(meta["added"]) == sorted(s.key for s in NEW)
    second = {s.key: np.full(s.shape, -7.0, np.float32) for s in NEW}
    meta, values = call(store, "Extend", second, worker=0, specs=[s.to_dict() for s in NEW])
    assert meta["added"] == []
    for s in NEW:
        np.testing.assert_array_equal(values[s.key], first[s.key])
    assert store.status()["joined_variables"] == 2


def test_a_join_with_another_shape_is_refused_whole_naming_the_variable():
    store = started_store()
    call(store, "Extend", {NEW[0].key: np.zeros((2, 2), np.float32)}, worker=0, specs=[NEW[0].to_dict()])
    before = store.state()
    other = [{**NEW[0].to_dict(), "shape": [3, 2]}, NEW[1].to_dict()]
    with pytest.raises(RequestError, match="head/kernel") as e:
        call(store, "Extend", {NEW[0].key: np.zeros((3, 2), np.float32), NEW[1].key: np.zeros(2, np.float32)},
             worker=1, specs=other)
    assert e.value.grpc_code == "FAILED_PRECONDITION"
    assert NEW[1].key not in store.state()["values"] and store.state()["version"] == before["version"]


def test_a_worker_that_starts_again_may_leave_joined_variables_out_but_not_the_job_s_first_ones():
    store = started_store()
    call(store, "Extend", {s.key: np.zeros(s.shape, np.float32) for s in NEW}, worker=0,
         specs=[s.to_dict() for s in NEW])
    base = [s.to_dict() for s in BASE]
    assert call(store, "WaitInit", worker=1, timeout_s=0.1, specs=base)[0]["initialized"]  # before it built its head
    assert call(store, "WaitInit", worker=1, timeout_s=0.1, specs=base + [NEW[0].to_dict()])[0]["initialized"]
    with pytest.raises(RequestError, match="differ") as e:  # a model without one of the job's first variables
        call(store, "WaitInit", worker=1, timeout_s=0.1, specs=base[:1])
    assert e.value.grpc_code == "FAILED_PRECONDITION"
    with pytest.raises(RequestError, match="differ"):  # a variable the job does not know: it must join first
        call(store, "WaitInit", worker=1, timeout_s=0.1, specs=base + [{**NEW[0].to_dict(), "key": "0002/x"}])


def test_joined_variables_are_in_the_checkpoint_and_a_restored_task_still_knows_they_joined(tmp_path):
    store = started_store()
    call(store, "Extend", {s.key: np.full(s.shape, 3.0, np.float32) for s in NEW}, worker=0,
         specs=[s.to_dict() for s in NEW])
    writer = ShardCheckpointer(store, str(tmp_path), 0, 1).start()
    writer.checkpoint_now(timeout=30)
    writer.close(final=False)
    restored = ParameterStore(None, num_workers=2)
    assert ShardCheckpointer(restored, str(tmp_path), 0, 1).restore() is not None
    np.testing.assert_array_equal(restored.state()["values"][NEW[0].key], np.full((2, 2), 3.0, np.float32))
    assert restored.state()["joined"] == [s.key for s in NEW]
    assert call(restored, "WaitInit", worker=1, timeout_s=0.1, specs=[s.to_dict() for s in BASE])[0]["initialized"]
    shard = ckpt.read_shard(str(tmp_path), 0)
    assert shard.meta["joined"] == [s.key for s in NEW]


# ------------------------------------------------------------------ schedules
def _config(**strategy):
    return JobConfig.from_dict({"cluster": {"ps": 1, "worker": strategy.pop("workers", 2)}, "strategy": strategy})


@pytest.mark.parametrize("spec, config, single, expected", [
    ({"policy": "async"}, {}, False, "every-auto (1..8, overlapped)"),  # the default: the steps per exchange adapt
    ({"policy": "async"}, {"exchange_every": 1}, False, "overlapped"),
    ({"policy": "async"}, {"overlap_exchange": False}, False, "every-auto (1..8, blocking)"),
    ({"policy": "async"}, {"exchange_every": 1, "overlap_exchange": False}, False, "blocking"),
    ({"policy": "ssp", "staleness": 2}, {}, False, "blocking"),
    ({"policy": "dtssp"}, {}, False, "blocking"),
    ({"policy": "async"}, {"exchange_every": 4}, False, "every-4 (overlapped)"),
    ({"policy": "async"}, {"exchange_every": 4, "overlap_exchange": False}, False, "every-4 (blocking)"),
    ({"policy": "async"}, {}, True, "local-only"),
    ({"policy": "async"}, {"workers": 1}, False, "lone-worker"),
    ({"policy": "async"}, {"workers": 1, "lone_worker_exchange_s": 0}, False, "every-auto (1..8, overlapped)"),
    ({"policy": "ssp", "staleness": 2}, {"workers": 1}, False, "blocking"),
    ({"policy": "async"}, {"exchange_every": "auto"}, False, "every-auto (1..8, overlapped)"),
    ({"policy": "async"}, {"exchange_every": "auto", "exchange_every_max": 3, "overlap_exchange": False}, False,
     "every-auto (1..3, blocking)"),
    ({"policy": "async"}, {"exchange_every": "auto"}, True, "local-only"),  # one process: no exchange at all
    ({"policy": "async"}, {"exchange_every": "auto", "workers": 1}, False, "lone-worker"),
])
def test_the_update_path_chooses_its_schedule_once_from_the_mode_and_the_config(spec, config, single, expected):
    schedule = choose_schedule(_config(**config), policy_from_spec(spec, 2), worker_id=0, single_process=single)
    assert schedule.name == expected
    if isinstance(schedule, LocalOnly):  # what it falls back to when a step must run Python
        assert isinstance(schedule.fallback, (EveryK if not isinstance(schedule, LoneWorker) else Overlapped))


def test_a_schedule_holds_the_steps_its_k_says():
    every3 = EveryK(Blocking(), 3)
    assert [every3.holds(n) for n in range(3)] == [True, True, False]
    assert not Blocking().holds(0) and not Overlapped().holds(0)


def test_auto_takes_the_fewest_steps_that_keep_the_exchange_within_its_share_of_the_steps_cpu():
    assert steps_per_exchange(0.004, 0.010, 0.1, 8) == 4  # 4 ms of exchange over 4 steps of 10 ms: 10 %
    assert steps_per_exchange(0.0041, 0.010, 0.1, 8) == 5
    assert steps_per_exchange(0.004, 0.100, 0.1, 8) == 1
    assert steps_per_exchange(1.0, 0.001, 0.1, 8) == 8  # bounded by exchange_every_max
    assert steps_per_exchange(0.004, 0.0, 0.1, 8) == 8  # no step CPU measured: the bound


def test_auto_follows_the_measured_cpu_and_holds_steps_by_it():
    """Counters as a worker reads them at each exchange: process CPU and the session's exchange CPU."""
    auto = Adaptive(Overlapped(), most=8, smoothing=1.0)  # no smoothing: each window decides
    assert auto.every == 1 and auto.overlapped and auto.observe(1.0, 0.5, 1) == 1  # the first read starts a window
    # 1 step: 14 ms of process CPU, of which 4 ms the exchange -> a step 10 ms, the exchange 40 % of it: 4 steps
    assert auto.observe(1.014, 0.504, 1) == 4
    assert [auto.holds(n) for n in range(4)] == [True, True, True, False]
    # 4 steps of 30 ms and an exchange of 4 ms: the exchange is 13 % of one step, within 10 % of two
    assert auto.observe(1.014 + 0.124, 0.508, 4) == 2
    assert (auto.exchange_cpu_s, round(auto.step_cpu_s, 6)) == (pytest.approx(0.004), 0.03)
    smooth = Adaptive(Blocking(), most=8, smoothing=0.5)
    smooth.observe(0.0, 0.0, 1)
    smooth.observe(0.014, 0.004, 1)  # 4 / 10 ms
    # smoothed: a step (10 + 100) / 2 = 55 ms, an exchange 4 ms: 0.73 steps' share; from 4 steps down to 2, not 1
    # (fewer steps only with half a step to spare: AUTO_HYSTERESIS_STEPS)
    assert smooth.observe(0.014 + 0.104, 0.008, 1) == 2
    assert smooth.step_cpu_s == pytest.approx(0.055)
    assert smooth.observe(0.118 + 0.104, 0.012, 1) == 2  # a step 77.5 ms: 0.52 steps' share, still 2
    assert smooth.observe(0.222 + 0.104, 0.016, 1) == 1  # 88.75 ms: 0.45, half a step to spare: 1


def test_an_update_is_measured_by_its_largest_relative_change():
    values = {"a": np.full(4, 2.0, np.float32), "b": np.ones((2, 2), np.float32), "zero": np.zeros(3, np.float32)}
    deltas = {"a": np.full(4, 0.02, np.float32), "b": np.full((2, 2), 0.05, np.float32),
              "zero": np.zeros(3, np.float32)}
    assert relative_update(deltas, values, {"a"}) == pytest.approx(0.01)
    assert relative_update(deltas, values, {"a", "b"}) == pytest.approx(0.05)  # the largest of them
    assert relative_update(deltas, values, {"zero", "missing"}) == 0.0  # unchanged zeros; unknown keys skipped
    assert relative_update({"zero": np.ones(3, np.float32)}, values, {"zero"}) == float("inf")
    specs = [VariableSpec("0/k", "float32", (4, 3)), VariableSpec("1/b", "float32", (3,)),
             VariableSpec("2/steps", "int64", (2, 2)), VariableSpec("3/mean", "float32", (3, 3), trainable=False)]
    assert measured_keys(specs) == {"0/k"}  # trainable floating matrices only
    assert measured_keys(specs[1:]) == {"1/b"}  # no matrix: every trainable floating variable


def test_auto_never_holds_more_steps_than_the_update_size_allows():
    """A job whose weights move fast (a large learning rate) keeps exchanging every step, whatever the CPU says."""
    assert steps_within_bound(0.002, 1, 0.01) == pytest.approx(5.0)
    assert steps_within_bound(0.0, 3, 0.01) == float("inf")
    auto = Adaptive(Overlapped(), most=8, smoothing=1.0, update_bound=0.01)
    auto.observe(1.0, 0.5, 1, update_size=0.002)
    # the CPU alone would take 4 steps (previous test); 0.3 % per step allows 3
    assert auto.observe(1.014, 0.504, 1, update_size=0.003) == 3
    assert auto.observe(1.014 + 0.042, 0.508, 3, update_size=0.04) == 1  # 3 steps moved 4 %: every step
    assert auto.observe(1.1, 0.512, 1, update_size=None) == 1  # no measure (nothing trainable): the last bound holds
    assert auto.observe(1.2, 0.6, 1, update_size=1e-5) == 8  # barely moving, costly exchanges: most


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 1), st.floats(0, 0.1), st.integers(1, 8),
                          st.one_of(st.none(), st.floats(0, 10), st.just(float("inf"))), st.floats(0, 1)),
                min_size=1, max_size=12),
       st.integers(1, 8))
def test_auto_chooses_between_one_and_its_most_steps_whatever_it_measures(reads, most):
    auto = Adaptive(Blocking(), most=most)
    process = exchange = server = 0.0
    for dp, de, steps, size, ds in reads:
        process, exchange, server = process + dp, exchange + de, server + ds
        assert 1 <= auto.observe(process, exchange, steps, update_size=size, server_cpu_s=server) <= most


# ------------------------------------------------------------------ the worker's registry
def test_a_join_loads_only_the_joined_variables_and_keeps_the_other_local_write_marks():
    """Loading the job's values of joined variables must not undo a local write of another (load_weights on the
    base, then a new head: the base's loaded weights are still this worker's to send)."""
    import tensorflow as tf

    from tfdist.strategies._variable_registry import VariableRegistry

    registry = VariableRegistry()
    base = tf.Variable(np.zeros(3, np.float32), name="base")
    registry.register(base, trainable=True)
    base.assign(np.ones(3, np.float32))  # a local write (set_weights, load_weights)
    assert registry.written == {registry.key_of(base)}
    head = tf.Variable(np.zeros(2, np.float32), name="head")
    registry.register(head, trainable=True, joins=True)
    assert [s.key for s in registry.peek_pending()] == [registry.key_of(head)]
    registry.assign({registry.key_of(base): np.full(3, 9.0, np.float32)})  # a read while the head waits: skipped
    np.testing.assert_array_equal(base.numpy(), np.ones(3, np.float32))  # (kept: written locally)
    registry.joined(registry.peek_pending())
    registry.assign({registry.key_of(head): np.full(2, 4.0, np.float32)}, keep_written=False, partial=True)
    np.testing.assert_array_equal(head.numpy(), np.full(2, 4.0, np.float32))
    assert registry.written == {registry.key_of(base)} and not registry.pending


def test_auto_counts_what_the_ps_tasks_report_in_an_exchanges_cpu_not_in_the_steps():
    """On one host the PS tasks take the workers' cores: their reported CPU counts as the exchange's."""
    auto = Adaptive(Overlapped(), most=8, smoothing=1.0)
    auto.observe(1.0, 0.5, 1, server_cpu_s=2.0)
    # a step of 40 ms (44 of process CPU, 4 of them the worker's exchange): alone 4 ms is a tenth -> 1 step (below);
    # plus 6 ms the PS tasks reported: 10 ms an exchange, a quarter of a step -> 3 steps (the step stays 40 ms)
    assert auto.observe(1.044, 0.504, 1, server_cpu_s=2.006) == 3
    assert (auto.step_cpu_s, auto.exchange_cpu_s, auto.server_cpu_s) == (
        pytest.approx(0.040), pytest.approx(0.010), pytest.approx(0.006))
    # nothing reported this time: the worker's 4 ms, one step's share exactly: 2 steps (down from 3 only as far
    # as keeps half a step to spare), then 1 once the exchange is at most half a step's share
    assert auto.observe(1.088, 0.508, 1, server_cpu_s=2.006) == 2
    assert auto.observe(1.130, 0.510, 1, server_cpu_s=2.006) == 1  # 2 ms of a 40 ms step
    poisoned = Adaptive(Overlapped(), most=8, smoothing=0.5)  # a running total gone infinite counts nothing
    poisoned.observe(1.0, 0.5, 1, server_cpu_s=1.0)
    for i, total in enumerate((float("inf"), float("inf"), float("nan")), 1):  # steps of 40 ms, exchanges of 4
        assert poisoned.observe(1.0 + 0.044 * i, 0.5 + 0.004 * i, 1, server_cpu_s=total) == 1
        assert math.isfinite(poisoned.exchange_cpu_s) and poisoned.server_cpu_s == 0.0
    no_reports = Adaptive(Overlapped(), most=8, smoothing=1.0)
    no_reports.observe(1.0, 0.5, 1)
    assert no_reports.observe(1.044, 0.504, 1) == 1 and no_reports.server_cpu_s == 0.0


def test_auto_does_not_flip_between_two_choices_on_a_measure_near_their_boundary():
    """An exchange about one step's share (0.9, 1.1, 0.95, 1.05...): the rule alone flips between 1 and 2 steps per
    exchange; with half a step to spare it stays at 2 once there."""
    from tfdist.strategies._schedules import steps_with_hysteresis

    shares = [1.1, 0.9, 1.05, 0.95, 1.2, 0.8, 0.7, 1.0]
    alone = [steps_per_exchange(0.004 * r, 0.040, 0.1, 8) for r in shares]
    assert alone == [2, 1, 2, 1, 2, 1, 1, 1]
    kept, current = [], 1
    for r in shares:
        current = steps_with_hysteresis(0.004 * r, 0.040, 0.1, 8, current)
        kept.append(current)
    assert kept == [2] * len(shares)
    assert steps_with_hysteresis(0.004 * 0.5, 0.040, 0.1, 8, 2) == 1  # half a step's share: down
    assert steps_with_hysteresis(0.004 * 3.4, 0.040, 0.1, 8, 6) == 4  # 3.4 steps' share: from 6 to 4, not 5 or 6


@settings(max_examples=300, deadline=None)
@given(st.floats(0, 1), st.floats(0, 1), st.integers(1, 8), st.integers(1, 8))
def test_hysteresis_only_ever_keeps_more_steps_than_the_rule_never_more_than_it_had(exchange, step, most, current):
    from tfdist.strategies._schedules import steps_with_hysteresis

    current = min(current, most)
    wanted = steps_per_exchange(exchange, step, 0.1, most)
    got = steps_with_hysteresis(exchange, step, 0.1, most, current)
    assert 1 <= got <= most and got >= wanted
    assert got == wanted if wanted >= current else got <= current
