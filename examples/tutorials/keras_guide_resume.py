"""The Keras guide "Multi-GPU and distributed training" (TensorFlow backend), on tfdist.

https://keras.io/guides/distributed_training_with_tensorflow/ — its
fault-tolerance cells as written: ``make_or_restore_model()`` loads the newest
``.keras`` checkpoint of a directory (or builds a new model),
``ModelCheckpoint(checkpoint_dir + "/ckpt-{epoch}.keras")``, and
``run_training()`` called twice in one process, each call building its strategy
and model anew; the second call resumes from the first's checkpoint.
Changed: the strategy line (``make_strategy()``: AllReduce in the test; the
parameter-server strategies' variables of a later model join the running
job, README), the data (8x8
digits, no download, each worker its own shard), the sizes, and ``record``
calls. The checkpoint directory is the same on every worker: the chief writes
it (tfdist sends the other workers' checkpoints to a temporary directory).
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import keras  # noqa: E402
import tensorflow as tf  # noqa: E402

from _common import load_digits_as_mnist, make_strategy, record  # noqa: E402


def get_compiled_model():
    # Make a simple 2-layer densely-connected neural network.
    inputs = keras.Input(shape=(64,))
    x = keras.layers.Dense(64, activation="relu")(inputs)
    x = keras.layers.Dense(64, activation="relu")(x)
    outputs = keras.layers.Dense(10)(x)
    model = keras.Model(inputs, outputs)
    model.compile(
        optimizer=keras.optimizers.Adam(),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=[keras.metrics.SparseCategoricalAccuracy()],
    )
    return model


def get_dataset(worker, workers):
    batch_size = 32
    num_val_samples = 200

    # Return the dataset in the form of a `tf.data.Dataset`.
    (x_train, y_train), (x_test, y_test) = load_digits_as_mnist()

    # Preprocess the data (these are Numpy arrays)
    x_train = x_train.reshape(-1, 64).astype("float32") / 255
    x_test = x_test.reshape(-1, 64).astype("float32") / 255
    y_train = y_train.astype("float32")
    y_test = y_test.astype("float32")

    # Reserve num_val_samples samples for validation
    x_val = x_train[-num_val_samples:]
    y_val = y_train[-num_val_samples:]
    x_train = x_train[:-num_val_samples][worker::workers]  # tfdist: this worker's shard
    y_train = y_train[:-num_val_samples][worker::workers]
    return (
        tf.data.Dataset.from_tensor_slices((x_train, y_train)).batch(batch_size).take(10),
        tf.data.Dataset.from_tensor_slices((x_val, y_val)).batch(batch_size),
        tf.data.Dataset.from_tensor_slices((x_test, y_test)).batch(batch_size),
    )


# Prepare a directory to store all the checkpoints.
checkpoint_dir = os.path.join(os.environ.get("TUTORIAL_DIR", "/tmp"), "ckpt")
if not os.path.exists(checkpoint_dir):
    os.makedirs(checkpoint_dir, exist_ok=True)


def make_or_restore_model():
    # Either restore the latest model, or create a fresh one
    # if there is no checkpoint available.
    checkpoints = [checkpoint_dir + "/" + name for name in os.listdir(checkpoint_dir)]
    if checkpoints:
        latest_checkpoint = max(checkpoints, key=os.path.getctime)
        print("Restoring from", latest_checkpoint)
        record(restored=os.path.basename(latest_checkpoint))
        return keras.models.load_model(latest_checkpoint)
    print("Creating a new model")
    record(restored=None)
    return get_compiled_model()


def run_training(epochs=1):
    # Create a MirroredStrategy.
    strategy = make_strategy()  # was: tf.distribute.MirroredStrategy()
    resolver = strategy.cluster_resolver

    # Open a strategy scope and create/restore the model
    with strategy.scope():
        model = make_or_restore_model()

    train_dataset, val_dataset, test_dataset = get_dataset(resolver.task_id, strategy.num_replicas_in_sync)
    callbacks = [
        # This callback saves a SavedModel every epoch
        # We include the current epoch in the folder name.
        keras.callbacks.ModelCheckpoint(filepath=checkpoint_dir + "/ckpt-{epoch}.keras", save_freq="epoch")
    ]
    history = model.fit(train_dataset, epochs=epochs, callbacks=callbacks, validation_data=val_dataset, verbose=2)
    strategy.barrier("epoch-saved")  # tfdist: the next run_training reads the chief's newest checkpoint
    record(loss=[float(v) for v in history.history["loss"]],
           weights_sum=float(sum(float(tf.reduce_sum(w)) for w in model.weights)))


# Running the first time creates the model
run_training(epochs=1)

# Calling the same function again will resume from where we left off
run_training(epochs=1)
record(checkpoints=sorted(os.listdir(checkpoint_dir)))
