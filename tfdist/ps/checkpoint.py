"""Checkpoint files of parameter-server shards: atomic writes, verified reads, the last K kept.

Layout under the job's ``ps.checkpoint_dir`` (a local path, or any URL
``tf.io.gfile`` writes, e.g. ``gs://bucket/run``; TensorFlow is imported only
for URLs)::

    <dir>/ps-<i>/ckpt-<step:012d>.data    the shard: one tfdist.wire message
    <dir>/ps-<i>/ckpt-<step:012d>.json    its manifest, written last

A checkpoint exists only once its manifest does. The data file is written
first (under a temporary name, then renamed), then the manifest the same
way; the manifest holds the data file's size and SHA-256, and a read checks
both. A write torn at any point therefore leaves either no manifest (the
checkpoint is not there) or a data file that fails the check (the reader
skips it, with a warning, and takes the previous one): a torn write is never
read. ``step`` is the shard's position in the job: the state snapshot's
global step on the gradient path, the number of applied batches on the update
path.

Each PS task writes its own directory, so tasks need no shared file system;
:func:`common_steps` finds the steps every shard has (a consistent cut of a
synchronous job).

Retention survives a full disk. After a write the newest ``keep`` are kept.
Before a write on a local path, when the free space is less than the new
checkpoint needs, the writer first deletes what the write would delete
anyway (down to ``keep - 1`` old ones), then, if that is not enough, every
older one but the newest good one (a warning says the shard now holds fewer
than ``keep``); a write that still fails for lack of space (or a URL, whose
free space is unknown) is tried once more after that pruning. The newest
checkpoint that verifies is never deleted (nor, where the other shards'
folders are visible, the newest step every shard has), so as long as the
volume holds two checkpoints a PS restart loses at most one checkpoint
interval. A volume too full for even that keeps the last good checkpoint and
each failed write says "No space left" and how much was needed.

Importing this module does not import TensorFlow.
"""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import re
import shutil
import time
import uuid
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

import numpy as np

from tfdist import wire
from tfdist.errors import TfdistError, WireFormatError

__all__ = ["CheckpointError", "ShardCheckpoint", "write_shard", "list_steps", "read_shard", "common_steps",
           "FORMAT_VERSION"]

logger = logging.getLogger(__name__)

FORMAT_VERSION = 1
_NAME = re.compile(r"^ckpt-(\d{12})\.json$")
_DATA = re.compile(r"^ckpt-(\d{12})\.data$")
#: Room a write needs beyond its data file: the manifest and the file system's own blocks.
_HEADROOM_BYTES = 64 * 1024


class CheckpointError(TfdistError):
    """A checkpoint could not be written or read (the message names the path)."""


@dataclass(frozen=True)
class ShardCheckpoint:
    """One PS shard's checkpoint, read and verified."""

    step: int
    ps: int
    num_ps: int
    meta: dict[str, Any]
    values: dict[str, np.ndarray]
    path: str
    written_at: float


# ------------------------------------------------------------------ file system
def _is_url(path: str) -> bool:
    return "://" in path


def _gfile():
    import tensorflow as tf  # only for URLs (gs://, s3://, hdfs://): a local PS stays TF-free

    return tf.io.gfile


def _join(*parts: str) -> str:
    if _is_url(parts[0]):
        return "/".join([parts[0].rstrip("/"), *parts[1:]])
    return os.path.join(*parts)


def _makedirs(path: str) -> None:
    if _is_url(path):
        _gfile().makedirs(path)
    else:
        os.makedirs(path, exist_ok=True)


def _listdir(path: str) -> list[str]:
    try:
        if _is_url(path):
            return [n.rstrip("/") for n in _gfile().listdir(path)]
        return os.listdir(path)
    except (FileNotFoundError, NotADirectoryError):
        return []
    except Exception as e:  # gfile's NotFoundError and friends
        if type(e).__name__ == "NotFoundError":
            return []
        raise


def _write_atomically(path: str, chunks: Iterable[bytes | memoryview]) -> tuple[int, str]:
    """Writes ``chunks`` to ``path`` via a temporary file and a rename; returns (size, sha256)."""
    tmp = f"{path}.tmp-{uuid.uuid4().hex[:8]}"
    digest, size = hashlib.sha256(), 0
    try:
        if _is_url(path):
            gfile = _gfile()
            with gfile.GFile(tmp, "wb") as f:
                for chunk in chunks:
                    f.write(bytes(chunk))
                    digest.update(chunk)
                    size += memoryview(chunk).nbytes
            gfile.rename(tmp, path, overwrite=True)
        else:
            with open(tmp, "wb") as f:
                for chunk in chunks:
                    f.write(chunk)
                    digest.update(chunk)
                    size += memoryview(chunk).nbytes
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
    except BaseException:
        _remove(tmp)
        raise
    return size, digest.hexdigest()


def _read(path: str) -> bytes:
    if _is_url(path):
        with _gfile().GFile(path, "rb") as f:
            return f.read()
    with open(path, "rb") as f:
        return f.read()


def _remove(path: str) -> None:
    try:
        if _is_url(path):
            _gfile().remove(path)
        else:
            os.remove(path)
    except Exception:  # already gone, or never written
        pass


# ------------------------------------------------------------------ checkpoints
def shard_dir(directory: str, ps: int) -> str:
    return _join(directory, f"ps-{ps}")


def _paths(directory: str, ps: int, step: int) -> tuple[str, str]:
    base = _join(shard_dir(directory, ps), f"ckpt-{step:012d}")
    return base + ".data", base + ".json"


def write_shard(directory: str, ps: int, num_ps: int, step: int, meta: Mapping[str, Any],
                values: Mapping[str, np.ndarray], keep: int = 3, last_good: int | None = None,
                consistent_cuts: bool = False) -> str:
    """Writes one shard's checkpoint atomically, then deletes all but the newest ``keep``.

    When the volume is short of space, older checkpoints are deleted *before*
    the write (see the module docstring); the newest good one never is.

    Args:
        directory: The job's checkpoint directory (``ps.checkpoint_dir``).
        ps: This PS task's index. num_ps: PS tasks of the job.
        step: The shard's position (see the module docstring); a later
            checkpoint of the same step replaces the earlier one.
        meta: JSON-able store state (specs, counters, clocks, membership).
        values: Variable key → array.
        keep: Checkpoints of this shard to keep (>= 1).
        last_good: A step whose checkpoint the caller knows is good (it wrote
            or restored it), so that pruning need not read it to verify it.
            ``None``: pruning verifies the newest ones itself.
        consistent_cuts: The shards checkpoint the same steps (the gradient
            path): the checkpoint pruning keeps is the newest step every shard
            holds, when their folders are visible here.

    Returns:
        The manifest's path.

    Raises:
        CheckpointError: the directory is not writable, or the volume has no
            room for the checkpoint even with only the newest good one kept
            (the message names the path, says "No space left" and the size).
    """
    data_path, manifest_path = _paths(directory, ps, step)
    try:
        chunks = wire.encode_chunks(dict(meta), values)
        need = sum(memoryview(c).nbytes for c in chunks) + _HEADROOM_BYTES
        _makedirs(shard_dir(directory, ps))
        _make_room(directory, ps, num_ps, step, need, keep, last_good, consistent_cuts)
        try:
            _write_shard_files(directory, ps, num_ps, step, chunks)
        except Exception as e:
            if not _out_of_space(e):
                raise
            # The free space was misjudged (a URL, another writer on the volume): keep only the newest good one.
            if not _make_room(directory, ps, num_ps, step, None, 1, last_good, consistent_cuts):
                raise
            logger.warning("ps:%d: the checkpoint of step %d did not fit (%s); writing it again after deleting the "
                           "older checkpoints", ps, step, e)
            _write_shard_files(directory, ps, num_ps, step, chunks)
    except (OSError, WireFormatError) as e:
        if _out_of_space(e):
            raise CheckpointError(_no_space_message(directory, ps, step, data_path, need, e)) from e
        raise CheckpointError(f"Could not write the checkpoint of ps:{ps} to {data_path}: {e}. Check that "
                              "ps.checkpoint_dir exists or can be created, and is writable by the PS task.") from e
    except Exception as e:  # gfile raises its own types
        if type(e).__module__.startswith("tensorflow"):
            if _out_of_space(e):
                raise CheckpointError(_no_space_message(directory, ps, step, data_path, need, e)) from e
            raise CheckpointError(f"Could not write the checkpoint of ps:{ps} to {data_path}: {e}") from e
        raise
    for old in list_steps(directory, ps)[:-keep]:
        _remove_checkpoint(directory, ps, old)
    return manifest_path


def _write_shard_files(directory: str, ps: int, num_ps: int, step: int,
                       chunks: list[bytes | memoryview]) -> tuple[int, str]:
    """The data file, then the manifest; a manifest that fails takes its data file with it (no orphan)."""
    data_path, manifest_path = _paths(directory, ps, step)
    size, sha = _write_atomically(data_path, chunks)
    manifest = {"format": FORMAT_VERSION, "ps": ps, "num_ps": num_ps, "step": int(step), "bytes": size,
                "sha256": sha, "written_at": time.time(), "data": os.path.basename(data_path)}
    try:
        _write_atomically(manifest_path, [json.dumps(manifest, sort_keys=True).encode("utf-8")])
    except BaseException:
        # A data file without its manifest is no checkpoint; left there it would only hold space. (Of a
        # rewrite of the same step, the old manifest no longer matches the data: it goes too.)
        _remove_checkpoint(directory, ps, step)
        raise
    return size, sha


def _remove_checkpoint(directory: str, ps: int, step: int) -> None:
    manifest_first = reversed(_paths(directory, ps, step))  # the checkpoint is gone once its manifest is
    for path in manifest_first:
        _remove(path)


def _out_of_space(e: BaseException) -> bool:
    if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):
        return True
    text = str(e)
    return "No space left" in text or "quota exceeded" in text.lower()


def _free_bytes(path: str) -> int | None:
    """Free bytes of the volume holding ``path``; ``None`` when unknown (a URL)."""
    if _is_url(path):
        return None
    try:
        return shutil.disk_usage(path).free
    except OSError:
        return None


def _no_space_message(directory: str, ps: int, step: int, data_path: str, need: int, e: BaseException) -> str:
    steps = list_steps(directory, ps)
    free = _free_bytes(shard_dir(directory, ps))
    return (f"No space left for the checkpoint of ps:{ps} at step {step} in {data_path}: it needs about "
            f"{need} bytes, {'an unknown amount' if free is None else free} are free with only the newest "
            f"checkpoint kept (step {steps[-1] if steps else None}). Received: {e}. Free space on that volume, or "
            "give ps.checkpoint_dir a larger one (it must hold two checkpoints of this shard so that a restart "
            "loses at most one checkpoint interval); training goes on meanwhile.")


def _newest_good(directory: str, ps: int, steps: list[int], last_good: int | None) -> int | None:
    """The newest of ``steps`` whose checkpoint verifies (``last_good`` is trusted without reading it)."""
    for s in reversed(steps):
        if s == last_good:
            return s
        try:
            _read_verified(directory, ps, s, None)
            return s
        except CheckpointError as e:
            logger.warning("ps:%d: checkpoint %d does not verify, so it may be deleted: %s", ps, s, e)
    return None


def _make_room(directory: str, ps: int, num_ps: int, step: int, need: int | None, keep: int,
               last_good: int | None, consistent_cuts: bool = False) -> list[int]:
    """Deletes old checkpoints of shard ``ps`` until ``need`` bytes are free; returns the steps deleted.

    Only when the volume is short of space (``need=None``: it is, the free
    space is unknown). First what the write of ``step`` would delete anyway
    (all but ``keep - 1`` old ones) and leftovers of failed writes, then, if
    still short, every old one but the newest good one. Never deleted: the
    newest checkpoint that verifies; with ``consistent_cuts``, when every
    shard's folder is visible here, the newest such one of the steps that
    every shard holds (the cut a synchronous job restarts from).
    """
    def short() -> bool:
        if need is None:
            return True
        free = _free_bytes(shard_dir(directory, ps))
        return free is not None and free < need

    if not short():
        return []
    folder = shard_dir(directory, ps)
    names = _listdir(folder)
    leftovers = [n for n in names if ".tmp-" in n]  # one writer per shard folder: a temporary is not of ours
    with_manifest = set(list_steps(directory, ps))
    leftovers += [n for n in names if (m := _DATA.match(n)) and int(m.group(1)) not in with_manifest]
    for name in leftovers:
        _remove(_join(folder, name))
    if leftovers:
        logger.info("ps:%d: removed %d leftover file(s) of failed checkpoint writes", ps, len(leftovers))
    old = [s for s in sorted(with_manifest) if s != step]
    cuts = [s for s in _common_steps_if_visible(directory, num_ps) if s in old] if consistent_cuts else []
    # A synchronous job restarts from the newest step every shard holds: that is the one to keep there.
    good = (_newest_good(directory, ps, cuts, last_good) if cuts else None) or _newest_good(directory, ps, old,
                                                                                              last_good)
    protected = {good}
    deleted: list[int] = []
    # Newer than the newest good one: failed verification, of no use to a restart; then the oldest first.
    candidates = [s for s in old if good is None or s > good] + [s for s in old if good is not None and s < good]
    allowed = max(len(old) - max(keep - 1, 0), 0)
    for beyond_keep in (False, True):
        for s in candidates:
            if not short():
                break
            if s in protected or s in deleted or (not beyond_keep and len(deleted) >= allowed):
                continue
            _remove_checkpoint(directory, ps, s)
            deleted.append(s)
        if not short():
            break
        if not beyond_keep and any(s not in protected and s not in deleted for s in candidates):
            logger.warning("ps:%d: the checkpoint volume is short of space: deleting checkpoints that "
                           "ps.checkpoint_keep=%d would keep; only the newest good one (step %s) is kept with the "
                           "new one", ps, keep, good)
    if deleted:
        logger.warning("ps:%d: deleted checkpoint(s) of step(s) %s before writing step %d: the volume of %s is "
                       "short of space", ps, deleted, step, directory)
    return deleted


def _common_steps_if_visible(directory: str, num_ps: int) -> list[int]:
    """:func:`common_steps` when every shard's folder is visible here (one file system); else []."""
    if num_ps <= 1 or not all(_listdir(shard_dir(directory, i)) for i in range(num_ps)):
        return []
    return common_steps(directory, num_ps)


def list_steps(directory: str, ps: int) -> list[int]:
    """Steps of the shard's checkpoints whose manifest exists, oldest first (not verified yet)."""
    steps = []
    for name in _listdir(shard_dir(directory, ps)):
        m = _NAME.match(name)
        if m:
            steps.append(int(m.group(1)))
    return sorted(steps)


def read_shard(directory: str, ps: int, step: int | None = None, num_ps: int | None = None
               ) -> ShardCheckpoint | None:
    """The newest verified checkpoint of shard ``ps`` (or the one of ``step``); ``None`` if there is none.

    A checkpoint that fails verification (torn, truncated, corrupted, another
    job's layout) is skipped with a warning and the previous one is tried;
    with ``step`` given, only that one is tried.

    Args:
        num_ps: When given, a checkpoint written by a job with another number
            of PS tasks is refused (its shards hold other variables).
    """
    candidates = [step] if step is not None else list(reversed(list_steps(directory, ps)))
    for s in candidates:
        try:
            return _read_verified(directory, ps, s, num_ps)
        except CheckpointError as e:
            logger.warning("ps:%d: skipping checkpoint %d: %s", ps, s, e)
    return None


def _read_verified(directory: str, ps: int, step: int, num_ps: int | None) -> ShardCheckpoint:
    data_path, manifest_path = _paths(directory, ps, step)
    try:
        manifest = json.loads(_read(manifest_path).decode("utf-8"))
        if not isinstance(manifest, dict) or manifest.get("format") != FORMAT_VERSION:
            raise CheckpointError(f"{manifest_path}: not a tfdist checkpoint manifest of format {FORMAT_VERSION}")
        if manifest.get("ps") != ps or manifest.get("step") != step:
            raise CheckpointError(f"{manifest_path}: names ps:{manifest.get('ps')} step {manifest.get('step')}")
        if num_ps is not None and manifest.get("num_ps") != num_ps:
            raise CheckpointError(
                f"{manifest_path} was written by a job with {manifest.get('num_ps')} PS task(s); this job has "
                f"{num_ps}. Use another ps.checkpoint_dir, or the same number of PS tasks.")
        data = _read(data_path)
    except (OSError, ValueError) as e:
        raise CheckpointError(f"cannot read {manifest_path} or its data: {e}") from e
    if len(data) != manifest.get("bytes") or hashlib.sha256(data).hexdigest() != manifest.get("sha256"):
        raise CheckpointError(f"{data_path} does not match its manifest (torn or corrupted write)")
    try:
        meta, values = wire.decode(data)
    except WireFormatError as e:
        raise CheckpointError(f"{data_path}: {e}") from e
    return ShardCheckpoint(step, ps, int(manifest["num_ps"]), meta,
                           {k: np.array(v, copy=True) for k, v in values.items()},
                           manifest_path, float(manifest.get("written_at", 0.0)))


def common_steps(directory: str, num_ps: int) -> list[int]:
    """Steps for which every one of ``num_ps`` shards has a checkpoint (a consistent cut), oldest first."""
    steps: set[int] | None = None
    for ps in range(num_ps):
        mine = set(list_steps(directory, ps))
        steps = mine if steps is None else steps & mine
    return sorted(steps or ())


# ------------------------------------------------------------------ the writer of one PS task

