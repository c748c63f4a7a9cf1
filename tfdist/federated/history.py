"""What a simulation run returns: per-round metrics, timings and the update log."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

__all__ = ["RoundRecord", "AppliedUpdate", "History"]


@dataclasses.dataclass
class RoundRecord:
    """One round.

    Attributes:
        round: 1-based round (0 = the initial model).
        sim_time: simulated clock at the end of the round (seconds).
        wall_time_s: real seconds the round took in the main process.
        num_dispatched: client updates sent out this round.
        num_applied: updates that arrived (and were applied) this round.
        mean_staleness: mean staleness (rounds) of the applied updates.
        metrics: test metrics of the model(s) after the round (``accuracy``, ``loss``, ...).
    """

    round: int
    sim_time: float
    wall_time_s: float
    num_dispatched: int
    num_applied: int
    mean_staleness: float
    metrics: dict = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class AppliedUpdate:
    """One client update, in the order the main process applied it."""

    client_id: int
    round_dispatched: int
    round_applied: int
    dispatch_time: float
    arrival_time: float
    staleness: int
    byzantine: bool
    worker: str


@dataclasses.dataclass
class History:
    """The result of :meth:`tfdist.federated.Simulation.run`.

    Attributes:
        rounds: one :class:`RoundRecord` per round, starting with round 0.
        updates: every applied client update in application order.
        wall_time_s: seconds of the whole run, start-up included.
        startup_s: seconds to start the workers (spawn, import TF, build models).
        loop_wall_s: seconds from the first round's start until the last
            evaluation came back (what ``rounds_per_s`` divides by).
        worker_busy_s: seconds each worker spent training clients.
        config: the resolved settings of the run.
    """

    rounds: list = dataclasses.field(default_factory=list)
    updates: list = dataclasses.field(default_factory=list)
    wall_time_s: float = 0.0
    startup_s: float = 0.0
    loop_wall_s: float = 0.0
    worker_busy_s: dict = dataclasses.field(default_factory=dict)
    config: dict = dataclasses.field(default_factory=dict)

    @property
    def accuracy(self) -> list:
        """Test accuracy after each round (``None`` where not evaluated)."""
        return [r.metrics.get("accuracy") for r in self.rounds]

    @property
    def final_accuracy(self) -> float | None:
        values = [a for a in self.accuracy if a is not None]
        return values[-1] if values else None

    @property
    def training_wall_s(self) -> float:
        """Seconds of the rounds alone (start-up excluded)."""
        return sum(r.wall_time_s for r in self.rounds)

    @property
    def rounds_per_s(self) -> float:
        """Rounds per second of the round loop (evaluations included, start-up excluded)."""
        n = sum(1 for r in self.rounds if r.round > 0)
        return n / self.loop_wall_s if self.loop_wall_s > 0 else float("nan")

    @property
    def worker_utilisation(self) -> float:
        """Mean share of the round loop's wall time the train workers spent training."""
        if not self.worker_busy_s or self.loop_wall_s <= 0:
            return float("nan")
        return sum(self.worker_busy_s.values()) / (len(self.worker_busy_s) * self.loop_wall_s)

    def summary(self) -> dict:
        return {
            "rounds": sum(1 for r in self.rounds if r.round > 0),
            "final_accuracy": self.final_accuracy,
            "wall_time_s": self.wall_time_s,
            "startup_s": self.startup_s,
            "training_wall_s": self.training_wall_s,
            "loop_wall_s": self.loop_wall_s,
            "rounds_per_s": self.rounds_per_s,
            "worker_utilisation": self.worker_utilisation,
            "sim_time": self.rounds[-1].sim_time if self.rounds else 0.0,
        }

    def to_dict(self) -> dict[str, Any]:
        return {
            "summary": self.summary(),
            "rounds": [dataclasses.asdict(r) for r in self.rounds],
            "updates": [dataclasses.asdict(u) for u in self.updates],
            "worker_busy_s": dict(self.worker_busy_s),
            "config": self.config,
        }

    def save_json(self, path: str) -> None:
        with open(path, "w", encoding="utf-8") as f:
            json.dump(self.to_dict(), f, indent=1, default=str)
