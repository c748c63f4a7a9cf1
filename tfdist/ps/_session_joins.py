"""Variables that join a running job, as a worker session sends them (one slice of the session).

:meth:`SessionJoins.extend` sends ``Extend`` for variables created after the
job's first step (the store adds what it lacks and answers the job's values);
:meth:`SessionJoins._rejoin` sends them again to tasks whose state went back to
before they joined (a checkpoint restored, a roll-back, a reset): ``Extend``
changes nothing where a task holds them already.
"""

from __future__ import annotations

import logging
from typing import Iterable, Mapping, Sequence

import numpy as np

from tfdist.ps.placement import PlacementPlan, Shard, VariableSpec
from tfdist.ps.protocol import ExtendRequest

__all__ = ["SessionJoins"]

logger = logging.getLogger(__name__)


class SessionJoins:
    """``extend`` and ``_rejoin`` of :class:`~tfdist.ps.session.WorkerSession`."""

    def _extend_requests(self, pieces: Sequence[Shard], by_key: Mapping[str, VariableSpec],
                         local_values: Mapping[str, np.ndarray], tasks: Iterable[int]) -> dict:
        """One ``Extend`` per task of ``tasks`` holding any of ``pieces``, with this worker's values."""
        requests = {}
        for ps in tasks:
            mine = [sh for sh in pieces if sh.ps == ps]
            if not mine:
                continue
            specs, values = [], {}
            for sh in mine:
                spec, value = by_key[sh.var_key], np.asarray(local_values[sh.var_key])
                if sh.rows is not None:
                    shape = (sh.rows[1] - sh.rows[0], *spec.shape[1:])
                    spec, value = VariableSpec(sh.key, spec.dtype, shape, spec.trainable), value[sh.rows[0]:sh.rows[1]]
                elif sh.key != spec.key:
                    spec = VariableSpec(sh.key, spec.dtype, spec.shape, spec.trainable)
                specs.append(spec)
                values[sh.key] = np.array(value, order="C")  # (ascontiguousarray would make a scalar 1-d)
            requests[ps] = ExtendRequest(self.worker_id, tuple(specs), values, self.state.incarnations[ps])
        return requests

    def extend(self, plan: PlacementPlan, new: Sequence[VariableSpec], local_values: Mapping[str, np.ndarray]
               ) -> tuple[dict[str, np.ndarray], frozenset[str]]:
        """Variables created after the job's first step join it: ``Extend`` to every task holding a piece.

        ``plan``: the plan so far with ``new`` placed after it (the same on
        every worker). Returns the job's values of the new variables and the
        keys this call added to the job (for those, the job's values are
        this worker's: the caller need not load them). Nothing of this
        session changes unless every task accepted.
        """
        new_keys = {s.key for s in new}
        by_key = {**self._by_key, **{s.key: s for s in new}}
        pieces = [sh for sh in plan.shards if sh.var_key in new_keys]
        replies = self._request_many(self._extend_requests(pieces, by_key, local_values, range(plan.num_ps)))
        found = {k: v for r in replies.values() for k, v in r.values.items()}
        added_pieces = {k for r in replies.values() for k in r.added}
        out = {}
        for spec in new:
            shards = [sh for sh in pieces if sh.var_key == spec.key]
            out[spec.key] = (found[shards[0].key] if len(shards) == 1 and shards[0].rows is None
                             else np.concatenate([found[sh.key] for sh in shards], axis=0))
        added = frozenset(s.key for s in new if all(sh.key in added_pieces for sh in pieces if sh.var_key == s.key))
        # -- every task accepted: the session knows the variables from now on
        self.specs = [*self.specs, *new]
        self._by_key = by_key
        self.plan = plan
        self._var_key.update({sh.key: sh.var_key for sh in pieces})
        self.joined.extend(s.key for s in new)
        for key, value in out.items():
            self._snapshot[key] = np.array(value, copy=True)
            if self._base is not None:
                self._base[key] = np.array(value, copy=True)
        return out, added

    def _rejoin(self, tasks: Iterable[int] | None = None) -> None:
        """Sends the joined variables again to ``tasks`` (default: all) that lost them; a task that holds them
        keeps its values. What a task gets back is this worker's current values (the job's, up to its last
        exchange); without them (no ``local_values``) nothing is sent."""
        if not self.joined or self.local_values is None:
            return
        joined = set(self.joined)
        pieces = [sh for sh in self.plan.shards if sh.var_key in joined]
        tasks = range(self.plan.num_ps) if tasks is None else tasks
        replies = self._request_many(self._extend_requests(pieces, self._by_key, self.local_values(), tasks))
        lost = {ps: len(r.added) for ps, r in replies.items() if r.added}
        if lost:
            logger.warning("worker %d: %s had lost variables that joined the job after its first step (restored or "
                           "reset to a state from before they joined); they were sent again with this worker's values",
                           self.worker_id, ", ".join(f"ps:{ps} ({n})" for ps, n in sorted(lost.items())))
