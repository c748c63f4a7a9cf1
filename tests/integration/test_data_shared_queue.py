"""Shared queue across real processes on 127.0.0.1: load balancing, exactly-once
delivery when a worker dies, end-of-epoch signalling, the standalone service.

Workers are ``python -m tfdist.data.queue_consumer`` processes (no TensorFlow,
so they start in well under a second); slow workers get an injected per-batch
delay. Every wait is bounded and every child is killed in teardown.
"""

import collections
import json
import os
import queue as pyqueue
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from tfdist import constants
from tfdist.data import RandomShuffleQueue, SharedQueue, SharedQueueServer
from tfdist.errors import AuthError

pytestmark = pytest.mark.integration

T = 60.0  # bound of every wait that should succeed
TOKEN = "test-token-1234"


class Child:
    """A child process whose stdout lines are read by a thread (bounded waits)."""

    def __init__(self, args, env=None):
        full_env = {**os.environ, constants.ENV_TOKEN: TOKEN, **(env or {})}
        self.proc = subprocess.Popen(
            [sys.executable, *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=full_env,
        )
        self.lines: pyqueue.Queue = pyqueue.Queue()
        self.stderr: list[str] = []
        self.readers = [
            threading.Thread(target=self._read, args=(self.proc.stdout, self.lines.put), daemon=True),
            threading.Thread(target=self._read, args=(self.proc.stderr, self.stderr.append), daemon=True),
        ]
        for t in self.readers:
            t.start()

    @staticmethod
    def _read(stream, sink):
        for line in stream:
            sink(line.rstrip("\n"))

    def wait_line(self, predicate, timeout=T):
        """Returns the first stdout line matching ``predicate``."""
        seen = []
        while True:
            try:
                line = self.lines.get(timeout=timeout)
            except pyqueue.Empty:
                raise AssertionError(
                    f"no matching line within {timeout} s; stdout: {seen[-5:]}; "
                    f"stderr: {self.stderr[-10:]}"
                ) from None
            seen.append(line)
            if predicate(line):
                return line

    def finish(self, timeout=T):
        """Waits for exit and for the output to be read; returns the exit code."""
        rc = self.proc.wait(timeout)
        for t in self.readers:
            t.join(timeout)
        return rc

    def events(self, timeout=T):
        """Waits for exit; returns the JSON events printed on stdout."""
        rc = self.finish(timeout)
        out = []
        while not self.lines.empty():
            out.append(self.lines.get_nowait())
        assert rc == 0, f"exit code {rc}; stderr: {self.stderr[-15:]}"
        return [json.loads(line) for line in out if line.startswith("{")]

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


@pytest.fixture
def children():
    started = []

    def start(args, env=None):
        child = Child(args, env)
        started.append(child)
        return child

    yield start
    for child in started:  # even when the test failed
        child.kill()


def consumer(start, address, *extra):
    return start(["-m", "tfdist.data.queue_consumer", "--address", address, "--report", "id", *extra])


def id_producer(n, chunk=10, gate=None):
    """Server producer f(epoch): examples with a unique "id" per epoch.

    With ``gate`` (a threading.Event, or one per epoch), production waits
    for it, so that workers started at different times all take part.
    """

    def produce(epoch):
        if gate is not None:
            event = gate[epoch] if isinstance(gate, list) else gate
            assert event.wait(T), f"epoch {epoch} was never released"
        for lo in range(0, n, chunk):
            ids = np.arange(lo, min(n, lo + chunk), dtype=np.int64)
            yield {"x": np.repeat(ids[:, None], 3, 1).astype(np.float32), "id": ids}

    return produce


class Audit:
    """Counts every acknowledged example id per epoch (server's on_ack hook)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.counts = collections.defaultdict(collections.Counter)

    def __call__(self, worker, epoch, arrays):
        with self.lock:
            self.counts[epoch].update(int(i) for i in arrays[1])

    def exactly_once(self, epoch, n):
        counts = self.counts[epoch]
        return sorted(counts) == list(range(n)) and set(counts.values()) == {1}


def served(audit, n, num_epochs=1, worker_timeout_s=10.0, capacity=64, gate=None):
    queue = RandomShuffleQueue(
        capacity=capacity, min_after_dequeue=8, dtypes=["float32", "int64"], shapes=[[3], []],
        names=["x", "id"], seed=0,
    )  # declared, so workers can connect before the first element exists
    return SharedQueueServer(
        queue,
        producers=[id_producer(n, gate=gate)],
        num_epochs=num_epochs,
        enqueue_many=True,
        token=TOKEN,
        worker_timeout_s=worker_timeout_s,
        on_ack=audit,
    )


def release_when_waiting(server, gate, workers, epoch=0):
    """Opens ``gate`` once ``workers`` workers wait for ``epoch`` (bounded)."""
    deadline = time.monotonic() + T
    while sum(w["epoch"] == epoch for w in server.stats()["workers"].values()) < workers:
        assert time.monotonic() < deadline, f"workers: {server.stats()['workers']}"
        time.sleep(0.01)  # polls real state; bounded by T
    gate.set()


def batch_ids(events):
    return [i for e in events if e["event"] == "batch" for i in e["values"]]


def test_a_3x_slower_worker_takes_fewer_batches_and_nothing_is_lost(children):
    audit, gate = Audit(), threading.Event()
    n = 600
    with served(audit, n, gate=gate) as server:
        fast = consumer(children, server.address, "--batch-size", "10", "--delay-s", "0.02", "--worker", "fast")
        slow = consumer(children, server.address, "--batch-size", "10", "--delay-s", "0.06", "--worker", "slow")
        release_when_waiting(server, gate, 2)
        fast_events, slow_events = fast.events(), slow.events()
        stats = server.stats()
    fast_ids, slow_ids = batch_ids(fast_events), batch_ids(slow_events)
    assert sorted(fast_ids + slow_ids) == list(range(n))  # each delivered once
    assert audit.exactly_once(0, n)
    assert 0 < len(slow_ids) < len(fast_ids)  # pull-based: the fast worker took more
    assert stats["workers"]["slow"]["acked_examples"] == len(slow_ids)


def test_a_killed_worker_s_unacknowledged_batch_is_redelivered_exactly_once(children):
    audit = Audit()
    n = 200
    with served(audit, n, worker_timeout_s=1.0) as server:
        doomed = consumer(children, server.address, "--batch-size", "10", "--hold-after", "3", "--worker", "doomed")
        doomed.wait_line(lambda line: '"holding"' in line)
        doomed.proc.send_signal(signal.SIGKILL)  # dies holding one un-acknowledged batch
        doomed.proc.wait(T)
        survivor = consumer(children, server.address, "--batch-size", "10", "--worker", "survivor")
        survivor_events = survivor.events()
        stats = server.stats()
    assert audit.exactly_once(0, n)
    assert stats["epochs"]["0"]["redelivered_batches"] == 1
    assert stats["workers"]["doomed"]["acked_batches"] == 2
    assert not stats["workers"]["doomed"]["alive"]
    assert len(batch_ids(survivor_events)) == n - 20  # the 3rd batch came again
    assert [e["event"] for e in survivor_events][-2:] == ["epoch_end", "done"]


def test_every_worker_sees_every_epoch_end_then_the_end_of_data(children):
    audit, gates = Audit(), [threading.Event(), threading.Event()]
    n = 120
    with served(audit, n, num_epochs=2, gate=gates) as server:
        workers = [
            consumer(children, server.address, "--batch-size", "8", "--epochs", "3", "--delay-s", "0.005")
            for _ in range(2)
        ]
        release_when_waiting(server, gates[0], 2, epoch=0)
        release_when_waiting(server, gates[1], 2, epoch=1)  # both saw epoch 0 end
        events = [w.events() for w in workers]
    for ev in events:
        ends = [e for e in ev if e["event"] == "epoch_end"]
        # epochs 0 and 1 end for everyone; the third iteration is empty (closed)
        assert [e["epoch"] for e in ends] == [0, 1, 1] and ends[2]["batches"] == 0
    assert audit.exactly_once(0, n) and audit.exactly_once(1, n)
    for epoch in range(2):
        per_worker = []
        for ev in events:
            idx = [i for i, e in enumerate(ev) if e["event"] == "epoch_end"][epoch]
            start = 0 if epoch == 0 else [i for i, e in enumerate(ev) if e["event"] == "epoch_end"][epoch - 1] + 1
            per_worker.append(batch_ids(ev[start:idx]))
        assert sorted(per_worker[0] + per_worker[1]) == list(range(n))


def test_standalone_service_with_a_remote_producer_and_token(children):
    service = children(["-m", "tfdist.data.queue_service", "--port", "0", "--host", "127.0.0.1"])
    line = service.wait_line(lambda l: "listening on" in l)
    address = line.rsplit(" ", 1)[1]
    with pytest.raises(AuthError, match="Wrong job token"):
        SharedQueue(address, token="wrong", timeout_s=10).stats()
    producer = SharedQueue(address, token=TOKEN, timeout_s=10)
    ids = np.arange(50, dtype=np.int64)
    producer.enqueue_many({"x": np.zeros((50, 2), np.float32), "id": ids})
    assert producer.end_epoch() == 0
    producer.close()
    reader = consumer(children, address, "--batch-size", "16")
    events = reader.events()
    assert sorted(batch_ids(events)) == list(range(50))
    assert [e["size"] for e in events if e["event"] == "batch"][-1] == 2  # final smaller batch
    producer.disconnect()
    service.proc.send_signal(signal.SIGTERM)
    assert service.proc.wait(T) == 143  # 128 + SIGTERM, as a PS task


def test_service_refuses_to_start_without_a_token(children):
    env = {constants.ENV_TOKEN: ""}
    service = children(["-m", "tfdist.data.queue_service", "--port", "0"], env=env)
    assert service.finish() == 2
    assert any(constants.ENV_TOKEN in line for line in service.stderr)


def test_server_and_client_modules_do_not_import_tensorflow():
    code = (
        "import sys, tfdist.data.queue_service, tfdist.data.shared_queue, tfdist.data.queue_consumer;"
        "sys.exit(int('tensorflow' in sys.modules))"
    )
    assert subprocess.run([sys.executable, "-c", code], timeout=T).returncode == 0


def test_fit_from_the_shared_queue_in_two_epochs():
    tf = pytest.importorskip("tensorflow")
    import keras

    audit = Audit()
    n = 96
    with served(audit, n, num_epochs=2) as server:
        queue = SharedQueue(server.address, token=TOKEN)
        ds = queue.as_dataset(batch_size=16).map(lambda e: (e["x"], e["id"] % 3))
        with tf.distribute.OneDeviceStrategy("/cpu:0").scope():
            model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(3)])
            model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        for epoch in range(2):  # one fit per epoch: see docs/input_pipeline.md
            model.fit(ds, initial_epoch=epoch, epochs=epoch + 1, verbose=0)
        queue.disconnect()
    assert audit.exactly_once(0, n) and audit.exactly_once(1, n)


def test_an_abandoned_iteration_does_not_end_the_epoch_and_nothing_is_delivered_twice():
    """An iteration closed early (a `break`, steps_per_epoch, Keras's build peek before the fix)."""
    pytest.importorskip("tensorflow")

    audit = Audit()
    n = 96
    with served(audit, n, num_epochs=2) as server:
        queue = SharedQueue(server.address, token=TOKEN)
        try:
            # a plain generator: the batch the caller took counts as delivered, the epoch goes on
            gen = queue.batches(8)
            first = next(gen)["id"].tolist()
            gen.close()
            assert queue.last_epoch == -1
            rest = [i for b in queue.batches(8) for i in b["id"].tolist()]
            assert sorted(first + rest) == list(range(n)) and queue.last_epoch == 0

            # a tf.data iterator abandoned after one batch: what its input pipeline had fetched
            # (prefetch included, and a batch in flight when it was destroyed, which the map never
            # sees) counts as delivered; the next iteration continues the same epoch with the rest
            ds = queue.as_dataset(batch_size=8)
            it = iter(ds)
            abandoned = next(it)["id"].numpy().tolist()
            del it
            assert queue.last_epoch == 0
            rest = [i for b in ds for i in b["id"].numpy().tolist()]
            assert queue.last_epoch == 1
            assert not set(abandoned) & set(rest) and len(rest) == len(set(rest)) and len(rest) < n
            assert list(ds) == []  # the data has ended
        finally:
            queue.disconnect()
    assert audit.exactly_once(0, n) and audit.exactly_once(1, n)


def _raw_stub(address, method):
    import grpc

    channel = grpc.insecure_channel(address)
    return channel, channel.unary_unary(f"/tfdist.data.SharedQueue/{method}")


def test_hostile_requests_are_refused_and_long_waits_neither_starve_the_service_nor_block_sigterm(children):
    """Issue 26: 33 Dequeues asking to wait 1e9 s starved the service and SIGTERM no longer stopped it;
    10**400, a dict or 10,000-character worker and unknown fields were accepted or answered INTERNAL."""
    import grpc
    from tfdist import wire

    service = children(["-m", "tfdist.data.queue_service", "--port", "0", "--host", "127.0.0.1", "--max-wait-s", "30"])
    address = service.wait_line(lambda l: "listening on" in l).rsplit(" ", 1)[1]
    auth = [(constants.AUTH_METADATA_KEY, TOKEN)]
    channel, dequeue = _raw_stub(address, "Dequeue")
    try:
        for meta in [{"worker": "w", "n": 1, "wait_s": 1e9}, {"worker": "w", "n": 10**400},
                     {"worker": "w", "n": 1, "acks": [10**400]}, {"worker": {"a": 1}, "n": 1},
                     {"worker": "x" * 10_000, "n": 1}, {"worker": "w", "n": 1, "unknown": 1}, {"n": 0}]:
            with pytest.raises(grpc.RpcError) as info:
                dequeue(wire.encode(meta, {}), timeout=T, metadata=auth)
            assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT, (meta, info.value.details())
            assert len(info.value.details()) < 600
        # 33 calls asking for the longest wait the protocol allows (an hour), on an empty queue
        hostile = [dequeue.future(wire.encode({"worker": f"h{i}", "n": 1, "wait_s": 3600.0}, {}), timeout=T,
                                  metadata=auth) for i in range(33)]
        client = SharedQueue(address, token=TOKEN, timeout_s=T)
        deadline = time.monotonic() + T
        while client.stats()["waiting_calls"] < 16:  # half the 32 threads wait; the rest answered "retry"
            assert time.monotonic() < deadline, client.stats()
            time.sleep(0.05)  # polls real state; bounded by T
        stats = client.stats()  # the service still answers while the waiting slots are full
        assert stats["waiting_calls"] == 16 and stats["refused"] == {"Dequeue": 7}
        assert set(stats["workers"]) <= {f"h{i}" for i in range(33)}  # no refused request registered a worker
        client.enqueue_many({"x": np.zeros((2, 2), np.float32)})  # and takes data
        client.disconnect()
        service.proc.send_signal(signal.SIGTERM)
        assert service.finish() == 143  # stopped within T although 16 calls asked to wait an hour
        for f in hostile:
            try:
                meta, _ = wire.decode(f.result(timeout=T))
                assert meta["status"] in ("batch", "retry")
            except grpc.RpcError as e:  # the stop cancelled it
                assert e.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED), e
    finally:
        channel.close()


def _self_signed(tmp_path, name):
    key, cert = tmp_path / f"{name}-key.pem", tmp_path / f"{name}-cert.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert),
         "-days", "1", "-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"],
        check=True, capture_output=True, timeout=60,
    )
    return str(cert), str(key)


def test_a_queue_served_with_tls_talks_to_clients_with_its_ca_and_names_tls_to_the_others(children, tmp_path):
    """The standalone service serves TLS from the job config's security.tls_cert/tls_key (as a launched input task);
    a client with the CA enqueues and reads; one without TLS, or with another CA, gets a TLS error within seconds."""
    from tfdist.config import JobConfig
    from tfdist.errors import TLSConfigError

    cert, key = _self_signed(tmp_path, "queue")
    other, _ = _self_signed(tmp_path, "other")
    config = JobConfig(name="tls-queue")
    config.security.tls_cert, config.security.tls_key, config.security.tls_ca = cert, key, cert
    service = children(["-m", "tfdist.data.queue_service", "--port", "0", "--host", "127.0.0.1"],
                       env={constants.ENV_CONFIG: config.to_json()})
    line = service.wait_line(lambda l: "listening on" in l)
    address = line.rsplit(" ", 2)[1] if line.endswith("(TLS)") else line.rsplit(" ", 1)[1]
    producer = SharedQueue(address, token=TOKEN, timeout_s=10, tls_ca=cert)
    producer.enqueue_many({"x": np.zeros((20, 2), np.float32), "id": np.arange(20, dtype=np.int64)})
    assert producer.end_epoch() == 0
    producer.close()
    reader = SharedQueue(address, token=TOKEN, timeout_s=10, tls_ca=cert)
    got = [int(i) for batch in reader.batches(8) for i in batch["id"]]
    reader.disconnect()
    assert sorted(got) == list(range(20))
    for tls_ca, says in ((None, "serves TLS, but this client does not use it"), (other, "not signed by the CA")):
        t0 = time.monotonic()
        with pytest.raises(TLSConfigError, match=says) as e:
            SharedQueue(address, token=TOKEN, timeout_s=30, tls_ca=tls_ca).stats()
        assert time.monotonic() - t0 < 10 and "the shared queue" in str(e.value)
    producer.disconnect()
    service.proc.send_signal(signal.SIGTERM)
    assert service.proc.wait(T) == 143
