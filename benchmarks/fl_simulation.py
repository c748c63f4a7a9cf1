"""Federated-simulation benchmark: tfdist vs sequential Keras loops vs Flower.

One workload for every variant: scikit-learn digits (1,437 train / 360 test),
100 clients with a Dirichlet(alpha=0.5) label split, 20 clients per round,
1 local epoch, batch 16, 30 rounds, an MLP 64-64-10, local SGD lr=0.3, FedAvg.

Variants (each in a fresh subprocess, so start-up and CPU are measured alone):
  sequential_fit    one Keras model kept for the run; model.fit per client
  naive_rebuild     a model built and compiled per client, then model.fit
  flower_quickstart Flower's simulation engine (Ray), client and model built
                    per call as Flower's TensorFlow quickstart does
  flower_cached     Flower, each Ray actor keeps its built model
  tfdist_w2/_w4     tfdist.federated.Simulation with 2 / 4 train workers
  tfdist_inline     tfdist with num_workers=0 (compiled step, no processes)

Reported per variant: total wall (start-up included), the round loop's wall
(round 1 start to the last evaluation; start-up excluded), rounds/s from that,
the median per-round time (steady state), final test accuracy, and the CPU
time of the whole process tree over the run / (wall x cores).

Usage:
  python benchmarks/fl_simulation.py                       # all variants, prints JSON
  python benchmarks/fl_simulation.py --write-docs          # also fills docs/benchmarks.md
  python benchmarks/fl_simulation.py --variants tfdist_w2,sequential_fit --rounds 10
Flower needs ``pip install "flwr[simulation]"``; it pins protobuf/packaging
versions that differ from TensorFlow's environment here, so by default it runs
from a separate virtual environment given by ``--flower-python``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)

from benchmarks import _common  # noqa: E402

SECTION = "federated"  # the marked section of docs/benchmarks.md this script rewrites
ALL_VARIANTS = ["sequential_fit", "naive_rebuild", "flower_quickstart", "flower_cached", "tfdist_w2", "tfdist_w4",
                "tfdist_inline"]
NUM_CLIENTS, CLIENTS_PER_ROUND, BATCH, EPOCHS, LR, ALPHA, SEED = 100, 20, 16, 1, 0.3, 0.5, 0


# --------------------------------------------------------------------------- workload
def workload():
    from tfdist.federated import load_digits_split, partition

    (x, y), test = load_digits_split(test_fraction=0.2, seed=SEED)
    data = partition(x, y, num_clients=NUM_CLIENTS, scheme="dirichlet", alpha=ALPHA, seed=SEED)
    return data, test


def make_model():
    from tfdist.federated import make_mlp

    return make_mlp(64, 10, (64,), seed=SEED)


def compiled_model():
    import keras

    model = make_model()
    model.compile(optimizer=keras.optimizers.SGD(learning_rate=LR),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    return model


def sample(round_num):
    import numpy as np

    from tfdist.federated import FedAvg

    return FedAvg(CLIENTS_PER_ROUND).sample_clients(np.arange(NUM_CLIENTS), round_num, np.random.default_rng([SEED, round_num, 1]))


# --------------------------------------------------------------------------- children
def _keras_loop(rounds, rebuild):
    from tfdist.federated.aggregate import weighted_average

    data, (xt, yt) = workload()
    t_start = time.perf_counter()
    model = compiled_model()
    weights = model.get_weights()
    acc = [model.evaluate(xt, yt, verbose=0, batch_size=len(yt))[1]]
    round_s = []
    t_loop = time.perf_counter()
    for r in range(1, rounds + 1):
        t0 = time.perf_counter()
        new, sizes = [], []
        for c in sample(r):
            m = compiled_model() if rebuild else model
            m.set_weights(weights)
            m.fit(data[c].x, data[c].y, epochs=EPOCHS, batch_size=BATCH, verbose=0)
            new.append(m.get_weights())
            sizes.append(data[c].num_examples)
        weights = weighted_average(new, sizes)
        model.set_weights(weights)
        acc.append(model.evaluate(xt, yt, verbose=0, batch_size=len(yt))[1])
        round_s.append(time.perf_counter() - t0)
    loop = time.perf_counter() - t_loop
    return {"accuracy": acc, "round_s": round_s, "loop_wall_s": loop, "startup_s": t_loop - t_start}


def _tfdist(rounds, workers):
    from tfdist.federated import FedAvg, Simulation

    data, test = workload()
    sim = Simulation(make_model, data, strategy=FedAvg(CLIENTS_PER_ROUND), test_data=test, num_workers=workers,
                     rounds=rounds, client={"learning_rate": LR, "batch_size": BATCH, "local_epochs": EPOCHS},
                     seed=SEED, progress=False)
    h = sim.run()
    return {"accuracy": h.accuracy, "round_s": [r.wall_time_s for r in h.rounds[1:]], "loop_wall_s": h.loop_wall_s,
            "startup_s": h.startup_s, "worker_utilisation": h.worker_utilisation}


# Flower ------------------------------------------------------------------------------
_FLOWER_CACHE: dict = {}
_FLOWER_LOG: list = []


def _flower_client(cached):
    import numpy as np
    from flwr.client import NumPyClient

    class KerasClient(NumPyClient):
        def __init__(self, model, x, y):
            self.model, self.x, self.y = model, x, y

        def fit(self, parameters, config):
            self.model.set_weights(parameters)
            self.model.fit(self.x, self.y, epochs=EPOCHS, batch_size=BATCH, verbose=0)
            return self.model.get_weights(), len(self.x), {}

    def client_fn(context):
        if "data" not in _FLOWER_CACHE:
            _FLOWER_CACHE["data"] = workload()[0]
        part = _FLOWER_CACHE["data"][int(context.node_config["partition-id"])]
        if cached:
            model = _FLOWER_CACHE.get("model")
            if model is None:
                model = _FLOWER_CACHE["model"] = compiled_model()
        else:
            model = compiled_model()  # quickstart: load_model() inside client_fn
        return KerasClient(model, part.x, part.y.astype(np.int64)).to_client()

    return client_fn


def client_fn_quickstart(context):
    return _flower_client(False)(context)


def client_fn_cached(context):
    return _flower_client(True)(context)


def _flower(rounds, cached):
    from flwr.client import ClientApp
    from flwr.common import ndarrays_to_parameters
    from flwr.server import ServerApp, ServerAppComponents, ServerConfig
    from flwr.server.strategy import FedAvg
    from flwr.simulation import run_simulation

    _, (xt, yt) = workload()
    t_start = time.perf_counter()
    eval_model = compiled_model()

    def evaluate_fn(server_round, parameters, config):
        eval_model.set_weights(parameters)
        loss, acc = eval_model.evaluate(xt, yt, verbose=0, batch_size=len(yt))
        _FLOWER_LOG.append((server_round, time.perf_counter(), acc))
        return loss, {"accuracy": acc}

    def server_fn(context):
        strategy = FedAvg(fraction_fit=CLIENTS_PER_ROUND / NUM_CLIENTS, fraction_evaluate=0.0,
                          min_fit_clients=CLIENTS_PER_ROUND, min_evaluate_clients=0,
                          min_available_clients=NUM_CLIENTS, evaluate_fn=evaluate_fn,
                          initial_parameters=ndarrays_to_parameters(eval_model.get_weights()))
        return ServerAppComponents(strategy=strategy, config=ServerConfig(num_rounds=rounds))

    import fl_simulation as module  # by reference, so Ray actors import it instead of unpickling closures

    client_app = ClientApp(client_fn=module.client_fn_cached if cached else module.client_fn_quickstart)
    run_simulation(server_app=ServerApp(server_fn=server_fn), client_app=client_app, num_supernodes=NUM_CLIENTS,
                   backend_config={"client_resources": {"num_cpus": 1, "num_gpus": 0.0},
                                   "init_args": {"num_cpus": os.cpu_count(), "include_dashboard": False}})
    times = [t for _, t, _ in _FLOWER_LOG]
    if len(times) != rounds + 1:
        raise RuntimeError(f"Flower evaluated {len(times)} times, expected {rounds + 1}: {_FLOWER_LOG}")
    return {"accuracy": [a for _, _, a in _FLOWER_LOG], "round_s": [b - a for a, b in zip(times, times[1:])],
            "loop_wall_s": times[-1] - times[0], "startup_s": times[0] - t_start}


def child(variant: str, rounds: int) -> dict:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    if variant == "sequential_fit":
        return _keras_loop(rounds, rebuild=False)
    if variant == "naive_rebuild":
        return _keras_loop(rounds, rebuild=True)
    if variant in ("flower_quickstart", "flower_cached"):
        return _flower(rounds, cached=variant == "flower_cached")
    if variant.startswith("tfdist_w"):
        return _tfdist(rounds, int(variant[len("tfdist_w"):]))
    if variant == "tfdist_inline":
        return _tfdist(rounds, 0)
    raise SystemExit(f"unknown variant {variant!r}; use one of {ALL_VARIANTS}")


# --------------------------------------------------------------------------- parent
def _tree_cpu_s(proc, seen: dict) -> float:
    import psutil

    try:
        procs = [proc] + proc.children(recursive=True)
    except psutil.NoSuchProcess:
        return sum(seen.values())
    for p in procs:
        try:
            t = p.cpu_times()
            seen[p.pid] = max(seen.get(p.pid, 0.0), t.user + t.system + t.children_user + t.children_system)
        except psutil.NoSuchProcess:
            pass
    return sum(seen.values())


def run_variant(variant, rounds, python, timeout_s):
    import psutil

    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, HERE, os.environ.get("PYTHONPATH", "")]),
               TF_CPP_MIN_LOG_LEVEL="3", RAY_DEDUP_LOGS="0")
    cmd = [python, os.path.abspath(__file__), "--child", variant, "--rounds", str(rounds)]
    load_before = os.getloadavg()[0]
    t0 = time.perf_counter()
    popen = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)
    proc = psutil.Process(popen.pid)
    seen: dict = {}
    stop = threading.Event()

    def sampler():
        while not stop.wait(0.2):
            _tree_cpu_s(proc, seen)

    th = threading.Thread(target=sampler, daemon=True)
    th.start()
    try:
        out, err = popen.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        for p in [proc] + proc.children(recursive=True):
            p.kill()
        out, err = popen.communicate()
        stop.set()
        return {"variant": variant, "error": f"timed out after {timeout_s} s", "stderr_tail": err[-2000:]}
    finally:
        stop.set()
        th.join()
    wall = time.perf_counter() - t0
    lines = [l for l in out.splitlines() if l.startswith("{")]
    if popen.returncode != 0 or not lines:
        return {"variant": variant, "error": f"exit code {popen.returncode}", "stderr_tail": err[-3000:]}
    res = json.loads(lines[-1])
    cpu = sum(seen.values())
    res.update({
        "variant": variant, "rounds": rounds, "wall_s": wall, "python": python,
        "load_average_before": load_before, "load_average_after": os.getloadavg()[0],
        "rounds_per_s": rounds / res["loop_wall_s"], "s_per_round": res["loop_wall_s"] / rounds,
        "median_round_s": statistics.median(res["round_s"]) if res["round_s"] else None,
        "final_accuracy": res["accuracy"][-1], "cpu_s": cpu,
        "cpu_utilisation": cpu / (wall * os.cpu_count()),
    })
    del res["round_s"]
    return res


def write_docs(report: dict, path: str) -> None:
    rows = {r["variant"]: r for r in report["results"] if "error" not in r}
    def ratio(a, b):
        return f"{rows[a]['rounds_per_s'] / rows[b]['rounds_per_s']:.1f}x" if a in rows and b in rows else "n/a"
    lines = [
        "## Federated simulation (`benchmarks/fl_simulation.py`)",
        "",
        "Workload, identical for every row: scikit-learn digits (1,437 train / 360 test), 100 clients "
        "(Dirichlet alpha=0.5 over labels), 20 clients per round, 1 local epoch, batch 16, "
        f"{report['rounds']} rounds, MLP 64-64-10, local SGD lr=0.3, FedAvg, test accuracy after every round. "
        f"Machine: {report['cores']} cores, shared (load average at start {report['load_average'][0]:.2f}). "
        "Each row is a fresh process tree.",
        "",
        f"Command: `{report['command']}`",
        "",
        "| variant | rounds run | rounds/s | s/round (loop) | median s/round | start-up s | total wall s | final acc | CPU util | load avg before/after |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in report["results"]:
        if "error" in r:
            lines.append(f"| {r['variant']} | failed: {r['error']} | | | | | | | | |")
            continue
        lines.append(
            f"| {r['variant']} | {r['rounds']} | {r['rounds_per_s']:.2f} | {r['s_per_round']:.3f} | {r['median_round_s']:.3f} | "
            f"{r['startup_s']:.1f} | {r['wall_s']:.1f} | {r['final_accuracy']:.3f} | {100 * r['cpu_utilisation']:.0f}% | "
            f"{r.get('load_average_before', float('nan')):.1f} / {r.get('load_average_after', float('nan')):.1f} |"
        )
    lines += ["", *[f"Note: {n}" for n in report.get("notes", [])]] if report.get("notes") else []
    lines += [
        "",
        f"Ratios (rounds/s): tfdist 2 workers vs Flower with cached models {ratio('tfdist_w2', 'flower_cached')}, "
        f"vs the sequential fit loop {ratio('tfdist_w2', 'sequential_fit')}, vs Flower quickstart "
        f"{ratio('tfdist_w2', 'flower_quickstart')}; 4 workers vs 2 {ratio('tfdist_w4', 'tfdist_w2')}.",
        "",
        "How to read it:",
        "",
        "* *rounds/s* and *s/round (loop)* cover round 1 to the last evaluation (30 rounds of training plus a "
        "test-set evaluation after each); *start-up* (interpreter, TF import, model build, worker spawn, Ray start) "
        "is separate and also inside *total wall*. *median s/round* is the steady state. *CPU util* is the CPU "
        "time of the variant's whole process tree over its total wall time and all cores.",
        "* `sequential_fit` keeps one compiled Keras model and calls `model.fit` per client; `naive_rebuild` builds "
        "and compiles a model per client; `flower_quickstart` is Flower's simulation engine (`run_simulation`, Ray "
        "backend, 1 CPU per client actor) with the client and model built in `client_fn` as Flower's TensorFlow "
        "quickstart does; `flower_cached` keeps one built model per Ray actor (still `model.fit`, as a Flower "
        "`NumPyClient` does). `tfdist_w2`/`tfdist_w4` are `tfdist.federated.Simulation` with 2/4 train workers "
        "plus its test process; `tfdist_inline` is `num_workers=0` (the compiled step, no processes).",
        "* tfdist's rows have identical accuracy curves whatever the number of workers (same seed); the Keras and "
        "Flower loops sample their own clients and shuffle differently, so their final accuracies differ by noise.",
        "* Flower (`flwr[simulation]`, the `bench` extra) pins protobuf/packaging versions other than the ones "
        "TensorFlow's test environment here uses, so it ran from a separate virtual environment "
        "(`--flower-python`), same TensorFlow 2.21 / Keras 3.15.",
        "* The machine is shared with other jobs: the load average columns show how busy it was around each "
        "row. Compare rows of one run, not absolute numbers across runs.",
        "",
    ]
    _common.replace_section(path, SECTION, "\n".join(lines))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--variants", default=",".join(ALL_VARIANTS))
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--flower-python", default=os.environ.get("TFDIST_FLOWER_PYTHON", sys.executable),
                        help="interpreter with flwr[simulation] installed (default: this one)")
    parser.add_argument("--timeout-s", type=float, default=1200)
    parser.add_argument("--output", help="write the JSON report here")
    parser.add_argument("--write-docs", action="store_true", help="fill the federated section of docs/benchmarks.md")
    parser.add_argument("--from-json", help="only rewrite the docs table from a saved --output report")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child, args.rounds)), flush=True)
        return 0
    if args.from_json:
        with open(args.from_json, encoding="utf-8") as f:
            write_docs(json.load(f), os.path.join(ROOT, "docs", "benchmarks.md"))
        return 0
    report = {"rounds": args.rounds, "cores": os.cpu_count(), "load_average": os.getloadavg(),
              "command": "python benchmarks/fl_simulation.py " + " ".join(a for a in (argv or sys.argv[1:])),
              "results": []}
    for variant in args.variants.split(","):
        python = args.flower_python if variant.startswith("flower") else sys.executable
        res = run_variant(variant, args.rounds, python, args.timeout_s)
        report["results"].append(res)
        print(json.dumps({k: v for k, v in res.items() if k != "accuracy"}), file=sys.stderr, flush=True)
    print(json.dumps(report, indent=1))
    if args.output:
        with open(args.output, "w", encoding="utf-8") as f:
            json.dump(report, f, indent=1)
    if args.write_docs:
        write_docs(report, os.path.join(ROOT, "docs", "benchmarks.md"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
