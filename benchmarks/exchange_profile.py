"""Where the CPU of a dense exchange goes: worker parts and PS CPU per step, against plain Keras, one JSON.

Issue #23 item 1 ("profile, then cut"). One run measures, on this machine:

* ``plain``: single-process Keras 3 ``fit`` of the benchmark model
  (``benchmarks/_common.py``, batch 64, Adam), CPU ms per step;
* ``tfdist``: ``tfdist.ParameterServerStrategy()`` (defaults: async,
  overlapped exchange, ``exchange_every: auto`` since 2026-11-28 evening:
  every step before), 2 workers + 2 PS processes started by
  ``tfdist.testing.LocalCluster``: each worker's CPU ms per step and the CPU
  of the exchange's parts inside it (``benchmarks/ps_workers/profile_worker.py``
  wraps the functions that make them; parts nest), and the PS processes' CPU
  per worker step (both PS tasks' CPU time, read with psutil while the
  workers train, divided by the steps of both workers; it includes their
  start-up and the workers' warm-up, a few percent).

``added_cpu_ms_per_step`` = tfdist worker CPU per step − plain CPU per step
(issue #23's target: ≤ 1.5 ms); ``job_cpu_ms_per_worker_step`` adds the PS
CPU, which on a machine with few cores competes with the workers.

Usage::

    python benchmarks/exchange_profile.py [--model mlp|cnn] [--steps N] [--repeats N] [--out FILE]

Every process it starts is stopped when it ends, also on errors.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from benchmarks import _common

WORKER = os.path.join(ROOT, "benchmarks", "ps_workers", "profile_worker.py")


def run_plain(model: str, warmup: int, steps: int, tmp: str) -> dict:
    children = _common.Children()
    out = os.path.join(tmp, "plain.json")
    try:
        proc = children.start([_common.python(), WORKER, "--mode", "plain", "--model", model, "--out", out,
                               "--warmup", str(warmup), "--steps", str(steps)], log_path=out + ".log")
        children.wait_all([proc], timeout=600)
    finally:
        children.stop_all()
    with open(out) as f:
        return json.load(f)


def run_tfdist(model: str, warmup: int, steps: int, tmp: str) -> dict:
    import psutil

    from tfdist.testing import LocalCluster

    out = tempfile.mkdtemp(prefix="tfdist-", dir=tmp)
    with LocalCluster(workers=2, ps=2, log_dir=os.path.join(out, "logs")) as cluster:
        cluster.start_ps()
        ps = [psutil.Process(cluster.process(f"ps:{i}").pid) for i in range(2)]

        def ps_cpu() -> float:
            return sum(t.user + t.system for t in (p.cpu_times() for p in ps))

        start = ps_cpu()
        cluster.start(WORKER, ["--mode", "tfdist", "--model", model, "--out", out, "--warmup", str(warmup),
                               "--steps", str(steps)])
        last = start
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:  # the PS tasks exit once both workers said Done
            try:
                last = ps_cpu()
            except psutil.Error:
                break
            if not any(cluster.process(f"worker:{i}").running for i in range(2)):
                break
            time.sleep(0.2)
        cluster.wait(60)
    workers = []
    for i in range(2):
        with open(os.path.join(out, f"worker-{i}.json")) as f:
            workers.append(json.load(f))
    total_steps = 2 * (warmup + steps)
    return {"workers": workers, "ps_cpu_s": last - start, "ps_cpu_ms_per_worker_step": 1e3 * (last - start) / total_steps}


def summarise(plain: dict, tfd: dict) -> dict:
    workers = tfd["workers"]
    worker_cpu = statistics.mean(w["cpu_ms_per_step"] for w in workers)
    parts = {k: statistics.mean(w["parts_ms_per_step"].get(k, 0.0) for w in workers)
             for k in workers[0]["parts_ms_per_step"]}
    return {
        "plain_cpu_ms_per_step": plain["cpu_ms_per_step"],
        "tfdist_worker_cpu_ms_per_step": worker_cpu,
        "added_cpu_ms_per_step": worker_cpu - plain["cpu_ms_per_step"],
        "ps_cpu_ms_per_worker_step": tfd["ps_cpu_ms_per_worker_step"],
        "job_cpu_ms_per_worker_step": worker_cpu + tfd["ps_cpu_ms_per_worker_step"],
        "worker_parts_ms_per_step": parts,
        "part_inside": workers[0]["part_inside"],
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="mlp", choices=sorted(_common.MODELS))
    p.add_argument("--warmup", type=int, default=50)
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--repeats", type=int, default=1, help="passes (plain, then tfdist), the median reported")
    p.add_argument("--out", help="also write the JSON here")
    args = p.parse_args()
    result = {"benchmark": "exchange_profile", "model": args.model, "machine": _common.machine(),
              "git": _common.git_info(ROOT), "versions": _common.package_versions(), "load_start": os.getloadavg()[0],
              "passes": []}
    with tempfile.TemporaryDirectory(prefix="tfdist-exchange-profile-") as tmp:
        for _ in range(args.repeats):
            plain = run_plain(args.model, args.warmup, args.steps, tmp)
            tfd = run_tfdist(args.model, args.warmup, args.steps, tmp)
            result["passes"].append({"load": os.getloadavg()[0], **summarise(plain, tfd)})
    keys = [k for k, v in result["passes"][0].items() if isinstance(v, float)]
    result["median"] = {k: statistics.median(p[k] for p in result["passes"]) for k in keys}
    text = json.dumps(result, indent=1)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
