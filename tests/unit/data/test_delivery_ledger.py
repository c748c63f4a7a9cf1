"""DeliveryLedger: leases, acks, re-delivery and epoch ends, with a fake clock."""

import numpy as np
import pytest

from tfdist.data import FIFOQueue, RandomShuffleQueue, SharedQueueError
from tfdist.data.delivery_ledger import DeliveryLedger


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def make(n_examples=10, worker_timeout_s=5.0, queue=None):
    clock = FakeClock()
    acked = []
    ledger = DeliveryLedger(
        queue or FIFOQueue(100, "int64", shapes=[]),
        worker_timeout_s=worker_timeout_s,
        on_ack=lambda w, e, arrays: acked.append((w, e, arrays[0].tolist())),
        clock=clock,
    )
    if n_examples:
        _, q = ledger.producing_queue()
        q.enqueue_many(np.arange(n_examples))
    return ledger, clock, acked


def test_epoch_ends_only_after_every_batch_is_acknowledged():
    ledger, _, acked = make(5)
    ledger.end_epoch()
    ledger.close()
    a = ledger.dequeue("a", 3, timeout=0)
    b = ledger.dequeue("b", 3, epoch=a.epoch, timeout=0)
    assert (a.kind, b.kind, len(b.arrays[0])) == ("batch", "batch", 2)  # last batch smaller
    assert ledger.dequeue("b", 3, epoch=0, timeout=0).kind == "retry"  # a still holds one
    ledger.ack("a", [a.batch_id])
    ledger.ack("b", [b.batch_id])
    assert ledger.dequeue("b", 3, epoch=0, timeout=0).kind == "end"
    assert ledger.dequeue("a", 3, epoch=0, timeout=0).kind == "end"  # everyone sees the end
    assert sorted(sum((ids for _, _, ids in acked), [])) == list(range(5))
    assert ledger.dequeue("c", 3, epoch=None, after=0, timeout=0).kind == "end"  # closed


def test_a_silent_worker_loses_its_leases_to_the_next_worker():
    ledger, clock, acked = make(6, worker_timeout_s=5.0)
    ledger.end_epoch()
    dead = ledger.dequeue("dead", 4, timeout=0)
    clock.now = 3.0
    live = ledger.dequeue("live", 4, epoch=0, timeout=0)
    ledger.ack("live", [live.batch_id])
    assert ledger.expire() == []  # 3 s < 5 s
    clock.now = 6.0
    ledger.heartbeat("live")
    assert ledger.expire() == ["dead"]
    again = ledger.dequeue("live", 4, epoch=0, timeout=0)
    assert again.redelivered and again.batch_id == dead.batch_id
    assert again.arrays[0].tolist() == dead.arrays[0].tolist()
    ledger.ack("live", [again.batch_id])
    assert ledger.ack("dead", [dead.batch_id]) == 0  # late: it went to "live"
    assert ledger.dequeue("live", 4, epoch=0, timeout=0).kind == "end"
    ids = sorted(sum((ids for _, _, ids in acked), []))
    assert ids == list(range(6))
    stats = ledger.stats()
    assert stats["workers"]["dead"]["late_acks"] == 1
    assert stats["epochs"]["0"]["redelivered_batches"] == 1


def test_a_late_ack_before_redelivery_withdraws_the_batch():
    ledger, clock, acked = make(4, worker_timeout_s=1.0)
    ledger.end_epoch()
    slow = ledger.dequeue("slow", 4, timeout=0)
    clock.now = 2.0
    ledger.expire()
    assert ledger.ack("slow", [slow.batch_id]) == 1
    assert ledger.dequeue("other", 4, epoch=0, timeout=0).kind == "end"
    assert len(acked) == 1


def test_epochs_are_separate_queues_and_late_joiners_start_at_the_oldest_open_epoch():
    ledger, _, _ = make(0, queue=RandomShuffleQueue(100, 0, "int64", shapes=[], seed=0))
    for epoch in range(2):
        _, q = ledger.producing_queue()
        q.enqueue_many(np.arange(4) + 100 * epoch)
        ledger.end_epoch()
    ledger.close()
    r = ledger.dequeue("a", 10, timeout=0)
    assert r.epoch == 0 and sorted(r.arrays[0].tolist()) == [0, 1, 2, 3]
    ledger.ack("a", [r.batch_id])
    assert ledger.dequeue("a", 10, epoch=0, timeout=0).kind == "end"
    late = ledger.dequeue("late", 10, epoch=None, after=-1, timeout=0)
    assert late.epoch == 1 and sorted(late.arrays[0].tolist()) == [100, 101, 102, 103]
    assert ledger.stats()["last_epoch"] == 1


def test_close_after_end_epoch_drops_the_empty_epoch():
    ledger, _, _ = make(2)
    ledger.end_epoch()
    ledger.close()
    assert ledger.stats()["last_epoch"] == 0


def test_a_failed_producer_fails_every_dequeue():
    ledger, _, _ = make(0)
    ledger.fail("A producer failed: ValueError: corrupt")
    with pytest.raises(SharedQueueError, match="corrupt"):
        ledger.dequeue("a", 2, timeout=0)


def test_dequeue_waits_at_most_its_timeout_for_data():
    ledger, _, _ = make(0)
    assert ledger.dequeue("a", 2, timeout=0.05).kind == "retry"

