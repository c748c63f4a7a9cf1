"""Deterministic placement of variables onto parameter-server tasks.

:class:`RoundRobinPlacement` follows TF1's ``replica_device_setter``: the i-th
variable created goes to PS task ``i % num_ps``. :class:`GreedyPlacement`
puts the largest variables first onto the least-loaded task. Either may
row-partition variables above a size across all PS tasks (TF1's
``fixed_size_partitioner``); every part is then placed like a variable of its
own. The plan is a pure function of the variable list, so every worker that
builds the same model computes the same map. Variables created after the job
started join it through ``extend``: a pure function of the plan so far and
the new variables in creation order, so the map stays the same on every worker.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from tfdist.errors import PlacementError

__all__ = [
    "VariableSpec",
    "Shard",
    "PlacementPlan",
    "RoundRobinPlacement",
    "GreedyPlacement",
    "make_placement",
]


@dataclass(frozen=True)
class VariableSpec:
    """A variable as the parameter servers see it.

    Attributes:
        key: Unique, creation-ordered key (``"0003/dense/kernel"``).
        dtype: numpy dtype name.
        shape: Static shape.
        trainable: Whether gradients may be pushed for it (gradient path).
    """

    key: str
    dtype: str
    shape: tuple[int, ...]
    trainable: bool = True

    @property
    def nbytes(self) -> int:
        itemsize = 2 if self.dtype == "bfloat16" else np.dtype(self.dtype).itemsize
        return int(math.prod(self.shape)) * itemsize

    def to_dict(self) -> dict:
        return {"key": self.key, "dtype": self.dtype, "shape": list(self.shape), "trainable": self.trainable}

    @classmethod
    def from_dict(cls, d: dict) -> "VariableSpec":
        return cls(str(d["key"]), str(d["dtype"]), tuple(int(x) for x in d["shape"]), bool(d.get("trainable", True)))


@dataclass(frozen=True)
class Shard:
    """A piece of a variable stored on one PS task.

    Attributes:
        key: Key of the piece on the PS (the variable key, plus ``/part_i``
            when partitioned).
        var_key: Key of the whole variable.
        ps: Index of the PS task holding it.
        rows: ``(start, stop)`` rows of the variable, or ``None`` if whole.
    """

    key: str
    var_key: str
    ps: int
    rows: tuple[int, int] | None = None


@dataclass(frozen=True)
class PlacementPlan:
    """Where every variable (or piece of one) lives."""

    num_ps: int
    shards: tuple[Shard, ...]

    def shards_of(self, var_key: str) -> list[Shard]:
        return [s for s in self.shards if s.var_key == var_key]

    def keys_on(self, ps: int) -> list[str]:
        return [s.key for s in self.shards if s.ps == ps]

    def bytes_per_ps(self, specs: Sequence[VariableSpec]) -> list[int]:
        by_key = {s.key: s for s in specs}
        load = [0] * self.num_ps
        for shard in self.shards:
            spec = by_key[shard.var_key]
            if shard.rows is None:
                load[shard.ps] += spec.nbytes
            else:
                row_bytes = spec.nbytes // max(spec.shape[0], 1)
                load[shard.ps] += row_bytes * (shard.rows[1] - shard.rows[0])
        return load

    def as_table(self) -> list[tuple[str, int, tuple[int, int] | None]]:
        """``[(variable key, PS task, rows or None), ...]`` in creation order."""
        return [(s.var_key, s.ps, s.rows) for s in self.shards]

    def describe(self, specs: Sequence[VariableSpec] | None = None) -> str:
        """A human-readable map, one line per shard (for logs)."""
        lines = []
        for s in self.shards:
            rows = "" if s.rows is None else f" rows {s.rows[0]}:{s.rows[1]}"
            lines.append(f"  {s.var_key}{rows} -> ps:{s.ps}")
        if specs is not None:
            lines.append("  bytes per ps: " + ", ".join(f"ps:{i}={b}" for i, b in enumerate(self.bytes_per_ps(specs))))
        return "\n".join(lines)


def _split_rows(spec: VariableSpec, num_ps: int, threshold: int | None) -> list[tuple[int, int] | None]:
    if threshold is None or num_ps < 2 or spec.nbytes <= threshold or len(spec.shape) == 0 or spec.shape[0] < 2:
        return [None]
    parts = min(num_ps, spec.shape[0])
    bounds = np.linspace(0, spec.shape[0], parts + 1).round().astype(int)
    return [(int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:])]


def _check(num_ps: int, specs: Sequence[VariableSpec]) -> None:
    if num_ps < 1:
        raise PlacementError(f"Need at least one PS task to place variables. Received: num_ps={num_ps}.")
    keys = [s.key for s in specs]
    if len(set(keys)) != len(keys):
        dup = sorted({k for k in keys if keys.count(k) > 1})
        raise PlacementError(f"Variable keys must be unique. Received duplicates: {dup}.")


def _part_key(spec: VariableSpec, i: int, rows) -> str:
    return spec.key if rows is None else f"{spec.key}/part_{i}"


class RoundRobinPlacement:
    """Variables (and partition pieces) in creation order over PS tasks.

    Args:
        partition_threshold_bytes: Split variables larger than this by rows
            across all PS tasks. Defaults to ``None`` (never split).
    """

    name = "round_robin"

    def __init__(self, partition_threshold_bytes: int | None = None):
        self.partition_threshold_bytes = partition_threshold_bytes

    def place(self, specs: Sequence[VariableSpec], num_ps: int) -> PlacementPlan:
        _check(num_ps, specs)
        shards, counter = [], 0
        for spec in specs:
            for i, rows in enumerate(_split_rows(spec, num_ps, self.partition_threshold_bytes)):
                shards.append(Shard(_part_key(spec, i, rows), spec.key, counter % num_ps, rows))
                counter += 1
        return PlacementPlan(num_ps, tuple(shards))

    def extend(self, plan: PlacementPlan, specs: Sequence[VariableSpec], new: Sequence[VariableSpec]
               ) -> PlacementPlan:
        """``plan`` (of ``specs``) with ``new`` variables placed after them: the counter goes on.

        The result equals ``place(specs + new)``: the i-th piece goes to task
        ``i % num_ps`` however the variables were added.
        """
        _check(plan.num_ps, [*specs, *new])
        shards, counter = list(plan.shards), len(plan.shards)
        for spec in new:
            for i, rows in enumerate(_split_rows(spec, plan.num_ps, self.partition_threshold_bytes)):
                shards.append(Shard(_part_key(spec, i, rows), spec.key, counter % plan.num_ps, rows))
                counter += 1
        return PlacementPlan(plan.num_ps, tuple(shards))


class GreedyPlacement:
    """Largest piece first onto the PS task with the fewest bytes so far.

    Ties go to the lowest task index, so the plan is deterministic. The plan
    lists shards in creation order regardless of the order they were placed.

    Args:
        partition_threshold_bytes: As for :class:`RoundRobinPlacement`.
    """

    name = "greedy"

    def __init__(self, partition_threshold_bytes: int | None = None):
        self.partition_threshold_bytes = partition_threshold_bytes

    def place(self, specs: Sequence[VariableSpec], num_ps: int) -> PlacementPlan:
        _check(num_ps, specs)
        pieces = []  # (order, key, var_key, rows, nbytes)
        for spec in specs:
            row_bytes = spec.nbytes // max(spec.shape[0], 1) if spec.shape else spec.nbytes
            for i, rows in enumerate(_split_rows(spec, num_ps, self.partition_threshold_bytes)):
                nbytes = spec.nbytes if rows is None else row_bytes * (rows[1] - rows[0])
                pieces.append((len(pieces), _part_key(spec, i, rows), spec.key, rows, nbytes))
        load = [0] * num_ps
        assigned = {}
        for order, key, var_key, rows, nbytes in sorted(pieces, key=lambda p: (-p[4], p[0])):
            ps = min(range(num_ps), key=lambda j: (load[j], j))
            load[ps] += nbytes
            assigned[order] = Shard(key, var_key, ps, rows)
        return PlacementPlan(num_ps, tuple(assigned[i] for i in range(len(pieces))))

    def extend(self, plan: PlacementPlan, specs: Sequence[VariableSpec], new: Sequence[VariableSpec]
               ) -> PlacementPlan:
        """``plan`` (of ``specs``) with ``new`` variables added, each piece in creation order onto the task
        with the fewest bytes so far (not largest first: the result must not depend on how the variables
        that join a running job are grouped, so every worker computes the same plan)."""
        _check(plan.num_ps, [*specs, *new])
        load = plan.bytes_per_ps(specs)
        shards = list(plan.shards)
        for spec in new:
            row_bytes = spec.nbytes // max(spec.shape[0], 1) if spec.shape else spec.nbytes
            for i, rows in enumerate(_split_rows(spec, plan.num_ps, self.partition_threshold_bytes)):
                nbytes = spec.nbytes if rows is None else row_bytes * (rows[1] - rows[0])
                ps = min(range(plan.num_ps), key=lambda j: (load[j], j))
                load[ps] += nbytes
                shards.append(Shard(_part_key(spec, i, rows), spec.key, ps, rows))
        return PlacementPlan(plan.num_ps, tuple(shards))


def make_placement(name: str, partition_threshold_bytes: int | None = None):
    """Returns the placement named ``"round_robin"`` or ``"greedy"``."""
    classes = {c.name: c for c in (RoundRobinPlacement, GreedyPlacement)}
    if name not in classes:
        raise PlacementError(f"Unknown placement. Received: placement={name!r}. Use one of {sorted(classes)}.")
    return classes[name](partition_threshold_bytes)
