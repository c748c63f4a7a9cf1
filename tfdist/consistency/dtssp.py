"""DTSSP: SSP whose staleness bound follows the learning-progress ratio.

The DTSSP paper (seed 001) moves the SSP bound ``s`` within ``[s_min, s_max]``
(defaults 3..10, start 3) by a learning-progress ratio (LPR); its exact
formula was lost from the source text, so tfdist uses the rule of DESIGN.md
§4.2, stated here in full:

* Over each window of ``W`` global clocks (window ``k`` = clocks ``kW+1 ..
  (k+1)W``; a window closes when every live worker has completed ``(k+1)W``
  steps) the policy averages the training losses the workers report with
  their pushes: ``L_k``.
* ``LPR_k = (L_{k-1} - L_k) / L_{k-1}``.
* ``LPR_k > +delta`` (learning progresses well): ``s := min(s + 1, s_max)``;
  ``LPR_k < -delta`` (loss worsening): ``s := max(s - 1, s_min)``; else
  ``s`` stays. ``delta`` defaults to 0.01.

Why ``W = 10`` by default: the mean of ``10 × N`` per-step losses is stable
enough that mini-batch noise rarely crosses ``±1 %``, and the bound still moves
several times per epoch on typical data sets. Every change is recorded with
its LPR in :attr:`DTSSPPolicy.changes`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from tfdist.consistency.base import PolicyContext
from tfdist.consistency.ssp import SSPPolicy

__all__ = ["DTSSPPolicy", "StalenessChange", "learning_progress_ratio", "next_staleness"]


def learning_progress_ratio(previous_loss: float, current_loss: float) -> float:
    """``(L_{t-1} - L_t) / L_{t-1}``; 0 when the previous loss is 0."""
    if previous_loss == 0:
        return 0.0
    return (previous_loss - current_loss) / abs(previous_loss)


def next_staleness(staleness: int, lpr: float, delta: float, min_staleness: int, max_staleness: int) -> int:
    """The DTSSP rule: widen on progress, narrow on regress, clamp to the range."""
    if lpr > delta:
        return min(staleness + 1, max_staleness)
    if lpr < -delta:
        return max(staleness - 1, min_staleness)
    return staleness


@dataclass(frozen=True)
class StalenessChange:
    """One evaluation of the rule (recorded whether or not ``s`` moved)."""

    window: int
    clock: int
    previous_loss: float
    loss: float
    lpr: float
    old_staleness: int
    new_staleness: int


class DTSSPPolicy(SSPPolicy):
    """SSP with a bound that adapts to learning progress.

    Args:
        min_staleness: ``s_min``. Defaults to 3.
        max_staleness: ``s_max``. Defaults to 10.
        initial_staleness: Start value. Defaults to ``min_staleness``.
        window: ``W``, global clocks per loss window. Defaults to 10.
        delta: Dead band of the LPR rule. Defaults to 0.01.
    """

    name = "dtssp"

    def __init__(self, min_staleness: int = 3, max_staleness: int = 10, initial_staleness: int | None = None,
                 window: int = 10, delta: float = 0.01):
        if not (isinstance(min_staleness, int) and isinstance(max_staleness, int) and 0 <= min_staleness <= max_staleness):
            raise ValueError(
                "Need integers 0 <= min_staleness <= max_staleness. "
                f"Received: min_staleness={min_staleness!r}, max_staleness={max_staleness!r}."
            )
        initial = min_staleness if initial_staleness is None else initial_staleness
        if not min_staleness <= initial <= max_staleness:
            raise ValueError(f"initial_staleness must lie in [{min_staleness}, {max_staleness}]. Received: {initial!r}.")
        if not isinstance(window, int) or window < 1:
            raise ValueError(f"window must be an integer >= 1. Received: window={window!r}.")
        if delta < 0:
            raise ValueError(f"delta must be >= 0. Received: delta={delta!r}.")
        super().__init__(initial)
        self.min_staleness, self.max_staleness = min_staleness, max_staleness
        self.window, self.delta = window, delta
        self._sums: dict[int, float] = {}
        self._counts: dict[int, int] = {}
        self._closed = 0  # windows evaluated so far
        self._window_loss: dict[int, float] = {}
        self.changes: list[StalenessChange] = []

    def on_applied(self, worker: int, clock: int, ctx: PolicyContext, loss: float | None = None) -> None:
        super().on_applied(worker, clock, ctx, loss)
        if loss is not None and clock >= 1:
            k = (clock - 1) // self.window
            self._sums[k] = self._sums.get(k, 0.0) + float(loss)
            self._counts[k] = self._counts.get(k, 0) + 1
        self._close_windows(self.min_clock(ctx))

    def _close_windows(self, global_clock: int) -> None:
        while global_clock >= (self._closed + 1) * self.window:
            k = self._closed
            self._closed += 1
            if not self._counts.get(k):
                continue
            self._window_loss[k] = self._sums.pop(k) / self._counts.pop(k)
            if k - 1 not in self._window_loss:
                continue
            prev, cur = self._window_loss[k - 1], self._window_loss[k]
            lpr = learning_progress_ratio(prev, cur)
            old = int(self.staleness)
            self.staleness = next_staleness(old, lpr, self.delta, self.min_staleness, self.max_staleness)
            self.changes.append(StalenessChange(k, (k + 1) * self.window, prev, cur, lpr, old, int(self.staleness)))

    def spec(self) -> dict:
        return {"policy": self.name, "min_staleness": self.min_staleness, "max_staleness": self.max_staleness,
                "window": self.window, "delta": self.delta}

    def state(self) -> dict:
        return {**super().state(), "staleness": int(self.staleness), "closed": self._closed,
                "sums": {str(k): v for k, v in self._sums.items()},
                "counts": {str(k): v for k, v in self._counts.items()},
                "window_loss": {str(k): v for k, v in self._window_loss.items()},
                "changes": [asdict(c) for c in self.changes]}

    def restore(self, state: dict) -> None:
        super().restore(state)
        self.staleness = int(state.get("staleness", self.staleness))
        self._closed = int(state.get("closed", 0))
        self._sums = {int(k): float(v) for k, v in state.get("sums", {}).items()}
        self._counts = {int(k): int(v) for k, v in state.get("counts", {}).items()}
        self._window_loss = {int(k): float(v) for k, v in state.get("window_loss", {}).items()}
        self.changes = [StalenessChange(**c) for c in state.get("changes", [])]
        if not self.min_staleness <= self.staleness <= self.max_staleness:
            raise ValueError(f"staleness {self.staleness} is outside {self.min_staleness}..{self.max_staleness}")

    def describe(self) -> dict:
        return {**super().describe(), **self.spec(), "staleness": int(self.staleness),
                "changes": [asdict(c) for c in self.changes[-20:]]}
