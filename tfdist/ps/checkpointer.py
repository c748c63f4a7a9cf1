"""A PS task's checkpointer: when its shard is written, in a background thread, and restored at start-up.

:class:`ShardCheckpointer` captures the store's state (every
``ps.checkpoint_every_steps`` steps, every ``ps.checkpoint_every_s`` seconds
on the update path, at the chief's scheduled step on the gradient path, on
request, and at exit) and writes it with :func:`tfdist.ps.checkpoint.write_shard`
(the file format, retention and verified reads live there). A restore falls
back to the previous checkpoint when the newest one is torn or malformed.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from typing import Any

from tfdist.ps import checkpoint as files
from tfdist.ps.checkpoint import CheckpointError

__all__ = ["ShardCheckpointer"]

logger = logging.getLogger(__name__)


class ShardCheckpointer:
    """Writes one PS task's checkpoints in the background: by steps, by time, on demand, at the end.

    Snapshots are copied under the store's lock (a memory copy) and written
    by one writer thread, so training waits only for the copy. At most
    ``max_queued`` snapshots wait to be written; a periodic one that finds the
    queue full is skipped with a warning (a slow file system never grows the
    PS's memory without bound).

    Args:
        store: The task's :class:`~tfdist.ps.store.ParameterStore`.
        directory: ``ps.checkpoint_dir``.
        ps, num_ps: This task's index and the job's number of PS tasks.
        every_s: Write a checkpoint this often when the shard moved since the
            last one (``ps.checkpoint_every_s``); ``None``: not by time.
        every_steps: Capture one each time the shard's step crosses a multiple
            of this (``ps.checkpoint_every_steps``); ``None``: not by steps.
        keep: Checkpoints kept (``ps.checkpoint_keep``).
    """

    def __init__(self, store, directory: str, ps: int, num_ps: int, every_s: float | None = None,
                 every_steps: int | None = None, keep: int = 3, max_queued: int = 2):
        self.store = store
        self.directory = directory
        self.ps, self.num_ps = ps, num_ps
        self.every_s, self.every_steps, self.keep = every_s, every_steps, keep
        self.max_queued = max_queued
        store.checkpoint_every_steps = every_steps
        self._queue: queue.Queue = queue.Queue()
        self._lock = threading.Lock()
        self._now_lock = threading.Lock()
        self._stop = threading.Event()
        self._writer = threading.Thread(target=self._write_loop, name=f"tfdist-ps{ps}-checkpoint", daemon=True)
        self._timer = threading.Thread(target=self._timer_loop, name=f"tfdist-ps{ps}-checkpoint-timer", daemon=True)
        #: Step of the newest checkpoint written (or restored); ``None``: none yet.
        self.last_step: int | None = None
        self.last_path: str | None = None
        self.stats = {"written": 0, "skipped": 0, "failed": 0, "seconds": 0.0, "bytes": 0}
        self.last_error: str | None = None

    # ------------------------------------------------------------------ restore
    def restore(self, step: int | None = None, replace: bool = False) -> int | None:
        """Loads this task's newest verified checkpoint (or the one of ``step``) into the store.

        Args:
            step: The checkpoint to load; ``None``: the newest valid one.
            replace: Roll back a store that holds values (see
                :meth:`ParameterStore.restore`).

        Returns:
            The step restored; ``None`` when there is no such checkpoint.
        """
        candidates = [step] if step is not None else list(reversed(files.list_steps(self.directory, self.ps)))
        ckpt = None
        for s in candidates:
            ckpt = files.read_shard(self.directory, self.ps, step=s, num_ps=self.num_ps)
            if ckpt is None:
                continue  # torn or corrupted: read_shard warned
            try:
                self.store.restore(ckpt.meta, ckpt.values, replace=replace)
                break
            except Exception as e:  # the store's DATA_LOSS: well-formed file, malformed content
                if getattr(e, "grpc_code", None) != "DATA_LOSS" or step is not None:
                    raise
                logger.warning("ps:%d: skipping checkpoint %d: %s", self.ps, s, e)
                ckpt = None
        if ckpt is None:
            return None
        if replace:
            self.discard_after(ckpt.step)
        with self._lock:
            self.last_step, self.last_path = ckpt.step, ckpt.path
        return ckpt.step

    def remove_stale_temporaries(self) -> list[str]:
        """Deletes temporary files a write killed part-way left in this task's folder (at start: none is ours)."""
        directory = files.shard_dir(self.directory, self.ps)
        stale = [name for name in files._listdir(directory) if ".tmp-" in name]
        for name in stale:
            files._remove(files._join(directory, name))
        if stale:
            logger.info("ps:%d: removed %d temporary file(s) of an interrupted checkpoint write", self.ps, len(stale))
        return stale

    def discard_after(self, step: int) -> None:
        """Deletes this task's checkpoints of steps after ``step``: the job rolled back, they are of another past.

        (A later restart must not restore them; the steps up to ``step`` are
        the history the job goes on from.)
        """
        for newer in [s for s in files.list_steps(self.directory, self.ps) if s > step]:
            for path in files._paths(self.directory, self.ps, newer):
                files._remove(path)
        with self._lock:
            if self.last_step is not None and self.last_step > step:
                self.last_step, self.last_path = None, None

    # ------------------------------------------------------------------ running
    def start(self) -> "ShardCheckpointer":
        self.remove_stale_temporaries()
        self._writer.start()
        if self.every_s:
            self._timer.start()
        return self

    def after_update(self, always: bool = False) -> None:
        """Called after every request that may move the shard: queues the snapshots the store captured."""
        if not self.every_steps and not always and not self.store.capture_pending:
            return
        for snapshot in self.store.take_captured():
            self._enqueue(snapshot, forced=False)

    def checkpoint_now(self, timeout: float | None = None) -> tuple[int | None, str | None]:
        """Writes a checkpoint of the current state and waits for it; returns ``(step, manifest path)``.

        Raises:
            CheckpointError: the write failed, or did not finish within ``timeout``.
        """
        # One at a time: concurrent calls would each hold a full copy of the state until it is written
        # (24 calls at once cost +350 MiB); in turn, at most one copy is held beyond the writer's queue.
        if not self._now_lock.acquire(timeout=-1 if timeout is None else max(0.0, timeout)):
            raise CheckpointError(f"The checkpoint of ps:{self.ps} was not written within {timeout:g} s "
                                  "(another one was being written).")
        try:
            return self._checkpoint_now(timeout)
        finally:
            self._now_lock.release()

    def _checkpoint_now(self, timeout: float | None) -> tuple[int | None, str | None]:
        snapshot = self.store.checkpoint_state()
        if snapshot is None:
            return None, None
        done = threading.Event()
        result: dict[str, Any] = {}
        self._enqueue(snapshot, forced=True, done=(done, result))
        if not done.wait(timeout):
            raise CheckpointError(f"The checkpoint of ps:{self.ps} was not written within {timeout:g} s.")
        if "error" in result:
            raise CheckpointError(result["error"])
        return snapshot[0], result.get("path")

    def close(self, final: bool = True, timeout: float = 60.0) -> None:
        """Stops the threads; with ``final``, first writes the state if it moved since the last checkpoint."""
        self._stop.set()
        if final and self.store.initialized and self.store.checkpoint_step() != self.last_step:
            try:
                self.checkpoint_now(timeout=timeout)
            except CheckpointError as e:
                logger.warning("ps:%d: the final checkpoint failed: %s", self.ps, e)
        self._queue.put(None)
        if self._writer.is_alive():
            self._writer.join(timeout)

    # ------------------------------------------------------------------ threads
    def _enqueue(self, snapshot, forced: bool, done=None) -> None:
        if not forced and self._queue.qsize() >= self.max_queued:
            self.stats["skipped"] += 1
            logger.warning("ps:%d: checkpoint of step %d skipped: %d still being written (the checkpoint "
                           "directory is slower than ps.checkpoint_every_steps/_s asks)", self.ps, snapshot[0],
                           self._queue.qsize())
            return
        self._queue.put((snapshot, done))

    def _timer_loop(self) -> None:
        while not self._stop.wait(self.every_s):
            if not self.store.initialized or self.store.checkpoint_step() == self.last_step:
                continue
            if self.store.policy.exchange.steps_are_global:  # the chief schedules them at one step on every task
                continue
            snapshot = self.store.checkpoint_state()
            if snapshot is not None:
                self._enqueue(snapshot, forced=False)

    def _write_loop(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            (step, meta, values), done = item
            start = time.perf_counter()
            try:
                with self._lock:
                    last_good = self.last_step
                path = files.write_shard(self.directory, self.ps, self.num_ps, step, meta, values, self.keep,
                                   last_good=last_good, consistent_cuts=self._consistent_cuts())
            except Exception as e:  # a failed write is reported; training goes on
                self.stats["failed"] += 1
                self.last_error = str(e)
                logger.error("ps:%d: checkpoint of step %d failed: %s", self.ps, step, e)
                if done is not None:
                    done[1]["error"] = str(e)
                    done[0].set()
                continue
            seconds = time.perf_counter() - start
            with self._lock:
                self.stats["written"] += 1
                self.stats["seconds"] += seconds
                self.stats["bytes"] += sum(v.nbytes for v in values.values())
                if self.last_step is None or step >= self.last_step:
                    self.last_step, self.last_path = step, path
            logger.info("ps:%d: checkpoint of step %d written in %.2f s (%s)", self.ps, step, seconds, path)
            if done is not None:
                done[1]["path"] = path
                done[0].set()

    def _consistent_cuts(self) -> bool:
        policy = getattr(self.store, "policy", None)
        return getattr(policy, "path", None) == "gradient"  # every task checkpoints the same global steps

    def describe(self) -> dict[str, Any]:
        """For ``Status``: where, how often, the newest step, counters."""
        with self._lock:
            return {"dir": self.directory, "every_s": self.every_s, "every_steps": self.every_steps,
                    "keep": self.keep, "last_step": self.last_step, "last_error": self.last_error,
                    **self.stats}
