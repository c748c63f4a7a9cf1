"""Consistency-mode benchmark: BSP, SyncReplicas, ASP, SSP and DTSSP with and without slow workers.

Prints one JSON document. Every run is a real job on this machine: one
parameter server and N worker processes (``tfdist.testing.LocalCluster``),
each training an MLP 64-32-10 (Adam 3e-3, batch 32 per worker) on its shard
of scikit-learn's digits with one of

* ``bsp``            — ``tfdist.BSPStrategy()``;
* ``sync_replicas``  — ``tfdist.SyncReplicasStrategy(replicas_to_aggregate=N-1)`` (3 of 4: one backup);
* ``asp``            — ``tfdist.ParameterServerStrategy(consistency="async")``;
* ``ssp``            — ``tfdist.SSPStrategy(staleness=3)``;
* ``dtssp``          — ``tfdist.DTSSPStrategy(min_staleness=3, max_staleness=10, window=10, delta=0.01)``.

**Emulated compute.** The model is tiny; a worker's "compute" is a fixed
per-step delay (``TFDIST_SLOWDOWN`` ``delay_s``, applied by the strategy at
the start of every step): ``base_delay_s × speed`` with speeds per scenario

* ``no_straggler`` — 1:1:…:1;
* ``straggler``    — one worker 3× slower (1:1:1:3);
* ``hetero``       — unequal workers 1:1:2:3 (repeated for 8 workers: 1:1:2:3:1:1:2:3).

So a few worker processes on 2 cores measure the consistency protocol, not
CPU contention.

**What is measured.** Workers first take one step (tracing), then wait at a
barrier; the clock starts when the driver releases them. The driver polls
the PS every ``--poll-s`` seconds for the global model (the PS values: on the
gradient path, BSP/SyncReplicas, the state snapshot of the last completed
step) and evaluates it on the digits test set (360 images) in numpy.

* *global step*: BSP/SyncReplicas — one aggregate applied (TF1's
  ``global_step``); ASP/SSP/DTSSP — N applied pushes (the same number of
  worker mini-batches as one BSP step; TF1 async would count every push);
* ``time_to_steps_s``: seconds until ``--steps`` global steps (interpolated
  between polls);
* ``time_to_accuracy_s``: seconds until the first snapshot with test accuracy
  >= ``--target-accuracy``; the run goes on past ``--steps`` until then (at
  most ``--max-run-s``);
* ``final_accuracy``: mean test accuracy of the snapshots taken in the last
  10% of the ``--steps`` global steps (``accuracy_at_steps``: the first
  snapshot at or past them).

Usage::

    python benchmarks/consistency.py [--quick] [--modes bsp,sync_replicas,asp,ssp,dtssp]
        [--scenarios no_straggler,straggler,hetero] [--workers 4] [--table-workers 4,8]
        [--steps N] [--target-accuracy A] [--base-delay-s 0.05] [--out FILE]
        [--write-docs] [--wait-quiet SECONDS]
    python benchmarks/consistency.py --from-json FILE --write-docs   # re-render the docs section

The default run (18 jobs) takes about 15 minutes on 2 cores; ``--quick`` (BSP and
SyncReplicas with and without the straggler, 60 steps) about 2.
Every child process is killed when a run ends, also on errors
(``LocalCluster`` is a context manager).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
import tempfile
import time
import traceback

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import numpy as np  # noqa: E402

from benchmarks import _common  # noqa: E402

WORKER_SCRIPT = os.path.join(ROOT, "benchmarks", "consistency_workers", "train.py")
DOCS = os.path.join(ROOT, "docs", "benchmarks.md")
SECTION = "consistency"  # the marked section of docs/benchmarks.md this script rewrites

MODES = ("bsp", "sync_replicas", "asp", "ssp", "dtssp")
SCENARIOS = ("no_straggler", "straggler", "hetero")
MODE_LABELS = {
    "bsp": "BSP",
    "sync_replicas": "SyncReplicas (N−1 of N)",
    "asp": "ASP",
    "ssp": "SSP(3)",
    "dtssp": "DTSSP(3..10)",
}
GRADIENT_PATH = ("bsp", "sync_replicas")
HETERO_PATTERN = (1, 1, 2, 3)


# ---------------------------------------------------------------- scenarios
def speeds_for(scenario: str, workers: int) -> list[float]:
    """Per-worker step-time multipliers of a scenario (the slow ones last)."""
    if scenario == "no_straggler":
        return [1.0] * workers
    if scenario == "straggler":
        return [1.0] * (workers - 1) + [3.0]
    if scenario == "hetero":
        return [float(HETERO_PATTERN[i % len(HETERO_PATTERN)]) for i in range(workers)]
    raise ValueError(f"Unknown scenario {scenario!r}. Use one of {list(SCENARIOS)}.")


def slowdown_envs(speeds: list[float], base_delay_s: float) -> dict[str, dict[str, str]]:
    from tfdist.testing import slowdown_env

    return {f"worker:{i}": slowdown_env({f"worker:{i}": {"factor": 1.0, "delay_s": round(base_delay_s * s, 6)}})
            for i, s in enumerate(speeds)}


# --------------------------------------------------------------- evaluation
def load_test_set():
    from tfdist.datasets import load_digits

    data = load_digits()
    return data.x_test.reshape(-1, 64).astype(np.float32), data.y_test


def evaluate(weights: list[np.ndarray], x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """(accuracy, cross-entropy) of the MLP Dense(relu)-Dense(softmax) given its kernels and biases."""
    w1, b1, w2, b2 = weights
    h = np.maximum(x @ w1 + b1, 0.0)
    z = h @ w2 + b2
    z = z - z.max(axis=1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
    acc = float((z.argmax(axis=1) == y).mean())
    loss = float(-logp[np.arange(len(y)), y].mean())
    return acc, loss


def time_to_steps(trace: list[list[float]], steps: float) -> float | None:
    """Seconds until ``steps`` global steps, interpolated between polls ``[t, steps, acc, loss]``."""
    prev = None
    for row in trace:
        if row[1] >= steps:
            if prev is None or row[1] == prev[1]:
                return row[0]
            return prev[0] + (steps - prev[1]) / (row[1] - prev[1]) * (row[0] - prev[0])
        prev = row
    return None


def time_to_accuracy(trace: list[list[float]], target: float) -> tuple[float | None, float | None]:
    """(seconds, global steps) at the first snapshot with accuracy >= ``target``."""
    for row in trace:
        if row[2] >= target:
            return row[0], row[1]
    return None, None


def final_accuracy(trace: list[list[float]], steps: float) -> tuple[float | None, float | None]:
    """(mean accuracy over snapshots in the last 10% of ``steps``, accuracy of the first at/after ``steps``)."""
    window = [r[2] for r in trace if 0.9 * steps <= r[1] <= steps]
    at = next((r[2] for r in trace if r[1] >= steps), None)
    if not window and at is not None:
        window = [at]
    return (float(np.mean(window)) if window else None), at


# -------------------------------------------------------------------- a run
def _wait_load(max_wait_s: float, quiet_load: float) -> float:
    """Waits (at most ``max_wait_s``) for the 1-minute load average to drop below ``quiet_load``."""
    deadline = time.monotonic() + max_wait_s
    while os.getloadavg()[0] >= quiet_load and time.monotonic() < deadline:
        time.sleep(5)
    return os.getloadavg()[0]


def run_one(mode: str, speeds: list[float], args, test_set) -> dict:
    """One job: N workers (+1 PS) under ``mode``; returns its measurements."""
    from tfdist.config import JobConfig
    from tfdist.testing import LocalCluster

    workers = len(speeds)
    load_before = _wait_load(args.wait_quiet, args.quiet_load) if args.wait_quiet else os.getloadavg()[0]
    config = JobConfig.from_dict({"name": f"consistency-{mode}",
                                  "ps": {"heartbeat_interval_s": 0.5, "heartbeat_timeout_s": 10,
                                         "rpc_timeout_s": 60}})
    run_dir = tempfile.mkdtemp(prefix=f"tfdist-consistency-{mode}-")
    worker_args = ["--run-dir", run_dir, "--mode", mode, "--max-seconds", str(args.max_run_s + 120)]
    if mode == "sync_replicas":
        worker_args += ["--m", str(args.replicas_to_aggregate or max(workers - 1, 1))]
    x_test, y_test = test_set
    started = time.monotonic()
    with LocalCluster(workers=workers, ps=1, config=config, log_dir=os.path.join(run_dir, "logs"),
                      env=slowdown_envs(speeds, args.base_delay_s)) as cluster:
        cluster.start(WORKER_SCRIPT, worker_args)
        tasks = [f"worker:{i}" for i in range(workers)]

        def check_alive(when):
            for t in tasks + ["ps:0"]:
                code = cluster.process(t).poll()
                if code is not None:
                    raise RuntimeError(f"{t} exited with {code} {when}:\n{cluster.log(t)[-3000:]}")

        def files(prefix):
            return [os.path.join(run_dir, f"{prefix}-{i}") for i in range(workers)]

        deadline = time.monotonic() + args.startup_timeout_s
        while not all(os.path.exists(f) for f in files("started")):
            check_alive("before training")
            if time.monotonic() > deadline:
                raise TimeoutError(f"workers not started within {args.startup_timeout_s} s (--startup-timeout-s)")
            time.sleep(0.05)
        startup_s = time.monotonic() - started
        load_at_go = os.getloadavg()[0]
        with open(os.path.join(run_dir, "go.tmp"), "w") as f:
            f.write(repr(time.time()))
        os.replace(os.path.join(run_dir, "go.tmp"), os.path.join(run_dir, "go"))
        go = time.time()
        with cluster.client(rpc_timeout_s=30) as client:
            keys = None
            polls: list[list[float]] = []  # [time.time(), global steps, model steps, accuracy, loss]
            t0 = None  # when every worker has finished its first (tracing) step
            reached_acc = False
            deadline = time.monotonic() + args.startup_timeout_s
            while True:
                time.sleep(args.poll_s)
                check_alive("during training")
                if keys is None:  # the chief initialises the PS during its first step
                    status = client.call(0, "Status", {})[0]
                    if not status.get("initialized"):
                        continue
                    keys = [sp["key"] for sp in status["specs"] if sp["trainable"]]
                    if len(keys) != 4:
                        raise RuntimeError(f"expected the 4 trainable variables of the MLP on the PS, got {keys}")
                meta, tensors = client.call(0, "Pull", {"worker": -1, "clock": 0, "keys": keys})
                now = time.time()
                if mode in GRADIENT_PATH:
                    steps, model_steps = meta["global_step"], meta["state_step"]
                else:
                    steps = model_steps = (meta["version"] - 1) / workers  # pushes / N
                acc, loss = evaluate([tensors[k] for k in keys], x_test, y_test)
                polls.append([now, steps, model_steps, acc, loss])
                if t0 is None:
                    if all(os.path.exists(f) for f in files("ready")):
                        t0 = max(float(open(f).read()) for f in files("ready"))
                    elif time.monotonic() > deadline:
                        raise TimeoutError(f"not every worker finished its first step within "
                                           f"{args.startup_timeout_s} s (--startup-timeout-s)")
                    continue
                base = [p for p in polls if p[0] <= t0] or polls[:1]
                reached_acc = reached_acc or acc >= args.target_accuracy
                if steps - base[-1][1] >= args.steps and reached_acc:
                    break
                if now - t0 > args.max_run_s:
                    break
            ps_status = client.call(0, "Status", {})[0]
            with open(os.path.join(run_dir, "stop"), "w") as f:
                f.write("stop")
        load_at_end = os.getloadavg()[0]
        cluster.wait(args.startup_timeout_s)
    base = [p for p in polls if p[0] <= t0] or polls[:1]
    steps0, model_steps0 = base[-1][1], base[-1][2]
    trace = [[round(p[0] - t0, 4), p[2] - model_steps0, p[3], p[4]] for p in polls if p[0] > t0]
    steps_trace = [[round(p[0] - t0, 4), p[1] - steps0] for p in polls if p[0] > t0]
    results = []
    for i in range(workers):
        with open(os.path.join(run_dir, f"worker-{i}.json")) as f:
            results.append(json.load(f))
    return summarize(mode, speeds, args, trace, steps_trace, ps_status, results, t0,
                     {"startup_s": round(startup_s, 2), "first_step_s": round(t0 - go, 2),
                      "load_1min_before": round(load_before, 2),
                      "load_1min_at_go": round(load_at_go, 2), "load_1min_at_end": round(load_at_end, 2),
                      "steps_at_origin": steps0})


def summarize(mode, speeds, args, trace, steps_trace, ps_status, results, t0, extra) -> dict:
    t_steps = time_to_steps(steps_trace, args.steps)
    t_acc, steps_at_acc = time_to_accuracy(trace, args.target_accuracy)
    final, at_steps = final_accuracy(trace, args.steps)
    per_worker = []
    for r in results:
        st = r["sync_stats"]
        timed = [row for row in r["steps"] if row[0] > t0]
        per_worker.append({
            "worker": r["worker_id"],
            "steps": len(timed),
            "steps_per_s": round(len(timed) / max(timed[-1][0] - t0, 1e-9), 2) if timed else 0.0,
            "dropped": st.get("dropped", 0),
            "waits": st.get("waits", 0),
            "wait_seconds": round(st.get("wait_seconds", 0.0), 2),
            "refreshes_or_resyncs": st.get("refreshes", st.get("resyncs", 0)),
        })
    policy = ps_status.get("policy") or {}
    out = {
        "mode": mode,
        "workers": len(speeds),
        "speeds": speeds,
        "delays_s": [round(args.base_delay_s * s, 4) for s in speeds],
        "time_to_steps_s": None if t_steps is None else round(t_steps, 3),
        "time_to_accuracy_s": None if t_acc is None else round(t_acc, 3),
        "steps_at_accuracy": steps_at_acc,
        "final_accuracy": None if final is None else round(final, 4),
        "accuracy_at_steps": at_steps,
        "best_accuracy": max((r[2] for r in trace), default=None),
        "run_s": trace[-1][0] if trace else None,
        "global_steps_run": steps_trace[-1][1] if steps_trace else 0,
        "per_worker": per_worker,
        "ps_stats": ps_status.get("stats", {}),
        "policy": {k: v for k, v in policy.items() if k != "changes"},
        **extra,
        # [t, global steps, accuracy, test loss], thinned to <= 200 points
        "curve": _thin(trace, 200),
    }
    if mode == "dtssp":
        changes = policy.get("changes", [])
        out["staleness_changes"] = [{k: c[k] for k in ("window", "lpr", "old_staleness", "new_staleness")}
                                    for c in changes]
    return out


def _thin(rows, n):
    if len(rows) <= n:
        return rows
    idx = np.linspace(0, len(rows) - 1, n).round().astype(int)
    return [rows[i] for i in idx]


# ------------------------------------------------------------------ report
def _ratio(a, b):
    return None if a is None or b is None or b == 0 else round(a / b, 3)


def build_report(runs: dict, args) -> dict:
    """Ratios and targets from ``runs[scenario@workers][mode]``."""
    n = args.workers
    ratios, targets = {}, {}

    def get(scn, workers, mode, key):
        return (runs.get(f"{scn}@{workers}", {}).get(mode) or {}).get(key)

    for mode in MODES:
        r = _ratio(get("straggler", n, mode, "time_to_steps_s"), get("no_straggler", n, mode, "time_to_steps_s"))
        if r is not None:
            ratios[f"{mode}_straggler_vs_none_time_to_steps"] = r
        r = _ratio(get("straggler", n, mode, "time_to_accuracy_s"), get("no_straggler", n, mode, "time_to_accuracy_s"))
        if r is not None:
            ratios[f"{mode}_straggler_vs_none_time_to_accuracy"] = r
    r = ratios.get("sync_replicas_straggler_vs_none_time_to_steps")
    if r is not None:
        targets["sync_replicas_straggler_le_1.15x_no_straggler"] = {"value": r, "met": r <= 1.15}
    table = {}
    for workers in args.table_workers:
        col = {}
        for key in ("time_to_steps_s", "time_to_accuracy_s"):
            d, b, s = (get("hetero", workers, m, key) for m in ("dtssp", "bsp", "ssp"))
            col[f"dtssp_vs_bsp_{key}"] = _ratio(d, b)
            col[f"dtssp_vs_ssp_{key}"] = _ratio(d, s)
        for m in ("bsp", "ssp", "dtssp"):
            col[f"{m}_final_accuracy"] = get("hetero", workers, m, "final_accuracy")
        if any(v is not None for v in col.values()):
            table[str(workers)] = col
    col = table.get(str(n))
    if col:
        v = col.get("dtssp_vs_bsp_time_to_accuracy_s")
        if v is not None:
            targets["hetero_dtssp_time_to_accuracy_le_0.8x_bsp"] = {"value": v, "met": v <= 0.8}
        v = col.get("dtssp_vs_ssp_time_to_accuracy_s")
        if v is not None:
            targets["hetero_dtssp_time_to_accuracy_le_0.9x_ssp"] = {"value": v, "met": v <= 0.9}
        a, b = col.get("dtssp_final_accuracy"), col.get("bsp_final_accuracy")
        if a is not None and b is not None:  # judged one-sided: DTSSP may be more accurate than BSP
            diff = round(100 * (a - b), 2)
            targets["hetero_dtssp_accuracy_at_most_0.5_point_below_bsp"] = {"value": diff, "met": diff >= -0.5}
    return {"ratios": ratios, "paper_table": table, "targets": targets}


def machine() -> dict:
    info = {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    info["cpu"] = line.split(":", 1)[1].strip()
                    break
        with open("/proc/meminfo") as f:
            info["mem_gib"] = round(int(f.readline().split()[1]) / 2**20, 1)
    except OSError:
        pass
    return info


def versions() -> dict:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for pkg in ("tensorflow", "keras", "grpcio", "numpy"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            out[pkg] = None
    return out


# -------------------------------------------------------------------- docs
def _fmt_s(v):
    return "—" if v is None else f"{v:.1f} s"


def _fmt_acc(v):
    return "—" if v is None else f"{100 * v:.1f} %"


def _fmt_x(v):
    return "—" if v is None else f"{v:.2f}×"


def _fmt_red(v):
    return "—" if v is None else f"{100 * (v - 1):+.1f} %"


def render_section(result: dict) -> str:
    """The Markdown of the consistency section, from a result of this script."""
    a = result["settings"]
    runs = result["runs"]
    n = a["workers"]
    lines = ["## Consistency modes and stragglers (`benchmarks/consistency.py`)", ""]
    lines += [
        "Command (JSON on stdout; " + f"{result['total_s'] / 60:.0f} minutes):", "", "```bash",
        result["command"], "```", "",
        f"Recorded {result['date']} on {result['machine'].get('cpus')} CPU cores "
        f"({result['machine'].get('cpu', '?')}, {result['machine'].get('mem_gib', '?')} GiB), "
        f"TensorFlow {result['versions'].get('tensorflow')}, Keras {result['versions'].get('keras')}. "
        f"Load average (1 min) at the start of the runs {result['load']['min_1min']:.1f}–{result['load']['max_1min']:.1f} "
        f"(at start {result['load']['at_start'][0]:.1f}, at end {result['load']['at_end'][0]:.1f}: "
        "other engineers' test suites share the machine).", "",
        f"Every run: 1 PS + N worker processes, MLP 64-32-10 (Adam 3e-3, batch 32 per worker) on the "
        f"digits training shards; accuracy of the PS's global model on the 360 test images, polled every "
        f"{a['poll_s']} s. A worker's compute is a fixed per-step delay of {a['base_delay_s'] * 1000:.0f} ms × its "
        "speed (the MLP's own step costs a few ms), so the processes on 2 cores measure the protocol. "
        f"A *global step* is one applied aggregate (BSP, SyncReplicas) or N applied pushes "
        f"(ASP, SSP, DTSSP: the same number of mini-batches as one BSP step). All workers start together "
        f"(a barrier after start-up); times start when every worker has finished its first step, which "
        f"traces the training function. *Final accuracy*: mean over the snapshots of the last 10 % of "
        f"{a['steps']} global steps. Target accuracy {100 * a['target_accuracy']:.0f} %.", "",
    ]

    def row_cells(scn, workers, mode):
        r = runs.get(f"{scn}@{workers}", {}).get(mode)
        if not r:
            return None
        if "error" in r:
            return ["failed: " + r["error"][:80].replace("|", r"\|")] + [""] * 2
        return [_fmt_s(r["time_to_steps_s"]), _fmt_s(r["time_to_accuracy_s"]), _fmt_acc(r["final_accuracy"])]

    if f"straggler@{n}" in runs or f"no_straggler@{n}" in runs:
        lines += [
            f"**{n} workers, one 3× slower** (speeds {':'.join('1' for _ in range(n - 1))}:3) vs **no straggler**: "
            f"time to {a['steps']} global steps, time to {100 * a['target_accuracy']:.0f} % test accuracy, final accuracy.",
            "",
            "| mode | steps: none | steps: straggler | ratio | accuracy: none | accuracy: straggler | ratio "
            "| final acc.: none | final acc.: straggler | slow worker's gradients dropped / steps |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        for mode in a["modes"]:
            none, slow = row_cells("no_straggler", n, mode), row_cells("straggler", n, mode)
            if none is None and slow is None:
                continue
            none = none or ["—"] * 3
            slow = slow or ["—"] * 3
            ratios = result["report"]["ratios"]
            rs = ratios.get(f"{mode}_straggler_vs_none_time_to_steps")
            ra = ratios.get(f"{mode}_straggler_vs_none_time_to_accuracy")
            r = runs.get(f"straggler@{n}", {}).get(mode) or {}
            pw = (r.get("per_worker") or [{}])[-1]
            drop = f"{pw.get('dropped', 0)} / {pw.get('steps', 0)}" if mode == "sync_replicas" and pw else "—"
            lines.append(f"| {MODE_LABELS[mode]} | {none[0]} | {slow[0]} | {_fmt_x(rs)} | {none[1]} | {slow[1]} | "
                         f"{_fmt_x(ra)} | {none[2]} | {slow[2]} | {drop} |")
        lines.append("")

    for workers in a["table_workers"]:
        key = f"hetero@{workers}"
        if key not in runs:
            continue
        sp = ":".join(f"{s:g}" for s in speeds_for("hetero", workers))
        lines += [
            f"**{workers} unequal workers** (speeds {sp}):", "",
            "| mode | time to steps | time to accuracy | global steps at accuracy | final accuracy | workers 0+1 in PS calls (s) |",
            "|---|---|---|---|---|---|",
        ]
        for mode in a["modes"]:
            r = runs[key].get(mode)
            if not r:
                continue
            if "error" in r:
                lines.append(f"| {MODE_LABELS[mode]} | failed: {r['error'][:80]} | | | | |")
                continue
            waits = sum(w["wait_seconds"] for w in r["per_worker"] if w["worker"] < 2)
            sat = r.get("steps_at_accuracy")
            lines.append(f"| {MODE_LABELS[mode]} | {_fmt_s(r['time_to_steps_s'])} | {_fmt_s(r['time_to_accuracy_s'])} | "
                         f"{'—' if sat is None else f'{sat:.0f}'} | {_fmt_acc(r['final_accuracy'])} | {waits:.1f} |")
        lines.append("")

    table = result["report"]["paper_table"]
    if table:
        cols = sorted(table, key=int)
        lines += [
            "**The DTSSP paper's Tables 1 and 2, same shape** (paper: 4 nodes with 4/8/16 worker threads, CIFAR-10, "
            "BSP/SSP/DTSSP time reduction −3.65/−9.31/−18 % vs BSP, −1.49/−8.52/−14.72 % vs SSP, accuracy ≈ 81 % "
            "for all). Here: unequal workers as above; time change of DTSSP relative to BSP and SSP(3) (negative = "
            "faster), and final accuracy.", "",
            "| Table 1: time | " + " | ".join(f"{c} workers" for c in cols) + " |",
            "|---|" + "---|" * len(cols),
        ]
        for label, key in (("DTSSP / BSP, to global steps", "dtssp_vs_bsp_time_to_steps_s"),
                           ("DTSSP / SSP, to global steps", "dtssp_vs_ssp_time_to_steps_s"),
                           ("DTSSP / BSP, to accuracy", "dtssp_vs_bsp_time_to_accuracy_s"),
                           ("DTSSP / SSP, to accuracy", "dtssp_vs_ssp_time_to_accuracy_s")):
            lines.append(f"| {label} | " + " | ".join(_fmt_red(table[c].get(key)) for c in cols) + " |")
        lines += ["", "| Table 2: final accuracy | " + " | ".join(f"{c} workers" for c in cols) + " |",
                  "|---|" + "---|" * len(cols)]
        for m in ("bsp", "ssp", "dtssp"):
            lines.append(f"| {MODE_LABELS[m]} | " + " | ".join(_fmt_acc(table[c].get(f"{m}_final_accuracy")) for c in cols) + " |")
        lines.append("")

    targets = result["report"]["targets"]
    if targets:
        lines += ["**Targets** (issue #3 item 8):", ""]
        names = {
            "sync_replicas_straggler_le_1.15x_no_straggler": "SyncReplicas(N−1 of N) with the straggler ≤ 1.15× its no-straggler time (to global steps)",
            "hetero_dtssp_time_to_accuracy_le_0.8x_bsp": "DTSSP time to accuracy ≤ 0.8× BSP, unequal workers",
            "hetero_dtssp_time_to_accuracy_le_0.9x_ssp": "DTSSP time to accuracy ≤ 0.9× SSP(3), unequal workers",
            "hetero_dtssp_accuracy_at_most_0.5_point_below_bsp": "DTSSP final accuracy at most 0.5 point below BSP's, unequal workers (points, DTSSP − BSP)",
        }
        for k, v in targets.items():
            val = f"{v['value']:+.2f}" if "point" in k else f"{v['value']:.2f}×"
            lines.append(f"* {names.get(k, k)}: **{val}** — {'met' if v['met'] else 'missed'}")
        lines.append("")
    if result.get("notes"):
        lines += [result["notes"], ""]
    return "\n".join(lines)


def write_docs(result: dict, path: str = DOCS) -> None:
    """Rewrites only the text between the consistency markers of ``path``."""
    _common.replace_section(path, SECTION, render_section(result))


# -------------------------------------------------------------------- main
def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="short smoke run: BSP and SyncReplicas with and without "
                   "the straggler, 60 steps (about 2 minutes)")
    p.add_argument("--modes", default=None, help=f"default {','.join(MODES)} (--quick: bsp,sync_replicas)")
    p.add_argument("--scenarios", default=None, help=f"default {','.join(SCENARIOS)} (--quick: no_straggler,straggler)")
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--table-workers", default=None, help="worker counts of the hetero (paper-table) runs; "
                   "default 4,8 (--quick: --workers)")
    p.add_argument("--table-modes", default="bsp,ssp,dtssp", help="modes of the hetero runs with more workers "
                   "than --workers")
    p.add_argument("--steps", type=int, default=None, help="global steps to time (default 150; --quick 60)")
    p.add_argument("--target-accuracy", type=float, default=None, help="default 0.93 (--quick 0.9)")
    p.add_argument("--base-delay-s", type=float, default=0.05)
    p.add_argument("--replicas-to-aggregate", type=int, default=None, help="SyncReplicas M (default N-1)")
    p.add_argument("--poll-s", type=float, default=0.1)
    p.add_argument("--max-run-s", type=float, default=None, help="cap of one run's training (default 90; --quick 40)")
    p.add_argument("--startup-timeout-s", type=float, default=240.0)
    p.add_argument("--wait-quiet", type=float, default=0.0, help="before each run wait up to this many seconds "
                   "for the 1-minute load average to fall below --quiet-load")
    p.add_argument("--quiet-load", type=float, default=2.0)
    p.add_argument("--out")
    p.add_argument("--write-docs", action="store_true", help="rewrite the consistency section of docs/benchmarks.md")
    p.add_argument("--from-json", help="with --write-docs: render this JSON file instead of running")
    p.add_argument("--notes", default="", help="a paragraph added to the docs section")
    args = p.parse_args(argv)
    if args.modes is None:
        args.modes = "bsp,sync_replicas" if args.quick else ",".join(MODES)
    if args.scenarios is None:
        args.scenarios = "no_straggler,straggler" if args.quick else ",".join(SCENARIOS)
    args.modes = [m for m in args.modes.split(",") if m]
    args.scenarios = [s for s in args.scenarios.split(",") if s]
    for m in args.modes:
        if m not in MODES:
            p.error(f"unknown mode {m!r}; use some of {','.join(MODES)}")
    for s in args.scenarios:
        if s not in SCENARIOS:
            p.error(f"unknown scenario {s!r}; use some of {','.join(SCENARIOS)}")
    if args.workers < 2:
        p.error("--workers must be >= 2")
    if args.table_workers is None:
        args.table_workers = str(args.workers) if args.quick else "4,8"
    args.table_workers = [int(w) for w in args.table_workers.split(",") if w]
    args.table_modes = [m for m in args.table_modes.split(",") if m in args.modes]
    args.steps = args.steps or (60 if args.quick else 150)
    args.target_accuracy = args.target_accuracy or (0.9 if args.quick else 0.93)
    args.max_run_s = args.max_run_s or (40.0 if args.quick else 90.0)
    return args


def plan(args) -> list[tuple[str, int, str]]:
    """(scenario, workers, mode) of every run, in order."""
    jobs = []
    for scn in args.scenarios:
        if scn == "hetero":
            continue
        for mode in args.modes:
            jobs.append((scn, args.workers, mode))
    if "hetero" in args.scenarios:
        for workers in sorted(set(args.table_workers) | {args.workers}):
            modes = args.modes if workers == args.workers else args.table_modes
            for mode in modes:
                jobs.append(("hetero", workers, mode))
    return jobs


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.from_json:
        with open(args.from_json) as f:
            result = json.load(f)
        saved = argparse.Namespace(**{**vars(args), **result["settings"]})
        result["report"] = build_report(result["runs"], saved)  # judged by this version of the script
        if args.notes:
            result["notes"] = args.notes
        if args.write_docs:
            write_docs(result)
        print(json.dumps(result, indent=1))
        return 0
    command = "python benchmarks/consistency.py " + " ".join(argv if argv is not None else sys.argv[1:])
    started = time.monotonic()
    load_start = list(os.getloadavg())
    test_set = load_test_set()
    runs: dict[str, dict[str, dict]] = {}
    loads = []
    for scn, workers, mode in plan(args):
        speeds = speeds_for(scn, workers)
        print(f"[consistency] {scn} x{workers} {mode} (speeds {speeds}) ...", file=sys.stderr, flush=True)
        try:
            r = run_one(mode, speeds, args, test_set)
            loads.append(r["load_1min_at_go"])
            print(f"[consistency]   steps {r['time_to_steps_s']} s, accuracy {r['time_to_accuracy_s']} s, "
                  f"final {r['final_accuracy']}, load {r['load_1min_at_go']}", file=sys.stderr, flush=True)
        except Exception as e:  # one failed run must not lose the others
            traceback.print_exc()
            r = {"mode": mode, "workers": workers, "speeds": speeds, "error": f"{type(e).__name__}: {e}"[:2000]}
        runs.setdefault(f"{scn}@{workers}", {})[mode] = r
    result = {
        "benchmark": "consistency",
        "quick": args.quick,
        "command": command,
        "date": datetime.datetime.now().strftime("%Y-%m-%d %H:%M"),
        "machine": machine(),
        "versions": versions(),
        "settings": {k: getattr(args, k) for k in ("modes", "scenarios", "workers", "table_workers", "table_modes",
                                                    "steps", "target_accuracy", "base_delay_s", "poll_s",
                                                    "max_run_s", "replicas_to_aggregate")},
        "load": {"at_start": load_start, "at_end": list(os.getloadavg()),
                 "min_1min": min(loads, default=load_start[0]), "max_1min": max(loads, default=load_start[0])},
        "runs": runs,
        "total_s": round(time.monotonic() - started, 1),
    }
    result["report"] = build_report(runs, args)
    if args.notes:
        result["notes"] = args.notes
    text = json.dumps(result, indent=1)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    if args.write_docs:
        write_docs(result)
    print(text)
    failed = [f"{k}/{m}" for k, v in runs.items() for m, r in v.items() if "error" in r]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
