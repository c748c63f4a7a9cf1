"""``tfdist.ps._rendezvous``: the job-wide meeting behind ``strategy.barrier`` and the gradient path's ``reduce``."""

import pytest

from tfdist.ps._rendezvous import KEPT, Rendezvous, awaited


def test_answers_the_sums_once_every_awaited_worker_arrived():
    r = Rendezvous()
    assert r.arrive(1, 0, "reduce", [2.0, 3.0]) is None
    assert r.decide(0, frozenset({0, 1})).action.name == "WAIT"
    assert r.arrive(0, 0, "reduce", [1.0, 1.0]) is None
    assert r.decide(0, frozenset({0, 1})).action.name != "WAIT"
    assert r.answer(0) == ((3.0, 4.0), (0, 1))
    assert r.arrive(1, 0, "reduce", [9.0, 9.0]) is None  # a late repeat gets the same answer
    assert r.answer(0) == ((3.0, 4.0), (0, 1))


def test_a_barrier_of_another_name_or_a_reduce_of_another_size_is_refused_without_a_change():
    r = Rendezvous()
    r.arrive(0, 0, "barrier:saved", [])
    assert "barrier:loaded" in r.arrive(1, 0, "barrier:loaded", [])
    assert r.open[0][1] == {0: ()}
    r.arrive(0, 1, "reduce", [1.0])
    assert "same shape" in r.arrive(1, 1, "reduce", [1.0, 2.0])
    assert r.open[1][1] == {0: (1.0,)}


def test_keeps_the_last_answers_only():
    r = Rendezvous()
    for seq in range(KEPT + 3):
        r.arrive(0, seq, "b", [])
        r.decide(seq, frozenset({0}))
    assert sorted(r.answers) == list(range(3, KEPT + 3))


class _Members:
    def __init__(self, started, live=(), num_workers=3, done=(), left=()):
        self.started, self._live, self.num_workers = started, frozenset(live), num_workers
        self.done_workers, self.left_workers = set(done), set(left)

    def live(self):
        return self._live


@pytest.mark.parametrize("members, expected", [
    (_Members(False, done={2}), {0, 1}),  # before the first step: every worker of the job that is not done
    (_Members(True, live={0}), {0, 1}),  # afterwards: the live workers (and the caller)
])
def test_awaited_workers(members, expected):
    assert awaited(members, 1) == frozenset(expected)
