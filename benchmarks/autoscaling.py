"""Autoscaling benchmark: the elastic engine against static allocations of 1, 2, 4 and 8 workers.

Prints one JSON document. Every row is the same real job on this machine:
one parameter server and worker processes running ``examples/train_elastic.py``
(a Keras MLP on scikit-learn's digits, batch 32, async PS) until the PS has
applied ``--total-batches`` updates (``elastic.total_batches``). Each worker
"computes" for ``--step-delay`` seconds per batch (emulated compute, as the
papers emulate bigger models), and the PS applies at most
``--max-updates-per-s`` updates per second (``ps.max_updates_per_s``): a
real throughput knee at about ``max_updates_per_s / per-worker rate``
workers (22 / ≈ 9 with the defaults: 3 is the smallest size that reaches
the cap).

Rows:

* ``static-k`` for k in ``--static`` (default 1,2,4,8): ``elastic`` with
  ``autoscale: false``, ``initial_workers = min_workers = max_workers = k``,
  no straggler replacement: the launcher's job at a fixed size, measured by
  the same engine;
* ``engine``: the autoscaling engine (Or et al., MLSys 2020), start 1 worker,
  ``max_workers`` = ``--max-workers`` (8), step 1, a measurement window
  every ``--interval-batches`` global batches, ``--min-samples`` windows per
  size, efficiency threshold 0.1, no utility, no straggler replacement
  (``--replace-stragglers`` turns it on).

Per row: completion time (from the engine's start to the last worker's exit),
worker-seconds (``EngineResult.worker_seconds``: every worker process from its
start to its exit, the GPU-time analogue), the same two up to the moment the
PS reported the job's batches applied (``trained_s``,
``worker_seconds_trained``: without the final evaluation and exit, so without
a worker's hang at exit), mean measured throughput per size, worker 0's final
test accuracy, the workers' exit codes (``-15``: stopped after
``elastic.drain_timeout_s``), and the 1/5/15-minute load averages at the
start and end of the row. For the engine: when it settled (seconds, and
measurement windows = decision intervals), at which size, and the scaling
steps it took. Ratios are against the best static size (shortest
completion) and against each static size's worker-seconds.

Targets (issue 6, the shape of Or et al.'s CIFAR-10 result):

* completion time within 10 % of the best static size;
* worker-seconds below every over-provisioned static size — sizes above the
  knee ``max_updates_per_s / R_1`` (``R_1``: the measured throughput of
  static-1, else of the engine's windows at 1 worker);
* settling within a few decision intervals: the engine settles using no more
  measurement windows than it needs to measure every size from its start up
  to one step past the size it settles at (``min_samples`` windows each; a
  size measured again would exceed it). Windows thrown away (a worker warming
  up or leaving) do not count; their cost shows in the seconds to settle.

Usage::

    python benchmarks/autoscaling.py [--quick] [--static 1,2,4,8] [--total-batches N]
        [--step-delay S] [--max-updates-per-s R] [--interval-batches N] [--out FILE] [--write-docs]
    python benchmarks/autoscaling.py --from-json FILE --write-docs   # re-render the docs section

The default run takes about 18 minutes on 2 cores (static-1 alone runs the
whole job on one worker, 6 minutes); ``--quick`` (static 2 and 4, engine up to 3,
1000 batches) about 4. Rows run one after another; ``LocalJob.stop`` ends
every process of a row, also on errors.
"""

from __future__ import annotations

import argparse
import datetime
import glob
import json
import os
import sys
import tempfile
import time
import traceback

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from benchmarks import _common  # noqa: E402

SCRIPT = os.path.join(ROOT, "examples", "train_elastic.py")
DOCS = os.path.join(ROOT, "docs", "benchmarks.md")
SECTION = "autoscaling"  # the marked section of docs/benchmarks.md this script rewrites

#: Or et al., MLSys 2020, §6 (CIFAR-10, ResNet-56, 4 to 24 GPUs, step 4): the engine converged to the best
#: size (4 GPUs), completed 8.23-16.0 % faster and used 58.6-85.1 % less GPU time than the over-provisioned
#: static allocations, and corrected the misallocation in 61.0-78.4 s, mostly bootstrap.
PAPER = ("Or et al. (CIFAR-10, ResNet-56, static 4–24 GPUs): the engine converged to the best size (4 GPUs), "
         "finished 8.2–16.0 % sooner and used 58.6–85.1 % less GPU time than the over-provisioned static "
         "allocations, and corrected the misallocation in 61–78 s, mostly bootstrap.")


# ---------------------------------------------------------------- one row
def job_config(label: str, workers: int, elastic: dict, args) -> dict:
    """The job config (a dict for ``JobConfig.from_dict``) of one row."""
    return {
        "name": f"autoscaling-{label}",
        "cluster": {"ps": 1, "worker": workers},
        # one step per update: the knee is in updates/s (the default, exchange_every: auto, would send several of
        # the emulated steps, which sleep rather than compute, in one update)
        "strategy": {"consistency": "async", "exchange_every": 1},
        "ps": {"max_updates_per_s": args.max_updates_per_s, "heartbeat_interval_s": 1, "heartbeat_timeout_s": 10},
        "elastic": {"total_batches": args.total_batches, "interval_batches": args.interval_batches,
                    "min_samples": args.min_samples, "warmup_batches": args.warmup_batches,
                    "drain_timeout_s": args.drain_timeout_s, "poll_s": args.poll_s, **elastic},
    }


def static_elastic(k: int) -> dict:
    return {"min_workers": k, "max_workers": k, "initial_workers": k, "autoscale": False,
            "replace_stragglers": False}


def engine_elastic(args) -> dict:
    return {"min_workers": 1, "max_workers": args.max_workers, "initial_workers": 1, "step": 1,
            "autoscale": True, "efficiency_threshold": 0.1, "replace_stragglers": args.replace_stragglers}


class SpanRecorder:
    """An ``on_poll`` hook that remembers when every worker the engine started began, on the engine's clock.

    ``EngineResult`` has each worker's exit (the ``left``/``crash`` decisions) but not its start; the spans
    give worker-seconds up to the moment the job's batches were applied (the known hang of a worker at
    interpreter exit, which the engine cuts after ``elastic.drain_timeout_s``, does not count there).
    """

    def __init__(self):
        self.starts: dict[int, tuple[int, float, str]] = {}  # id(WorkerRecord) -> (worker, start s, role)

    def __call__(self, engine) -> None:
        t0 = engine.started_at if engine.started_at is not None else engine.clock()
        for rec in engine.workers.values():
            self.starts.setdefault(id(rec), (rec.worker, rec.started - t0, rec.role))

    def spans(self, decisions: list[dict], end_s: float) -> list[dict]:
        """``[{worker, role, start, end}]``: each start matched with the worker's next exit decision."""
        exits = sorted((d["t"], d["worker"]) for d in decisions if d["kind"] in ("left", "crash", "finished"))
        out = []
        for worker, start, role in sorted(self.starts.values(), key=lambda x: x[1]):
            end = next((t for t, w in exits if w == worker and t >= start), end_s)
            exits = [(t, w) for t, w in exits if not (w == worker and t == end)]
            out.append({"worker": worker, "role": role, "start": round(start, 3), "end": round(end, 3)})
        return out


def run_row(label: str, workers: int, elastic: dict, args, run_root: str) -> dict:
    """Runs one job through the elastic engine; returns its measurements.

    A row in which a worker crashed while the job trained (the engine's ``crash`` decisions: a non-zero
    exit before the job's batches were applied) is run again, up to ``--retries`` times; the crashed
    attempts are kept in ``attempts``. Exits after that (``left`` with any code) do not change the training
    and only show in ``exits``.
    """
    attempts = []
    for attempt in range(args.retries + 1):
        row = run_attempt(label, workers, elastic, args, os.path.join(run_root, f"{label}-{attempt}"))
        crashed = [d["message"] for d in row["decisions"] if d["kind"] == "crash"]
        if not crashed or attempt == args.retries:
            row["attempts"] = attempts
            return row
        print(f"[autoscaling]   worker(s) crashed {crashed}; running {label} again", file=sys.stderr, flush=True)
        attempts.append({k: row[k] for k in ("exits", "completion_s", "log_dir")})
    raise AssertionError("unreachable")


def run_attempt(label: str, workers: int, elastic: dict, args, row_dir: str) -> dict:
    from tfdist import JobConfig
    from tfdist.cluster import LocalJob
    from tfdist.elastic import run_local_elastic

    out_dir = os.path.join(row_dir, "out")
    config = JobConfig.from_dict(job_config(label, workers, elastic, args))
    job = LocalJob(config, SCRIPT, ["--step-delay", str(args.step_delay), "--out", out_dir],
                   log_dir=os.path.join(row_dir, "logs"), forward=False)
    spans = SpanRecorder()
    load_start = [round(x, 2) for x in os.getloadavg()]
    try:
        result = run_local_elastic(job, timeout=args.row_timeout_s, on_poll=spans)
    finally:
        job.stop(grace=5.0)
    load_end = [round(x, 2) for x in os.getloadavg()]
    return summarize(label, config.elastic, result, spans.spans(result.decisions, result.completion_s), out_dir,
                     row_dir, load_start, load_end)


def worker_results(out_dir: str) -> list[dict]:
    """The JSON every worker of ``examples/train_elastic.py`` wrote when it stopped (ids are reused)."""
    rows = []
    for path in sorted(glob.glob(os.path.join(out_dir, "worker-*.json"))):
        with open(path) as f:
            rows.append(json.load(f))
    return rows


def settle_stats(result, elastic) -> dict:
    """When and how the engine settled: seconds, windows (decision intervals), scaling steps, sizes explored."""
    if result.settled_s is None:
        return {"settled_s": None, "settled_workers": result.settled_workers}
    before = [r for r in result.timeline if r["t"] <= result.settled_s + 1e-3]
    sizes = sorted({r["workers"] for r in before})
    ups = [d for d in result.decisions if d["kind"] == "scale_up" and d["t"] <= result.settled_s + 1e-3]
    downs = [d for d in result.decisions if d["kind"] == "scale_down"]
    # when the job ran at the settled size: the start of its first window there after settling (a window
    # opens once the drained workers have left)
    after = [r for r in result.timeline if r["t"] > result.settled_s + 1e-3 and r["workers"] == result.settled_workers]
    at_size = after[0]["t"] - after[0]["seconds"] if downs and after else result.settled_s
    windows = len(before)
    first = elastic.initial_workers
    settled = result.settled_workers
    # the fewest windows that can settle there: min_samples at every size from the start to one step past it
    # (or up to max_workers, where it settles without a failed step)
    last = min(settled + elastic.step, elastic.max_workers)
    needed = elastic.min_samples * (len(range(first, last + 1, elastic.step)))
    return {
        "settled_s": round(result.settled_s, 2),
        "settled_workers": settled,
        "settle_windows": windows,
        "settle_windows_needed": needed,
        "window_s_mean": round(sum(r["seconds"] for r in before) / windows, 2) if windows else None,
        "scale_ups_before_settling": len(ups),
        "scale_downs": len(downs),
        "sizes_explored": sizes,
        "at_settled_size_s": round(at_size, 2),
    }


def summarize(label, elastic, result, spans, out_dir, row_dir, load_start, load_end) -> dict:
    workers = worker_results(out_dir)
    chief = [w for w in workers if w["worker"] == 0]
    done = [w["accuracy"] for w in workers if w.get("reason") == "job_done"]
    timeline = result.timeline
    by_size: dict[int, list[float]] = {}
    for r in timeline:
        by_size.setdefault(r["workers"], []).append(r["throughput"])
    trained = next((d["t"] for d in result.decisions if d["kind"] == "job_done"), None)
    cut = result.completion_s if trained is None else trained
    row = {
        "label": label,
        "autoscale": elastic.autoscale,
        "workers": None if elastic.autoscale else elastic.initial_workers,
        "completion_s": round(result.completion_s, 2),
        "worker_seconds": round(result.worker_seconds, 1),
        # up to the moment the PS reported the job's batches applied (no final evaluation, exit, or exit hang)
        "trained_s": None if trained is None else round(trained, 2),
        "worker_seconds_trained": round(sum(max(0.0, min(sp["end"], cut) - sp["start"]) for sp in spans), 1),
        "progress": result.progress,
        "throughput_by_size": {str(k): round(sum(v) / len(v), 2) for k, v in sorted(by_size.items())},
        "windows": len(timeline),
        "accuracy_worker0": round(chief[-1]["accuracy"], 4) if chief else None,
        "accuracy_job_done_mean": round(sum(done) / len(done), 4) if done else None,
        "exits": {str(k): v for k, v in sorted(result.exits.items())},
        "stopped_after_drain_timeout": sorted(int(k) for k, v in result.exits.items() if -15 in v),
        "load_start": load_start,
        "load_end": load_end,
        "spans": spans,
        "log_dir": os.path.join(row_dir, "logs"),
    }
    if elastic.autoscale:
        row.update(settle_stats(result, elastic))
        row["timeline"] = [{k: r[k] for k in ("t", "workers", "throughput", "seconds")} for r in timeline]
    row["decisions"] = [{k: d[k] for k in ("t", "kind", "message") if k in d} for d in result.decisions
                        if d["kind"] != "stay"]
    return row


# ------------------------------------------------------------------ report
def _ratio(a, b):
    return None if a is None or b is None or not b else round(a / b, 3)


#: (time key, worker-seconds key) pairs: as the engine reports them (last worker's exit) and up to the moment
#: the job's batches were applied (no final evaluation, exit, or hang at exit).
METRICS = {"exit": ("completion_s", "worker_seconds"), "trained": ("trained_s", "worker_seconds_trained")}


def build_report(rows: dict, settings: dict) -> dict:
    """Best static size, the engine's ratios, the knee and the targets, for both metric pairs."""
    static = {int(k.split("-")[1]): r for k, r in rows.items() if k.startswith("static-") and "error" not in r}
    engine = rows.get("engine")
    report: dict = {"ratios": {}, "targets": {}}
    # R_1: static-1's measured throughput, else the engine's windows at size 1
    r1 = (static.get(1) or {}).get("throughput_by_size", {}).get("1") or \
        ((engine or {}).get("throughput_by_size") or {}).get("1")
    if r1:
        report["per_worker_rate"] = r1
        report["knee_workers"] = round(settings["max_updates_per_s"] / r1, 2)
    knee = report.get("knee_workers")
    over = [k for k in sorted(static) if knee is not None and k > knee]
    report["over_provisioned"] = over
    for metric, (t_key, ws_key) in METRICS.items():
        timed = {k: r for k, r in static.items() if r.get(t_key) is not None}
        if not timed:
            continue
        best = min(timed, key=lambda k: timed[k][t_key])
        report[f"best_static_{metric}"] = best
        if not engine or "error" in engine or engine.get(t_key) is None:
            continue
        ratios = {"completion_vs_best_static": _ratio(engine[t_key], timed[best][t_key])}
        for k, r in sorted(timed.items()):
            ratios[f"completion_vs_static_{k}"] = _ratio(engine[t_key], r[t_key])
            ratios[f"worker_seconds_vs_static_{k}"] = _ratio(engine[ws_key], r[ws_key])
        report["ratios"][metric] = ratios
        ratio = ratios["completion_vs_best_static"]
        targets = {"completion_within_10pct_of_best_static": {"value": ratio, "met": ratio <= 1.10,
                                                              "best_static": best}}
        if knee is not None:
            values = {k: ratios[f"worker_seconds_vs_static_{k}"] for k in over if k in timed}
            targets["worker_seconds_below_every_overprovisioned_static"] = {
                "over_provisioned": over, "value": values, "met": bool(values) and all(v < 1.0 for v in values.values())}
        report["targets"][metric] = targets
    if engine and "error" not in engine:
        if engine.get("settled_s") is not None:
            report["targets"]["settled_within_the_windows_it_needs"] = {
                "value": engine["settle_windows"], "needed": engine["settle_windows_needed"],
                "settled_workers": engine["settled_workers"], "settled_s": engine["settled_s"],
                "met": engine["settle_windows"] <= engine["settle_windows_needed"]}
        else:
            report["targets"]["settled_within_the_windows_it_needs"] = {"value": None, "met": False}
    return report


def versions() -> dict:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for pkg in ("tensorflow", "keras", "grpcio"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            out[pkg] = None
    return out


# -------------------------------------------------------------------- docs
def _f(v, fmt="{:.1f}"):
    return "—" if v is None else fmt.format(v)


def _met(t):
    return "met" if t["met"] else "missed"


def render_section(result: dict) -> str:
    """The Markdown of the autoscaling section, from a result of this script."""
    s, rows, rep = result["settings"], result["rows"], result["report"]
    m = result["machine"]
    load = result["load"]
    lines = ["", "## Autoscaling (`benchmarks/autoscaling.py`, seed paper 002)", "",
             f"Command ({result['total_s'] / 60:.0f} minutes):", "", "```bash", result["command"], "```", "",
             f"Recorded {result['date']} on {m.get('cpus')} CPU cores ({m.get('cpu', '?')}, {m.get('mem_gib', '?')} GiB), "
             f"TensorFlow {result['versions'].get('tensorflow')}, Keras {result['versions'].get('keras')}; "
             f"load average (1/5/15 min) {'/'.join(f'{x:.1f}' for x in load['at_start'])} at the start and "
             f"{'/'.join(f'{x:.1f}' for x in load['at_end'])} at the end (a shared machine; each row's 1-minute "
             "load at its start and end is in the table).", "",
             f"The same job in every row: 1 PS (async, at most **{s['max_updates_per_s']:g} updates/s**, "
             f"`ps.max_updates_per_s`), workers running `examples/train_elastic.py --step-delay {s['step_delay']:g}` "
             f"(MLP on digits, batch 32, {s['step_delay'] * 1000:.0f} ms of emulated compute per batch), "
             f"**{s['total_batches']} global batches** (`elastic.total_batches`). Static rows: `autoscale: false`, "
             "`initial_workers = min_workers = max_workers = k`, no straggler replacement. Engine: start 1, "
             f"max {s['max_workers']}, step 1, a window every {s['interval_batches']} batches, {s['min_samples']} "
             f"windows per size, threshold 0.1, no utility, straggler replacement "
             f"{'on' if s['replace_stragglers'] else 'off'}; `elastic.drain_timeout_s` {s['drain_timeout_s']:g}.", "",
             "*Completion* and *worker-seconds* are the engine's (`EngineResult`): from the job's start to the last "
             "worker's exit, and every worker process from its start to its exit (the GPU-time analogue; start-up, "
             "warm-up and the final evaluation included). *Trained* and *worker-s trained* stop at the moment the "
             "PS reported the job's batches applied, so they leave out the final evaluation and the exit — and "
             "with them the known hang of a worker at interpreter exit (exit code −15: stopped after the drain "
             "timeout).", ""]
    if "per_worker_rate" in rep:
        lines += [f"Measured: one worker alone does {rep['per_worker_rate']:.1f} batches/s, so the knee is at "
                  f"{s['max_updates_per_s']:g} / {rep['per_worker_rate']:.1f} = **{rep['knee_workers']:.1f} workers**; "
                  f"the static sizes above it ({', '.join(map(str, rep['over_provisioned'])) or 'none'}) are "
                  "over-provisioned.", ""]
    best = rep.get("best_static_exit")
    ratios = rep.get("ratios", {})
    lines += ["| allocation | completion (s) | ÷ best static | trained (s) | worker-s | engine's ÷ this | "
              "worker-s trained | engine's ÷ this | throughput (batches/s) at size | test accuracy "
              "| load 1 min | exit codes |",
              "|---|---:|---:|---:|---:|---:|---:|---:|---|---:|---|---|"]
    for label, r in rows.items():
        if "error" in r:
            lines.append(f"| {label} | failed: {r['error'][:100]} |" + " |" * 11)
            continue
        if r["autoscale"]:
            name = f"**engine** (1 → {s['max_workers']})"
            ws = wst = "—"
        else:
            k = r["workers"]
            name = f"static {k}" + (" (best)" if k == best else "")
            ws = _f(ratios.get("exit", {}).get(f"worker_seconds_vs_static_{k}"), "{:.2f}×")
            wst = _f(ratios.get("trained", {}).get(f"worker_seconds_vs_static_{k}"), "{:.2f}×")
        comp = _ratio(r["completion_s"], rows[f"static-{best}"]["completion_s"]) if best is not None else None
        thr = ", ".join(f"{k}: {v:.1f}" for k, v in r["throughput_by_size"].items())
        ex = "; ".join(f"w{k}: {','.join(str(c) for c in v)}" for k, v in r["exits"].items())
        if r.get("attempts"):
            ex += f" (run again after a crash: {r['attempts'][0]['exits']})"
        lines.append(f"| {name} | {r['completion_s']:.1f} | {_f(comp, '{:.2f}×')} | {_f(r.get('trained_s'))} | "
                     f"{r['worker_seconds']:.0f} | {ws} | {r['worker_seconds_trained']:.0f} | {wst} | {thr} | "
                     f"{_f(r['accuracy_worker0'], '{:.3f}')} | {r['load_start'][0]:.1f} → {r['load_end'][0]:.1f} | {ex} |")
    lines.append("")
    e = rows.get("engine")
    if e and "error" not in e:
        if e.get("settled_s") is not None:
            lines += [f"The engine explored sizes {e['sizes_explored']} and **settled at {e['settled_workers']} "
                      f"worker(s) after {e['settled_s']:.1f} s** = {e['settle_windows']} measurement windows "
                      f"(decision intervals of {s['interval_batches']} batches, {e['window_s_mean']:.1f} s each on "
                      f"average; the fewest that can settle there: {e['settle_windows_needed']}), "
                      f"{e['scale_ups_before_settling']} scale-up(s) and {e['scale_downs']} scale-down(s); it ran at "
                      f"the settled size from {e['at_settled_size_s']:.1f} s of {e['completion_s']:.1f} s. "
                      "Decisions (`<log_dir>/elastic.jsonl`):", ""]
        else:
            lines += ["The engine did **not** settle before the job ended. Decisions:", ""]
        for d in e.get("decisions", []):
            if d["kind"] in ("start", "join", "scale_up", "scale_down", "settled", "job_done", "stop", "crash",
                             "restart"):
                lines.append(f"* {d['t']:.1f} s — {d['kind']}: {d['message']}")
        lines.append("")
    targets = rep.get("targets", {})
    if targets:
        lines += ["**Targets** (issue 6), judged on the engine's numbers (exit) and on the trained numbers:", ""]
        for metric, label in (("exit", "exit"), ("trained", "trained")):
            t = targets.get(metric, {}).get("completion_within_10pct_of_best_static")
            if t:
                lines.append(f"* completion within 10 % of the best static size ({label}: static {t['best_static']}): "
                             f"**{t['value']:.2f}×** — {_met(t)}")
        for metric, label in (("exit", "worker-seconds"), ("trained", "worker-seconds trained")):
            t = targets.get(metric, {}).get("worker_seconds_below_every_overprovisioned_static")
            if t:
                vals = ", ".join(f"static {k}: {v:.2f}×" for k, v in t["value"].items())
                lines.append(f"* {label} below every over-provisioned static size: **{vals or 'none measured'}** "
                             f"— {_met(t)}")
        t = targets.get("settled_within_the_windows_it_needs")
        if t:
            if t["value"] is None:
                lines.append("* settling within a few decision intervals: did not settle — missed")
            else:
                lines.append(f"* settling within a few decision intervals: **{t['value']} windows, {t['settled_s']:.1f} s** "
                             f"(the fewest possible: {t['needed']}) at {t['settled_workers']} worker(s) — {_met(t)}")
        lines.append("")
    lines += [f"Paper: {PAPER}", ""]
    if result.get("notes"):
        lines += ["Notes:", ""] + [f"* {n}" for n in result["notes"]] + [""]
    return "\n".join(lines)


def write_docs(result: dict, path: str = DOCS) -> None:
    """Rewrites only the text between the autoscaling markers of ``path``."""
    _common.replace_section(path, SECTION, render_section(result))


# -------------------------------------------------------------------- main
def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true",
                   help="short smoke run: static 2 and 4, engine up to 3 workers, 1000 batches (about 4 minutes)")
    p.add_argument("--static", default=None, help="static sizes (default 1,2,4,8; --quick 2,4)")
    p.add_argument("--max-workers", type=int, default=None, help="engine's max_workers (default 8; --quick 3)")
    p.add_argument("--total-batches", type=int, default=None, help="the job's work (default 3000; --quick 1000)")
    p.add_argument("--step-delay", type=float, default=0.1, help="emulated compute per batch, seconds")
    p.add_argument("--max-updates-per-s", type=float, default=22.0, help="the PS's update-rate cap (the knee)")
    p.add_argument("--interval-batches", type=int, default=None, help="N, batches per window (default 40; --quick 15)")
    p.add_argument("--min-samples", type=int, default=2)
    p.add_argument("--warmup-batches", type=int, default=3)
    p.add_argument("--drain-timeout-s", type=float, default=10.0)
    p.add_argument("--poll-s", type=float, default=0.5)
    p.add_argument("--replace-stragglers", action="store_true", help="let the engine replace persistent stragglers")
    p.add_argument("--row-timeout-s", type=float, default=None, help="bound on one row (default: 3x static-1's "
                   "ideal time + 180 s)")
    p.add_argument("--retries", type=int, default=1, help="run a row again when one of its workers crashed")
    p.add_argument("--skip-engine", action="store_true")
    p.add_argument("--out", help="also write the JSON here")
    p.add_argument("--write-docs", action="store_true", help="rewrite the autoscaling section of docs/benchmarks.md")
    p.add_argument("--from-json", help="with --write-docs: render this JSON file instead of running")
    p.add_argument("--notes", action="append", default=[], help="a note for the docs section (repeatable)")
    args = p.parse_args(argv)
    args.static = [int(k) for k in (args.static or ("2,4" if args.quick else "1,2,4,8")).split(",") if k]
    args.max_workers = args.max_workers or (3 if args.quick else 8)
    args.total_batches = args.total_batches or (1000 if args.quick else 3000)
    args.interval_batches = args.interval_batches or (15 if args.quick else 40)
    if args.row_timeout_s is None:
        args.row_timeout_s = 3 * args.total_batches * (args.step_delay + 0.02) + 180
    if any(k < 1 for k in args.static) or args.max_workers < 2:
        p.error("static sizes must be >= 1 and --max-workers >= 2")
    return args


SETTINGS = ("static", "max_workers", "total_batches", "step_delay", "max_updates_per_s", "interval_batches",
            "min_samples", "warmup_batches", "drain_timeout_s", "poll_s", "replace_stragglers", "retries", "quick")


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.from_json:
        with open(args.from_json) as f:
            result = json.load(f)
        result["report"] = build_report(result["rows"], result["settings"])
        if args.notes:
            result["notes"] = args.notes
        if args.write_docs:
            write_docs(result)
        print(json.dumps(result, indent=1))
        return 0
    command = "python benchmarks/autoscaling.py " + " ".join(argv if argv is not None else sys.argv[1:])
    started = time.monotonic()
    load_start = [round(x, 2) for x in os.getloadavg()]
    run_root = tempfile.mkdtemp(prefix="tfdist-autoscaling-")
    plan = [(f"static-{k}", k, static_elastic(k)) for k in args.static]
    if not args.skip_engine:
        plan.append(("engine", args.max_workers, engine_elastic(args)))
    rows: dict[str, dict] = {}
    for label, workers, elastic in plan:
        print(f"[autoscaling] {label} ({args.total_batches} batches) ...", file=sys.stderr, flush=True)
        try:
            r = run_row(label, workers, elastic, args, run_root)
            print(f"[autoscaling]   {r['completion_s']:.1f} s, {r['worker_seconds']:.0f} worker-s, throughput "
                  f"{r['throughput_by_size']}, settled {r.get('settled_workers')} at {r.get('settled_s')} s, "
                  f"exits {r['exits']}, load {r['load_start'][0]} -> {r['load_end'][0]}", file=sys.stderr, flush=True)
        except Exception as e:  # one failed row must not lose the others
            traceback.print_exc()
            r = {"label": label, "error": f"{type(e).__name__}: {e}"[:2000]}
        rows[label] = r
    settings = {k: getattr(args, k) for k in SETTINGS}
    result = {
        "benchmark": "autoscaling",
        "command": command,
        "date": datetime.datetime.now().strftime("%Y-%m-%d %H:%M"),
        "machine": _common.machine(),
        "versions": versions(),
        "settings": settings,
        "load": {"at_start": load_start, "at_end": [round(x, 2) for x in os.getloadavg()]},
        "run_dir": run_root,
        "rows": rows,
        "total_s": round(time.monotonic() - started, 1),
    }
    result["report"] = build_report(rows, settings)
    if args.notes:
        result["notes"] = args.notes
    if args.out:
        _common.write_result(args.out, result)
    if args.write_docs:
        write_docs(result)
    print(json.dumps(result, indent=1))
    return 1 if any("error" in r for r in rows.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
