"""Keras under a strategy trains every element of a queue dataset (no batch lost to its build peek)."""

import numpy as np
import pytest
import tensorflow as tf

from tfdist.data import FIFOQueue, RandomShuffleQueue
from tfdist.data import symbolic_build


def filled_queue(n, cls=FIFOQueue, **kwargs):
    queue = cls(capacity=n, dtypes=["float32", "int64"], shapes=[[3], []], **kwargs)
    queue.enqueue_many((np.ones((n, 3), np.float32), np.arange(n)))
    queue.close()
    return queue


@pytest.mark.parametrize("method", ["fit", "evaluate"])
def test_under_one_device_strategy_every_dequeued_element_is_trained_once(method, compiled_recorder):
    trained = []
    model = compiled_recorder(tf.distribute.OneDeviceStrategy("/cpu:0"), trained)
    queue = filled_queue(160)
    getattr(model, method)(queue.as_dataset(batch_size=16), verbose=0)
    # Keras 3.15 would otherwise take one batch to build the model and drop it together with
    # the batches its input pipeline prefetched (8 of 10 batches here on TF 2.21)
    assert sorted(trained) == list(range(160))
    assert queue.size() == 0


def test_steps_per_epoch_never_trains_a_batch_twice_and_prefetched_batches_count_as_delivered(compiled_recorder):
    trained = []
    model = compiled_recorder(tf.distribute.OneDeviceStrategy("/cpu:0"), trained)
    queue = filled_queue(160)
    ds = queue.as_dataset(batch_size=8).map(lambda x, i: (x * 2.0, i))  # found through the map
    model.fit(ds, steps_per_epoch=5, epochs=1, verbose=0)
    assert trained == list(range(40))  # the 5 batches trained, in order
    model.fit(ds, epochs=1, verbose=0)  # a new iteration continues where the queue is
    # nothing is trained twice; the batches the first iteration's input pipeline had
    # prefetched when fit stopped it were dequeued and are not trained (as with .prefetch)
    assert len(trained) == len(set(trained)) and trained[:40] == list(range(40))
    assert trained[40:] == sorted(trained[40:]) and queue.size() == 0


def test_queue_datasets_are_found_through_the_pipeline_and_others_are_not():
    queue = filled_queue(8, RandomShuffleQueue, seed=0)
    ds = queue.as_dataset(batch_size=4)
    assert symbolic_build.contains_queue_dataset(ds)
    assert symbolic_build.contains_queue_dataset(ds.map(lambda x, y: (x, y)).prefetch(2))
    other = tf.data.Dataset.from_tensor_slices(np.arange(4)).batch(2)
    assert symbolic_build.contains_queue_dataset(tf.data.Dataset.zip((other, ds)))
    assert not symbolic_build.contains_queue_dataset(other.map(lambda v: v + 1))
    assert symbolic_build.is_installed() and symbolic_build.install()  # idempotent


def _counting_dataset(opened):
    """A dataset that records every iterator opened on it (its generator runs once per iterator)."""

    def gen():
        opened.append(1)
        for i in range(8):
            yield np.ones(3, np.float32), np.int64(i % 4)

    spec = (tf.TensorSpec([3], tf.float32), tf.TensorSpec([], tf.int64))
    return tf.data.Dataset.from_generator(gen, output_signature=spec).batch(4)


@pytest.mark.parametrize("spec_build", [False, True])
@pytest.mark.parametrize("method", ["fit", "evaluate"])
def test_a_strategy_built_from_the_element_spec_opens_no_iterator_for_the_build(method, spec_build):
    import keras

    strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
    if spec_build:
        assert symbolic_build.build_from_element_spec(strategy) is strategy
    with strategy.scope():
        model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4)])
        model.compile(optimizer="sgd", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      metrics=["accuracy"])
    opened = []
    getattr(model, method)(_counting_dataset(opened), verbose=0)
    # Keras 3.15 opens a throwaway iterator for one batch under any strategy (the SIGSEGV site in TF 2.21);
    # built from the element spec, only the iterator that is trained/evaluated is opened.
    assert len(opened) == (1 if spec_build else 2)
    assert model.built
