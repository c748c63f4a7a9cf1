"""A job started task by task ends by itself: every process, parameter servers included, exits 0.

No launcher watches these jobs (as under Kubeflow, or one ``--task`` launch per
machine): each task is its own process with its own ``TF_CONFIG``, and nothing
is killed. The parameter-server tasks must exit because every worker said it
is done, which a worker does at interpreter exit (issue #12: with two PS tasks
that message needed a thread pool Python had already shut down, so the PS
tasks served forever).
"""

import pytest

TOKEN = "lifecycle-test-token"

pytestmark = pytest.mark.timeout(300)


def test_calls_to_several_ps_tasks_go_out_one_by_one_when_no_thread_can_take_them():
    """At interpreter exit ``concurrent.futures`` refuses new work; a worker's last calls must still go out."""
    from tfdist.ps.client import PSClient
    from tfdist.ps.server import PSServer

    servers = [PSServer(None, token=TOKEN, num_workers=2, task_index=i).start() for i in range(2)]
    client = PSClient([s.address for s in servers], TOKEN, rpc_timeout_s=10)
    try:
        assert sorted(client.call_all("Status", {"brief": True})) == [0, 1]  # in parallel: starts the pool
        client._executor().shutdown()  # what Python's exit does to every pool before atexit hooks run
        assert sorted(client.call_all("Status", {"brief": True})) == [0, 1]
        assert sorted(client.call_all("Done", {"worker": 0}, parallel=False)) == [0, 1]
        assert all(s.store.done_workers == {0} for s in servers)
    finally:
        client.close()
        for s in servers:
            s.stop(0)
