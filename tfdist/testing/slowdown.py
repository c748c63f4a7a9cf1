"""Kept for old imports: the slowdown injector lives in :mod:`tfdist.slowdown` (the strategies apply it)."""

from tfdist.slowdown import ENV_SLOWDOWN, SCHEDULES, Slowdown, StepSlowdown, slowdown_from_env

__all__ = ["Slowdown", "SlowdownCallback", "slowdown_from_env", "ENV_SLOWDOWN", "StepSlowdown", "SCHEDULES"]  # noqa: F822


def __getattr__(name: str):  # the Keras callback imports keras: only when asked for
    if name == "SlowdownCallback":
        from tfdist import slowdown

        return slowdown.SlowdownCallback
    raise AttributeError(name)
