"""The learnable task and the weight snapshots of ``benchmarks/stragglers_vs_peers.py``.

The task: a 64-dimensional Gaussian latent ``z`` seen through a fixed random
projection to 784 features, ``x = tanh(z P)``, labelled by a fixed random
linear teacher on the latent, ``y = argmax(z W)`` (10 classes). The benchmark
MLP (784-256-256-10, the model of ``ps_throughput.py``) learns it over a few
thousand steps (Adam 1e-4, batch 64: held-out accuracy 0.66 after 200 steps
of one worker, 0.80 after 400, 0.86 after 800, 0.88 after 2,000). Every
worker draws its own endless stream (``tf.random.stateless_normal`` seeded by
the worker and the batch, generated in its ``tf.data`` pipeline, so TF PSS's
workers generate it too): no example is seen twice, nothing is downloaded,
and every system gets the same data per worker. The held-out set is drawn
with numpy from the same distribution.

The snapshots: one process per system (the chief worker, or TF PSS's
coordinator) copies the model's weights every ``interval`` seconds to
``snap-NNNN.npz`` (with the wall time), written whole (temporary name, then a
rename) so that the driver may kill the job at any moment; the driver
evaluates them afterwards, the same way for every system.

No TensorFlow import at module level (the driver imports this before it starts
children).
"""

from __future__ import annotations

import glob
import os
import threading
import time

import numpy as np

DIM, LATENT, CLASSES = 784, 64, 10
TEACHER_SEED, HELDOUT_SEED = 1234, 99
HELDOUT = 4096
LEARNING_RATE = 1e-4


def _teacher() -> tuple[np.ndarray, np.ndarray]:
    """The projection ``P`` (latent -> features) and the linear teacher ``W`` (latent -> classes)."""
    rng = np.random.default_rng(TEACHER_SEED)
    p = (rng.standard_normal((LATENT, DIM)) / np.sqrt(LATENT)).astype(np.float32)
    w = rng.standard_normal((LATENT, CLASSES)).astype(np.float32)
    return p, w


def heldout() -> tuple[np.ndarray, np.ndarray]:
    p, w = _teacher()
    z = np.random.default_rng(HELDOUT_SEED).standard_normal((HELDOUT, LATENT)).astype(np.float32)
    return np.tanh(z @ p), np.argmax(z @ w, axis=1).astype(np.int64)


def dataset(worker: int, batch: int):
    """Worker ``worker``'s endless stream of fresh batches (the same in every system)."""
    import tensorflow as tf

    p, w = (tf.constant(a) for a in _teacher())
    stream = tf.constant(100 + worker, tf.int64)

    def make(i):
        z = tf.random.stateless_normal((batch, LATENT), seed=tf.stack([stream, i]))
        return tf.tanh(tf.matmul(z, p)), tf.argmax(tf.matmul(z, w), axis=1)

    ds = tf.data.Dataset.range(1 << 62).map(make).prefetch(2)
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    return ds.with_options(options)


def compile_model(keras, model, **kwargs) -> None:
    """Adam(LEARNING_RATE), sparse categorical cross-entropy from logits (Keras 3 or tf-keras); ``kwargs`` to compile."""
    model.compile(optimizer=keras.optimizers.Adam(LEARNING_RATE),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), **kwargs)


class Snapshots:
    """Copies ``read()`` (a list of arrays) to ``directory`` every ``interval`` s until ``until`` (wall time).

    Writes ``done`` when it stops. ``read`` runs on this thread: the model's
    variables are read while the training loop runs on another.
    """

    def __init__(self, read, directory: str, interval: float, until: float):
        self.read, self.directory, self.interval, self.until = read, directory, interval, until
        self.count = 0
        self.errors: list[str] = []
        self._thread = threading.Thread(target=self._run, name="snapshots", daemon=True)

    def start(self) -> "Snapshots":
        os.makedirs(self.directory, exist_ok=True)
        self._thread.start()
        return self

    def _save(self) -> None:
        now = time.time()
        arrays = [np.asarray(w) for w in self.read()]
        path = os.path.join(self.directory, f"snap-{self.count:04d}.npz")
        tmp = path + ".tmp.npz"
        np.savez(tmp, time=np.float64(now), **{f"w{i}": w for i, w in enumerate(arrays)})
        os.replace(tmp, path)
        self.count += 1

    def _run(self) -> None:
        next_at = time.time()
        while True:
            try:
                self._save()
            except Exception as e:  # noqa: BLE001 - reported in the done file, the run goes on
                self.errors.append(repr(e))
            next_at += self.interval
            if next_at > self.until:
                break
            time.sleep(max(next_at - time.time(), 0.0))
        with open(os.path.join(self.directory, "done"), "w") as f:
            f.write("\n".join(self.errors))


def read_snapshots(directory: str) -> list[tuple[float, list[np.ndarray]]]:
    """Every whole snapshot in ``directory``, oldest first: ``(wall time, weights)``."""
    out = []
    for path in sorted(glob.glob(os.path.join(directory, "snap-*.npz"))):
        if path.endswith(".tmp.npz"):
            continue
        with np.load(path) as z:
            n = len([k for k in z.files if k.startswith("w")])
            out.append((float(z["time"]), [z[f"w{i}"] for i in range(n)]))
    return out


def mlp_accuracy(weights: list[np.ndarray], x: np.ndarray, y: np.ndarray) -> float:
    """Accuracy of the benchmark MLP (Dense-relu, Dense-relu, Dense) with ``weights`` on ``(x, y)``, in numpy."""
    h = x
    pairs = list(zip(weights[0::2], weights[1::2]))
    for i, (kernel, bias) in enumerate(pairs):
        h = h @ kernel + bias
        if i < len(pairs) - 1:
            h = np.maximum(h, 0.0)
    return float(np.mean(np.argmax(h, axis=1) == y))
