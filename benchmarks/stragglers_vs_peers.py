"""Time to accuracy with a straggler: tfdist's modes against MultiWorkerMirroredStrategy and TF's PSS.

The benchmark the project exists for (issue #23 item 2). Prints one JSON
document. In one run, for every system, with and without a straggler:

* **the job**: 4 workers train the MLP of ``ps_throughput.py`` (784-256-256-10,
  Adam 1e-4, batch 64 per worker) on a learnable task, each on its own
  endless stream of fresh examples (a random latent seen through a fixed
  projection, labelled by a fixed linear teacher, ``benchmarks/_teacher.py``);
  the same model, optimizer, per-worker batch and data per worker in every
  system;
* **the systems**: ``mwms`` (``tf.distribute.MultiWorkerMirroredStrategy``,
  Keras 3 with the work-arounds of ``ps_workers/keras_worker.py``),
  ``tf_pss`` (TF's ``ParameterServerStrategy`` with tf-keras, 1 PS, a
  coordinator), and tfdist with 2 PS tasks in ``bsp``, ``sync_replicas`` (3
  of 4), ``async``, ``ssp`` (3) and ``dtssp`` (defaults, 3..10);
* **the straggler**: worker 3 runs at a third of its speed. The driver
  stops the process (SIGSTOP) for 2 x 60 ms after every 60 ms it lets it run
  (SIGCONT), from launch to the end, whatever the system: TF PSS's workers run
  no user code (its coordinator dispatches the steps), so a callback that
  sleeps after each step, which would slow the Keras 3 systems, cannot slow
  TF PSS the same way; the duty cycle does, for all of them, like a machine
  three times slower. The slow worker is never the chief (or TF PSS's
  coordinator), whose model is measured. ``--pattern moving`` moves the
  slow-down instead: bursts of ``--burst-s`` (0.36 s: two duty cycles) on a
  random one of workers 1..3 (seeded, the same sequence for every system),
  one after another, so that one worker is 3x slower at every moment as
  before but which one changes (a noisy neighbour, not a slow machine): the
  case where a wider staleness bound (DTSSP) can absorb what SSP(3) waits
  out; its docs section is ``stragglers-vs-peers-moving``;
* **the measure**: worker 0 (TF PSS: the coordinator, reading the PS) copies
  its model's weights every 0.5 s; afterwards each copy is evaluated on 4,096
  held-out examples. Times count from the launch of the job's first process
  (start-up is part of what a user waits for). Reported per run: the time
  until held-out accuracy first reaches ``--target``, the accuracy at the end
  of ``--budget-s``, and the curve.

Ratios (``summary``): each tfdist mode's time to target over MWMS's and TF
PSS's with the straggler (>= 2 and >= 1.2 are issue #23's targets for the
best mode), each over its own time without the straggler (<= 1.1), and DTSSP
over SSP with the straggler (<= 0.9). A run that never reaches the target
counts as the budget (its ratio is then a bound, marked).

Usage::

    python benchmarks/stragglers_vs_peers.py [--quick] [--systems mwms,tf_pss,bsp,...] [--budget-s 90]
        [--target 0.8] [--passes 1] [--straggler both|yes|no] [--pattern persistent|moving] [--burst-s 0.36]
        [--out FILE] [--write-docs]
    python benchmarks/stragglers_vs_peers.py --from-json FILE --write-docs

A full pass (7 systems x 2) takes about 14 x (budget + 20 s) on 2 cores;
``--quick`` runs async and MWMS with the straggler for 30 s each. TF PSS needs
tf-keras (``pip install -e .[bench]``). Every child process is killed when the
script ends, also on errors.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import random
import shlex
import signal
import statistics
import sys
import tempfile
import threading
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from benchmarks import _common, _teacher  # noqa: E402

WORKERS_DIR = os.path.join(ROOT, "benchmarks", "ps_workers")
DOCS = os.path.join(ROOT, "docs", "benchmarks.md")
SECTION = "stragglers-vs-peers"
NUM_WORKERS, SLOW_WORKER = 4, 3
TFDIST_MODES = {
    "bsp": {"consistency": "bsp"},
    "sync_replicas": {"consistency": "sync_replicas", "replicas_to_aggregate": 3},
    "async": {"consistency": "async"},  # the library's defaults: exchange_every auto (since 2026-11-28 evening)
    "async_every1": {"consistency": "async", "exchange_every": 1},
    "async_auto": {"consistency": "async", "exchange_every": "auto"},  # (the default now; kept for older JSON)
    "ssp": {"consistency": "ssp", "staleness": 3},
    "dtssp": {"consistency": "dtssp"},
    # not a default: DTSSP with a wider range, to see what its bound buys against a persistent straggler
    "dtssp_wide": {"consistency": "dtssp", "max_staleness": 50},
}
SYSTEMS = ("mwms", "tf_pss", *TFDIST_MODES)
LABELS = {
    "mwms": "TF MultiWorkerMirroredStrategy (Keras 3, patched)",
    "tf_pss": "TF ParameterServerStrategy (tf-keras, 1 PS + coordinator)",
    "bsp": "tfdist BSP", "sync_replicas": "tfdist SyncReplicas (3 of 4)", "async": "tfdist async",
    "async_auto": "tfdist async, `exchange_every: auto`",
    "async_every1": "tfdist async, every step (`exchange_every: 1`)",
    "ssp": "tfdist SSP (s=3)", "dtssp": "tfdist DTSSP (3..10)",
    "dtssp_wide": "tfdist DTSSP (3..50, `max_staleness: 50`)",
}


class MovingThrottle:
    """One worker at a time runs at ``1 / slowdown`` of its speed, in bursts of ``burst_s``; which one moves.

    Every burst picks one of ``pids`` at random (``random.Random(seed)``: the same sequence in every system of a
    run) and runs a duty cycle on it for ``burst_s``: ``run_s`` running, then ``run_s * (slowdown - 1)``
    stopped (SIGSTOP / SIGCONT), in whole cycles, at least one; the next burst starts at once. At every moment exactly one worker is slowed, as with the
    persistent straggler, but the slow-down moves between machines (a co-located job, a noisy neighbour): a
    bounded-staleness job absorbs a burst whose lag fits its bound and waits out one that does not.
    """

    def __init__(self, pids: list[int], slowdown: float, burst_s: float, seed: int = 0, run_s: float = 0.06):
        self.pids, self.run_s, self.stop_s = list(pids), run_s, run_s * (slowdown - 1.0)
        self.cycles_per_burst = max(1, round(burst_s / (run_s * slowdown)))
        self._random = random.Random(seed)
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="moving-throttle", daemon=True)
        self.cycles, self.bursts = 0, []  # the pid index of every burst, in order

    def start(self) -> "MovingThrottle":
        self._thread.start()
        return self

    @staticmethod
    def _signal(pid: int, sig) -> bool:
        try:
            os.kill(pid, sig)
            return True
        except ProcessLookupError:
            return False

    def _loop(self) -> None:
        while not self._done.is_set():
            index = self._random.randrange(len(self.pids))
            pid = self.pids[index]
            self.bursts.append(index)
            for _ in range(self.cycles_per_burst):
                if self._done.wait(self.run_s) or not self._signal(pid, signal.SIGSTOP):
                    return
                self._done.wait(self.stop_s)
                if not self._signal(pid, signal.SIGCONT):
                    return
                self.cycles += 1

    def stop(self) -> None:
        self._done.set()
        self._thread.join(5)
        for pid in self.pids:
            self._signal(pid, signal.SIGCONT)  # never leave one stopped


class Throttle(MovingThrottle):
    """Runs process ``pid`` ``run_s`` of every ``run_s * slowdown`` seconds (SIGCONT / SIGSTOP) until stopped.

    The persistent straggler: a :class:`MovingThrottle` with one process to pick.
    """

    def __init__(self, pid: int, slowdown: float, run_s: float = 0.06):
        super().__init__([pid], slowdown, burst_s=run_s * slowdown, run_s=run_s)
        self.pid = pid


#: How the straggler is made: ``persistent`` (worker 3, always) or ``moving`` (bursts on workers 1..3).
PATTERN = {"kind": "persistent", "burst_s": 0.36, "seed": 0}


def _throttle(worker_pids: list[int], slowdown: float):
    """The straggler for one run (``None`` without one): :data:`PATTERN` on the job's worker processes."""
    if slowdown <= 1:
        return None
    if PATTERN["kind"] == "moving":  # never worker 0: its model is the one measured
        return MovingThrottle(worker_pids[1:], slowdown, PATTERN["burst_s"], PATTERN["seed"]).start()
    return Throttle(worker_pids[SLOW_WORKER], slowdown).start()


def _env(**extra) -> dict:
    env = dict(os.environ)
    env.pop("TF_CONFIG", None)
    env.pop("TFDIST_CONFIG", None)
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    env.update(extra)
    return env


def _ports(n: int) -> list[int]:
    from tfdist.cluster.local import free_port

    ports: list[int] = []
    while len(ports) < n:
        p = free_port()
        if p not in ports:
            ports.append(p)
    return ports


def _wait_done(snapshots: str, deadline: float, check) -> None:
    """Until the observer wrote ``done`` (bounded); ``check()`` raises if the job failed meanwhile."""
    while not os.path.exists(os.path.join(snapshots, "done")):
        check()
        if time.time() > deadline:
            raise TimeoutError(f"no snapshots 'done' in {snapshots} by the deadline")
        time.sleep(0.2)


def _running(procs, what: str):
    def check():
        for p in procs:
            code = p.poll()
            if code is not None:
                raise RuntimeError(f"{what}: a process exited with {code} before the budget ended:\n"
                                   f"{_common.log_tail(p)}")
    return check


def run_mwms(work, budget, slowdown, interval, children):
    cluster = {"worker": [f"127.0.0.1:{p}" for p in _ports(NUM_WORKERS)]}
    snapshots = os.path.join(work, "snapshots")
    launch = time.time()
    until = launch + budget
    procs = []
    for i in range(NUM_WORKERS):
        tf_config = json.dumps({"cluster": cluster, "task": {"type": "worker", "index": i}})
        procs.append(children.start(
            [_common.python(), os.path.join(WORKERS_DIR, "tta_worker.py"), "--mode", "mwms", "--snapshots",
             snapshots, "--until", repr(until), "--interval", str(interval)],
            env=_env(TF_CONFIG=tf_config), log_path=os.path.join(work, f"worker-{i}.log")))
    throttle = _throttle([p.pid for p in procs], slowdown)
    try:
        _wait_done(snapshots, until + 120, _running(procs, "mwms"))
    finally:
        if throttle:
            throttle.stop()
        children.stop_all()
    return launch, snapshots


def run_tf_pss(work, budget, slowdown, interval, children, steps_per_execution=1):
    ports = _ports(NUM_WORKERS + 2)
    cluster = {"chief": [f"127.0.0.1:{ports[0]}"], "ps": [f"127.0.0.1:{ports[1]}"],
               "worker": [f"127.0.0.1:{p}" for p in ports[2:]]}
    spec = json.dumps(cluster)
    snapshots = os.path.join(work, "snapshots")
    env = _env(TF_USE_LEGACY_KERAS="1")
    launch = time.time()
    until = launch + budget
    servers = {}
    for job, n in (("ps", 1), ("worker", NUM_WORKERS)):
        for i in range(n):
            servers[job, i] = children.start(
                [_common.python(), os.path.join(WORKERS_DIR, "tfpss_server.py"), "--cluster", spec, "--job", job,
                 "--index", str(i)], env=env, log_path=os.path.join(work, f"{job}-{i}.log"))
    coordinator = children.start(
        [_common.python(), os.path.join(WORKERS_DIR, "tta_tfpss_coordinator.py"), "--cluster", spec,
         "--snapshots", snapshots, "--until", repr(until), "--interval", str(interval),
         "--steps-per-execution", str(steps_per_execution)],
        env=env, log_path=os.path.join(work, "coordinator.log"))
    throttle = _throttle([servers["worker", i].pid for i in range(NUM_WORKERS)], slowdown)
    try:
        _wait_done(snapshots, until + 120, _running([coordinator, *servers.values()], "tf_pss"))
    finally:
        if throttle:
            throttle.stop()
        children.stop_all()
    return launch, snapshots


def run_tfdist(mode, work, budget, slowdown, interval):
    from tfdist.config import JobConfig
    from tfdist.testing import LocalCluster

    config = JobConfig(name=f"tta-{mode}")
    for key, value in TFDIST_MODES[mode].items():
        setattr(config.strategy, key, value)
    snapshots = os.path.join(work, "snapshots")
    with LocalCluster(workers=NUM_WORKERS, ps=2, config=config, log_dir=os.path.join(work, "logs")) as cluster:
        launch = time.time()
        until = launch + budget
        cluster.start(os.path.join(WORKERS_DIR, "tta_worker.py"),
                      ["--mode", "tfdist", "--snapshots", snapshots, "--until", repr(until),
                       "--interval", str(interval)])
        pids = [cluster.process(f"worker:{i}").pid for i in range(NUM_WORKERS)]
        if None in pids:
            raise RuntimeError(f"worker:{pids.index(None)} of the tfdist {mode} job is not running")
        throttle = _throttle(pids, slowdown)
        try:
            tasks = [cluster.process(f"worker:{i}") for i in range(NUM_WORKERS)]
            _wait_done(snapshots, until + 120, _running(tasks, f"tfdist {mode}"))
            job = _job_status(cluster)
        finally:
            if throttle:
                throttle.stop()
    return launch, snapshots, job


def _job_status(cluster) -> dict:
    """What PS task 0 says at the end of the budget: the batches applied (per worker) and, DTSSP, the bound."""
    from tfdist.ps.admin import AdminClient

    admin = AdminClient(cluster.config.cluster.ps, cluster.token)
    try:
        status = admin.status(0).to_dict()
    except Exception as e:  # noqa: BLE001 - a side measure; the run's curve stands without it
        return {"status_error": f"{type(e).__name__}: {e}"[:300]}
    finally:
        admin.client.close()
    policy = status.get("policy") or {}
    out = {"batches": status.get("progress"), "worker_batches": status.get("worker_batches"),
           "policy": policy.get("policy")}
    if "staleness" in policy:
        out["staleness_at_end"] = policy["staleness"]
    if policy.get("changes"):  # the last 20 evaluations of DTSSP's rule
        out["staleness_changes"] = [[c["clock"], round(c["lpr"], 4), c["old_staleness"], c["new_staleness"]]
                                    for c in policy["changes"]]
    return out


def evaluate(launch: float, snapshots: str, target: float, budget: float) -> dict:
    """Accuracy of every snapshot on the held-out set; time to ``target`` and final accuracy."""
    x, y = _teacher.heldout()
    snaps = _teacher.read_snapshots(snapshots)
    if not snaps:
        raise RuntimeError(f"no snapshots in {snapshots}")
    first = snaps[0][1]
    curve, started = [], None
    for t, weights in snaps:
        if started is None and any((w != f).any() for w, f in zip(weights, first)):
            started = t - launch  # the first copy after a training step landed
        curve.append((round(t - launch, 2), round(_teacher.mlp_accuracy(weights, x, y), 4)))
    reached = next((t for t, acc in curve if acc >= target), None)
    within = [acc for t, acc in curve if t <= budget + 0.5]
    from_start = None if reached is None or started is None else round(reached - started, 2)
    return {"time_to_target_s": reached, "reached": reached is not None,
            "time_to_target_from_first_step_s": from_start,
            "final_accuracy": within[-1] if within else curve[-1][1], "best_accuracy": max(a for _, a in curve),
            "training_started_s": started, "snapshots": len(curve), "curve": curve}


def run_one(system, straggler, budget, slowdown, target, interval, work, children, tf_pss_spe) -> dict:
    os.makedirs(work, exist_ok=True)
    factor = slowdown if straggler else 1.0
    if system == "mwms":
        launch, snaps = run_mwms(work, budget, factor, interval, children)
    elif system == "tf_pss":
        launch, snaps = run_tf_pss(work, budget, factor, interval, children, tf_pss_spe)
    else:
        launch, snaps, job = run_tfdist(system, work, budget, factor, interval)
        return {"system": system, "straggler": straggler, **evaluate(launch, snaps, target, budget), "job": job}
    return {"system": system, "straggler": straggler, **evaluate(launch, snaps, target, budget)}


#: The two clocks of a time to target: from the launch of the job's first process, and from its first step.
CLOCKS = {"launch": "time_to_target_s", "first_step": "time_to_target_from_first_step_s"}


def _tta(row: dict, budget: float, clock: str = "launch") -> tuple[float, bool]:
    """Time to target, or the budget (and ``False``) when the target was not reached."""
    if row["reached"]:
        return row[CLOCKS[clock]], True
    started = row.get("training_started_s") if clock == "first_step" else 0.0
    return budget - (started if started is not None else budget), False


def _ratio(a: dict, b: dict, budget: float, clock: str = "launch") -> dict:
    """b's time over a's (how many times sooner a is), marked as a bound when one of them never got there."""
    (ta, ra), (tb, rb) = _tta(a, budget, clock), _tta(b, budget, clock)
    if ta <= 0 or tb <= 0:  # a run whose first step came at (or after) the end of the budget: no bound
        return {"value": None, "kind": "a run did not start training within the budget"}
    value = round(tb / ta, 2)
    if ra and rb:
        kind = "exact"
    elif ra and not rb:
        kind = "at least"  # b did not reach it within the budget
    elif rb and not ra:
        kind = "at most"
    else:
        kind = "neither reached the target"
    return {"value": value, "kind": kind}


def summarize(runs: list[dict], budget: float) -> dict:
    """Per system and straggler setting, the median over passes; the ratios of issue #23 item 2."""
    table: dict = {}
    out_errors = [r for r in runs if "error" in r]
    for r in runs:
        if "error" in r:
            continue
        table.setdefault(r["system"], {}).setdefault("straggler" if r["straggler"] else "no_straggler", []).append(r)

    def median_row(rows):
        row = {"reached": all(r["reached"] for r in rows),
               "final_accuracy": statistics.median(r["final_accuracy"] for r in rows),
               "training_started_s": statistics.median(r["training_started_s"] or budget for r in rows),
               "per_pass_time_to_target_s": [r["time_to_target_s"] for r in rows],
               "per_pass_time_to_target_from_first_step_s": [r["time_to_target_from_first_step_s"] for r in rows]}
        for clock, key in CLOCKS.items():
            row[key] = statistics.median(_tta(r, budget, clock)[0] for r in rows)
        return row

    med = {s: {k: median_row(v) for k, v in d.items()} for s, d in table.items()}
    out: dict = {"median": med, "failed_runs": [(r["system"], r["straggler"], r["pass"]) for r in out_errors]}
    for clock in CLOCKS:
        part: dict = {"vs_peers": {}, "own_no_straggler": {}}
        for mode in TFDIST_MODES:
            row = med.get(mode, {}).get("straggler")
            if row is None:
                continue
            for peer in ("mwms", "tf_pss"):
                if "straggler" in med.get(peer, {}):
                    part["vs_peers"].setdefault(mode, {})[peer] = _ratio(row, med[peer]["straggler"], budget, clock)
            if "no_straggler" in med.get(mode, {}):  # straggler time / own no-straggler time
                part["own_no_straggler"][mode] = _ratio(med[mode]["no_straggler"], row, budget, clock)
        if "straggler" in med.get("dtssp", {}) and "straggler" in med.get("ssp", {}):
            part["dtssp_over_ssp"] = _ratio(med["ssp"]["straggler"], med["dtssp"]["straggler"], budget, clock)
        ranked = [m for m in TFDIST_MODES if "straggler" in med.get(m, {})]
        if ranked:
            best = min(ranked, key=lambda m: _tta(med[m]["straggler"], budget, clock)[0])
            peers = part["vs_peers"].get(best, {})
            part["best_mode"] = best
            part["targets"] = {
                "best_vs_mwms_ge_2": peers.get("mwms"),
                "best_vs_tf_pss_ge_1_2": peers.get("tf_pss"),
                "best_straggler_over_own_no_straggler_le_1_1": part["own_no_straggler"].get(best),
                "dtssp_over_ssp_le_0_9": part.get("dtssp_over_ssp"),
            }
        out[clock] = part
    return out


def dtssp_over_ssp_per_pass(result: dict) -> dict:
    """DTSSP's time to target over SSP's, with the straggler, for every pass both reached it (either clock)."""
    out: dict = {}
    for clock, key in CLOCKS.items():
        times: dict = {}
        for run in result["runs"]:
            if run.get("straggler") and run.get("reached") and run["system"] in ("ssp", "dtssp"):
                times.setdefault(run["pass"], {})[run["system"]] = run[key]
        out[clock] = [round(t["dtssp"] / t["ssp"], 2) for _, t in sorted(times.items())
                      if t.get("ssp") and t.get("dtssp") is not None]
    return out


def _section(result: dict) -> str:
    """The docs section a run rewrites: one per straggler pattern."""
    kind = result.get("pattern", {}).get("kind", "persistent")
    return SECTION if kind == "persistent" else f"{SECTION}-{kind}"


def _straggler_words(result: dict) -> str:
    pattern = result.get("pattern", {"kind": "persistent"})
    if pattern["kind"] == "moving":
        return (f"one worker at a time {result['slowdown']:g}x slower by a SIGSTOP/SIGCONT duty cycle, in bursts of "
                f"{pattern['burst_s']:g} s on a random one of workers 1..{NUM_WORKERS - 1} (seed {pattern['seed']})")
    return f"worker {SLOW_WORKER} of {NUM_WORKERS} {result['slowdown']:g}x slower by a SIGSTOP/SIGCONT duty cycle"


def render_docs(result: dict) -> str:
    s = result["summary"]
    budget = result["budget_s"]
    lines = [
        f"Measured {result['date']} at {result['git'].get('commit', '?')[:7]} on {result['machine'].get('cpus')} "
        f"cores: `{result['command']}` ({result['passes']} pass(es), the median per system; target held-out "
        f"accuracy {result['target']}, budget {budget:g} s from launch; {_straggler_words(result)}). "
        f"Task: {result['task']}.",
        "",
        "Seconds until the held-out accuracy reached the target, from the launch of the job's first process "
        "(start-up included) and from the job's first step (the first copy of the model that training changed):",
        "",
        "| system | straggler: from launch | from first step | first step at | final accuracy | "
        "no straggler: from launch | from first step |",
        "|---|---|---|---|---|---|---|",
    ]

    def fmt(row, key):
        if row is None:
            return "-"
        return f"{row[key]:.1f}" if row["reached"] else f"not reached (> {row[key]:.0f})"

    for system in result["systems"]:
        med = s["median"].get(system, {})
        st, no = med.get("straggler"), med.get("no_straggler")
        lines.append(
            f"| {LABELS[system]} | {fmt(st, CLOCKS['launch'])} | {fmt(st, CLOCKS['first_step'])} | "
            f"{st['training_started_s']:.1f} | {st['final_accuracy']:.3f} | " if st else f"| {LABELS[system]} | - | - | - | - | ")
        lines[-1] += f"{fmt(no, CLOCKS['launch'])} | {fmt(no, CLOCKS['first_step'])} |"
    lines.append("")

    def r(x):
        return "-" if not x else (f"{x['value']}" + ("" if x["kind"] == "exact" else f" ({x['kind']})"))

    for clock, title in (("launch", "from launch"), ("first_step", "from the first step")):
        part = s.get(clock, {})
        if not part.get("vs_peers"):
            continue
        lines += [f"Ratios, {title} (straggler): how many times sooner than the peer; own straggler time over "
                  "own no-straggler time.", "",
                  "| tfdist mode | x sooner than MWMS | x sooner than TF PSS | straggler / no straggler |",
                  "|---|---|---|---|"]
        for mode, peers in part["vs_peers"].items():
            lines.append(f"| {LABELS[mode]} | {r(peers.get('mwms'))} | {r(peers.get('tf_pss'))} | "
                         f"{r(part['own_no_straggler'].get(mode))} |")
        t = part.get("targets", {})
        lines += ["", f"Best tfdist mode with the straggler ({title}): **{part.get('best_mode')}**; issue #23's "
                  f"targets: x sooner than MWMS {r(t.get('best_vs_mwms_ge_2'))} (>= 2), than TF PSS "
                  f"{r(t.get('best_vs_tf_pss_ge_1_2'))} (>= 1.2), straggler / no straggler "
                  f"{r(t.get('best_straggler_over_own_no_straggler_le_1_1'))} (<= 1.1); DTSSP / SSP(3) "
                  f"{r(t.get('dtssp_over_ssp_le_0_9'))} (<= 0.9).", ""]
    per_pass = dtssp_over_ssp_per_pass(result)
    if per_pass["launch"]:
        lines += ["DTSSP / SSP(3) with the straggler, per pass: " + "; ".join(
            f"{title} " + ", ".join(f"{v:.2f}" for v in per_pass[clock])
            for clock, title in (("launch", "from launch"), ("first_step", "from the first step"))) + ".", ""]
    steps = {}
    for run in result["runs"]:
        job = run.get("job") or {}
        if run["straggler"] and job.get("batches") is not None:
            steps.setdefault(run["system"], []).append((job["batches"], job.get("staleness_at_end")))
    if steps:
        lines += ["Batches the PS tasks applied within the budget with the straggler (PS task 0's count, all workers, "
                  "per pass" + (", and DTSSP's bound at the end" if "dtssp" in steps else "") + "): " + "; ".join(
                      f"{LABELS[m]} " + ", ".join(f"{g}" + (f" (s={b})" if m == "dtssp" and b is not None else "")
                                                  for g, b in v) for m, v in steps.items()) + ".", ""]
    if s.get("failed_runs"):
        lines.append(f"Failed runs (system, straggler, pass): {s['failed_runs']}.")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="async and MWMS with the straggler, 30 s each")
    p.add_argument("--systems", help=f"comma-separated, from {','.join(SYSTEMS)} (default all)")
    p.add_argument("--straggler", choices=["both", "yes", "no"], default="both")
    p.add_argument("--budget-s", type=float, help="training time of each run from launch (default 90, quick 30)")
    p.add_argument("--target", type=float, default=0.86, help="held-out accuracy to reach (default 0.86)")
    p.add_argument("--slowdown", type=float, default=3.0, help="the straggler's slowdown (default 3)")
    p.add_argument("--pattern", choices=["persistent", "moving"], default="persistent",
                   help="persistent: worker 3 slowed throughout (default); moving: bursts of --burst-s on a "
                        "random one of workers 1..3, one after another")
    p.add_argument("--burst-s", type=float, default=0.36, help="with --pattern moving: one burst (default 0.36)")
    p.add_argument("--seed", type=int, default=0, help="with --pattern moving: the bursts' random sequence")
    p.add_argument("--interval", type=float, default=0.5, help="seconds between weight snapshots")
    p.add_argument("--passes", type=int, default=1, help="interleaved passes over every run")
    p.add_argument("--tf-pss-steps-per-execution", type=int, default=1)
    p.add_argument("--out", help="also write the JSON here")
    p.add_argument("--write-docs", action="store_true", help=f"rewrite the {SECTION} section of docs/benchmarks.md")
    p.add_argument("--from-json", help="with --write-docs: render this JSON file instead of running")
    args = p.parse_args(argv)

    if args.from_json:
        with open(args.from_json) as f:
            result = json.load(f)
        if args.write_docs:
            _common.replace_section(DOCS, _section(result), render_docs(result))
        print(json.dumps(result, indent=2))
        return 0
    if args.quick:
        systems = ["async", "mwms"]
        settings = [True]
    else:
        systems = [s for s in (args.systems or ",".join(SYSTEMS)).split(",") if s]
        settings = {"both": [True, False], "yes": [True], "no": [False]}[args.straggler]
    for s in systems:
        if s not in SYSTEMS:
            p.error(f"unknown system {s!r}; choose from {','.join(SYSTEMS)}")
    budget = args.budget_s or (30.0 if args.quick else 90.0)
    if args.burst_s <= 0:
        p.error("--burst-s must be > 0")
    PATTERN.update(kind=args.pattern, burst_s=args.burst_s, seed=args.seed)

    result: dict = {
        "benchmark": "stragglers_vs_peers",
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "command": "python " + shlex.join(["benchmarks/stragglers_vs_peers.py",
                                           *(argv if argv is not None else sys.argv[1:])]),
        "machine": _common.machine(), "versions": _common.package_versions(), "git": _common.git_info(ROOT),
        "systems": systems, "budget_s": budget, "target": args.target, "slowdown": args.slowdown,
        "passes": args.passes, "workers": NUM_WORKERS, "slow_worker": SLOW_WORKER, "pattern": dict(PATTERN),
        "tf_pss_steps_per_execution": args.tf_pss_steps_per_execution,
        "task": f"latent {_teacher.LATENT} -> tanh projection to {_teacher.DIM} features, linear teacher on the "
                f"latent ({_teacher.CLASSES} classes), a fresh stream per worker, {_teacher.HELDOUT} held out; MLP "
                f"784-256-256-10, Adam {_teacher.LEARNING_RATE:g}, batch {_common.BATCH} per worker",
        "runs": [],
    }
    children = _common.Children()
    root = tempfile.mkdtemp(prefix="stragglers-vs-peers-")
    result["log_dir"] = root
    try:
        for n in range(args.passes):
            for straggler in settings:
                for system in systems:
                    work = os.path.join(root, f"p{n}-{system}-{'slow' if straggler else 'even'}")
                    print(f"pass {n + 1}/{args.passes}: {system}, straggler={straggler}", file=sys.stderr,
                          flush=True)
                    try:
                        row = run_one(system, straggler, budget, args.slowdown, args.target, args.interval, work,
                                      children, args.tf_pss_steps_per_execution)
                    except Exception as e:  # noqa: BLE001 - one failed run is reported, the others still run
                        children.stop_all()
                        row = {"system": system, "straggler": straggler, "error": f"{type(e).__name__}: {e}"[-3000:]}
                        print(f"  failed: {row['error'][-600:]}", file=sys.stderr, flush=True)
                    else:
                        print(f"  time to {args.target}: {row['time_to_target_s']} s, final accuracy "
                              f"{row['final_accuracy']}", file=sys.stderr, flush=True)
                    row["pass"] = n
                    result["runs"].append(row)
    finally:
        children.stop_all()
    result["summary"] = summarize(result["runs"], budget)
    failed = result["summary"]["failed_runs"]
    text = json.dumps(result, indent=2)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    if args.write_docs:
        _common.replace_section(DOCS, _section(result), render_docs(result))
    print(text)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
