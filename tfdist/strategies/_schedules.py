"""The update path's exchange schedules: when and how a worker's training steps reach the PS.

A schedule is chosen once per strategy (:func:`choose_schedule`) from the
mode's facts and the config, and fixed for good when the first training step
is traced (a local-only candidate then falls back to its ``fallback`` if the
job has PS-resident tables, an injected slow-down or elastic warm-up, which
need a step that runs Python). Nothing else in the runtime decides it.

=================  =========================================================================
schedule           when it is chosen, what a step does
=================  =========================================================================
``Blocking``       SSP, DTSSP; ASP with ``overlap_exchange: false``: the step's update is
                   pushed and fresh values come back before the next step.
``Overlapped``     ASP (default): the exchange runs in the background while the next step
                   computes; its corrections are added at the next exchange.
``EveryK``         ASP with ``exchange_every: k``: k − 1 steps stay local, the k-th sends their
                   sum through the inner schedule (blocking or overlapped). A step that
                   stays local runs no Python where it can (the graph counts it: no
                   tables, slow-down or elastic membership).
``Adaptive``       ASP with ``exchange_every: auto`` (the default): as ``EveryK``, with k
                   chosen from the measured CPU of the worker's exchanges and steps (1 to
                   ``exchange_every_max``), at most the steps whose update stays within
                   ``AUTO_UPDATE_BOUND`` of the weights.
``LocalOnly``      ASP in one process with its in-process PS (no cluster, no checkpoints):
                   Keras's own step plus a step counter; the steps reach the PS before
                   anything reads it (``flush_local_steps``). Falls back to every-100.
``LoneWorker``     ASP, the only training worker of a job with remote PS tasks
                   (``lone_worker_exchange_s`` > 0, not elastic): local-only steps, sent every
                   ``lone_worker_exchange_s`` by a background thread. Falls back to the
                   per-step schedule.
=================  =========================================================================

The runtime (:class:`~tfdist.strategies._update_path.UpdatePathRuntime`) owns
the steps not sent yet; a schedule owns only what is its own (the lone
worker's thread and its failure).
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from tfdist.config import JobConfig
    from tfdist.consistency import ConsistencyPolicy

#: The update path's runtime (:class:`tfdist.strategies._update_path.UpdatePathRuntime`), which holds the
#: schedule; named, not imported, so that the runtime's module stays the only one that imports the other.
UpdatePathRuntime = Any

__all__ = [
    "AUTO_EXCHANGE_CPU_SHARE",
    "AUTO_HYSTERESIS_STEPS",
    "AUTO_UPDATE_BOUND",
    "SINGLE_PROCESS_EXCHANGE_EVERY",
    "Adaptive",
    "Blocking",
    "EveryK",
    "LocalOnly",
    "LoneWorker",
    "Overlapped",
    "Schedule",
    "choose_schedule",
    "measured_keys",
    "steps_per_exchange",
    "steps_with_hysteresis",
    "steps_within_bound",
]

logger = logging.getLogger(__name__)

#: Async training as one process (no cluster, in-process PS) that cannot run local-only steps: the worker's
#: steps reach the PS this often (and before every read), since nothing else reads the PS meanwhile.
SINGLE_PROCESS_EXCHANGE_EVERY = 100


class Schedule:
    """A per-step schedule: every training step is exchanged (see the module's table).

    Attributes:
        name: For logs and ``describe``.
        every: Training steps per exchange (the others stay local and travel
            summed with the last one).
        overlapped: The exchange runs in the background while the next step
            computes (ASP): its corrections are added, not assigned.
        local_only: Steps run without any exchange (Keras's step plus a counter).
        may_hold: Steps may stay local between exchanges (``every`` above 1
            now or later): the runtime lets such steps skip Python in the graph.
    """

    name = "blocking"
    every = 1
    overlapped = False
    local_only = False
    may_hold = False

    def holds(self, unsent_steps: int) -> bool:
        """Whether the step ending now stays local (``unsent_steps`` held before it)."""
        return unsent_steps + 1 < self.every

    def exchange(self, rt: UpdatePathRuntime, values: Mapping[str, np.ndarray], loss: float | None,
                 steps: int) -> None:
        """Sends ``steps`` steps (their update: ``values`` minus what the PS last gave) and takes the answer."""
        send_blocking(rt, values, loss, steps)

    def __repr__(self) -> str:
        return self.name


class Blocking(Schedule):
    """Push, then wait for fresh values, every step."""


class Overlapped(Schedule):
    """ASP: the exchange of step t travels while step t+1 computes."""

    name = "overlapped"
    overlapped = True

    def exchange(self, rt, values, loss, steps) -> None:
        send_overlapped(rt, values, loss, steps)


class EveryK(Schedule):
    """ASP with ``exchange_every: k``: one exchange per ``k`` steps, through ``inner``."""

    may_hold = True

    def __init__(self, inner: Schedule, k: int):
        self.inner, self.every = inner, int(k)
        self.overlapped = inner.overlapped
        self.name = f"every-{self.every} ({inner.name})"

    def exchange(self, rt, values, loss, steps) -> None:
        self.inner.exchange(rt, values, loss, steps)


#: ``exchange_every: auto``: the share of its steps' CPU a worker's exchanges may take (the worker's own
#: exchange CPU and what the PS tasks report serving it cost them; gRPC's C threads are not counted).
AUTO_EXCHANGE_CPU_SHARE = 0.1
#: ``exchange_every: auto`` keeps its steps per exchange until fewer would keep the exchange's CPU within its
#: share with this many steps to spare: a measure near a boundary (an exchange at 1.1 steps' share one window,
#: 0.9 the next) does not flip the schedule back and forth, and a flip to fewer steps costs every step after it.
AUTO_HYSTERESIS_STEPS = 0.5


def steps_per_exchange(exchange_cpu_s: float, step_cpu_s: float, share: float, most: int) -> int:
    """The fewest steps per exchange that keep one exchange's CPU within ``share`` of those steps' CPU.

    >>> steps_per_exchange(0.004, 0.010, 0.1, 8)   # an exchange costs 40 % of a step: 4 steps per exchange
    4
    >>> steps_per_exchange(0.004, 0.100, 0.1, 8)   # a step 25x the exchange: every step
    1
    """
    steps = _steps_needed(exchange_cpu_s, step_cpu_s, share)
    if steps is None:
        return most
    return max(1, min(most, math.ceil(steps - 1e-9)))


def _steps_needed(exchange_cpu_s: float, step_cpu_s: float, share: float) -> float | None:
    """``exchange / (share * step)``: the (fractional) steps whose CPU ``share`` covers one exchange; None when a
    step's CPU is too small to divide by."""
    per_step = share * step_cpu_s
    if not per_step > 0:  # (a denormal step's CPU times the share is 0: found by hypothesis)
        return None
    steps = exchange_cpu_s / per_step
    return steps if math.isfinite(steps) else None  # (found by hypothesis)


def steps_with_hysteresis(exchange_cpu_s: float, step_cpu_s: float, share: float, most: int, current: int,
                          spare: float = AUTO_HYSTERESIS_STEPS) -> int:
    """:func:`steps_per_exchange`, but fewer steps than ``current`` only with ``spare`` steps to spare.

    >>> steps_with_hysteresis(0.0045, 0.040, 0.1, 8, current=2)   # 1.1 steps' share: stays at 2
    2
    >>> steps_with_hysteresis(0.0055, 0.040, 0.1, 8, current=3)   # 1.4 steps' share: 3 -> 2, not 3
    2
    >>> steps_with_hysteresis(0.0020, 0.040, 0.1, 8, current=2)   # 0.5 steps' share: 1
    1
    """
    wanted = steps_per_exchange(exchange_cpu_s, step_cpu_s, share, most)
    if wanted >= current:
        return wanted
    steps = _steps_needed(exchange_cpu_s, step_cpu_s, share)
    # step down only as far as keeps ``spare`` steps to spare: to k once steps <= k - spare
    return max(wanted, min(current, math.ceil(steps + spare - 1e-9))) if steps is not None else wanted


#: ``exchange_every: auto``: how large one exchange's update may be against the values it changes (the largest
#: ratio of L2 norms over the trainable weight matrices, :func:`tfdist.ps.update_session.relative_update`).
#: Local steps cost accuracy when the model moves much between exchanges (a large learning rate: a digits MLP with
#: Adam 1e-2 moves ~0.8 % per step and lost ~0.1 of accuracy at 4 steps per exchange; with Adam 1e-4 an MLP
#: moves ~0.07 % per step and lost nothing at 5-8, docs/benchmarks.md).
AUTO_UPDATE_BOUND = 0.01


def steps_within_bound(update_size: float, steps: int, bound: float) -> float:
    """How many steps' update may reach ``bound``, from one of ``steps`` steps that reached ``update_size``.

    Linear in the steps (as updates in one direction add up; updates that
    partly cancel grow slower, and repeated use settles at the bound).

    >>> steps_within_bound(0.002, 1, 0.01)   # a step moves the weights 0.2 %: 5 steps per exchange
    5.0
    >>> round(steps_within_bound(0.03, 4, 0.01), 4)    # 4 steps moved them 3 %: 1.33 steps
    1.3333
    """
    if update_size <= 0:
        return math.inf
    return steps * bound / update_size


class Adaptive(Schedule):
    """ASP with ``exchange_every: auto``: ``every`` follows the measured CPU of exchanges and steps.

    At each exchange it reads the process's CPU time and the CPU the
    session counted in its exchanges (``stats["exchange_cpu_seconds"]``: the
    exchange thread's and the client threads'); since the previous exchange,
    their difference over the steps sent is one step's CPU. An exchange's
    CPU is the worker's plus what the PS tasks report serving it cost them
    (``stats["server_cpu_seconds"]``, from the replies of stream
    connections: on one host the PS tasks take the workers' cores; where
    they report nothing, only the worker's counts). Both are smoothed
    (exponentially, ``smoothing``) and ``every`` becomes
    :func:`steps_per_exchange` of them, from 1 to ``most``; it goes down
    only with :data:`AUTO_HYSTERESIS_STEPS` to spare
    (:func:`steps_with_hysteresis`), so that a measure near a boundary does
    not flip it. It starts at 1.

    The size of the update also bounds it: the session measures each
    update against the values it changes (``session.last_update_size``, the
    trainable weight matrices), and ``every`` never exceeds the steps whose
    update stays within ``update_bound`` (:func:`steps_within_bound`,
    smoothed likewise). A job that moves its weights fast (a large learning
    rate) keeps exchanging every step, one that moves them slowly may wait.
    """

    may_hold = True

    def __init__(self, inner: Schedule, most: int, share: float = AUTO_EXCHANGE_CPU_SHARE,
                 smoothing: float = 0.3, process_time=time.process_time, update_bound: float = AUTO_UPDATE_BOUND):
        self.inner, self.most, self.share, self.smoothing = inner, int(most), float(share), float(smoothing)
        self.update_bound = float(update_bound)
        self.every = 1
        self.overlapped = inner.overlapped
        self.name = f"every-auto (1..{self.most}, {inner.name})"
        self._process_time = process_time
        #: (process CPU, exchange CPU, the PS tasks' CPU) at the previous exchange
        self._last: tuple[float, float, float] | None = None
        #: Smoothed CPU seconds of one exchange (the PS tasks' part included; that part alone: ``server_cpu_s``)
        #: and of one step (None before the second exchange).
        self.exchange_cpu_s: float | None = None
        self.server_cpu_s: float | None = None
        self.step_cpu_s: float | None = None
        #: Smoothed steps whose update stays within ``update_bound`` (None before the first measured update).
        self.steps_in_bound: float | None = None
        self._measured_specs = -1  # how many registered variables ``session.update_size_keys`` was built from
        self._cpu_every = 1  # what the CPU rule chose last (before the update-size bound)

    def exchange(self, rt, values, loss, steps) -> None:
        session = rt.session
        specs = rt.registry.specs
        if self._measured_specs != len(specs):  # (variables may join the job later)
            session.update_size_keys = measured_keys(specs)
            self._measured_specs = len(specs)
        session.last_update_size = None
        self.inner.exchange(rt, values, loss, steps)
        before = self.every
        self.observe(self._process_time(), float(session.stats.get("exchange_cpu_seconds", 0.0)), steps,
                     session.last_update_size, float(session.stats.get("server_cpu_seconds", 0.0)))
        if self.every != before:
            logger.info("worker %d: exchange_every auto: %d step(s) per exchange (an exchange ~%.1f ms of CPU, "
                        "%.1f of them on the PS tasks; a step ~%.1f ms; %s step(s) move the weights %.1f %%)",
                        rt.worker_id, self.every, 1e3 * (self.exchange_cpu_s or 0.0),
                        1e3 * (self.server_cpu_s or 0.0), 1e3 * (self.step_cpu_s or 0.0),
                        "%.1f" % self.steps_in_bound if self.steps_in_bound is not None else "any",
                        100 * self.update_bound)

    def observe(self, process_cpu_s: float, exchange_cpu_s: float, steps: int,
                update_size: float | None = None, server_cpu_s: float = 0.0) -> int:
        """Takes the counters read at an exchange of ``steps`` steps (and its update's size); returns ``every``.

        ``server_cpu_s``: the session's running total of what the PS tasks
        reported (0 where they report nothing); it counts in the exchange's
        CPU. (The PS tasks run in other processes wherever ``auto`` applies:
        a single process with its in-process PS never uses it, so their CPU
        is not in ``process_cpu_s`` as well.)
        """
        a = self.smoothing
        if update_size is not None and steps >= 1:
            allowed = min(steps_within_bound(update_size, steps, self.update_bound), float(self.most))
            self.steps_in_bound = allowed if self.steps_in_bound is None else (1 - a) * self.steps_in_bound + a * allowed
        last, self._last = self._last, (process_cpu_s, exchange_cpu_s, server_cpu_s)
        if last is not None and steps >= 1:
            own = max(exchange_cpu_s - last[1], 0.0)
            server = server_cpu_s - last[2]
            server = server if math.isfinite(server) and server > 0 else 0.0
            step = max(process_cpu_s - last[0] - own, 0.0) / steps
            exchange = own + server
            self.exchange_cpu_s = exchange if self.exchange_cpu_s is None else (1 - a) * self.exchange_cpu_s + a * exchange
            self.server_cpu_s = server if self.server_cpu_s is None else (1 - a) * self.server_cpu_s + a * server
            self.step_cpu_s = step if self.step_cpu_s is None else (1 - a) * self.step_cpu_s + a * step
        if self.exchange_cpu_s is None:
            return self.every
        self._cpu_every = steps_with_hysteresis(self.exchange_cpu_s, self.step_cpu_s, self.share, self.most,
                                                self._cpu_every)
        every = self._cpu_every
        if self.steps_in_bound is not None:  # (the accuracy bound, without hysteresis)
            every = min(every, max(1, math.floor(self.steps_in_bound + 1e-9)))
        self.every = every
        return self.every


def measured_keys(specs) -> frozenset[str]:
    """The variables whose update ``exchange_every: auto`` measures: the trainable floating matrices.

    Biases and other vectors start at zero and would count as changed
    without bound; when a model has no trainable matrix, every trainable
    floating variable counts.
    """
    floating = [s for s in specs if s.trainable and np.dtype(s.dtype).kind == "f"]
    matrices = [s for s in floating if len(s.shape) >= 2]
    return frozenset(s.key for s in (matrices or floating))


class LocalOnly(Schedule):
    """Steps without an exchange; they reach the PS when something reads it. ``fallback``: see the module doc."""

    name = "local-only"
    local_only = True

    def __init__(self, fallback: Schedule):
        self.fallback = fallback


class LoneWorker(LocalOnly):
    """A lone worker: local-only steps, sent by a background thread every ``interval_s``.

    Nobody else writes to the PS, so its local values are the job's. The
    thread's failure stops training at the next step (``failed``, a variable
    the step asserts on); after a recovery the PS tasks must get this worker's
    state back (``resync``).
    """

    name = "lone-worker"

    def __init__(self, fallback: Schedule, interval_s: float):
        super().__init__(fallback)
        self.interval_s = float(interval_s)
        self.error: BaseException | None = None
        self.resync = False
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()

    def start(self, rt: UpdatePathRuntime) -> None:
        """The first step is being traced: joins the job now (eager) and starts the background exchange."""
        import tensorflow as tf

        with tf.init_scope():  # eager, out of the step's trace: the chief initialises the PS with its values
            rt.ensure_session()
        logger.info("worker %d is the job's only training worker: its steps run without an exchange; their "
                    "update reaches the PS every %g s in the background (strategy.lone_worker_exchange_s)",
                    rt.worker_id, self.interval_s)
        self._thread = threading.Thread(target=self._loop, args=(rt,), name="tfdist-lone-exchange", daemon=True)
        self._thread.start()

    def _loop(self, rt: UpdatePathRuntime) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.exchange_now(rt)
            except Exception as e:  # the PS is gone for good (recovery failed) or refused the update
                if self._stop.is_set() or (isinstance(e, RuntimeError) and "shutdown" in str(e)):
                    return  # the process is ending: close() sends what is left, in its own thread
                self.error = e
                logger.error("worker %d: the background exchange with the parameter servers failed; training "
                             "stops at the next step: %s", rt.worker_id, e)
                rt.lone_failed.assign(True)
                return

    def exchange_now(self, rt: UpdatePathRuntime) -> None:
        """Sends the steps made since the last exchange (their summed update), in the background.

        The training thread goes on meanwhile: the values read here may mix
        two steps across variables, which loses nothing, since each
        variable's next update is taken against the very values sent now.
        """
        with rt._exchange_lock:
            if rt.lifecycle.closed or rt.session is None:
                return
            rt._count_local_steps()
            if rt.registry.pending:
                rt.join_new_variables()  # a second model, a new head: its steps are sent with the others
            if rt.lifecycle.left:
                if not rt._unsent_steps:
                    return
                rt.rejoin()  # a later fit after leave(): its steps take part in the job again
            if not rt._unsent_steps:  # the last exchange's outcome (a lost PS is found, and recovered from, now)
                corrections = rt._recovering(rt.session.land)
                if corrections:
                    rt.registry.add(corrections)
                return
            steps, rt._unsent_steps = rt._unsent_steps, 0
            recoveries = rt._recoveries()
            try:
                send_overlapped(rt, rt.registry.values(), None, steps)
            except BaseException:
                rt._unsent_steps += steps  # not sent: the next exchange (or close) carries them
                raise
            if rt._recoveries() > recoveries:  # the exchange before failed and this one was not sent:
                rt._unsent_steps += steps      # the next one carries these steps (and the state, see _recover)
            else:
                self.resync = False

    def stop(self, join_timeout_s: float) -> None:
        thread = self._thread
        if thread is None:
            return
        self._stop.set()
        if thread is not threading.current_thread():
            thread.join(timeout=join_timeout_s)


def send_blocking(rt: UpdatePathRuntime, current: Mapping[str, np.ndarray], loss: float | None, steps: int) -> None:
    """Pushes the update and assigns the fresh values that come back (a lost PS is recovered from)."""
    rt.registry.written.clear()  # this update carries the local writes (current - snapshot)
    values = rt._recovering(lambda: rt.session.end(current, loss, steps=steps))
    if values is not None:
        rt.registry.assign(values)


def send_overlapped(rt: UpdatePathRuntime, current: Mapping[str, np.ndarray], loss: float | None,
                    steps: int) -> None:
    """Starts this exchange in the background; adds the corrections of the one before."""
    rt.registry.written.clear()  # this update carries the local writes (current - base)
    corrections = rt._recovering(lambda: rt.session.end_overlapped(current, loss, steps=steps))
    if corrections:
        rt.fold(corrections)


def choose_schedule(config: JobConfig, policy: ConsistencyPolicy, worker_id: int,
                    single_process: bool = False) -> Schedule:
    """The schedule of an update-path worker (see the module's table); ``single_process``: in-process PS."""
    asp = policy.refresh_every_step and policy.staleness == math.inf
    per_step: Schedule = Overlapped() if asp and config.strategy.overlap_exchange else Blocking()
    k = config.strategy.steps_per_exchange
    auto = asp and k == "auto"
    every = int(k) if asp and not auto else 1
    if every > 1:
        return EveryK(per_step, every)
    if not asp:
        return per_step
    if single_process:
        if config.ps.checkpoint_dir:
            return per_step
        return LocalOnly(fallback=EveryK(per_step, SINGLE_PROCESS_EXCHANGE_EVERY))
    if (config.strategy.lone_worker_exchange_s > 0 and worker_id == 0 and config.cluster.num_workers == 1
            and not config.elastic.enabled):
        return LoneWorker(per_step, config.strategy.lone_worker_exchange_s)
    return Adaptive(per_step, config.strategy.exchange_every_max) if auto else per_step
