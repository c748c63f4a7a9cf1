"""keras.callbacks.TensorBoard works under a tfdist strategy in the stock install and records ps_* scalars."""

import glob

import numpy as np


def _scalar_tags(log_dir):
    import tensorflow as tf

    tags = set()
    for path in glob.glob(f"{log_dir}/**/events.out.tfevents.*", recursive=True):
        for event in tf.compat.v1.train.summary_iterator(path):
            for value in event.summary.value:
                tags.add(value.tag)
    return tags


def _tags_after_fit(tmp_path, strategy, callbacks=()):
    """Scalar tags the TensorBoard callback (listed after ``callbacks``) wrote for a 2-epoch fit (in-process PS)."""
    import keras

    try:
        with strategy.scope():
            model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, activation="softmax")])
            model.compile("sgd", "sparse_categorical_crossentropy")
        rng = np.random.default_rng(0)
        x, y = rng.random((64, 4), dtype=np.float32), rng.integers(0, 3, 64)
        model.fit(x, y, batch_size=16, epochs=2, verbose=0,
                  callbacks=[*callbacks, keras.callbacks.TensorBoard(str(tmp_path / "tb"))])
    finally:
        strategy.shutdown()
    return _scalar_tags(tmp_path / "tb")


def test_fit_with_the_tensorboard_callback_writes_the_exchange_counters(tmp_path):
    import tfdist

    tags = _tags_after_fit(tmp_path, tfdist.ParameterServerStrategy())  # no cluster: an in-process PS
    assert {"epoch_loss", "epoch_ps_step", "epoch_ps_waits", "epoch_ps_refreshes"} <= tags, sorted(tags)


def test_the_straggler_and_staleness_metrics_are_tensorboard_scalars(tmp_path):
    """Per worker: the detector's epoch entries (StragglerDetector listed before TensorBoard) and ps_staleness."""
    import tfdist

    detector = tfdist.callbacks.StragglerDetector(warmup_iterations=0)
    tags = _tags_after_fit(tmp_path, tfdist.SSPStrategy(staleness=2), [detector])
    assert {"epoch_straggler_count", "epoch_straggler_threshold", "epoch_ps_staleness"} <= tags, sorted(tags)
