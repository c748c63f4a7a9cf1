"""The participation protocol of partial all-reduce: agree on each iteration's members, re-admit with state.

Run identically on every worker at each iteration boundary. Without
re-admission it needs no communication (:func:`~tfdist.straggler.plan_members`
is deterministic). When workers join, only the members of the last iteration
know exactly who they were (a worker that was out may have missed later
exclusions), so the members gather one flag each ("I took part"), and the
lowest-id worker that took part (the *source*) broadcasts the detectors'
state, so the re-admitted workers continue with the same counters.

The group is anything with ``size``, ``worker_id``,
``all_gather(values, timeout_s=, members=)`` and
``broadcast_bytes(data, source, members, timeout_s=)`` (a
:class:`tfdist.collective.WorkerGroup`); its errors propagate.
"""

from __future__ import annotations

import pickle
from typing import Any, Callable, Iterable

from tfdist.straggler.membership import Participation, plan_members

__all__ = ["agree_participation"]


def agree_participation(
    group: Any,
    step: int,
    previous: Iterable[int],
    excluded: Iterable[int],
    state: Callable[[], Any],
    timeout_s: float | None = None,
) -> tuple[Participation, Any]:
    """Decides the members of iteration ``step``; on re-admission hands out the source's ``state()``.

    Args:
        group: The worker group (see the module docstring).
        step: The coming iteration.
        previous: The members of the last iteration, as this worker knows them.
        excluded: Workers the detector excludes now.
        state: Returns this worker's detector state; called on the source only.
        timeout_s: Timeout of each collective. Defaults to the group's.

    Returns:
        ``(participation, state)``: the decision, and the source's state when
        workers join (``None`` otherwise).
    """
    n, me = group.size, group.worker_id
    previous = frozenset(previous)
    members = plan_members(n, previous, excluded)
    if not members - previous:
        return Participation(step=step, members=members, left=previous - members), None
    subset = members if len(members) < n else None
    flags = group.all_gather([1.0 if me in previous else 0.0], timeout_s=timeout_s, members=subset)
    ids = sorted(members)
    took_part = frozenset(w for w, f in zip(ids, flags[:, 0]) if f > 0) or frozenset(ids[:1])
    source = min(took_part)
    payload = pickle.dumps(state()) if me == source else None
    received = pickle.loads(group.broadcast_bytes(payload, source, subset, timeout_s=timeout_s))
    return Participation(step=step, members=members, joined=members - took_part, left=took_part - members,
                         source=source), received
