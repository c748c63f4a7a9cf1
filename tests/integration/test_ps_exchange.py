"""The ASP exchange against real PS processes: conditional pulls and overlapped exchanges lose no update.

Updates are multiples of 2**-6 on small values, so float32 sums are exact and
"no update lost" is checked with ``==``: the PS must end at the initial
values plus the sum of every update every worker made.
"""

import random
import threading

import numpy as np
import pytest

from tfdist.config import JobConfig
from tfdist.ps.placement import GreedyPlacement, VariableSpec
from tfdist.ps.update_session import UpdateSession
from tfdist.testing import LocalCluster

# one variable split over both PS tasks, two whole ones
SPECS = [VariableSpec("0000/w", "float32", (64, 8)), VariableSpec("0001/b", "float32", (8,)),
         VariableSpec("0002/v", "float32", (5, 3))]
STEP = np.float32(2.0 ** -6)


@pytest.fixture
def cluster():
    with LocalCluster(workers=2, ps=2, config=JobConfig.from_dict({"ps": {"startup_timeout_s": 20}})) as c:
        c.start_ps()
        yield c


def _session(cluster, worker):
    plan = GreedyPlacement(partition_threshold_bytes=1024).place(SPECS, 2)
    return UpdateSession(cluster.client(rpc_timeout_s=20), SPECS, plan, worker, worker == 0, startup_timeout_s=20,
                         heartbeat_interval_s=None, num_workers=2)


def _initial():
    rng = np.random.default_rng(0)
    return {s.key: (rng.integers(-64, 64, s.shape) * STEP).astype(np.float32) for s in SPECS}


def _ps_values(session):
    """What the PS tasks hold right now (a plain Pull through a separate client)."""
    meta = {"worker": -1}
    replies = session.client.call_many("Pull", {ps: (meta, {}) for ps in range(2)})
    return session._join({ps: tensors for ps, (_, tensors) in replies.items()})


def _update(rng, shape):
    return (rng.integers(-8, 9, shape) * STEP).astype(np.float32)


def test_a_lone_worker_gets_unchanged_replies_and_exactly_the_ps_values(cluster):
    chief, other = _session(cluster, 0), _session(cluster, 1)
    local = _initial()
    chief.initialize(local)
    rng = np.random.default_rng(1)
    for _ in range(5):
        local = {k: v + _update(rng, v.shape) for k, v in local.items()}
        local = chief.sync(local)
    assert chief.stats["unchanged_replies"] == 5 * 2 and chief.stats["bytes_pulled"] == 0
    for k, v in _ps_values(chief).items():
        np.testing.assert_array_equal(local[k], v)  # bit for bit what the PS computed
    # another worker's update lands: the next reply carries the values again
    theirs = other.initialize({})
    other.sync({k: v + STEP for k, v in theirs.items()})
    local = chief.sync({k: v + 2 * STEP for k, v in local.items()})
    assert chief.stats["bytes_pulled"] > 0
    for k, v in _ps_values(chief).items():
        np.testing.assert_array_equal(local[k], v)
    chief.close(done=False), other.close(done=False)


@pytest.mark.parametrize("conditional_pull", [True, False])
def test_overlapped_exchanges_push_every_update_exactly_once(cluster, conditional_pull):
    steps = 40
    sessions = [_session(cluster, w) for w in range(2)]
    for s in sessions:
        s.conditional_pull = conditional_pull
    start = _initial()
    sessions[0].initialize(start)
    sessions[1].initialize({})
    made = [{k: np.zeros_like(v) for k, v in start.items()} for _ in range(2)]
    seen_others, errors = [0, 0], []

    def run(w):
        try:
            s, rng, pause = sessions[w], np.random.default_rng(10 + w), random.Random(w)
            local = {k: v.copy() for k, v in start.items()}
            for step in range(steps):
                u = {k: _update(rng, v.shape) for k, v in local.items()}
                for k in local:  # the "optimizer step"
                    local[k] += u[k]
                    made[w][k] += u[k]
                corrections = s.end_overlapped(local)
                if corrections:
                    seen_others[w] += 1
                    for k, c in corrections.items():
                        local[k] += c
                if w == 1 and step % 7 == 6:  # an evaluate() in between: pull and take the values
                    local = {k: v.copy() for k, v in s.pull().items()}
                if pause.random() < 0.3:
                    threading.Event().wait(pause.random() * 0.01)
            corrections = s.flush()
            for k, c in (corrections or {}).items():
                local[k] += c
        except Exception as e:  # surfaced below
            errors.append(e)

    threads = [threading.Thread(target=run, args=(w,)) for w in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    assert not any(t.is_alive() for t in threads)
    ps = _ps_values(sessions[0])
    for k, v in start.items():
        np.testing.assert_array_equal(ps[k], v + made[0][k] + made[1][k])
    assert sum(seen_others) > 0  # the workers did see each other's updates
    for s in sessions:
        assert s.stats["syncs"] == steps
        for k, v in s.pull().items():
            np.testing.assert_array_equal(v, ps[k])
        s.close(done=False)


def test_ssp_cannot_overlap(cluster):
    s = _session(cluster, 0)
    s.refresh_every_step = False
    s.initialize(_initial())
    with pytest.raises(Exception, match="ASP"):
        s.end_overlapped(_initial())
    s.close(done=False)


@pytest.mark.parametrize("then", ["end", "end_overlapped"])
def test_corrections_a_worker_adds_at_once_are_not_pushed_back(cluster, then):
    """``land()``: the exchange in flight lands, and the caller adds its corrections (another worker's update)
    to its values now, then pushes again (a flush before ps_status or a join does so). The next update is
    taken against the PS's values, so the other worker's update is not sent back as this worker's own;
    ``flush()``'s callers, which load fresh values instead, keep the old base (the other tests here)."""
    chief, other = _session(cluster, 0), _session(cluster, 1)
    start = _initial()
    chief.initialize(start)
    theirs = other.initialize({})
    rng = np.random.default_rng(3)
    v = {k: _update(rng, a.shape) for k, a in start.items()}
    other.sync({k: theirs[k] + v[k] for k in theirs})  # lands before the chief's exchange below
    u1 = {k: _update(rng, a.shape) for k, a in start.items()}
    local = {k: start[k] + u1[k] for k in start}
    assert chief.end_overlapped(local) is None  # in flight
    corrections = chief.land()
    for k in start:
        np.testing.assert_array_equal(corrections[k], v[k])
        local[k] = local[k] + corrections[k]
    u2 = {k: _update(rng, a.shape) for k, a in start.items()}
    local = {k: local[k] + u2[k] for k in start}
    if then == "end":
        chief.end(local)
    else:
        assert chief.end_overlapped(local) is None  # nothing else landed: no correction
        assert chief.flush() is None
    for k, got in _ps_values(chief).items():
        np.testing.assert_array_equal(got, start[k] + v[k] + u1[k] + u2[k])  # v once, bit for bit
    chief.close(done=False), other.close(done=False)
