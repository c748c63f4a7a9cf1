"""tfdist.AllReduceStrategy across real worker processes: partial all-reduce around a straggler.

One job of 3 worker processes (``tfdist.testing.LocalCluster``: free ports,
per-task logs, every child killed on exit, bounded waits) runs
``scripts/allreduce_worker.py``, which exercises, in order:

1. the update is the mean gradient of the members (all 3, then {0, 1});
2. 3 epochs x 20 steps with worker 0 — the collective leader — 3x slower
   (emulated compute, inside the strategy's step) for the first 30 steps:
   it is detected and left out, re-admitted at the next epoch start with the
   training state of worker 1, left out again while still slow, and re-admitted
   for good after it recovered; members stay bit-identical at every step;
3. worker 2 kills itself (SIGKILL) mid-training: the others get an error naming
   it, within the collective timeout, instead of hanging. It dies in one of the
   epoch's profiling iterations, where every worker takes part: later, on a
   loaded machine, the detector may already have left it out as a straggler,
   and then the survivors rightly never notice (CI saw exactly that once).

Assertions count iterations and compare hashes, never seconds (except that the
error arrives within the timeout bound).
"""

import json
import os
import time

from tfdist.testing import LocalCluster, run_python

SCRIPT = os.path.join(os.path.dirname(__file__), "scripts", "allreduce_worker.py")
WAIT_S = 300  # bound on the whole job (TF start-up of 3 processes on 2 shared cores is the bulk)
TIMEOUT_S = 20.0
STEPS, EPOCHS, SLOW_UNTIL, LIMIT = 20, 3, 30, 3


def _load(out, n):
    return [json.load(open(os.path.join(out, f"worker-{i}.json"))) for i in range(n)]


def _run(tmp_path):
    out = str(tmp_path)
    args = ["--out", out, "--epochs", str(EPOCHS), "--steps", str(STEPS), "--base", "0.05", "--factor", "3",
            "--slow-worker", "0", "--slow-until", str(SLOW_UNTIL), "--limit", str(LIMIT),
            "--timeout", str(TIMEOUT_S), "--kill-worker", "2", "--kill-at", "3"]
    with LocalCluster(workers=3, ps=1, log_dir=str(tmp_path / "logs")) as cluster:
        cluster.start(SCRIPT, args=args, tasks=["worker:0", "worker:1", "worker:2"])
        deadline = time.monotonic() + WAIT_S
        codes = {}
        for w in (0, 1, 2):
            proc = cluster.process(f"worker:{w}")
            codes[w] = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
        logs = {w: cluster.log(f"worker:{w}")[-3000:] for w in (0, 1, 2)}
    assert codes[0] == 0 and codes[1] == 0, logs
    assert codes[2] != 0, logs  # killed itself
    return _load(out, 3), json.load(open(os.path.join(out, "killed.json")))


def test_partial_all_reduce_excludes_readmits_and_keeps_members_identical(tmp_path):
    results, killed = _run(tmp_path)

    # 1. the update equals lr x the mean gradient of the members (SGD), full and partial
    for r in results:
        full, partial = r["mean"]["checks"]
        assert full["members"] == [0, 1, 2] and partial["members"] == [0, 1]
        assert full["max_abs_error"] < 1e-5 and full["max_abs_update"] > 1e-4, full
        if r["worker_id"] in (0, 1):
            assert partial["max_abs_error"] < 1e-5 and partial["max_abs_update"] > 1e-4, partial
        else:
            assert partial["max_abs_update"] == 0.0, partial  # left out: unchanged
    assert len({r["mean"]["checks"][1]["hash"] for r in results[:2]}) == 1

    # 2. identical verdicts everywhere; only worker 0 is ever detected
    histories = [r["straggler_history"] for r in results]
    events = [[(e["kind"], e["worker"], e["step"]) for e in h["events"] if e["detector"] == "dynamic_threshold"]
              for h in histories]
    assert events[1] == events[2], events
    ev = events[1]
    assert {w for _, w, _ in ev} == {0}, ev
    first_detection = next(s for k, _, s in ev if k == "detected")
    assert 4 <= first_detection < SLOW_UNTIL, ev
    # recovery is seen when it takes part again: at the first epoch start after the slow-down ends
    recovered = [s for k, _, s in ev if k == "recovered"]
    assert recovered and 2 * STEPS <= recovered[-1] <= 2 * STEPS + LIMIT, ev
    assert ev[-1][0] == "recovered"

    # who took part: per step, from every worker's own record
    steps = [r["steps"] for r in results]
    assert all(len(s) == STEPS * EPOCHS for s in steps)
    members = [tuple(s["members"]) for s in steps[1]]
    assert members[: first_detection + 1] == [(0, 1, 2)] * (first_detection + 1)
    assert members[first_detection + 1] == (1, 2)  # left out right after the detecting iteration
    assert members[2 * STEPS:] == [(0, 1, 2)] * STEPS  # re-admitted for good at the last epoch start
    out_steps = [t for t, m in enumerate(members) if 0 not in m]
    assert all(t % STEPS >= 5 for t in out_steps)  # everyone takes part in the profiling iterations
    assert results[0]["stats"]["skipped"] == len(out_steps)
    assert results[1]["stats"]["partial_steps"] == len(out_steps) + 1  # + the {0, 1} step of part 1
    # worker 0's own view of who takes part agrees with the members' about itself
    assert [0 in s["members"] for s in steps[0]] == [0 in m for m in members]
    # the excluded worker's time is not counted while it is out
    times = histories[1]["times"]
    assert all(times[t][0] is None for t in out_steps)

    # bit-identical training state among the members of every step, the re-admitted worker included
    for t, m in enumerate(members):
        hashes = {steps[w][t]["hash"] for w in m}
        assert len(hashes) == 1, (t, m, [steps[w][t]["hash"] for w in range(3)])
    readmissions = [p for p in histories[1]["participation"] if p["joined"]]
    assert readmissions and all(p["joined"] == [0] and p["source"] == 1 for p in readmissions), readmissions
    assert readmissions[-1]["step"] == 2 * STEPS
    # (+1: worker 0 was the source when worker 2 rejoined after part 1; +1: the first step, where every
    # worker starts from worker 0's state; +1: the train phase's model and Adam, built after the job's first
    # step, start from worker 0's values before their first step, issue #25)
    assert results[0]["stats"]["resyncs"] == len(readmissions) + 3
    assert all(h["participation"] == histories[1]["participation"] for h in histories[1:])
    # training went on: the loss fell
    loss = results[1]["keras_history"]["loss"]
    assert loss[-1] < loss[0]

    # 3. worker 2 was killed: the others raise an error naming it, within the timeout (no hang)
    assert killed["worker"] == 2
    for r in results[:2]:
        raised = r["raised"]
        assert raised is not None and raised["type"] in ("CollectivePeerError", "CollectiveTimeoutError"), raised
        if raised["type"] == "CollectivePeerError":
            assert 2 in raised["peers"] or "unreachable" in raised["message"], raised
        assert raised["time"] - killed["time"] <= TIMEOUT_S + 10.0, (raised, killed)


def test_a_multi_worker_job_never_trains_alone_after_tf_ran_an_op(tmp_path):
    """TF_CONFIG lists 2 workers, the script ran a TF op and never joined the group: refused, naming the fix.

    (Joining by itself while TF has run no op is the Keras matrix's AllReduce case, which never calls
    ``init_worker_group``.) Before, this trained each worker as a job of its own, silently.
    """
    import sys

    code = (
        "import tensorflow as tf\n"
        "tf.constant(1.0) + 1.0\n"
        "import tfdist\n"
        "from tfdist.collective import CollectiveSetupError\n"
        "try:\n"
        "    tfdist.AllReduceStrategy()\n"
        "except CollectiveSetupError as e:\n"
        "    print('REFUSED:', e)\n"
        "else:\n"
        "    print('TRAINED ALONE')\n"
    )
    tf_config = json.dumps({"cluster": {"worker": ["127.0.0.1:1", "127.0.0.1:2"]}, "task": {"type": "worker",
                                                                                          "index": 1}})
    env = {**os.environ, "TF_CONFIG": tf_config}
    script = tmp_path / "ran_an_op.py"
    script.write_text(code)
    done = run_python([sys.executable, str(script)], env, timeout=120, cwd=str(tmp_path))
    assert done.returncode == 0, done.stderr[-2000:]
    assert "REFUSED:" in done.stdout and "init_worker_group()" in done.stdout, done.stdout + done.stderr[-2000:]


def _mixed_precision_job(tmp_path, extra):
    out = tmp_path / "out"
    out.mkdir()
    script = os.path.join(os.path.dirname(__file__), "scripts", "mixed_precision_worker.py")
    with LocalCluster(workers=2, ps=1, log_dir=str(tmp_path / "logs")) as cluster:
        cluster.start(script, args=["--out", str(out), *extra], tasks=["worker:0", "worker:1"])
        deadline = time.monotonic() + 180
        codes = {w: cluster.process(f"worker:{w}").wait(timeout=max(1.0, deadline - time.monotonic()))
                 for w in (0, 1)}
        logs = {w: cluster.log(f"worker:{w}")[-3000:] for w in (0, 1)}
    assert codes == {0: 0, 1: 0}, logs
    return [json.load(open(out / f"worker-{w}.json")) for w in (0, 1)]


def test_mixed_float16_overflow_on_one_worker_is_skipped_by_every_worker(tmp_path):
    """Dynamic loss scaling: worker 1's gradients overflow at step 3, worker 0's do not; all skip it, stay one model.

    Keras's LossScaleOptimizer checks each replica's own gradients before they are reduced (and crashed under
    this strategy before: its nested call_for_each_replica). Without the members' joint answer worker 0 would
    all-reduce alone at that step and the workers' collectives would no longer pair up.
    """
    w0, w1 = _mixed_precision_job(tmp_path, ["--overflow-worker", "1", "--overflow-step", "3"])
    assert w0["hash"] == w1["hash"], (w0, w1)  # one model
    assert w0["loss_scale"] == w1["loss_scale"] == w0["initial_scale"] / 2, (w0, w1)  # both skipped one step
    assert w0["iterations"] == w1["iterations"] == 7 and w0["steps"] == w1["steps"] == 8, (w0, w1)
