"""Persistent-straggler replacement: start a spare, remove the straggler only once the spare has joined.

Or, Zhang and Freedman, "Resource Elasticity in Distributed Deep Learning"
(MLSys 2020; ``shared/seeds/002_*``, DESIGN.md §7): a worker whose EWMA of
throughput ÷ median throughput stays below 0.8 is a *persistent* straggler
(detected by :class:`tfdist.straggler.EwmaDetector`, alpha 0.1). Removing it
at once would cost the job its throughput until a new worker is ready, so the
engine first starts a replacement, lets it warm up and join, and only then
removes the straggler.

The :class:`ReplacementPlanner` turns the detector's verdicts into
:class:`ReplacementAction` values; the engine carries them out and reports
back:

1. ``start_spare`` (``worker`` = the straggler): start one new worker. The
   engine calls :meth:`ReplacementPlanner.spare_started` with the new
   worker's id.
2. ``remove`` (``worker`` = the straggler): the spare is among the ``joined``
   workers given to :meth:`ReplacementPlanner.plan`; drain the straggler. The
   engine calls :meth:`ReplacementPlanner.forget` once it has left.

At most ``max_spares`` spares are *pending* at any time: requested and not
started yet, or started and not joined yet.

Choices tfdist makes where the paper is silent:

* Each :meth:`ReplacementPlanner.observe` call is one iteration of the
  detector. The default detector config uses ``window=1`` because the engine
  already averages its windows; a config with ``window=w`` updates the
  averages every ``w`` calls.
* Workers come and go: each worker id gets its own detector slot the first
  time it is seen (its EWMA starts at 1.0: presumed normal), a worker missing
  from one window keeps its average, and :meth:`ReplacementPlanner.forget`
  frees its id (an id seen again later is a new worker and starts normal).
* Several stragglers waiting for a spare are served worst first (lowest
  EWMA), then by id.
* Actions are emitted **once**: the planner remembers what it asked for.
  An engine that cannot start a requested spare calls
  :meth:`ReplacementPlanner.cancel_spare`; the straggler is then asked for
  again at the next :meth:`ReplacementPlanner.plan`.
* A straggler that **recovers** before its spare has started is not
  replaced (the request is dropped). One that recovers after its spare has
  started is kept, and the spare **stays as an extra worker**: when it joins,
  the planner emits ``keep_spare`` (``worker`` = the spare; nothing to do but
  log it). Likewise when the straggler left or crashed before its spare
  joined: the spare takes its place. The scaling policy, which owns the job
  size, decides what happens to the extra worker.
* A spare that leaves before it joined (:meth:`ReplacementPlanner.forget`)
  frees its straggler, which is asked a new spare for at the next plan.

No I/O, no clock, no TensorFlow.

Example:

>>> planner = ReplacementPlanner(max_spares=1)
>>> for _ in range(4):  # worker 3 runs at 0.4x the median
...     planner.observe({0: 10.0, 1: 10.0, 2: 10.0, 3: 4.0})
>>> [(a.kind, a.worker) for a in planner.plan(joined={0, 1, 2, 3})]
[('start_spare', 3)]
>>> planner.spare_started(4, replaces=3)
>>> planner.plan(joined={0, 1, 2, 3})  # the spare is still warming up
[]
>>> [(a.kind, a.worker) for a in planner.plan(joined={0, 1, 2, 3, 4})]
[('remove', 3)]
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

import numpy as np

from tfdist.errors import ConfigError
from tfdist.straggler.ewma import EwmaConfig, EwmaDetector
from tfdist.straggler.verdicts import json_ready

__all__ = ["START_SPARE", "REMOVE", "KEEP_SPARE", "ReplacementAction", "ReplacementPlanner"]

#: Start one new worker to replace ``worker`` (a persistent straggler).
START_SPARE = "start_spare"
#: Remove ``worker`` (a persistent straggler whose spare has joined).
REMOVE = "remove"
#: Nothing to do: spare ``worker`` joined and stays (its straggler recovered or left). For the log.
KEEP_SPARE = "keep_spare"

_INITIAL_SLOTS = 8


@dataclass(frozen=True)
class ReplacementAction:
    """One thing the engine should do about persistent stragglers.

    Attributes:
        kind: :data:`START_SPARE`, :data:`REMOVE` or :data:`KEEP_SPARE`.
        worker: The straggler (``start_spare``, ``remove``) or the spare
            (``keep_spare``).
        reason: One sentence for the log.
        numbers: The numbers behind it (EWMA, threshold, pending spares, ...).
    """

    kind: str
    worker: int | None
    reason: str
    numbers: dict = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict for the engine's log."""
        return {"kind": self.kind, "worker": self.worker, "reason": self.reason, "numbers": json_ready(self.numbers)}


def _check_id(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
        raise ValueError(f"`{name}` must be a worker id (an integer >= 0). Received: {name}={value!r}.")
    return int(value)


class ReplacementPlanner:
    """Plans replacement-before-removal of persistent stragglers, with a cap on spares.

    Args:
        max_spares: Most spares pending at once (requested or starting, not
            joined yet). 0 turns replacement off. Defaults to 1.
        ewma: The :class:`tfdist.straggler.EwmaConfig` of the detector.
            Defaults to ``EwmaConfig(window=1)`` (alpha 0.1, threshold 0.8,
            one window per :meth:`observe`).
    """

    def __init__(self, max_spares: int = 1, ewma: EwmaConfig | None = None):
        if isinstance(max_spares, bool) or not isinstance(max_spares, int) or max_spares < 0:
            raise ConfigError(
                f"Invalid config field `max_spares`. Received: max_spares={max_spares!r}. "
                "Give an integer >= 0 (0 turns straggler replacement off)."
            )
        if ewma is not None and not isinstance(ewma, EwmaConfig):
            raise ConfigError(
                f"Invalid config field `ewma`. Received: ewma={ewma!r}. Give a tfdist.straggler.EwmaConfig or None."
            )
        self.max_spares = max_spares
        self.ewma_config = ewma if ewma is not None else EwmaConfig(window=1)
        self._detector = EwmaDetector(_INITIAL_SLOTS, self.ewma_config)
        self._slot: dict[int, int] = {}  # live worker id -> detector slot (slots are never reused)
        self._next_slot = 0
        self._ratios: dict[int, float] = {}  # last window's throughput / median, by worker
        self._requested: set[int] = set()  # stragglers with a start_spare emitted, no spare started yet
        self._spare_of: dict[int, int] = {}  # straggler -> its started spare (until the spare joined)
        self._replaces: dict[int, int | None] = {}  # started spare -> straggler (None: the straggler left)
        self._removing: set[int] = set()  # stragglers with a remove emitted, not forgotten yet
        self._windows = 0

    # ------------------------------------------------------------------ inputs
    def observe(self, throughputs: Mapping[int, float | None]) -> None:
        """One window of per-worker throughputs (any unit, the same for all).

        Args:
            throughputs: ``{worker id: throughput}`` of the workers that count
                (not of spares still warming up). ``None`` (or a worker left
                out) means no data this window; its average is kept.
        """
        if not isinstance(throughputs, Mapping):
            raise ValueError(f"`throughputs` must map worker ids to throughputs. Received: {throughputs!r}.")
        rates = {}
        for worker, rate in throughputs.items():
            worker = _check_id("worker", worker)
            if rate is not None and (isinstance(rate, bool) or not isinstance(rate, (int, float, np.floating))
                                     or not math.isfinite(rate) or rate < 0):
                raise ValueError(
                    f"Throughputs must be finite numbers >= 0 or None. Received: throughputs[{worker}]={rate!r}."
                )
            rates[worker] = rate
        for worker in rates:
            if worker not in self._slot:
                self._assign_slot(worker)
        row: list[float | None] = [None] * self._detector.num_workers
        for worker, rate in rates.items():
            row[self._slot[worker]] = None if rate is None else float(rate)
        verdict = self._detector.observe_throughputs(row)
        self._windows += 1
        if verdict.updated:
            self._ratios = {w: verdict.ratios[s] for w, s in self._slot.items() if not math.isnan(verdict.ratios[s])}

    def spare_started(self, spare: int, replaces: int) -> None:
        """The engine started worker ``spare`` to replace straggler ``replaces``."""
        spare, replaces = _check_id("spare", spare), _check_id("replaces", replaces)
        if spare in self._replaces:
            raise ValueError(f"Spare {spare} was already started (for worker {self._replaces[spare]}).")
        if replaces in self._spare_of:
            raise ValueError(
                f"Worker {replaces} already has a spare starting ({self._spare_of[replaces]}). Received: "
                f"spare={spare}. Call forget({self._spare_of[replaces]}) first if that spare is gone."
            )
        self._requested.discard(replaces)
        if replaces in self._slot:
            self._spare_of[replaces] = spare
            self._replaces[spare] = replaces
        else:  # the straggler already left: the spare takes its place
            self._replaces[spare] = None

    def cancel_spare(self, replaces: int) -> None:
        """The engine could not start the spare requested for ``replaces``; it may be asked for again."""
        self._requested.discard(_check_id("replaces", replaces))

    def forget(self, worker: int) -> None:
        """Worker ``worker`` left the job (removed, drained or crashed)."""
        worker = _check_id("worker", worker)
        self._slot.pop(worker, None)
        self._ratios.pop(worker, None)
        self._requested.discard(worker)
        self._removing.discard(worker)
        if worker in self._spare_of:  # a straggler left before its spare joined: the spare takes its place
            self._replaces[self._spare_of.pop(worker)] = None
        if worker in self._replaces:  # a spare left before it joined: its straggler needs a new one
            straggler = self._replaces.pop(worker)
            if straggler is not None:
                self._spare_of.pop(straggler, None)

    # ------------------------------------------------------------------ views
    @property
    def stragglers(self) -> frozenset[int]:
        """Live workers the detector calls persistent stragglers now."""
        flagged = self._detector.stragglers
        return frozenset(w for w, s in self._slot.items() if s in flagged)

    @property
    def ewma(self) -> dict[int, float]:
        """Each live worker's EWMA of throughput ÷ median."""
        values = self._detector.ewma
        return {w: values[s] for w, s in sorted(self._slot.items())}

    @property
    def pending_spares(self) -> int:
        """Spares requested or starting that have not joined yet."""
        return len(self._requested) + len(self._replaces)

    def describe(self) -> dict[str, Any]:
        """A JSON-ready summary for the log."""
        return json_ready({
            "windows": self._windows,
            "max_spares": self.max_spares,
            "ewma": self.ewma,
            "stragglers": self.stragglers,
            "requested": self._requested,
            "starting": dict(self._replaces),
            "removing": self._removing,
        })

    # ------------------------------------------------------------------ plan
    def plan(self, joined: Iterable[int]) -> list[ReplacementAction]:
        """What to do now; each action is returned once.

        Args:
            joined: Ids of the workers that count in the job now (at least
                the spares that have finished warming up and joined; other ids
                are ignored).

        Returns:
            ``remove``/``keep_spare`` actions for spares that have joined,
            then ``start_spare`` actions for stragglers without a spare, while
            fewer than ``max_spares`` spares are pending.
        """
        joined = {_check_id("joined", w) for w in joined}
        stragglers = self.stragglers
        ewma = self.ewma
        threshold = self.ewma_config.threshold
        recovery = self.ewma_config.recovery_threshold
        recovery = threshold if recovery is None else recovery
        actions: list[ReplacementAction] = []

        self._requested &= stragglers  # recovered (or left) before a spare started: no spare needed

        for spare in sorted(self._replaces):
            if spare not in joined:
                continue
            straggler = self._replaces.pop(spare)
            numbers = {"spare": spare, "straggler": straggler, "threshold": threshold,
                       "ewma": None if straggler is None else ewma.get(straggler)}
            if straggler is None:
                actions.append(ReplacementAction(
                    KEEP_SPARE, spare, f"Spare {spare} joined; the worker it was to replace has left, so it takes "
                                       "its place.", numbers))
                continue
            self._spare_of.pop(straggler, None)
            if straggler in stragglers:
                self._removing.add(straggler)
                actions.append(ReplacementAction(
                    REMOVE, straggler, f"Spare {spare} has joined; removing persistent straggler {straggler} "
                                       f"(EWMA {ewma[straggler]:.3f} < {threshold:g}).", numbers))
            else:
                actions.append(ReplacementAction(
                    KEEP_SPARE, spare, f"Worker {straggler} recovered (EWMA {ewma[straggler]:.3f} >= {recovery:g}) "
                                       f"before its spare {spare} joined; the spare stays as an extra worker.",
                                       {**numbers, "recovery_threshold": recovery}))

        waiting = stragglers - self._requested - set(self._spare_of) - self._removing
        for straggler in sorted(waiting, key=lambda w: (ewma[w], w)):
            if self.pending_spares >= self.max_spares:
                break
            self._requested.add(straggler)
            numbers = {"ewma": ewma[straggler], "ratio": self._ratios.get(straggler), "threshold": threshold,
                       "alpha": self.ewma_config.alpha, "pending_spares": self.pending_spares,
                       "max_spares": self.max_spares, "windows": self._windows}
            actions.append(ReplacementAction(
                START_SPARE, straggler,
                f"Worker {straggler} is a persistent straggler (EWMA of throughput/median {ewma[straggler]:.3f} < "
                f"{threshold:g}); starting a spare to replace it ({self.pending_spares} of {self.max_spares} "
                "spare(s) pending).", numbers))
        return actions

    # ------------------------------------------------------------------ internals
    def _assign_slot(self, worker: int) -> None:
        if self._next_slot >= self._detector.num_workers:
            self._grow(max(2 * self._detector.num_workers, self._next_slot + 1))
        self._slot[worker] = self._next_slot
        self._next_slot += 1

    def _grow(self, size: int) -> None:
        """Moves the detector's state into a larger detector; new slots start fresh (EWMA 1.0, no data)."""
        old_size = self._detector.num_workers
        old = self._detector.state_dict()
        bigger = EwmaDetector(size, self.ewma_config)
        state = bigger.state_dict()
        for key, value in old.items():
            if isinstance(value, np.ndarray) and value.shape[:1] == (old_size,):
                state[key][:old_size] = value
            else:
                state[key] = value
        bigger.load_state_dict(state)
        self._detector = bigger
