"""Who takes part in each iteration when stragglers are left out (partial all-reduce).

The policy half of partial all-reduce (STYLE habit 2): :func:`plan_members`
turns the dynamic-threshold detector's ``excluded()`` set into the members
of the next iteration, and :class:`Participation` is the typed decision an
engine (e.g. ``tfdist.AllReduceStrategy``) carries out.
:class:`StragglerEngine` (also named ``ParticipationEngine``) is the small
interface every strategy offers the :class:`tfdist.callbacks.StragglerDetector`
callback to act on verdicts, and :func:`reporter` picks the one worker that
reports them to shared services.

The rule (seed paper 000, §4.2: stragglers are left out, and take part again
in the first ``n`` iterations of every epoch so recovery can be seen):

* No worker is excluded (e.g. the epoch's profiling iterations): everyone
  takes part; workers that were out are **re-admitted** (``joined``) and
  copy the training state from ``source``, the lowest-id worker that took
  part in the previous iteration.
* Otherwise the members are the previous members minus the excluded
  workers. Membership only shrinks within an epoch (an excluded worker's
  counter does not move while it is out), so a worker that is out needs no
  news about the others until everyone is back.
* The last members are never excluded: if the rule would leave nobody, the
  previous members stay.

>>> plan_members(4, frozenset(range(4)), frozenset({2}))
frozenset({0, 1, 3})
>>> plan_members(4, frozenset({0, 1, 3}), frozenset())
frozenset({0, 1, 2, 3})
>>> plan_members(2, frozenset({1}), frozenset({0, 1}))
frozenset({1})
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Iterable

from tfdist.straggler.verdicts import EventKind, StragglerEvent

__all__ = ["Participation", "ParticipationEngine", "StragglerEngine", "flagged_after", "plan_members",
           "plan_participation", "reporter"]


def plan_members(num_workers: int, previous: Iterable[int], excluded: Iterable[int]) -> frozenset[int]:
    """The members of the next iteration (see the module docstring)."""
    everyone = frozenset(range(num_workers))
    excluded = frozenset(excluded) & everyone
    if not excluded:
        return everyone
    members = (frozenset(previous) & everyone) - excluded
    return members if members else frozenset(previous) & everyone or everyone


@dataclass(frozen=True)
class Participation:
    """Who takes part in one iteration, as decided identically on every member.

    Attributes:
        step: The iteration (0-based, over the whole run) the decision is for.
        members: Workers that compute and all-reduce in this iteration.
        joined: Workers re-admitted at this iteration: they must first copy
            the training state (weights, optimizer state) from ``source``.
        left: Workers that were members in the previous iteration and are not now.
        source: The lowest-id worker that was a member in the previous
            iteration and is one now (``None`` when nobody joins).
    """

    step: int
    members: frozenset[int]
    joined: frozenset[int] = frozenset()
    left: frozenset[int] = frozenset()
    source: int | None = None

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        for k in ("members", "joined", "left"):
            out[k] = sorted(out[k])
        return out


def plan_participation(
    step: int, num_workers: int, previous: Iterable[int], excluded: Iterable[int]
) -> Participation:
    """:func:`plan_members` as a :class:`Participation` (``source``: lowest previous member kept)."""
    previous = frozenset(previous)
    members = plan_members(num_workers, previous, excluded)
    joined = members - previous
    kept = sorted(members & previous)
    return Participation(step=step, members=members, joined=joined, left=previous - members,
                         source=(kept[0] if kept else None) if joined else None)


class StragglerEngine:
    """What a strategy offers :class:`tfdist.callbacks.StragglerDetector` to act on its verdicts.

    Both strategy families implement it and expose it the same way, as the
    strategy's ``straggler_engine`` attribute; the callback finds it through
    ``model.distribute_strategy`` (or takes ``engine=``), so nothing is wired
    by hand. ``tfdist.AllReduceStrategy`` leaves stragglers out of its
    all-reduce (:meth:`begin_iteration`); the parameter-server strategies tell
    the parameter servers not to wait for them (:meth:`set_stragglers`).
    (Independently, a tfdist strategy reports the seconds its last step was
    blocked on peers as ``last_step_wait_seconds``; the callback subtracts
    them so a worker's time is its own compute.)

    Attributes:
        exclude_stragglers: Whether the engine leaves excluded workers out of
            iterations (partial all-reduce); then the callback decides every
            iteration's members and calls :meth:`begin_iteration`. When
            ``False`` the callback leaves membership alone.
    """

    exclude_stragglers: bool = False

    def begin_iteration(self, participation: Participation) -> None:
        """Applies ``participation`` to the coming iteration, before it starts.

        Called on every worker at the same iteration boundary. When workers
        join, every worker in ``{source} | joined`` must copy the source's
        training state here (a collective among exactly those workers).
        """

    def set_stragglers(self, stragglers: frozenset[int], report: bool) -> None:
        """Called on every worker when the verdicts change the set of workers currently flagged as stragglers.

        Args:
            stragglers: Workers detected (by any detector) and not recovered since.
            report: ``True`` on exactly one worker, the reporter (:func:`reporter`):
                only it tells services the workers share, such as the
                parameter servers, so they hear each change once.
        """


#: The engine interface under its first name (partial all-reduce was its first user).
ParticipationEngine = StragglerEngine


def reporter(members: Iterable[int]) -> int:
    """The one worker that reports verdicts to shared services: the lowest-id member of the iteration.

    >>> reporter(frozenset({3, 1, 2}))
    1
    """
    return min(members)


def flagged_after(flagged: Iterable[int], events: Iterable[StragglerEvent]) -> frozenset[int]:
    """The flagged set after ``events`` (in order): a detection adds its worker, a recovery removes it."""
    out = set(flagged)
    for event in events:
        if event.kind is EventKind.DETECTED:
            out.add(event.worker)
        else:
            out.discard(event.worker)
    return frozenset(out)
