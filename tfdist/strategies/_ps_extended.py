"""``ParameterServerExtended``: the ``tf.distribute`` hooks of the parameter-server strategies, and nothing else.

Built as TF's ``ParameterServerStrategyV2`` / ``…Extended`` pair: the public
strategy (``parameter_server.py``) is a thin shell, this object sees what
Keras does (DESIGN.md §1) and hands every decision to the runtime of the
job's exchange path (``_ps_runtime.py``, ``_update_path.py``, ``_gradient_path.py``):

* ``_create_variable``: every variable; the runtime keeps the ones it wants
  on the parameter servers (round-robin placement happens at the first step)
  and notes the layer creating each, for layers with ``finalize_state``;
* ``_batch_reduce_to``: the gradient all-reduce of a training step (the
  gradient path exchanges here; the update path reduces locally);
* ``_update``: the optimizer applying a gradient to a variable (how the
  gradient path matches exchanged gradients to variables);
* ``_distribute_datasets_from_function``: the dataset function sees one
  input pipeline per training worker (``_input_context.py``);
* ``_step`` (an outermost ``call_for_each_replica``, ``_steps.py``): one
  step; a ``tf.py_function`` runs the runtime's ``begin_step`` before it,
  and a training step ends with the runtime's end-of-step (its statistics
  join the Keras logs). Calls from inside a step are part of it
  (``_inside_step``: LossScaleOptimizer's).
"""

from __future__ import annotations

import contextlib
import inspect

import keras
import numpy as np
import tensorflow as tf

from tfdist._tf_compat import in_xla_compilation, is_loss_scale_check, keras_variable_owner, refuse_legacy_keras
from tfdist.errors import ConfigError
from tfdist.strategies._input_context import with_input_context, worker_input_context
from tfdist.strategies._ps_runtime import STAT_NAMES, PSRuntime
from tfdist.strategies._steps import StepExtended
from tfdist.strategies._stuck import note_progress

__all__ = ["ParameterServerExtended"]


class ParameterServerExtended(StepExtended):
    """Hooks that route variables and steps through the parameter servers."""

    def __init__(self, container_strategy, runtime: PSRuntime, device: str = "/cpu:0"):
        super().__init__(container_strategy, device)
        self._runtime = runtime
        self._tracing_training_step = False

    @property
    def _num_replicas_in_sync(self):
        return self._runtime.num_replicas

    def _distribute_datasets_from_function(self, dataset_fn, options):
        runtime = self._runtime
        context = worker_input_context(runtime.config.cluster.num_workers, runtime.worker_id, runtime.num_replicas)
        return super()._distribute_datasets_from_function(with_input_context(dataset_fn, context), options)

    def _create_variable(self, next_creator, **kwargs):
        refuse_legacy_keras()
        name = str(kwargs.get("name") or "")
        owner = keras_variable_owner()
        on_ps = self._runtime.wants(name, kwargs, owner)
        # Created while a step traces (an optimizer built by its first apply_gradients in a custom loop):
        # TF runs such initialisers in a function of their own before the step, and under the step's
        # control dependency on the begin op that function would start the step (and initialise the PS
        # from variables not initialised yet). The initial value needs nothing of the step.
        with tf.control_dependencies(None) if self._in_step else contextlib.nullcontext():
            var = super()._create_variable(next_creator, **kwargs)
        if isinstance(owner, keras.optimizers.Optimizer):
            self._runtime.note_optimizer(owner)
        if on_ps:
            self._runtime.register(var, name, kwargs, owner=owner)
        return var

    def _batch_reduce_to(self, reduce_op, value_destination_pairs, options):
        self._tracing_training_step = True
        reduced = self._runtime.reduce_gradients([v for v, _ in value_destination_pairs])
        if reduced is None:
            return super()._batch_reduce_to(reduce_op, value_destination_pairs, options)
        return reduced

    def _update(self, var, fn, args, kwargs, group):
        self._tracing_training_step = True
        if args:
            self._runtime.note_update(var)
        return super()._update(var, fn, args, kwargs, group)

    def _run_step(self, fn, args, kwargs):
        """Keras's step; its writes (the optimizer's, eager under ``run_eagerly``) are not local writes."""
        registry = self._runtime.registry
        registry.stepping = True
        try:
            return self._on_replica(fn, args, kwargs)
        finally:
            registry.stepping = False

    def _inside_step(self, fn, args, kwargs):
        runtime = self._runtime
        synchronous = runtime.policy.exchange.steps_are_global and runtime.config.starting_workers > 1
        if synchronous and is_loss_scale_check(fn):
            raise ConfigError(
                f"{type(self._container_strategy()).__name__} cannot train with dynamic loss scaling "
                "(keras.mixed_precision 'mixed_float16', LossScaleOptimizer): each worker decides alone "
                "whether its gradients overflowed and skips the step, so the synchronous workers would "
                "disagree on which steps exist. Use the 'mixed_bfloat16' policy (no loss scaling), an "
                "update-path strategy (async, SSP, DTSSP) or tfdist.AllReduceStrategy."
            )
        return super()._inside_step(fn, args, kwargs)

    def _step(self, fn, args, kwargs):
        if in_xla_compilation():
            raise ConfigError(
                f"{type(self._container_strategy()).__name__} cannot run a step compiled with XLA: it exchanges "
                "with the parameter servers through tf.py_function, which XLA cannot compile. Received: "
                "model.compile(..., jit_compile=True). Compile with jit_compile=False (or leave it at 'auto')."
            )
        runtime = self._runtime
        if runtime.local_only():
            # One process, nothing to exchange: Keras's step and a step counter (README "Single process").
            self._tracing_training_step = False
            result = self._run_step(fn, args, kwargs)
            runtime.end_of_step_done_tracing()
            if not (self._tracing_training_step and runtime.variables):
                return result
            return _with_stats(result, runtime.build_local_end_of_step())
        trace = {"training": False}  # known once fn is traced; read when the step runs

        def begin():
            note_progress()
            runtime.begin_step(trace["training"])
            return np.int64(0)

        began, begin_skips = runtime.build_begin(begin, keras_train_step=_is_keras_train_step(fn))
        self._tracing_training_step = False
        with tf.control_dependencies([began]):
            result = self._run_step(fn, args, kwargs)
        runtime.end_of_step_done_tracing()
        trace["training"] = self._tracing_training_step
        if not (trace["training"] and runtime.variables):
            return result
        # The end of the step reads every variable: after the begin op's pull too. (A variable the step
        # does not write, e.g. Normalization's statistics, is otherwise read whenever TF likes, possibly
        # before a pull wrote the job's values into it: that worker then pushed "initial - job's" as an
        # update, which made a DTSSP job's variance negative and its steps NaN.)
        with tf.control_dependencies([began]):
            stats = runtime.build_end_of_step(result, begin_skips=begin_skips)
        return _with_stats(result, stats)


def _is_keras_train_step(fn) -> bool:
    """Whether ``fn`` (what Keras's step function runs under ``strategy.run``) is a Keras model's ``train_step``.

    Keras 3.15 passes the model's bound ``train_step`` (wrapped by autograph); evaluation passes ``test_step``,
    prediction a function of its own.
    """
    method = inspect.unwrap(fn)
    return getattr(method, "__name__", "") == "train_step" and isinstance(getattr(method, "__self__", None),
                                                                           keras.Model)


def _with_stats(result, stats: tf.Tensor):
    """The step's logs with the ``ps_*`` statistics added (when Keras's step returns a dict)."""
    if not isinstance(result, dict):
        return result
    result = dict(result)
    stats = tf.ensure_shape(stats, [len(STAT_NAMES)])
    for i, name in enumerate(STAT_NAMES):
        result[name] = stats[i]
    return result


_original_flatten = None


def install_plain_batch_results() -> None:
    """``train_on_batch`` returns what plain Keras returns: the model's metrics, without the ``ps_*`` statistics.

    Keras flattens a step's logs into a list for ``train_on_batch`` (without
    ``return_dict``) by putting the model's metrics first and then *every
    other* log key, so the five ``ps_*`` statistics a training step adds would
    lengthen the list (``loss, acc = model.train_on_batch(...)`` would fail,
    and a model without metrics would get a list instead of its loss). The
    statistics stay in ``return_dict=True``, ``fit``'s logs and History.
    Runs once, when a parameter-server strategy is created; a metric of the
    model that happens to be named like a statistic is kept.
    """
    global _original_flatten
    if _original_flatten is not None:
        return
    _original_flatten = keras.Model._flatten_metrics_in_order

    def _flatten_metrics_in_order(self, logs):
        if isinstance(logs, dict) and any(name in logs for name in STAT_NAMES):
            names = set()
            for metric in self.metrics:
                names.update(getattr(sub, "name", None) for sub in getattr(metric, "metrics", None) or [metric])
            logs = {k: v for k, v in logs.items() if k not in STAT_NAMES or k in names}
        return _original_flatten(self, logs)

    keras.Model._flatten_metrics_in_order = _flatten_metrics_in_order
