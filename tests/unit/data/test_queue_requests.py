"""The shared queue's request path without sockets: each bug issue 26 observed, reproduced.

``QueueService.handle`` is what every gRPC call of a ``SharedQueueServer``
runs (parse, then the ledger). Each test below is one observation of the
issue: before the typed protocol the request was applied in part, accepted,
or answered ``INTERNAL``.
"""

import numpy as np
import pytest

from tfdist.data import FIFOQueue, QueueClosedError, SharedQueueError
from tfdist.data.delivery_ledger import DeliveryLedger
from tfdist.data.queue_protocol import QueueProtocolError, QueueRequestError, parse
from tfdist.data.queue_service import QueueService


class FrozenClock:
    def __call__(self):
        return 100.0


def make(n_examples=6, close=False, max_workers=10_000):
    queue = FIFOQueue(100, "int64", shapes=[])
    ledger = DeliveryLedger(queue, worker_timeout_s=5.0, clock=FrozenClock(), max_workers=max_workers)
    if n_examples:
        ledger.producing_queue()[1].enqueue_many(np.arange(n_examples))
    if close:
        ledger.close()
    return QueueService(ledger, queue, max_wait_s=0.0), ledger


def test_a_refused_dequeue_does_not_apply_its_acks():
    svc, ledger = make()
    meta, _ = svc.handle("Dequeue", {"worker": "w", "n": 2}, {})
    before = ledger.state()
    with pytest.raises(QueueProtocolError, match="`n` must be an integer"):
        svc.handle("Dequeue", {"worker": "w", "acks": [meta["batch_id"]], "n": "x"}, {})
    assert ledger.state() == before
    assert ledger.stats()["workers"]["w"]["acked_batches"] == 0
    assert svc.rejected == {"Dequeue": 1}


def test_a_dequeue_of_zero_examples_registers_no_worker():
    svc, ledger = make()
    with pytest.raises(QueueProtocolError, match="`n`"):
        svc.handle("Dequeue", {"worker": "stranger", "n": 0}, {})
    assert ledger.stats()["workers"] == {}


def test_enqueue_after_close_of_an_emptied_epoch_is_refused_not_lost():
    svc, ledger = make()
    svc.handle("EndEpoch", {}, {})  # epoch 0 has the 6 rows; epoch 1 is empty
    svc.handle("Close", {}, {})  # drops the empty epoch 1: the data ends after epoch 0
    before = ledger.state()
    with pytest.raises(QueueClosedError, match="closed"):
        svc.handle("Enqueue", {"names": ["0"], "structure": "single"}, {"0": np.arange(3)})
    with pytest.raises(QueueClosedError, match="closed"):
        svc.handle("EndEpoch", {}, {})
    assert ledger.state() == before  # no epoch 1 was created to hold rows nobody would read


@pytest.mark.parametrize("meta", [
    {"worker": "w", "n": 10**400}, {"worker": "w", "n": 1, "epoch": 10**400}, {"worker": "w", "n": 1, "after": 10**400},
    {"worker": "w", "n": 1, "acks": [10**400]}, {"worker": {"a": 1}, "n": 1}, {"worker": "x" * 10_000, "n": 1},
    {"worker": "w", "n": 1, "surprise": 1}, {"worker": "w", "n": True}, {"worker": "w", "n": 1, "wait_s": 1e400},
    {"worker": "w", "n": 1, "wait_s": float("nan")}, {"worker": "w", "n": 1, "acks": [1, 1]}, {"n": 1},
    {"worker": "w", "n": 1, "after": -2}, {"worker": "w", "n": 1, "acks": "0"},
])
def test_malformed_dequeues_are_invalid_argument_and_change_nothing(meta):
    svc, ledger = make()
    before = ledger.state()
    with pytest.raises(QueueProtocolError) as info:
        svc.handle("Dequeue", meta, {})
    assert info.value.grpc_code == "INVALID_ARGUMENT"
    assert len(str(info.value)) < 400  # a 10,000-character name is not echoed back
    assert ledger.state() == before


@pytest.mark.parametrize("method,meta,tensors", [
    ("Ack", {"worker": "w", "acks": [1], "extra": 0}, {}),
    ("Ack", {"worker": "w"}, {"x": np.zeros(1)}),
    ("Describe", {"wait_s": -1}, {}),
    ("Stats", {"brief": True}, {}),
    ("Close", {}, {"x": np.zeros(1)}),
    ("Enqueue", {"names": ["0"]}, {}),
    ("Enqueue", {"names": ["0", "0"]}, {"0": np.zeros(1)}),
    ("Enqueue", {"names": ["0"], "structure": "set"}, {"0": np.zeros(1)}),
    ("Enqueue", {"names": ["0", "1"], "structure": "single"}, {"0": np.zeros(1), "1": np.zeros(1)}),
    ("Enqueue", {"names": ["0"]}, {"0": np.zeros(()), }),
    ("Enqueue", {"names": ["0"]}, {"0": np.zeros((0,))}),
    ("Enqueue", {"names": ["0", "1"]}, {"0": np.zeros(2), "1": np.zeros(3)}),
    ("Nope", {}, {}),
])
def test_malformed_requests_of_every_method_are_refused_whole(method, meta, tensors):
    svc, ledger = make()
    before = ledger.state()
    with pytest.raises(QueueProtocolError):
        svc.handle(method, meta, tensors)
    assert ledger.state() == before


def test_an_element_unlike_the_queue_s_is_refused_before_any_row_goes_in():
    svc, ledger = make()  # the queue holds int64 scalars ("single")
    before = ledger.state()
    for meta, tensors, match in [
        ({"names": ["0"], "structure": "single"}, {"0": np.zeros(2, np.float32)}, "is float32; the queue holds int64"),
        ({"names": ["0"], "structure": "single"}, {"0": np.zeros((2, 3), np.int64)}, "per-example shape"),
        ({"names": ["a"], "structure": "dict"}, {"a": np.zeros(2, np.int64)}, "structured as the first"),
    ]:
        with pytest.raises(QueueRequestError, match=match):
            svc.handle("Enqueue", meta, tensors)
    assert ledger.state() == before
    meta, _ = svc.handle("Enqueue", {"names": ["0"], "structure": "single"}, {"0": np.arange(2, dtype=np.int32)})
    assert meta == {"enqueued": 2}  # a type that casts to the queue's is fine


def test_dict_elements_may_list_their_keys_in_any_order():
    queue = FIFOQueue(10)
    ledger = DeliveryLedger(queue, worker_timeout_s=5.0)
    svc = QueueService(ledger, queue, max_wait_s=0.0)
    svc.handle("Enqueue", {"names": ["x", "y"], "structure": "dict"}, {"x": np.zeros((1, 2)), "y": np.arange(1)})
    meta, _ = svc.handle("Enqueue", {"names": ["y", "x"], "structure": "dict"}, {"x": np.ones((1, 2)), "y": np.arange(1)})
    assert meta == {"enqueued": 1}
    with pytest.raises(QueueRequestError, match="per-example shape"):
        svc.handle("Enqueue", {"names": ["y", "x"], "structure": "dict"}, {"x": np.ones((1, 3)), "y": np.arange(1)})


def test_a_dequeue_for_an_epoch_not_produced_yet_creates_nothing():
    svc, ledger = make()
    before = ledger.state()["epochs"]
    meta, _ = svc.handle("Dequeue", {"worker": "w", "n": 1, "epoch": 2**53}, {})
    assert meta["status"] == "retry"
    meta, _ = svc.handle("Dequeue", {"worker": "w", "n": 1, "after": 2**53 - 1}, {})
    assert meta["status"] == "retry"
    assert ledger.state()["epochs"] == before


def test_workers_beyond_max_workers_are_refused_and_not_kept():
    svc, ledger = make(max_workers=2)
    svc.handle("Ack", {"worker": "a"}, {})
    svc.handle("Dequeue", {"worker": "b", "n": 1}, {})
    before = ledger.state()
    for method, meta in [("Ack", {"worker": "c"}), ("Dequeue", {"worker": "c", "n": 1})]:
        with pytest.raises(QueueRequestError) as info:
            svc.handle(method, meta, {})
        assert info.value.grpc_code == "RESOURCE_EXHAUSTED" and "max_workers" in str(info.value)
    assert ledger.state() == before
    svc.handle("Ack", {"worker": "a"}, {})  # known workers still served


def test_a_failed_producer_refuses_a_dequeue_without_taking_its_acks():
    svc, ledger = make()
    meta, _ = svc.handle("Dequeue", {"worker": "w", "n": 2}, {})
    ledger.fail("producer exploded")
    before = ledger.state()
    with pytest.raises(SharedQueueError, match="producer exploded"):
        svc.handle("Dequeue", {"worker": "w", "n": 2, "acks": [meta["batch_id"]]}, {})
    assert ledger.state() == before


def test_waits_are_bounded_by_the_server_whatever_the_request_asks():
    queue = FIFOQueue(10)  # no element structure until something is enqueued
    ledger = DeliveryLedger(queue, worker_timeout_s=5.0)
    svc = QueueService(ledger, queue, max_wait_s=0.05, max_waiters=1)
    meta, _ = svc.handle("Dequeue", {"worker": "w", "n": 1, "wait_s": 3600.0}, {})  # nothing there: bounded
    assert meta["status"] == "retry"
    meta, _ = svc.handle("Describe", {"wait_s": 3600.0}, {})
    assert meta["spec"] is None
    ledger.shutdown()  # a stopping service answers at once
    assert svc.handle("Dequeue", {"worker": "w", "n": 1, "wait_s": 3600.0}, {})[0]["status"] == "retry"


def test_requests_round_trip_through_to_wire():
    from tfdist.data import queue_protocol as qp

    for req in [qp.DequeueRequest("w", 3, None, 2, (4, 5), 0.5), qp.AckRequest("w", (1,)), qp.DescribeRequest(2.0),
                qp.EndEpochRequest(), qp.CloseRequest(), qp.StatsRequest()]:
        assert parse(type(req).__name__[: -len("Request")], *req.to_wire()) == req
    enq = qp.EnqueueRequest(("x", "y"), (np.zeros((2, 3)), np.arange(2)), "dict", 1.0)
    back = parse("Enqueue", *enq.to_wire())
    assert back.names == ("x", "y") and back.structure == "dict" and back.rows == 2
