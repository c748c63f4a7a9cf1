"""PS checkpoint retention on a full disk: prune before writing, never the last good one, recover when space returns.

A real small file system (a tmpfs of a few hundred KiB, mounted by the
``small_tmpfs`` fixture; root only, skipped elsewhere) so that ``ENOSPC``
comes from the kernel, not from a mock. The same with a real PS process:
``tests/integration/test_checkpoint_full_disk.py``.
"""

import errno
import os

import numpy as np
import pytest

from tfdist.ps import checkpoint as ckpt
from tfdist.ps.checkpointer import ShardCheckpointer


KIB = 1024
#: One shard's data file: ~300 KiB (a tmpfs of 1 MiB holds three of them with their headroom, not four).
SHARD = 300 * KIB


def shard(step, nbytes=SHARD):
    return {"w": np.full(nbytes // 4, step, np.float32)}


def write(d, step, keep=3, nbytes=SHARD, **kwargs):
    return ckpt.write_shard(str(d), 0, 1, step, {"step": step}, shard(step, nbytes), keep=keep, **kwargs)


def fill(d, leave_free):
    """A file that takes all but ``leave_free`` bytes of the volume of ``d`` (what else fills a real disk)."""
    path = os.path.join(str(d), "filler")
    with open(path, "ab") as f:
        f.write(b"\0" * max(ckpt._free_bytes(str(d)) - leave_free, 0))
    return path


def files(d):
    folder = ckpt.shard_dir(str(d), 0)
    return sorted(os.listdir(folder)) if os.path.isdir(folder) else []


def newest(d):
    got = ckpt.read_shard(str(d), 0)
    return None if got is None else (got.step, float(got.values["w"][0]))


def test_a_disk_that_holds_fewer_than_keep_keeps_checkpointing(small_tmpfs):
    """keep=3 on a volume with room for 3 data files but not 3 plus a new one: each write prunes first."""
    d = small_tmpfs(1024 * KIB)
    for step in range(1, 9):
        write(d, step)
        assert newest(d) == (step, step)
        assert ckpt.list_steps(str(d), 0)[-1] == step
    assert ckpt.list_steps(str(d), 0) == [6, 7, 8]  # what fits; never fewer than the newest good one
    assert not [n for n in files(d) if ".tmp-" in n]


def test_a_disk_filled_by_something_else_keeps_the_last_good_one_and_recovers(small_tmpfs):
    d = small_tmpfs(1024 * KIB)
    for step in (1, 2, 3):
        write(d, step)
    filler = fill(d, 50 * KIB)
    write(d, 4)  # 1 and 2 are what keep=3 lets go before a write, and make room; the newest good one (3) stays
    assert ckpt.list_steps(str(d), 0) == [3, 4] and newest(d) == (4, 4)
    with open(filler, "ab") as f:  # the disk is full: a bigger shard does not fit even with only 4 kept
        f.write(b"\0" * ckpt._free_bytes(str(d)))
    with pytest.raises(ckpt.CheckpointError, match="No space left") as e:
        write(d, 5, nbytes=2 * SHARD)
    assert "ps.checkpoint_dir" in str(e.value) and "step 5" in str(e.value)
    assert newest(d) == (4, 4)  # the last good checkpoint is never deleted to make room
    assert files(d) == ["ckpt-000000000004.data", "ckpt-000000000004.json"]  # no torn or orphan file holds space
    os.remove(filler)  # the operator frees the disk: the next write works and retention is back to keep
    for step in (6, 7, 8, 9):
        write(d, step)
    assert ckpt.list_steps(str(d), 0) == [7, 8, 9] and newest(d) == (9, 9)


def test_only_what_keep_lets_go_is_pruned_when_that_makes_room(small_tmpfs):
    d = small_tmpfs(1024 * KIB)
    for step in (1, 2):
        write(d, step, nbytes=100 * KIB)
    fill(d, 80 * KIB)  # the new one (100 KiB + headroom) needs what step 1 frees, not more
    write(d, 3, nbytes=100 * KIB)
    assert ckpt.list_steps(str(d), 0) == [2, 3]


def test_a_newer_corrupted_checkpoint_goes_before_the_last_good_one(small_tmpfs):
    d = small_tmpfs(1024 * KIB)
    write(d, 1, keep=5)
    write(d, 2, keep=5)
    data = os.path.join(ckpt.shard_dir(str(d), 0), "ckpt-000000000002.data")
    with open(data, "r+b") as f:  # a flipped byte: the size is right, the hash is not
        f.seek(SHARD // 2)
        f.write(b"\xff")
    fill(d, 200 * KIB)
    write(d, 3, keep=5)
    assert ckpt.list_steps(str(d), 0) == [1, 3]  # 2 was deleted, 1 (the newest good one then) was kept
    assert newest(d) == (3, 3)


def test_the_writer_passes_on_what_it_wrote_and_keeps_going_on_a_full_disk(small_tmpfs):
    """The background writer of a PS task (its ``last_step`` is the good one it trusts without reading it)."""
    from tfdist.consistency import AsyncPolicy
    from tfdist.ps.placement import VariableSpec
    from tfdist.ps.server import ParameterService
    from tfdist.ps.store import ParameterStore

    d = small_tmpfs(1024 * KIB)
    store = ParameterStore(AsyncPolicy(), num_workers=1)
    spec = VariableSpec("w", "float32", (SHARD // 4,))
    service = ParameterService(store)
    service.call("Init", {"w": np.zeros(SHARD // 4, np.float32)}, worker=0, specs=[spec.to_dict()])
    writer = ShardCheckpointer(store, str(d), 0, 1, keep=3).start()
    try:
        for clock in range(1, 7):
            service.call("Push", {"w": np.ones(SHARD // 4, np.float32)}, worker=0, clock=clock)
            step, _ = writer.checkpoint_now(timeout=60)
            assert step == clock and writer.last_step == clock
        assert writer.describe()["failed"] == 0
        assert ckpt.list_steps(str(d), 0)[-1] == 6 and newest(d) == (6, 6.0)
    finally:
        writer.close(final=False)


def test_a_manifest_that_cannot_be_written_leaves_no_data_file(tmp_path, monkeypatch):
    real = ckpt._write_atomically

    def no_room_for_manifests(path, chunks):
        if path.endswith(".json"):
            raise OSError(errno.ENOSPC, "No space left on device", path)
        return real(path, chunks)

    write(tmp_path, 1, nbytes=4 * KIB)
    monkeypatch.setattr(ckpt, "_write_atomically", no_room_for_manifests)
    with pytest.raises(ckpt.CheckpointError, match="No space left"):
        write(tmp_path, 2, nbytes=4 * KIB)
    assert files(tmp_path) == ["ckpt-000000000001.data", "ckpt-000000000001.json"]


def test_out_of_space_is_told_from_other_write_errors():
    assert ckpt._out_of_space(OSError(errno.ENOSPC, "No space left on device"))
    assert ckpt._out_of_space(OSError(errno.EDQUOT, "Disk quota exceeded"))
    assert ckpt._out_of_space(RuntimeError("RESOURCE_EXHAUSTED: No space left on device"))  # gfile's text
    assert not ckpt._out_of_space(OSError(errno.EACCES, "Permission denied"))
