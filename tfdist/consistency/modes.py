"""One descriptor per consistency mode: what the config, the strategies, the runtime and the PS read about it.

A mode is a policy (its rules, :mod:`tfdist.consistency.base`) plus a
:class:`ConsistencyMode`: its name, its parameters with their defaults, its
exchange path, whether it can exchange less often than every step, how many
workers it needs to go on, and the checks a job must pass to run it (a step
cannot aggregate more gradients than the job has workers). Nothing else in
tfdist lists the modes or branches on their names: the config accepts the
registered names, the strategies and the PS build the policy through
:meth:`ConsistencyMode.policy`, the launcher asks :meth:`ConsistencyMode.can_lose`
whether a job survives a failed worker.

Adding a mode (or a variant of one, e.g. SSP with another default bound) is a
policy class plus one :func:`register_mode` call::

    class WideSSP(SSPPolicy):
        name = "ssp_wide"

    register_mode(ConsistencyMode(
        "ssp_wide", "update", {"staleness": 5},
        lambda p, n: WideSSP(p["staleness"]), "SSP with a bound of 5 by default"))
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping

from tfdist.errors import ConfigError

__all__ = ["ConsistencyMode", "ExchangePath", "EXCHANGE_PATHS", "MODES", "register_mode", "mode_of", "mode_names",
           "exchange_path"]


@dataclass(frozen=True)
class ExchangePath:
    """What a mode's workers send and how the PS treats it (DESIGN.md §4.1), named fact by fact.

    Two paths exist; the worker runtime, the session and the store each have
    one slice per path (``strategies/_update_path.py`` / ``_gradient_path.py``,
    ``UpdateSession`` / ``GradientSession``, ``ps/_update_requests.py`` /
    ``ps/_gradient_requests.py``). Code that must treat the paths differently
    outside those slices reads one of these facts, never the path's name.

    Attributes:
        name: ``"update"`` (workers send the change their own optimizer made)
            or ``"gradient"`` (gradients the PS aggregates per global step).
        reads_carry_clock: A read (pull, lookup) tells the policy the reader's
            clock and waits as it decides (the staleness bound).
        steps_are_global: A shard's position is the gradient barrier's state
            step, the same on every PS task (so checkpoints are cuts at one
            step, scheduled by the chief); otherwise the batches it applied.
        row_pushes_name_step: A ``PushRows`` is counted towards a named global
            step (applied when that step completes), not applied at once.
    """

    name: str
    reads_carry_clock: bool
    steps_are_global: bool
    row_pushes_name_step: bool


#: The exchange paths, by name.
EXCHANGE_PATHS: dict[str, ExchangePath] = {
    "update": ExchangePath("update", reads_carry_clock=True, steps_are_global=False, row_pushes_name_step=False),
    "gradient": ExchangePath("gradient", reads_carry_clock=False, steps_are_global=True, row_pushes_name_step=True),
}
PATHS = tuple(EXCHANGE_PATHS)


def exchange_path(name: str) -> ExchangePath:
    """The path named ``name`` (``ValueError`` naming the choices otherwise)."""
    try:
        return EXCHANGE_PATHS[name]
    except (KeyError, TypeError):
        raise ValueError(f"Unknown exchange path {name!r}; use one of {PATHS}.") from None


@dataclass(frozen=True)
class ConsistencyMode:
    """A consistency mode as every part of tfdist sees it.

    Attributes:
        name: The config's ``strategy.consistency`` and the policy's ``name``.
        path: ``"update"`` or ``"gradient"``.
        params: The parameters its spec carries, with their defaults
            (``None``: derived from the job, e.g. ``replicas_to_aggregate``
            = every worker).
        build: ``build(params, num_workers)`` → the policy (``params``: every
            parameter, defaults filled in).
        summary: One line for docs and errors.
        local_steps: Whether workers may exchange less often than every step
            (``strategy.exchange_every`` > 1): only where nothing counts steps.
        needs_all_aggregated: A step needs ``replicas_to_aggregate`` workers
            (SyncReplicas): the job survives a lost worker only while that
            many remain. Otherwise the mode does without any worker.
    """

    name: str
    path: str
    params: Mapping[str, Any]
    build: Callable[[Mapping[str, Any], int], Any]
    summary: str
    local_steps: bool = False
    needs_all_aggregated: bool = False

    def __post_init__(self):
        if self.path not in PATHS:
            raise ValueError(f"Mode {self.name!r}: path must be one of {PATHS}. Received: {self.path!r}.")

    @property
    def exchange(self) -> ExchangePath:
        """The facts of this mode's exchange path."""
        return EXCHANGE_PATHS[self.path]

    def policy(self, spec: Mapping[str, Any] | None = None, num_workers: int = 1):
        """The policy for ``spec`` (its parameters; missing ones take the mode's defaults).

        Raises:
            ConfigError: a parameter is unknown or invalid.
        """
        spec = dict(spec or {})
        spec.pop("policy", None)
        unknown = set(spec) - set(self.params) - {"refresh_every_step"}
        if unknown:
            raise ConfigError(f"Consistency {self.name!r} takes the parameters {sorted(self.params)}. "
                              f"Received unknown: {sorted(unknown)}.")
        params = {**self.params, **spec}
        try:
            return self.build(params, num_workers)
        except (KeyError, TypeError, ValueError, OverflowError) as e:
            raise ConfigError(f"Bad consistency settings {dict(spec, policy=self.name)!r}: {e}") from e

    def aggregation_size(self, spec: Mapping[str, Any], num_workers: int) -> int | None:
        """Gradient path: ``M``, the gradients each step aggregates; ``None`` on the update path."""
        if not self.exchange.steps_are_global:
            return None
        m = spec.get("replicas_to_aggregate")
        return int(m) if m is not None else num_workers

    def check_workers(self, spec: Mapping[str, Any], num_workers: int) -> None:
        """Raises :class:`ConfigError` when the job cannot run this mode with ``num_workers`` workers."""
        m = self.aggregation_size(spec, num_workers)
        if m is not None and m > num_workers:
            raise ConfigError(
                f"Invalid config field `strategy.replicas_to_aggregate`. Received: replicas_to_aggregate={m}. "
                f"The job starts with {num_workers} worker(s); a step cannot aggregate more gradients than there "
                "are workers (accumulating across steps is not supported). Use at most the number of workers.")

    def can_lose(self, spec: Mapping[str, Any], total: int, remaining: int) -> tuple[bool, str]:
        """Whether a job of ``total`` workers goes on with ``remaining`` of them, and why."""
        if not self.needs_all_aggregated:
            why = ("barriers shrink to the live workers" if self.exchange.steps_are_global
                   else "the others do not wait for it")
            return True, f"consistency {self.name} can do without it ({why})"
        m = self.aggregation_size(spec, total) or total
        if remaining >= m:
            return True, f"{remaining} worker(s) remain for strategy.replicas_to_aggregate={m}"
        return False, (f"only {remaining} worker(s) would remain, fewer than strategy.replicas_to_aggregate={m} "
                       "gradients per step")


#: Every registered mode, by name (the built-in ones are registered by :mod:`tfdist.consistency`).
MODES: dict[str, ConsistencyMode] = {}


def register_mode(mode: ConsistencyMode) -> ConsistencyMode:
    """Makes a mode known to the config, the strategies, the launcher and the PS (idempotent for the same mode)."""
    if mode.name in MODES and MODES[mode.name] != mode:
        raise ValueError(f"A consistency mode named {mode.name!r} is registered already.")
    MODES[mode.name] = mode
    return mode


def mode_of(name: Any) -> ConsistencyMode:
    """The registered mode ``name``; :class:`ConfigError` naming the choices otherwise."""
    mode = MODES.get(name) if isinstance(name, str) else None
    if mode is None:
        raise ConfigError(f"Unknown consistency mode. Received: consistency={name!r}. Use one of {mode_names()}.")
    return mode


def mode_names() -> list[str]:
    return list(MODES)

