"""The faults of the fault matrix, injected into a running ``durability_worker.py`` job (bounded waits).

Shared by ``tests/integration/test_ps_durability.py`` and
``benchmarks/fault_accuracy.py`` (which repeats the job to measure what
each fault costs in accuracy), so that both inject exactly the same fault.
Each injector is called once the job started, with the
``tfdist.testing.LocalCluster`` and the script's ``--out`` folder, and
returns what it saw. The job's launcher loop (``cluster.wait``) does the
rest: it restarts a dead ``ps:1`` or chief and goes on without a dead
non-chief worker (``launch.on_worker_failure: auto``).
"""

import os
import re
import signal
import time

#: The job: steps per worker; the step before which a worker pauses (or the chief kills itself after);
#: the checkpoint interval in steps of the jobs with checkpoints.
STEPS, PAUSE_AT, EVERY = 150, 60, 20
#: The heart-beat settings of the jobs with a stopped worker: the PS gives up on a silent worker after 3 s.
HEARTBEAT_INTERVAL_S, HEARTBEAT_TIMEOUT_S = 1.0, 3.0


def wait_until(cluster, what, ready, timeout):
    """Polls ``ready()`` (bounded); raises at once, with its log tail, if a task of the job exits meanwhile."""
    deadline = time.monotonic() + timeout
    while not ready():
        for task, proc in cluster.job.tasks.items():
            if proc.poll() is not None:
                raise RuntimeError(f"{task} exited {proc.poll()} while waiting for {what}:\n"
                                   f"{cluster.log(task)[-3000:]}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} did not happen within {timeout:g} s")
        time.sleep(0.05)


def wait_for_file(cluster, path, timeout):
    """Waits until ``path`` exists (see :func:`wait_until`)."""
    wait_until(cluster, path, lambda: os.path.exists(path), timeout)


_TMP = re.compile(r"^ckpt-(\d{12})\.(data|json)\.tmp-[0-9a-f]{8}$")
_MANIFEST = re.compile(r"^ckpt-(\d{12})\.json$")


def checkpoint_files(directory):
    """(steps with a manifest, steps with a temporary file being written) in one PS shard's checkpoint directory."""
    names = os.listdir(directory) if os.path.isdir(directory) else []
    complete = sorted(int(m.group(1)) for m in map(_MANIFEST.match, names) if m)
    torn = sorted(int(m.group(1)) for m in map(_TMP.match, names) if m)
    return complete, torn


def ps_status(cluster, ps):
    """The brief ``Status`` of PS task ``ps``."""
    with cluster.client() as client:
        meta, _ = client.call(ps, "Status", {"brief": True})
    return meta


def kill_ps1(cluster, out):
    """While the chief is paused before step PAUSE_AT (``--pause-at``), SIGKILL ps:1; returns its status before.

    Only once every worker's batches reached ps:1: a worker still starting up (under load, or with fresh
    interpreters) would first meet the restarted task and have nothing to recover from (the other workers train
    on until their hold at PAUSE_AT + 30)."""
    wait_for_file(cluster, os.path.join(out, "paused"), 240)
    workers = {str(w) for w in range(cluster.job.config.cluster.num_workers)}
    wait_until(cluster, "every worker's batches on ps:1",
               lambda: workers <= set(ps_status(cluster, 1).get("worker_batches") or {}), 240)
    before = ps_status(cluster, 1)
    cluster.kill("ps:1")
    open(os.path.join(out, "resume"), "w").close()
    return before


def kill_worker1(cluster, out):
    """While worker 1 is paused before step PAUSE_AT (``--pause-at --pause-worker 1``), SIGKILL it."""
    wait_for_file(cluster, os.path.join(out, "paused"), 240)
    cluster.kill("worker:1")
    open(os.path.join(out, "resume"), "w").close()  # the chief waits for it before its (PAUSE_AT + 30)-th step


def stop_worker1(cluster, out, mode):
    """SIGSTOPs worker 1 paused before step PAUSE_AT (``--pause-worker 1``) past the heart-beat timeout; SIGCONT.

    Worker 1 is let go once ps:0 no longer counts it live and the chief
    made 10 steps without it: global steps on the gradient path (BSP,
    SyncReplicas); under SSP, which counts none, the chief's batches ps:0
    applied. Async counts none either and nobody waits for worker 1: there
    it is let go once the chief is done (exited, or finished ``fit`` and
    waiting at ``--barrier`` for worker 1). Returns what was seen:
    ``stopped_s`` (how long it was stopped), ``dead_after_s`` (from the stop
    until ps:0 gave up on it), ``step_when_dead``, ``steps_without_it`` (in
    the unit above; 0 under async) and ``batches_of_1`` (worker 1's batches
    ps:0 had applied then).
    """
    def progress(status):
        return int(status["worker_batches"].get("0", 0)) if mode == "ssp" else status["global_step"]

    seen = {}
    wait_for_file(cluster, os.path.join(out, "paused"), 240)
    worker1 = cluster.process("worker:1")
    worker1.signal(signal.SIGSTOP)
    stopped = time.monotonic()
    open(os.path.join(out, "resume"), "w").close()  # read when it runs again
    try:
        deadline = stopped + HEARTBEAT_TIMEOUT_S + 30
        while 1 in ps_status(cluster, 0)["live_workers"]:  # the PS gives up on it after the heart-beat timeout
            if time.monotonic() > deadline:
                raise TimeoutError("worker 1 still live on ps:0 30 s after the heart-beat timeout")
            time.sleep(0.1)
        seen["dead_after_s"] = time.monotonic() - stopped
        first = progress(ps_status(cluster, 0))
        seen["step_when_dead"] = first
        deadline = time.monotonic() + 60
        while progress(ps_status(cluster, 0)) < first + 10:  # the chief trains without it
            code = cluster.process("worker:0").poll()
            if mode == "async" and (code == 0 or os.path.exists(os.path.join(out, "trained-0"))):
                break  # nobody waits for worker 1: the chief may be done already (or done and at --barrier)
            if code is not None:
                raise RuntimeError(f"the chief exited {code}:\n{cluster.log('worker:0')[-3000:]}")
            if time.monotonic() > deadline:
                raise TimeoutError("the chief made no progress without the stopped worker")
            time.sleep(0.1)
        last = ps_status(cluster, 0)
        seen["steps_without_it"] = progress(last) - first
        seen["batches_of_1"] = last["worker_batches"].get("1")
    finally:
        seen["stopped_s"] = time.monotonic() - stopped
        worker1.signal(signal.SIGCONT)
    return seen


def sync_replicas_m(mode, fault):
    """The ``--m`` of the job in ``mode`` with ``fault`` (SyncReplicas' M of 2 workers; 1 in other modes).

    1 (under SyncReplicas worker 1 is a backup the job can do without),
    except for a stopped worker under SyncReplicas: M=2 makes the chief
    wait for worker 1 until the PS no longer counts it live (with M=1 it
    would never wait, and could finish before the stop is noticed).
    """
    return 2 if mode == "sync_replicas" and fault == "stop" else 1
