"""The SSP read guarantee, checked exactly with identifiable updates against a real PS.

Worker w's update at clock c sets position (w, c) of a table to 1. A read at
clock c must contain every (w', c') with c' <= c - s - 1 (all workers) and
every (w, c') with c' < c (its own: read-my-writes).
"""

import random
import threading

import numpy as np
import pytest

from tfdist.config import JobConfig
from tfdist.ps.placement import RoundRobinPlacement, VariableSpec
from tfdist.ps.update_session import UpdateSession
from tfdist.testing import LocalCluster

WORKERS, CLOCKS = 3, 30


@pytest.mark.parametrize("staleness", [0, 2])
def test_every_read_holds_what_ssp_guarantees(staleness):
    specs = [VariableSpec("0000/table", "float32", (WORKERS, CLOCKS))]
    plan = RoundRobinPlacement().place(specs, 1)
    cfg = JobConfig.from_dict({"ps": {"heartbeat_timeout_s": 30}})
    errors, refreshes = [], {}
    with LocalCluster(workers=WORKERS, ps=1, config=cfg) as cluster:
        cluster.start_ps()
        sessions = [
            UpdateSession(cluster.client(), specs, plan, w, w == 0, startup_timeout_s=30, heartbeat_interval_s=None,
                          policy_spec={"policy": "ssp", "staleness": staleness, "refresh_every_step": False},
                          num_workers=WORKERS, staleness=staleness, refresh_every_step=False)
            for w in range(WORKERS)
        ]
        sessions[0].initialize({"0000/table": np.zeros((WORKERS, CLOCKS), np.float32)})

        def run(w):
            rng = random.Random(w)
            s = sessions[w]
            try:
                cache = s.initialize({}) if w else {"0000/table": np.zeros((WORKERS, CLOCKS), np.float32)}
                cache = {k: np.array(v) for k, v in cache.items()}
                for c in range(1, CLOCKS + 1):
                    fresh = s.begin()
                    if fresh is not None:
                        cache = {k: np.array(v) for k, v in fresh.items()}
                    table = cache["0000/table"]
                    must = [(w2, c2) for w2 in range(WORKERS) for c2 in range(1, c - staleness)]
                    must += [(w, c2) for c2 in range(1, c)]
                    missing = [(w2, c2) for w2, c2 in must if table[w2, c2 - 1] != 1]
                    if missing:
                        errors.append((w, c, missing[:5]))
                    table[w, c - 1] += 1  # the local update, applied at once (read-my-writes)
                    # worker 2 is slow, the others jitter
                    threading.Event().wait(rng.uniform(0.0, 0.004) + (0.01 if w == 2 else 0.0))
                    s.end(cache)
                refreshes[w] = s.stats["refreshes"]
            except Exception as e:  # surface thread failures in the test
                errors.append((w, "exception", repr(e)))
            finally:
                s.close(done=True)

        threads = [threading.Thread(target=run, args=(w,)) for w in range(WORKERS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert not any(t.is_alive() for t in threads), "a worker thread hung"
    assert not errors, errors[:5]
    # caches refresh only when the guarantee needs it: fewer pulls than ASP's one per clock
    if staleness > 0:
        assert all(n < CLOCKS for n in refreshes.values()), refreshes
