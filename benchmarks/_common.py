"""Shared pieces of the benchmarks: models, synthetic data, step timing, child processes, docs sections.

Imported by ``benchmarks/ps_throughput.py`` (the driver, which must not import
TensorFlow before it forks children) and by the worker scripts in
``benchmarks/ps_workers/`` (which do). Only the functions that build models or
datasets import TensorFlow/Keras, lazily, so the same definitions serve Keras 3
and tf-keras (``TF_USE_LEGACY_KERAS=1``).
"""

from __future__ import annotations

import json
import os
import platform
import signal
import subprocess
import sys
import time
from typing import Sequence

#: Per-worker batch of every training configuration.
BATCH = 64
#: Distinct synthetic examples (repeated forever).
EXAMPLES = 2048
NUM_CLASSES = 10

#: name -> (input shape, description). MLP 784-256-256-10 on flattened 28x28;
#: CNN 2 conv + 2 dense on 32x32x3 (5x5 convs 32/64, dense 512: 2.16 M parameters).
MODELS = {
    "mlp": ((784,), "MLP 784-256-256-10 (0.27 M params) on synthetic 28x28 (flattened)"),
    "cnn": ((32, 32, 3), "CNN conv5x5(32)-pool-conv5x5(64)-pool-dense512-dense10 (2.16 M params) on synthetic 32x32x3"),
}


def make_model(keras, name: str):
    """The benchmark model ``name`` built with the given Keras module (Keras 3 or tf-keras)."""
    shape, _ = MODELS[name]
    L = keras.layers
    if name == "mlp":
        layers = [L.Dense(256, activation="relu"), L.Dense(256, activation="relu"), L.Dense(NUM_CLASSES)]
    elif name == "cnn":
        layers = [
            L.Conv2D(32, 5, padding="same", activation="relu"),
            L.MaxPooling2D(),
            L.Conv2D(64, 5, padding="same", activation="relu"),
            L.MaxPooling2D(),
            L.Flatten(),
            L.Dense(512, activation="relu"),
            L.Dense(NUM_CLASSES),
        ]
    else:
        raise ValueError(f"Unknown model {name!r}. Use one of {sorted(MODELS)}.")
    return keras.Sequential([keras.Input(shape), *layers])


def compile_model(keras, model, steps_per_execution: int = 1) -> None:
    """Adam(1e-3), sparse categorical cross-entropy from logits, no metrics (pure step cost)."""
    model.compile(
        optimizer=keras.optimizers.Adam(1e-3),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        steps_per_execution=steps_per_execution,
    )


def synthetic_arrays(name: str, seed: int = 0):
    import numpy as np

    shape, _ = MODELS[name]
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((EXAMPLES, *shape), dtype=np.float32)
    y = rng.integers(0, NUM_CLASSES, size=(EXAMPLES,), dtype=np.int64)
    return x, y


def synthetic_dataset(name: str, batch: int, seed: int = 0):
    """An endless ``tf.data`` pipeline of synthetic batches (in memory, prefetched)."""
    import tensorflow as tf

    x, y = synthetic_arrays(name, seed)
    ds = tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(batch, drop_remainder=True).prefetch(2)
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    return ds.with_options(options)


def step_timer_class(keras):
    """A Keras callback class recording the wall time at the end of every training batch."""

    class StepTimer(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.times: list[float] = []  # perf_counter at every batch end
            self.wall: list[float] = []  # time.time() at every batch end (to line workers up)
            self.cpu: list[float] = []  # process CPU seconds (all threads) at every batch end

        def on_train_batch_end(self, batch, logs=None):
            self.times.append(time.perf_counter())
            self.wall.append(time.time())
            self.cpu.append(time.process_time())

    return StepTimer


def read_net_bytes(iface: str = "eth0") -> tuple[int, int]:
    """``(tx_bytes, rx_bytes)`` of a network interface of this process's namespace, from sysfs."""
    base = f"/sys/class/net/{iface}/statistics"
    with open(f"{base}/tx_bytes") as tx, open(f"{base}/rx_bytes") as rx:
        return int(tx.read()), int(rx.read())


def net_counter_class(keras):
    """A Keras callback class reading an interface's byte counters at the ends of chosen batches."""

    class NetCounter(keras.callbacks.Callback):
        def __init__(self, iface: str, batches: Sequence[int]):
            super().__init__()
            self.iface = iface
            self.batches = tuple(batches)
            self.counts: dict[int, tuple[int, int]] = {}  # batch index -> (tx_bytes, rx_bytes) at its end
            read_net_bytes(iface)  # fail at once, not after the warm-up, if the interface is missing

        def on_train_batch_end(self, batch, logs=None):
            if batch in self.batches:
                self.counts[batch] = read_net_bytes(self.iface)

    return NetCounter


def start_barrier_class(keras):
    """A Keras callback class that, at the end of the first batch (traced, compiled), waits until every
    worker of the job has got there too: a file barrier in a directory all workers see (bounded wait)."""

    class StartBarrier(keras.callbacks.Callback):
        def __init__(self, directory: str, worker_id: int, num_workers: int, timeout: float = 180.0):
            super().__init__()
            self.directory, self.worker_id, self.num_workers, self.timeout = directory, worker_id, num_workers, timeout

        def on_train_batch_end(self, batch, logs=None):
            if batch != 0:
                return
            with open(os.path.join(self.directory, f"started-{self.worker_id}"), "w"):
                pass
            deadline = time.monotonic() + self.timeout
            while not all(os.path.exists(os.path.join(self.directory, f"started-{w}"))
                          for w in range(self.num_workers)):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"worker {self.worker_id}: the other workers did not finish their first step "
                                       f"within {self.timeout} s (files started-<id> in {self.directory})")
                time.sleep(0.02)

    return StartBarrier


def epoch_timer_class(keras):
    """A Keras callback class recording the wall time at every epoch end (for TF PSS, which
    refuses batch-level callbacks)."""

    class EpochTimer(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.epoch_times: list[float] = []

        def on_epoch_end(self, epoch, logs=None):
            self.epoch_times.append(time.perf_counter())

    return EpochTimer


def timed_window(times: Sequence[float], warmup: int, steps: int, batch: int) -> dict:
    """Throughput over ``steps`` batch ends after the first ``warmup`` ones."""
    if len(times) < warmup + steps:
        raise RuntimeError(f"only {len(times)} step times recorded, need warmup+steps={warmup + steps}")
    seconds = times[warmup + steps - 1] - times[warmup - 1]
    return {
        "warmup_steps": warmup,
        "timed_steps": steps,
        "seconds": seconds,
        "steps_per_s": steps / seconds,
        "examples_per_s": steps * batch / seconds,
        "batch": batch,
    }


def write_result(path: str, result: dict) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(result, f)
    os.replace(tmp, path)


def section_markers(name: str) -> tuple[str, str]:
    """The lines that open and close the Markdown section ``name``."""
    return f"<!-- section: {name} -->", f"<!-- /section: {name} -->"


def replace_section(path: str, name: str, text: str) -> None:
    """Rewrites the body of one marked section of a Markdown file, leaving the rest as it is.

    A section is the text between the lines ``<!-- section: NAME -->`` and
    ``<!-- /section: NAME -->`` (both kept). The file becomes
    ``<before>BEGIN + "\\n" + text + "\\n" + END<after>``; it is replaced atomically.

    Args:
        path: The Markdown file, e.g. ``docs/benchmarks.md``.
        name: The section name, e.g. ``"consistency"``.
        text: The new body, without the markers.

    Raises:
        ValueError: a marker is missing (or the end marker comes first).
    """
    begin_marker, end_marker = section_markers(name)
    with open(path, encoding="utf-8") as f:
        doc = f.read()
    begin = doc.find(begin_marker)
    end = doc.find(end_marker, begin + len(begin_marker)) if begin >= 0 else -1
    if end < 0:
        raise ValueError(
            f"{path} has no section {name!r}: it needs a line {begin_marker} and, after it, a line {end_marker}. "
            "Add both where the section belongs, then write the docs again."
        )
    doc = doc[:begin] + begin_marker + "\n" + text + "\n" + doc[end:]
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(doc)
    os.replace(tmp, path)


def machine() -> dict:
    """Short description of this machine and the software versions."""
    info = {
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "load_avg_1_5_15": list(os.getloadavg()),
    }
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


class Children:
    """Child processes started by a benchmark; :meth:`stop_all` kills every one (bounded)."""

    def __init__(self):
        self.procs: list[subprocess.Popen] = []

    def start(self, argv: Sequence[str], env: dict | None = None, log_path: str | None = None) -> subprocess.Popen:
        forked = _forked(argv, env, log_path)
        if forked is not None:
            self.procs.append(forked)
            return forked
        out = open(log_path, "wb") if log_path else subprocess.DEVNULL
        try:
            proc = subprocess.Popen(
                list(argv), env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        finally:
            if log_path:
                out.close()
        proc.log_path = log_path  # type: ignore[attr-defined]
        self.procs.append(proc)
        return proc

    def wait_all(self, procs: Sequence[subprocess.Popen], timeout: float) -> None:
        """Waits (bounded) until ``procs`` exit 0; raises with the log tail of a failed one."""
        deadline = time.monotonic() + timeout
        pending = list(procs)
        while pending:
            for p in list(pending):
                code = p.poll()
                if code is None:
                    continue
                pending.remove(p)
                if code != 0:
                    raise RuntimeError(f"{p.args[1:3]} exited with {code}:\n{log_tail(p)}")
            if pending and time.monotonic() > deadline:
                raise TimeoutError(
                    f"{[p.args[1:3] for p in pending]} still running after {timeout:g} s:\n"
                    + "\n".join(log_tail(p) for p in pending)
                )
            time.sleep(0.1)

    def stop_all(self, grace: float = 3.0) -> None:
        for p in self.procs:
            if p.poll() is None:
                _signal_group(p, signal.SIGTERM)
        deadline = time.monotonic() + grace
        for p in self.procs:
            try:
                p.wait(timeout=max(deadline - time.monotonic(), 0.05))
            except subprocess.TimeoutExpired:
                _signal_group(p, signal.SIGKILL)
                try:
                    p.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    pass
        self.procs.clear()


def _forked(argv: Sequence[str], env: dict | None, log_path: str | None):
    """The child forked from tfdist's zygote, or None: only with ``TFDIST_FAST_START=1``, under which the
    benchmarks' ``LocalCluster`` tasks fork from it too (the test suite's smoke runs set it; the documented
    benchmark commands do not). Its output goes to ``log_path`` as a started child's would."""
    try:
        from tfdist.cluster import zygote  # no TensorFlow import: the driver stays light
    except ImportError:
        return None
    argv = list(argv)
    proc = zygote.try_spawn(argv, dict(os.environ if env is None else env))
    if proc is None:
        return None

    def pump(stream):  # each stream appends whole lines to the log, as the started child's two would
        sink = open(log_path, "a", encoding="utf-8", errors="replace") if log_path else None
        for line in iter(stream.readline, ""):
            if sink is not None:
                sink.write(line)
                sink.flush()
        stream.close()
        if sink is not None:
            sink.close()

    import threading

    for stream in (proc.stdout, proc.stderr):
        threading.Thread(target=pump, args=(stream,), daemon=True).start()
    proc.args, proc.log_path = argv, log_path
    return proc


def _signal_group(p: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(p.pid, sig)  # each child leads its own session (start_new_session=True)
    except (ProcessLookupError, PermissionError):
        try:
            p.send_signal(sig)
        except (ProcessLookupError, AttributeError):  # AttributeError: a forked child (no send_signal)
            pass


def log_tail(p: subprocess.Popen, lines: int = 25) -> str:
    path = getattr(p, "log_path", None)
    if not path or not os.path.exists(path):
        return "(no log)"
    with open(path, encoding="utf-8", errors="replace") as f:
        return "".join(f.readlines()[-lines:])


def python() -> str:
    return sys.executable


def git_info(root: str) -> dict:
    """The commit a benchmark ran at and how many tracked files differed from it."""
    import subprocess

    def git(*args):
        try:
            return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, timeout=10).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return None

    status = git("status", "--porcelain", "--untracked-files=no") or ""
    return {"commit": git("rev-parse", "--short", "HEAD"), "modified_tracked_files": len(status.splitlines())}


def package_versions(names=("tensorflow", "keras", "tf_keras", "grpcio", "numpy")) -> dict:
    """Installed versions of ``names`` (``None`` where not installed)."""
    from importlib import metadata

    out = {}
    for name in names:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out
