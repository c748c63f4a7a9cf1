"""The federated-learning simulator: main process, simulated clock, event order.

Layout after Yu, Park and Moon, "Fast Federated Learning Simulator based on
Multiprocessing Technique" (the seed paper): the main process owns the global
state and the simulated clock (Algorithm 1), a pool of train-worker processes
trains the clients of each round (Algorithm 2), and a test process evaluates
snapshots as rounds complete (Algorithm 3); queues connect them.

Simulated time versus real time: when a client is dispatched, its delay model
fixes when its update *arrives* (simulated seconds). Workers compute as fast
as they can, in any real order; the main process consumes results strictly in
simulated-arrival order (ties: dispatch order), so the outcome does not depend
on the number of workers or on which finished first.
"""

from __future__ import annotations

import dataclasses
import heapq
import logging
import time
from typing import Any, Callable

import numpy as np

from tfdist.errors import ConfigError
from tfdist.federated import aggregate as agg
from tfdist.federated._backend import InlineBackend, ProcessBackend, WorkerSpec
from tfdist.federated._model import ModelSpec
from tfdist.federated.attacks import ByzantineConfig
from tfdist.federated.client import ClientConfig, ClientTask, ClientUpdate
from tfdist.federated.delays import DelayModel, make_delay_model
from tfdist.federated.history import AppliedUpdate, History, RoundRecord
from tfdist.federated.partition import FederatedData
from tfdist.federated.strategies import ClientResult, Strategy, make_strategy

logger = logging.getLogger(__name__)

__all__ = ["Simulation"]


@dataclasses.dataclass
class _InFlight:
    task: ClientTask
    dispatch_time: float
    arrival_time: float


class Simulation:
    """A federated-learning simulation on a pool of worker processes.

    Args:
        model_fn: returns a built Keras classifier (called once in the main
            process for the initial weights, and once per worker).
        client_data: the clients' datasets, e.g. from :func:`tfdist.federated.partition`.
        strategy: a :class:`Strategy` (``FedAvg``, ``FedProx``, ``FedAdam``,
            ``FedMedian``, ``FedTrimmedMean``, ``FedKrum``, ``RingDistillation``),
            a name or a dict. Defaults to ``FedAvg(clients_per_round=10)``.
        test_data: ``(x, y)`` the test process evaluates on. Defaults to ``None`` (no evaluation).
        num_workers: train-worker processes; several per core are fine.
            ``0`` runs everything in the main process (sequential reference).
            Defaults to 2.
        rounds: number of rounds. Defaults to 10.
        client: a :class:`ClientConfig` or dict: the simulated devices' local
            epochs, batch size and optimizer. Defaults to ``ClientConfig()``.
        client_update: overrides the strategy's local training method.
        delays: a :class:`DelayModel`, a dict or ``None`` (no delays).
        byzantine: ``{"fraction": 0.1, "attack": "sign_flip"}``, a
            :class:`ByzantineConfig` or ``None``.
        round_deadline_s: simulated seconds after which a round closes;
            updates arriving later are applied, stale, in the round during
            which they arrive. Defaults to ``None``: every round waits for all
            its clients (synchronous, no staleness).
        seed: seeds sampling, delays, attacks and local shuffling. Defaults to 0.
        eval_every: evaluate every this many rounds (and after the last). Defaults to 1.
        progress: show a progress bar per round. Defaults to ``True``.
        threads_per_worker: TF threads in each worker. Defaults to 1.
        start_timeout_s: bound on starting the workers. Defaults to 300.
        task_timeout_s: bound on waiting for one result or evaluation. Defaults to 300.
        model_transport: how workers get the model: ``"auto"``, ``"config"``
            or ``"function"`` (see :class:`~tfdist.federated._model.ModelSpec`).

    Example:
        >>> sim = Simulation(make_model, partition(x, y, num_clients=100, scheme="dirichlet"),
        ...                  strategy=FedAvg(clients_per_round=20), test_data=(x_test, y_test),
        ...                  num_workers=2, rounds=30)
        >>> history = sim.run()
        >>> history.final_accuracy
    """

    def __init__(
        self,
        model_fn: Callable[[], Any],
        client_data: FederatedData,
        strategy: Strategy | str | dict | None = None,
        test_data: tuple | None = None,
        num_workers: int = 2,
        rounds: int = 10,
        client: ClientConfig | dict | None = None,
        client_update: ClientUpdate | None = None,
        delays: DelayModel | dict | None = None,
        byzantine: ByzantineConfig | dict | None = None,
        round_deadline_s: float | None = None,
        seed: int = 0,
        eval_every: int = 1,
        progress: bool = True,
        threads_per_worker: int = 1,
        start_timeout_s: float = 300.0,
        task_timeout_s: float = 300.0,
        model_transport: str = "auto",
    ):
        if not callable(model_fn):
            raise ConfigError(f"model_fn must be callable and return a Keras model. Received: model_fn={model_fn!r}")
        if isinstance(client_data, (list, tuple)):
            client_data = FederatedData.from_arrays([c[0] for c in client_data], [c[1] for c in client_data])
        if not isinstance(client_data, FederatedData) or len(client_data) == 0:
            raise ConfigError(
                "client_data must be a non-empty FederatedData (see tfdist.federated.partition). "
                f"Received: {type(client_data).__name__}"
            )
        if any(c.num_examples == 0 for c in client_data):
            raise ConfigError("Every client needs at least one example. Use partition(..., min_examples=1).")
        for name, value, low in (("num_workers", num_workers, 0), ("rounds", rounds, 1), ("eval_every", eval_every, 1),
                                 ("threads_per_worker", threads_per_worker, 1)):
            if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < low:
                raise ConfigError(f"{name} must be an int >= {low}. Received: {name}={value!r}")
        if round_deadline_s is not None and not round_deadline_s > 0:
            raise ConfigError(f"round_deadline_s must be > 0 or None. Received: round_deadline_s={round_deadline_s}")
        if test_data is not None and (len(test_data) != 2 or len(test_data[0]) != len(test_data[1])):
            raise ConfigError("test_data must be a pair (x_test, y_test) of equal length.")
        self.model_fn = model_fn
        self.client_data = client_data
        self.strategy = make_strategy(strategy if strategy is not None else "fedavg")
        self.client = client if isinstance(client, ClientConfig) else ClientConfig(**(client or {}))
        for c in range(len(client_data)):  # fail now on per-client lists of the wrong length
            self.client.epochs_of(c), self.client.batch_size_of(c)
        self.client_update = client_update
        self.delays = make_delay_model(delays)
        self.byzantine = ByzantineConfig.from_spec(byzantine)
        if self.strategy.topology == "ring":
            self.strategy.neighbours(0, len(client_data))
        self.test_data = test_data
        self.num_workers = int(num_workers)
        self.rounds = int(rounds)
        self.round_deadline_s = round_deadline_s
        self.seed = int(seed)
        self.eval_every = int(eval_every)
        self.progress = progress
        self.threads_per_worker = int(threads_per_worker)
        self.start_timeout_s = start_timeout_s
        self.task_timeout_s = task_timeout_s
        self.model_transport = model_transport
        self.backend = None

    # ------------------------------------------------------------------
    def config_dict(self) -> dict:
        """The resolved settings of this simulation (what the log line shows)."""
        return {
            "num_clients": len(self.client_data),
            "partition": self.client_data.scheme,
            "strategy": self.strategy.to_dict(),
            "topology": self.strategy.topology,
            "client": self.client.to_dict(),
            "delays": self.delays.to_dict(),
            "byzantine": self.byzantine.to_dict() if self.byzantine else None,
            "num_workers": self.num_workers,
            "rounds": self.rounds,
            "round_deadline_s": self.round_deadline_s,
            "seed": self.seed,
            "eval_every": self.eval_every,
            "threads_per_worker": self.threads_per_worker,
        }

    def _rng(self, *key: int) -> np.random.Generator:
        return np.random.default_rng([self.seed, *key])

    def run(self) -> History:
        """Runs all rounds and returns the :class:`History`.

        Raises:
            WorkerCrashedError: a worker failed (the message holds its traceback).
            SimulationTimeoutError: a bounded wait expired.
        """
        t_run = time.perf_counter()
        config = self.config_dict()
        logger.info("Federated simulation: %s", config)
        num_clients = len(self.client_data)
        spec = ModelSpec(self.model_fn, self.model_transport)
        self.strategy.initialize(spec.initial_weights, num_clients)
        self.delays.setup(num_clients, self.seed)
        self._byzantine = self.byzantine.choose(num_clients, self.seed) if self.byzantine else frozenset()
        update = self.client_update if self.client_update is not None else self.strategy.client_update(self.client)
        data = tuple((_as_float32(c.x), c.y.astype(np.int64)) for c in self.client_data)
        test = (_as_float32(np.asarray(self.test_data[0])), np.asarray(self.test_data[1]).astype(np.int64)) if self.test_data else None
        worker_spec = WorkerSpec(spec, update, self.client, data, test, self.threads_per_worker)
        evaluate = test is not None
        if self.num_workers == 0:
            backend = InlineBackend(worker_spec, evaluate)
        else:
            backend = ProcessBackend(worker_spec, self.num_workers, evaluate, self.start_timeout_s, self.task_timeout_s)
        self.backend = backend
        history = History(config=config)
        self._history = history
        self._ring = self.strategy.topology == "ring"
        weights = [np.array(w) for w in spec.initial_weights]
        self._global = weights
        self._nodes = [list(weights) for _ in range(num_clients)] if self._ring else None
        self._heap: list = []
        self._in_flight: dict[int, _InFlight] = {}
        self._busy: set = set()
        self._buffer: list = []
        self._now = 0.0
        self._next_job = 0
        bar = _progress_bar(self.rounds, self.progress)
        try:
            backend.start()
            history.startup_s = backend.startup_s
            t_loop = time.perf_counter()
            history.rounds.append(RoundRecord(0, 0.0, 0.0, 0, 0, 0.0))
            if evaluate:
                backend.submit_eval(0, self._eval_payload())
            for r in range(1, self.rounds + 1):
                record = self._run_round(r)
                history.rounds.append(record)
                if evaluate and (r % self.eval_every == 0 or r == self.rounds):
                    backend.submit_eval(r, self._eval_payload())
                backend.poll()
                if bar is not None:
                    latest = max((k for k in backend.metrics), default=None)
                    bar.set_postfix(acc=f"{backend.metrics[latest]['accuracy']:.3f}" if latest is not None else "-",
                                    sim_t=f"{record.sim_time:.1f}s")
                    bar.update(1)
            backend.finish_evals()
            history.loop_wall_s = time.perf_counter() - t_loop
            for rec in history.rounds:
                rec.metrics = dict(backend.metrics.get(rec.round, {}))
            history.worker_busy_s = dict(backend.busy_s)
        finally:
            if bar is not None:
                bar.close()
            backend.close()
        history.wall_time_s = time.perf_counter() - t_run
        logger.info("Federated simulation done: %s", history.summary())
        return history

    @property
    def global_weights(self) -> list:
        """The current global weights (client-server) after :meth:`run`."""
        return self._global

    @property
    def node_weights(self) -> list | None:
        """Every node's weights (P2P ring) after :meth:`run`."""
        return self._nodes

    # ------------------------------------------------------------------
    def _eval_payload(self) -> dict:
        if self._ring:
            return {"kind": "nodes", "weights": self._nodes,
                    "honest": [c not in self._byzantine for c in range(len(self._nodes))]}
        return {"kind": "global", "weights": self._global}

    def _dispatch(self, r: int, client_id: int) -> float:
        n = len(self.client_data)
        epochs, batch = self.client.epochs_of(client_id), self.client.batch_size_of(client_id)
        extras = {}
        if self._ring:
            left, right = self.strategy.neighbours(client_id, n)
            neighbour_weights = [self._nodes[left], self._nodes[right]]
            start = self.strategy.start_weights(self._nodes[client_id], neighbour_weights)
            extras["neighbour_weights"] = neighbour_weights
        else:
            start = self._global
        seed = int(self._rng(r, client_id, 3).integers(2**31 - 1))
        task = ClientTask(self._next_job, client_id, r, start, epochs, batch, seed, extras)
        self._next_job += 1
        work = float(self.client_data[client_id].num_examples * epochs)
        delay = self.delays.sample(client_id, r, work, self._rng(r, client_id, 2))
        arrival = self._now + delay.total_s
        self._in_flight[task.job_id] = _InFlight(task, self._now, arrival)
        heapq.heappush(self._heap, (arrival, task.job_id))
        self._busy.add(client_id)
        self.backend.submit(task)
        return arrival

    def _run_round(self, r: int) -> RoundRecord:
        t0 = time.perf_counter()
        round_start = self._now
        available = np.array([c for c in range(len(self.client_data)) if c not in self._busy], dtype=np.int64)
        chosen = self.strategy.sample_clients(available, r, self._rng(r, 1)) if len(available) else []
        arrivals = [self._dispatch(r, int(c)) for c in chosen]
        if self.round_deadline_s is not None:
            round_end = round_start + self.round_deadline_s
        else:
            round_end = max(arrivals, default=round_start)
        staleness = []
        while self._heap and self._heap[0][0] <= round_end:
            arrival, job_id = heapq.heappop(self._heap)
            flight = self._in_flight.pop(job_id)
            out = self.backend.wait_result(job_id)
            self._now = max(self._now, arrival)
            staleness.append(self._apply(r, flight, out))
        self._now = round_end
        if not self._ring:
            if self._buffer:
                self._global = self.strategy.aggregate(r, self._global, self._buffer)
            self._buffer = []
        return RoundRecord(r, self._now, time.perf_counter() - t0, len(arrivals), len(staleness),
                           float(np.mean(staleness)) if staleness else 0.0)

    def _apply(self, r: int, flight: _InFlight, out) -> int:
        """Applies one arrived update at its simulated arrival time (Algorithm 1's doUpdate)."""
        task = flight.task
        c = task.client_id
        self._busy.discard(c)
        delta = agg.subtract(out.weights, task.weights)
        bad = c in self._byzantine
        if bad:
            delta = self.byzantine.attack.apply(delta, self._rng(task.round_num, c, 4))
        staleness = r - task.round_num
        if self._ring:
            self._nodes[c] = agg.add(task.weights, delta)
        else:
            self._buffer.append(ClientResult(c, self.client_data[c].num_examples, delta, task.round_num,
                                             flight.arrival_time, staleness, out.metrics))
        self._history.updates.append(AppliedUpdate(c, task.round_num, r, flight.dispatch_time, flight.arrival_time,
                                                   staleness, bad, out.worker))
        return staleness


def _as_float32(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x)
    return x.astype(np.float32) if np.issubdtype(x.dtype, np.floating) and x.dtype != np.float32 else x


def _progress_bar(total: int, enabled: bool):
    if not enabled:
        return None
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return None
    return tqdm(total=total, desc="rounds", unit="round")
