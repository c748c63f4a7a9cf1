"""Accuracy cost of each fault of the fault matrix, over repeated runs (issue #13: "within 1 point").

One run of the fault-matrix job (``tests/integration/test_ps_durability.py``:
2 PS tasks, 2 workers, an MLP on digits, 150 steps per worker) differs from
another undisturbed run by up to ~2 points, so a single comparison cannot
show a 1-point bound. This script runs the job ``--rounds`` times
undisturbed and ``--rounds`` times with a fault, interleaved, per mode and
fault, and reports the final test accuracy of the job: every value, the
means, their difference and its standard error, and the paired differences
(below). The faults are those of the test
(injected by the same code, ``tests/integration/scripts/durability_faults.py``);
the undisturbed job has the faulted job's config and M:

* ``ps``: ps:1 SIGKILLed while the chief is paused before its 60th step
  (checkpoints every 20 steps; the launcher restarts ps:1, which restores
  its newest checkpoint; under BSP and SyncReplicas the chief then resets
  every task to its own state).
* ``chief``: the chief SIGKILLs itself after its 60th step; the launcher
  starts it again (``launch.restart_chief``) and it joins the running job.
  The new process runs the script from its start: it trains its 150 steps
  again on the job's values (the job trains 60 chief batches more).
* ``worker``: worker 1 SIGKILLed while it is paused before its 60th step;
  the launcher goes on without it (``launch.on_worker_failure: auto``; under
  BSP the barrier shrinks to the live workers) and its remaining batches
  are not trained by anyone.
* ``stop``: worker 1 SIGSTOPped while paused before its 60th step, past the
  heart-beat timeout (interval 1 s, timeout 3 s), and SIGCONTed once ps:0
  gave up on it and the chief made 10 global steps without it; it rejoins.
  (Async counts no global steps: worker 1 goes on once the chief is done.)

SyncReplicas aggregates M=1 of the 2 workers, M=2 with a stopped worker (as
the test). SSP has staleness 3.

What is measured (``--evaluate final``, the default): the test accuracy of
the job's final model, which every worker pulls once every worker that is
still part of the job finished ``fit`` (``durability_worker.py --barrier``):
a worker that was stopped, or a job whose workers finish at different
times, trains after the chief's own ``fit`` ended, so the chief's accuracy
right after its ``fit`` can be a model mid-training. The one exception is
the faulted run of ``worker``: worker 1 is dead and never arrives at the
barrier, and the chief is the last to train, so that run evaluates right
after the chief's ``fit`` (no barrier; its undisturbed partner has the
barrier). ``--evaluate own-fit`` is the earlier method: the chief evaluates
right after its own ``fit``, whatever the other worker still trains.

Seeds (``--seeds paired``, the default): round r runs both its undisturbed
and its faulted job with ``durability_worker.py --seed F+r`` (F:
``--first-seed``, default 0; the seed sets the model's initial values and
the workers' shuffle orders), so each round is a pair of jobs that differ
by the fault only, and the rounds sample different trajectories
(undisturbed BSP and SyncReplicas with M=2 are deterministic: with one
seed every undisturbed run is the same one trajectory). The summary adds
the mean of the per-round differences (faulted minus undisturbed, rounds
where both jobs finished) and its standard error (sample SD /
sqrt(pairs)). ``--seeds fixed`` is the earlier method: seed 0 in every
run.

Usage::

    python benchmarks/fault_accuracy.py [--modes async,ssp,bsp,sync_replicas] [--faults ps,chief,worker,stop]
        [--rounds 5] [--evaluate final|own-fit] [--seeds paired|fixed] [--first-seed 0] [--out FILE]

Prints one JSON document (``modes[mode][fault]``: the summary; ``runs``:
every run; a run whose job did not finish has ``error`` and is left out of
the means); ``--out`` is rewritten after every run. The summary's fields:
``undisturbed`` and the faulted side's accuracies (``ps_killed``,
``chief_killed``, ``worker_killed``, ``worker_stopped``), their means and
population SDs, ``mean_difference_points`` and ``standard_error_points``
(unpaired: difference of the means, SE from both sides' sample variances),
``within_1_point`` (of that difference), ``failed_runs``; added with the
paired seeds (every field before is still there): ``seeds`` (per side,
the seed of each accuracy), ``paired_differences_points`` (per round with
both jobs finished: round, seed, faulted minus undisturbed in points),
``pairs``, ``mean_paired_difference_points``,
``paired_standard_error_points`` (None with fewer than 2 pairs),
``within_1_point_paired``. Each run has ``seed``, ``evaluated``
(``after_barrier``: the job's final model; ``after_own_fit``: the chief's
right after its ``fit``), ``global_step``, ``chief_steps`` and
``worker_batches`` (ps:0's, once the chief is done), with the barrier
``chief_accuracy_after_own_fit`` (the chief's model right after its
``fit``, before the barrier: what the earlier method measured) and, where
worker 1 wrote one, ``worker1_accuracy``. The document has ``evaluate``,
``seeds`` and ``first_seed`` (absent in documents of the earlier method:
``own-fit``, ``fixed``, 0). About
5-35 s per run on 2 cores with ``TFDIST_FAST_START=1`` (5 rounds x 2 runs:
1-3 minutes per mode and fault).
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import statistics
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPTS = os.path.join(ROOT, "tests", "integration", "scripts")
sys.path.insert(0, ROOT)
sys.path.insert(0, SCRIPTS)
import durability_faults as faults  # noqa: E402  (the fault matrix's own injectors)
from durability_faults import EVERY, HEARTBEAT_INTERVAL_S, HEARTBEAT_TIMEOUT_S, PAUSE_AT, STEPS  # noqa: E402

WORKER = os.path.join(SCRIPTS, "durability_worker.py")
MODES = ("async", "ssp", "bsp", "sync_replicas")
#: Per fault: what it is (for the JSON), and the key of the faulted runs' accuracies in the summary.
FAULTS = {
    "ps": (f"ps:1 SIGKILLed while the chief is paused before its step {PAUSE_AT}; checkpoints every {EVERY} steps; "
           "the launcher restarts ps:1", "ps_killed"),
    "chief": (f"the chief SIGKILLs itself after its step {PAUSE_AT}; the launcher restarts it (launch.restart_chief)",
              "chief_killed"),
    "worker": (f"worker 1 SIGKILLed while paused before its step {PAUSE_AT}; the job goes on without it "
               "(launch.on_worker_failure: auto); its remaining batches are not trained", "worker_killed"),
    "stop": (f"worker 1 SIGSTOPped while paused before its step {PAUSE_AT}, past the heart-beat timeout "
             f"(ps.heartbeat_interval_s {HEARTBEAT_INTERVAL_S:g}, ps.heartbeat_timeout_s {HEARTBEAT_TIMEOUT_S:g}); "
             "SIGCONT once ps:0 gave up on it and the chief made 10 global steps without it", "worker_stopped"),
}
def _config(fault: str, work: str):
    """The job's config with ``fault`` (the undisturbed run of the pair has the same): as the test sets it."""
    from tfdist.config import JobConfig

    config = JobConfig(name="fault-accuracy")
    if fault == "ps":
        config.ps.checkpoint_dir = os.path.join(work, "ckpt")
        config.ps.checkpoint_every_steps, config.ps.checkpoint_every_s = EVERY, None
    elif fault == "stop":
        config.ps.heartbeat_interval_s, config.ps.heartbeat_timeout_s = HEARTBEAT_INTERVAL_S, HEARTBEAT_TIMEOUT_S
    # chief: launch.restart_chief and worker: launch.on_worker_failure "auto" are the defaults the test runs with
    return config


def _fault_args(fault: str) -> list[str]:
    if fault == "chief":
        return ["--crash-chief-at", str(PAUSE_AT)]
    if fault == "ps":
        return ["--pause-at", str(PAUSE_AT)]
    return ["--pause-at", str(PAUSE_AT), "--pause-worker", "1"]  # worker, stop


def uses_barrier(fault: str, faulted: bool, evaluate: str) -> bool:
    """Whether the run evaluates the job's final model at ``--barrier`` (not the killed worker's run: below)."""
    # worker 1 SIGKILLed never arrives at the barrier; the chief is the last to train, its fit ends the job
    return evaluate == "final" and not (faulted and fault == "worker")


def run_job(mode: str, fault: str, faulted: bool, log_dir: str, seed: int = 0, evaluate: str = "final",
            lr_decay: bool = False) -> dict:
    """One run of the job in ``mode`` with ``fault`` (``faulted``) or without; the job's final accuracy.

    ``evaluate``: ``final`` (every worker evaluates once all live workers finished ``fit``, see
    ``uses_barrier``) or ``own-fit`` (the chief evaluates right after its own ``fit``). ``seed``:
    ``durability_worker.py --seed``.
    """
    from tfdist.testing import LocalCluster

    work = tempfile.mkdtemp(prefix=f"{mode}-{fault}-{'fault' if faulted else 'base'}-s{seed}-", dir=log_dir)
    out = os.path.join(work, "out")
    os.makedirs(out)
    m = faults.sync_replicas_m(mode, fault)
    barrier = uses_barrier(fault, faulted, evaluate)
    args = ["--out", out, "--mode", mode, "--m", str(m), "--steps", str(STEPS), "--seed", str(seed)]
    if lr_decay:  # the job's learning rate decays over its steps (the killed-PS tests' job)
        args.append("--lr-decay")
    if barrier:
        args.append("--barrier")
    if faulted:
        args += _fault_args(fault)
    seen: dict = {}
    start = time.monotonic()
    with LocalCluster(workers=2, ps=2, config=_config(fault, work), log_dir=os.path.join(work, "logs")) as cluster:
        cluster.start(WORKER, args)
        if faulted and fault == "ps":
            faults.kill_ps1(cluster, out)
        elif faulted and fault == "worker":
            faults.kill_worker1(cluster, out)
        elif faulted and fault == "stop":
            seen = faults.stop_worker1(cluster, out, mode)
        cluster.wait(300)
        restarts = dict(cluster.job.restarts)
        failed = [str(t) for t in cluster.job.failed_workers]
    chief = json.load(open(os.path.join(out, "worker-0.json")))
    run = {"accuracy": chief["accuracy"], "m": m, "restarts": restarts, "recoveries": chief["recoveries"],
           "wall_s": round(time.monotonic() - start, 1), "seed": seed,
           "evaluated": "after_barrier" if barrier else "after_own_fit",
           "global_step": chief["ps_status"][0]["global_step"], "chief_steps": chief["steps"],
           "worker_batches": chief["ps_status"][0]["worker_batches"]}
    if chief.get("accuracy_after_own_fit") is not None:  # with the barrier: the chief's model right after its fit
        run["chief_accuracy_after_own_fit"] = chief["accuracy_after_own_fit"]
    other = os.path.join(out, "worker-1.json")
    if os.path.exists(other):  # worker 1's accuracy (without the barrier: after its own fit, maybe after the chief)
        run["worker1_accuracy"] = json.load(open(other))["accuracy"]
    if fault == "ps":
        run["restored_from"] = chief["ps_status"][1]["restored_from"]
    if faulted and fault == "chief":
        run["chief_crashed"] = os.path.exists(os.path.join(out, "crashed"))
    if faulted and fault == "worker":
        done = int(chief["ps_status"][0]["worker_batches"]["1"])
        run.update(failed_workers=failed, worker1_batches=done, worker1_batches_lost=STEPS - done)
    if faulted and fault == "stop":
        run.update({k: round(v, 2) if isinstance(v, float) else v for k, v in seen.items()})
    return run


def summarise(base: list[float], faulted: list[float], label: str, runs: list[dict] | None = None) -> dict:
    """The accuracies of both sides (``label``: the faulted side's key), means, SDs, difference ± SE in points.

    With ``runs`` (this mode and fault's runs, each with ``round``, ``seed``, ``fault``, ``accuracy``):
    the paired fields too, one pair per round whose two jobs finished.
    """
    diff = statistics.mean(faulted) - statistics.mean(base)
    se = math.sqrt(statistics.variance(base) / len(base) + statistics.variance(faulted) / len(faulted)) \
        if len(base) > 1 and len(faulted) > 1 else None
    summary = {"undisturbed": base, label: faulted,
               "mean_undisturbed": statistics.mean(base), f"mean_{label}": statistics.mean(faulted),
               "sd_undisturbed": statistics.pstdev(base), f"sd_{label}": statistics.pstdev(faulted),
               "mean_difference_points": 100 * diff, "standard_error_points": None if se is None else 100 * se,
               "within_1_point": abs(100 * diff) <= 1.0}
    if runs is None:
        return summary
    done = [r for r in runs if r["accuracy"] is not None]
    summary["seeds"] = {"undisturbed": [r["seed"] for r in done if not r["fault"]],
                        label: [r["seed"] for r in done if r["fault"]]}
    pairs = []
    for rnd in sorted({r["round"] for r in done}):
        both = {r["fault"]: r for r in done if r["round"] == rnd}
        if True in both and False in both:
            pairs.append({"round": rnd, "seed": both[False]["seed"],
                          "difference_points": 100 * (both[True]["accuracy"] - both[False]["accuracy"])})
    d = [p["difference_points"] for p in pairs]
    summary.update(paired_differences_points=pairs, pairs=len(pairs),
                   mean_paired_difference_points=statistics.mean(d) if d else None,
                   paired_standard_error_points=statistics.stdev(d) / math.sqrt(len(d)) if len(d) > 1 else None,
                   within_1_point_paired=abs(statistics.mean(d)) <= 1.0 if d else None)
    return summary


def _names(text: str, known, flag: str, parser) -> list[str]:
    names = [n for n in text.split(",") if n]
    unknown = [n for n in names if n not in known]
    if unknown or not names:
        parser.error(f"{flag} takes a comma-separated list of {', '.join(known)}. Received: {flag}={text!r}.")
    return names


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--modes", default="async,ssp", help=f"comma-separated, of {','.join(MODES)}")
    p.add_argument("--faults", default="ps", help=f"comma-separated, of {','.join(FAULTS)}")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--evaluate", choices=("final", "own-fit"), default="final",
                   help="final: the job's final model, once every live worker finished fit (default); "
                        "own-fit: the chief's model right after its own fit (the earlier method)")
    p.add_argument("--seeds", choices=("paired", "fixed"), default="paired",
                   help="paired: round r runs both its jobs with seed first-seed + r (default); "
                        "fixed: seed 0 everywhere")
    p.add_argument("--first-seed", type=int, default=0, help="the seed of round 0 with --seeds paired")
    p.add_argument("--lr-decay", action="store_true",
                   help="the job's learning rate decays over its steps (durability_worker.py --lr-decay)")
    p.add_argument("--out")
    args = p.parse_args()
    modes, fault_names = _names(args.modes, MODES, "--modes", p), _names(args.faults, FAULTS, "--faults", p)
    log_dir = tempfile.mkdtemp(prefix="fault-accuracy-")
    result = {"benchmark": "fault_accuracy", "date": datetime.datetime.now(datetime.timezone.utc).isoformat(),
              "command": "python benchmarks/fault_accuracy.py " + " ".join(sys.argv[1:]),
              "job": f"2 PS, 2 workers, MLP on digits, {STEPS} steps per worker; SSP staleness 3; SyncReplicas M=1 "
                     "(M=2 with a stopped worker); the undisturbed runs have the faulted runs' config",
              "evaluate": args.evaluate, "seeds": args.seeds, "first_seed": args.first_seed,
              "faults": {f: FAULTS[f][0] for f in fault_names}, "load_avg_at_start": os.getloadavg(),
              "log_dir": log_dir, "modes": {}, "runs": []}
    for mode in modes:
        for fault in fault_names:
            label = FAULTS[fault][1]
            base, faulted = [], []
            for r in range(args.rounds):
                for with_fault in ((False, True) if r % 2 == 0 else (True, False)):  # interleaved
                    seed = args.first_seed + r if args.seeds == "paired" else 0
                    try:
                        run = run_job(mode, fault, with_fault, log_dir, seed=seed, evaluate=args.evaluate,
                                      lr_decay=args.lr_decay)
                    except Exception as e:  # the job did not finish: reported, left out of the means
                        error = f"{type(e).__name__}: {e}"
                        run = {"accuracy": None, "seed": seed, "error": error if len(error) <= 3000 else
                               f"{error[:500]} [...] {error[-2500:]}"}
                    run.update(mode=mode, fault=with_fault, fault_name=fault, round=r)
                    result["runs"].append(run)
                    if run["accuracy"] is not None:
                        (faulted if with_fault else base).append(run["accuracy"])
                    what = label.replace("_", " ") if with_fault else "undisturbed"
                    print(f"[fault_accuracy] {mode} {fault} round {r} seed {seed} {what}: "
                          + (f"{run['accuracy']:.4f} ({run['wall_s']} s)" if run["accuracy"] is not None
                             else run["error"][:300]), file=sys.stderr, flush=True)
                    if base and faulted:  # so far (the file holds every finished run if the script is stopped)
                        these = [x for x in result["runs"] if x["mode"] == mode and x["fault_name"] == fault]
                        summary = summarise(base, faulted, label, these)
                        summary["failed_runs"] = sum(1 for x in these if x["accuracy"] is None)
                        result["modes"].setdefault(mode, {})[fault] = summary
                    _write(result, args.out)
    print(json.dumps(result, indent=2))
    return 0


def _write(result: dict, path: str | None) -> None:
    if path:
        with open(path + ".tmp", "w") as f:
            json.dump(result, f, indent=2)
        os.replace(path + ".tmp", path)


if __name__ == "__main__":
    sys.exit(main())
