"""queue.as_dataset: a real tf.data.Dataset for Keras 3 fit and custom loops."""

import threading

import numpy as np
import pytest
import tensorflow as tf
import keras

from tfdist.data import (
    Coordinator,
    FIFOQueue,
    PaddingFIFOQueue,
    QueueRunner,
    RandomShuffleQueue,
)

T = 20.0


def digits_like(n=256, seed=0):
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 4, n).astype(np.int64)
    x = (np.eye(4)[y] * 2 + rng.normal(0, 0.3, (n, 4))).astype(np.float32)
    return x, y


def chunks(x, y, size=32):
    for i in range(0, len(x), size):
        yield x[i : i + size], y[i : i + size]


def small_model():
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(4)])
    model.compile(
        optimizer=keras.optimizers.SGD(0.1),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    return model


def test_batches_end_with_a_smaller_final_batch_or_drop_it():
    q = FIFOQueue(100, ["float32", "int64"], shapes=[[4], []])
    q.enqueue_many((np.ones((10, 4)), np.arange(10)))
    q.close()
    ds = q.as_dataset(batch_size=4)
    assert ds.element_spec[0].shape.as_list() == [None, 4]
    assert [int(y.shape[0]) for _, y in ds] == [4, 4, 2]

    q = FIFOQueue(100, ["float32", "int64"], shapes=[[4], []])
    q.enqueue_many((np.ones((10, 4)), np.arange(10)))
    q.close()
    ds = q.as_dataset(batch_size=4, drop_remainder=True)
    assert ds.element_spec[0].shape.as_list() == [4, 4]
    assert [y.numpy().tolist() for _, y in ds] == [[0, 1, 2, 3], [4, 5, 6, 7]]


def test_batch_size_one_keeps_the_batch_dimension():
    q = FIFOQueue(10, "int64", shapes=[])
    q.enqueue_many(np.arange(3))
    q.close()
    assert [b.numpy().tolist() for b in q.as_dataset(batch_size=1)] == [[0], [1], [2]]


def test_unbatched_dict_and_padded_elements():
    q = FIFOQueue(10, ["float32", "int64"], shapes=[[2], []], names=["x", "y"])
    q.enqueue({"x": [1, 2], "y": 3})
    q.close()
    (elem,) = list(q.as_dataset())
    assert elem["y"].numpy() == 3 and elem["x"].shape == (2,)

    p = PaddingFIFOQueue(10, ["int32"], shapes=[[None]])
    for n in (1, 3, 2):
        p.enqueue((np.arange(n) + 1,))
    p.close()
    (batch,) = [b for (b,) in p.as_dataset(batch_size=3)]
    assert batch.numpy().tolist() == [[1, 0, 0], [1, 2, 3], [1, 2, 0]]


def test_fit_on_a_shuffled_queue_fed_by_producer_threads():
    x, y = digits_like()
    queue = RandomShuffleQueue(capacity=128, min_after_dequeue=32, seed=0)
    runner = QueueRunner(queue, [chunks(x[:128], y[:128]), chunks(x[128:], y[128:])], enqueue_many=True)
    model = small_model()
    with Coordinator() as coord:
        runner.start(coord)
        history = model.fit(queue.as_dataset(batch_size=32, prefetch=2), epochs=1, verbose=0)
    assert len(history.history["loss"]) == 1
    assert queue.is_closed() and queue.size() == 0


def test_custom_loop_under_one_device_strategy():
    x, y = digits_like(96)
    queue = FIFOQueue(64)
    runner = QueueRunner(queue, [chunks(x, y)], enqueue_many=True)
    strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
    with strategy.scope():
        model = small_model()
        opt = keras.optimizers.SGD(0.1)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    @tf.function
    def step(batch):
        def replica_step(xb, yb):
            with tf.GradientTape() as tape:
                loss = loss_fn(yb, model(xb, training=True))
            grads = tape.gradient(loss, model.trainable_variables)
            opt.apply_gradients(zip(grads, model.trainable_variables))
            return tf.shape(yb)[0]

        return strategy.run(replica_step, args=batch)

    seen = 0
    with Coordinator() as coord:
        runner.start(coord)
        dist = strategy.experimental_distribute_dataset(queue.as_dataset(batch_size=16))
        for batch in dist:
            seen += int(step(batch))
    assert seen == 96


def test_fit_under_one_device_strategy_scope():
    x, y = digits_like(64)
    queue = FIFOQueue(64)
    runner = QueueRunner(queue, [chunks(x, y)], enqueue_many=True)
    with tf.distribute.OneDeviceStrategy("/cpu:0").scope():
        model = small_model()
    with Coordinator() as coord:
        runner.start(coord)
        model.fit(queue.as_dataset(batch_size=16), epochs=1, verbose=0)


def test_data_appended_while_training_runs_flows_into_fit():
    """A producer that starts only once training has begun (like an environment)."""
    queue = FIFOQueue(64, ["float32", "int64"], shapes=[[4], []])
    training_started = threading.Event()
    produced = []

    def environment():
        assert training_started.wait(T), "fit did not start"
        step = 0
        while True:  # never ends: the coordinator stops it
            xb, yb = digits_like(8, seed=step)
            produced.append(step)
            step += 1
            yield xb, yb

    class MarkStart(keras.callbacks.Callback):
        def on_train_begin(self, logs=None):
            training_started.set()

    model = small_model()
    runner = QueueRunner(queue, [environment], enqueue_many=True)
    with Coordinator() as coord:
        runner.start(coord)
        history = model.fit(
            queue.as_dataset(batch_size=8), steps_per_epoch=5, epochs=2, verbose=0, callbacks=[MarkStart()]
        )
    assert len(history.history["loss"]) == 2
    assert len(produced) >= 10  # every trained batch was generated after fit began


def test_a_producer_error_fails_fit_and_is_reraised_by_the_coordinator():
    def broken():
        yield np.zeros((8, 4), np.float32), np.zeros(8, np.int64)
        raise ValueError("corrupt shard 7")

    queue = FIFOQueue(64, ["float32", "int64"], shapes=[[4], []])
    runner = QueueRunner(queue, [broken], enqueue_many=True)
    model = small_model()
    with pytest.raises(ValueError, match="corrupt shard 7") as info:
        with Coordinator() as coord:
            runner.start(coord)
            coord.wait_for_stop(T)
            model.fit(queue.as_dataset(batch_size=8), epochs=1, verbose=0)
    # fit itself failed with tf.data's wrapper of the same error
    assert "corrupt shard 7" in str(info.value.__context__)


def test_dataset_timeout_when_nothing_arrives():
    queue = FIFOQueue(4, "float32", shapes=[])
    with pytest.raises(Exception, match="timeout=0.2"):
        list(queue.as_dataset(batch_size=2, timeout=0.2))
    queue.close()
