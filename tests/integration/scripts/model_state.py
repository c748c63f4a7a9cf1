"""A digest of a model's training state, for the integration test scripts (workers compare them)."""

import hashlib

import numpy as np


def state_hash(model) -> str:
    """SHA-1 of the trainable weights and the optimizer's variables, in order."""
    h = hashlib.sha1()
    for v in list(model.trainable_weights) + list(model.optimizer.variables):
        h.update(np.ascontiguousarray(v.numpy()).tobytes())
    return h.hexdigest()
