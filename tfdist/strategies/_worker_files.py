"""The stock Keras callbacks and ``model.save``, safe when every worker of a job runs them (issue #25).

Every worker runs the whole script, so a script written from TensorFlow's
tutorials gives ``ModelCheckpoint``, ``BackupAndRestore``, ``TensorBoard`` and
``CSVLogger`` the same path on every worker. tf-keras sent a non-chief
worker's files to a temporary directory (``distributed_file_utils``); Keras 3
does not, and two workers writing one HDF5 or ``.keras`` file collide (h5py's
``BlockingIOError``) or leave it corrupt (``BadZipFile``). Under a tfdist
strategy, on a worker that is not the chief (:attr:`is_chief` is False):

* ``ModelCheckpoint``, ``TensorBoard`` and ``CSVLogger`` write under a
  temporary directory of this worker (from ``set_model``, before they open
  anything), removed at the end of ``fit``: the chief's files are the job's;
* ``BackupAndRestore`` restores from the chief's backup (so every worker
  resumes from the same epoch and weights) and writes its own backups to a
  temporary directory removed at the end of ``fit`` (the chief's backup is
  deleted by the chief alone). Only a backup older than this process is
  restored: one the chief wrote while this worker ran belongs to a ``fit``
  the chief is running (asynchronous workers drift apart), not to a job this
  worker resumes, and restoring it would skip this worker's epochs;
* and on every worker ``model.save``/``save_weights`` write a temporary file
  beside the target and rename it into place, so a reader never sees a
  half-written file and two workers saving one path never collide.

The callbacks' own paths are restored after ``fit``. :func:`install` wraps
Keras's ``CallbackList`` and ``Model`` once; the strategies call it.
"""

from __future__ import annotations

import atexit
import logging
import os
import shutil
import tempfile
import threading
import time

import keras

__all__ = ["install", "worker_temp_root"]

logger = logging.getLogger(__name__)

#: (callback class, attribute, "file" or "dir") of the callbacks that only write.
_WRITERS = (
    (keras.callbacks.ModelCheckpoint, "filepath", "file"),
    (keras.callbacks.CSVLogger, "filename", "file"),
    (keras.callbacks.TensorBoard, "log_dir", "dir"),
)
_BACKUP_ATTRS = ("backup_dir", "_weights_path", "_training_metadata_path", "_prev_weights_path",
                 "_prev_training_metadata_path")
_ORIGINAL = "_tfdist_original_paths"
_TEMP = "_tfdist_temp_dir"

_installed = False
_lock = threading.Lock()
_root: str | None = None


def worker_temp_root(worker: int) -> str:
    """This process's temporary directory for a non-chief worker's files (removed at exit)."""
    global _root
    with _lock:
        if _root is None or not os.path.isdir(_root):
            _root = tempfile.mkdtemp(prefix=f"tfdist-worker{worker}-")
            atexit.register(shutil.rmtree, _root, True)
        return _root


def _tfdist_strategy(model):
    strategy = getattr(model, "_distribute_strategy", None)
    if strategy is None or not type(strategy).__module__.startswith("tfdist.") or not hasattr(strategy, "is_chief"):
        return None
    return strategy


def _non_chief_worker(model) -> int | None:
    """This worker's id when ``model`` trains under a tfdist strategy on a task that is not the chief."""
    strategy = _tfdist_strategy(model)
    if strategy is None or strategy.is_chief:
        return None
    return int(getattr(strategy, "worker_id", -1))


def _redirect(callback, attrs: dict[str, str], worker: int) -> None:
    """Points ``attrs`` (attribute -> "file"/"dir") of ``callback`` under a fresh temporary directory."""
    if getattr(callback, _ORIGINAL, None) is not None:
        return
    temp = tempfile.mkdtemp(prefix=f"{type(callback).__name__}-", dir=worker_temp_root(worker))
    original = {name: getattr(callback, name) for name in attrs}
    for name, kind in attrs.items():
        value = str(original[name])
        base = os.path.basename(value.rstrip("/\\")) or ("logs" if kind == "dir" else "file")
        setattr(callback, name, os.path.join(temp, base))
    setattr(callback, _ORIGINAL, original)
    setattr(callback, _TEMP, temp)
    logger.info("worker %d is not the chief: %s writes under %s instead of %s (removed after fit)", worker,
                type(callback).__name__, temp, sorted(set(map(str, original.values()))))


def _restore(callback) -> None:
    """Undoes :func:`_redirect` and removes the callback's temporary directory."""
    original = getattr(callback, _ORIGINAL, None)
    if original is None:
        return
    for name, value in original.items():
        setattr(callback, name, value)
    shutil.rmtree(getattr(callback, _TEMP), ignore_errors=True)
    setattr(callback, _ORIGINAL, None)


def _backup_attrs(callback) -> dict[str, str]:
    # BackupAndRestore keeps its files in backup_dir; the others are paths of files under it.
    rel = {}
    for name in _BACKUP_ATTRS:
        if hasattr(callback, name):
            rel[name] = "dir" if name == "backup_dir" else "file"
    return rel


def _redirect_backup(callback, worker: int) -> None:
    """BackupAndRestore after it restored from the chief's backup: its writes go to a temporary directory."""
    if getattr(callback, _ORIGINAL, None) is not None:
        return
    temp = tempfile.mkdtemp(prefix="BackupAndRestore-", dir=worker_temp_root(worker))
    original = {name: getattr(callback, name) for name in _backup_attrs(callback)}
    backup_dir = os.path.join(temp, "backup")
    for name, value in original.items():
        if name == "backup_dir":
            setattr(callback, name, backup_dir)
        else:  # a file of the chief's backup directory: the same name in ours
            setattr(callback, name, os.path.join(backup_dir, os.path.relpath(str(value), str(original["backup_dir"]))))
    setattr(callback, _ORIGINAL, original)
    setattr(callback, _TEMP, temp)


def _process_start_time() -> float:
    """When this process started, in ``time.time()`` seconds (a forked child's own start, not its parent's).

    ``/proc/self/stat`` gives the start in clock ticks after boot (10 ms); the boot's own time is this clock
    less the time since boot (``CLOCK_BOOTTIME``, which the kernel counts the start from), not ``/proc/stat``'s
    ``btime`` (whole seconds, which put the start up to a second early).
    """
    try:
        with open("/proc/self/stat") as f:
            ticks = int(f.read().rsplit(")", 1)[1].split()[19])  # field 22: start time, clock ticks after boot
        boot = time.time() - time.clock_gettime(time.CLOCK_BOOTTIME)
        return boot + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, AttributeError):
        return _IMPORTED


_IMPORTED = time.time()
#: How much earlier than its computed start a file counts as written while this process ran (2 clock ticks).
START_MARGIN_S = 0.02


def _written_while_running(callback) -> bool:
    """Whether the chief's backup at ``callback``'s paths was written after this process started."""
    paths = [getattr(callback, name, None) for name in ("_weights_path", "_training_metadata_path")]
    # the start is known to a clock tick (10 ms): a backup from the ticks around it is out of doubt taken as
    # written while this process ran (not restored). A wider margin took the backup of the run before, written
    # a second before this run's worker started (a quick relaunch), for the chief's: that worker then
    # started from epoch 0 while the chief resumed (a synchronous job waits for it until its calls time out).
    start = _process_start_time() - START_MARGIN_S
    try:
        return any(os.path.getmtime(p) >= start for p in paths if p and os.path.exists(p))
    except OSError:  # removed meanwhile (the chief's fit ended): nothing to restore
        return True


def _callbacks(callback_list):
    return list(getattr(callback_list, "callbacks", []) or [])


def install() -> None:
    """Wraps ``CallbackList.set_model``/``on_train_begin``/``on_train_end`` and ``Model.save``/``save_weights`` once."""
    global _installed
    with _lock:
        if _installed:
            return
        _installed = True
    cls = keras.callbacks.CallbackList
    set_model, on_train_begin, on_train_end = cls.set_model, cls.on_train_begin, cls.on_train_end

    def wrapped_set_model(self, model):
        worker = _non_chief_worker(model)
        if worker is not None:
            for cb in _callbacks(self):
                for kind, attr, what in _WRITERS:
                    if isinstance(cb, kind):
                        _redirect(cb, {attr: what}, worker)
        return set_model(self, model)

    def wrapped_on_train_begin(self, logs=None):
        model = getattr(self, "model", None)
        worker = _non_chief_worker(model) if model is not None else None
        backups = [cb for cb in _callbacks(self) if isinstance(cb, keras.callbacks.BackupAndRestore)]
        if worker is not None:
            for cb in backups:  # restore from the chief's backup, if it predates this process
                _restore(cb)
                if _written_while_running(cb):
                    logger.info("worker %d is not the chief: the backup in %s was written while this worker ran "
                                "(the chief's fit going on), not restored", worker, cb.backup_dir)
                    _redirect_backup(cb, worker)  # reads (nothing) and writes its own temporary directory
        result = on_train_begin(self, logs)
        if worker is not None:
            for cb in backups:
                _redirect_backup(cb, worker)
        return result

    def wrapped_on_train_end(self, logs=None):
        try:
            return on_train_end(self, logs)
        finally:
            for cb in _callbacks(self):
                _restore(cb)

    cls.set_model, cls.on_train_begin, cls.on_train_end = wrapped_set_model, wrapped_on_train_begin, \
        wrapped_on_train_end

    save, save_weights = keras.Model.save, keras.Model.save_weights

    def atomic(original):
        def write(self, filepath, overwrite=True, *args, **kwargs):
            strategy = _tfdist_strategy(self)
            path = os.fspath(filepath) if isinstance(filepath, (str, os.PathLike)) else None
            if strategy is None or path is None or "://" in path or not overwrite or kwargs.get("max_shard_size"):
                return original(self, filepath, overwrite, *args, **kwargs)
            return _write_then_rename(lambda tmp: original(self, tmp, overwrite, *args, **kwargs), path,
                                      getattr(strategy, "worker_id", 0))

        write.__name__, write.__doc__ = original.__name__, original.__doc__
        return write

    keras.Model.save, keras.Model.save_weights = atomic(save), atomic(save_weights)


def _write_then_rename(write, path: str, worker: int):
    """``write(tmp)`` to a temporary name beside ``path`` (same suffix: Keras checks it), then renames it over ``path``."""
    directory, base = os.path.split(os.path.abspath(path))
    suffix = next((s for s in (".weights.h5", ".keras", ".h5") if base.endswith(s)), "")
    if not suffix or not os.path.isdir(directory):  # Keras's own error (or a sharded save) for anything else
        return write(path)
    tmp = os.path.join(directory, f".{base[:-len(suffix)]}.tfdist-w{worker}-{os.getpid()}{suffix}")
    try:
        result = write(tmp)
        os.replace(tmp, path)
        return result
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
