"""The fault matrix: a PS task, the chief or a worker killed (or stopped) mid-fit; the job ends as good as without.

Real processes (``tfdist.testing.LocalCluster``, whose wait loop is the
launcher's: ``launch.restart_ps`` is on by default): 2 PS tasks, 2 workers,
an MLP on digits. The chief pauses before a given step (a file handshake,
bounded), the test SIGKILLs ``ps:1`` and lets the chief go on; both workers
must finish ``fit`` with a good model, having recovered by themselves, and
``ps:1`` must come back as a new incarnation restored from a checkpoint (or,
without ``ps.checkpoint_dir``, initialised again from the chief's values).

The other faults: the chief SIGKILLs itself (the launcher starts it again);
a non-chief worker is SIGKILLed under async (the job goes on without it);
a worker is SIGSTOPped past ``ps.heartbeat_timeout_s`` under BSP and
SyncReplicas (the others go on, it rejoins after SIGCONT); ``ps:1`` is
SIGKILLed in the middle of writing a checkpoint (it restores the previous
one). Each compares the chief's test accuracy with the same job without the
fault (``_baseline``) and prints what was lost.
"""

import fcntl
import json
import os
import signal
import sys
import time

import pytest

from tfdist.config import JobConfig, StrategyConfig
from tfdist.testing import LocalCluster

# The faults are injected by the scripts' durability_faults.py (benchmarks/fault_accuracy.py injects the same).
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "scripts"))
from durability_faults import (EVERY, HEARTBEAT_INTERVAL_S, HEARTBEAT_TIMEOUT_S, PAUSE_AT, STEPS,  # noqa: E402
                               checkpoint_files, kill_ps1, kill_worker1, stop_worker1, sync_replicas_m,
                               wait_for_file)

pytestmark = pytest.mark.timeout(420)

_BASELINE: dict[tuple[str, int, bool], float] = {}


class _Logs(dict):
    """Whole task logs (for assertions on their lines); shown as their last 3000 characters each."""

    def __repr__(self):
        return repr({task: text[-3000:] for task, text in self.items()})


#: How far below the undisturbed job's accuracy a faulted job may end in one comparison. Two undisturbed
#: async/SSP runs of this job differ by up to ~2 points (measured: SSP 0.944 and 0.961): 3 points there (the
#: mean over repeated runs is within 1 point: benchmarks/fault_accuracy.py). The sync modes often end equal,
#: but the pause/hold handshake changes SyncReplicas' step interleaving (measured 0.922 vs 0.933): 2 points.
#: Under the parallel suite's load, with a constant learning rate, async runs spread over 4.5 points (0.894 to
#: 0.939 undisturbed, 0.908 to 0.953 with ps:1 killed) and one killed-PS comparison failed by 0.3 point
#: (2026-11-29, 0.905 against 0.939): the killed-PS tests run the job with a decaying learning rate
#: (durability_worker.py --lr-decay), which narrows that spread to ~2 points.
MARGIN = {"async": 0.03, "ssp": 0.03, "bsp": 0.02, "sync_replicas": 0.02}


def _run(tmp_path, scripts_dir, mode, config, fault=None, extra=(), workers=(0, 1), m=1, evaluator=False):
    """Runs the job; ``fault(cluster, out)`` (run once the job started) injects the fault.

    Returns (results of ``workers`` that wrote one, what ``fault`` returned, restarts, logs, cluster).
    """
    out = tmp_path / "out"
    out.mkdir()
    cluster = LocalCluster(workers=2, ps=2, config=config, log_dir=str(tmp_path / "logs"), evaluator=evaluator)
    args = ["--out", str(out), "--mode", mode, "--m", str(m), "--steps", str(STEPS), *extra]
    before = None
    with cluster:
        cluster.start(os.path.join(scripts_dir, "durability_worker.py"), args)
        if fault is not None:
            before = fault(cluster, out)
        cluster.wait(240)  # the launcher's loop: restarts a dead ps:1, goes on without a dead non-chief worker
        if evaluator:  # it ends by itself once the job is over (bounded)
            deadline = time.monotonic() + 60
            while cluster.process("evaluator:0").poll() is None:
                assert time.monotonic() < deadline, cluster.log("evaluator:0")[-3000:]
                time.sleep(0.1)
        logs = _Logs({t: cluster.log(t) for t in ("worker:0", "worker:1", "ps:1")})
        restarts = dict(cluster.job.restarts)
    results = [json.load(open(out / f"worker-{w}.json")) for w in workers]
    return results, before, restarts, logs, cluster


def _baseline(tmp_path_factory, scripts_dir, mode, m=1, lr_decay=False) -> float:
    """The chief's test accuracy of the same job without the fault: one job per mode and M in the whole run.

    Under pytest-xdist the workers share it through a file in the run's shared temporary directory: the
    first to ask runs the job, holding a lock; the others wait for its result (or, if it failed, run it).
    """
    key, name = (mode, m, lr_decay), f"{mode}-{m}{'-decay' if lr_decay else ''}"
    if key not in _BASELINE:
        base = tmp_path_factory.getbasetemp()
        shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
        result = shared / f"durability-baseline-{name}.json"
        with open(shared / f"durability-baseline-{name}.lock", "w") as lock:
            deadline = time.monotonic() + 400  # a baseline job is bounded by cluster.wait(240)
            while True:
                try:
                    fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    assert time.monotonic() < deadline, f"another worker's baseline job ({mode}, M={m}) never ended"
                    time.sleep(0.2)
            try:
                if not result.exists():
                    results, *_ = _run(tmp_path_factory.mktemp(f"baseline-{name}"), scripts_dir, mode,
                                       JobConfig(name="durable"), m=m, extra=["--lr-decay"] if lr_decay else ())
                    result.write_text(json.dumps({"accuracy": results[0]["accuracy"]}))
                _BASELINE[key] = json.loads(result.read_text())["accuracy"]
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)
    return _BASELINE[key]


# The slower cases (each with a baseline job of its own) run with RUN_SLOW=1; CI runs them (.ci/run), and
# benchmarks/recovery.py measures the PS-kill recovery of async and BSP jobs.
_SLOW = pytest.mark.slow


@pytest.mark.parametrize("mode, with_checkpoints", [
    ("async", True), pytest.param("async", False, marks=_SLOW), pytest.param("ssp", True, marks=_SLOW),
    pytest.param("bsp", True, marks=_SLOW), pytest.param("sync_replicas", False, marks=_SLOW),
], ids=["async-checkpoint", "async-no-checkpoint", "ssp-checkpoint", "bsp-checkpoint", "sync_replicas-no-checkpoint"])
def test_a_job_survives_a_killed_ps(tmp_path, tmp_path_factory, scripts_dir, mode, with_checkpoints):
    config = JobConfig(name="durable")
    if with_checkpoints:
        config.ps.checkpoint_dir = str(tmp_path / "ckpt")
        config.ps.checkpoint_every_steps = EVERY
        config.ps.checkpoint_every_s = None
    results, before, restarts, logs, _ = _run(tmp_path, scripts_dir, mode, config, fault=kill_ps1,
                                              extra=["--pause-at", str(PAUSE_AT), "--lr-decay"])
    assert restarts == {"ps:1": 1}
    baseline = _baseline(tmp_path_factory, scripts_dir, mode, lr_decay=True)  # (durability_worker.py: why)
    print(f"{mode}: accuracy {results[0]['accuracy']:.4f} with ps:1 killed, {baseline:.4f} without")
    for r in results:
        assert r["steps"] == STEPS, logs
        assert r["accuracy"] >= baseline - MARGIN[mode], (r, baseline, logs)
        # every worker recovered by itself (none could finish before the kill: the script holds the others
        # before step PAUSE_AT + 30 until the test says resume; under SyncReplicas M=1 worker 1 did, once, in CI)
        assert r["recoveries"] >= 1, logs
    after = results[0]["ps_status"][1]
    assert after["incarnation"] != before["incarnation"]
    if mode in ("bsp", "sync_replicas"):  # the gradient path: the chief reset every task to its state
        assert "reset every parameter server to this worker's state" in logs["worker:0"]
        assert len({st["state_step"] for st in results[0]["ps_status"]}) == 1
    elif with_checkpoints:
        restored = after["restored_from"]
        # the newest checkpoint captured before the kill, at most the progress seen: the first step at or past a
        # multiple of EVERY (async's default exchange carries 1..exchange_every_max steps: the count jumps by that)
        most = StrategyConfig().exchange_every_max
        assert restored is not None and restored % EVERY < most and EVERY <= restored <= before["progress"] + EVERY
        print(f"ps:1 restored from step {restored}; progress before the kill {before['progress']}; "
              f"at least {before['progress'] - restored} applied batches lost on it")
        assert "restarted from the checkpoint" in logs["ps:1"]
    else:
        assert after["restored_from"] is None
        assert "initialised again from this worker's current values" in logs["worker:0"]


@_SLOW
def test_an_evaluator_goes_on_across_a_ps_restart(tmp_path, scripts_dir):
    """Async with checkpoints and an evaluator task: ps:1 is SIGKILLed and restarted mid-job; the evaluator's
    rounds wait for it (the other PS task says training goes on), read its new incarnation, and end with the job."""
    config = JobConfig(name="durable")
    config.ps.checkpoint_dir = str(tmp_path / "ckpt")
    config.ps.checkpoint_every_steps, config.ps.checkpoint_every_s = EVERY, None
    def kill_ps1_after_a_round(cluster, out):
        wait_for_file(cluster, str(out / "evaluating"), 240)  # the evaluator has read the job once
        return kill_ps1(cluster, out)

    results, before, restarts, logs, cluster = _run(tmp_path, scripts_dir, "async", config,
                                                    fault=kill_ps1_after_a_round,
                                                    extra=["--pause-at", str(PAUSE_AT)], evaluator=True)
    assert restarts == {"ps:1": 1}
    evaluator_log = cluster.log("evaluator:0")
    assert cluster.process("evaluator:0").poll() == 0, evaluator_log[-3000:]
    rounds = json.load(open(tmp_path / "out" / "evaluator.json"))["rounds"]
    incarnations = [r["incarnations"][1] for r in rounds]
    assert before["incarnation"] in incarnations, incarnations  # rounds before the kill...
    after = [r for r in rounds if r["incarnations"][1] not in (None, before["incarnation"])]
    assert after, (incarnations, evaluator_log[-3000:])  # ...and after the restart
    assert "waiting for it to come back" in evaluator_log or "restarted" in evaluator_log, evaluator_log[-3000:]
    # its last round saw the final model (the chief's accuracy after fit, within the last updates' noise)
    assert after[-1]["accuracy"] >= results[0]["accuracy"] - 0.03, (after[-1], results[0]["accuracy"])
    print(f"evaluator: {len(rounds)} rounds, {len(after)} after the restart of ps:1; last accuracy "
          f"{after[-1]['accuracy']:.4f} (chief {results[0]['accuracy']:.4f})")


@pytest.mark.parametrize("mode", ["async", pytest.param("bsp", marks=_SLOW),
                                  pytest.param("sync_replicas", marks=_SLOW)])
def test_a_job_survives_a_killed_chief(tmp_path, tmp_path_factory, scripts_dir, mode):
    """The chief SIGKILLs itself mid-fit; the launcher starts it again and it joins with the job's values.

    Every worker evaluates once all have finished ``fit`` (``--barrier``): worker 1 finishes while the
    restarted chief still trains its steps again, and its model then was the job's mid-training one
    (measured in CI: 0.922 against 0.953, while the chief ended at 0.947).
    """
    results, _, restarts, logs, _ = _run(tmp_path, scripts_dir, mode, JobConfig(name="durable"),
                                         extra=["--crash-chief-at", str(PAUSE_AT), "--barrier"])
    assert restarts == {"worker:0": 1}, logs
    assert os.path.exists(tmp_path / "out" / "crashed")
    baseline = _baseline(tmp_path_factory, scripts_dir, mode)
    print(f"{mode}: accuracy {results[0]['accuracy']:.4f} with the chief killed, {baseline:.4f} without")
    for r in results:
        assert r["steps"] == STEPS, logs
        assert r["accuracy"] >= baseline - MARGIN[mode], (r, baseline, logs)
    assert "already held values" in logs["worker:0"]  # the new chief joined; it did not initialise the PS again


@pytest.mark.parametrize("mode", ["async", pytest.param("sync_replicas", marks=_SLOW)])
def test_a_job_goes_on_without_a_killed_worker(tmp_path, tmp_path_factory, scripts_dir, mode):
    """Worker 1 is SIGKILLed mid-fit; under ``launch.on_worker_failure: auto`` the chief trains to the end.

    Async, and SyncReplicas with M=1 (worker 1 is a backup the mode can do without). BSP goes on as well (its
    barrier shrinks to the live workers: ``tfdist.cluster.failure``); ``benchmarks/fault_accuracy.py --modes
    bsp --faults worker`` runs it.
    """
    results, _, restarts, logs, cluster = _run(
        tmp_path, scripts_dir, mode, JobConfig(name="durable"), fault=kill_worker1, workers=(0,),
        extra=["--pause-at", str(PAUSE_AT), "--pause-worker", "1"])
    assert restarts == {}
    assert [str(t) for t in cluster.job.failed_workers] == ["worker:1"]
    assert not os.path.exists(tmp_path / "out" / "worker-1.json")
    chief = results[0]
    assert chief["steps"] == STEPS and chief["recoveries"] == 0, logs
    baseline = _baseline(tmp_path_factory, scripts_dir, mode)
    done_by_1 = int(chief["ps_status"][0]["worker_batches"]["1"])
    assert PAUSE_AT - 2 <= done_by_1 <= PAUSE_AT - 1  # its last update may have been in flight
    print(f"{mode}: accuracy {chief['accuracy']:.4f} with worker 1 killed, {baseline:.4f} without; worker 1 "
          f"trained {done_by_1} of its {STEPS} batches: {STEPS - done_by_1} lost (not taken over)")
    # the job lost a third of its batches (worker 1's, not taken over): measured async 0.933 vs 0.958 and
    # 0.936 vs 0.930; SyncReplicas 0.936 vs 0.925. The training changes, as with a stopped worker: 2 points.
    assert chief["accuracy"] >= baseline - max(MARGIN[mode], 0.02), (chief, baseline, logs)


@_SLOW
@pytest.mark.parametrize("mode", ["async", "ssp", "bsp", "sync_replicas"])
def test_a_stopped_worker_rejoins(tmp_path, tmp_path_factory, scripts_dir, mode):
    """Worker 1 is SIGSTOPped past the heart-beat timeout: the chief goes on without it; SIGCONT, it rejoins.

    (Async: the chief never waits for it, and may finish before the PS gives up on worker 1. SSP: the chief
    waits at its staleness bound until the PS gives up on worker 1; its heart-beats must not queue behind
    that wait, or the PS counts the chief gone too and the wait never ends: fixed, found by
    benchmarks/fault_accuracy.py.)

    SyncReplicas aggregates M=2 of the 2 workers here, so that the chief
    waits for worker 1 until the PS no longer counts it live (with M=1 it
    would never wait, and could finish before the stop is noticed).
    """
    config = JobConfig(name="durable")
    config.ps.heartbeat_interval_s, config.ps.heartbeat_timeout_s = HEARTBEAT_INTERVAL_S, HEARTBEAT_TIMEOUT_S
    seen = {}

    def stop(cluster, out):
        seen.update(stop_worker1(cluster, out, mode))

    m = sync_replicas_m(mode, "stop")
    # With the decaying learning rate (durability_worker.py --lr-decay) and its own baseline job: with a
    # constant rate, SSP under load ended 0.936-0.958 undisturbed and 0.928-0.947 stopped (5 rounds each,
    # benchmarks/fault_accuracy.py), and CI once compared 0.930 stopped against a 0.961 baseline (stop 41).
    results, _, restarts, logs, _ = _run(tmp_path, scripts_dir, mode, config, fault=stop, m=m,
                                         extra=["--pause-at", str(PAUSE_AT), "--pause-worker", "1", "--lr-decay"])
    assert restarts == {}
    # stopped until the PS gave up on it; its last heart-beat came at most one interval before the stop
    assert seen["stopped_s"] >= seen["dead_after_s"], seen
    assert seen["dead_after_s"] >= HEARTBEAT_TIMEOUT_S - HEARTBEAT_INTERVAL_S - 0.2, seen
    baseline = _baseline(tmp_path_factory, scripts_dir, mode, m, lr_decay=True)
    print(f"{mode}: accuracy {results[0]['accuracy']:.4f} with worker 1 stopped for {seen['stopped_s']:.1f} s "
          f"(not live after {seen['dead_after_s']:.1f} s), {baseline:.4f} without; the chief made "
          f"{seen['steps_without_it']} global steps without it; worker 1 had sent {seen['batches_of_1']} batches")
    for r in results:
        assert r["steps"] == STEPS, logs  # every worker finishes fit, the stopped one too
        # The stop changes the training itself, not only its bookkeeping: the chief made its steps alone (half
        # the batch) meanwhile. Measured 0.928 and 0.922 (BSP), 0.933 (SyncReplicas) vs 0.944: 3 points. With
        # the decay, beside two busy loops, 5 rounds each (undisturbed / stopped): async 0.933-0.947 / 0.925-0.944,
        # SSP 0.928-0.942 / 0.922-0.942, BSP 0.922 / 0.922-0.928, SyncReplicas 0.922 / 0.925-0.930.
        assert r["accuracy"] >= baseline - 0.03, (r, baseline, logs)
    status = results[1]["ps_status"][0]
    assert status["joins"] >= 1, status  # worker 1 came back as a joiner
    assert int(status["worker_batches"]["1"]) == STEPS


@_SLOW
@pytest.mark.parametrize("mode", ["async", "bsp", "sync_replicas"])
def test_a_ps_killed_while_writing_a_checkpoint_restores_the_previous_one(tmp_path, tmp_path_factory, scripts_dir,
                                                                          mode):
    """SIGKILL ps:1 in the middle of a checkpoint write (a 16 MiB shard); it restores the one before.

    The test polls ps:1's checkpoint directory; when a temporary file
    appears (after one complete checkpoint), it SIGSTOPs ps:1 at once and
    looks again: if the write is still unfinished it SIGKILLs ps:1 there
    (a torn write), else it lets ps:1 go on and waits for the next write.
    """
    config = JobConfig(name="durable")
    ckpt = tmp_path / "ckpt"
    config.ps.checkpoint_dir, config.ps.checkpoint_every_steps, config.ps.checkpoint_every_s = str(ckpt), EVERY, None
    shard_dir = str(ckpt / "ps-1")

    def kill_ps1_while_writing(cluster, out):
        ps1 = cluster.process("ps:1")
        deadline, tries = time.monotonic() + 180, 0
        while True:
            assert time.monotonic() < deadline, f"no checkpoint write of ps:1 caught in 180 s ({tries} tries)"
            assert ps1.poll() is None and cluster.process("worker:0").poll() is None, cluster.log("worker:0")[-3000:]
            complete, torn = checkpoint_files(shard_dir)
            if complete and torn and max(torn) > max(complete):
                tries += 1
                ps1.signal(signal.SIGSTOP)  # frozen: the directory stays as it is while we look
                complete, torn = checkpoint_files(shard_dir)
                if torn and max(torn) not in complete:
                    cluster.kill("ps:1")  # the write of step max(torn) is torn
                    return {"complete": complete, "torn": max(torn), "tries": tries}
                ps1.signal(signal.SIGCONT)  # it finished in the meantime: catch the next one
            time.sleep(0.002)

    results, killed, restarts, logs, _ = _run(tmp_path, scripts_dir, mode, config, fault=kill_ps1_while_writing,
                                              extra=["--ballast-mb", "16"])
    assert restarts == {"ps:1": 1}, logs
    previous = max(killed["complete"])
    assert previous < killed["torn"]
    for r in results:
        assert r["steps"] == STEPS, logs
        assert r["recoveries"] >= 1, logs
    after = results[0]["ps_status"][1]
    assert after["bytes"] >= 16 * 2 ** 20  # the ballast is on ps:1
    assert after["restored_from"] == previous, (after, killed)  # the previous complete checkpoint, not the torn one
    assert f"restarted from the checkpoint of step {previous}" in logs["ps:1"]
    baseline = _baseline(tmp_path_factory, scripts_dir, mode)
    print(f"{mode}: ps:1 killed while writing the checkpoint of step {killed['torn']} (caught on try "
          f"{killed['tries']}); restored step {previous}: at least {killed['torn'] - previous} applied batches lost "
          f"on it; accuracy {results[0]['accuracy']:.4f}, {baseline:.4f} without the fault")
    # The torn write loses the batches ps:1 applied since its previous checkpoint (20 of 150 steps, on half the
    # parameters). Under SyncReplicas that adds to its run-to-run spread: 10 undisturbed runs of this job ended
    # 0.925-0.939, 5 faulted ones 0.914-0.944 (2026-11-29; 0.914 against a 0.939 baseline failed a 2-point margin).
    margin = 0.03 if mode == "sync_replicas" else MARGIN[mode]
    assert results[0]["accuracy"] >= baseline - margin, (results[0], baseline, logs)
