"""Bandwidth-limited benchmark: tfdist PS (1 and 2 PS hosts) vs all-reduce on emulated hosts with capped links.

Prints one JSON document. Every task runs on its own emulated host — a Linux
network namespace of a :class:`tfdist.testing.NetnsCluster`, joined by a
bridge — and every host's link is capped in both directions with ``tc ... tbf``
(100 Mbit/s and 1 Gbit/s by default). For 2 and 4 worker hosts it trains the
CNN of ``benchmarks/ps_throughput.py`` (2.16 M parameters, 8.6 MB of float32)
on synthetic data, batch 64 per worker, Adam, with

* ``ps1``       — ``tfdist.ParameterServerStrategy`` (async, the defaults of the
  PS benchmark: greedy placement, variables over 1 MiB split over the PS
  tasks), 1 PS host;
* ``ps2``       — the same with 2 PS hosts (the 8 MB dense kernel is split);
* ``allreduce`` — ``tfdist.AllReduceStrategy`` (TF collective ring all-reduce
  of one concatenated gradient per step, no straggler detector);
* ``mwms``      — TF's ``MultiWorkerMirroredStrategy`` with Keras 3 ``fit``
  and the two Keras 3.15 work-arounds of DESIGN.md §1 patched into the worker
  script (``benchmarks/ps_workers/keras_worker.py``), the baseline.

Throughput is timed inside each worker at batch ends after a warm-up and
summed over workers, as in the PS benchmark. Bytes are read from the kernel's
counters of each host's ``eth0`` (``/sys/class/net/eth0/statistics``), the
same way for every strategy: each worker reads its own at the two batch ends
that bound its timed window; the PS hosts' counters are sampled by this script
(``ip -n NS -s link``) every 0.25 s and interpolated to the window all workers
were timing. Before the training runs, a TCP transfer between two capped hosts
measures what the cap really lets through.

Every worker process gets the same TensorFlow intra-op threads
(cores // workers, at least 1), whatever the strategy.

Usage::

    python benchmarks/multihost.py [--quick] [--rates 100mbit,1gbit] [--workers 2,4]
        [--configs ps1,ps2,allreduce,mwms] [--warmup N] [--steps N] [--out FILE] [--write-docs]
    python benchmarks/multihost.py --from-json FILE --write-docs   # re-render the docs section

Needs root (network namespaces) and iproute2; exits 2 saying why otherwise.
The default matrix (2 rates x 2 worker counts x 4 configurations) took 10-15
minutes on 2 shared cores, ``--quick`` (100 Mbit/s, 2 workers, few steps) about 1.5.
Every namespace and process is removed when the script ends, also on errors.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shlex
import subprocess
import sys
import tempfile
import threading
import time
import traceback

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from benchmarks import _common  # noqa: E402

WORKER = os.path.join(ROOT, "benchmarks", "ps_workers", "keras_worker.py")
DOCS = os.path.join(ROOT, "docs", "benchmarks.md")
SECTION = "multihost"  # the marked section of docs/benchmarks.md this script rewrites
MODEL = "cnn"
PORT = 2222  # every host has its own address: every task uses the same port
TOKEN = "multihost-benchmark-token"

CONFIGS = ("ps1", "ps2", "allreduce", "mwms")
CONFIG_LABELS = {
    "ps1": "tfdist PS (async), 1 PS host",
    "ps2": "tfdist PS (async), 2 PS hosts",
    "allreduce": "tfdist AllReduceStrategy",
    "mwms": "TF MWMS (Keras 3, patched)",
}
RATES_FULL = ("100mbit", "1gbit")
WORKERS_FULL = (2, 4)
#: (warm-up steps, timed steps per worker) below 1 Gbit/s and from 1 Gbit/s on (faster steps: more of them,
#: so that the timed windows last long enough to overlap and to average over the exchanges).
STEPS_FULL = (3, 10)
STEPS_FULL_FAST = (5, 40)
STEPS_QUICK = (2, 3)
#: Seconds between two samples of the PS hosts' byte counters.
SAMPLE_INTERVAL_S = 0.25


def rate_bits_per_s(rate: str) -> float:
    """``"100mbit"`` -> 1e8 (the ``tc`` units this script uses: kbit, mbit, gbit)."""
    for unit, factor in (("gbit", 1e9), ("mbit", 1e6), ("kbit", 1e3)):
        if rate.endswith(unit):
            return float(rate[: -len(unit)]) * factor
    raise ValueError(f"Unknown rate {rate!r}. Use tc units, e.g. 100mbit or 1gbit.")


def tbf_burst(rate: str) -> str:
    """Bucket size for ``rate``: 2 ms worth of bytes, at least 32 KB (1 Gbit/s needs more than 32 KB)."""
    return f"{max(32, int(rate_bits_per_s(rate) / 8 * 0.002 / 1024))}kb"


def _base_env(threads: int) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG" and not k.startswith("TFDIST_")}
    env.update(TF_CPP_MIN_LOG_LEVEL="2", PYTHONUNBUFFERED="1", TF_NUM_INTRAOP_THREADS=str(threads),
               PYTHONPATH=os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p))
    return env


def _load() -> float:
    return round(os.getloadavg()[0], 2)


# ------------------------------------------------------------- link check ----------

_RECEIVER = """
import json, socket, time
s = socket.create_server(("0.0.0.0", 5000)); print("listening", flush=True)
c, _ = s.accept(); n = 0; first = None
while True:
    b = c.recv(1 << 20)
    if not b: break
    if first is None: first = time.perf_counter()
    n += len(b)
print(json.dumps({"bytes": n, "seconds": time.perf_counter() - first}), flush=True)
"""
_SENDER = """
import socket, sys
c = socket.create_connection((sys.argv[1], 5000), timeout=60); chunk = bytes(1 << 20)
for _ in range(int(sys.argv[2])): c.sendall(chunk)
c.close()
"""


def link_check(rate: str | None, timeout: float = 60.0) -> dict:
    """Throughput of one TCP stream between two hosts whose links are capped at ``rate`` (None: uncapped)."""
    from tfdist.testing import NetnsCluster

    mib = 200 if rate is None else max(4, int(rate_bits_per_s(rate) / 8 * 1.5 / 2**20))  # ~1.5 s at the cap
    with NetnsCluster(["a", "b"]) as net:
        if rate:
            for h in ("a", "b"):
                net.cap(h, rate=rate, burst=tbf_burst(rate))
        net.run("b", "receiver", [sys.executable, "-c", _RECEIVER])
        net.wait_for_output("receiver", "listening", 30)
        net.run("a", "sender", [sys.executable, "-c", _SENDER, net.address("b"), str(mib)])
        codes = net.wait(["sender", "receiver"], timeout)
        if codes != {"sender": 0, "receiver": 0}:
            raise RuntimeError(f"link check at {rate} failed: {codes}\n{net.describe()}")
        got = json.loads(net.log("receiver").strip().splitlines()[-1])
    return {"rate": rate or "uncapped", "burst": tbf_burst(rate) if rate else None, "mib": mib,
            "measured_mbit_per_s": round(8 * got["bytes"] / got["seconds"] / 1e6, 1)}


# --------------------------------------------------------------- counters ----------


class CounterSampler:
    """Samples ``(time.time(), tx_bytes, rx_bytes)`` of ``eth0`` in some namespaces, in a thread."""

    def __init__(self, namespaces: dict[str, str], interval_s: float = SAMPLE_INTERVAL_S):
        self.namespaces = namespaces  # host -> namespace
        self.interval_s = interval_s
        self.samples: dict[str, list[tuple[float, int, int]]] = {h: [] for h in namespaces}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="net-counters", daemon=True)

    @staticmethod
    def read(namespace: str) -> tuple[int, int]:
        out = subprocess.run(["ip", "-n", namespace, "-j", "-s", "link", "show", "dev", "eth0"],
                             capture_output=True, text=True, timeout=10, check=True).stdout
        stats = json.loads(out)[0]["stats64"]
        return stats["tx"]["bytes"], stats["rx"]["bytes"]

    def _run(self) -> None:
        while not self._stop.is_set():
            for host, ns in self.namespaces.items():
                try:
                    tx, rx = self.read(ns)
                except (subprocess.SubprocessError, OSError, ValueError, KeyError, IndexError):
                    continue  # the namespace is going away
                self.samples[host].append((time.time(), tx, rx))
            self._stop.wait(self.interval_s)

    def start(self) -> "CounterSampler":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=15)

    def at(self, host: str, t: float) -> tuple[float, float] | None:
        """``(tx, rx)`` of ``host`` at wall time ``t``, linearly interpolated; None outside the samples."""
        s = self.samples[host]
        for (t0, tx0, rx0), (t1, tx1, rx1) in zip(s, s[1:]):
            if t0 <= t <= t1:
                f = (t - t0) / (t1 - t0) if t1 > t0 else 0.0
                return tx0 + f * (tx1 - tx0), rx0 + f * (rx1 - rx0)
        return None


# --------------------------------------------------------------- training ----------


def _hosts(config: str, workers: int) -> dict[str, str]:
    """Task -> host of one configuration."""
    ps = {"ps1": 1, "ps2": 2}.get(config, 0)
    hosts = {f"ps:{i}": f"ps{i}" for i in range(ps)}
    hosts.update({f"worker:{i}": f"w{i}" for i in range(workers)})
    return hosts


def _start_tasks(net, config: str, hosts: dict[str, str], args: list[str], threads: int) -> None:
    from tfdist.config import ClusterConfig, JobConfig, parse_task
    from tfdist.cluster.local import task_environment

    cluster: dict[str, list[str]] = {}
    for task, host in hosts.items():
        cluster.setdefault(task.split(":")[0], []).append(f"{net.address(host)}:{PORT}")
    base = _base_env(threads)
    if config in ("ps1", "ps2"):
        job = JobConfig(name=f"bench-multihost-{config}")
        job.cluster = ClusterConfig(**cluster)
        job.ps.placement = "greedy"  # the PS benchmark's settings
        job.ps.partition_threshold_bytes = 1024 * 1024
        # Every step's update crosses the link (the default, exchange_every: auto, may hold steps when the
        # exchange costs CPU; on a capped link it mostly waits, not computes): bytes per step compare with all-reduce.
        job.strategy.exchange_every = 1
        for task, host in hosts.items():  # PS tasks first: the workers wait for them anyway
            spec = parse_task(task)
            env = task_environment(job, spec, TOKEN, base=base)
            argv = ([sys.executable, "-m", "tfdist.ps"] if spec.job == "ps"
                    else [sys.executable, WORKER, "--mode", "tfdist", *args])
            net.run(host, task, argv, env=env)
    else:
        for task, host in hosts.items():
            tf_config = json.dumps({"cluster": cluster, "task": {"type": "worker", "index": int(task.split(":")[1])}})
            net.run(host, task, [sys.executable, WORKER, "--mode", config, *args], env={**base, "TF_CONFIG": tf_config})


def run_config(config: str, workers: int, rate: str, warmup: int, steps: int, timeout: float, log_dir: str) -> dict:
    """One training run: ``workers`` worker hosts (+ PS hosts) with every link capped at ``rate``."""
    from tfdist.testing import NetnsCluster

    hosts = _hosts(config, workers)
    out = tempfile.mkdtemp(prefix=f"{config}-{workers}w-{rate}-", dir=log_dir)
    threads = max(1, (os.cpu_count() or 1) // workers)
    args = ["--model", MODEL, "--out", out, "--warmup", str(warmup), "--steps", str(steps), "--net-iface", "eth0",
            "--start-barrier", out, "--num-workers", str(workers)]
    worker_tasks = [t for t in hosts if t.startswith("worker:")]
    ps_tasks = [t for t in hosts if t.startswith("ps:")]
    start = time.monotonic()
    with NetnsCluster(list(hosts.values()), log_dir=out) as net:
        for host in hosts.values():
            net.cap(host, rate=rate, burst=tbf_burst(rate))
        sampler = CounterSampler({hosts[t]: net.host(hosts[t]).namespace for t in ps_tasks}).start()
        try:
            _start_tasks(net, config, hosts, args, threads)
            codes = net.wait(worker_tasks, timeout)
            if any(c != 0 for c in codes.values()):
                raise RuntimeError(f"exit codes {codes} (None: still running after {timeout:g} s)\n"
                                   + net.describe(lines=25))
        finally:
            sampler.stop()
    per = []
    for i in range(workers):
        with open(os.path.join(out, f"worker-{i}.json")) as f:
            per.append(json.load(f))
    return summarize(per, sampler, [hosts[t] for t in ps_tasks], rate, threads, time.monotonic() - start)


def summarize(per: list[dict], sampler: CounterSampler, ps_hosts: list[str], rate: str, threads: int,
              wall_s: float) -> dict:
    """Throughput, bytes per step and link use of one run, from the workers' results and the PS samples."""
    steps_per_s = sum(w["steps_per_s"] for w in per)
    row = {
        "ok": True,
        "examples_per_s": sum(w["examples_per_s"] for w in per),
        "steps_per_s": steps_per_s,
        "per_worker_examples_per_s": [round(w["examples_per_s"], 1) for w in per],
        "cpu_ms_per_step": [round(w["cpu_ms_per_step"], 1) for w in per],
        "warmup_steps": per[0]["warmup_steps"],
        "timed_steps_per_worker": per[0]["timed_steps"],
        "params": per[0]["params"],
        "intra_op_threads": threads,
        "run_wall_s": round(wall_s, 1),
    }
    # Worker hosts: tx + rx of their own eth0 over their own timed window, per step of theirs.
    row["worker_tx_bytes_per_step"] = [round(w["net"]["tx_bytes"] / w["timed_steps"]) for w in per]
    row["worker_rx_bytes_per_step"] = [round(w["net"]["rx_bytes"] / w["timed_steps"]) for w in per]
    row["worker_bytes_per_step"] = sum(w["net"]["bytes_per_step"] for w in per) / len(per)
    cap_bytes_per_s = rate_bits_per_s(rate) / 8
    # Busiest direction of a worker's link, as a share of the cap.
    row["worker_link_use"] = [round(max(w["net"]["tx_bytes"], w["net"]["rx_bytes"]) / w["seconds"] / cap_bytes_per_s, 3)
                              for w in per]
    if "sync_stats" in per[0]:
        row["sync_ms_per_step"] = [round(w["sync_ms_per_step"], 1) for w in per]
    # PS hosts: their counters over the window every worker was timing, per step of all workers together.
    lo, hi = max(w["wall_window"][0] for w in per), min(w["wall_window"][1] for w in per)
    # Share of the longest timed window during which every worker was timing (1: they ran side by side).
    row["timed_window_overlap"] = round(max(hi - lo, 0.0) / max(w["wall_window"][1] - w["wall_window"][0] for w in per), 3)
    window = "common"
    if hi - lo < 0.5:  # the workers' windows hardly overlap: use their union
        lo, hi, window = min(w["wall_window"][0] for w in per), max(w["wall_window"][1] for w in per), "union"
    ps_rows = []
    for host in ps_hosts:
        a, b = sampler.at(host, lo), sampler.at(host, hi)
        if a is None or b is None:
            ps_rows.append(None)
            continue
        tx, rx = (b[0] - a[0]) / (hi - lo), (b[1] - a[1]) / (hi - lo)  # bytes/s
        ps_rows.append({"tx_bytes_per_step": round(tx / steps_per_s), "rx_bytes_per_step": round(rx / steps_per_s),
                        "bytes_per_step": round((tx + rx) / steps_per_s),
                        "link_use": round(max(tx, rx) / cap_bytes_per_s, 3)})
    if ps_hosts:
        row["ps_hosts"] = ps_rows
        row["ps_window"] = {"kind": window, "seconds": round(hi - lo, 2),
                            "samples": [len(sampler.samples[h]) for h in ps_hosts]}
    return row


def ratios(configs: dict) -> dict:
    """Examples/s ratios of one (rate, workers) cell: tfdist vs the MWMS baseline, and 2 PS vs 1 PS hosts."""
    ok = {k: v["examples_per_s"] for k, v in configs.items() if v.get("ok")}
    out = {}
    pairs = [("ps1", "mwms"), ("ps2", "mwms"), ("allreduce", "mwms"), ("ps2", "ps1"), ("ps2", "allreduce"),
             ("ps1", "allreduce")]
    for a, b in pairs:
        if a in ok and b in ok:
            out[f"{a}_vs_{b}"] = round(ok[a] / ok[b], 3)
    return out


def bench(rates, worker_counts, configs, steps_by_rate, timeout, log_dir) -> dict:
    cells = {}
    for rate in rates:
        for n in worker_counts:
            cell = {}
            for config in configs:
                load = _load()
                try:
                    row = run_config(config, n, rate, *steps_by_rate[rate], timeout, log_dir)
                except Exception as exc:  # one failed run must not lose the others' numbers
                    row = {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:4000],
                           "traceback": traceback.format_exc()[-4000:]}
                row["load_1min_at_start"] = load
                cell[config] = row
                print(f"multihost: {rate} {n}w {config}: "
                      + (f"{row['examples_per_s']:.0f} examples/s, {row['worker_bytes_per_step'] / 1e6:.1f} MB/step "
                         f"per worker host" if row["ok"] else row["error"].splitlines()[0]),
                      file=sys.stderr, flush=True)
            cells[f"{rate}/{n}w"] = {"rate": rate, "workers": n, "configs": cell, "ratios": ratios(cell)}
    return cells


# -------------------------------------------------------------- analysis ----------


def analysis(result: dict) -> list[str]:
    """Plain statements about the measured cells (what is bounded by what)."""
    notes = []
    for key, cell in result.get("cells", {}).items():
        c, r = cell["configs"], cell["ratios"]
        if "ps2_vs_ps1" in r:
            ps1_use = max((p or {}).get("link_use", 0) for p in c["ps1"].get("ps_hosts", [None]))
            notes.append(f"{key}: 2 PS hosts give {r['ps2_vs_ps1']:.2f}x the examples/s of 1 PS host; the single PS "
                         f"host's busiest direction ran at {ps1_use:.0%} of the cap.")
        best = max((k for k in c if c[k].get("ok")), key=lambda k: c[k]["examples_per_s"], default=None)
        if best:
            notes.append(f"{key}: fastest is {best} ({c[best]['examples_per_s']:.0f} examples/s).")
    return notes


# ------------------------------------------------------------------- docs ----------


def _mb(x) -> str:
    return "—" if x is None else f"{x / 1e6:.1f}"


def render_docs(result: dict) -> str:
    """The Markdown of the multihost section, from a result of this script."""
    m, v = result["machine"], result["versions"]
    lines = [
        "",
        "## Bandwidth-limited multi-host (`benchmarks/multihost.py`)",
        "",
        f"Measured {result['date']} on {m.get('cpus')} CPU cores ({m.get('cpu', 'unknown CPU')}, "
        f"{m.get('mem_gib', '?')} GiB), {m.get('platform')}, Python {m.get('python')}, "
        f"TensorFlow {v.get('tensorflow')}, Keras {v.get('keras')}, grpcio {v.get('grpcio')}; "
        f"code: {result['git'].get('commit')}"
        + (f" + {result['git']['modified_tracked_files']} modified files" if result["git"].get("modified_tracked_files") else "")
        + f". 1-minute load {result['load']['at_start']} at the start, {result['load'].get('at_end')} at the end.",
        "",
        "Command:",
        "",
        "```",
        result["command"],
        "```",
        "",
    ]
    links = result.get("link_check") or []
    if links:
        lines += ["What the caps let through (one TCP stream between two capped hosts, `tc tbf`, burst as given):",
                  "", "| cap | burst | measured Mbit/s |", "|---|---|---:|"]
        lines += [f"| {x['rate']} | {x['burst'] or '—'} | {x['measured_mbit_per_s']:,.0f} |" for x in links]
        lines.append("")
    steps = "; ".join(f"{r}: warm-up {w} steps, {n} timed steps per worker" for r, (w, n) in result["steps"].items())
    lines += [
        f"The PS benchmark's {_common.MODELS[MODEL][1]}, batch 64 per worker, Adam; "
        f"{steps}; the workers wait for each other at the end of their first step (so that their timed windows "
        "overlap: *overlap* is the share of the longest window during which all were timing); one run per row. "
        "Every host (worker and PS) "
        "is a network namespace whose link is capped in both directions. examples/s is summed over workers. "
        "Bytes are the kernel's counters of the hosts' `eth0`: *worker MB/step* is tx + rx of a worker host "
        "per step of its own (mean over workers); *PS MB/step* is tx + rx of each PS host per step of all "
        "workers together; *link use* is the busier direction of the busiest host's link, as a share of the cap "
        "(PS host for the PS rows, a worker for all-reduce); *vs* columns divide examples/s by the baseline's in the "
        "same cell; CPU is each worker process's CPU time per step (all threads); load is the 1-minute load average "
        "when the row started.",
        "",
        "| cap | workers | configuration | examples/s | worker MB/step (tx / rx) | PS MB/step per host | link use | "
        "vs MWMS | vs AllReduce | CPU ms/step per worker | overlap | load |",
        "|---|---:|---|---:|---|---|---:|---:|---:|---|---:|---:|",
    ]
    for key, cell in result.get("cells", {}).items():
        c = cell["configs"]
        base = {k: c[k]["examples_per_s"] for k in ("mwms", "allreduce") if c.get(k, {}).get("ok")}
        for name, row in c.items():
            prefix = f"| {cell['rate']} | {cell['workers']} | {CONFIG_LABELS[name]} |"
            if not row.get("ok"):
                err = row.get("error", "").splitlines()[0][:140].replace("|", "\\|")
                lines.append(f"{prefix} failed | `{err}` | | | | | | | {row.get('load_1min_at_start')} |")
                continue
            tx = sum(row["worker_tx_bytes_per_step"]) / len(row["worker_tx_bytes_per_step"])
            rx = sum(row["worker_rx_bytes_per_step"]) / len(row["worker_rx_bytes_per_step"])
            ps = row.get("ps_hosts")
            ps_text = ", ".join(_mb(p["bytes_per_step"]) if p else "—" for p in ps) if ps else "—"
            uses = [p["link_use"] for p in ps or [] if p] or row["worker_link_use"]
            vs = [f"{row['examples_per_s'] / base[b]:.2f}" if b in base and b != name else "" for b in ("mwms", "allreduce")]
            lines.append(
                f"{prefix} {row['examples_per_s']:,.0f} | {_mb(row['worker_bytes_per_step'])} ({_mb(tx)} / {_mb(rx)}) "
                f"| {ps_text} | {max(uses):.0%} | {vs[0]} | {vs[1]} | "
                f"{', '.join(f'{x:.0f}' for x in row['cpu_ms_per_step'])} | {row.get('timed_window_overlap', 1.0):.2f} "
                f"| {row.get('load_1min_at_start')} |")
    lines.append("")
    if result.get("notes"):
        lines += ["Computed from this run:", ""] + [f"- {n}" for n in result["notes"]] + [""]
    return "\n".join(lines)


def write_docs(result: dict, path: str = DOCS) -> None:
    """Rewrites only the text between the multihost markers of ``path``."""
    _common.replace_section(path, SECTION, render_docs(result))


# ------------------------------------------------------------------- main ----------


def _csv(text: str) -> list[str]:
    return [x for x in text.split(",") if x]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="smoke version: 100mbit, 2 workers, few steps (~2 minutes)")
    p.add_argument("--rates", help="comma-separated tc rates of every host's link (default 100mbit,1gbit; quick 100mbit)")
    p.add_argument("--workers", help="comma-separated worker-host counts (default 2,4; quick 2)")
    p.add_argument("--configs", default=",".join(CONFIGS), help=f"subset of {','.join(CONFIGS)}")
    p.add_argument("--warmup", type=int, help=f"warm-up steps per worker (default {STEPS_FULL[0]}, from 1gbit on "
                   f"{STEPS_FULL_FAST[0]}, quick {STEPS_QUICK[0]}); the first ends at a barrier of all workers")
    p.add_argument("--steps", type=int, help=f"timed steps per worker (default {STEPS_FULL[1]}, from 1gbit on "
                   f"{STEPS_FULL_FAST[1]}, quick {STEPS_QUICK[1]})")
    p.add_argument("--timeout", type=float, default=240.0, help="bound on each training run, seconds (default 240)")
    p.add_argument("--no-link-check", action="store_true", help="skip the TCP transfer that measures each cap")
    p.add_argument("--out", help="also write the JSON here")
    p.add_argument("--write-docs", action="store_true", help="rewrite the multihost section of docs/benchmarks.md")
    p.add_argument("--from-json", help="with --write-docs: render this JSON file instead of running")
    args = p.parse_args(argv)

    if args.from_json:
        with open(args.from_json) as f:
            result = json.load(f)
        if args.write_docs:
            write_docs(result)
        print(json.dumps(result, indent=2))
        return 0

    rates = _csv(args.rates) if args.rates else list(("100mbit",) if args.quick else RATES_FULL)
    workers = [int(n) for n in _csv(args.workers)] if args.workers else list((2,) if args.quick else WORKERS_FULL)
    configs = _csv(args.configs)
    for c in configs:
        if c not in CONFIGS:
            p.error(f"unknown config {c!r}; choose from {','.join(CONFIGS)}")
    for r in rates:
        try:
            rate_bits_per_s(r)
        except ValueError as exc:
            p.error(str(exc))
    steps_by_rate = {}
    for r in rates:
        default = STEPS_QUICK if args.quick else STEPS_FULL_FAST if rate_bits_per_s(r) >= 1e9 else STEPS_FULL
        steps_by_rate[r] = [args.warmup or default[0], args.steps or default[1]]
        if steps_by_rate[r][0] < 1:
            p.error(f"--warmup must be >= 1 (the first step traces the model). Received: --warmup {args.warmup}.")

    from tfdist.testing import NetnsCluster

    reason = NetnsCluster.unavailable_reason()
    if reason is not None:
        print(f"benchmarks/multihost.py needs network namespaces: {reason}. Run it as root on Linux with iproute2.",
              file=sys.stderr)
        return 2

    result: dict = {
        "benchmark": "multihost",
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "command": "python " + shlex.join(["benchmarks/multihost.py", *(argv if argv is not None else sys.argv[1:])]),
        "quick": args.quick,
        "machine": _common.machine(),
        "versions": _common.package_versions(("tensorflow", "keras", "grpcio", "numpy")),
        "git": _common.git_info(ROOT),
        "load": {"at_start": _load()},
        "model": MODEL,
        "batch_per_worker": _common.BATCH,
        "steps": steps_by_rate,  # rate -> [warm-up steps, timed steps per worker]
        "rates": rates,
        "workers": workers,
        "configs": configs,
    }
    log_dir = tempfile.mkdtemp(prefix="multihost-bench-")
    result["log_dir"] = log_dir
    start = time.monotonic()
    if not args.no_link_check:
        result["link_check"] = [link_check(r) for r in rates] + ([] if args.quick else [link_check(None)])
    result["cells"] = bench(rates, workers, configs, steps_by_rate, args.timeout, log_dir)
    result["wall_s"] = round(time.monotonic() - start, 1)
    result["load"]["at_end"] = _load()
    result["notes"] = analysis(result)
    text = json.dumps(result, indent=2)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    if args.write_docs:
        write_docs(result)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
