"""``tfdist.strategies._worker_files``: the stock callbacks' files on a worker that is not the chief (issue #25)."""

import json
import os

import keras
import numpy as np
import pytest

from tfdist.strategies import _worker_files


class _FakeStrategy:
    """Stands for a tfdist strategy (the module check) on worker ``worker_id``."""

    def __init__(self, worker_id):
        self.worker_id = worker_id
        self.is_chief = worker_id == 0


_FakeStrategy.__module__ = "tfdist.strategies.fake"


def _model(worker_id):
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile("sgd", "mse")
    model._distribute_strategy = _FakeStrategy(worker_id)
    return model


@pytest.fixture(autouse=True)
def _installed():
    _worker_files.install()


def _callbacks(tmp_path):
    return [keras.callbacks.ModelCheckpoint(str(tmp_path / "best.keras")),
            keras.callbacks.CSVLogger(str(tmp_path / "log.csv")),
            keras.callbacks.TensorBoard(str(tmp_path / "tb"), write_graph=False),
            keras.callbacks.BackupAndRestore(str(tmp_path / "backup"))]


def test_a_worker_that_is_not_the_chief_writes_to_a_temporary_directory_removed_after_fit(tmp_path):
    cbs = _callbacks(tmp_path)
    cb_list = keras.callbacks.CallbackList(cbs, model=_model(1))
    cb_list.on_train_begin()
    paths = [cbs[0].filepath, cbs[1].filename, cbs[2].log_dir, cbs[3].backup_dir, cbs[3]._weights_path]
    assert all(not p.startswith(str(tmp_path)) for p in paths), paths
    assert cbs[3]._weights_path == os.path.join(cbs[3].backup_dir, "latest.weights.h5")
    temps = [os.path.dirname(p) for p in paths[:2]]
    assert all(os.path.isdir(t) for t in temps)
    cb_list.on_train_end()
    assert [cbs[0].filepath, cbs[1].filename, cbs[2].log_dir, cbs[3].backup_dir] == [
        str(tmp_path / "best.keras"), str(tmp_path / "log.csv"), str(tmp_path / "tb"), str(tmp_path / "backup")]
    assert not any(os.path.exists(t) for t in temps)
    assert os.listdir(tmp_path) == []  # nothing at the shared paths


def test_the_chief_writes_the_paths_it_was_given(tmp_path):
    cbs = _callbacks(tmp_path)
    cb_list = keras.callbacks.CallbackList(cbs, model=_model(0))
    cb_list.on_train_begin()
    assert cbs[0].filepath == str(tmp_path / "best.keras") and cbs[1].filename == str(tmp_path / "log.csv")
    cb_list.on_train_end()
    assert os.path.exists(tmp_path / "log.csv")


def test_backup_and_restore_restores_every_worker_from_the_chiefs_backup(tmp_path):
    chief, other = _model(0), _model(1)
    _write_chief_backup(chief, tmp_path / "backup")
    _before_this_process(tmp_path / "backup")  # a backup of the job this worker resumes
    backup = keras.callbacks.BackupAndRestore(str(tmp_path / "backup"))
    cb_list = keras.callbacks.CallbackList([backup], model=other)
    cb_list.on_train_begin()
    assert other._initial_epoch == 2 and np.all(other.get_weights()[0] == 3.0)
    assert not backup.backup_dir.startswith(str(tmp_path))  # its own backups go elsewhere
    cb_list.on_train_end()
    assert os.path.exists(tmp_path / "backup" / "latest.weights.h5")  # the chief's backup is the chief's to delete


def _write_chief_backup(chief, directory):
    """The chief's BackupAndRestore files after epoch 2, its kernel all 3.0."""
    chief.set_weights([np.full((2, 1), 3.0, "float32"), np.zeros(1, "float32")])
    os.makedirs(directory)
    chief.save_weights(str(directory / "latest.weights.h5"))
    with open(directory / "training_metadata.json", "w") as f:
        json.dump({"epoch": 2}, f)


def _before_this_process(directory, seconds=60.0):
    when = _worker_files._process_start_time() - seconds
    for name in os.listdir(directory):
        os.utime(directory / name, (when, when))


def test_the_backup_of_a_run_that_ended_just_before_this_process_started_is_restored(tmp_path):
    """A job started again at once (its tasks forked in a second): the backup its last run wrote 0.3 s before this
    worker started is the one it resumes from (the chief restores it too). A margin of a second took it for the
    chief's backup of this run, and the worker trained from epoch 0 while the chief resumed."""
    chief, other = _model(0), _model(1)
    _write_chief_backup(chief, tmp_path / "backup")
    _before_this_process(tmp_path / "backup", seconds=0.3)
    backup = keras.callbacks.BackupAndRestore(str(tmp_path / "backup"))
    cb_list = keras.callbacks.CallbackList([backup], model=other)
    cb_list.on_train_begin()
    assert other._initial_epoch == 2 and np.all(other.get_weights()[0] == 3.0)
    cb_list.on_train_end()


def test_a_backup_the_chief_wrote_while_this_worker_ran_is_not_restored(tmp_path):
    """Asynchronous workers drift apart: the chief's backup of the fit it is running is not this worker's start."""
    chief, other = _model(0), _model(1)
    before = [w.copy() for w in other.get_weights()]
    _write_chief_backup(chief, tmp_path / "backup")
    backup = keras.callbacks.BackupAndRestore(str(tmp_path / "backup"))
    cb_list = keras.callbacks.CallbackList([backup], model=other)
    cb_list.on_train_begin()
    assert getattr(other, "_initial_epoch", 0) in (0, None)
    assert all(np.array_equal(a, b) for a, b in zip(other.get_weights(), before))
    assert not backup.backup_dir.startswith(str(tmp_path))  # and its own backups go elsewhere
    cb_list.on_train_end()
    assert backup.backup_dir == str(tmp_path / "backup")
    assert sorted(os.listdir(tmp_path / "backup")) == ["latest.weights.h5", "training_metadata.json"]


def test_the_process_start_time_is_this_process(tmp_path):
    import time
    start = _worker_files._process_start_time()
    assert _worker_files._IMPORTED - 3600 <= start <= _worker_files._IMPORTED + 1 <= time.time() + 1, start
    # to a few clock ticks: a process started now says it started between before and after (not a second early)
    read, write = os.pipe()
    before = time.time()
    pid = os.fork()
    if pid == 0:  # the child: only reads /proc and the clocks, then leaves without any clean-up
        os.write(write, f"{_worker_files._process_start_time()} {time.time()}".encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as f:
        child_start, child_now = (float(v) for v in f.read().split())
    os.waitpid(pid, 0)
    assert before - 0.03 <= child_start <= child_now, (before, child_start, child_now)


def test_model_save_writes_a_temporary_file_and_renames_it(tmp_path, monkeypatch):
    model = _model(1)
    seen = []
    real_replace = os.replace
    monkeypatch.setattr(os, "replace", lambda a, b: seen.append(os.path.basename(a)) or real_replace(a, b))
    model.save(str(tmp_path / "m.keras"))
    model.save_weights(str(tmp_path / "m.weights.h5"))
    assert sorted(os.listdir(tmp_path)) == ["m.keras", "m.weights.h5"]
    assert seen[0].startswith(".m.tfdist-w1-") and seen[0].endswith(".keras"), seen
    assert seen[1].endswith(".weights.h5"), seen
    keras.models.load_model(str(tmp_path / "m.keras"))  # a whole file
