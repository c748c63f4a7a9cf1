"""Shared pytest set-up: quiet TF logs, skip slow tests unless RUN_SLOW=1."""

import os

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def pytest_collection_modifyitems(config, items):
    if os.environ.get("RUN_SLOW") == "1":
        return
    skip = pytest.mark.skip(reason="slow scenario test; run with RUN_SLOW=1")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def compiled_recorder():
    """``factory(strategy, sink_list) -> model``: a tiny compiled Keras model whose
    train/test steps record the ids (labels) of every batch they run on."""
    import keras
    import tensorflow as tf

    class IdRecorder(keras.Model):
        """A tiny model whose train/test steps record the ids (labels) of every batch they run on."""

        def __init__(self, sink):
            super().__init__()
            self.dense = keras.layers.Dense(3)
            self._sink = sink  # a bound method: Keras would copy a list attribute

        def call(self, x):
            return self.dense(x)

        def _record(self, ids):
            tf.py_function(lambda i: self._sink(i.numpy().tolist()) or 0, [ids], tf.int32)

        def train_step(self, data):
            x, ids = data
            self._record(ids)
            return super().train_step((x, ids % 3))

        def test_step(self, data):
            x, ids = data
            self._record(ids)
            return super().test_step((x, ids % 3))


    def compiled_recorder(strategy, trained):
        with strategy.scope():
            model = IdRecorder(trained.extend)
            # jit_compile=False: the py_function that records ids cannot be compiled by XLA
            model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True), jit_compile=False)
        return model

    return compiled_recorder
