"""Autoscaling policy: add K workers while the last step scaled, then settle on the best size seen.

The scaling rules of Or, Zhang and Freedman, "Resource Elasticity in
Distributed Deep Learning" (MLSys 2020; ``shared/seeds/002_*``, DESIGN.md
§7). The job starts small; every ``N`` global batches the engine measures
the aggregate throughput ``R_k`` (global batches per second) at the current
size ``k`` and the policy judges the last scale-up step ``k_old -> k_new``:

* **Throughput scaling efficiency**
  ``s = ((R_new - R_old) / (k_new - k_old)) / (R_old / k_old)``: the gain
  per added worker as a fraction of the old per-worker throughput (1: linear
  scaling, 0: no gain, < 0: the job got slower). The step is kept only if
  ``s > efficiency_threshold`` (0.1 in the paper).
* **Marginal utility vs marginal cost** (only with a :class:`Utility`): with
  ``b`` remaining global batches the remaining time is ``T_k = b / R_k`` and
  the remaining cost ``C_k = t_k * b * k * P = T_k * k * P`` (``t_k = 1/R_k``
  the time per global batch, ``P`` the price of a worker-second). The step is
  kept only if ``U(T_new) - U(T_old) > C_new - C_old``. The paper compares
  *marginal* values because early on ``U(T(k))`` looks flat and an absolute
  test ``U > C`` would always pass.

On a failed step the policy goes back to the best size seen and settles
there; at ``max_workers`` it settles too.

Choices tfdist makes where the paper is silent:

* ``R_k`` is the **mean** of the measurement windows at size ``k``. The
  engine already drops warm-up windows and windows that straddle a size
  change, each window spans ``N`` (default 50) global batches, and with the
  default of 2 windows the median *is* the mean; the mean also keeps every
  window's evidence when a size is sampled more often.
* A size is judged once it has ``min_samples`` windows, and a verdict is
  final: :meth:`ScalingPolicy.decide` remembers it, so further windows at the
  same size (while the engine carries out the decision) do not reopen it,
  and a settled policy stays settled.
* "The best size seen" is the best among the sizes the rule **accepted**
  (the start size and every size reached by a passing step), never the size
  whose step just failed: a step with ``0 < s <= threshold`` raises the
  throughput a little, but the rule said the extra workers are not worth it.
  Best means the highest ``R_k`` without a utility, the highest
  ``U(T_k) - C_k`` with one (ties go to the smaller size). Since a passing
  step raises both, this is the size the failed step started from.
* With a utility but no ``remaining_batches`` the utility test is skipped
  (and "best" falls back to throughput); the decision's reason says so.
  A price without a utility only shows up in the logged numbers: comparing
  costs alone would reject every step that does not scale super-linearly.
* The paper retries larger sizes after falling back; tfdist settles (the
  issue's rule). Restart exploration by building a new policy.
* A job below ``min_workers`` or above ``max_workers`` (a crash, an outside
  change) is moved back into range first; a settled job that runs at another
  size than the settled one (a crashed worker) is moved back to it.

No I/O, no clock, no TensorFlow: the engine passes measurements in and
carries out the returned :class:`ScalingDecision`.

Example:

>>> policy = ScalingPolicy(ScalingConfig(max_workers=8, min_samples=1))
>>> curve = lambda k: 10.0 * min(k, 4)  # linear up to a knee at 4 workers
>>> decision = policy.decide()
>>> while not decision.settled or decision.action is not Action.STAY:
...     if decision.action is not Action.STAY:
...         policy.applied(decision.target)
...     policy.observe(policy.current, curve(policy.current))
...     decision = policy.decide()
>>> policy.current
4
"""

from __future__ import annotations

import abc
import enum
import math
from dataclasses import dataclass, fields
from typing import Any, Callable, Mapping, NamedTuple

from tfdist.errors import ConfigError
from tfdist.straggler.verdicts import json_ready

__all__ = [
    "Action",
    "Utility",
    "LinearUtility",
    "DeadlineUtility",
    "utility_from_dict",
    "ScalingConfig",
    "ScalingDecision",
    "SizeStats",
    "ScalingPolicy",
    "scaling_efficiency",
]


class Action(enum.Enum):
    """What the engine should do with the number of workers."""

    ADD = "add"
    REMOVE = "remove"
    STAY = "stay"


def _fail(name: str, value: Any, fix: str) -> ConfigError:
    return ConfigError(f"Invalid config field `{name}`. Received: {name}={value!r}. {fix}")


def _is_number(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)


def _is_int(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, int)


def scaling_efficiency(k_old: int, r_old: float, k_new: int, r_new: float) -> float:
    """Throughput scaling efficiency of the step ``k_old -> k_new`` (Or et al.).

    ``s = ((r_new - r_old) / (k_new - k_old)) / (r_old / k_old)``.

    >>> scaling_efficiency(2, 20.0, 4, 40.0)  # linear
    1.0
    >>> scaling_efficiency(4, 40.0, 5, 40.0)  # no gain
    0.0
    """
    if not (0 < k_old < k_new):
        raise ValueError(f"Expected 0 < k_old < k_new. Received: k_old={k_old!r}, k_new={k_new!r}.")
    if not r_old > 0:
        raise ValueError(f"Expected a positive throughput at k_old. Received: r_old={r_old!r}.")
    return ((r_new - r_old) / (k_new - k_old)) / (r_old / k_old)


# --------------------------------------------------------------------------- utilities
class Utility(abc.ABC):
    """Value to the user of finishing the job ``completion_time_s`` seconds from now.

    A utility is usually non-increasing in the completion time and is in the
    same unit as ``ScalingConfig.price_per_worker_s`` (e.g. dollars). Only
    differences of utilities are compared, so a constant offset does not
    matter. Subclass and implement :meth:`__call__`; any plain callable
    ``float -> float`` is accepted by :class:`ScalingConfig` too.
    """

    @abc.abstractmethod
    def __call__(self, completion_time_s: float) -> float:
        """The utility of finishing after ``completion_time_s`` seconds."""

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready description (``{"kind": ..., ...}``) for logs and configs."""
        return {"kind": type(self).__name__}


class LinearUtility(Utility):
    """Every second of completion time costs ``value_per_s``: ``U(T) = -value_per_s * T``.

    With a price ``P`` per worker-second a step then pays when the time it
    saves is worth more than the worker-seconds it adds:
    ``value_per_s * (T_old - T_new) > P * (k_new * T_new - k_old * T_old)``.

    Args:
        value_per_s: What one second less of completion time is worth (>= 0).

    Example:

    >>> u = LinearUtility(value_per_s=0.5)
    >>> u(100.0) - u(60.0)  # finishing 40 s later loses 20
    -20.0
    """

    def __init__(self, value_per_s: float):
        if not _is_number(value_per_s) or value_per_s < 0:
            raise _fail("utility.value_per_s", value_per_s, "Give a finite number >= 0 (value of one second saved).")
        self.value_per_s = float(value_per_s)

    def __call__(self, completion_time_s: float) -> float:
        return -self.value_per_s * float(completion_time_s)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": "linear", "value_per_s": self.value_per_s}

    def __repr__(self) -> str:
        return f"LinearUtility(value_per_s={self.value_per_s!r})"


class DeadlineUtility(Utility):
    """Worth ``value`` if the job finishes within ``deadline_s``; less (or nothing) after.

    ``U(T) = value`` for ``T <= deadline_s``. After the deadline the utility
    drops to 0 at once (``decay_s=0``, a hard deadline) or falls linearly to 0
    over ``decay_s`` seconds (a soft deadline). Because only *differences*
    are compared, a step can pass only where ``U`` changes: far past the
    deadline ``U`` is flat and no step that costs more passes, so give a
    ``decay_s`` that covers the completion times you expect, or use
    :class:`LinearUtility`.

    Args:
        deadline_s: Seconds from now within which the job is worth ``value``.
        value: Worth of finishing in time (finite).
        decay_s: Seconds after the deadline over which the worth falls to 0.
            Defaults to 0 (a step at the deadline).

    Example:

    >>> u = DeadlineUtility(deadline_s=3600, value=100.0, decay_s=1800)
    >>> [u(3000), u(3600 + 900), u(9000)]
    [100.0, 50.0, 0.0]
    """

    def __init__(self, deadline_s: float, value: float, decay_s: float = 0.0):
        if not _is_number(deadline_s) or deadline_s <= 0:
            raise _fail("utility.deadline_s", deadline_s, "Give a positive number of seconds.")
        if not _is_number(value):
            raise _fail("utility.value", value, "Give a finite number (worth of finishing by the deadline).")
        if not _is_number(decay_s) or decay_s < 0:
            raise _fail("utility.decay_s", decay_s, "Give a number of seconds >= 0 (0: a hard deadline).")
        self.deadline_s = float(deadline_s)
        self.value = float(value)
        self.decay_s = float(decay_s)

    def __call__(self, completion_time_s: float) -> float:
        late = float(completion_time_s) - self.deadline_s
        if late <= 0:
            return self.value
        if self.decay_s == 0:
            return 0.0
        return self.value * max(0.0, 1.0 - late / self.decay_s)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": "deadline", "deadline_s": self.deadline_s, "value": self.value, "decay_s": self.decay_s}

    def __repr__(self) -> str:
        return f"DeadlineUtility(deadline_s={self.deadline_s!r}, value={self.value!r}, decay_s={self.decay_s!r})"


_UTILITIES = {"linear": LinearUtility, "deadline": DeadlineUtility}


def utility_from_dict(spec: Mapping[str, Any] | Utility | None) -> Utility | None:
    """Builds a utility from its config form (the ``elastic.utility`` section).

    ``{"kind": "linear", "value_per_s": v}`` or ``{"kind": "deadline",
    "deadline_s": d, "value": v, "decay_s": s}``; a :class:`Utility` or
    ``None`` is returned as is.

    >>> utility_from_dict({"kind": "linear", "value_per_s": 2})
    LinearUtility(value_per_s=2.0)
    """
    if spec is None or isinstance(spec, Utility):
        return spec
    if not isinstance(spec, Mapping) or spec.get("kind") not in _UTILITIES:
        raise _fail(
            "utility", spec,
            'Write {"kind": "linear", "value_per_s": V} or {"kind": "deadline", "deadline_s": D, "value": V}, or None.',
        )
    cls = _UTILITIES[spec["kind"]]
    args = {k: v for k, v in spec.items() if k != "kind"}
    try:
        return cls(**args)
    except TypeError as e:
        raise _fail("utility", dict(spec), f"{cls.__name__} takes different arguments ({e}).") from None


def _describe_utility(utility: Callable[[float], float] | None) -> Any:
    if utility is None:
        return None
    if hasattr(utility, "to_dict"):
        return utility.to_dict()
    return repr(utility)


# --------------------------------------------------------------------------- config
@dataclass(frozen=True)
class ScalingConfig:
    """Settings of :class:`ScalingPolicy` (the ``elastic`` section of a job config).

    Attributes:
        min_workers: Fewest workers. Defaults to 1.
        max_workers: Most workers; the policy settles when it gets there.
            Defaults to 8.
        step: ``K``, workers added per scale-up step (the last step is capped
            at ``max_workers``). Defaults to 1.
        interval_batches: ``N``, global batches per measurement window (the
            engine measures; the policy only records it). Defaults to 50.
        min_samples: Measurement windows at a size before it is judged.
            Defaults to 2.
        efficiency_threshold: A step is kept only if its scaling efficiency
            is above this, in [-1, 1]. Defaults to 0.1 (Or et al.).
        price_per_worker_s: ``P``, the price of one worker-second, in the
            utility's unit. Defaults to 0 (workers are free).
        utility: A :class:`Utility` (or any callable ``seconds -> value``) of
            the completion time, or ``None`` to judge by efficiency alone.
            Defaults to ``None``.

    Example:

    >>> ScalingConfig(max_workers=16, step=4, utility=LinearUtility(1.0), price_per_worker_s=0.01).step
    4
    """

    min_workers: int = 1
    max_workers: int = 8
    step: int = 1
    interval_batches: int = 50
    min_samples: int = 2
    efficiency_threshold: float = 0.1
    price_per_worker_s: float = 0.0
    utility: Utility | Callable[[float], float] | None = None

    def __post_init__(self):
        for name, low in (("min_workers", 1), ("max_workers", 1), ("step", 1), ("interval_batches", 1),
                          ("min_samples", 1)):
            value = getattr(self, name)
            if not _is_int(value) or value < low:
                raise _fail(name, value, f"Give an integer >= {low}.")
        if self.max_workers < self.min_workers:
            raise _fail("max_workers", self.max_workers,
                        f"Give at least min_workers ({self.min_workers}), or lower min_workers.")
        t = self.efficiency_threshold
        if not _is_number(t) or not -1.0 <= t <= 1.0:
            raise _fail("efficiency_threshold", t,
                        "Give a number in [-1, 1]; 0.1 (the default, Or et al.) keeps a step that adds at least "
                        "10% of a worker's throughput per added worker.")
        if not _is_number(self.price_per_worker_s) or self.price_per_worker_s < 0:
            raise _fail("price_per_worker_s", self.price_per_worker_s,
                        "Give a finite number >= 0 (the price of one worker-second, in the utility's unit).")
        if isinstance(self.utility, Mapping):
            object.__setattr__(self, "utility", utility_from_dict(self.utility))
        if self.utility is not None and not callable(self.utility):
            raise _fail("utility", self.utility,
                        "Give a tfdist.elastic.Utility (e.g. LinearUtility(value_per_s=1.0)), a callable "
                        "seconds -> value, or None.")

    def to_dict(self) -> dict[str, Any]:
        """The settings as a JSON-ready dict (a utility as its ``to_dict()``)."""
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["utility"] = _describe_utility(self.utility)
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], strict: bool = True) -> "ScalingConfig":
        """Builds a config from a dict; ``utility`` may be in its dict form.

        Args:
            data: Field values.
            strict: Refuse keys that are not fields (typos). Pass ``False`` to
                pick the scaling fields out of a larger section (e.g. the whole
                ``elastic`` config). Defaults to ``True``.
        """
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - names)
        if strict and unknown:
            raise ConfigError(f"Unknown scaling config field(s) {unknown}. Known fields: {sorted(names)}.")
        return cls(**{k: v for k, v in data.items() if k in names})


# --------------------------------------------------------------------------- decisions
@dataclass(frozen=True)
class ScalingDecision:
    """What the policy wants done now, and why.

    Attributes:
        action: :class:`Action` to carry out.
        current: Workers the job runs at now.
        target: Workers after the action (``current`` for ``STAY``).
        reason: One sentence for the log.
        numbers: Every number behind the decision: ``k_old``, ``k_new``,
            ``R_old``, ``R_new``, ``s``, ``threshold``, the samples, and
            ``T``/``C``/``U`` values when remaining batches (and a utility) are
            known.
        settled: ``True`` once the policy has stopped exploring (the
            decision that goes back to the best size is already settled).
    """

    action: Action
    current: int
    target: int
    reason: str
    numbers: dict
    settled: bool

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict for the engine's log (non-finite numbers become ``None``)."""
        return {
            "action": self.action.value,
            "current": self.current,
            "target": self.target,
            "reason": self.reason,
            "numbers": json_ready(self.numbers),
            "settled": self.settled,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "ScalingDecision":
        """The inverse of :meth:`to_dict` (numbers keep their JSON form)."""
        return cls(
            action=Action(data["action"]),
            current=int(data["current"]),
            target=int(data["target"]),
            reason=str(data["reason"]),
            numbers=dict(data["numbers"]),
            settled=bool(data["settled"]),
        )


class SizeStats(NamedTuple):
    """Measurements at one size: ``(workers, throughput, samples)``."""

    workers: int
    throughput: float
    samples: int


# --------------------------------------------------------------------------- policy
class ScalingPolicy:
    """Decides when to add workers, and where to settle (Or et al., MLSys 2020).

    The engine loop::

        decision = policy.decide(remaining_batches)
        if decision.action is not Action.STAY:
            actuator.resize(decision.target)       # warm-up, join ...
            policy.applied(decision.target)
        ...                                        # N global batches later:
        policy.observe(workers, throughput, batches)

    Exploration starts at ``initial_workers`` and adds ``step`` workers
    while the last step passes; a failed step goes back to the best accepted
    size and settles; ``max_workers`` settles. A size is not judged before it
    has ``min_samples`` windows (the decision is then ``STAY``).

    Args:
        config: A :class:`ScalingConfig`.
        initial_workers: Workers the job starts with. Defaults to
            ``config.min_workers``.
    """

    def __init__(self, config: ScalingConfig | None = None, initial_workers: int | None = None):
        self.config = config if config is not None else ScalingConfig()
        if initial_workers is None:
            initial_workers = self.config.min_workers
        if not _is_int(initial_workers) or not self.config.min_workers <= initial_workers <= self.config.max_workers:
            raise _fail("initial_workers", initial_workers,
                        f"Give an integer between min_workers ({self.config.min_workers}) and max_workers "
                        f"({self.config.max_workers}).")
        self._current = initial_workers
        self._samples: dict[int, list[float]] = {}
        self._batches: dict[int, int] = {}
        self._accepted: list[int] = []  # sizes the rule kept, in the order they were accepted
        self._verdicts: dict[int, ScalingDecision] = {}  # final ADD verdicts, by size
        self._settled_at: int | None = None
        self._settle_decision: ScalingDecision | None = None

    # ------------------------------------------------------------------ inputs
    @property
    def current(self) -> int:
        """Workers the job runs at (as last told by :meth:`applied`)."""
        return self._current

    @property
    def settled(self) -> bool:
        """Whether exploration has ended."""
        return self._settled_at is not None

    @property
    def settled_size(self) -> int | None:
        """The size the policy settled on, or ``None`` while exploring."""
        return self._settled_at

    def observe(self, workers: int, throughput: float, batches: int = 0) -> None:
        """Records one measurement window taken wholly at ``workers`` workers.

        Args:
            workers: Workers that counted during the whole window.
            throughput: Aggregate throughput in global batches per second (> 0).
            batches: Global batches in the window (for the log). Defaults to 0.
        """
        if not _is_int(workers) or workers < 1:
            raise ValueError(f"`workers` must be an integer >= 1. Received: workers={workers!r}.")
        if not _is_number(throughput) or throughput <= 0:
            raise ValueError(
                f"`throughput` must be a finite number > 0 (global batches per second). Received: "
                f"throughput={throughput!r}. Leave out windows in which no batch completed."
            )
        if not _is_int(batches) or batches < 0:
            raise ValueError(f"`batches` must be an integer >= 0. Received: batches={batches!r}.")
        self._samples.setdefault(workers, []).append(float(throughput))
        self._batches[workers] = self._batches.get(workers, 0) + batches

    def applied(self, workers: int) -> None:
        """Tells the policy the job now runs at ``workers`` workers.

        Call it after carrying out an ``ADD`` or ``REMOVE`` (with the size
        actually reached), and whenever the size changed otherwise (a crash).
        """
        if not _is_int(workers) or workers < 0:
            raise ValueError(f"`workers` must be an integer >= 0. Received: workers={workers!r}.")
        self._current = workers

    # ------------------------------------------------------------------ views
    def throughput(self, workers: int) -> float | None:
        """``R_k``: mean throughput of the windows at ``workers`` (``None`` if none)."""
        values = self._samples.get(workers)
        return sum(values) / len(values) if values else None

    def samples(self, workers: int) -> int:
        """Measurement windows recorded at ``workers``."""
        return len(self._samples.get(workers, ()))

    @property
    def history(self) -> list[SizeStats]:
        """``(workers, mean throughput, samples)`` of every measured size, by size."""
        return [SizeStats(k, self.throughput(k), len(v)) for k, v in sorted(self._samples.items())]

    def best_size(self, remaining_batches: int | None = None) -> int:
        """The best accepted size so far (see the module docstring); ``current`` if none yet.

        Highest throughput, or with a utility and ``remaining_batches`` the
        highest ``U(T_k) - C_k``.
        """
        remaining = self._check_remaining(remaining_batches)
        candidates = [k for k in self._accepted if self.samples(k) > 0]
        if not candidates:
            return self._current
        return self._best(candidates, remaining)[0]

    # ------------------------------------------------------------------ decision
    def decide(self, remaining_batches: int | None = None) -> ScalingDecision:
        """What to do now.

        Args:
            remaining_batches: ``b``, global batches left in the job; needed
                for the utility test. Defaults to ``None``.

        Returns:
            A :class:`ScalingDecision`.

        No clock, no I/O. The one thing it records is its verdict on a size
        (an ``ADD`` from it, or settling), which is final: calling again
        returns the same decision until :meth:`applied` changes the size,
        however many windows arrive meanwhile.
        """
        b = self._check_remaining(remaining_batches)
        cfg, k = self.config, self._current
        n = self.samples(k)
        base = {"current": k, "samples": n, "min_samples": cfg.min_samples}

        if k < cfg.min_workers:
            return ScalingDecision(Action.ADD, k, cfg.min_workers,
                                   f"The job runs at {k} worker(s), below min_workers ({cfg.min_workers}).",
                                   {**base, "min_workers": cfg.min_workers}, self.settled)
        if k > cfg.max_workers:
            return ScalingDecision(Action.REMOVE, k, cfg.max_workers,
                                   f"The job runs at {k} worker(s), above max_workers ({cfg.max_workers}).",
                                   {**base, "max_workers": cfg.max_workers}, self.settled)
        if self._settled_at is not None:
            return self._settled_decision(k, base)
        if k in self._verdicts:
            return self._verdicts[k]
        if n < cfg.min_samples:
            return ScalingDecision(Action.STAY, k, k,
                                   f"Measuring {k} worker(s): {n} of {cfg.min_samples} windows.", base, False)

        below = [a for a in self._accepted if a < k]
        if not below:  # the start of exploration: nothing to compare with yet
            numbers = {**base, "k": k, "R": self.throughput(k), **self._time_cost(k, b)}
            if k >= cfg.max_workers:
                return self._settle(k, Action.STAY, k, f"Started at max_workers ({k}); nothing to explore.", numbers)
            self._accepted.append(k)
            target = min(k + cfg.step, cfg.max_workers)
            decision = ScalingDecision(Action.ADD, k, target,
                                       f"Measured the start size {k} (R={numbers['R']:.4g}/s); trying {target}.",
                                       numbers, False)
            self._verdicts[k] = decision
            return decision

        k_old = max(below)
        passed, why, numbers = self._judge(k_old, k, b)
        numbers = {**base, **numbers}
        if passed:
            self._accepted.append(k)
            if k >= cfg.max_workers:
                return self._settle(k, Action.STAY, k, f"Step {k_old}->{k} passed ({why}); at max_workers, settled.",
                                    numbers)
            target = min(k + cfg.step, cfg.max_workers)
            decision = ScalingDecision(Action.ADD, k, target, f"Step {k_old}->{k} passed ({why}); trying {target}.",
                                       numbers, False)
            self._verdicts[k] = decision
            return decision

        best, scores, best_by = self._best(self._accepted, b)
        numbers.update(best=best, best_by=best_by, candidates=scores)
        action = Action.REMOVE if best < k else Action.ADD  # best > k only after an outside size change
        return self._settle(best, action, best,
                            f"Step {k_old}->{k} failed ({why}); back to the best size seen, {best}, and settled.",
                            numbers)

    # ------------------------------------------------------------------ logs
    def state_dict(self) -> dict[str, Any]:
        """The whole state as a JSON-ready dict (for logs and :meth:`load_state_dict`)."""
        return {
            "config": self.config.to_dict(),
            "current": self._current,
            "samples": {str(k): list(v) for k, v in sorted(self._samples.items())},
            "batches": {str(k): v for k, v in sorted(self._batches.items())},
            "accepted": list(self._accepted),
            "verdicts": {str(k): d.to_dict() for k, d in sorted(self._verdicts.items())},
            "settled_at": self._settled_at,
            "settle_decision": None if self._settle_decision is None else self._settle_decision.to_dict(),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restores a :meth:`state_dict` (the policy keeps its own config)."""
        self._current = int(state["current"])
        self._samples = {int(k): [float(x) for x in v] for k, v in state["samples"].items()}
        self._batches = {int(k): int(v) for k, v in state["batches"].items()}
        self._accepted = [int(k) for k in state["accepted"]]
        self._verdicts = {int(k): ScalingDecision.from_dict(d) for k, d in state["verdicts"].items()}
        self._settled_at = None if state["settled_at"] is None else int(state["settled_at"])
        sd = state.get("settle_decision")
        self._settle_decision = None if sd is None else ScalingDecision.from_dict(sd)

    def describe(self) -> str:
        """One line for the log: current size, state, and the measured sizes."""
        sizes = ", ".join(f"{s.workers}: {s.throughput:.4g}/s x{s.samples}" for s in self.history) or "none"
        state = f"settled at {self._settled_at}" if self.settled else "exploring"
        return f"ScalingPolicy(current={self._current}, {state}; measured {sizes})"

    def __repr__(self) -> str:
        return self.describe()

    # ------------------------------------------------------------------ internals
    @staticmethod
    def _check_remaining(remaining: int | None) -> int | None:
        if remaining is not None and (not _is_int(remaining) or remaining < 0):
            raise ValueError(f"`remaining_batches` must be an integer >= 0 or None. Received: {remaining!r}.")
        return remaining

    def _settle(self, at: int, action: Action, target: int, reason: str, numbers: dict) -> ScalingDecision:
        self._settled_at = at
        decision = ScalingDecision(action, self._current, target, reason, numbers, True)
        self._settle_decision = decision
        return decision

    def _settled_decision(self, k: int, base: dict) -> ScalingDecision:
        at = self._settled_at
        if self._settle_decision is not None and self._settle_decision.current == k:
            return self._settle_decision  # not carried out yet: the same decision again
        numbers = {**base, "settled_at": at}
        if k == at:
            return ScalingDecision(Action.STAY, k, k, f"Settled at {at} worker(s).", numbers, True)
        action = Action.ADD if k < at else Action.REMOVE
        return ScalingDecision(action, k, at, f"Settled at {at} worker(s); the job runs at {k}, moving back.",
                               numbers, True)

    def _time_cost(self, k: int, b: int | None) -> dict[str, float]:
        """``T_k`` and ``C_k`` (and ``U(T_k)``) when the remaining batches are known."""
        if b is None:
            return {}
        r = self.throughput(k)
        t = b / r
        out = {"remaining_batches": b, "T": t, "C": t * k * self.config.price_per_worker_s}
        if self.config.utility is not None:
            out["U"] = float(self.config.utility(t))
        return out

    def _judge(self, k_old: int, k_new: int, b: int | None) -> tuple[bool, str, dict]:
        cfg = self.config
        r_old, r_new = self.throughput(k_old), self.throughput(k_new)
        s = scaling_efficiency(k_old, r_old, k_new, r_new)
        numbers: dict[str, Any] = {
            "k_old": k_old, "k_new": k_new, "R_old": r_old, "R_new": r_new,
            "samples_old": self.samples(k_old), "samples_new": self.samples(k_new),
            "s": s, "threshold": cfg.efficiency_threshold, "efficiency_passed": s > cfg.efficiency_threshold,
        }
        why = [f"s={s:.3g} {'>' if s > cfg.efficiency_threshold else '<='} {cfg.efficiency_threshold:g}"]
        passed = s > cfg.efficiency_threshold
        if b is not None:
            old, new = self._time_cost(k_old, b), self._time_cost(k_new, b)
            numbers.update(remaining_batches=b, price_per_worker_s=cfg.price_per_worker_s,
                           T_old=old["T"], T_new=new["T"], C_old=old["C"], C_new=new["C"])
        if cfg.utility is not None:
            if b is None:
                numbers["utility_skipped"] = True
                why.append("utility test skipped: remaining_batches unknown")
            else:
                du, dc = new["U"] - old["U"], new["C"] - old["C"]
                numbers.update(U_old=old["U"], U_new=new["U"], dU=du, dC=dc, utility_passed=du > dc)
                why.append(f"dU={du:.4g} {'>' if du > dc else '<='} dC={dc:.4g}")
                passed = passed and du > dc
        return passed, "; ".join(why), numbers

    def _best(self, candidates: list[int], b: int | None) -> tuple[int, dict[int, float], str]:
        if self.config.utility is not None and b is not None:
            scores = {}
            for k in candidates:
                tc = self._time_cost(k, b)
                scores[k] = tc["U"] - tc["C"]
            by = "utility_minus_cost"
        else:
            scores = {k: self.throughput(k) for k in candidates}
            by = "throughput"
        best = max(sorted(scores), key=lambda k: scores[k])  # ties: the smaller size (first in sorted order)
        return best, scores, by
