"""TensorFlow's tutorial "Distributed input", on tfdist.

https://www.tensorflow.org/tutorials/distribute/input — the tutorial's code
as written there: ``experimental_distribute_dataset`` and
``distribute_datasets_from_function``, iterating with ``for``, ``iter``/``next``
and inside a ``tf.function``, ``element_spec`` as an ``input_signature``,
``get_next_as_optional`` for a last partial batch,
``experimental_distribute_values_from_function`` and
``experimental_local_results``. Changed: the strategy line
(``make_strategy()``; the tutorial uses ``MirroredStrategy`` on one machine,
this file is run on 2 worker processes), ``record`` calls beside the prints,
and the dataset of ``experimental_distribute_dataset`` sets its auto-shard
policy to ``DATA`` as the tutorial's section "Sharding" shows (tfdist shards a
dataset only when its policy is set explicitly; MultiWorkerMirroredStrategy's
default ``AUTO`` shards by file, then by data: docs/from_tf_strategies.md).
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from _common import make_strategy, record  # noqa: E402

strategy = make_strategy()
task = getattr(strategy.cluster_resolver, "task_id", 0)


def values(per_replica):
    """The tutorial prints per-replica values; this worker's (one replica per worker) as a list."""
    return [np.asarray(v).tolist() for v in strategy.experimental_local_results(per_replica)]


def spec_shape(spec):
    """A (per-replica) spec's shape as text: MultiWorkerMirroredStrategy's is a ``PerReplicaSpec``."""
    return str(spec.shape if hasattr(spec, "shape") else spec._component_specs[0].shape)


# ---- tf.distribute.Strategy.experimental_distribute_dataset
global_batch_size = 16
# Create a tf.data.Dataset object.
dataset = tf.data.Dataset.from_tensors(([1.], [1.])).repeat(128).batch(global_batch_size)
options = tf.data.Options()
options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
dataset = dataset.with_options(options)


@tf.function
def train_step(inputs):
    features, labels = inputs
    return labels - 0.3 * features


# Iterate over the dataset using the for..in construct.
dist_dataset = strategy.experimental_distribute_dataset(dataset)
batches = []
for x in dist_dataset:
    # train_step trains the model using the dataset elements
    loss = strategy.run(train_step, args=(x,))
    print("Loss is ", loss)
    batches.append(len(values(loss)[0]))
record(section="experimental_distribute_dataset", task=task, batch_sizes=batches, loss=values(loss)[0][0])


# ---- tf.distribute.Strategy.distribute_datasets_from_function
def dataset_fn(input_context):
    batch_size = input_context.get_per_replica_batch_size(global_batch_size)
    dataset = tf.data.Dataset.from_tensors(([1.], [1.])).repeat(64)
    # tfdist's addition: each element says which element it is, so the test sees the shards.
    dataset = dataset.enumerate().map(lambda i, xy: (tf.cast(tf.reshape(i, [1]), tf.float32) + xy[0], xy[1]))
    dataset = dataset.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
    dataset = dataset.batch(batch_size)
    dataset = dataset.prefetch(2)  # This prefetches 2 batches per device.
    return dataset


dist_dataset = strategy.distribute_datasets_from_function(dataset_fn)
seen = []
for x in dist_dataset:
    seen += [int(round(f - 1)) for f in np.asarray(values(x[0])[0]).reshape(-1)]
record(section="distribute_datasets_from_function", task=task, elements=seen)

# ---- Distributed iterators: iter and next
num_epochs = 2
steps_per_epoch = 2
losses = []
for epoch in range(num_epochs):
    dist_iterator = iter(dist_dataset)
    for step in range(steps_per_epoch):
        # train_step trains the model using the dataset elements
        loss = strategy.run(train_step, args=(next(dist_iterator),))
        # which is the same as
        # loss = strategy.run(train_step, args=(dist_iterator.get_next(),))
        print("Loss is ", loss)
        losses.append(values(loss)[0])
record(section="iter_next", task=task, steps=len(losses))


# ---- Iterating inside a tf.function
@tf.function
def train(dist_dataset):
    total = tf.constant(0.0)
    for x in dist_dataset:
        loss = strategy.run(train_step, args=(x,))
        total += tf.reduce_sum(strategy.experimental_local_results(loss)[0])
    return total


record(section="inside_tf_function", task=task, total=float(train(dist_dataset)))

# ---- element_spec as the input signature
dist_dataset = strategy.distribute_datasets_from_function(dataset_fn)


@tf.function(input_signature=[dist_dataset.element_spec])
def train_step_with_spec(inputs):
    def step_fn(inputs):
        return 2 * inputs

    return strategy.run(step_fn, args=(inputs,))


doubled = None
for x in dist_dataset:
    doubled = train_step_with_spec(x)
    print(doubled)
record(section="element_spec", task=task, spec=spec_shape(dist_dataset.element_spec[0]),
       doubled_shape=list(np.asarray(values(doubled[0])[0]).shape))

# ---- Partial batches: get_next_as_optional
dataset = tf.data.Dataset.range(9).batch(2)
dist_dataset = strategy.experimental_distribute_dataset(dataset)
steps_per_loop = 5


@tf.function
def train_fn(distributed_iterator):
    count = tf.constant(0, tf.int64)
    last = tf.constant(-1, tf.int64)
    for _ in tf.range(steps_per_loop):
        optional_data = distributed_iterator.get_next_as_optional()
        if not optional_data.has_value():
            break
        per_replica_results = strategy.run(lambda x: x, args=(optional_data.get_value(),))
        local = strategy.experimental_local_results(per_replica_results)[0]
        count += tf.size(local, out_type=tf.int64)
        last = tf.cond(tf.size(local) > 0, lambda: local[-1], lambda: last)  # (a replica's batch may be empty)
    return count, last


count, last = train_fn(iter(dist_dataset))
record(section="get_next_as_optional", task=task, count=int(count), last=int(last))


# ---- experimental_distribute_values_from_function
def value_fn(ctx):
    return tf.constant(ctx.replica_id_in_sync_group)


distributed_values = strategy.experimental_distribute_values_from_function(value_fn)
result = strategy.run(lambda x: x + 1, args=(distributed_values,))
print(strategy.experimental_local_results(result))
record(section="values_from_function", task=task, local_results=values(result),
       replicas=strategy.num_replicas_in_sync)
