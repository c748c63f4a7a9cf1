"""The only module of tfdist that imports ``tensorflow.python.*``.

TensorFlow upgrades touch this file alone. Checked on TF 2.21 / Keras 3.15 (CPU):

Strategies (DESIGN.md §1): a ``tf.distribute.Strategy`` over a subclass of
``OneDeviceExtended`` works with Keras 3 ``fit``/``evaluate``/``predict``, and
its hooks (``_create_variable``, ``_call_for_each_replica``,
``_batch_reduce_to``, ``_update``) see every variable and every step.

Collective groups between independent processes (two and three processes):

* ``context.configure_collective_ops(collective_leader, device_filters=(own task,))``,
  ``context.configure_coordination_service("standalone", ...)`` and
  ``context.enable_collective_ops(server_def)`` must run before the process
  runs any TF op; ``ensure_initialized()`` then starts the task's gRPC server
  on its port and (with the coordination service) waits until every task has
  registered, up to ``cluster_register_timeout``.
* ``server_def.default_session_config`` must be a copy of ``context.config``:
  that is what carries the coordination-service settings (a fresh
  ``ConfigProto`` silently runs without the service).
* A peer that dies makes pending and later collectives fail with
  ``UnavailableError`` (socket closed / connection refused / "tasks are
  unhealthy (stopped sending heartbeats)" from the coordination service); a
  peer that hangs makes them fail with ``DeadlineExceededError`` after
  ``timeout_seconds``. After either, TF aborts the process's collective
  executor: every later collective fails too ("Restart your program to reset").
* No process is killed by TF when a peer dies, with or without the service.
"""

from __future__ import annotations

import copy
import os
import sys
from typing import Mapping, Sequence

from tensorflow.compiler.xla.tsl.protobuf import coordination_config_pb2
from tensorflow.core.protobuf import cluster_pb2, tensorflow_server_pb2
from tensorflow.python.distribute import distribute_lib, input_util, one_device_strategy
from tensorflow.python.eager import context

from tfdist.errors import ConfigError

#: Base of every tfdist strategy (see DESIGN.md §1: works with Keras 3 fit).
OneDeviceExtended = one_device_strategy.OneDeviceExtended
StrategyBase = distribute_lib.Strategy

__all__ = [
    "OneDeviceExtended",
    "StrategyBase",
    "context_initialized",
    "enable_collective_group",
    "in_xla_compilation",
    "refuse_legacy_keras",
    "keras_tensorflow_trainer",
    "keras_variable_owner",
    "is_loss_scale_check",
    "replica_context",
    "sharded_distributed_dataset",
    "called_from_keras_trainer",
    "host_distributed_dataset",
    "host_distributed_datasets_from_function",
]


def called_from_keras_trainer(depth: int = 12) -> bool:
    """Whether Keras 3's TensorFlow trainer (``fit``/``evaluate``/``predict``) is the caller.

    Checked on Keras 3.15: its epoch iterator calls
    ``strategy.experimental_distribute_dataset`` for every input type, and
    its array adapter marks the datasets it makes from numpy arrays with the
    ``DATA`` auto-shard policy.
    """
    frame = sys._getframe(2)  # pylint: disable=protected-access
    for _ in range(depth):
        if frame is None:
            return False
        if frame.f_globals.get("__name__", "").startswith("keras.src.backend.tensorflow.trainer"):
            return True
        frame = frame.f_back
    return False


def sharded_distributed_dataset(extended, dataset, options, input_context):
    """``dataset`` distributed as MultiWorkerMirroredStrategy distributes it on this worker.

    Checked on TF 2.21: ``input_util.get_distributed_dataset`` with an
    ``input_context`` (between-graph: this worker is pipeline
    ``input_pipeline_id`` of ``num_input_pipelines``) first rebatches the
    global batch into this worker's share of ``num_replicas_in_sync``
    per-replica batches, then auto-shards by the dataset's
    ``options().experimental_distribute.auto_shard_policy`` (FILE, DATA, or
    AUTO: by file, else by data; OFF: no shard) — MultiWorkerMirroredStrategy's path.
    """
    return input_util.get_distributed_dataset(
        dataset, extended._input_workers_with_options(options), extended._container_strategy(),  # pylint: disable=protected-access
        num_replicas_in_sync=input_context.num_replicas_in_sync, input_context=input_context, options=options)


def _host_input_options(extended, options):
    """Input options that iterate a one-device worker's input with a plain ``tf.data`` iterator, or None.

    Checked on TF 2.21: ``OneDeviceExtended`` distributes a dataset (and a
    dataset function's) through ``input_lib`` with ``PER_WORKER`` options,
    which always wraps the iterator in a ``MultiDeviceIterator``: making one
    traces its per-device generator functions, ~80 ms of CPU for every
    iterator, i.e. every epoch of ``fit``/``evaluate``/``predict`` (a plain
    iterator: ~2 ms). With one device that is the host's CPU there is
    nothing to fetch to; ``PER_REPLICA`` options without ``fetch_to_device``
    make ``input_lib`` iterate the dataset itself on the host (the data
    list is wrapped as the multi-device iterator would have returned it).
    Only for the default ``PER_WORKER`` mode without
    ``place_dataset_on_device``; anything else (or a GPU worker) keeps TF's path.
    """
    if extended._device != extended._input_device:  # pylint: disable=protected-access
        return None
    if options is not None and (
            options.experimental_replication_mode != distribute_lib.InputReplicationMode.PER_WORKER
            or options.experimental_place_dataset_on_device):
        return None
    buffer_size = 1 if options is None else options.experimental_per_replica_buffer_size
    return distribute_lib.InputOptions(
        experimental_fetch_to_device=False,
        experimental_replication_mode=distribute_lib.InputReplicationMode.PER_REPLICA,
        experimental_place_dataset_on_device=False, experimental_per_replica_buffer_size=buffer_size)


def _prefetched(dataset, options):
    # The multi-device iterator kept ``per_replica_buffer_size`` elements ready per device: so does this path.
    return dataset.prefetch(options.experimental_per_replica_buffer_size) \
        if options.experimental_per_replica_buffer_size else dataset


def host_distributed_dataset(extended, dataset, options):
    """``OneDeviceExtended._experimental_distribute_dataset``, iterated without a multi-device iterator
    when the worker's device is its host's CPU (:func:`_host_input_options`)."""
    host = _host_input_options(extended, options)
    if host is None:
        return one_device_strategy.OneDeviceExtended._experimental_distribute_dataset(extended, dataset, options)
    return input_util.get_distributed_dataset(
        _prefetched(dataset, host), extended._input_workers_with_options(host),  # pylint: disable=protected-access
        extended._container_strategy(), options=host)  # pylint: disable=protected-access


def host_distributed_datasets_from_function(extended, dataset_fn, options):
    """``OneDeviceExtended._distribute_datasets_from_function``, iterated without a multi-device iterator
    when the worker's device is its host's CPU (:func:`_host_input_options`)."""
    host = _host_input_options(extended, options)
    if host is None:
        return one_device_strategy.OneDeviceExtended._distribute_datasets_from_function(extended, dataset_fn, options)
    return input_util.get_distributed_datasets_from_function(
        lambda context: _prefetched(dataset_fn(context), host),
        extended._input_workers_with_options(host),  # pylint: disable=protected-access
        [distribute_lib.InputContext()], extended._container_strategy(), options=host)  # pylint: disable=protected-access


def replica_context(strategy, replica_id_in_sync_group: int):
    """The replica context of a one-device extended whose one replica is replica ``replica_id_in_sync_group`` of the job.

    Checked on TF 2.21: ``OneDeviceExtended`` enters a ``_OneDeviceReplicaContext``
    with id 0; the local replica id (``_get_local_replica_id``, which indexes
    per-replica values) is computed from the id given to the constructor, so
    it stays 0 while ``replica_id_in_sync_group`` reports the job-wide id.
    """
    ctx = one_device_strategy._OneDeviceReplicaContext(strategy)  # pylint: disable=protected-access
    ctx._replica_id_in_sync_group = int(replica_id_in_sync_group)  # pylint: disable=protected-access
    return ctx


def in_xla_compilation() -> bool:
    """Whether the function being traced now is compiled with XLA (``jit_compile=True``)."""
    from tensorflow.python.framework import ops
    from tensorflow.python.ops import control_flow_util

    return bool(control_flow_util.GraphOrParentsInXlaContext(ops.get_default_graph()))


def keras_tensorflow_trainer():
    """Keras 3's private TensorFlow trainer class, or None in another layout.

    ``tfdist.data`` wraps its ``_maybe_symbolic_build`` so queue-fed datasets
    are not read ahead of training (checked on Keras 3.15: under any
    strategy, ``fit``/``evaluate`` take a batch from a throwaway iterator).
    """
    try:
        from keras.src.backend.tensorflow.trainer import TensorFlowTrainer
    except ImportError:  # another Keras layout or backend
        return None
    return TensorFlowTrainer


def keras_variable_owner():
    """The object (a Keras layer) whose weight is being created now, or None.

    Checked on Keras 3.15: ``Layer.add_weight`` creates the variable inside
    ``backend.name_scope(layer.name, caller=layer)``, and Keras keeps its
    open name scopes on a per-thread stack.
    """
    try:
        from keras.src.backend.common import global_state
    except ImportError:  # another Keras layout
        return None
    stack = global_state.get_global_attribute("name_scope_stack")
    return getattr(stack[-1], "caller", None) if stack else None


def is_loss_scale_check(fn) -> bool:
    """Whether ``fn`` (as given to ``call_for_each_replica``) is ``LossScaleOptimizer.check_finite``.

    Checked on Keras 3.15: under a strategy that needs merge calls,
    ``LossScaleOptimizer`` decides whether a step's gradients overflowed with
    ``call_for_each_replica(self.check_finite, ...)`` from inside the step,
    on the replica's own (not yet reduced) gradients, and applies them only
    if they are finite. TF may hand the method over wrapped (autograph).
    """
    try:
        from keras.src.optimizers.loss_scale_optimizer import LossScaleOptimizer
    except ImportError:  # another Keras layout
        return False
    import inspect

    fn = inspect.unwrap(fn)
    return getattr(fn, "__name__", None) == "check_finite" and isinstance(getattr(fn, "__self__", None),
                                                                          LossScaleOptimizer)


def context_initialized() -> bool:
    """Whether this process already created its TF eager context (ran an op)."""
    return context.context()._context_handle is not None  # pylint: disable=protected-access


def enable_collective_group(
    jobs: Mapping[str, Sequence[str]],
    job: str,
    index: int,
    leader: str,
    *,
    coordination_service: bool,
    register_timeout_ms: int,
    heartbeat_timeout_ms: int,
    shutdown_barrier_timeout_ms: int,
) -> list[str]:
    """Makes this process task ``/job:{job}/task:{index}`` of a collective group.

    Args:
        jobs: ``{job: [host:port, ...]}`` of the group's tasks.
        job: This task's job.
        index: This task's index in ``jobs[job]``.
        leader: Device string of the group leader, e.g. ``/job:chief/replica:0/task:0``.
        coordination_service: Also run TF's standalone coordination service
            (hosted by the leader): registration barrier, heart-beats, and an
            error naming a dead task.
        register_timeout_ms: How long start-up waits for every task to register.
        heartbeat_timeout_ms: A task silent this long is reported unhealthy.
        shutdown_barrier_timeout_ms: How long exit waits for the other tasks.

    Returns:
        The devices this process sees after set-up.
    """
    ctx = context.context()
    ctx.configure_collective_ops(
        collective_leader=leader,
        scoped_allocator_enabled_ops=("CollectiveReduce",),
        device_filters=(f"/job:{job}/task:{index}",),
    )
    if coordination_service and ctx.coordination_service is None:
        ctx.configure_coordination_service(
            "standalone",
            service_leader=leader,
            cluster_register_timeout_in_ms=register_timeout_ms,
            heartbeat_timeout_in_ms=heartbeat_timeout_ms,
            shutdown_barrier_timeout_in_ms=shutdown_barrier_timeout_ms,
            coordinated_jobs=[
                coordination_config_pb2.CoordinatedJob(name=name, num_tasks=len(addrs))
                for name, addrs in jobs.items()
            ],
        )
    cluster_def = cluster_pb2.ClusterDef()
    for name, addrs in jobs.items():
        job_def = cluster_def.job.add()
        job_def.name = name
        for i, addr in enumerate(addrs):
            job_def.tasks[i] = addr
    port = int(jobs[job][index].rpartition(":")[2])
    server_def = tensorflow_server_pb2.ServerDef(
        cluster=cluster_def,
        default_session_config=copy.deepcopy(ctx.config),
        job_name=job,
        task_index=index,
        protocol="grpc",
        port=port,
    )
    ctx.enable_collective_ops(server_def)
    ctx.ensure_initialized()
    return list(ctx.devices())


def refuse_legacy_keras(depth: int = 60) -> None:
    """Raises ``ConfigError`` when the variable being created comes from tf-keras (Keras 2).

    tfdist's strategies are written and tested for Keras 3 (the ``keras``
    package); with tf-keras (``TF_USE_LEGACY_KERAS=1``, or ``import
    tf_keras``) ``fit`` runs, but its optimizer's ``learning_rate`` becomes a
    variable the strategies place like a model weight, so one worker's
    learning-rate schedule changes every worker's, and nothing else of it is
    tested. Called where a strategy creates a variable (rare: never per
    step), it looks for a tf-keras frame among its callers.
    """
    frame = sys._getframe(1)  # pylint: disable=protected-access
    for _ in range(depth):
        if frame is None:
            return
        module = frame.f_globals.get("__name__", "")
        if module == "tf_keras" or module.startswith("tf_keras."):
            legacy = os.environ.get("TF_USE_LEGACY_KERAS", "")
            raise ConfigError(
                "tfdist supports Keras 3 (`import keras`) only, and this model is built with tf-keras "
                f"(Keras 2: {'TF_USE_LEGACY_KERAS=' + legacy if legacy else 'import tf_keras'}). Under tfdist "
                "its optimizer's learning rate would be shared between workers like a weight. Unset "
                "TF_USE_LEGACY_KERAS and build the model with `keras` (Keras 3); README \"Keras 3 only\"."
            )
        frame = frame.f_back
