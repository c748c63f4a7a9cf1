"""Recovery benchmark (issue #13): a parameter-server task SIGKILLed mid-training; time to train again, steps lost,
and what checkpoints cost.

Prints one JSON document. Measures, on this machine in one run, for a job of
2 PS tasks and 2 workers (the benchmark MLP 784-256-256-10 of
``benchmarks/_common.py`` on synthetic data, batch 64 per worker, the
``tfdist.testing.LocalCluster`` launcher loop with ``launch.restart_ps`` on):

1. ``recovery`` (per mode, async and BSP): checkpoints every
   ``--recovery-every-s`` seconds; once ps:1 has written its first
   checkpoint the driver waits ``--kill-after-s`` more, reads ps:1's
   ``Status`` (its progress), SIGKILLs it and lets the launcher restart it.
   Reported per worker: seconds from the kill to the first training step
   completed after it (``kill_to_step_s``), and from the moment the launcher
   started the new ps:1 process (``restart_to_step_s``: the issue's target,
   <= 10 s); the worker's own ``training goes on after X s`` (from
   ``WorkerSession.recover``); the restored checkpoint step and the steps
   lost: ps:1's progress before the kill minus the restored step (async:
   batches applied to ps:1 that are gone; BSP: the chief resets every task
   to its own state, so nothing of the job's state is lost, and the number
   is what the restored checkpoint alone would have lost).
2. ``overhead``: the same async job without a kill, with no checkpoints, with
   ``ps.checkpoint_every_s: 10`` and with a short interval
   (``--short-every-s``, to make the cost visible); rounds interleaved, the
   median of the mean step time over both workers (after a warm-up) per
   setting; the ratio to no checkpoints is the overhead (target <= 3 %).

Usage::

    python benchmarks/recovery.py [--quick] [--modes async,bsp] [--rounds N] [--out FILE]

The default run takes about 6 minutes on 2 cores, ``--quick`` about 3.
Every child process is killed when the script ends, also on errors.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import shlex
import statistics
import sys
import tempfile
import threading
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tests", "integration", "scripts"))

from benchmarks import _common  # noqa: E402
from durability_faults import wait_until  # noqa: E402  (the fault matrix's bounded wait)

WORKER = os.path.join(ROOT, "benchmarks", "recovery_workers", "worker.py")
#: Targets of issue #13 on this machine.
TARGET_RECOVERY_S = 10.0
TARGET_OVERHEAD = 0.03
_GOES_ON = re.compile(r"training goes on after ([0-9.]+) s")
_RESTORED = re.compile(r"restarted from the checkpoint of step (\d+)")
_RESET = re.compile(r"reset every parameter server to this worker's state at step (\d+)")


def _config(name: str, mode: str, ckpt_dir: str | None, every_s: float | None):
    from tfdist.config import JobConfig

    config = JobConfig(name=name)
    config.strategy.consistency = mode
    config.ps.checkpoint_dir = ckpt_dir
    config.ps.checkpoint_every_s = every_s
    config.ps.checkpoint_every_steps = None
    return config


def _status(cluster, ps: int) -> dict:
    with cluster.client() as client:
        meta, _ = client.call(ps, "Status", {"brief": True})
    return meta


def _results(out: str) -> list[dict]:
    results = []
    for w in (0, 1):
        with open(os.path.join(out, f"worker-{w}.json")) as f:
            results.append(json.load(f))
    return results


def run_recovery(mode: str, every_s: float, kill_after_s: float, after_kill_s: float, model: str, max_steps: int,
                 log_dir: str, timeout: float) -> dict:
    """One job: SIGKILL ps:1 ``kill_after_s`` after its first checkpoint; returns what the kill cost."""
    from tfdist.testing import LocalCluster

    out = tempfile.mkdtemp(prefix=f"recovery-{mode}-", dir=log_dir)
    config = _config(f"bench-recovery-{mode}", mode, os.path.join(out, "ckpt"), every_s)
    with LocalCluster(workers=2, ps=2, config=config, log_dir=out) as cluster:
        cluster.start(WORKER, ["--mode", mode, "--model", model, "--out", out, "--steps", str(max_steps)])
        wait_until(cluster, "ps:1's first checkpoint", lambda: os.path.exists(os.path.join(out, "started")) and
              (_status(cluster, 1).get("checkpoint") or {}).get("last_step") is not None, timeout)
        time.sleep(kill_after_s)  # where in the checkpoint interval the kill lands (not a synchronisation)
        before = _status(cluster, 1)
        kill_wall, kill_mono = time.time(), time.monotonic()
        cluster.kill("ps:1")
        # The launcher's loop (cluster.wait, in this thread) restarts ps:1 as soon as it sees it dead; the
        # run ends ``after_kill_s`` after the kill (its length, not a synchronisation: workers stop at a step end).
        stopper = threading.Timer(after_kill_s, lambda: open(os.path.join(out, "stop"), "w").close())
        stopper.start()
        try:
            cluster.wait(timeout)
        finally:
            stopper.cancel()
        restart_mono = cluster.process("ps:1").started_at
        logs = {w: cluster.log(f"worker:{w}") for w in (0, 1)}
        ps1_log = cluster.log("ps:1")
        restarts = dict(cluster.job.restarts)
    restart_wall = kill_wall + (restart_mono - kill_mono)
    results = _results(out)
    per_worker = []
    for w, r in enumerate(results):
        first = next((t for t in r["step_ends"] if t > kill_wall), None)
        goes_on = [float(x) for x in _GOES_ON.findall(logs[w])]
        per_worker.append({
            "kill_to_step_s": None if first is None else round(first - kill_wall, 3),
            "restart_to_step_s": None if first is None else round(first - restart_wall, 3),
            "recover_logged_s": goes_on,
            "recoveries": r["recoveries"],
            "steps": len(r["step_ends"]),
        })
    progress_key = "progress" if mode == "async" else "state_step"
    restored = [int(x) for x in _RESTORED.findall(ps1_log)]
    restored = restored[-1] if restored else None
    reset = [int(x) for x in _RESET.findall(logs[0])]
    return {
        "mode": mode,
        "checkpoint_every_s": every_s,
        "restarts": restarts,
        "kill_to_restart_s": round(restart_wall - kill_wall, 3),
        "workers": per_worker,
        "kill_to_step_s_max": max(p["kill_to_step_s"] for p in per_worker),
        "restart_to_step_s_max": max(p["restart_to_step_s"] for p in per_worker),
        "ps1_progress_before_kill": before.get(progress_key),
        "restored_step": restored,
        "chief_reset_to_step": reset[-1] if reset else None,
        "steps_lost": None if restored is None else before.get(progress_key) - restored,
        "steps_lost_unit": ("batches applied to ps:1" if mode == "async" else
                            "global steps (the chief then resets every task to its own state: nothing lost)"),
        "log_dir": out,
    }


def run_steady(every_s: float | None, model: str, steps: int, warmup: int, log_dir: str, timeout: float) -> dict:
    """The async job without a fault; ``every_s``: checkpoint interval (``None``: no checkpoints)."""
    from tfdist.testing import LocalCluster

    tag = "none" if every_s is None else f"{every_s:g}s"
    out = tempfile.mkdtemp(prefix=f"steady-{tag}-", dir=log_dir)
    config = _config(f"bench-steady-{tag}", "async", None if every_s is None else os.path.join(out, "ckpt"), every_s)
    with LocalCluster(workers=2, ps=2, config=config, log_dir=out) as cluster:
        cluster.start(WORKER, ["--mode", "async", "--model", model, "--out", out, "--steps", str(steps)])
        cluster.wait(timeout)
    results = _results(out)
    means = []
    for r in results:
        ends = r["step_ends"][warmup:]
        means.append((ends[-1] - ends[0]) / (len(ends) - 1))
    written = [(st.get("checkpoint") or {}).get("written", 0) for st in results[0]["ps_status"]]
    seconds = [(st.get("checkpoint") or {}).get("seconds", 0.0) for st in results[0]["ps_status"]]
    return {"mean_step_ms": round(1000 * statistics.mean(means), 3),
            "per_worker_mean_step_ms": [round(1000 * m, 3) for m in means],
            "checkpoints_written_per_ps": written, "checkpoint_write_s_per_ps": [round(x, 3) for x in seconds]}


def run_overhead(settings, rounds: int, model: str, steps: int, warmup: int, log_dir: str, timeout: float) -> dict:
    """Interleaved rounds of every setting; the median per setting; ratios to no checkpoints."""
    runs: dict[str, list[dict]] = {}
    for _ in range(rounds):
        for every_s in settings:
            key = "none" if every_s is None else f"every_{every_s:g}s"
            runs.setdefault(key, []).append(run_steady(every_s, model, steps, warmup, log_dir, timeout))
    rows = {}
    for key, rs in runs.items():
        rows[key] = {"median_mean_step_ms": round(statistics.median(r["mean_step_ms"] for r in rs), 3),
                     "runs": rs}
    base = rows["none"]["median_mean_step_ms"]
    for key, row in rows.items():
        row["ratio_to_none"] = round(row["median_mean_step_ms"] / base, 4)
    return rows


def targets(result: dict) -> dict:
    out = {}
    for r in result.get("recovery", []):
        out[f"recovery_{r['mode']}_restart_to_step_s<={TARGET_RECOVERY_S:g}"] = r["restart_to_step_s_max"] <= TARGET_RECOVERY_S
    over = result.get("overhead", {}).get("every_10s")
    if over:
        out[f"overhead_every_10s<={TARGET_OVERHEAD:.0%}"] = over["ratio_to_none"] - 1 <= TARGET_OVERHEAD
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="shorter runs, one round (about 3 minutes)")
    p.add_argument("--modes", default="async,bsp", help="modes of the recovery part (async, bsp)")
    p.add_argument("--only", choices=["recovery", "overhead"], help="run one part only")
    p.add_argument("--model", default="mlp", choices=sorted(_common.MODELS))
    p.add_argument("--recovery-every-s", type=float, default=10.0, help="checkpoint interval of the recovery runs")
    p.add_argument("--kill-after-s", type=float, help="SIGKILL ps:1 this long after its first checkpoint "
                   "(default: half the interval)")
    p.add_argument("--short-every-s", type=float, default=1.0, help="the short interval of the overhead part")
    p.add_argument("--rounds", type=int, help="interleaved rounds of the overhead part (default 3, quick 1)")
    p.add_argument("--timeout", type=float, default=300.0, help="bound on each run, seconds")
    p.add_argument("--out", help="also write the JSON here")
    args = p.parse_args(argv)

    steps, warmup = (1500, 100) if args.quick else (3000, 200)
    result: dict = {
        "benchmark": "recovery",
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "command": "python " + shlex.join(["benchmarks/recovery.py", *(argv if argv is not None else sys.argv[1:])]),
        "quick": args.quick,
        "machine": _common.machine(),
        "job": {"ps": 2, "workers": 2, "model": _common.MODELS[args.model][1], "batch_per_worker": _common.BATCH,
                "launcher": "tfdist.testing.LocalCluster (launch.restart_ps: true)"},
    }
    log_dir = tempfile.mkdtemp(prefix="recovery-bench-")
    result["log_dir"] = log_dir
    if args.only in (None, "recovery"):
        kill_after = args.kill_after_s if args.kill_after_s is not None else args.recovery_every_s / 2
        result["recovery"] = [
            run_recovery(mode, args.recovery_every_s, kill_after, 15.0 if args.quick else 20.0, args.model,
                         100000, log_dir, args.timeout)
            for mode in args.modes.split(",") if mode]
    if args.only in (None, "overhead"):
        result["overhead"] = run_overhead([None, 10.0, args.short_every_s], args.rounds or (1 if args.quick else 3),
                                          args.model, steps, warmup, log_dir, args.timeout)
        result["overhead_steps_per_worker"] = {"steps": steps, "warmup_left_out": warmup}
    result["targets"] = targets(result)
    text = json.dumps(result, indent=2)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
