"""Reading the parameter servers' checkpoints outside a job: into numpy, or into a plain Keras model.

Every PS task writes its shard under ``ps.checkpoint_dir`` (see
:mod:`tfdist.ps.checkpoint`). :func:`read` joins the shards back into whole
variables (row-partitioned ones are concatenated); :func:`load_into` loads
them into a Keras model built by the same code, with no strategy and no
cluster, for serving, evaluation or fine-tuning:

```python
model = build_model()                      # the same architecture, outside any strategy scope
tfdist.checkpoint.load_into(model, "/checkpoints/ps")
model.save("digits.keras")
```

Which checkpoint: on the gradient path (BSP, SyncReplicas) the newest step
every shard holds (a consistent cut); on the update path (async, SSP,
DTSSP) each shard's newest (the shards of an asynchronous job are never at
one step; each is what its PS task held). ``step=`` picks one.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tfdist.consistency.modes import exchange_path
from tfdist.errors import TfdistError
from tfdist.ps import checkpoint as _files
from tfdist.ps.identity import CanonicalNames

__all__ = ["CheckpointInfo", "read", "load_into", "latest_steps"]

logger = logging.getLogger(__name__)

_KEY = re.compile(r"^(\d{4,})/(.+?)(?:/part_(\d+))?$")
_SHARD_DIR = re.compile(r"^ps-(\d+)$")


@dataclass
class CheckpointInfo:
    """What :func:`read` found."""

    directory: str
    num_ps: int
    path: str  # "update" or "gradient"
    steps: list[int]  # per shard
    #: Variable names (Keras paths, e.g. ``"sequential/dense/kernel"``) in the job's creation order.
    names: list[str] = field(default_factory=list)


def _num_ps(directory: str) -> int:
    found = sorted(int(m.group(1)) for m in map(_SHARD_DIR.match, _files._listdir(directory)) if m)
    if not found:
        raise TfdistError(f"No parameter-server checkpoints in {directory} (expected ps-0/, ps-1/, ...). "
                          "Is it the job's ps.checkpoint_dir?")
    return found[-1] + 1


def read(directory: str, step: int | None = None) -> tuple[CheckpointInfo, dict[str, np.ndarray]]:
    """Reads a job's PS checkpoints and joins the shards.

    Args:
        directory: The job's ``ps.checkpoint_dir``.
        step: The step to read (every shard must hold it). Defaults to the
            newest consistent cut (gradient path) or each shard's newest
            (update path).

    Returns:
        ``(info, values)``: ``values`` maps each variable's name to its
        whole array, in the job's creation order.

    Raises:
        TfdistError: no checkpoints, a shard without one, or no step every
            shard holds on the gradient path.
    """
    num_ps = _num_ps(directory)
    shards = []
    for ps in range(num_ps):
        ckpt = _files.read_shard(directory, ps, step=step, num_ps=num_ps)
        if ckpt is None:
            raise TfdistError(f"ps:{ps} has no valid checkpoint{'' if step is None else f' of step {step}'} in "
                              f"{directory}.")
        shards.append(ckpt)
    path = shards[0].meta.get("path", "update")
    if step is None and exchange_path(path).steps_are_global and len({c.step for c in shards}) > 1:
        common = _files.common_steps(directory, num_ps)
        if not common:
            raise TfdistError(f"The shards in {directory} hold no common step (newest: "
                              f"{[c.step for c in shards]}); a synchronous job's checkpoint is one step on every shard.")
        return read(directory, common[-1])
    pieces: dict[tuple[int, str], dict[int, np.ndarray]] = {}
    for ckpt in shards:
        for key, value in ckpt.values.items():
            m = _KEY.match(key)
            if not m:
                raise TfdistError(f"Unexpected variable key {key!r} in {ckpt.path}.")
            part = int(m.group(3)) if m.group(3) is not None else -1
            pieces.setdefault((int(m.group(1)), m.group(2)), {})[part] = value
    values = {}
    for (_, name), parts in sorted(pieces.items()):
        values[name] = parts[-1] if -1 in parts else np.concatenate([parts[i] for i in sorted(parts)], axis=0)
    info = CheckpointInfo(directory, num_ps, path, [c.step for c in shards], list(values))
    return info, values


def load_into(model, directory: str, step: int | None = None, include_optimizer: bool = True) -> CheckpointInfo:
    """Loads the PS checkpoints in ``directory`` into ``model`` (a plain Keras model; no strategy needed).

    Variables are matched by their Keras path (``sequential/dense/kernel``),
    then by that path with Keras's auto-name counters renumbered as the job
    names its variables (:class:`tfdist.ps.identity.CanonicalNames`: a model
    built after other objects, ``sequential_1/dense_3/...``, still matches);
    failing both, by position among the model's weights, provided the shapes
    agree one by one. On the gradient path the
    checkpoint also holds the optimizer's state: with ``include_optimizer``
    it is loaded into ``model.optimizer`` when that optimizer is built
    (``model.optimizer.build(model.trainable_variables)``).

    Args:
        model: A built Keras model with the job's architecture.
        directory: The job's ``ps.checkpoint_dir``.
        step: See :func:`read`.
        include_optimizer: Also load the optimizer's variables when present.

    Returns:
        The :class:`CheckpointInfo` of what was loaded.

    Raises:
        TfdistError: the model's weights and the checkpoint do not match
            (the message names the first differences).
    """
    info, values = read(directory, step)
    weights = list(model.weights)
    by_path = {w.path: w for w in weights}
    matched = {name: by_path[name] for name in values if name in by_path}
    names = CanonicalNames()  # fed as the job fed its own: the model's variables, then the optimizer's
    canonical = {names.canonical(w.path): w for w in weights}
    if len(matched) < len(weights):
        matched = {name: canonical[name] for name in values if name in canonical}
        if any(tuple(w.shape) != values[name].shape for name, w in matched.items()):
            matched = {}  # the same names, another model: by position, which says what differs
    if len(matched) < len(weights):
        matched = _match_by_position(weights, values, info)
    for name, var in matched.items():
        _assign(var, values[name], name)
    loaded_optimizer = 0
    optimizer = getattr(model, "optimizer", None)
    if include_optimizer and optimizer is not None and getattr(optimizer, "built", False):
        for var in optimizer.variables:
            name = var.path if var.path in values else names.canonical(var.path)
            if name in values and tuple(var.shape) == values[name].shape:
                _assign(var, values[name], name)
                loaded_optimizer += 1
    logger.info("loaded %d weights (%d optimizer variables) from %s, step(s) %s", len(matched), loaded_optimizer,
                directory, info.steps)
    return info


def _assign(var, value: np.ndarray, name: str) -> None:
    if tuple(var.shape) != value.shape:
        raise TfdistError(f"{name}: the model's variable has shape {tuple(var.shape)}, the checkpoint's "
                          f"{value.shape}. Build the model the job trained.")
    var.assign(value.astype(np.dtype(var.dtype)) if value.dtype != np.dtype(var.dtype) else value)


def _match_by_position(weights, values: dict[str, np.ndarray], info: CheckpointInfo) -> dict[str, Any]:
    """Model weights ↔ the checkpoint's model variables, in order (optimizer variables left out)."""
    optimizer_prefixes = {name.split("/", 1)[0] for name in values if _is_optimizer_name(name)}
    candidates = [n for n in values if n.split("/", 1)[0] not in optimizer_prefixes]
    shapes_model = [tuple(w.shape) for w in weights]
    shapes_ckpt = [values[n].shape for n in candidates]
    if shapes_model != shapes_ckpt:
        unmatched = [w.path for w in weights if w.path not in values][:4]
        raise TfdistError(
            f"The model's weights do not match the checkpoint in {info.directory}: e.g. {unmatched} are not in it, "
            f"and by position the shapes differ ({len(shapes_model)} weights {shapes_model[:4]}... vs "
            f"{len(shapes_ckpt)} variables {shapes_ckpt[:4]}...). Build the same model the job trained.")
    logger.warning("the model's layer names differ from the job's; weights matched by position (%d)", len(weights))
    return dict(zip(candidates, weights))


def _is_optimizer_name(name: str) -> bool:
    last = name.rsplit("/", 1)[-1]
    return last in ("iteration", "learning_rate") or last.endswith(("_momentum", "_velocity", "_accumulator"))


def latest_steps(directory: str) -> dict[int, list[int]]:
    """Steps of every shard's checkpoints, oldest first (for a look at a checkpoint directory)."""
    return {ps: _files.list_steps(directory, ps) for ps in range(_num_ps(directory))}
