"""Input-pipeline benchmark: the queue-fed dataset vs tf.data, and the shared queue.

Prints one JSON object. Measures, on the same machine in one run:

1. ``local``: examples/s of ``RandomShuffleQueue`` + ``QueueRunner`` +
   ``as_dataset`` against an equivalent ``tf.data`` pipeline (parallel
   interleave over the same shard files, the same numpy decoding, the same
   shuffle buffer, batch and prefetch). A ``tf.data`` pipeline with native
   decoding (``FixedLengthRecordDataset`` + ``decode_raw``) is reported too,
   for reference.
2. ``shared``: examples/s of a ``SharedQueueServer`` over loopback with 1 and
   2 consumer processes (``tfdist.data.queue_consumer``, no compute).
3. ``balance``: each worker's share of the batches of one epoch with three
   workers, one of them 3x slower (injected per-batch delay).

Usage::

    python benchmarks/input_pipeline.py [--examples 40000] [--repeats 3] [--out FILE]
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402

H = W = 28
RECORD = H * W + 1  # uint8 image + uint8 label
CHUNK = 256  # records read and decoded per producer step
BATCH = 64
SHUFFLE = 10_000


# -- data and decoding work (shared by both pipelines) ---------------------------------


def write_shards(directory: str, examples: int, shards: int, seed: int = 0) -> list[str]:
    rng = np.random.default_rng(seed)
    paths = []
    per = examples // shards
    for s in range(shards):
        records = rng.integers(0, 256, size=(per, RECORD), dtype=np.uint8)
        records[:, -1] %= 10
        path = os.path.join(directory, f"shard-{s:03d}.bin")
        records.tofile(path)
        paths.append(path)
    return paths


def decode(raw: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The decoding work: bytes -> normalised float images (random flips) + labels."""
    images = raw[:, :-1].reshape(-1, H, W).astype(np.float32) / 255.0
    images = (images - 0.1307) / 0.3081
    flip = raw[:, 0] % 2 == 1  # deterministic "random" horizontal flip
    images[flip] = images[flip, :, ::-1]
    return images[..., None], raw[:, -1].astype(np.int64)


def read_shard(path) -> "iter":
    """Producer: decoded chunks of one shard file."""
    if isinstance(path, bytes):
        path = path.decode()
    data = np.fromfile(path, dtype=np.uint8).reshape(-1, RECORD)
    for start in range(0, len(data), CHUNK):
        yield decode(data[start : start + CHUNK])


# -- 1. local -------------------------------------------------------------------------


def consume(ds) -> int:
    n = 0
    for _, y in ds:
        n += int(y.shape[0])
    return n


class Timer:
    """Wall time and this process's CPU time (all threads) of a block."""

    def __enter__(self):
        self.wall, self.cpu = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, *exc):
        self.wall = time.perf_counter() - self.wall
        self.cpu = time.process_time() - self.cpu


def run_queue(paths: list[str], threads: int) -> tuple[int, Timer]:
    import tfdist.data as td

    queue = td.RandomShuffleQueue(capacity=SHUFFLE, min_after_dequeue=SHUFFLE // 5, seed=0)
    runner = td.QueueRunner(
        queue, [functools.partial(read_shard, p) for p in paths], num_threads=threads, enqueue_many=True
    )
    with td.Coordinator() as coord, Timer() as timer:
        runner.start(coord)
        n = consume(queue.as_dataset(batch_size=BATCH, prefetch=2))
    return n, timer


def run_tf_data_equivalent(paths: list[str], threads: int) -> tuple[int, Timer]:
    import tensorflow as tf

    sig = (
        tf.TensorSpec([None, H, W, 1], tf.float32),
        tf.TensorSpec([None], tf.int64),
    )
    ds = (
        tf.data.Dataset.from_tensor_slices(paths)
        .interleave(
            lambda p: tf.data.Dataset.from_generator(read_shard, args=(p,), output_signature=sig),
            cycle_length=threads,
            num_parallel_calls=threads,
        )
        .unbatch()
        .shuffle(SHUFFLE, seed=0)
        .batch(BATCH)
        .prefetch(2)
    )
    with Timer() as timer:
        n = consume(ds)
    return n, timer


def run_tf_data_native(paths: list[str], threads: int) -> tuple[int, Timer]:
    import tensorflow as tf

    def parse(raw):
        v = tf.io.decode_raw(raw, tf.uint8)
        img = tf.cast(tf.reshape(v[:-1], [H, W, 1]), tf.float32) / 255.0
        img = (img - 0.1307) / 0.3081
        img = tf.cond(v[0] % 2 == 1, lambda: tf.reverse(img, [1]), lambda: img)
        return img, tf.cast(v[-1], tf.int64)

    ds = (
        tf.data.FixedLengthRecordDataset(paths, RECORD, num_parallel_reads=threads)
        .map(parse, num_parallel_calls=tf.data.AUTOTUNE)
        .shuffle(SHUFFLE, seed=0)
        .batch(BATCH)
        .prefetch(2)
    )
    with Timer() as timer:
        n = consume(ds)
    return n, timer


def bench_local(paths: list[str], repeats: int, threads: int) -> dict:
    import tensorflow as tf  # noqa: F401  (import cost kept out of the timings)

    results = {}
    runs = {
        "queue_dataset": run_queue,
        "tf_data_equivalent": run_tf_data_equivalent,
        "tf_data_native_decode": run_tf_data_native,
    }
    for name, fn in runs.items():
        fn(paths[:1], threads)  # warm-up
    rates = {name: [] for name in runs}
    cpu = {name: [] for name in runs}
    for _ in range(repeats):  # interleave the runs so machine noise hits all of them
        for name, fn in runs.items():
            n, timer = fn(paths, threads)
            rates[name].append(n / timer.wall)
            cpu[name].append(1000 * timer.cpu / n * 1000)
    for name, values in rates.items():
        results[name] = {
            "examples_per_s_median": round(statistics.median(values)),
            "examples_per_s_runs": [round(v) for v in values],
            # CPU time of this process per 1,000 examples: less sensitive to
            # other load on a shared machine than wall-clock rates
            "cpu_ms_per_1k_examples_median": round(statistics.median(cpu[name]), 1),
        }
    results["ratio_queue_vs_tf_data_equivalent"] = round(
        results["queue_dataset"]["examples_per_s_median"]
        / results["tf_data_equivalent"]["examples_per_s_median"],
        3,
    )
    results["cpu_ratio_tf_data_equivalent_vs_queue"] = round(
        results["tf_data_equivalent"]["cpu_ms_per_1k_examples_median"]
        / results["queue_dataset"]["cpu_ms_per_1k_examples_median"],
        3,
    )
    results["ratio_queue_vs_tf_data_native_decode"] = round(
        results["queue_dataset"]["examples_per_s_median"]
        / results["tf_data_native_decode"]["examples_per_s_median"],
        3,
    )
    return results


# -- 2. and 3. shared queue ----------------------------------------------------------------


def chunk_producer(examples: int):
    images, labels = decode(np.random.default_rng(0).integers(0, 256, (1024, RECORD), dtype=np.uint8))

    def produce(epoch):
        for start in range(0, examples, 1024):
            k = min(1024, examples - start)
            yield images[:k], labels[:k]

    return produce


def start_consumers(address: str, specs: list[tuple[str, float]], batch_size: int) -> list:
    procs = []
    for name, delay in specs:
        procs.append(
            subprocess.Popen(
                [
                    sys.executable, "-m", "tfdist.data.queue_consumer", "--address", address,
                    "--batch-size", str(batch_size), "--delay-s", str(delay), "--worker", name,
                ],
                stdout=subprocess.PIPE,
                text=True,
            )
        )
    return procs


def finish(procs: list, timeout: float = 300) -> list[list[dict]]:
    """Waits for the consumers; returns each one's batch events."""
    out = []
    try:
        for p in procs:
            stdout, _ = p.communicate(timeout=timeout)
            if p.returncode != 0:
                raise RuntimeError(f"consumer exited with {p.returncode}")
            out.append([json.loads(l) for l in stdout.splitlines() if '"batch"' in l])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(10)
    return out


def bench_shared(examples: int, consumers: int, repeats: int) -> dict:
    from tfdist.data import FIFOQueue, SharedQueueServer

    rates = []
    for _ in range(repeats):
        with SharedQueueServer(
            FIFOQueue(capacity=SHUFFLE), producers=[chunk_producer(examples)], enqueue_many=True
        ) as server:
            procs = start_consumers(server.address, [(f"c{i}", 0.0) for i in range(consumers)], BATCH)
            events = finish(procs)
        assert sum(b["size"] for ev in events for b in ev) == examples
        # over the window in which every consumer was receiving (consumer
        # processes start a few hundred ms apart)
        start = max(ev[0]["t"] for ev in events)
        end = min(ev[-1]["t"] for ev in events)
        in_window = sum(b["size"] for ev in events for b in ev if start < b["t"] <= end)
        rates.append(in_window / (end - start))
    mb = (H * W * 4 + 8) * statistics.median(rates) / 1e6
    return {
        "consumers": consumers,
        "examples_per_s_median": round(statistics.median(rates)),
        "examples_per_s_runs": [round(r) for r in rates],
        "payload_MB_per_s": round(mb, 1),
    }


def bench_balance(examples: int, delay_s: float) -> dict:
    from tfdist.data import FIFOQueue, SharedQueueServer

    specs = [("fast0", delay_s), ("fast1", delay_s), ("slow", 3 * delay_s)]
    with SharedQueueServer(
        FIFOQueue(capacity=SHUFFLE), producers=[chunk_producer(examples)], enqueue_many=True
    ) as server:
        events = finish(start_consumers(server.address, specs, BATCH))
        stats = server.stats()
    names = [name for name, _ in specs]
    # Shares over the window in which all three workers were consuming
    # (consumer processes start a few hundred ms apart).
    start = max(ev[0]["t"] for ev in events)
    end = min(ev[-1]["t"] for ev in events)
    in_window = {n: sum(start <= b["t"] <= end for b in ev) for n, ev in zip(names, events)}
    whole = {n: len(ev) for n, ev in zip(names, events)}
    total = sum(in_window.values())
    fast_mean = (in_window["fast0"] + in_window["fast1"]) / 2
    return {
        "workers": {name: f"{d * 1000:.0f} ms/batch" for name, d in specs},
        "batches_whole_epoch": whole,
        "window_s": round(end - start, 2),
        "batches_in_window": in_window,
        "share_in_window": {n: round(b / total, 3) for n, b in in_window.items()},
        "ideal_share": {"fast0": 0.429, "fast1": 0.429, "slow": 0.143},
        "slow_vs_fast_batches": round(in_window["slow"] / fast_mean, 3),
        "acked_examples": sum(w["acked_examples"] for w in stats["workers"].values()),
        "examples": examples,
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=40_000)
    parser.add_argument("--shards", type=int, default=8)
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--shared-examples", type=int, default=64_000)
    parser.add_argument("--balance-examples", type=int, default=19_200)
    parser.add_argument("--balance-delay-s", type=float, default=0.02)
    parser.add_argument("--out", help="also write the JSON here")
    args = parser.parse_args(argv)
    from tfdist import constants

    # the servers and the consumer processes share a job token
    os.environ.setdefault(constants.ENV_TOKEN, os.urandom(16).hex())

    result = {
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "settings": vars(args) | {"batch_size": BATCH, "shuffle_buffer": SHUFFLE, "chunk": CHUNK},
    }
    with tempfile.TemporaryDirectory(prefix="tfdist-bench-") as tmp:
        paths = write_shards(tmp, args.examples, args.shards)
        result["local"] = bench_local(paths, args.repeats, args.threads)
    result["shared"] = [bench_shared(args.shared_examples, c, args.repeats) for c in (1, 2)]
    result["balance"] = bench_balance(args.balance_examples, args.balance_delay_s)
    import tensorflow as tf

    result["machine"]["tensorflow"] = tf.__version__
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
