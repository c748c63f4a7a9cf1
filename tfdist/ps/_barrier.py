"""The gradient barrier of one PS task (gradient path: BSP, SyncReplicas).

Owns (PS side): the global step (the step being aggregated), the state step
(the step of the state snapshot workers re-sync from), the gradients summed
for the current step and who sent them, the aggregates of the last
:data:`AGGREGATE_HISTORY` steps (for workers that arrive late), and each
worker's row gradients of PS-resident tables pending until the step
completes. The policy decides whether a gradient counts and when a step is
complete; the barrier carries it out.

Every method runs with the store's lock held. No sockets, no TensorFlow.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

import numpy as np

from tfdist.ps import _schema as schema
from tfdist.ps._schema import Field
from tfdist.ps._waits import Wait

__all__ = ["GradientBarrier", "AGGREGATE_HISTORY"]

#: Completed steps whose aggregates are kept for workers that arrive late.
AGGREGATE_HISTORY = 8


class GradientBarrier:
    """Sums gradients per global step; completes a step when the policy says so."""

    FIELDS = (
        # ``global_step`` is written for older readers; a restore starts it at ``state_step``.
        Field("global_step", schema.COUNT, default=0),
        Field("state_step", schema.COUNT, default=0),
    )

    def __init__(self):
        self.global_step = 0
        self.state_step = 0
        self.acc: dict[str, np.ndarray] = {}
        self.contributors: set[int] = set()
        #: step -> (aggregate, the worker that closed it)
        self.history: dict[int, tuple[dict[str, np.ndarray], int]] = {}
        #: Each worker's row gradients for the current step: (table key, rows, grads, learning rate).
        self.sparse_acc: dict[int, list[tuple[str, np.ndarray, np.ndarray, float | None]]] = {}

    def restart(self, step: int) -> None:
        """The gradient path starts again at ``step``: no step in progress, no aggregates kept."""
        self.global_step = self.state_step = step
        self.acc, self.contributors, self.history, self.sparse_acc = {}, set(), {}, {}

    def store_state(self, step: int) -> None:
        """A worker uploaded the state snapshot of ``step``."""
        self.state_step = step

    def contribute(self, worker: int, grads: Mapping[str, np.ndarray]) -> int:
        """Adds a counted gradient to the current step; returns its bytes."""
        nbytes = 0
        for key, g in grads.items():
            if key in self.acc:
                self.acc[key] += g
            else:
                self.acc[key] = np.array(g, copy=True)
            nbytes += g.nbytes
        self.contributors.add(worker)
        return nbytes

    def add_rows(self, worker: int, parts, rows: np.ndarray, learning_rate: float | None) -> None:
        for key, grads in parts:
            self.sparse_acc.setdefault(worker, []).append(
                (key, np.array(rows, copy=True), np.array(grads, copy=True), learning_rate))

    def complete_if_ready(self, policy, ctx, closer: int | None, apply_rows: Callable[[str, np.ndarray, np.ndarray,
                          float | None], None]) -> int:
        """Completes the current step if the policy says it is; returns the gradients aggregated (0: not yet)."""
        contributors = frozenset(self.contributors)
        if not contributors or not policy.step_complete(contributors, ctx):
            return 0
        m = policy.aggregation_size()
        if len(contributors) != m:  # Keras scaled every loss by 1/m: make the sum the mean
            for value in self.acc.values():
                value *= np.asarray(m / len(contributors), dtype=value.dtype)
        step = self.global_step
        self.history[step] = (self.acc, closer if closer is not None else min(contributors))
        for old in [s for s in self.history if s <= step - AGGREGATE_HISTORY]:
            del self.history[old]
        self._apply_rows(contributors, m, apply_rows)
        self.acc, self.contributors = {}, set()
        self.global_step = step + 1
        return len(contributors)

    def _apply_rows(self, contributors: frozenset[int], m: int, apply_rows) -> None:
        """A step completes: each table gets its contributors' row gradients summed."""
        pending, self.sparse_acc = self.sparse_acc, {}
        by_key: dict[str, tuple[list, list, float | None]] = {}
        for worker in sorted(contributors):
            for key, rows, grads, lr in pending.get(worker, ()):
                entry = by_key.setdefault(key, ([], [], lr))
                entry[0].append(rows)
                entry[1].append(grads)
        scale = np.float32(m / len(contributors)) if contributors and len(contributors) != m else None
        for key, (rows, grads, lr) in by_key.items():
            g = np.concatenate(grads)
            if scale is not None:
                g *= scale
            apply_rows(key, np.concatenate(rows), g, lr)

    def step_wait(self, step: int, awaited: frozenset[int]) -> Wait:
        """Whether a contributor to ``step`` still waits, and for whom."""
        if self.global_step > step:
            return Wait(False, "")
        missing = sorted(awaited - self.contributors)
        return Wait(True, f"step {step} has {len(self.contributors)} gradient(s) (from workers "
                          f"{sorted(self.contributors)}); the policy waits for more (live workers not yet heard "
                          f"for this step: {missing})")

    # ------------------------------------------------------------------ schema
    def state(self) -> dict[str, Any]:
        return {
            **schema.snapshot(self, self.FIELDS),
            "accumulated": {k: v.copy() for k, v in self.acc.items()},
            "contributors": sorted(self.contributors),
            "history": {step: ({k: v.copy() for k, v in agg.items()}, closer)
                        for step, (agg, closer) in self.history.items()},
            "sparse_pending": {w: [(k, r.copy(), g.copy(), lr) for k, r, g, lr in items]
                               for w, items in self.sparse_acc.items()},
        }

    def checkpoint(self) -> dict[str, Any]:
        return schema.dump(self, self.FIELDS, "checkpoint")

    def load(self, parsed: Mapping[str, Any]) -> None:
        """A restored task: the step in progress is not kept (its gradients are sent again)."""
        self.restart(parsed["state_step"])

    def status(self) -> dict[str, Any]:
        return schema.dump(self, self.FIELDS, "status")
