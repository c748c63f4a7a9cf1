"""Small built-in datasets and models for examples, tests, configs and benchmarks."""

from __future__ import annotations

import numpy as np

from tfdist.errors import ConfigError

__all__ = ["load_digits_split", "make_mlp", "DATASETS"]


def load_digits_split(test_fraction: float = 0.2, seed: int = 0) -> tuple:
    """scikit-learn's bundled handwritten digits (1,797 real 8x8 images; works offline).

    Features are scaled to [0, 1] and flattened to 64 values.

    Args:
        test_fraction: share held out for the test process. Defaults to 0.2.
        seed: seed of the stratified split. Defaults to 0.

    Returns:
        ``((x_train, y_train), (x_test, y_test))`` with float32 features, int64 labels.
    """
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    if not 0.0 < test_fraction < 1.0:
        raise ConfigError(f"test_fraction must be in (0, 1). Received: test_fraction={test_fraction}")
    d = load_digits()
    x = (d.data / 16.0).astype(np.float32)
    y = d.target.astype(np.int64)
    x_tr, x_te, y_tr, y_te = train_test_split(x, y, test_size=test_fraction, random_state=seed, stratify=y)
    return (x_tr, y_tr), (x_te, y_te)


DATASETS = {"digits": load_digits_split}


def make_mlp(input_dim: int = 64, num_classes: int = 10, hidden: tuple = (64,), seed: int = 0):
    """A small MLP classifier that outputs logits.

    Args:
        input_dim: number of input features. Defaults to 64 (digits).
        num_classes: number of classes. Defaults to 10.
        hidden: units of the hidden ReLU layers. Defaults to ``(64,)``.
        seed: seed of the initial weights. Defaults to 0.
    """
    import keras

    keras.utils.set_random_seed(seed)
    layers = [keras.Input((input_dim,))]
    layers += [keras.layers.Dense(int(u), activation="relu") for u in hidden]
    layers.append(keras.layers.Dense(num_classes))
    return keras.Sequential(layers, name="mlp")
