"""FIFO, random-shuffle and padding queues: TF1 semantics, with timeouts."""

import threading
import time

import numpy as np
import pytest

from tfdist.data import (
    FIFOQueue,
    PaddingFIFOQueue,
    QueueClosedError,
    QueueTimeoutError,
    RandomShuffleQueue,
)
from tfdist.errors import ConfigError

T = 5.0  # bound of every wait that should succeed


def wait_until_blocked(q, n=1):
    """Waits (bounded) until n enqueuers are blocked on the full queue."""
    deadline = time.monotonic() + T
    while q._pending_enqueues < n:
        assert time.monotonic() < deadline, "the enqueue never blocked"
        time.sleep(0.001)  # polls real state; bounded by T


def test_fifo_order_enqueue_many_and_dequeue_many():
    q = FIFOQueue(10, ["float32", "int64"], shapes=[[2], []])
    q.enqueue(([0, 0], 0))
    q.enqueue_many((np.ones((3, 2)), [1, 2, 3]))
    assert q.size() == 4
    x, y = q.dequeue_many(3, timeout=T)
    assert x.shape == (3, 2) and y.tolist() == [0, 1, 2]
    x, y = q.dequeue(timeout=T)
    assert x.shape == (2,) and int(y) == 3


def test_dict_elements_and_single_tensor_elements():
    q = FIFOQueue(4, ["float32", "int32"], shapes=[[1], []], names=["x", "y"])
    q.enqueue({"x": [1.0], "y": 7})
    assert q.dequeue(timeout=T)["y"] == 7
    s = FIFOQueue(4, "int64", shapes=[])
    s.enqueue_many(np.arange(3))
    assert s.dequeue_many(3, timeout=T).tolist() == [0, 1, 2]


def test_undeclared_dtypes_come_from_the_first_element():
    q = FIFOQueue(4)
    assert q.element_spec is None
    q.enqueue((np.zeros(2, np.float32), np.int64(1)))
    assert q.dtypes == [np.float32, np.int64] and q.shapes == [(2,), ()]
    with pytest.raises(ValueError, match="shape"):
        q.enqueue((np.zeros(3, np.float32), np.int64(1)))


def test_close_then_dequeue_up_to_returns_the_rest_then_raises():
    q = FIFOQueue(10, "int64", shapes=[])
    q.enqueue_many(np.arange(5))
    q.close()
    with pytest.raises(QueueClosedError, match="enqueue|closed"):
        q.enqueue(1)
    with pytest.raises(QueueClosedError, match="dequeue_up_to"):
        q.dequeue_many(8, timeout=T)
    assert q.size() == 5  # a failed dequeue_many removes nothing
    assert q.dequeue_up_to(3, timeout=T).tolist() == [0, 1, 2]
    assert q.dequeue_up_to(3, timeout=T).tolist() == [3, 4]
    with pytest.raises(QueueClosedError):
        q.dequeue_up_to(3, timeout=T)


def test_timeouts_remove_nothing_and_report_progress():
    q = FIFOQueue(2, "int64", shapes=[])
    with pytest.raises(QueueTimeoutError, match="timeout=0.05"):
        q.dequeue(timeout=0.05)
    with pytest.raises(QueueTimeoutError) as info:
        q.enqueue_many(np.arange(5), timeout=0.05)
    assert info.value.num_enqueued == 2 and q.size() == 2


def test_close_cancels_pending_enqueues_only_when_asked():
    q = FIFOQueue(1, "int64", shapes=[])
    q.enqueue(0)
    errors = []

    def blocked_enqueue():
        try:
            q.enqueue(1, timeout=T)
        except Exception as e:  # noqa: BLE001 - recorded for the assertion
            errors.append(e)

    t = threading.Thread(target=blocked_enqueue)
    t.start()
    wait_until_blocked(q)
    q.close(cancel_pending_enqueues=True)
    t.join(T)
    assert not t.is_alive() and isinstance(errors[0], QueueClosedError)

    q2 = FIFOQueue(1, "int64", shapes=[])
    q2.enqueue(0)
    t = threading.Thread(target=q2.enqueue, args=(1,), kwargs={"timeout": T})
    t.start()
    wait_until_blocked(q2)
    q2.close()  # the pending enqueue still completes as room appears
    assert q2.dequeue(timeout=T) == 0
    t.join(T)
    assert q2.dequeue(timeout=T) == 1


def test_blocked_dequeue_wakes_on_enqueue_and_on_close():
    q = FIFOQueue(4, "int64", shapes=[])
    out = []
    t = threading.Thread(target=lambda: out.append(q.dequeue_many(2, timeout=T)))
    t.start()
    q.enqueue_many([5, 6])
    t.join(T)
    assert out[0].tolist() == [5, 6]
    errors = []

    def wait_forever():
        try:
            q.dequeue()  # no timeout: close() must wake it
        except QueueClosedError as e:
            errors.append(e)

    t = threading.Thread(target=wait_forever)
    t.start()
    q.close()
    t.join(T)
    assert not t.is_alive() and errors


def test_random_shuffle_keeps_min_after_dequeue_until_closed():
    q = RandomShuffleQueue(capacity=20, min_after_dequeue=5, dtypes="int64", shapes=[], seed=1)
    q.enqueue_many(np.arange(7))
    q.dequeue_many(2, timeout=T)  # 7 - 2 >= 5
    with pytest.raises(QueueTimeoutError, match="available"):
        q.dequeue(timeout=0.05)
    q.close()
    assert len(q.dequeue_up_to(10, timeout=T)) == 5


def test_random_shuffle_is_a_permutation_and_seeded():
    def drain(seed):
        q = RandomShuffleQueue(100, 0, "int64", shapes=[], seed=seed)
        q.enqueue_many(np.arange(50))
        q.close()
        return q.dequeue_up_to(100, timeout=T).tolist()

    a, b, c = drain(0), drain(0), drain(1)
    assert sorted(a) == list(range(50)) and a == b and a != c and a != list(range(50))


def test_random_shuffle_validates_min_after_dequeue():
    with pytest.raises(ConfigError, match="min_after_dequeue"):
        RandomShuffleQueue(capacity=10, min_after_dequeue=10)


def test_padding_queue_pads_to_the_batch_maximum():
    q = PaddingFIFOQueue(8, ["int32", "float32"], shapes=[[None], [2, None]])
    q.enqueue(([1, 2, 3], np.ones((2, 1))))
    q.enqueue(([4], np.ones((2, 4))))
    a, b = q.dequeue_many(2, timeout=T)
    assert a.tolist() == [[1, 2, 3], [4, 0, 0]] and b.shape == (2, 2, 4)
    assert b[0, :, 1:].sum() == 0
    with pytest.raises(ConfigError, match="shape"):
        PaddingFIFOQueue(8, ["int32"])


def test_many_producers_and_consumers_lose_and_duplicate_nothing():
    q = FIFOQueue(16, "int64", shapes=[])
    got, lock = [], threading.Lock()

    def produce(k):
        for i in range(200):
            q.enqueue(k * 1000 + i, timeout=T)

    def consume():
        while True:
            try:
                batch = q.dequeue_up_to(7, timeout=T)
            except QueueClosedError:
                return
            with lock:
                got.extend(batch.tolist())

    producers = [threading.Thread(target=produce, args=(k,)) for k in range(3)]
    consumers = [threading.Thread(target=consume) for _ in range(3)]
    for t in producers + consumers:
        t.start()
    for t in producers:
        t.join(T * 4)
    q.close()
    for t in consumers:
        t.join(T * 4)
    assert sorted(got) == sorted(k * 1000 + i for k in range(3) for i in range(200))


def test_capacity_is_validated():
    with pytest.raises(ConfigError, match="Received: capacity=0"):
        FIFOQueue(0, "int64")
