"""tfdist.AllReduceStrategy in one process (no cluster): predict and evaluate over several batches."""

import numpy as np


def test_predict_over_several_batches_matches_the_model_without_a_strategy():
    import keras

    import tfdist

    strategy = tfdist.AllReduceStrategy()
    with strategy.scope():
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(10)])
        model.compile("sgd", "mse")
    x = np.random.default_rng(0).random((100, 4), dtype=np.float32)
    got = model.predict(x, batch_size=32, verbose=0)  # 4 batches, the last one partial
    assert got.shape == (100, 10)
    np.testing.assert_allclose(got, x @ model.get_weights()[0] + model.get_weights()[1], rtol=1e-5, atol=1e-6)
    loss = model.evaluate(x, np.zeros((100, 10), np.float32), batch_size=32, verbose=0)
    np.testing.assert_allclose(loss, np.mean(got ** 2), rtol=1e-4)


def _iterator_kinds(iterator):
    """The class names of the iterators inside a distributed iterator (one per worker)."""
    return {type(getattr(w, "_iterator", None)).__name__ for w in iterator._iterators}


def test_a_cpu_worker_iterates_its_input_without_a_multi_device_iterator():
    """Every epoch makes an iterator; TF's one-device path makes a MultiDeviceIterator (~80 ms of CPU each),
    tfdist's CPU workers a plain one. Same batches, same structure, partial last batch included."""
    import tensorflow as tf

    import tfdist

    strategy = tfdist.AllReduceStrategy()
    data = tf.data.Dataset.range(10).map(lambda i: {"x": tf.cast(i, tf.float32), "i": i}).batch(4)
    iterator = iter(strategy.experimental_distribute_dataset(data))
    assert _iterator_kinds(iterator) == {"OwnedIterator"}
    got = [int(v) for batch in iterator for v in batch["i"].numpy()]
    assert got == list(range(10))

    def dataset_fn(ctx):
        return tf.data.Dataset.range(6).batch(ctx.get_per_replica_batch_size(3))

    from_function = iter(strategy.distribute_datasets_from_function(dataset_fn))
    assert _iterator_kinds(from_function) == {"OwnedIterator"}
    assert [b.numpy().tolist() for b in from_function] == [[0, 1, 2], [3, 4, 5]]

    @tf.function
    def first_of_each(iterator):  # inside a tf.function, as Keras's step reads it
        return strategy.run(lambda b: b["i"][0], args=(next(iterator),))

    iterator = iter(strategy.experimental_distribute_dataset(data))
    assert [int(first_of_each(iterator)), int(first_of_each(iterator))] == [0, 4]


def test_a_script_s_input_options_are_honoured_as_tf_s_one_device_strategy_does():
    """Explicit default options (fetch to the device, which is the host) iterate plainly too; the
    PER_REPLICA mode stays refused as TF's one-device strategy refuses it."""
    import pytest
    import tensorflow as tf

    import tfdist

    strategy = tfdist.AllReduceStrategy()
    data = tf.data.Dataset.range(4).batch(2)
    options = tf.distribute.InputOptions(experimental_fetch_to_device=True)
    assert _iterator_kinds(iter(strategy.experimental_distribute_dataset(data, options))) == {"OwnedIterator"}
    placed = tf.distribute.InputOptions(experimental_place_dataset_on_device=True, experimental_fetch_to_device=False,
                                        experimental_replication_mode=tf.distribute.InputReplicationMode.PER_REPLICA)
    with pytest.raises(NotImplementedError, match="PER_REPLICA"):
        strategy.experimental_distribute_dataset(data, placed)
    assert [b.numpy().tolist() for b in strategy.experimental_distribute_dataset(data, options)] == [[0, 1], [2, 3]]
