"""Parameter-server benchmark: tfdist PS training vs plain Keras, MWMS and TF's PSS; PS bytes/s vs raw gRPC.

Prints one JSON document. Measures, on this machine in one run:

1. ``training``: examples/s and steps/s (batch 64 per worker) of an MLP
   784-256-256-10 and a 2-conv + 2-dense CNN (2.16 M parameters) on synthetic
   data, for

   * ``plain``        — single-process Keras 3 ``fit``;
   * ``tfdist_single`` — ``tfdist.ParameterServerStrategy()`` with no cluster (one process, in-process PS);
   * ``tf_onedevice`` — TF's own ``tf.distribute.OneDeviceStrategy`` (one process): what any
     ``tf.distribute`` strategy costs Keras over plain ``fit`` (its distributed step and input path);
   * ``tfdist_1w1ps`` — ``tfdist.ParameterServerStrategy``, 1 worker + 1 PS;
   * ``tfdist_2w2ps`` — 2 workers + 2 PS (async, a sync with the PS every step);
   * ``mwms``         — ``tf.distribute.MultiWorkerMirroredStrategy``, 2 worker
     processes, Keras 3 ``fit`` with the DESIGN.md §1 work-arounds patched in
     the worker script only;
   * ``tf_pss``       — TF's own ``ParameterServerStrategy`` with tf-keras
     (``TF_USE_LEGACY_KERAS=1``), 1 PS + 2 workers + a coordinator.

   Keras 3 runs are timed inside each worker at batch ends over ``steps``
   steps after ``warmup`` steps; a job of several workers counts the examples
   all of them finished inside the window in which every one trains
   (``joint_rate``; the sum of the workers' own rates is kept as
   ``sum_of_worker_rates``); TF PSS is timed in
   its coordinator between epoch ends (tf-keras refuses batch-level callbacks
   under PSS, whose steps are dispatched asynchronously) over the same total
   number of steps.
2. ``bytes``: bytes/s moved (request + response) by a real PS task
   (``python -m tfdist.ps`` via ``LocalCluster.start_ps``) for one
   ``WorkerSession.sync`` (push delta + pull values, what a training step
   pays) and for the bare ``PushPull`` RPC, against a raw grpcio unary echo
   server in a subprocess, for the same payload sizes.

Usage::

    python benchmarks/ps_throughput.py [--quick] [--only training|bytes] [--models mlp,cnn]
        [--configs plain,tfdist_1w1ps,...] [--repeats N] [--sizes 65536,1048576] [--out FILE]
        [--write-docs] [--wait-quiet SECONDS] [--source-note TEXT]
    python benchmarks/ps_throughput.py --from-json FILE --write-docs   # re-render the docs section

The default run takes about 10 minutes on 2 cores, ``--quick`` about 2-3.
TF PSS needs tf-keras: ``pip install -e .[bench]``.

Every child process is killed when the script ends, also on errors.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import shlex
import statistics
import sys
import tempfile
import time
import traceback

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from benchmarks import _common  # noqa: E402

WORKERS = os.path.join(ROOT, "benchmarks", "ps_workers")
DOCS = os.path.join(ROOT, "docs", "benchmarks.md")
SECTION = "parameter-server"  # the marked section of docs/benchmarks.md this script rewrites

CONFIGS = ("plain", "tfdist_single", "tf_onedevice", "tfdist_1w1ps", "tfdist_2w2ps", "mwms", "tf_pss", "mwms_split",
           "tfdist_2w2ps_k4", "tfdist_2w2ps_auto", "tf_pss_spe10", "tfdist_2w2ps_grpc", "tfdist_2w2ps_defaults",
           "tfdist_1w1ps_grpc", "tfdist_2w2ps_defaults_tcp")
#: strategy.exchange_every of the tfdist_2w2ps_k4 row.
EXCHANGE_EVERY = 4
#: steps_per_execution of the tf_pss_spe10 row: TF PSS's best measured on this machine (issue #23: 10,600
#: examples/s against 7,600 at 1); it must divide the timed steps of every model.
TF_PSS_SPE = 10
CONFIG_LABELS = {
    "plain": "plain Keras 3 fit, 1 process",
    "tfdist_single": "tfdist PS strategy with no cluster (one process, in-process PS)",
    "tf_onedevice": "TF OneDeviceStrategy, 1 process (the cost of any tf.distribute strategy in Keras)",
    "tfdist_1w1ps": "tfdist PS, 1 worker + 1 PS",
    "tfdist_2w2ps": "tfdist PS (async, every step: `exchange_every: 1`), 2 workers + 2 PS",
    "mwms": "TF MultiWorkerMirroredStrategy, 2 workers (Keras 3, patched)",
    "tf_pss": "TF ParameterServerStrategy, 2 workers + 1 PS + coordinator (tf-keras)",
    "mwms_split": "reference: TF MWMS, 2 workers, with the intra-op thread split tfdist's local launch applies",
    "tfdist_2w2ps_k4": "tfdist PS (async, `exchange_every: 4`), 2 workers + 2 PS",
    "tfdist_2w2ps_auto": "tfdist PS (async, `exchange_every: auto`), 2 workers + 2 PS",
    "tfdist_1w1ps_grpc": "tfdist PS, 1 worker + 1 PS, every call over gRPC (`ps.transport: grpc`)",
    "tfdist_2w2ps_grpc": "tfdist PS (async), 2 workers + 2 PS, every call over gRPC (`ps.transport: grpc`)",
    "tfdist_2w2ps_defaults_tcp": "tfdist PS (async), 2 workers + 2 PS, the library's defaults but "
                                 "`ps.shared_memory: false` (message bodies over loopback TCP, as before 2026-11-29)",
    "tfdist_2w2ps_defaults": "tfdist PS (async), 2 workers + 2 PS, the library's defaults (`exchange_every: auto`, "
                             "round-robin placement, no partitioning), whatever --placement says",
    "tf_pss_spe10": f"TF ParameterServerStrategy, 2 workers + 1 PS + coordinator (tf-keras), "
                    f"`steps_per_execution={TF_PSS_SPE}`",
}
#: (warm-up steps, timed steps per worker) per model.
STEPS_FULL = {"mlp": (50, 600), "cnn": (20, 100)}
STEPS_QUICK = {"mlp": (10, 100), "cnn": (5, 20)}
SIZES_FULL = (64 * 1024, 1024 * 1024, 4 * 1024 * 1024, 16 * 1024 * 1024)
SIZES_QUICK = (64 * 1024, 1024 * 1024, 4 * 1024 * 1024)

TARGET_BYTES_RATIO = 0.6  # PS push+pull / raw gRPC at >= 1 MB
TARGET_ASYNC_SPEEDUP = 1.3  # tfdist 2w2ps / max(MWMS, TF PSS)
TARGET_SINGLE_RATIO = 0.8  # tfdist 1w1ps / plain, CNN
#: Issue #12 item 9: milliseconds the strategy may add to a step of the MLP (1 worker + 1 PS vs plain).
TARGET_ADDED_MS = 1.0


def _env(**extra) -> dict:
    env = dict(os.environ)
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    env["PYTHONUNBUFFERED"] = "1"
    env.pop("TF_CONFIG", None)
    env.pop("TFDIST_CONFIG", None)
    env.update(extra)
    return env


def _load() -> float:
    return round(os.getloadavg()[0], 2)


def wait_quiet(max_wait_s: float, threshold: float) -> dict:
    """Waits (bounded) until the 1-minute load average is below ``threshold``."""
    start = time.monotonic()
    before = _load()
    while _load() >= threshold and time.monotonic() - start < max_wait_s:
        time.sleep(10)
    return {"load_before_wait": before, "load_at_start": _load(), "waited_s": round(time.monotonic() - start, 1),
            "threshold": threshold, "quiet": _load() < threshold}


# ------------------------------------------------------------------ bytes/s ----------


def _rate(fn, payload_bytes: int, min_seconds: float, min_calls: int) -> dict:
    """Calls ``fn`` until ``min_seconds`` and ``min_calls`` pass; bytes counted both ways."""
    fn()  # warm-up (connection, allocations)
    fn()
    calls, start = 0, time.perf_counter()
    while True:
        fn()
        calls += 1
        elapsed = time.perf_counter() - start
        if elapsed >= min_seconds and calls >= min_calls:
            break
    return {"calls": calls, "seconds": elapsed, "ms_per_call": 1e3 * elapsed / calls,
            "bytes_per_s": 2 * payload_bytes * calls / elapsed}


def _bytes_one_size(size: int, rounds: int, min_seconds: float, client, echo) -> dict:
    import numpy as np

    from tfdist.ps.placement import VariableSpec, make_placement
    from tfdist.ps.session import WorkerSession

    n = size // 4
    key = "0000/payload"
    spec = VariableSpec(key, "float32", (n,))
    plan = make_placement("round_robin").place([spec], 1)
    # conditional_pull=False: every call really pulls the values back (a lone worker would
    # otherwise get "unchanged" replies and move half the bytes counted below).
    session = WorkerSession(client, [spec], plan, worker_id=0, is_chief=True, heartbeat_interval_s=None,
                            conditional_pull=False)
    current = {key: np.random.default_rng(0).standard_normal(n, dtype=np.float32)}
    session.initialize(current)
    delta = {key: np.zeros(n, dtype=np.float32)}
    meta = {"worker": 0, "clock": 0, "keys": [key]}
    raw = bytes(size)
    calls = {
        "raw_grpc": lambda: echo(raw, timeout=60),
        "tfdist_sync": lambda: session.sync(current),
        "tfdist_pushpull_rpc": lambda: client.call(0, "PushPull", meta, delta),
    }
    per = {name: [] for name in calls}
    for _ in range(rounds):  # interleaved, so drifting load hits all alike
        for name, fn in calls.items():
            per[name].append(_rate(fn, size, min_seconds, 5))
    row = {"payload_bytes": size}
    for name, runs in per.items():
        row[name] = {
            "bytes_per_s": statistics.median(r["bytes_per_s"] for r in runs),
            "ms_per_call": statistics.median(r["ms_per_call"] for r in runs),
            "rounds_mb_per_s": [round(r["bytes_per_s"] / 1e6, 1) for r in runs],
        }
    row["ratio_sync_vs_raw"] = row["tfdist_sync"]["bytes_per_s"] / row["raw_grpc"]["bytes_per_s"]
    row["ratio_rpc_vs_raw"] = row["tfdist_pushpull_rpc"]["bytes_per_s"] / row["raw_grpc"]["bytes_per_s"]
    return row


def bench_bytes(sizes, rounds: int, min_seconds: float, children: _common.Children, log_dir: str) -> dict:
    import grpc

    from tfdist.cluster.local import free_port
    from tfdist.config import JobConfig
    from tfdist.errors import PSUnavailableError
    from tfdist.testing import LocalCluster

    sys.path.insert(0, WORKERS)
    import grpc_echo

    port = free_port()
    children.start([_common.python(), os.path.join(WORKERS, "grpc_echo.py"), "--port", str(port)], env=_env(),
                   log_path=os.path.join(log_dir, "grpc-echo.log"))
    channel = grpc.insecure_channel(f"127.0.0.1:{port}", options=grpc_echo.OPTIONS[:2])
    grpc.channel_ready_future(channel).result(timeout=30)
    echo = channel.unary_unary(grpc_echo.METHOD)

    results = []
    try:
        for size in sizes:
            # A fresh PS task per size: a store is initialised once with a fixed set of variables.
            for attempt in range(2):  # a PS that lost a port race does not come up: try once more
                with LocalCluster(workers=1, ps=1, config=JobConfig(name="bench-bytes"), log_dir=log_dir) as cluster:
                    try:
                        cluster.start_ps(ready_timeout=30)
                    except PSUnavailableError:
                        if attempt:
                            raise
                        continue
                    with cluster.client(rpc_timeout_s=60) as client:
                        results.append(_bytes_one_size(size, rounds, min_seconds, client, echo))
                    break
    finally:
        channel.close()
    return {
        "method": "payload = one float32 variable of the given size on 1 PS task (python -m tfdist.ps); "
                  "bytes/s = (request + response payload bytes) x calls / s; median of interleaved rounds",
        "rows": results,
    }


# --------------------------------------------------------------- training ----------


def _worker_argv(mode: str, model: str, out: str, warmup: int, steps: int) -> list[str]:
    return [_common.python(), os.path.join(WORKERS, "keras_worker.py"), "--mode", mode, "--model", model,
            "--out", out, "--warmup", str(warmup), "--steps", str(steps)]


def joint_rate(per_worker: list[dict], batch: int) -> dict | None:
    """Examples finished by all workers inside the window in which every one of them trains, per second.

    The window runs from the latest worker's first timed batch end to the
    earliest worker's last one; each worker counts the batches it ended
    inside it (issue #23: an aggregate of the whole job, not a sum of rates
    timed at different moments). ``None`` without batch-end times or when the
    windows do not overlap.
    """
    ends = [w.get("batch_end_wall") for w in per_worker]
    if not all(ends):
        return None
    lo, hi = max(e[0] for e in ends), min(e[-1] for e in ends)
    if hi <= lo:
        return None
    examples = sum(batch * sum(1 for t in e if lo < t <= hi) for e in ends)
    return {"examples_per_s": examples / (hi - lo), "seconds": hi - lo, "examples": examples}


def _aggregate(per_worker: list[dict]) -> dict:
    """The job's rate in the window all workers train (:func:`joint_rate`), and the sum of their own rates."""
    summed = sum(w["examples_per_s"] for w in per_worker)
    joint = joint_rate(per_worker, _common.BATCH) if len(per_worker) > 1 else None
    out = {
        "examples_per_s": joint["examples_per_s"] if joint else summed,
        "aggregate": "joint window" if joint else "sum of worker rates",
        "sum_of_worker_rates": summed,
        "cpu_ms_per_step": [round(w["cpu_ms_per_step"], 2) for w in per_worker if "cpu_ms_per_step" in w],
        "per_worker_examples_per_s": [round(w["examples_per_s"], 1) for w in per_worker],
        "per_worker_steps_per_s": [round(w["steps_per_s"], 2) for w in per_worker],
    }
    windows = [w.get("wall_window") for w in per_worker]
    if len(per_worker) > 1 and all(windows):
        lo, hi = max(a for a, _ in windows), min(b for _, b in windows)
        spans = [b - a for a, b in windows]
        out["timed_window_overlap"] = round(max(hi - lo, 0.0) / max(spans), 3)
    return out


def run_plain(model, warmup, steps, children, log_dir, timeout, mode="plain"):
    out = os.path.join(log_dir, f"{mode}-{model}.json")
    proc = children.start(_worker_argv(mode, model, out, warmup, steps), env=_env(),
                          log_path=os.path.join(log_dir, f"{mode}-{model}.log"))
    children.wait_all([proc], timeout)
    with open(out) as f:
        r = json.load(f)
    return {**_aggregate([r]), "params": r["params"]}


def run_tfdist(model, n, warmup, steps, log_dir, timeout, placement, partition_threshold_bytes, exchange_every=1,
               transport="auto", shared_memory=True):
    from tfdist.config import JobConfig
    from tfdist.testing import LocalCluster

    config = JobConfig(name=f"bench-{model}-{n}w{n}ps")
    config.ps.placement = placement
    config.ps.partition_threshold_bytes = partition_threshold_bytes
    config.ps.transport = transport
    config.ps.shared_memory = shared_memory
    config.strategy.exchange_every = exchange_every
    out = tempfile.mkdtemp(prefix=f"tfdist-{model}-{n}w-", dir=log_dir)
    with LocalCluster(workers=n, ps=n, config=config, log_dir=out) as cluster:
        cluster.start(os.path.join(WORKERS, "keras_worker.py"),
                      ["--mode", "tfdist", "--model", model, "--out", out, "--warmup", str(warmup), "--steps", str(steps)])
        cluster.wait(timeout)
    per = []
    for i in range(n):
        with open(os.path.join(out, f"worker-{i}.json")) as f:
            per.append(json.load(f))
    agg = _aggregate(per)
    agg["params"] = per[0]["params"]
    agg["sync_ms_per_step"] = [round(w["sync_ms_per_step"], 2) for w in per]
    agg["steps_per_exchange"] = [w.get("steps_per_exchange") for w in per]
    agg["placement"] = {"policy": placement, "partition_threshold_bytes": partition_threshold_bytes,
                        "shards_per_ps": [sum(1 for _, ps, _ in per[0]["placement"] if ps == i) for i in range(n)]}
    return agg


def split_threads(workers: int = 2) -> int:
    """Intra-op threads per training task that tfdist's local launch gives ``workers`` tasks here."""
    from tfdist.cluster.local import local_cpu_count

    return max(1, local_cpu_count() // workers)


def run_mwms(model, warmup, steps, children, log_dir, timeout, threads: int | None = None):
    """TF MWMS with 2 workers; ``threads`` sets TF_NUM_INTRAOP_THREADS (None: TF's default, what users get)."""
    from tfdist.cluster.local import free_port

    ports = [free_port(), free_port()]
    while ports[1] == ports[0]:
        ports[1] = free_port()
    cluster = {"worker": [f"127.0.0.1:{p}" for p in ports]}
    out = tempfile.mkdtemp(prefix=f"mwms-{model}-", dir=log_dir)
    procs = []
    for i in range(2):
        tf_config = json.dumps({"cluster": cluster, "task": {"type": "worker", "index": i}})
        extra = {"TF_NUM_INTRAOP_THREADS": str(threads)} if threads else {}
        procs.append(children.start(_worker_argv("mwms", model, out, warmup, steps),
                                    env=_env(TF_CONFIG=tf_config, **extra),
                                    log_path=os.path.join(out, f"worker-{i}.log")))
    children.wait_all(procs, timeout)
    per = []
    for i in range(2):
        with open(os.path.join(out, f"worker-{i}.json")) as f:
            per.append(json.load(f))
    return {**_aggregate(per), "params": per[0]["params"]}


def run_tf_pss(model, warmup, steps, children, log_dir, timeout, steps_per_execution=1):
    """TF PSS: 1 PS + 2 worker servers + coordinator. Same total timed steps as 2 workers x ``steps``."""
    from tfdist.cluster.local import free_port

    ports: list[int] = []
    while len(ports) < 4:
        p = free_port()
        if p not in ports:
            ports.append(p)
    cluster = {"chief": [f"127.0.0.1:{ports[0]}"], "ps": [f"127.0.0.1:{ports[1]}"],
               "worker": [f"127.0.0.1:{ports[2]}", f"127.0.0.1:{ports[3]}"]}
    spec = json.dumps(cluster)
    out = tempfile.mkdtemp(prefix=f"tfpss-{model}-", dir=log_dir)
    env = _env(TF_USE_LEGACY_KERAS="1")
    servers = []
    for job, n in (("ps", 1), ("worker", 2)):
        for i in range(n):
            servers.append(children.start(
                [_common.python(), os.path.join(WORKERS, "tfpss_server.py"), "--cluster", spec, "--job", job,
                 "--index", str(i)], env=env, log_path=os.path.join(out, f"{job}-{i}.log")))
    result_path = os.path.join(out, "coordinator.json")
    coordinator = children.start(
        [_common.python(), os.path.join(WORKERS, "tfpss_coordinator.py"), "--cluster", spec, "--model", model,
         "--out", result_path, "--steps-per-epoch", str(steps), "--timed-epochs", "2",
         "--steps-per-execution", str(steps_per_execution)],
        env=env, log_path=os.path.join(out, "coordinator.log"))
    try:
        deadline = time.monotonic() + timeout
        while coordinator.poll() is None and time.monotonic() < deadline:
            for s in servers:
                if s.poll() is not None:
                    raise RuntimeError(f"TF PSS server {s.args[3:]} exited with {s.returncode}:\n{_common.log_tail(s)}")
            time.sleep(0.2)
        children.wait_all([coordinator], max(deadline - time.monotonic(), 0.1))
    finally:
        for s in servers:
            if s.poll() is None:
                s.terminate()
    with open(result_path) as f:
        r = json.load(f)
    return {"examples_per_s": r["examples_per_s"], "params": r["params"], "keras": r["keras"],
            "epoch_seconds": [round(x, 3) for x in r["epoch_seconds"]],
            "steps_per_execution": steps_per_execution,
            "note": f"timed in the coordinator over 2 epochs of {steps} steps (2 x {steps} steps of 64 "
                    "over both workers), after a warm-up epoch of the same length"}


def _run_config(config, model, warmup, steps, children, log_dir, placement, threshold, timeout) -> dict:
    t0 = time.monotonic()
    load = _load()
    try:
        if config == "plain":
            row = run_plain(model, warmup, steps, children, log_dir, timeout)
        elif config in ("tfdist_single", "tf_onedevice"):
            row = run_plain(model, warmup, steps, children, log_dir, timeout,
                            mode="onedevice" if config == "tf_onedevice" else config)
        elif config == "tfdist_1w1ps":
            row = run_tfdist(model, 1, warmup, steps, log_dir, timeout, placement, threshold)
        elif config == "tfdist_2w2ps":
            row = run_tfdist(model, 2, warmup, steps, log_dir, timeout, placement, threshold)
        elif config == "tfdist_1w1ps_grpc":
            row = run_tfdist(model, 1, warmup, steps, log_dir, timeout, placement, threshold, transport="grpc")
            row["transport"] = "grpc"
        elif config == "tfdist_2w2ps_grpc":
            row = run_tfdist(model, 2, warmup, steps, log_dir, timeout, placement, threshold, transport="grpc")
            row["transport"] = "grpc"
        elif config in ("tfdist_2w2ps_defaults", "tfdist_2w2ps_defaults_tcp"):
            from tfdist.config import PSConfig

            defaults = PSConfig()
            row = run_tfdist(model, 2, warmup, steps, log_dir, timeout, defaults.placement,
                             defaults.partition_threshold_bytes, exchange_every=None,  # (async: auto)
                             shared_memory=config == "tfdist_2w2ps_defaults")
        elif config == "mwms":
            row = run_mwms(model, warmup, steps, children, log_dir, timeout)
        elif config == "tf_pss":
            row = run_tf_pss(model, warmup, steps, children, log_dir, timeout)
        elif config == "tf_pss_spe10":
            if steps % TF_PSS_SPE:
                raise ValueError(f"{steps} timed steps are not a multiple of steps_per_execution {TF_PSS_SPE}")
            row = run_tf_pss(model, warmup, steps, children, log_dir, timeout, TF_PSS_SPE)
        elif config == "tfdist_2w2ps_k4":
            row = run_tfdist(model, 2, warmup, steps, log_dir, timeout, placement, threshold, EXCHANGE_EVERY)
            row["exchange_every"] = EXCHANGE_EVERY
        elif config == "tfdist_2w2ps_auto":
            row = run_tfdist(model, 2, warmup, steps, log_dir, timeout, placement, threshold, "auto")
            row["exchange_every"] = "auto"
        elif config == "mwms_split":
            row = run_mwms(model, warmup, steps, children, log_dir, timeout, threads=split_threads(2))
            row["intra_op_threads"] = split_threads(2)
        else:
            raise ValueError(f"unknown config {config!r}; use one of {CONFIGS}")
        row["steps_per_s"] = row["examples_per_s"] / _common.BATCH
        row["ok"] = True
    except Exception as e:  # a baseline that cannot run is recorded, not faked
        row = {"ok": False, "error": f"{type(e).__name__}: {e}"[-3000:]}
        traceback.print_exc(file=sys.stderr)
    finally:
        children.stop_all()
    row["workers"] = 1 if config in ("plain", "tfdist_single", "tf_onedevice", "tfdist_1w1ps", "tfdist_1w1ps_grpc") else 2
    row["warmup_steps"], row["timed_steps_per_worker"] = warmup, steps
    row["load_1min_at_start"] = load
    row["wall_s"] = round(time.monotonic() - t0, 1)
    print(f"[ps_throughput] {model} {config}: "
          + (f"{row['examples_per_s']:.0f} examples/s" if row["ok"] else row["error"].splitlines()[0])
          + f" (load {load})", file=sys.stderr, flush=True)
    return row


def _median_row(runs: list[dict]) -> dict:
    """The run whose examples/s is the median (lower middle), with every run's value attached."""
    ok = [r for r in runs if r["ok"]]
    if not ok:
        return runs[-1]
    ok.sort(key=lambda r: r["examples_per_s"])
    row = dict(ok[(len(ok) - 1) // 2])
    row["runs_examples_per_s"] = [round(r["examples_per_s"], 1) for r in runs if r["ok"]]
    row["runs_load_1min"] = [r["load_1min_at_start"] for r in runs]
    row["failed_runs"] = len(runs) - len(ok)
    return row


def bench_training(models, configs, steps_table, repeats, children, log_dir, placement, threshold, timeout) -> dict:
    """Every config of every model, ``repeats`` times (order reversed on odd passes to balance drifting load)."""
    out: dict = {}
    for model in models:
        warmup, steps = steps_table[model]
        runs: dict[str, list[dict]] = {c: [] for c in configs}
        for rep in range(repeats):
            for config in (configs if rep % 2 == 0 else configs[::-1]):
                runs[config].append(
                    _run_config(config, model, warmup, steps, children, log_dir, placement, threshold, timeout))
        rows = {c: _median_row(runs[c]) for c in configs}
        out[model] = {"description": _common.MODELS[model][1], "repeats": repeats, "configs": rows,
                      "ratios": _ratios(rows)}
    return out


def _ratios(rows: dict) -> dict:
    """Ratios of the reported (median) runs, and per pass: runs of the same pass ran minutes apart at most."""
    def eps(name):
        r = rows.get(name)
        return r["examples_per_s"] if r and r.get("ok") else None

    def per_pass(a, b):
        ra, rb = rows[a].get("runs_examples_per_s", []), rows[b].get("runs_examples_per_s", [])
        if rows[a].get("failed_runs") or rows[b].get("failed_runs") or len(ra) != len(rb):
            return []
        return [round(x / y, 3) for x, y in zip(ra, rb)]

    ratios = {}
    if eps("tfdist_single") and eps("plain"):  # issue #15, item 10
        ratios["tfdist_single_vs_plain"] = eps("tfdist_single") / eps("plain")
        ratios["tfdist_single_vs_plain_per_pass"] = per_pass("tfdist_single", "plain")
        ratios["tfdist_single_ms_added_per_step"] = 1e3 / rows["tfdist_single"]["steps_per_s"] - \
            1e3 / rows["plain"]["steps_per_s"]
    if eps("tfdist_single") and eps("tf_onedevice"):  # what tfdist adds over any tf.distribute strategy
        ratios["tfdist_single_vs_tf_onedevice"] = eps("tfdist_single") / eps("tf_onedevice")
        ratios["tfdist_single_vs_tf_onedevice_per_pass"] = per_pass("tfdist_single", "tf_onedevice")
    if eps("tf_onedevice") and eps("plain"):
        ratios["tf_onedevice_vs_plain"] = eps("tf_onedevice") / eps("plain")
    if eps("tfdist_1w1ps") and eps("plain"):
        ratios["tfdist_1w1ps_vs_plain"] = eps("tfdist_1w1ps") / eps("plain")
        ratios["tfdist_1w1ps_vs_plain_per_pass"] = per_pass("tfdist_1w1ps", "plain")
        # What the strategy adds to one step (both rows use batch 64 per worker).
        ratios["tfdist_1w1ps_ms_added_per_step"] = 1e3 / rows["tfdist_1w1ps"]["steps_per_s"] - \
            1e3 / rows["plain"]["steps_per_s"]
    baselines = {k: eps(k) for k in ("mwms", "tf_pss", "tf_pss_spe10") if eps(k)}

    def vs_each_baseline(name):
        for k, v in baselines.items():
            ratios[f"{name}_vs_{k}"] = eps(name) / v
            ratios[f"{name}_vs_{k}_per_pass"] = per_pass(name, k)

    if eps("tfdist_2w2ps") and baselines:
        best = max(baselines, key=baselines.get)
        ratios["tfdist_2w2ps_vs_best_baseline"] = eps("tfdist_2w2ps") / baselines[best]
        ratios["best_baseline"] = best
        vs_each_baseline("tfdist_2w2ps")
    if eps("tfdist_2w2ps_k4") and baselines:
        best = max(baselines, key=baselines.get)
        ratios["tfdist_2w2ps_k4_vs_best_baseline"] = eps("tfdist_2w2ps_k4") / baselines[best]
        ratios["tfdist_2w2ps_k4_vs_best_baseline_per_pass"] = per_pass("tfdist_2w2ps_k4", best)
        if eps("mwms_split"):
            ratios["tfdist_2w2ps_k4_vs_mwms_split"] = eps("tfdist_2w2ps_k4") / eps("mwms_split")
    if eps("tfdist_2w2ps_auto") and baselines:
        best = max(baselines, key=baselines.get)
        ratios["tfdist_2w2ps_auto_vs_best_baseline"] = eps("tfdist_2w2ps_auto") / baselines[best]
        ratios["tfdist_2w2ps_auto_vs_best_baseline_per_pass"] = per_pass("tfdist_2w2ps_auto", best)
        vs_each_baseline("tfdist_2w2ps_auto")
    for name in ("tfdist_2w2ps_grpc", "tfdist_2w2ps_defaults", "tfdist_2w2ps_defaults_tcp"):
        if eps(name) and baselines:
            vs_each_baseline(name)
    if eps("tfdist_2w2ps_defaults") and eps("tfdist_2w2ps_defaults_tcp"):  # shared memory against loopback TCP
        ratios["tfdist_2w2ps_defaults_vs_tcp_per_pass"] = per_pass("tfdist_2w2ps_defaults",
                                                                   "tfdist_2w2ps_defaults_tcp")
    if eps("tfdist_2w2ps_grpc") and eps("tfdist_2w2ps"):  # the lean transport against gRPC, same run
        ratios["tfdist_2w2ps_vs_grpc_transport_per_pass"] = per_pass("tfdist_2w2ps", "tfdist_2w2ps_grpc")
    if eps("tfdist_2w2ps_auto") and eps("tfdist_2w2ps"):
        ratios["tfdist_2w2ps_auto_vs_every_step_per_pass"] = per_pass("tfdist_2w2ps_auto", "tfdist_2w2ps")
    if eps("tfdist_2w2ps") and eps("mwms_split"):  # a reference, not a baseline users would run
        ratios["tfdist_2w2ps_vs_mwms_split"] = eps("tfdist_2w2ps") / eps("mwms_split")
        ratios["tfdist_2w2ps_vs_mwms_split_per_pass"] = per_pass("tfdist_2w2ps", "mwms_split")
    if eps("tfdist_1w1ps_grpc") and eps("plain"):
        ratios["tfdist_1w1ps_grpc_ms_added_per_step"] = 1e3 / rows["tfdist_1w1ps_grpc"]["steps_per_s"] - \
            1e3 / rows["plain"]["steps_per_s"]
    if eps("tfdist_1w1ps") and eps("tfdist_1w1ps_grpc"):
        ratios["tfdist_1w1ps_vs_grpc_transport_per_pass"] = per_pass("tfdist_1w1ps", "tfdist_1w1ps_grpc")
    if eps("tfdist_2w2ps") and eps("tfdist_1w1ps"):
        ratios["tfdist_2w2ps_vs_1w1ps"] = eps("tfdist_2w2ps") / eps("tfdist_1w1ps")
    return ratios


def targets(result: dict) -> dict:
    out = {}
    rows = [r for r in result.get("bytes", {}).get("rows", []) if r["payload_bytes"] >= 1024 * 1024]
    if rows:
        worst = min(r["ratio_sync_vs_raw"] for r in rows)
        out["ps_bytes_ge_0.6_raw_at_1MB_plus"] = {"target": TARGET_BYTES_RATIO, "worst_ratio": worst,
                                                  "met": worst >= TARGET_BYTES_RATIO}
    for model, m in result.get("training", {}).items():
        r = m["ratios"]
        if "tfdist_2w2ps_vs_best_baseline" in r:
            out[f"{model}_2w2ps_ge_1.3x_best_baseline"] = {
                "target": TARGET_ASYNC_SPEEDUP, "ratio": r["tfdist_2w2ps_vs_best_baseline"],
                "met": r["tfdist_2w2ps_vs_best_baseline"] >= TARGET_ASYNC_SPEEDUP}
        if "tfdist_2w2ps_auto_vs_best_baseline" in r:
            out[f"{model}_2w2ps_exchange_every_auto_ge_1.3x_best_baseline"] = {
                "target": TARGET_ASYNC_SPEEDUP, "ratio": r["tfdist_2w2ps_auto_vs_best_baseline"],
                "met": r["tfdist_2w2ps_auto_vs_best_baseline"] >= TARGET_ASYNC_SPEEDUP,
                "note": "strategy.exchange_every: auto"}
        if "tfdist_2w2ps_k4_vs_best_baseline" in r:
            out[f"{model}_2w2ps_exchange_every_{EXCHANGE_EVERY}_ge_1.3x_best_baseline"] = {
                "target": TARGET_ASYNC_SPEEDUP, "ratio": r["tfdist_2w2ps_k4_vs_best_baseline"],
                "met": r["tfdist_2w2ps_k4_vs_best_baseline"] >= TARGET_ASYNC_SPEEDUP,
                "note": f"not the default: strategy.exchange_every={EXCHANGE_EVERY} (local SGD)"}
        if model == "mlp" and "tfdist_1w1ps_ms_added_per_step" in r:  # issue #12, item 9
            added = r["tfdist_1w1ps_ms_added_per_step"]
            out["mlp_1w1ps_adds_le_1ms_per_step"] = {"target": TARGET_ADDED_MS, "ratio": added, "op": "≤",
                                                     "met": added <= TARGET_ADDED_MS, "unit": "ms"}
        if model == "cnn" and "tfdist_1w1ps_vs_plain" in r:
            out["cnn_1w1ps_ge_0.8x_plain"] = {"target": TARGET_SINGLE_RATIO, "ratio": r["tfdist_1w1ps_vs_plain"],
                                              "met": r["tfdist_1w1ps_vs_plain"] >= TARGET_SINGLE_RATIO}
    return out


def analysis(result: dict) -> list[str]:
    """Plain-language bounds computed from the measured numbers (rendered under Notes)."""
    notes = []
    rows = result.get("bytes", {}).get("rows", [])
    for model, m in result.get("training", {}).items():
        c = m["configs"]
        plain, single = c.get("plain", {}), c.get("tfdist_1w1ps", {})
        if plain.get("ok") and single.get("ok") and rows:
            model_bytes = 4 * plain["params"]
            near = min(rows, key=lambda r: abs(math.log(r["payload_bytes"] / model_bytes)))
            raw_ms = 1e3 * 2 * model_bytes / near["raw_grpc"]["bytes_per_s"]
            step_ms = 1e3 * _common.BATCH / plain["examples_per_s"]
            blocked_ms = single["sync_ms_per_step"][0]
            single_ms = 1e3 * _common.BATCH / single["examples_per_s"]
            cpu = ""
            if plain.get("cpu_ms_per_step") and single.get("cpu_ms_per_step"):
                cpu = (f" CPU per step (all threads of the process): plain {plain['cpu_ms_per_step'][0]:.1f} ms, "
                       f"tfdist worker {single['cpu_ms_per_step'][0]:.1f} ms, the PS process not counted; with "
                       f"{result['machine'].get('cpus')} cores the exchange's CPU competes with the computation.")
            notes.append(
                f"{model}: a plain step took {step_ms:.1f} ms, a tfdist 1 worker + 1 PS step {single_ms:.1f} ms, "
                f"of which it was blocked on the PS for {blocked_ms:.1f} ms. Each exchange pushes "
                f"{model_bytes / 1e6:.1f} MB and, when another worker's update landed, pulls as much back; at the "
                f"raw gRPC rate measured for {near['payload_bytes'] // 1024} KiB payloads push + pull alone would "
                f"take {raw_ms:.1f} ms, which a blocking exchange adds to every step (at most "
                f"{step_ms / (step_ms + raw_ms):.2f}x plain) and the overlapped one hides behind the next step "
                f"as far as free cores allow.{cpu}")
        ratios = m["ratios"]
        best = ratios.get("best_baseline")
        if best and plain.get("ok"):
            need = TARGET_ASYNC_SPEEDUP * c[best]["examples_per_s"]
            notes.append(
                f"{model}: {TARGET_ASYNC_SPEEDUP}x the best baseline ({best}) is {need:,.0f} examples/s, "
                f"{need / plain['examples_per_s']:.2f}x what one plain process reaches with all "
                f"{result['machine'].get('cpus')} cores; the two tfdist workers and two PS tasks share those cores.")
    return notes


# ------------------------------------------------------------------- docs ----------


def _fmt(x, digits=0):
    return "—" if x is None else f"{x:,.{digits}f}"


def _passes(values) -> str:
    return f" (per pass: {', '.join(f'{v:.2f}' for v in values)})" if values and len(values) > 1 else ""


def render_docs(result: dict) -> str:
    """The Markdown of the parameter-server section, from a result of this script."""
    lines = ["", "## Parameter server (`benchmarks/ps_throughput.py`)", ""]
    m = result["machine"]
    lines += [
        f"Measured {result['date']} on {m.get('cpus')} CPU cores ({m.get('cpu', 'unknown CPU')}, "
        f"{m.get('mem_gib', '?')} GiB), {m.get('platform')}, Python {m.get('python')}, "
        f"TensorFlow {result['versions'].get('tensorflow')}, Keras {result['versions'].get('keras')}, "
        f"tf-keras {result['versions'].get('tf_keras')}, grpcio {result['versions'].get('grpcio')}. "
        f"1-minute load average: {result['load']['load_at_start']} at the start "
        f"(waited {result['load']['waited_s']} s for < {result['load']['threshold']}), "
        f"{result['load'].get('load_at_end')} at the end; other jobs may have shared the 2 cores.",
        "",
        *([f"Code measured: {result['source_note']}.", ""] if result.get("source_note") else []),
        "Command:",
        "",
        "```",
        result["command"],
        "```",
        "",
    ]
    training = result.get("training")
    if training:
        lines += [
            "### Training throughput",
            "",
            "Batch 64 per worker, Adam, synthetic data, every process on this machine. Keras 3 runs are timed "
            "inside each worker at batch ends after a warm-up; several workers count the examples all of them finished in the "
            "window in which every one trains (not a sum of rates timed at different moments); TF PSS is timed in its "
            "coordinator between epoch ends over the same total number of steps. steps/s counts steps of 64 "
            "examples (all workers together). tfdist (async) exchanges with the PS after every step: it pushes "
            "the step's update and pulls fresh values in the background while the next step computes "
            "(`strategy.overlap_exchange`, the default), and a worker alone on its PS tasks gets 'unchanged' "
            "replies instead of its own update back. tfdist's local launch gives each of its 2 workers "
            "cores / 2 TensorFlow intra-op threads (`launch.threads_per_task: auto`); the MWMS and TF PSS "
            "baselines run as a user would start them, with TensorFlow's default threads, and the last row "
            "(a reference, not a target baseline) runs MWMS with the same split as tfdist. "
            f"The `exchange_every: {EXCHANGE_EVERY}` row is not the default: each worker exchanges after every "
            f"{EXCHANGE_EVERY}th step, sending its {EXCHANGE_EVERY} updates summed (local SGD), so it trains on "
            "staler values for less communication. "
            "'Blocked' is the time a step waited for the PS (the "
            "previous exchange still in flight, plus computing the update); CPU is the process's CPU time per "
            "step, all threads.",
            "",
        ]
        for model, mres in training.items():
            rows = mres["configs"]
            warmup, steps = next(((r["warmup_steps"], r["timed_steps_per_worker"]) for r in rows.values()), (0, 0))
            reps = mres.get("repeats", 1)
            lines += [f"**{mres['description']}** — warm-up {warmup} steps, {steps} timed steps per worker"
                      + (f"; {reps} passes (the second in reverse order), the lower-middle run reported, all runs "
                         "in `runs_examples_per_s` of the JSON; per-pass ratios pair runs of the same pass."
                         if reps > 1 else "."), ""]
            lines += ["| configuration | examples/s | steps/s | per worker examples/s | ratio | load (1 min) |",
                      "|---|---:|---:|---|---|---:|"]
            plain = rows.get("plain", {}).get("examples_per_s") if rows.get("plain", {}).get("ok") else None
            r = mres["ratios"]
            for name, row in rows.items():
                if not row.get("ok"):
                    err = row.get("error", "").splitlines()[0][:160].replace("|", "\\|")
                    lines.append(f"| {CONFIG_LABELS[name]} | failed | — | `{err}` | | {row.get('load_1min_at_start')} |")
                    continue
                ratio = ""
                if name == "tfdist_1w1ps" and "tfdist_1w1ps_vs_plain" in r:
                    ratio = f"{r['tfdist_1w1ps_vs_plain']:.2f}x plain" + _passes(r.get("tfdist_1w1ps_vs_plain_per_pass"))
                elif name == "tfdist_2w2ps" and "tfdist_2w2ps_vs_best_baseline" in r:
                    best = r["best_baseline"]
                    ratio = (f"{r['tfdist_2w2ps_vs_best_baseline']:.2f}x best baseline ({best})"
                             + _passes(r.get(f"tfdist_2w2ps_vs_{best}_per_pass")))
                elif name == "tfdist_2w2ps_k4" and "tfdist_2w2ps_k4_vs_best_baseline" in r:
                    ratio = (f"{r['tfdist_2w2ps_k4_vs_best_baseline']:.2f}x best baseline ({r['best_baseline']})"
                             + _passes(r.get("tfdist_2w2ps_k4_vs_best_baseline_per_pass")))
                elif name == "mwms_split" and "tfdist_2w2ps_vs_mwms_split" in r:
                    ratio = (f"tfdist 2w2ps is {r['tfdist_2w2ps_vs_mwms_split']:.2f}x this"
                             + _passes(r.get("tfdist_2w2ps_vs_mwms_split_per_pass")))
                elif plain and name != "plain":
                    ratio = f"{row['examples_per_s'] / plain:.2f}x plain"
                per = ", ".join(_fmt(x) for x in row.get("per_worker_examples_per_s", []))
                lines.append(f"| {CONFIG_LABELS[name]} | {_fmt(row['examples_per_s'])} | {_fmt(row['steps_per_s'], 1)} "
                             f"| {per or '—'} | {ratio} | {row.get('load_1min_at_start')} |")
            extra = []
            for name in ("tfdist_1w1ps", "tfdist_2w2ps", "tfdist_2w2ps_k4"):
                if rows.get(name, {}).get("ok"):
                    extra.append(f"{name}: {', '.join(str(x) for x in rows[name]['sync_ms_per_step'])} ms/step "
                                 f"per worker")
            if extra:
                lines += ["", "tfdist steps blocked on the PS: " + "; ".join(extra) + "."]
            cpu = [f"{name} {', '.join(f'{x:.1f}' for x in row['cpu_ms_per_step'])}"
                   for name, row in rows.items() if row.get("ok") and row.get("cpu_ms_per_step")]
            if cpu:
                lines += ["", "CPU ms per step per worker process: " + "; ".join(cpu) + "."]
            lines.append("")
    byts = result.get("bytes")
    if byts:
        lines += [
            "### PS push + pull bytes/s vs raw gRPC",
            "",
            "One PS task (`python -m tfdist.ps`) holding one float32 variable of the payload size. "
            "`WorkerSession.sync` is what a training step pays (delta = current − snapshot, one `PushPull` "
            "call, values joined back); the bare `PushPull` RPC leaves out the client-side subtraction. "
            "The raw baseline is a grpcio unary echo server in another process (bytes in, same bytes out, "
            "same message options). bytes/s counts request + response payloads; median of interleaved rounds.",
            "",
            "| payload | raw gRPC MB/s | tfdist sync MB/s | ratio | PushPull RPC MB/s | ratio | sync ms/call |",
            "|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for row in byts["rows"]:
            size = row["payload_bytes"]
            label = f"{size // 1024} KiB" if size < 1024 * 1024 else f"{size // (1024 * 1024)} MiB"
            lines.append(
                f"| {label} | {_fmt(row['raw_grpc']['bytes_per_s'] / 1e6)} | {_fmt(row['tfdist_sync']['bytes_per_s'] / 1e6)} "
                f"| {row['ratio_sync_vs_raw']:.2f} | {_fmt(row['tfdist_pushpull_rpc']['bytes_per_s'] / 1e6)} "
                f"| {row['ratio_rpc_vs_raw']:.2f} | {row['tfdist_sync']['ms_per_call']:.2f} |")
        lines.append("")
    tg = result.get("targets")
    if tg:
        lines += ["### Targets (issue #2, item 9)", "", "| target | measured | met |", "|---|---:|---|"]
        for name, t in tg.items():
            value = t.get("worst_ratio", t.get("ratio"))
            lines.append(f"| {name} ({t.get('op', '≥')} {t['target']}{' ' + t['unit'] if t.get('unit') else ''}) "
                         f"| {value:.2f} | {'yes' if t['met'] else 'no'} |")
        lines.append("")
    if result.get("notes"):
        lines += ["### Notes", ""] + [f"- {n}" for n in result["notes"]] + [""]
    return "\n".join(lines)


def write_docs(result: dict, path: str = DOCS) -> None:
    """Rewrites only the text between the parameter-server markers of ``path``."""
    _common.replace_section(path, SECTION, render_docs(result))


# ------------------------------------------------------------------- main ----------


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="short smoke version (~1-2 minutes)")
    p.add_argument("--only", choices=["training", "bytes"], help="run one part only")
    p.add_argument("--models", default="mlp,cnn")
    p.add_argument("--configs", default=",".join(CONFIGS))
    p.add_argument("--sizes", help="comma-separated payload sizes in bytes for the bytes/s part")
    p.add_argument("--rounds", type=int, help="interleaved rounds per payload size (default 3, quick 1)")
    p.add_argument("--repeats", type=int, help="runs of every training config; the median is reported "
                   "(default 2, quick 1)")
    p.add_argument("--placement", default="greedy", choices=["round_robin", "greedy"],
                   help="tfdist ps.placement for the training runs (default greedy)")
    p.add_argument("--partition-threshold-bytes", type=int, default=1024 * 1024,
                   help="tfdist ps.partition_threshold_bytes: larger variables are split over the PS tasks "
                        "(default 1 MiB; 0 = never)")
    p.add_argument("--timeout", type=float, default=300.0, help="bound on each training run, seconds")
    p.add_argument("--wait-quiet", type=float, default=0.0,
                   help="wait up to this many seconds for the 1-minute load average to drop below --quiet-load")
    p.add_argument("--quiet-load", type=float, default=0.5)
    p.add_argument("--source-note", help="free text recorded with the result, e.g. which tree was measured")
    p.add_argument("--out", help="also write the JSON here")
    p.add_argument("--write-docs", action="store_true", help="rewrite the parameter-server section of docs/benchmarks.md")
    p.add_argument("--from-json", help="with --write-docs: render this JSON file instead of running")
    args = p.parse_args(argv)

    if args.from_json:
        with open(args.from_json) as f:
            result = json.load(f)
        if args.write_docs:
            write_docs(result)
        print(json.dumps(result, indent=2))
        return 0

    models = [m for m in args.models.split(",") if m]
    configs = [c for c in args.configs.split(",") if c]
    for c in configs:
        if c not in CONFIGS:
            p.error(f"unknown config {c!r}; choose from {','.join(CONFIGS)}")
    sizes = [int(s) for s in args.sizes.split(",")] if args.sizes else list(SIZES_QUICK if args.quick else SIZES_FULL)
    rounds = args.rounds or (1 if args.quick else 3)
    threshold = args.partition_threshold_bytes or None

    result: dict = {
        "benchmark": "ps_throughput",
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "command": "python " + shlex.join(["benchmarks/ps_throughput.py", *(argv if argv is not None else sys.argv[1:])]),
        "quick": args.quick,
        "machine": _common.machine(),
        "versions": _common.package_versions(),
        "git": _common.git_info(ROOT),
        "source_note": args.source_note,
        "load": wait_quiet(args.wait_quiet, args.quiet_load),
        "batch_per_worker": _common.BATCH,
        "tfdist_config": {"consistency": "async", "placement": args.placement,
                          "partition_threshold_bytes": threshold, "sync_every_step": True,
                          "overlap_exchange": True, "conditional_pull": True,
                          "threads_per_task": "auto", "intra_op_threads_2w2ps": split_threads(2)},
    }
    children = _common.Children()
    log_dir = tempfile.mkdtemp(prefix="ps-throughput-")
    result["log_dir"] = log_dir
    try:
        if args.only in (None, "bytes"):
            try:
                result["bytes"] = bench_bytes(sizes, rounds, 0.3 if args.quick else 0.7, children, log_dir)
            finally:
                children.stop_all()
        if args.only in (None, "training"):
            result["training"] = bench_training(models, configs, STEPS_QUICK if args.quick else STEPS_FULL,
                                                args.repeats or (1 if args.quick else 2), children, log_dir,
                                                args.placement, threshold, args.timeout)
    finally:
        children.stop_all()
    result["load"]["load_at_end"] = _load()
    result["targets"] = targets(result)
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
