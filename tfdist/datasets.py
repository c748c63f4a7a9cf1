"""Small real datasets for examples, tests and benchmarks, offline-safe.

:func:`load_mnist_or_digits` returns TFDS MNIST when it is already on disk or
can be downloaded, and otherwise scikit-learn's bundled handwritten digits
(1,797 real 8×8 images, no network needed) — and says which it returned.
"""

from __future__ import annotations

import logging
import os
import socket
from dataclasses import dataclass

import numpy as np

__all__ = ["ImageData", "load_digits", "load_mnist", "load_mnist_or_digits", "network_available"]

logger = logging.getLogger(__name__)

_TFDS_HOST = ("storage.googleapis.com", 443)


@dataclass
class ImageData:
    """Images in [0, 1] of shape ``(n, h, w, 1)`` and integer labels."""

    name: str
    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray

    @property
    def num_classes(self) -> int:
        return int(max(self.y_train.max(), self.y_test.max())) + 1

    def shard(self, index: int, count: int) -> "ImageData":
        """Every ``count``-th training example starting at ``index`` (test set whole)."""
        return ImageData(self.name, self.x_train[index::count], self.y_train[index::count], self.x_test, self.y_test)


def network_available(timeout: float = 3.0) -> bool:
    """True if the TFDS download host answers within ``timeout`` seconds."""
    try:
        socket.create_connection(_TFDS_HOST, timeout=timeout).close()
        return True
    except OSError:
        return False


def _digits_arrays() -> tuple[np.ndarray, np.ndarray]:
    """(images (1797, 8, 8), labels) of scikit-learn's bundled digits.

    Read straight from the file scikit-learn ships (``datasets/data/digits.csv.gz``,
    the one its ``load_digits`` reads), located without importing scikit-learn:
    that import costs every worker process about a second. Falls back to
    ``sklearn.datasets.load_digits`` if the file is not where it should be.
    """
    import importlib.util

    spec = importlib.util.find_spec("sklearn")
    for root in (spec.submodule_search_locations or []) if spec is not None else []:
        path = os.path.join(root, "datasets", "data", "digits.csv.gz")
        if os.path.exists(path):
            data = np.loadtxt(path, delimiter=",")
            return data[:, :-1].reshape(-1, 8, 8), data[:, -1]
    from sklearn.datasets import load_digits as _load

    d = _load()
    return d.images, d.target


def load_digits(test_fraction: float = 0.2, seed: int = 0) -> ImageData:
    """scikit-learn's bundled 8×8 digits, split per class with a fixed seed."""
    images, target = _digits_arrays()
    x = (images.astype("float32") / 16.0)[..., None]
    y = target.astype("int64")
    rng = np.random.default_rng(seed)
    test_idx = []
    for c in np.unique(y):
        idx = np.flatnonzero(y == c)
        rng.shuffle(idx)
        test_idx.extend(idx[: int(round(len(idx) * test_fraction))])
    test = np.zeros(len(y), bool)
    test[test_idx] = True
    train_idx = np.flatnonzero(~test)
    rng.shuffle(train_idx)
    return ImageData("digits", x[train_idx], y[train_idx], x[test], y[test])


def load_mnist(data_dir: str | None = None) -> ImageData:
    """TFDS MNIST as numpy arrays (downloads on first use)."""
    import tensorflow_datasets as tfds

    train, test = tfds.load("mnist", split=["train", "test"], batch_size=-1, as_supervised=True, data_dir=data_dir)
    xtr, ytr = tfds.as_numpy(train)
    xte, yte = tfds.as_numpy(test)
    return ImageData("mnist", xtr.astype("float32") / 255.0, ytr.astype("int64"), xte.astype("float32") / 255.0, yte.astype("int64"))


def _mnist_on_disk(data_dir: str | None) -> bool:
    root = data_dir or os.environ.get("TFDS_DATA_DIR") or os.path.expanduser("~/tensorflow_datasets")
    mnist = os.path.join(root, "mnist")
    return os.path.isdir(mnist) and any(
        os.path.exists(os.path.join(mnist, v, "dataset_info.json")) for v in os.listdir(mnist)
    )


def load_mnist_or_digits(prefer: str = "auto", data_dir: str | None = None) -> ImageData:
    """MNIST if available (on disk or downloadable), else bundled digits.

    Args:
        prefer: ``"auto"``, ``"mnist"`` (fail without it) or ``"digits"``.
    """
    if prefer == "digits":
        return load_digits()
    if prefer not in ("auto", "mnist"):
        raise ValueError(f"Unknown dataset. Received: prefer={prefer!r}. Use 'auto', 'mnist' or 'digits'.")
    if _mnist_on_disk(data_dir) or network_available():
        try:
            return load_mnist(data_dir)
        except Exception as e:  # a broken download must not stop an example
            if prefer == "mnist":
                raise
            logger.warning("TFDS MNIST could not be loaded (%s); using scikit-learn digits", e)
    elif prefer == "mnist":
        raise RuntimeError("MNIST is not on disk and the TFDS download host is unreachable.")
    return load_digits()
