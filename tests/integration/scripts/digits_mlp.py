"""The small MLP on digits that the single-process and lone-worker tests train (plain Keras or under a strategy)."""


def sgd_mlp(lr=0.05):
    """A 64-32-10 MLP, SGD(``lr``), seeded: every call builds the same initial weights."""
    import keras

    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(32, activation="relu"),
                              keras.layers.Dense(10, activation="softmax")])
    model.compile(keras.optimizers.SGD(lr), "sparse_categorical_crossentropy", metrics=["accuracy"])
    return model
