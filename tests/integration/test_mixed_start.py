"""A start-up that finds PS tasks in different states never mixes them (issue #26 item 3, the handshake part).

Observed: a job started again on PS tasks of which one was restarted empty (no
``ps.checkpoint_dir``) while another still held trained values: the chief
logged "parameter servers already held values (job restarted?); using theirs"
and training started from a model that was half one state, half another
(accuracy 0.09 before ``fit``). Now the chief sets the held tasks to its own
values (a new incarnation there, so other workers re-sync) and says why.
Real PS tasks on 127.0.0.1 (gRPC), the workers' sessions in this process.
"""

import logging
import threading
import time

import numpy as np
import pytest

from tfdist.ps.client import PSClient
from tfdist.ps.placement import RoundRobinPlacement, VariableSpec
from tfdist.ps.server import PSServer
from tfdist.ps.session import WorkerSession

pytestmark = pytest.mark.timeout(120)

TOKEN = "a-token-123"
SPECS = [VariableSpec("0000/a", "float32", (4, 2)), VariableSpec("0001/b", "float32", (3,))]


def _session(addresses, worker, values_seed=None):
    plan = RoundRobinPlacement().place(SPECS, 2)
    assert {s.ps for s in plan.shards} == {0, 1}  # one variable on each task
    return WorkerSession(PSClient(addresses, TOKEN), SPECS, plan, worker, worker == 0, startup_timeout_s=20,
                         heartbeat_interval_s=None, num_workers=2)


def _values(x):
    return {"0000/a": np.full((4, 2), x, np.float32), "0001/b": np.full(3, x, np.float32)}


def test_a_chief_that_finds_one_task_holding_values_and_one_empty_sets_both_to_its_values(caplog):
    servers = [PSServer(None, token=TOKEN, num_workers=2).start() for _ in range(2)]
    replacement = None
    try:
        first = _session([s.address for s in servers], 0)
        assert first.initialize(_values(1.0)) is None
        first.sync(_values(5.0))  # trained: ps:0 and ps:1 hold 5.0
        first.client.close()
        servers[1].stop(0)  # ps:1 restarts empty (no checkpoint), at a new address
        replacement = PSServer(None, token=TOKEN, num_workers=2).start()
        addresses = [servers[0].address, replacement.address]

        chief = _session(addresses, 0)
        with caplog.at_level(logging.WARNING, logger="tfdist.ps.session"):
            assert chief.initialize(_values(2.0)) is None  # its own values are the job's: nothing to load
        assert "would mix two states" in caplog.text and "ps:[0] held values" in caplog.text
        for server in (servers[0], replacement):
            for value in server.store.state()["values"].values():
                np.testing.assert_array_equal(value, np.full_like(value, 2.0))  # before: ps:0 kept 5.0

        other = _session(addresses, 1)
        pulled = other.initialize({})
        for key, value in pulled.items():
            np.testing.assert_array_equal(value, _values(2.0)[key])  # one state, not half of each
        chief.sync(_values(3.0))  # and the job goes on
        chief.client.close()
        other.client.close()
    finally:
        for s in [*servers, replacement]:
            if s is not None:
                s.stop(0)


def test_a_chief_that_finds_every_task_holding_values_takes_them():
    """A job started again on PS tasks that all kept (or restored) their values resumes from them, as before."""
    servers = [PSServer(None, token=TOKEN, num_workers=2).start() for _ in range(2)]
    try:
        addresses = [s.address for s in servers]
        first = _session(addresses, 0)
        first.initialize(_values(1.0))
        first.sync(_values(5.0))
        first.client.close()
        chief = _session(addresses, 0)
        values = chief.initialize(_values(2.0))
        for key, value in values.items():
            np.testing.assert_array_equal(value, _values(5.0)[key])
        chief.client.close()
    finally:
        for s in servers:
            s.stop(0)


def test_a_worker_whose_ps_task_is_lost_while_it_starts_waits_for_it_and_starts(caplog):
    """A PS task lost during a worker's start-up does not fail the worker: it waits for the task and starts over.

    Seen in CI (``test_a_dynamic_table_survives_a_killed_ps[async]``): worker 1
    began its first step late, its start-up ``WaitInit`` to ps:1 was cut by the
    kill, and the worker failed (``PSUnavailableError``) although the launcher
    restarted ps:1 within a second. Here worker 1 waits in ``WaitInit`` on ps:0
    (the chief has not initialised the job), ps:0 is stopped (the wait is cut)
    and started again at the same port; the chief then initialises the job and
    worker 1 starts with the chief's values.
    """
    servers = [PSServer(None, token=TOKEN, num_workers=2).start() for _ in range(2)]
    replacement, other, outcome = None, None, {}
    try:
        other = _session([s.address for s in servers], 1)

        def start():
            try:
                outcome["values"] = other.initialize({})
            except Exception as e:  # noqa: BLE001 (asserted below)
                outcome["error"] = e

        thread = threading.Thread(target=start, daemon=True)
        with caplog.at_level(logging.WARNING, logger="tfdist.ps.session"):
            thread.start()
            deadline = time.monotonic() + 30
            while servers[0].store.waits.waiters == 0:  # worker 1 waits in WaitInit on ps:0
                assert time.monotonic() < deadline and thread.is_alive(), outcome
                time.sleep(0.01)
            port = servers[0].port
            servers[0].stop(0)  # its wait is cut (UNAVAILABLE)
            replacement = PSServer(None, port=port, token=TOKEN, num_workers=2).start()
            chief = _session([replacement.address, servers[1].address], 0)
            assert chief.initialize(_values(2.0)) is None
            thread.join(60)
            assert not thread.is_alive()
        assert "error" not in outcome, outcome  # before: PSUnavailableError (WaitInit ... UNAVAILABLE)
        for key, value in outcome["values"].items():
            np.testing.assert_array_equal(value, _values(2.0)[key])
        assert "lost while this worker started" in caplog.text
        chief.sync(_values(3.0))
        other.sync(_values(4.0))  # both take part in the job
        chief.client.close()
    finally:
        if other is not None:
            other.client.close()
        for s in [*servers, replacement]:
            if s is not None:
                s.stop(0)
