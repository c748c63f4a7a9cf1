"""Building the user's model in the main process and again in every worker."""

from __future__ import annotations

import logging
import pickle
from typing import Any, Callable

import numpy as np

from tfdist.errors import ConfigError

logger = logging.getLogger(__name__)

__all__ = ["ModelSpec", "evaluate_weights", "limit_tf_threads"]


def limit_tf_threads(threads: int = 1) -> None:
    """Caps TF's thread pools (call before TF runs its first op)."""
    import tensorflow as tf

    try:
        tf.config.threading.set_intra_op_parallelism_threads(threads)
        tf.config.threading.set_inter_op_parallelism_threads(threads)
    except RuntimeError:  # TF already initialised in this process
        logger.debug("TF threading already initialised; thread limits not applied")


class ModelSpec:
    """A picklable recipe for the user's model that works in spawned processes.

    By default the model is shipped as its Keras config (so a ``model_fn``
    defined in a notebook works); if the config does not round-trip (custom
    layers not registered), ``model_fn`` itself is pickled, which needs it to
    be importable (defined at module level of a module).

    Args:
        model_fn: returns a built Keras model.
        transport: ``"auto"``, ``"config"`` or ``"function"``. Defaults to ``"auto"``.
    """

    def __init__(self, model_fn: Callable[[], Any], transport: str = "auto"):
        import keras

        if transport not in ("auto", "config", "function"):
            raise ConfigError(f"model transport must be auto, config or function. Received: transport={transport!r}")
        model = model_fn()
        if not isinstance(model, keras.Model):
            raise ConfigError(
                f"model_fn must return a keras.Model. Received: {type(model).__name__}. "
                "Return e.g. keras.Sequential([keras.Input((64,)), keras.layers.Dense(10)])."
            )
        if not model.weights:
            raise ConfigError(
                "model_fn returned a model with no weights (not built). "
                f"Received: model={model.name!r}. Start it with keras.Input(shape) so it is built."
            )
        self.initial_weights = [np.asarray(w) for w in model.get_weights()]
        self.num_outputs = int(model.outputs[0].shape[-1]) if getattr(model, "outputs", None) else None
        self._config = None
        self._fn = None
        if transport in ("auto", "config"):
            try:
                config = keras.saving.serialize_keras_object(model)
                rebuilt = keras.saving.deserialize_keras_object(config)
                if [tuple(w.shape) for w in rebuilt.weights] != [w.shape for w in self.initial_weights]:
                    raise ValueError("rebuilt model has different weight shapes")
                pickle.dumps(config)
                self._config = config
            except Exception as e:  # noqa: BLE001 - any failure means: ship the function
                if transport == "config":
                    raise ConfigError(f"The model's Keras config does not round-trip: {e}. Use transport='function'.") from e
                logger.info("Model config does not round-trip (%s); shipping model_fn instead", e)
        if self._config is None:
            try:
                pickle.dumps(model_fn)
            except Exception as e:
                raise ConfigError(
                    f"model_fn cannot be sent to worker processes: {e}. Received: model_fn={model_fn!r}. "
                    "Define it at module level of an importable module, or use standard Keras layers."
                ) from e
            self._fn = model_fn

    @property
    def transport(self) -> str:
        return "config" if self._config is not None else "function"

    def build(self) -> Any:
        """Builds a fresh model (in whatever process calls it)."""
        if self._config is not None:
            import keras

            return keras.saving.deserialize_keras_object(self._config)
        return self._fn()


def evaluate_weights(predict, model_weights_vars, weights, x, y, from_logits: bool) -> dict:
    """Accuracy and cross-entropy of ``weights`` on ``(x, y)`` with a compiled ``predict``."""
    for var, value in zip(model_weights_vars, weights):
        var.assign(value)
    out = np.asarray(predict(x), dtype=np.float64)
    if from_logits:
        out = out - out.max(axis=1, keepdims=True)
        log_p = out - np.log(np.exp(out).sum(axis=1, keepdims=True))
    else:
        log_p = np.log(np.clip(out, 1e-7, 1.0))
    accuracy = float(np.mean(np.argmax(out, axis=1) == y))
    loss = float(-np.mean(log_p[np.arange(len(y)), y]))
    return {"accuracy": accuracy, "loss": loss}
