"""Layers that derive state from their variables (Normalization) compute with values written behind Keras's back."""

import numpy as np


def _built_normalization(x):
    import keras

    layer = keras.layers.Normalization(name="norm")
    layer.build((None, x.shape[1]))
    return layer


def test_a_traced_function_sees_values_written_into_the_variables_after_a_refresh():
    import tensorflow as tf

    from tfdist.strategies._derived_state import DerivedStateLayers

    x = np.array([[0.0, 10.0], [2.0, 30.0]], np.float32)
    layer = _built_normalization(x)
    derived = DerivedStateLayers()
    for v in (layer.adapt_mean, layer.adapt_variance):
        derived.track(layer, v.value)
    layer.finalize_state()  # what build does once the variables are tracked
    step = tf.function(lambda t: layer(t))
    np.testing.assert_allclose(step(x).numpy(), x)  # mean 0, variance 1: traced now
    # What a pull does: values go into the variables (not through adapt), then the registry refreshes.
    layer.adapt_mean.assign([1.0, 20.0])
    layer.adapt_variance.assign([1.0, 100.0])
    derived.refresh()
    expected = [[-1.0, -1.0], [1.0, 1.0]]
    np.testing.assert_allclose(step(x).numpy(), expected, rtol=1e-6)  # same trace, new values
    np.testing.assert_allclose(layer(x).numpy(), expected, rtol=1e-6)  # eager too
    assert step.experimental_get_tracing_count() == 1


def test_refresh_calls_finalize_state_only_of_layers_whose_variables_changed():
    import keras

    from tfdist.strategies._derived_state import DerivedStateLayers

    class Scaled(keras.layers.Layer):
        """A custom layer in Keras's preprocessing style: ``call`` uses a tensor derived from a variable."""

        def build(self, input_shape):
            self.scale = self.add_weight(shape=(), initializer="ones", trainable=False)
            self.finalize_state()

        def finalize_state(self):
            self.finalized = getattr(self, "finalized", 0) + 1
            self.factor = keras.ops.convert_to_tensor(self.scale) * 2.0

        def call(self, x):
            return x * self.factor

    a, b = Scaled(), Scaled()
    derived = DerivedStateLayers()
    for layer in (a, b):
        layer.build((None, 1))
        derived.track(layer, layer.scale.value)
    derived.refresh()  # the first refresh after tracking finalizes both
    assert (a.finalized, b.finalized) == (2, 2)
    derived.refresh()
    assert (a.finalized, b.finalized) == (2, 2)  # nothing written since
    a.scale.assign(3.0)
    derived.refresh()
    assert (a.finalized, b.finalized) == (3, 2)
    np.testing.assert_allclose(a(np.ones((1, 1), np.float32)).numpy(), [[6.0]])


def test_mirrors_are_not_keras_weights_and_saving_and_tf_data_are_unchanged(tmp_path):
    import keras
    import tensorflow as tf

    from tfdist.strategies._derived_state import DerivedStateLayers

    x = np.array([[0.0, 10.0], [2.0, 30.0]], np.float32)
    layer = _built_normalization(x)
    derived = DerivedStateLayers()
    derived.track(layer, layer.adapt_mean.value)
    layer.adapt(x)
    assert isinstance(layer.mean, tf.Variable)  # held in a mirror
    assert [w.path for w in layer.weights] == ["norm/mean", "norm/variance", "norm/count"]
    model = keras.Sequential([keras.Input((2,)), layer])
    path = str(tmp_path / "m.keras")
    model.save(path)
    loaded = keras.models.load_model(path)
    np.testing.assert_allclose(loaded.predict(x, verbose=0), model.predict(x, verbose=0), rtol=1e-6)
    np.testing.assert_allclose(model.predict(x, verbose=0), [[-1.0, -1.0], [1.0, 1.0]], rtol=1e-6)
    mapped = next(iter(tf.data.Dataset.from_tensor_slices(x).batch(2).map(layer)))  # the layer in tf.data
    np.testing.assert_allclose(mapped.numpy(), [[-1.0, -1.0], [1.0, 1.0]], rtol=1e-6)


def test_layers_without_finalize_state_are_not_tracked():
    import keras

    from tfdist.strategies._derived_state import DerivedStateLayers

    dense = keras.layers.Dense(2)
    dense.build((None, 2))
    derived = DerivedStateLayers()
    derived.track(dense, dense.kernel.value)
    assert derived.layers == []
