"""tfdist.ps.memory: glibc malloc settings for large messages."""

import sys

import pytest

from tfdist.ps import memory


@pytest.fixture
def fresh(monkeypatch):
    monkeypatch.setattr(memory, "_done", None)
    for name in memory._USER_ENV + ("GLIBC_TUNABLES",):
        monkeypatch.delenv(name, raising=False)
    return memory


def test_applies_once_on_glibc(fresh):
    if not sys.platform.startswith("linux"):
        pytest.skip("glibc only")
    assert fresh.tune_malloc() is True
    assert fresh.tune_malloc() is True  # cached, no second mallopt


def test_the_users_own_malloc_settings_win(fresh, monkeypatch):
    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", "131072")
    assert fresh.tune_malloc() is False
