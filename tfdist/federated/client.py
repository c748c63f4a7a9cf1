"""Client-side local training, run inside the train-worker processes.

A :class:`ClientUpdate` is built once per worker (:meth:`ClientUpdate.setup`,
where it compiles its ``tf.function``) and then trains one client after
another on the same Keras model (:meth:`ClientUpdate.train`): it assigns the
weights it was sent, runs the client's local epochs in one compiled call, and
reads the weights back. This is what makes the simulator fast: a client update
costs a few milliseconds instead of the ~60 ms of ``model.fit`` set-up, and the
model is never rebuilt.

To add a local training method (a new loss, a regulariser, a different
optimizer), subclass :class:`KerasClientUpdate` and override
:meth:`KerasClientUpdate.prepare` and/or :meth:`KerasClientUpdate.compute_loss`.

TensorFlow is imported inside methods only, so importing this module is cheap.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable

import numpy as np

from tfdist.errors import ConfigError

__all__ = [
    "ClientConfig",
    "ClientTask",
    "ClientUpdate",
    "KerasClientUpdate",
    "ProximalClientUpdate",
    "DistillationClientUpdate",
]


@dataclasses.dataclass
class ClientConfig:
    """How a simulated device trains locally.

    The simulator uses these values as given for every client (it never
    enlarges batches or cuts epochs to go faster).

    Args:
        learning_rate: local optimizer learning rate. Defaults to 0.1.
        optimizer: ``"sgd"`` or ``"adam"`` (a fresh optimizer state for every
            client update, as on a real device). Defaults to ``"sgd"``.
        momentum: SGD momentum. Defaults to 0.
        local_epochs: epochs over the client's data per update; one int for all
            clients or a list with one int per client. Defaults to 1.
        batch_size: local batch size; one int or one per client. Defaults to 16.
        from_logits: whether the model outputs logits. Defaults to ``None``:
            detected (a final softmax means probabilities).
    """

    learning_rate: float = 0.1
    optimizer: str = "sgd"
    momentum: float = 0.0
    local_epochs: int | list = 1
    batch_size: int | list = 16
    from_logits: bool | None = None

    def __post_init__(self):
        def number(value):
            return isinstance(value, (int, float, np.floating)) and not isinstance(value, bool) and math.isfinite(value)

        if not (number(self.learning_rate) and self.learning_rate > 0):
            raise ConfigError(f"client.learning_rate must be a finite number > 0. Received: learning_rate={self.learning_rate!r}")
        if self.optimizer not in ("sgd", "adam"):
            raise ConfigError(f"client.optimizer must be 'sgd' or 'adam'. Received: optimizer={self.optimizer!r}")
        if not (number(self.momentum) and 0.0 <= self.momentum < 1.0):
            raise ConfigError(f"client.momentum must be a number in [0, 1). Received: momentum={self.momentum!r}")
        for name in ("local_epochs", "batch_size"):
            value = getattr(self, name)
            values = list(value) if isinstance(value, (list, tuple, np.ndarray)) else [value]
            if not values or any(not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v < 1 for v in values):
                raise ConfigError(
                    f"client.{name} must be a positive int or a list of them (one per client). Received: {name}={value!r}"
                )
            if isinstance(value, (tuple, np.ndarray)):
                setattr(self, name, [int(v) for v in values])

    def _per_client(self, name: str, client_id: int) -> int:
        value = getattr(self, name)
        if isinstance(value, list):
            if client_id >= len(value):
                raise ConfigError(
                    f"client.{name} has {len(value)} entries but client {client_id} exists. "
                    f"Received: len({name})={len(value)}. Give one value per client."
                )
            return int(value[client_id])
        return int(value)

    def epochs_of(self, client_id: int) -> int:
        """Local epochs of ``client_id``."""
        return self._per_client("local_epochs", client_id)

    def batch_size_of(self, client_id: int) -> int:
        """Local batch size of ``client_id``."""
        return self._per_client("batch_size", client_id)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


@dataclasses.dataclass
class ClientTask:
    """One unit of work for a train worker: train ``client_id`` from ``weights``.

    Attributes:
        job_id: unique id of this update in the run.
        client_id: the client (its data is already in the worker).
        round_num: round in which it was dispatched (1-based).
        weights: the weights to start from, one array per ``model.weights``.
        local_epochs: epochs to run.
        batch_size: batch size to use.
        seed: seed of the local shuffling (derived from run seed, round, client).
        extras: method-specific inputs, e.g. ``{"neighbour_weights": [...]}``.
    """

    job_id: int
    client_id: int
    round_num: int
    weights: list
    local_epochs: int
    batch_size: int
    seed: int
    extras: dict = dataclasses.field(default_factory=dict)


class ClientUpdate:
    """Base class of local training methods (runs in the train workers).

    Subclasses must be picklable (defined at module level of an importable
    module) because they are sent to the worker processes.
    """

    def setup(self, model: Any, config: ClientConfig, build_model: Callable[[], Any]) -> None:
        """Called once per worker with the worker's model.

        Args:
            model: the worker's built Keras model (reused for every client).
            config: the device settings.
            build_model: returns a fresh model of the same architecture (e.g. a teacher).
        """
        self.model = model
        self.config = config

    def train(self, task: ClientTask, x: np.ndarray, y: np.ndarray) -> tuple[list, dict]:
        """Trains one client and returns ``(new_weights, metrics)``."""
        raise NotImplementedError

    def warm_up(self, task: ClientTask, x: np.ndarray, y: np.ndarray) -> None:
        """Called once at worker start-up with a throw-away task (e.g. to trace
        compiled functions before the first round). Defaults to nothing."""


def _output_is_logits(model) -> bool:
    layer = model.layers[-1] if model.layers else None
    activation = getattr(layer, "activation", None)
    name = getattr(activation, "__name__", "") or ""
    return "softmax" not in name


class KerasClientUpdate(ClientUpdate):
    """Local training with a compiled train loop over a reused Keras model.

    The whole update (all local epochs and batches) is one call of a
    ``tf.function`` traced once per worker: weights are assigned from numpy,
    ``ceil(n / batch_size) * epochs`` steps run in a ``tf.while_loop``, and the
    weights are read back. Loss: sparse categorical cross-entropy plus the
    model's own regularisation losses, plus whatever :meth:`compute_loss` adds.
    """

    def setup(self, model, config, build_model):
        import keras
        import tensorflow as tf

        super().setup(model, config, build_model)
        self.from_logits = _output_is_logits(model) if config.from_logits is None else bool(config.from_logits)
        if config.optimizer == "sgd":
            self.optimizer = keras.optimizers.SGD(learning_rate=config.learning_rate, momentum=config.momentum)
        else:
            self.optimizer = keras.optimizers.Adam(learning_rate=config.learning_rate)
        before = {id(v) for v in self.optimizer.variables}
        self.optimizer.build(model.trainable_variables)
        self._slots = [v for v in self.optimizer.variables if id(v) not in before]
        self._slot_zeros = [np.zeros(v.shape, dtype=v.dtype.name if hasattr(v.dtype, "name") else v.dtype) for v in self._slots]
        self._weights = list(model.weights)
        self._fit_fn = None
        self._tf = tf

    # -- hooks for subclasses -------------------------------------------------
    def prepare(self, task: ClientTask, x: np.ndarray, y: np.ndarray) -> np.ndarray | None:
        """Per-example extra targets for :meth:`compute_loss` (e.g. soft labels), or ``None``.

        Runs eagerly before training; the returned array is shuffled and
        batched together with ``x`` and ``y``.
        """
        return None

    def compute_loss(self, y, outputs, targets):
        """Loss of one batch (inside ``tf.function``).

        Args:
            y: integer labels of the batch.
            outputs: model outputs (logits or probabilities).
            targets: rows of :meth:`prepare`'s array for the batch (shape ``(b, 0)`` if none).
        """
        import keras

        return keras.ops.mean(
            keras.losses.sparse_categorical_crossentropy(y, outputs, from_logits=self.from_logits)
        )

    def before_training(self, task: ClientTask) -> None:
        """Called after the start weights were assigned (e.g. to snapshot them)."""

    # -- engine ---------------------------------------------------------------
    def _build_fit(self, x: np.ndarray, num_targets: int):
        tf = self._tf
        model = self.model
        feature_spec = tf.TensorSpec([None, *x.shape[1:]], tf.as_dtype(x.dtype))

        @tf.function(
            input_signature=[
                feature_spec,
                tf.TensorSpec([None], tf.int64),
                tf.TensorSpec([None, None], tf.float32),
                tf.TensorSpec([None], tf.int32),
                tf.TensorSpec([None], tf.int32),
            ]
        )
        def fit(xs, ys, ts, starts, ends):
            total = tf.constant(0.0, tf.float32)
            n = tf.shape(starts)[0]
            for i in tf.range(n):
                s, e = starts[i], ends[i]
                with tf.GradientTape() as tape:
                    out = model(xs[s:e], training=True)
                    loss = self.compute_loss(ys[s:e], out, ts[s:e])
                    if model.losses:
                        loss = loss + tf.add_n(model.losses)
                grads = tape.gradient(loss, model.trainable_variables)
                self.optimizer.apply(grads, model.trainable_variables)
                total += tf.cast(loss, tf.float32)
            return total / tf.cast(tf.maximum(n, 1), tf.float32)

        return fit

    def warm_up(self, task, x, y):
        """Traces the compiled train loop with a throw-away update (every task
        assigns its own weights and resets the optimizer, so nothing leaks)."""
        self.train(task, x, y)

    def train(self, task, x, y):
        n = int(y.shape[0])
        for var, value in zip(self._weights, task.weights):
            var.assign(value)
        for var, zero in zip(self._slots, self._slot_zeros):
            var.assign(zero)
        self.optimizer.iterations.assign(0)
        self.before_training(task)
        targets = self.prepare(task, x, y)
        if targets is None:
            targets = np.zeros((n, 0), np.float32)
        rng = np.random.default_rng(task.seed)
        order, starts, ends = [], [], []
        for epoch in range(task.local_epochs):
            offset = epoch * n
            order.append(rng.permutation(n))
            for s in range(0, n, task.batch_size):
                starts.append(offset + s)
                ends.append(offset + min(s + task.batch_size, n))
        idx = np.concatenate(order) if order else np.zeros(0, np.int64)
        if self._fit_fn is None:
            self._fit_fn = self._build_fit(x, targets.shape[1])
        loss = self._fit_fn(
            x[idx], y[idx].astype(np.int64), targets[idx].astype(np.float32),
            np.asarray(starts, np.int32), np.asarray(ends, np.int32),
        )
        weights = [v.numpy() for v in self._weights]
        return weights, {"loss": float(loss), "steps": len(starts)}


class ProximalClientUpdate(KerasClientUpdate):
    """FedProx local objective: loss + ``mu / 2 * ||w - w_global||^2`` (Li et al., MLSys 2020).

    Args:
        mu: proximal coefficient. Defaults to 0.01.
    """

    def __init__(self, mu: float = 0.01):
        if not mu >= 0:
            raise ConfigError(f"FedProx mu must be >= 0. Received: mu={mu}")
        self.mu = float(mu)

    def setup(self, model, config, build_model):
        super().setup(model, config, build_model)
        tf = self._tf
        self._anchors = [tf.Variable(tf.zeros_like(v), trainable=False) for v in model.trainable_variables]
        self._trainable_index = [
            next(i for i, w in enumerate(self._weights) if w is v) for v in model.trainable_variables
        ]

    def before_training(self, task):
        for anchor, i in zip(self._anchors, self._trainable_index):
            anchor.assign(task.weights[i])

    def compute_loss(self, y, outputs, targets):
        tf = self._tf
        loss = super().compute_loss(y, outputs, targets)
        prox = tf.add_n([tf.reduce_sum(tf.square(v - a)) for v, a in zip(self.model.trainable_variables, self._anchors)])
        return loss + 0.5 * self.mu * prox


class DistillationClientUpdate(KerasClientUpdate):
    """Local training plus knowledge distillation from neighbour models.

    The neighbours' models (sent in ``task.extras["neighbour_weights"]``) label
    the client's own examples; their softened predictions, averaged, are the
    teacher. Loss: ``(1 - kd_weight) * CE(y, s) + kd_weight * T^2 * KL(teacher_T || s_T)``
    (Hinton et al., 2015). This is the P2P-ring scenario of the seed paper.

    Args:
        temperature: softening temperature ``T``. Defaults to 2.
        kd_weight: weight of the distillation term in ``[0, 1]``. Defaults to 0.5.
    """

    def __init__(self, temperature: float = 2.0, kd_weight: float = 0.5):
        if not temperature > 0:
            raise ConfigError(f"temperature must be > 0. Received: temperature={temperature}")
        if not 0.0 <= kd_weight <= 1.0:
            raise ConfigError(f"kd_weight must be in [0, 1]. Received: kd_weight={kd_weight}")
        self.temperature = float(temperature)
        self.kd_weight = float(kd_weight)

    def setup(self, model, config, build_model):
        super().setup(model, config, build_model)
        tf = self._tf
        self._teacher = build_model()
        self._teacher_weights = list(self._teacher.weights)
        teacher = self._teacher
        self._predict = None

        def make_predict(x):
            @tf.function(input_signature=[tf.TensorSpec([None, *x.shape[1:]], tf.as_dtype(x.dtype))])
            def predict(xs):
                return teacher(xs, training=False)

            return predict

        self._make_predict = make_predict

    def _logits(self, outputs):
        tf = self._tf
        if self.from_logits:
            return tf.cast(outputs, tf.float32)
        return tf.math.log(tf.clip_by_value(tf.cast(outputs, tf.float32), 1e-7, 1.0))

    def prepare(self, task, x, y):
        neighbours = task.extras.get("neighbour_weights") or []
        if not neighbours:
            return None
        if self._predict is None:
            self._predict = self._make_predict(x)
        soft = np.zeros((x.shape[0], 0), np.float32)
        for weights in neighbours:
            for var, value in zip(self._teacher_weights, weights):
                var.assign(value)
            logits = self._logits(self._predict(x)).numpy() / self.temperature
            logits -= logits.max(axis=1, keepdims=True)
            p = np.exp(logits)
            p /= p.sum(axis=1, keepdims=True)
            soft = p if soft.shape[1] == 0 else soft + p
        return (soft / len(neighbours)).astype(np.float32)

    def compute_loss(self, y, outputs, targets):
        tf = self._tf
        ce = super().compute_loss(y, outputs, targets)
        if targets.shape[-1] == 0:  # static: no neighbours in this trace
            return ce
        t = self.temperature

        def distill():
            log_student = tf.nn.log_softmax(self._logits(outputs) / t, axis=-1)
            log_teacher = tf.math.log(tf.clip_by_value(targets, 1e-7, 1.0))
            kl = tf.reduce_sum(targets * (log_teacher - log_student), axis=-1)
            return tf.reduce_mean(kl) * t * t

        kd = tf.cond(tf.shape(targets)[-1] > 0, distill, lambda: tf.constant(0.0, tf.float32))
        return (1.0 - self.kd_weight) * ce + self.kd_weight * kd
