"""Sparse-table benchmark: step time and bytes per step as an embedding table grows from 1e4 to 1e7 rows.

Prints one JSON document. Measures, on this machine in one run, for tables
of ``--rows`` rows (default 1e4, 1e5, 1e6, 1e7) x 32 float32 values, the
model ``Embedding`` + ``GlobalAveragePooling1D`` + ``Dense(1)``, SGD, batch
64 x 8 ids drawn uniformly from the table (issue #14):

* ``plain``      — single-process Keras 3 ``fit`` with ``keras.layers.Embedding``;
* ``replicated`` — tfdist, 1 worker + 1 PS task (separate processes on
  127.0.0.1), ``keras.layers.Embedding``: the worker holds the table and every
  step pushes its dense delta;
* ``sharded``    — tfdist, 1 worker + 1 PS task, ``tfdist.layers.ShardedEmbedding``:
  the table lives on the PS and a step moves the rows its batch touches;
* ``tf_pss``     — TF's ParameterServerStrategy with tf-keras (``TF_USE_LEGACY_KERAS=1``;
  ``pip install -e .[bench]``), 1 PS + 1 worker + a coordinator: the table is a
  PS variable, a step gathers its rows there and SGD applies the sparse
  gradient there. tf-keras refuses batch-level callbacks under PSS, so it is
  timed between epoch ends (an epoch of ``steps`` steps as the warm-up); its
  bytes are not counted.

Each configuration runs in fresh processes (``benchmarks/ps_workers/sparse_table_worker.py``),
timed at batch ends over ``steps`` steps after a warm-up. Bytes per step are
payload bytes (tensor data, not gRPC framing) read from the worker's and the
PS's counters over the timed steps (the exchange overlaps the next step, so
one exchange may fall in or out of the window: about 5 % of the replicated
rows' bytes in ``--quick`` mode); the reference is issue #14's
``unique ids x row bytes x 2`` (the rows a step touches, fetched and sent
back). A configuration is skipped, and the output says why, when its table
would not fit in the memory this machine has available (an estimate of the
processes' peak) or its predicted run time (the previous size's step time
scaled by the growth of the table) exceeds ``--max-config-seconds``.

Usage::

    python benchmarks/sparse_scaling.py [--quick] [--rows 10000,100000,...] [--configs plain,replicated,sharded,tf_pss]
        [--out FILE] [--max-config-seconds S] [--timeout S]

``--quick``: 5 warm-up + 20 timed steps per configuration (default 10 + 100)
and a 60 s time budget per configuration (default 300 s). Every child
process is killed when the script ends, also on errors.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
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

WORKER = os.path.join(ROOT, "benchmarks", "ps_workers", "sparse_table_worker.py")
TFPSS_SERVER = os.path.join(ROOT, "benchmarks", "ps_workers", "tfpss_server.py")
TFPSS_COORDINATOR = os.path.join(ROOT, "benchmarks", "ps_workers", "tfpss_sparse_coordinator.py")
CONFIGS = ("plain", "replicated", "sharded", "tf_pss")
CONFIG_LABELS = {
    "plain": "plain Keras 3 fit, 1 process, keras.layers.Embedding",
    "replicated": "tfdist PS, 1 worker + 1 PS, keras.layers.Embedding (replicated)",
    "sharded": "tfdist PS, 1 worker + 1 PS, tfdist.layers.ShardedEmbedding (PS-resident)",
    "tf_pss": "TF ParameterServerStrategy, 1 worker + 1 PS + coordinator, tf-keras Embedding (a PS variable)",
}
ROWS = (10_000, 100_000, 1_000_000, 10_000_000)
DIM, BATCH, IDS = 32, 64, 8
#: Estimated peak memory of a configuration, in table sizes (all its processes together). Measured at 1e7
#: rows (1.28 GB): plain Keras peaked at 4.6 GB; the replicated tfdist worker at 10.7 GB (the table, its
#: gradient, the snapshot the delta is diffed against, the delta, the serialised message) plus the PS's
#: copy; the sharded worker at 0.69 GB whatever the table (its PS holds the table).
MEMORY_FACTOR = {"plain": 4.0, "replicated": 11.0, "sharded": 2.5, "tf_pss": 2.5}
#: Share of the available memory a configuration may take.
MEMORY_SHARE = 0.8
#: gRPC's own ceiling on a message (a signed 32-bit length).
MAX_GRPC_MESSAGE_BYTES = 2**31 - 1
#: Issue #14's targets.
TARGET_STEP_GROWTH = 1.3  # sharded step time at the largest size / at the smallest
TARGET_BYTES_RATIO = 2.0  # sharded bytes per step / (unique ids x row bytes x 2)


def _env() -> dict:
    env = dict(os.environ)
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    env["PYTHONUNBUFFERED"] = "1"
    env.pop("TF_CONFIG", None)
    env.pop("TFDIST_CONFIG", None)
    return env


def available_memory_bytes() -> int | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def skip_reason(config: str, rows: int, previous: dict | None, steps: int, budget_s: float) -> str | None:
    """Why ``config`` at ``rows`` is not run (memory or predicted time), or ``None``."""
    if config == "tf_pss" and importlib.util.find_spec("tf_keras") is None:
        return "tf-keras is not installed (pip install -e .[bench])"
    table = rows * DIM * 4
    need = MEMORY_FACTOR[config] * table
    avail = available_memory_bytes()
    if avail is not None and need > MEMORY_SHARE * avail:
        return (f"memory: needs about {need / 2**30:.1f} GiB ({MEMORY_FACTOR[config]:g} x the "
                f"{table / 2**30:.2f} GiB table), {avail / 2**30:.1f} GiB available")
    if previous and "ms_per_step" in previous:
        growth = rows / previous["rows"]
        # the share of a step that grows with the table: replicated and plain grow ~linearly past 1e5 rows
        predicted = previous["ms_per_step"] / 1e3 * (growth if config in ("plain", "replicated") else 1.0) * steps
        if predicted > budget_s:
            return (f"time: predicted {predicted:.0f} s for {steps} steps ({previous['ms_per_step']:.0f} ms/step at "
                    f"{previous['rows']:,} rows x {growth:g}) > --max-config-seconds {budget_s:g}")
    return None


def run_one(config: str, rows: int, warmup: int, steps: int, children: _common.Children, log_dir: str,
            timeout: float) -> dict:
    out = os.path.join(log_dir, f"{config}-{rows}.json")
    argv = ["--mode", config, "--rows", str(rows), "--dim", str(DIM), "--batch", str(BATCH), "--ids", str(IDS),
            "--warmup", str(warmup), "--steps", str(steps), "--out", out]
    t0 = time.monotonic()
    if config == "tf_pss":
        result = run_tf_pss(rows, warmup, steps, children, log_dir, timeout)
        result["run_s"] = round(time.monotonic() - t0, 1)
        return result
    if config == "plain":
        proc = children.start([_common.python(), WORKER, *argv], env=_env(),
                              log_path=os.path.join(log_dir, f"{config}-{rows}.log"))
        children.wait_all([proc], timeout)
    else:
        from tfdist.config import JobConfig
        from tfdist.testing import LocalCluster

        task_logs = os.path.join(log_dir, f"{config}-{rows}")
        os.makedirs(task_logs, exist_ok=True)
        config_ = JobConfig(name=f"sparse-{config}-{rows}")
        config_.ps.rpc_timeout_s = max(config_.ps.rpc_timeout_s, 120.0)  # a 1.28 GB dense delta per step
        # a replicated table travels whole in one message (init, every delta): raise gRPC's limit to fit it
        config_.ps.max_message_bytes = max(config_.ps.max_message_bytes,
                                           min(rows * DIM * 4 + 64 * 2**20, MAX_GRPC_MESSAGE_BYTES))
        config_.launch.max_restarts = 0  # a failed run is reported, not retried
        # the exchange every step that a job with several workers makes (a lone worker would send its steps
        # in the background every strategy.lone_worker_exchange_s instead)
        config_.strategy.lone_worker_exchange_s = 0
        with LocalCluster(workers=1, ps=1, config=config_, log_dir=task_logs) as cluster:
            cluster.start(WORKER, argv)
            cluster.wait(timeout)
    with open(out) as f:
        result = json.load(f)
    result["run_s"] = round(time.monotonic() - t0, 1)
    return result


def run_tf_pss(rows: int, warmup: int, steps: int, children: _common.Children, log_dir: str, timeout: float) -> dict:
    """TF PSS: 1 PS + 1 worker server + coordinator; timed between epoch ends (an epoch of ``warmup`` first)."""
    from tfdist.cluster.local import free_port

    ports: list[int] = []
    while len(ports) < 3:
        port = free_port()
        if port not in ports:
            ports.append(port)
    spec = json.dumps({"chief": [f"127.0.0.1:{ports[0]}"], "ps": [f"127.0.0.1:{ports[1]}"],
                       "worker": [f"127.0.0.1:{ports[2]}"]})
    env = {**_env(), "TF_USE_LEGACY_KERAS": "1"}
    servers = [children.start([_common.python(), TFPSS_SERVER, "--cluster", spec, "--job", job, "--index", "0"],
                              env=env, log_path=os.path.join(log_dir, f"tf_pss-{rows}-{job}.log"))
               for job in ("ps", "worker")]
    out = os.path.join(log_dir, f"tf_pss-{rows}.json")
    # steps per epoch = the timed steps; the first epoch (the same length) is the warm-up
    coordinator = children.start([_common.python(), TFPSS_COORDINATOR, "--cluster", spec, "--rows", str(rows),
                                  "--dim", str(DIM), "--batch", str(BATCH), "--ids", str(IDS), "--out", out,
                                  "--steps-per-epoch", str(steps), "--timed-epochs", "1"],
                                 env=env, log_path=os.path.join(log_dir, f"tf_pss-{rows}-coordinator.log"))
    deadline = time.monotonic() + timeout
    while coordinator.poll() is None and time.monotonic() < deadline:
        for s in servers:
            if s.poll() is not None:
                raise RuntimeError(f"TF PSS server {s.args[3:]} exited with {s.returncode}:\n{_common.log_tail(s)}")
        time.sleep(0.2)
    children.wait_all([coordinator], max(deadline - time.monotonic(), 0.1))
    with open(out) as f:
        return json.load(f)


def targets(rows_by_config: dict) -> dict:
    sharded = [r for r in rows_by_config.get("sharded", []) if "ms_per_step" in r]
    out = {"sharded_step_growth_max": TARGET_STEP_GROWTH, "sharded_bytes_vs_reference_max": TARGET_BYTES_RATIO}
    if len(sharded) >= 2:
        growth = sharded[-1]["ms_per_step"] / sharded[0]["ms_per_step"]
        out["sharded_step_growth"] = {"from_rows": sharded[0]["rows"], "to_rows": sharded[-1]["rows"],
                                      "value": round(growth, 3), "met": growth <= TARGET_STEP_GROWTH}
    if sharded:
        worst = max(r["bytes_vs_reference"] for r in sharded)
        out["sharded_bytes_vs_reference"] = {"worst": round(worst, 3), "met": worst <= TARGET_BYTES_RATIO}
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="5 warm-up + 20 timed steps, 60 s per configuration")
    p.add_argument("--rows", default=",".join(str(r) for r in ROWS), help="comma-separated table sizes")
    p.add_argument("--configs", default=",".join(CONFIGS))
    p.add_argument("--warmup", type=int, help="warm-up steps (default 10, quick 5)")
    p.add_argument("--steps", type=int, help="timed steps (default 100, quick 20)")
    p.add_argument("--max-config-seconds", type=float, help="skip a configuration predicted to take longer "
                   "(default 300, quick 60)")
    p.add_argument("--timeout", type=float, default=600.0, help="bound on each run, seconds")
    p.add_argument("--out", help="also write the JSON here")
    args = p.parse_args(argv)
    warmup = args.warmup or (5 if args.quick else 10)
    steps = args.steps or (20 if args.quick else 100)
    budget = args.max_config_seconds or (60.0 if args.quick else 300.0)
    sizes = sorted(int(float(r)) for r in args.rows.split(","))
    configs = [c for c in args.configs.split(",") if c]
    unknown = set(configs) - set(CONFIGS)
    if unknown:
        p.error(f"--configs: unknown {sorted(unknown)}; use some of {list(CONFIGS)}")

    started = time.monotonic()
    result = {
        "benchmark": "sparse_scaling",
        "date_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M"),
        "command": "python benchmarks/sparse_scaling.py " + " ".join(sys.argv[1:] if argv is None else argv),
        "machine": _common.machine(),
        "model": f"Embedding(rows, {DIM}) + GlobalAveragePooling1D + Dense(1), SGD(0.1), batch {BATCH} x {IDS} "
                 "uniform ids",
        "warmup_steps": warmup, "timed_steps": steps, "max_config_seconds": budget,
        "configs": {c: CONFIG_LABELS[c] for c in configs},
        "not_measured": ["bytes per step of TF PSS (no counters)"],
        "results": {c: [] for c in configs},
    }
    children = _common.Children()
    log_dir = tempfile.mkdtemp(prefix="tfdist-sparse-scaling-")
    result["log_dir"] = log_dir
    try:
        for config in configs:
            previous = None
            for rows in sizes:
                reason = skip_reason(config, rows, previous, warmup + steps, budget)
                if reason:
                    entry = {"rows": rows, "skipped": reason}
                else:
                    try:
                        entry = run_one(config, rows, warmup, steps, children, log_dir, args.timeout)
                        previous = entry
                    except Exception as e:  # noqa: BLE001 - recorded; the other configurations go on
                        entry = {"rows": rows, "error": f"{type(e).__name__}: {e}"[-2000:],
                                 "traceback": traceback.format_exc()[-2000:]}
                    finally:
                        children.stop_all()
                print(f"{config:10s} {rows:>11,} rows: " + (
                    f"{entry['ms_per_step']:8.1f} ms/step" + (f", {entry['bytes_per_step'] / 1e3:10.1f} kB/step"
                                                             if "bytes_per_step" in entry else "")
                    if "ms_per_step" in entry else entry.get("skipped") or entry.get("error", "")[:300]),
                    file=sys.stderr, flush=True)
                result["results"][config].append(entry)
    finally:
        children.stop_all()
    result["targets"] = targets(result["results"])
    result["total_s"] = round(time.monotonic() - started, 1)
    text = json.dumps(result, indent=1)
    print(text)
    if args.out:
        _common.write_result(args.out, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
