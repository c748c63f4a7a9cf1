"""Server-side producer for the shared-queue launcher test: digits with an id per example."""

import numpy as np


def produce(epoch):
    from sklearn.datasets import load_digits

    d = load_digits()
    x = (d.data / 16.0).astype("float32")
    for i in range(len(x)):
        yield {"x": x[i], "y": np.int64(d.target[i]), "id": np.int64(i)}
