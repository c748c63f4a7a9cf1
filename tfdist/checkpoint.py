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

Dynamic tables (``tfdist.layers.DynamicEmbedding``) are exported by id:
:func:`export_table` writes the whole table, or only the rows created,
changed or evicted since an earlier export (a delta); :func:`read_export`
gives the table an export stands for; :func:`serving_model` turns a model
into a plain Keras one whose dynamic tables are static lookups
(``keras.layers.IntegerLookup`` + ``keras.layers.Embedding``):

```python
tfdist.checkpoint.export_table("/checkpoints/ps", "user_emb", "/exports/user-0.npz")
tfdist.checkpoint.export_table("/checkpoints/ps", "user_emb", "/exports/user-1.npz", since="/exports/user-0.npz")
model = build_model()                      # outside any strategy: its DynamicEmbedding reads default values
tfdist.checkpoint.load_into(model, "/checkpoints/ps")          # the dense weights
serving = tfdist.checkpoint.serving_model(model, {"user_emb": "/exports/user-1.npz"})
serving.save("serving.keras")              # loads in plain Keras, no tfdist needed
```
"""

from __future__ import annotations

import json
import logging
import os
import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tfdist.consistency.modes import exchange_path
from tfdist.errors import TfdistError
from tfdist.ps import checkpoint as _files
from tfdist.ps.identity import CanonicalNames

__all__ = ["CheckpointInfo", "TableExport", "export_table", "latest_steps", "load_into", "read", "read_export",
           "serving_model"]

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
    num_ps, path, shards = _read_shards(directory, step)
    pieces: dict[tuple[int, str], dict[int, np.ndarray]] = {}
    for ckpt in shards:
        for key, value in ckpt.values.items():
            if key.startswith("table/"):  # PS-resident tables: by id (export_table), not as variables
                continue
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


def _read_shards(directory: str, step: int | None):
    """(num_ps, path, every shard's checkpoint): the step asked for, else as :func:`read` says."""
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
        return _read_shards(directory, common[-1])
    return num_ps, path, shards


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


# ------------------------------------------------------------------ dynamic tables: export, delta, serving
_EXPORT_FORMAT = "tfdist-table-export/1"


@dataclass
class TableExport:
    """A dynamic table as an export stands for it: ids (sorted), their rows, and what the file holds."""

    table: str  # the table's key on the PS (``t000/<layer name>``)
    ids: np.ndarray
    values: np.ndarray
    default_value: float
    kind: str  # "full" or "delta"
    steps: list[int]  # the checkpoint step of every shard exported
    #: A delta's own content: the rows it sets and the ids it removes (a full export: every row, none).
    upserts: int = 0
    deleted: int = 0


def _table_rows(directory: str, table: str, step: int | None) -> tuple[str, dict, np.ndarray, np.ndarray, list]:
    """(key, spec, ids, values) of dynamic table ``table`` (its layer name or key) joined from every shard."""
    _, _, shards = _read_shards(directory, step)
    specs = {d["key"]: d for d in shards[0].meta.get("tables") or [] if d.get("dynamic") is not None}
    matches = [k for k in specs if k == table or k.split("/", 1)[-1] == table]
    if len(matches) != 1:
        raise TfdistError(f"No single dynamic table {table!r} in the checkpoints in {directory}; they hold "
                          f"{sorted(specs) or 'none'} (give the layer's name or the key).")
    key = matches[0]
    ids = np.concatenate([np.asarray(c.values[f"table/{key}/ids"], np.int64) for c in shards])
    values = np.concatenate([np.asarray(c.values[f"table/{key}/values"], np.float32) for c in shards])
    order = np.argsort(ids, kind="stable")
    return key, specs[key], ids[order], values[order], [c.step for c in shards]


def export_table(directory: str, table: str, path: str, since: str | None = None,
                 step: int | None = None) -> TableExport:
    """Exports dynamic table ``table`` from the PS checkpoints in ``directory`` to ``path`` (a ``.npz`` file).

    The file holds ``ids`` (int64), ``values`` (float32, one row per id)
    and ``deleted`` (int64), and a ``meta`` JSON string. A full export
    (``since=None``) holds every row and deletes nothing. A delta
    (``since`` an earlier export, full or delta) holds only the rows
    created or changed since then and the ids evicted since then: applied
    to the table ``since`` stands for (:func:`read_export`), it gives this
    checkpoint's table. A serving system applies it by removing
    ``deleted`` and setting ``ids`` to ``values``.

    Args:
        directory: The job's ``ps.checkpoint_dir``.
        table: The ``DynamicEmbedding``'s name, or its key.
        path: Where to write the export (written whole, then renamed).
        since: An earlier export of the same table: write a delta from it.
        step: As for :func:`read`.

    Returns:
        The :class:`TableExport` the file stands for (the whole table).
    """
    key, spec, ids, values, steps = _table_rows(directory, table, step)
    meta = {"format": _EXPORT_FORMAT, "table": key, "dim": spec["dim"], "steps": steps, "rows": len(ids),
            "default_value": float(spec["dynamic"].get("default_value", 0.0))}
    if since is None:
        meta.update(kind="full", since=None)
        up_ids, up_values, deleted = ids, values, np.zeros(0, np.int64)
    else:
        base = read_export(since)
        if base.table != key:
            raise TfdistError(f"{since} exports table {base.table!r}, not {key!r}.")
        pos = np.minimum(np.searchsorted(base.ids, ids), max(len(base.ids) - 1, 0))
        known = (base.ids[pos] == ids) if len(base.ids) else np.zeros(len(ids), bool)
        same = known.copy()
        same[known] = (base.values[pos[known]].view(np.int32) == values[known].view(np.int32)).all(axis=1)
        up_ids, up_values = ids[~same], values[~same]
        deleted = base.ids[~np.isin(base.ids, ids)]
        meta.update(kind="delta", since=os.path.abspath(since))
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "wb") as f:
        np.savez(f, ids=up_ids, values=up_values, deleted=deleted, meta=np.array(json.dumps(meta)))
    os.replace(tmp, path)
    logger.info("exported %s table %s (%d rows; %d set, %d deleted) to %s", meta["kind"], key, len(ids),
                len(up_ids), len(deleted), path)
    return TableExport(key, ids, values, meta["default_value"], meta["kind"], steps, len(up_ids), len(deleted))


def read_export(path: str) -> TableExport:
    """The whole table an export stands for (a delta: applied to the table of the export it was made from)."""
    chain = []
    while path is not None:
        with np.load(path, allow_pickle=False) as f:
            meta = json.loads(str(f["meta"]))
            if meta.get("format") != _EXPORT_FORMAT:
                raise TfdistError(f"{path} is not a tfdist table export (format {meta.get('format')!r}).")
            chain.append((meta, f["ids"], f["values"], f["deleted"]))
        path = meta.get("since")
        if len(chain) > 10_000:
            raise TfdistError("A chain of more than 10,000 table exports: is one its own base?")
    meta, ids, values, _ = chain[-1]
    for d_meta, d_ids, d_values, d_deleted in reversed(chain[:-1]):  # oldest delta first
        if d_meta["table"] != meta["table"]:
            raise TfdistError(f"A delta of table {d_meta['table']!r} follows an export of {meta['table']!r}.")
        keep = ~np.isin(ids, d_deleted) & ~np.isin(ids, d_ids)
        ids, values = np.concatenate([ids[keep], d_ids]), np.concatenate([values[keep], d_values])
        order = np.argsort(ids, kind="stable")
        ids, values = ids[order], values[order]
    top = chain[0][0]
    return TableExport(top["table"], ids, values, top["default_value"], top["kind"], top["steps"],
                       len(chain[0][1]), len(chain[0][3]))


def serving_model(model, exports):
    """A plain Keras copy of ``model`` whose ``DynamicEmbedding`` layers are static lookups of exported tables.

    Each dynamic layer becomes ``keras.Sequential([IntegerLookup, Embedding])``
    (with ``keras.layers.Hashing(num_bins=2**63 - 1)`` first for string
    inputs, the same hash as ``tfdist.layers.hash_strings``): an exported id
    reads its row, any other id the table's ``default_value`` (in training an
    id never trained reads its initial row instead). Every other layer is
    ``model``'s own (shared, with its weights: load them first, e.g. with
    :func:`load_into`). The result saves and loads with Keras alone.

    Args:
        model: A functional or sequential Keras model with the job's architecture.
        exports: ``{layer name: export path or TableExport}``, or one path/export when the model
            has a single dynamic layer.
    """
    import keras

    dynamic = [layer for layer in model._flatten_layers() if getattr(layer, "_tfdist_dynamic_table", False)]
    if not isinstance(exports, dict):
        if len(dynamic) != 1:
            raise TfdistError(f"The model has {len(dynamic)} DynamicEmbedding layers; give exports as "
                              "{layer name: export}.")
        exports = {dynamic[0].name: exports}
    missing = sorted({layer.name for layer in dynamic} - set(exports))
    if missing:
        raise TfdistError(f"No export given for the DynamicEmbedding layer(s) {missing}.")

    def replace(layer):
        if not getattr(layer, "_tfdist_dynamic_table", False):
            return layer
        export = exports[layer.name]
        export = read_export(export) if isinstance(export, str) else export
        if export.values.shape[1:] != (layer.output_dim,):
            raise TfdistError(f"Layer {layer.name!r} is {layer.output_dim} wide; its export's rows are "
                              f"{export.values.shape[1:]}.")
        oov = _free_id(export.ids)
        steps = [keras.layers.IntegerLookup(vocabulary=export.ids, num_oov_indices=1, oov_token=oov,
                                            vocabulary_dtype="int64", name=f"{layer.name}_ids")]
        if layer.string_inputs:
            steps.insert(0, keras.layers.Hashing(num_bins=2**63 - 1, name=f"{layer.name}_hash"))
        table = keras.layers.Embedding(len(export.ids) + 1, layer.output_dim, name=f"{layer.name}_rows")
        steps.append(table)
        lookup = keras.Sequential(steps, name=layer.name)
        table.build((None,))
        table.embeddings.assign(np.concatenate([np.full((1, layer.output_dim), export.default_value, np.float32),
                                                export.values]))
        return lookup

    return keras.models.clone_model(model, clone_function=replace)


def _free_id(ids: np.ndarray) -> int:
    """An int64 that is not one of ``ids`` (IntegerLookup's out-of-vocabulary token)."""
    for candidate in (-1, 0, -(2**63)):
        if not np.isin(candidate, ids):
            return candidate
    gaps = np.flatnonzero(ids[1:] != ids[:-1] + 1)  # sorted; -1, 0 and the smallest int64 are taken: no wrap
    return int(ids[gaps[0]] + 1)
