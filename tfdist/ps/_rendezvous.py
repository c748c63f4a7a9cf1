"""Job-wide rendezvous on PS task 0: ``strategy.barrier(name)`` and ``strategy.reduce`` across the workers.

Every worker of a job calls its strategy's ``barrier``/``reduce`` in the same
order (as under MultiWorkerMirroredStrategy, where each is a collective). The
``n``-th call of each worker is rendezvous ``n``: PS task 0 collects each
worker's name and values for it and, once every live worker contributed,
answers every caller with the element-wise sum of the values (in worker-id
order: the same float sums everywhere) and the workers counted. A worker
that arrives late (a rendezvous answered while it was counted out) gets the
same answer: the last :data:`KEPT` answers are kept. Workers that called
rendezvous ``n`` with different names are told so.

Owns (PS side): the rendezvous in progress and the last answers; neither is
checkpointed (a restarted PS task gets the contributions again). Every method
runs with the store's lock held.
"""

from __future__ import annotations

from typing import Sequence

from tfdist.ps._waits import Wait

__all__ = ["Rendezvous", "KEPT"]

#: Rendezvous whose answers are kept for late workers.
KEPT = 8


class Rendezvous:
    """The rendezvous of a job's workers, by their sequence number."""

    def __init__(self):
        #: seq -> (name, {worker: values})
        self.open: dict[int, tuple[str, dict[int, tuple[float, ...]]]] = {}
        #: seq -> (name, sums, workers)
        self.answers: dict[int, tuple[str, tuple[float, ...], tuple[int, ...]]] = {}

    def arrive(self, worker: int, seq: int, name: str, values: Sequence[float]) -> str | None:
        """Records a worker's arrival; returns why it does not match the others (``None``: it does)."""
        known = self.answers.get(seq) or self.open.get(seq)
        if known is not None and known[0] != name:
            return (f"worker {worker} called rendezvous #{seq} {name!r} where other workers called {known[0]!r}: "
                    "every worker must call strategy.barrier/strategy.reduce in the same order")
        if seq in self.answers:
            return None
        _, contributions = self.open.setdefault(seq, (name, {}))
        first = next(iter(contributions.values()), None)
        if first is not None and len(first) != len(values):
            return (f"worker {worker} reduced {len(values)} values in rendezvous #{seq} {name!r} where other "
                    f"workers reduced {len(first)}: every worker must reduce tensors of the same shape")
        contributions[worker] = tuple(values)
        return None

    def decide(self, seq: int, live: frozenset[int]) -> Wait:
        """Go once ``seq`` is answered, answering it once every live worker arrived."""
        if seq in self.answers:
            return Wait(False, "")
        name, contributions = self.open[seq]
        missing = sorted(live - set(contributions))
        if missing:
            return Wait(True, f"rendezvous #{seq} {name!r} waits for workers {missing}")
        workers = tuple(sorted(contributions))
        sums = [0.0] * len(contributions[workers[0]])
        for w in workers:
            sums = [s + v for s, v in zip(sums, contributions[w])]
        self.answers[seq] = (name, tuple(sums), workers)
        del self.open[seq]
        for old in [s for s in self.answers if s <= seq - KEPT]:
            del self.answers[old]
        return Wait(False, "")

    def answer(self, seq: int) -> tuple[tuple[float, ...], tuple[int, ...]]:
        _, sums, workers = self.answers[seq]
        return sums, workers


def rendezvous(store, req, timeout: float | None, cancelled):
    """Serves a ``Rendezvous`` request on ``store`` (a :class:`tfdist.ps.store.ParameterStore`); waits, bounded."""
    from tfdist.ps.protocol import RequestError
    from tfdist.ps.replies import RendezvousReply

    with store._cond:  # pylint: disable=protected-access
        members = store.members
        members.check_member(req.worker)
        mismatch = store.rendezvous.arrive(req.worker, req.seq, req.name, req.values)
        if mismatch is not None:  # refused: nothing changed
            raise RequestError(mismatch, grpc_code="FAILED_PRECONDITION")
        store._touch(req.worker)  # pylint: disable=protected-access
        store._cond.notify_all()  # pylint: disable=protected-access
        store.waits.wait_for(lambda: store.rendezvous.decide(req.seq, awaited(members, req.worker)),
                             timeout, f"meet the other workers at {req.name!r} (this worker's arrival is counted)",
                             cancelled, counted=False)
        sums, workers = store.rendezvous.answer(req.seq)
        return RendezvousReply(sums, workers)


def awaited(members, worker: int) -> frozenset[int]:
    """The workers a rendezvous waits for: the live ones; before the job's first step, every worker of the job."""
    live = set(members.live()) | {worker}
    if not members.started and members.num_workers:
        live |= set(range(members.num_workers)) - members.done_workers - members.left_workers
    return frozenset(live)
