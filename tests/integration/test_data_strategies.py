"""Queue datasets in Keras fit/evaluate under strategies that need sockets: every example trained once.

Keras 3.15 takes a batch from the dataset to build the model under any
strategy; for queue datasets it must build from the element spec instead
(tfdist.data.symbolic_build), or that batch and those prefetched behind it
are lost. Covered here: a local queue under the in-process
tfdist.ParameterServerStrategy, and the shared queue (one in-process server
on 127.0.0.1) under OneDeviceStrategy over two fits.
"""

import collections
import threading

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

import tfdist  # noqa: E402
from tfdist.data import FIFOQueue, SharedQueue, SharedQueueServer  # noqa: E402

TOKEN = "test-token-1234"


def test_local_queue_under_in_process_parameter_server_strategy(monkeypatch, compiled_recorder):
    monkeypatch.delenv("TF_CONFIG", raising=False)
    strategy = tfdist.ParameterServerStrategy()  # no cluster: an in-process PS on 127.0.0.1
    try:
        trained, evaluated = [], []
        model = compiled_recorder(strategy, trained)
        queue = FIFOQueue(200, ["float32", "int64"], shapes=[[3], []])
        queue.enqueue_many((np.ones((160, 3), np.float32), np.arange(160)))
        queue.close()
        model.fit(queue.as_dataset(batch_size=16), epochs=1, verbose=0)
        assert sorted(trained) == list(range(160))

        model._sink = evaluated.extend  # noqa: SLF001 - the same compiled model records elsewhere
        queue = FIFOQueue(200, ["float32", "int64"], shapes=[[3], []])
        queue.enqueue_many((np.ones((48, 3), np.float32), np.arange(48)))
        queue.close()
        model.evaluate(queue.as_dataset(batch_size=16), verbose=0)
        assert sorted(evaluated) == list(range(48))
    finally:
        strategy.shutdown()


def test_shared_queue_fit_under_one_device_strategy_trains_each_example_once_per_epoch(compiled_recorder):
    n, acked = 96, collections.defaultdict(collections.Counter)
    lock = threading.Lock()

    def on_ack(worker, epoch, arrays):
        with lock:
            acked[epoch].update(int(i) for i in arrays[1])

    def produce(epoch):
        yield np.ones((n, 3), np.float32), np.arange(n, dtype=np.int64)

    server = SharedQueueServer(
        FIFOQueue(200, ["float32", "int64"], shapes=[[3], []]),
        producers=[produce], num_epochs=2, enqueue_many=True, token=TOKEN, on_ack=on_ack,
    )
    with server:
        queue = SharedQueue(server.address, token=TOKEN)
        try:
            trained = []
            model = compiled_recorder(tf.distribute.OneDeviceStrategy("/cpu:0"), trained)
            ds = queue.as_dataset(batch_size=16)
            for epoch in range(2):  # one fit per epoch, as docs/input_pipeline.md says
                trained.clear()
                model.fit(ds, epochs=1, verbose=0)
                assert sorted(trained) == list(range(n)), epoch  # no batch lost, none twice
                assert queue.last_epoch == epoch
        finally:
            queue.disconnect()
    for epoch in range(2):
        assert sorted(acked[epoch]) == list(range(n)) and set(acked[epoch].values()) == {1}
