"""What the tutorials in this folder change from TensorFlow's: the strategy line and the (offline) data.

``TUTORIAL_STRATEGY`` picks the strategy (``async``, ``bsp``, ``sync_replicas``,
``ssp``, ``all_reduce``, or ``mwms`` for TensorFlow's own
MultiWorkerMirroredStrategy as a reference); ``TUTORIAL_OUT`` names a JSON
file where a tutorial also writes what it prints (the tests read it).
MNIST cannot be downloaded here: scikit-learn's bundled 8x8 digits stand in.
"""

import json
import os


def make_strategy():
    """The one line a user changes: ``tf.distribute.MultiWorkerMirroredStrategy()`` → a tfdist strategy."""
    name = os.environ.get("TUTORIAL_STRATEGY", "bsp")
    if name == "mwms":
        import tensorflow as tf

        return tf.distribute.MultiWorkerMirroredStrategy()
    import tfdist

    return {
        "async": lambda: tfdist.ParameterServerStrategy(),
        "ssp": lambda: tfdist.SSPStrategy(staleness=2),
        "bsp": lambda: tfdist.BSPStrategy(),
        "sync_replicas": lambda: tfdist.SyncReplicasStrategy(),
        "all_reduce": lambda: tfdist.AllReduceStrategy(),
    }[name]()


def load_digits_as_mnist():
    """``(x_train, y_train), (x_test, y_test)`` like ``keras.datasets.mnist.load_data()``: uint8 images 0..255."""
    import numpy as np
    from sklearn.datasets import load_digits

    digits = load_digits()
    x = (digits.images * (255.0 / 16.0)).astype(np.uint8)  # 8x8, 0..255 like MNIST's pixels
    y = digits.target.astype(np.uint8)
    return (x[:1500], y[:1500]), (x[1500:], y[1500:])


def record(**values):
    """Appends ``values`` to the JSON list in ``TUTORIAL_OUT`` (one file per task)."""
    path = os.environ.get("TUTORIAL_OUT")
    if not path:
        return
    rows = json.load(open(path)) if os.path.exists(path) else []
    rows.append(values)
    with open(path + ".tmp", "w") as f:
        json.dump(rows, f)
    os.replace(path + ".tmp", path)
