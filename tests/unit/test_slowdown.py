"""Slowdown schedules (pure)."""

import json

import pytest

from tfdist.slowdown import Slowdown, slowdown_from_env


def test_factor_and_delay():
    s = Slowdown(factor=3.0, delay_s=0.01)
    assert s.sleep_for(0, 0.1) == pytest.approx(0.21)
    assert Slowdown().sleep_for(5, 1.0) == 0.0


def test_first_half_of_every_epoch():
    s = Slowdown(factor=2.0, schedule="first_half", steps_per_epoch=10)
    assert [s.active(i) for i in range(20)] == ([True] * 5 + [False] * 5) * 2
    s2 = Slowdown(factor=2.0, schedule="second_half", steps_per_epoch=4)
    assert [s2.active(i) for i in range(4)] == [False, False, True, True]


def test_start_and_stop():
    s = Slowdown(delay_s=1.0, start_step=3, stop_step=5)
    assert [s.active(i) for i in range(7)] == [False, False, False, True, True, False, False]


def test_validation():
    with pytest.raises(ValueError, match="factor"):
        Slowdown(factor=0.5)
    with pytest.raises(ValueError, match="steps_per_epoch"):
        Slowdown(factor=2, schedule="first_half")
    with pytest.raises(ValueError, match="schedule"):
        Slowdown(schedule="sometimes")


def test_from_env():
    env = {"TFDIST_SLOWDOWN": json.dumps({"worker:2": {"factor": 3}})}
    assert slowdown_from_env("worker:2", env) == Slowdown(factor=3)
    assert slowdown_from_env("worker:1", env) is None
    assert slowdown_from_env("worker:1", {}) is None
    with pytest.raises(ValueError, match="JSON"):
        slowdown_from_env("worker:1", {"TFDIST_SLOWDOWN": "{"})
