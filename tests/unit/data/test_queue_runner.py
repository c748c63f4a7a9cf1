"""QueueRunner: producer threads and processes, end of data, errors."""

import functools

import numpy as np
import pytest

from tfdist.data import (
    Coordinator,
    FIFOQueue,
    QueueClosedError,
    QueueRunner,
    RandomShuffleQueue,
)
from tfdist.errors import ConfigError

T = 10.0


def read_shard(shard, n=25):
    """A module-level (picklable) producer: examples of one shard."""
    for i in range(n):
        yield (np.full((2,), shard, np.float32), np.int64(shard * 1000 + i))


def read_shard_batches(shard, n=25, chunk=10):
    for start in range(0, n, chunk):
        ids = np.arange(start, min(n, start + chunk)) + shard * 1000
        yield (np.full((len(ids), 2), shard, np.float32), ids.astype(np.int64))


def broken_shard(shard):
    yield (np.zeros(2, np.float32), np.int64(0))
    raise ValueError(f"corrupt record in shard {shard}")


def drain(queue, n=8):
    got = []
    while True:
        try:
            _, ids = queue.dequeue_up_to(n, timeout=T)
        except QueueClosedError:
            return got
        got.extend(ids.tolist())


def expected(shards, n=25):
    return sorted(s * 1000 + i for s in shards for i in range(n))


@pytest.mark.parametrize("enqueue_many", [False, True])
def test_threads_fill_the_queue_and_close_it_at_the_end(enqueue_many):
    make = read_shard_batches if enqueue_many else read_shard
    queue = RandomShuffleQueue(capacity=20, min_after_dequeue=5, seed=0)
    runner = QueueRunner(queue, [make(s) for s in range(4)], num_threads=2, enqueue_many=enqueue_many)
    with Coordinator() as coord:
        threads = runner.start(coord)
        assert len(threads) == 2
        got = drain(queue)
    assert sorted(got) == expected(range(4))
    assert all(not t.is_alive() for t in threads)


def test_callables_are_accepted_and_num_threads_is_capped():
    queue = FIFOQueue(100)
    runner = QueueRunner(queue, [functools.partial(read_shard, 1)], num_threads=8)
    with Coordinator() as coord:
        assert len(runner.start(coord)) == 1
        assert sorted(drain(queue)) == expected([1])


def test_producer_error_aborts_the_queue_and_is_reraised():
    queue = FIFOQueue(100)
    runner = QueueRunner(queue, [broken_shard(3), read_shard(1)], num_threads=2)
    with pytest.raises(ValueError, match="corrupt record in shard 3"):
        with Coordinator() as coord:
            runner.start(coord)
            assert coord.wait_for_stop(T)
            with pytest.raises(ValueError, match="corrupt record"):
                drain(queue)  # dequeuers get the producer's error at once


def test_stop_unblocks_producers_waiting_on_a_full_queue():
    queue = FIFOQueue(2)
    endless = (((np.zeros(1), np.int64(i)) for i in iter(int, 1)))
    runner = QueueRunner(queue, [endless])
    coord = Coordinator()
    (t,) = runner.start(coord)
    queue.dequeue(timeout=T)  # the producer is running
    coord.request_stop()
    coord.join(stop_grace_period_secs=T)
    assert not t.is_alive()


def test_producer_processes_deliver_everything():
    queue = FIFOQueue(10)
    producers = [functools.partial(read_shard_batches, s) for s in range(2)]
    runner = QueueRunner(queue, producers, num_threads=2, enqueue_many=True, use_processes=True)
    with Coordinator() as coord:
        runner.start(coord)
        assert sorted(drain(queue)) == expected(range(2))


def test_producer_process_error_comes_back_with_the_child_traceback():
    queue = FIFOQueue(10)
    runner = QueueRunner(queue, [functools.partial(broken_shard, 5)], use_processes=True)
    with pytest.raises(ValueError, match="shard 5") as info:
        with Coordinator() as coord:
            runner.start(coord)
            coord.wait_for_stop(T)
    assert any("Traceback in producer process" in note for note in info.value.__notes__)


def test_bad_arguments_say_how_to_fix():
    queue = FIFOQueue(4)
    with pytest.raises(ConfigError, match=r"producers=\[gen\]"):
        QueueRunner(queue, read_shard(0))
    with pytest.raises(ConfigError, match="picklable"):
        QueueRunner(queue, [read_shard(0)], use_processes=True)
    with pytest.raises(ConfigError, match="tfdist.data queue"):
        QueueRunner(object(), [read_shard(0)])


def test_a_second_start_is_refused():
    queue = FIFOQueue(100)
    runner = QueueRunner(queue, [read_shard(0)])
    with Coordinator() as coord:
        runner.start(coord)
        with pytest.raises(Exception, match="already started"):
            runner.start(coord)
        drain(queue)
