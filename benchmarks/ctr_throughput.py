"""CTR throughput benchmark: 2 workers + 2 PS, tfdist vs TF's ParameterServerStrategy, on examples/train_ctr.py's model.

Prints one JSON document. Issue #14 item 6: "2 workers + 2 PS throughput on
the CTR model vs TF PSS; target: CTR throughput >= 1.3x TF PSS on the same
job". The job is ``examples/train_ctr.py``'s (its data and model functions
are imported, not copied): wide and deep on synthetic Criteo-like data
(26 categorical features with power-law ids, 13 dense), one width-1 and one
width-``--emb-dim`` table shared by the features (per-feature offsets),
an MLP 128-64, Adagrad(0.05), binary cross-entropy, ``keras.metrics.AUC``,
``--batch`` examples per step on each worker, each worker its own examples.

* ``tfdist`` — ``tfdist.testing.LocalCluster`` with 2 workers + 2 PS
  (separate processes on 127.0.0.1), ``tfdist.ParameterServerStrategy()``
  with its defaults (async), the tables ``tfdist.layers.ShardedEmbedding``
  (PS-resident, row ``i`` on PS ``i % 2``) as the example builds them,
  Keras 3 ``fit`` (``steps_per_execution`` 1, Keras's default). Each worker
  times its steps at batch ends after ``--warmup`` steps
  (``benchmarks/ps_workers/ctr_worker.py``); throughput is the sum of the
  workers' examples/s.
* ``tf_pss`` — TF's ``tf.distribute.ParameterServerStrategy`` with tf-keras
  (``TF_USE_LEGACY_KERAS=1``), 2 PS + 2 worker ``tf.distribute.Server``
  processes + a coordinator (``benchmarks/ps_workers/tfpss_server.py``,
  ``tfpss_ctr_coordinator.py``), the same model with tf-keras ``Embedding``
  tables as PS variables partitioned by rows over the 2 PS
  (``MinSizePartitioner(256 KiB, max_shards=2)``, TF's tutorial setting),
  ``steps_per_execution`` ``--tfpss-steps-per-execution`` (default 1,
  tf-keras's default), timed between epoch ends (tf-keras refuses batch
  callbacks under PSS): an epoch of ``workers x --steps`` steps, after a
  warm-up epoch of the same length.

The configurations are interleaved over ``--passes`` passes (ABBA order:
the second pass runs them in reverse), each run in fresh processes. The
driver samples the CPU time of every process of a run four times a second and
reports each role's CPU seconds per step over the timed window (where the
time goes on a machine of few cores), plus the load average before and
after each run. Every child process is killed when a run ends, also on
errors or timeouts.

Usage::

    python benchmarks/ctr_throughput.py [--scale small] [--passes 4] [--warmup 20] [--steps 300]
        [--configs tfdist,tf_pss] [--batch 256] [--tfpss-steps-per-execution 1] [--out FILE] [--timeout S]
"""

from __future__ import annotations

import argparse
import bisect
import datetime
import importlib.util
import json
import os
import sys
import tempfile
import threading
import time
import traceback

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from benchmarks import _common  # noqa: E402

WORKER = os.path.join(ROOT, "benchmarks", "ps_workers", "ctr_worker.py")
TFPSS_SERVER = os.path.join(ROOT, "benchmarks", "ps_workers", "tfpss_server.py")
TFPSS_COORDINATOR = os.path.join(ROOT, "benchmarks", "ps_workers", "tfpss_ctr_coordinator.py")
CONFIGS = ("tfdist", "tf_pss", "tfdist_grpc", "tfdist_every1", "tfdist_tcp")
WORKERS, PS = 2, 2
#: Seconds the TF PSS coordinator may take to exit once its result is written (then it is killed).
COORDINATOR_EXIT_GRACE_S = 30.0
#: Issue #14's target: tfdist's CTR throughput / TF PSS's.
TARGET_RATIO = 1.3


def _env() -> dict:
    env = dict(os.environ)
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    env["PYTHONUNBUFFERED"] = "1"
    env.pop("TF_CONFIG", None)
    env.pop("TFDIST_CONFIG", None)
    return env


class CpuSampler:
    """Samples the CPU seconds (user + system) of named processes four times a second, in a thread."""

    def __init__(self, interval: float = 0.25):
        import psutil

        self._psutil = psutil
        self.interval = interval
        self.pids: dict[str, int] = {}
        self.samples: dict[str, list[tuple[float, float]]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="cpu-sampler", daemon=True)

    def __enter__(self) -> "CpuSampler":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def watch(self, role: str, pid: int | None) -> None:
        if pid:
            self.pids[role] = pid

    def _run(self) -> None:
        procs: dict[int, object] = {}
        while not self._stop.wait(self.interval):
            for role, pid in list(self.pids.items()):
                try:
                    proc = procs.get(pid) or procs.setdefault(pid, self._psutil.Process(pid))
                    t = proc.cpu_times()
                    self.samples.setdefault(role, []).append((time.time(), t.user + t.system))
                except (self._psutil.NoSuchProcess, self._psutil.AccessDenied, self._psutil.ZombieProcess):
                    pass

    def cpu_seconds(self, role: str, start: float, end: float) -> float | None:
        """CPU seconds ``role`` used between wall times ``start`` and ``end`` (linear between samples)."""
        s = self.samples.get(role, [])
        if len(s) < 2 or start < s[0][0] or end > s[-1][0]:
            return None
        times = [t for t, _ in s]

        def at(w: float) -> float:
            i = min(max(bisect.bisect_left(times, w), 1), len(s) - 1)
            (t0, c0), (t1, c1) = s[i - 1], s[i]
            return c0 + (c1 - c0) * (w - t0) / max(t1 - t0, 1e-9)

        return at(end) - at(start)


def cpu_per_step(sampler: CpuSampler, window: tuple[float, float], steps: int) -> dict:
    """Each role's CPU seconds per step (all workers' steps) over the wall-time window."""
    out = {}
    for role in sorted(sampler.pids):
        cpu = sampler.cpu_seconds(role, *window)
        out[role] = None if cpu is None else round(cpu / steps * 1e3, 2)
    total = [v for v in out.values() if v is not None]
    return {"pids": dict(sampler.pids), "ms_cpu_per_step": out,
            "ms_cpu_per_step_all": round(sum(total), 2) if len(total) == len(out) else None,
            "window_s": round(window[1] - window[0], 2)}


def run_tfdist(args, run_dir: str, children: _common.Children, transport: str = "auto",
               exchange_every: int | str | None = None, shared_memory: bool = True) -> dict:
    from tfdist.config import JobConfig
    from tfdist.testing import LocalCluster

    config = JobConfig(name="ctr-throughput")  # defaults: async, round-robin placement, exchange_every auto
    config.ps.transport = transport
    config.ps.shared_memory = shared_memory
    config.strategy.exchange_every = exchange_every
    config.launch.max_restarts = 0  # a failed run is reported, not retried
    argv = ["--scale", args.scale, "--out-dir", run_dir, "--batch", str(args.batch), "--emb-dim", str(args.emb_dim),
            "--warmup", str(args.warmup), "--steps", str(args.steps)]
    with CpuSampler() as sampler, LocalCluster(workers=WORKERS, ps=PS, config=config,
                                               log_dir=os.path.join(run_dir, "logs")) as cluster:
        cluster.start(WORKER, argv)
        for task in [*(f"ps:{i}" for i in range(PS)), *(f"worker:{i}" for i in range(WORKERS))]:
            sampler.watch(task, cluster.process(task).pid)
        cluster.wait(args.timeout)
        time.sleep(sampler.interval * 2)  # PS tasks still run: a sample after the window
    workers = []
    for i in range(WORKERS):
        with open(os.path.join(run_dir, f"worker-{i}.json")) as f:
            workers.append(json.load(f))
    window = (min(w["window_wall"][0] for w in workers), max(w["window_wall"][1] for w in workers))
    steps = WORKERS * args.steps
    return {
        "examples_per_s": sum(w["examples_per_s"] for w in workers),
        "examples_per_s_over_union_window": steps * args.batch / (window[1] - window[0]),
        "timed_steps": steps, "warmup_steps_per_worker": args.warmup,
        "per_worker": [{k: w[k] for k in ("worker", "examples_per_s", "seconds", "ms_per_step", "median_ms_per_step",
                                          "p90_ms_per_step", "cpu_s_per_step", "sync_stats_per_step",
                                          "ps_metrics_last", "loss_last", "max_rss_mb", "build_s")}
                       for w in workers],
        **cpu_per_step(sampler, window, steps),
    }


def run_tf_pss(args, run_dir: str, children: _common.Children) -> dict:
    from tfdist.cluster.local import free_port

    ports: list[int] = []
    while len(ports) < 1 + PS + WORKERS:
        port = free_port()
        if port not in ports:
            ports.append(port)
    spec = {"chief": [f"127.0.0.1:{ports[0]}"], "ps": [f"127.0.0.1:{p}" for p in ports[1:1 + PS]],
            "worker": [f"127.0.0.1:{p}" for p in ports[1 + PS:]]}
    env = {**_env(), "TF_USE_LEGACY_KERAS": "1"}
    out = os.path.join(run_dir, "coordinator.json")
    steps = WORKERS * args.steps
    with CpuSampler() as sampler:
        servers = []
        for job, n in (("ps", PS), ("worker", WORKERS)):
            for i in range(n):
                proc = children.start([_common.python(), TFPSS_SERVER, "--cluster", json.dumps(spec), "--job", job,
                                       "--index", str(i)], env=env, log_path=os.path.join(run_dir, f"{job}-{i}.log"))
                sampler.watch(f"{job}:{i}", proc.pid)
                servers.append(proc)
        coordinator = children.start(
            [_common.python(), TFPSS_COORDINATOR, "--cluster", json.dumps(spec), "--scale", args.scale, "--out", out,
             "--batch", str(args.batch), "--emb-dim", str(args.emb_dim),
             "--examples-per-worker", str((args.warmup + args.steps) * args.batch),
             "--steps-per-epoch", str(steps), "--timed-epochs", "1",
             "--steps-per-execution", str(args.tfpss_steps_per_execution)],
            env=env, log_path=os.path.join(run_dir, "coordinator.log"))
        sampler.watch("coordinator", coordinator.pid)
        deadline = time.monotonic() + args.timeout
        written_at = None
        while coordinator.poll() is None and time.monotonic() < deadline:
            for s in servers:
                if s.poll() is not None:
                    raise RuntimeError(f"TF PSS server {s.args[4:]} exited with {s.returncode}:\n"
                                       f"{_common.log_tail(s)}")
            if written_at is None and os.path.exists(out):
                written_at = time.monotonic()
            elif written_at is not None and time.monotonic() - written_at > COORDINATOR_EXIT_GRACE_S:
                break  # its result is written; a coordinator stuck in its exit is stopped with the servers
            time.sleep(0.2)
        if coordinator.poll() is None and written_at is not None:
            exit_note = (f"the coordinator had not exited {COORDINATOR_EXIT_GRACE_S:g} s after writing its result: "
                         "killed")
        else:
            exit_note = None
            children.wait_all([coordinator], max(deadline - time.monotonic(), 0.1))
    with open(out) as f:
        result = json.load(f)
    if exit_note:
        result["note"] = exit_note
    result.update(cpu_per_step(sampler, tuple(result["window_wall"]), steps))
    return result


RUNNERS = {"tfdist": run_tfdist, "tf_pss": run_tf_pss,
           "tfdist_grpc": lambda args, run_dir, children: run_tfdist(args, run_dir, children, transport="grpc"),
           "tfdist_every1": lambda args, run_dir, children: run_tfdist(args, run_dir, children, exchange_every=1),
           "tfdist_tcp": lambda args, run_dir, children: run_tfdist(args, run_dir, children, shared_memory=False)}


def _per_pass_ratios(runs: list[dict], numerator: str, denominator: str) -> list[float]:
    """``numerator``'s examples/s over ``denominator``'s, per pass where both ran."""
    ratios = []
    for p in sorted({r["pass"] for r in runs}):
        got = {r["config"]: r.get("examples_per_s") for r in runs if r["pass"] == p}
        if got.get(numerator) and got.get(denominator):
            ratios.append(round(got[numerator] / got[denominator], 3))
    return ratios


def summarize(runs: list[dict], configs: list[str]) -> dict:
    """Mean examples/s per configuration, the per-pass ratio tfdist / TF PSS, and the target's verdict."""
    by_config = {c: [r["examples_per_s"] for r in runs if r["config"] == c and "examples_per_s" in r] for c in configs}
    out: dict = {"examples_per_s_mean": {c: round(sum(v) / len(v), 1) if v else None for c, v in by_config.items()}}
    if {"tfdist", "tf_pss"} <= set(configs):
        means = out["examples_per_s_mean"]
        ratio = round(means["tfdist"] / means["tf_pss"], 3) if means["tfdist"] and means["tf_pss"] else None
        out["ratio_tfdist_over_tf_pss_per_pass"] = _per_pass_ratios(runs, "tfdist", "tf_pss")
        out["ratio_tfdist_over_tf_pss"] = ratio
        out["target"] = {"min_ratio": TARGET_RATIO, "met": None if ratio is None else ratio >= TARGET_RATIO}
    if {"tfdist", "tfdist_grpc"} <= set(configs):  # the data plane's lean transport against gRPC, same run
        out["ratio_tfdist_over_tfdist_grpc_per_pass"] = _per_pass_ratios(runs, "tfdist", "tfdist_grpc")
    if {"tfdist", "tfdist_tcp"} <= set(configs):  # shared memory against loopback TCP, same run
        out["ratio_tfdist_over_tfdist_tcp_per_pass"] = _per_pass_ratios(runs, "tfdist", "tfdist_tcp")
    if {"tfdist", "tfdist_every1"} <= set(configs):  # exchange_every auto (the default) against every step
        out["ratio_tfdist_over_tfdist_every1_per_pass"] = _per_pass_ratios(runs, "tfdist", "tfdist_every1")
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--scale", default="small", help="train_ctr.py's --scale: tiny|small|full or a multiplier "
                   "(small: 1.06 M rows). Defaults to small.")
    p.add_argument("--passes", type=int, default=4, help="passes over the configurations (interleaved, ABBA). "
                   "Defaults to 4.")
    p.add_argument("--configs", default="tfdist,tf_pss",
                   help=f"comma-separated, of {list(CONFIGS)}. Defaults to tfdist,tf_pss; tfdist_grpc is tfdist with "
                        "ps.transport: grpc (the transport before, in the same run); tfdist_tcp with "
                        "ps.shared_memory: false")
    p.add_argument("--batch", type=int, default=256, help="examples per step on each worker (the example's)")
    p.add_argument("--emb-dim", type=int, default=16, help="width of the deep table (the example's)")
    p.add_argument("--warmup", type=int, default=20, help="warm-up steps per worker (tfdist; TF PSS: an epoch "
                   "as long as the timed one). Defaults to 20.")
    p.add_argument("--steps", type=int, default=300, help="timed steps per worker (TF PSS: an epoch of "
                   "workers x steps). Defaults to 300.")
    p.add_argument("--tfpss-steps-per-execution", type=int, default=1,
                   help="tf-keras compile(steps_per_execution=...) for TF PSS. Defaults to 1 (tf-keras's default).")
    p.add_argument("--timeout", type=float, default=900.0, help="bound on each run, seconds")
    p.add_argument("--out", help="also write the JSON here")
    args = p.parse_args(argv)
    configs = [c for c in args.configs.split(",") if c]
    unknown = set(configs) - set(CONFIGS)
    if unknown:
        p.error(f"--configs: unknown {sorted(unknown)}; use some of {list(CONFIGS)}")
    if args.warmup < 2:
        p.error(f"--warmup must be at least 2 (the first step ends in a barrier). Received: {args.warmup}")

    started = time.monotonic()
    result = {
        "benchmark": "ctr_throughput",
        "date_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M"),
        "command": "python benchmarks/ctr_throughput.py " + " ".join(sys.argv[1:] if argv is None else argv),
        "machine": _common.machine(), "versions": _common.package_versions(), "git": _common.git_info(ROOT),
        "job": {"model": "examples/train_ctr.py make_model(tables='shared'): wide (width 1) + deep "
                         f"(width {args.emb_dim}) tables, MLP 128-64, Adagrad(0.05), binary cross-entropy, AUC",
                "scale": args.scale, "batch_per_worker": args.batch, "workers": WORKERS, "ps": PS,
                "warmup_steps_per_worker": args.warmup, "timed_steps_per_worker": args.steps,
                "tfpss_steps_per_execution": args.tfpss_steps_per_execution},
        "configs": {"tfdist": "tfdist.ParameterServerStrategy() (async), ShardedEmbedding tables on the PS, Keras 3",
                    "tfdist_grpc": "the same with ps.transport: grpc (every call over gRPC, the transport before)",
                    "tfdist_every1": "the same with strategy.exchange_every: 1 (every step; the default before "
                                     "2026-11-28 evening)",
                    "tfdist_tcp": "the same with ps.shared_memory: false (bodies over loopback TCP, the default "
                                  "before 2026-11-29)",
                    "tf_pss": "tf.distribute.ParameterServerStrategy, tf-keras Embedding tables as PS variables "
                              "(MinSizePartitioner(256 KiB, max_shards=2)), coordinator + 2 worker servers"},
        "runs": [],
    }
    if "tf_pss" in configs and importlib.util.find_spec("tf_keras") is None:
        p.error("tf_pss needs tf-keras (pip install -e .[bench]); or pass --configs tfdist")
    children = _common.Children()
    log_dir = tempfile.mkdtemp(prefix="tfdist-ctr-throughput-")
    result["log_dir"] = log_dir
    try:
        for pass_ in range(args.passes):
            for config in (configs if pass_ % 2 == 0 else configs[::-1]):
                run_dir = os.path.join(log_dir, f"pass{pass_}-{config}")
                os.makedirs(run_dir)
                entry = {"pass": pass_, "config": config, "load_avg_before": [round(x, 2) for x in os.getloadavg()]}
                t0 = time.monotonic()
                try:
                    entry.update(RUNNERS[config](args, run_dir, children))
                except Exception as e:  # noqa: BLE001 - recorded; the other runs go on
                    entry["error"] = f"{type(e).__name__}: {e}"[-2000:]
                    entry["traceback"] = traceback.format_exc()[-2000:]
                finally:
                    children.stop_all()
                entry["load_avg_after"] = [round(x, 2) for x in os.getloadavg()]
                entry["run_s"] = round(time.monotonic() - t0, 1)
                print(f"pass {pass_} {config:7s}: " + (f"{entry['examples_per_s']:9.1f} examples/s" if
                      "examples_per_s" in entry else entry["error"][:300]) + f" (load {entry['load_avg_before'][0]}"
                      f" -> {entry['load_avg_after'][0]}, {entry['run_s']} s)", file=sys.stderr, flush=True)
                result["runs"].append(entry)
    finally:
        children.stop_all()
    result["summary"] = summarize(result["runs"], configs)
    result["total_s"] = round(time.monotonic() - started, 1)
    text = json.dumps(result, indent=1)
    print(text)
    if args.out:
        _common.write_result(args.out, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
