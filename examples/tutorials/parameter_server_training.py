"""TensorFlow's tutorial "Parameter server training with ParameterServerStrategy", translated to tfdist.

https://www.tensorflow.org/tutorials/distribute/parameter_server_training —
both parts: training with ``Model.fit`` and the custom training loop. TF's
``ParameterServerStrategy`` is in-graph (a coordinator process schedules
functions onto workers); tfdist is between-graph (every worker runs this whole
script), so this tutorial cannot run unchanged. What changed, line by line
(docs/from_tf_strategies.md, "Parameter server training"):

* the strategy line: ``make_strategy()`` instead of
  ``tf.distribute.ParameterServerStrategy(cluster_resolver,
  variable_partitioner=...)``; the cluster comes from the launch (no in-process
  cluster, no ``if task_type == "ps"``: a PS task serves and never runs this);
  ``variable_partitioner`` → ``ps.partition_threshold_bytes`` (not set here: the
  embedding stays one variable, so the tutorial's two-shard assertion becomes a
  print of ``strategy.placement_table()``);
* ``Model.fit`` with a dataset (no ``DatasetCreator``: Keras 3 has none);
  Keras 3 names (``keras.optimizers.SGD``/``RMSprop`` for ``optimizers.legacy``,
  ``reduction=None``, ``keras.ops.mean`` on the functional model's tensors, the
  regression target as a column, which tf-keras broadcast against the 10 outputs;
  the custom loop's examples batched before the preprocessing models map them);
* the custom loop: ``coordinator.create_per_worker_dataset(fn)`` →
  ``strategy.distribute_datasets_from_function(fn)``; ``coordinator.schedule(step_fn,
  args=(iterator,))`` → ``step_fn(iterator)`` (this worker runs its own steps);
  ``coordinator.join()`` → ``strategy.barrier(...)``; ``loss.fetch()`` → the value;
* sizes (a 64-wide embedding, few steps), a seeded example generator, and
  ``record`` calls beside the prints.
"""

import os
import random
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import keras  # noqa: E402
import tensorflow as tf  # noqa: E402

from _common import make_strategy, record  # noqa: E402

strategy = make_strategy()
task = getattr(strategy.cluster_resolver, "task_id", 0)
EPOCHS = int(os.environ.get("TUTORIAL_EPOCHS", "4"))

# ---- Training with Model.fit
global_batch_size = 64

x = tf.random.uniform((10, 10), seed=1)
y = tf.random.uniform((10, 1), seed=2)  # (10,) in the tutorial: Keras 3's MSE does not broadcast it to (64, 10)

dataset = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(10, seed=3).repeat()
dataset = dataset.batch(global_batch_size)
dataset = dataset.prefetch(2)

with strategy.scope():
    model = keras.models.Sequential([keras.Input((10,)), keras.layers.Dense(10)])
    model.compile(keras.optimizers.SGD(), loss="mse", steps_per_execution=10)

working_dir = os.path.join(os.environ.get("TUTORIAL_DIR", "/tmp"), "my_working_dir")
log_dir = os.path.join(working_dir, "log")
ckpt_filepath = os.path.join(working_dir, "ckpt.keras")
backup_dir = os.path.join(working_dir, "backup")

callbacks = [
    keras.callbacks.TensorBoard(log_dir=log_dir),
    keras.callbacks.ModelCheckpoint(filepath=ckpt_filepath),
    keras.callbacks.BackupAndRestore(backup_dir=backup_dir),
]
history = model.fit(dataset, epochs=EPOCHS, steps_per_epoch=20, callbacks=callbacks, verbose=0)
record(part="fit", task=task, loss=[float(v) for v in history.history["loss"]])

# ---- Training with a custom training loop
feature_vocab = [
    "avenger", "ironman", "batman", "hulk", "spiderman", "kingkong", "wonder_woman"
]
label_vocab = ["yes", "no"]

with strategy.scope():
    feature_lookup_layer = keras.layers.StringLookup(vocabulary=feature_vocab, mask_token=None)
    label_lookup_layer = keras.layers.StringLookup(vocabulary=label_vocab, num_oov_indices=0, mask_token=None)

    raw_feature_input = keras.layers.Input(shape=(3,), dtype="string", name="feature")
    feature_id_input = feature_lookup_layer(raw_feature_input)
    feature_preprocess_stage = keras.Model({"features": raw_feature_input}, feature_id_input)

    raw_label_input = keras.layers.Input(shape=(1,), dtype="string", name="label")
    label_id_input = label_lookup_layer(raw_label_input)
    label_preprocess_stage = keras.Model({"label": raw_label_input}, label_id_input)


def feature_and_label_gen(num_examples=200):
    examples = {"features": [], "label": []}
    rng = random.Random(task)  # tfdist: seeded, a different stream per worker
    for _ in range(num_examples):
        features = rng.sample(feature_vocab, 3)
        label = ["yes"] if "avenger" in features else ["no"]
        examples["features"].append(features)
        examples["label"].append(label)
    return examples


examples = feature_and_label_gen()


def dataset_fn(_):
    raw_dataset = tf.data.Dataset.from_tensor_slices(examples)

    # Batched before the preprocessing models map it (the tutorial maps single examples: Keras 3's
    # functional models refuse inputs without their batch dimension).
    train_dataset = raw_dataset.shuffle(200, seed=task).batch(32).map(
        lambda x: (
            {"features": feature_preprocess_stage(x["features"])},
            label_preprocess_stage(x["label"])
        )).repeat()
    return train_dataset


# These variables created under the `Strategy.scope` will be placed on parameter
# servers in a round-robin fashion.
with strategy.scope():
    # Create the model. The input needs to be compatible with Keras processing layers.
    model_input = keras.layers.Input(shape=(3,), dtype="int64", name="model_input")

    emb_layer = keras.layers.Embedding(input_dim=len(feature_lookup_layer.get_vocabulary()), output_dim=64)
    emb_output = keras.ops.mean(emb_layer(model_input), axis=1)
    dense_output = keras.layers.Dense(
        units=1, activation="sigmoid", kernel_regularizer=keras.regularizers.L2(1e-4))(emb_output)
    model = keras.Model({"features": model_input}, dense_output)

    optimizer = keras.optimizers.RMSprop(learning_rate=0.1)
    accuracy = keras.metrics.Accuracy()

print(strategy.placement_table())  # the tutorial: two shards of the embedding, one per PS task


@tf.function
def step_fn(iterator):

    def replica_fn(batch_data, labels):
        with tf.GradientTape() as tape:
            pred = model(batch_data, training=True)
            per_example_loss = keras.losses.BinaryCrossentropy(reduction=None)(labels, pred)
            loss = tf.nn.compute_average_loss(per_example_loss)
            model_losses = model.losses
            if model_losses:
                loss += tf.nn.scale_regularization_loss(tf.add_n(model_losses))
        gradients = tape.gradient(loss, model.trainable_variables)

        optimizer.apply_gradients(zip(gradients, model.trainable_variables))

        actual_pred = tf.cast(tf.greater(pred, 0.5), tf.int64)
        accuracy.update_state(labels, actual_pred)
        return loss

    batch_data, labels = next(iterator)
    losses = strategy.run(replica_fn, args=(batch_data, labels))
    return strategy.reduce(tf.distribute.ReduceOp.SUM, losses, axis=None)


per_worker_dataset = strategy.distribute_datasets_from_function(dataset_fn)  # create_per_worker_dataset
per_worker_iterator = iter(per_worker_dataset)

num_epochs = EPOCHS
steps_per_epoch = 5
for i in range(num_epochs):
    accuracy.reset_state()
    for _ in range(steps_per_epoch):
        step_fn(per_worker_iterator)  # coordinator.schedule(step_fn, args=(per_worker_iterator,))
    # Wait at epoch boundaries.
    strategy.barrier(f"epoch-{i}")  # coordinator.join()
    print("Finished epoch %d, accuracy is %f." % (i, accuracy.result().numpy()))
    record(part="loop", task=task, epoch=i, accuracy=float(accuracy.result().numpy()))

loss = step_fn(per_worker_iterator)  # coordinator.schedule(...)
print("Final loss is %f" % loss.numpy())  # loss.fetch()
record(part="final", task=task, loss=float(loss.numpy()), checkpoint=os.path.exists(ckpt_filepath),
       placement=[[k, ps] for k, ps, _ in strategy.placement_table()])
