"""TensorFlow's tutorial "Multi-worker training with Keras", on tfdist.

https://www.tensorflow.org/tutorials/distribute/multi_worker_with_keras — the
code as written there (``model.fit``, ``BackupAndRestore``, ``ModelCheckpoint``
and ``model.save`` on the same paths on every worker, ``write_filepath`` from
the cluster resolver, ``load_model``); changed: the strategy line
(``make_strategy()``), the data (8x8 digits for MNIST, no download), the
sizes, ``.keras`` file names (Keras 3), the input sharded per worker with
``distribute_datasets_from_function`` (tfdist does not auto-shard:
docs/from_tf_strategies.md), one ``strategy.barrier`` before every worker
loads the chief's model (Keras 3 saves without a collective, so nothing else
orders the load after the save), and ``record`` calls beside the prints.

``TUTORIAL_FAIL_AFTER_EPOCH=k`` stands in for the tutorial's "kill a worker"
step: every worker's ``fit`` stops with an error after epoch ``k``; run the
script again and ``BackupAndRestore`` resumes every worker from the chief's
backup.
"""

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from _common import load_digits_as_mnist, make_strategy, record  # noqa: E402


# mnist_setup.py
def mnist_dataset(batch_size, input_context=None):
    (x_train, y_train), _ = load_digits_as_mnist()
    # The `x` arrays are in uint8 and have values in the [0, 255] range.
    # You need to convert them to float32 with values in the [0, 1] range.
    x_train = x_train / np.float32(255)
    y_train = y_train.astype(np.int64)
    train_dataset = tf.data.Dataset.from_tensor_slices((x_train, y_train))
    if input_context is not None:  # tfdist: each worker reads its own shard
        train_dataset = train_dataset.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
        batch_size = input_context.get_per_replica_batch_size(batch_size)
    return train_dataset.shuffle(1500, seed=0).repeat().batch(batch_size)


def build_and_compile_cnn_model():
    model = tf.keras.Sequential([
        tf.keras.layers.InputLayer(shape=(8, 8)),
        tf.keras.layers.Reshape(target_shape=(8, 8, 1)),
        tf.keras.layers.Conv2D(8, 3, activation="relu"),
        tf.keras.layers.Flatten(),
        tf.keras.layers.Dense(32, activation="relu"),
        tf.keras.layers.Dense(10),
    ])
    model.compile(
        loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        optimizer=tf.keras.optimizers.SGD(learning_rate=0.05),
        metrics=["accuracy"])
    return model


class _FailAfterEpoch(tf.keras.callbacks.Callback):
    """Stands in for the tutorial's killed worker (TUTORIAL_FAIL_AFTER_EPOCH)."""

    def __init__(self, epoch):
        super().__init__()
        self.epoch = epoch

    def on_epoch_end(self, epoch, logs=None):
        if epoch == self.epoch:
            raise RuntimeError(f"simulated failure after epoch {epoch}")


# main.py
per_worker_batch_size = 32
tf_config = json.loads(os.environ["TF_CONFIG"])
num_workers = len(tf_config["cluster"]["worker"])
work_dir = os.environ.get("TUTORIAL_DIR", "/tmp")
epochs = int(os.environ.get("TUTORIAL_EPOCHS", "3"))

strategy = make_strategy()  # was: tf.distribute.MultiWorkerMirroredStrategy()

global_batch_size = per_worker_batch_size * num_workers
multi_worker_dataset = strategy.distribute_datasets_from_function(
    lambda input_context: mnist_dataset(global_batch_size, input_context))

with strategy.scope():
    # Model building/compiling need to be within `strategy.scope()`.
    multi_worker_model = build_and_compile_cnn_model()

# Fault tolerance: the same backup directory and checkpoint path on every worker.
callbacks = [tf.keras.callbacks.BackupAndRestore(backup_dir=os.path.join(work_dir, "backup")),
             tf.keras.callbacks.ModelCheckpoint(os.path.join(work_dir, "ckpt", "best.keras"))]
fail_after = os.environ.get("TUTORIAL_FAIL_AFTER_EPOCH")
if fail_after is not None:
    callbacks.append(_FailAfterEpoch(int(fail_after)))
try:
    history = multi_worker_model.fit(multi_worker_dataset, epochs=epochs, steps_per_epoch=10, callbacks=callbacks)
except RuntimeError as e:
    print(f"fit stopped: {e}")
    record(stopped=str(e))
    sys.exit(0)
record(epochs=[e for e in history.epoch], loss=[float(v) for v in history.history["loss"]])

# Model saving and loading
model_path = os.path.join(work_dir, "keras-model.keras")  # Keras 3: a .keras file (tf-keras: a SavedModel dir)


def _is_chief(task_type, task_id):
    # Note: there are two possible `TF_CONFIG` configurations.
    #   1) In addition to `worker` tasks, a `chief` task type is use;
    #      in this case, this function should be modified to
    #      `return task_type == 'chief'`.
    #   2) Only `worker` task type is used; in this case, worker 0 is
    #      regarded as the chief. The implementation demonstrated here
    #      is for this case.
    # For the purpose of this Colab section, the `task_type` is `None` case
    # is added because it is effectively run with only a single worker.
    return (task_type == "worker" and task_id == 0) or task_type is None


def _get_temp_dir(dirpath, task_id):
    base_dirpath = "workertemp_" + str(task_id)
    temp_dir = os.path.join(dirpath, base_dirpath)
    tf.io.gfile.makedirs(temp_dir)
    return temp_dir


def write_filepath(filepath, task_type, task_id):
    dirpath = os.path.dirname(filepath)
    base = os.path.basename(filepath)
    if not _is_chief(task_type, task_id):
        dirpath = _get_temp_dir(dirpath, task_id)
    return os.path.join(dirpath, base)


task_type, task_id = (strategy.cluster_resolver.task_type, strategy.cluster_resolver.task_id)
write_model_path = write_filepath(model_path, task_type, task_id)
multi_worker_model.save(write_model_path)
if not _is_chief(task_type, task_id):
    tf.io.gfile.rmtree(os.path.dirname(write_model_path))
strategy.barrier("model-saved")  # tfdist: every worker loads the chief's model after the chief saved it

loaded_model = tf.keras.models.load_model(model_path)
# Now that the model is restored, and can continue with the training.
single_worker_dataset = mnist_dataset(per_worker_batch_size)
more = loaded_model.fit(single_worker_dataset, epochs=2, steps_per_epoch=5, verbose=0)
record(loaded_fit_loss=[float(v) for v in more.history["loss"]],
       files=sorted(f for f in os.listdir(work_dir) if "model" in f or "workertemp" in f))
