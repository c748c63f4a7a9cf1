"""Client of a :class:`~tfdist.data.SharedQueueServer`: one per worker (or producer)."""

from __future__ import annotations

import itertools
import logging
import os
import socket
import threading
import time
import uuid
from typing import Any, Iterator

import grpc
import numpy as np

from tfdist import constants
from tfdist.auth import token_metadata
from tfdist.data.element_spec import ElementSpec
from tfdist.data.errors import (
    QueueClosedError,
    QueueTimeoutError,
    SharedQueueError,
    SharedQueueUnavailableError,
)
from tfdist.data import queue_protocol as qp
from tfdist.data.queue_protocol import METHODS, SERVICE
from tfdist.errors import AuthError, ConfigError
from tfdist import wire

__all__ = ["SharedQueue"]

logger = logging.getLogger(__name__)

_RETRYABLE = (grpc.StatusCode.UNAVAILABLE,)


class SharedQueue:
    """A worker's handle on a queue served by a :class:`~tfdist.data.SharedQueueServer`.

    Workers iterate ``as_dataset(batch_size)`` (or :meth:`batches`); each
    iteration is one epoch of the shared queue and ends, for every worker,
    when the epoch's examples are all acknowledged. A batch is acknowledged
    when the input pipeline asks for the next one (the ack rides on that
    request); if this worker dies first, the server re-delivers it to another
    worker. A heartbeat thread keeps this worker's leases while it computes.

    Producers on other machines use :meth:`enqueue`, :meth:`enqueue_many`,
    :meth:`end_epoch` and :meth:`close`.

    Args:
        address: ``host:port`` of the server.
        token: the job token. Defaults to the environment variable
            ``TFDIST_TOKEN``.
        worker: this client's name in the server's statistics. Defaults to
            ``"<hostname>:<pid>:<random>"``.
        timeout_s: deadline of each call, and how long an unreachable server
            is retried before :class:`~tfdist.data.SharedQueueUnavailableError`.
            Defaults to 30.
        poll_s: how long the server may hold a dequeue open waiting for data
            before the client asks again. Defaults to 1.
        heartbeat_interval_s: seconds between heartbeats while this client
            holds batches; keep it well under the server's
            ``worker_timeout_s``. Defaults to 1.
        tls_ca: PEM CA file to verify a queue served with TLS
            (``SharedQueueServer(tls_cert=..., tls_key=...)``; in a launched
            job the config's ``security.tls_ca``, see :meth:`from_cluster`).
            Defaults to ``None``: plain TCP.

    Example:
        >>> queue = SharedQueue("input-host:7070")
        >>> model.fit(queue.as_dataset(batch_size=64), epochs=10)
    """

    def __init__(
        self,
        address: str,
        *,
        token: str | None = None,
        worker: str | None = None,
        timeout_s: float = constants.DEFAULT_RPC_TIMEOUT_S,
        poll_s: float = 1.0,
        heartbeat_interval_s: float = 1.0,
        max_message_bytes: int = constants.DEFAULT_MAX_MESSAGE_BYTES,
        tls_ca: str | None = None,
    ):
        if timeout_s <= poll_s:
            raise ConfigError(
                "timeout_s must be larger than poll_s. Received: "
                f"timeout_s={timeout_s}, poll_s={poll_s}."
            )
        self._address = address
        token = token if token is not None else os.environ.get(constants.ENV_TOKEN)
        self._metadata = token_metadata(token)
        self._worker = worker or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
        self._timeout_s = timeout_s
        self._poll_s = poll_s
        self._heartbeat_interval_s = heartbeat_interval_s
        options = [
            ("grpc.max_receive_message_length", max_message_bytes),
            ("grpc.max_send_message_length", max_message_bytes),
            ("grpc.enable_retries", 0),
        ]
        self._tls_ca = tls_ca
        if tls_ca:
            from tfdist.tls import channel_credentials

            try:
                creds = channel_credentials(tls_ca)
            except OSError as e:
                raise ConfigError(f"TLS: the CA file tls_ca={tls_ca!r} cannot be read ({e.strerror or e}). Give the "
                                  "PEM file of the CA that signed the queue's certificate.") from None
            self._channel = grpc.secure_channel(address, creds, options=options)
        else:
            self._channel = grpc.insecure_channel(address, options=options)
        self._stubs = {m: self._channel.unary_unary(f"/{SERVICE}/{m}") for m in METHODS}
        self._spec: ElementSpec | None = None
        self._last_epoch = -1
        self._lock = threading.Lock()
        self._holding = 0  # batches leased and not yet acknowledged
        self._closed = threading.Event()
        self._heartbeat: threading.Thread | None = None

    @classmethod
    def from_cluster(cls, index: int = 0, **kwargs) -> "SharedQueue":
        """The queue served by input task ``index`` of this job (from ``TF_CONFIG``).

        Use it in a script started by ``python -m tfdist.launch`` with an
        ``input`` task in the config; the token comes from ``TFDIST_TOKEN``.

        Example:
            >>> ds = SharedQueue.from_cluster().as_dataset(batch_size=64)
        """
        from tfdist.cluster.resolver import resolve_cluster

        config = resolve_cluster(required=True).config
        if index >= len(config.cluster.input):
            raise ConfigError(
                f"The cluster has {len(config.cluster.input)} input task(s); there is no input:{index}. "
                "Add `input: 1` to the cluster in the config."
            )
        kwargs.setdefault("token", config.security.resolve_token())
        kwargs.setdefault("tls_ca", config.security.tls_ca)  # the queue serves TLS when the PS does
        return cls(config.cluster.input[index], **kwargs)

    @property
    def address(self) -> str:
        return self._address

    @property
    def worker(self) -> str:
        return self._worker

    @property
    def last_epoch(self) -> int:
        """The last epoch this client saw end (-1 before the first)."""
        return self._last_epoch

    # -- RPC -----------------------------------------------------------------------

    def _call(self, method: str, request, timeout: float | None = None):
        timeout = self._timeout_s if timeout is None else timeout
        payload = wire.encode(*request.to_wire())
        deadline = time.monotonic() + self._timeout_s
        for attempt in itertools.count():
            try:
                reply = self._stubs[method](payload, timeout=timeout, metadata=self._metadata)
                return wire.decode(reply)
            except grpc.RpcError as e:
                code, details = e.code(), e.details()
                if code == grpc.StatusCode.UNAUTHENTICATED:
                    raise AuthError(f"{details} (shared queue at {self._address})") from None
                if code == grpc.StatusCode.OUT_OF_RANGE:
                    raise QueueClosedError(f"{details} (shared queue at {self._address})") from None
                if code == grpc.StatusCode.UNAVAILABLE and attempt == 1:
                    self._raise_if_tls_is_why()  # a TLS mismatch never heals: say so now, not after timeout_s
                if code in _RETRYABLE and time.monotonic() < deadline:
                    time.sleep(min(0.05 * 2**attempt, 1.0))  # back-off before a retry
                    continue
                if code in _RETRYABLE or code == grpc.StatusCode.DEADLINE_EXCEEDED:
                    raise SharedQueueUnavailableError(
                        f"{method} to the shared queue at {self._address} failed: "
                        f"{code.name} ({details}). Calls are retried for timeout_s="
                        f"{self._timeout_s:g} s; is the queue service running and the "
                        "address right?"
                    ) from None
                raise SharedQueueError(f"{details} (shared queue at {self._address})") from None

    def _raise_if_tls_is_why(self) -> None:
        """Raises :class:`~tfdist.errors.TLSConfigError` naming the file or setting when TLS is why calls fail."""
        from tfdist.errors import TLSConfigError
        from tfdist.tls import diagnose

        message = diagnose(self._address, self._tls_ca, what="the shared queue", ca_setting="tls_ca",
                           server_settings="the queue's tls_cert and tls_key (security.tls_cert / tls_key, or "
                                           "--tls-cert / --tls-key)")
        if message:
            raise TLSConfigError(message)

    # -- consumer side -------------------------------------------------------------

    def element_spec(self, timeout: float | None = None) -> ElementSpec:
        """The element structure, waiting until a producer has defined it.

        Raises:
            SharedQueueError: still unknown after ``timeout`` (default ``timeout_s``).
        """
        if self._spec is None:
            wait = (self._timeout_s if timeout is None else timeout)
            deadline = time.monotonic() + wait
            while True:
                slice_s = max(0.0, min(self._timeout_s - 1.0, deadline - time.monotonic()))
                meta, _ = self._call("Describe", qp.DescribeRequest(slice_s))
                if meta["spec"] is not None:
                    self._spec = ElementSpec.from_dict(meta["spec"])
                    break
                if time.monotonic() >= deadline:
                    raise SharedQueueError(
                        f"The shared queue at {self._address} has no element structure yet "
                        f"(nothing enqueued within {wait:g} s). Start its producers, or "
                        "raise timeout."
                    )
        return self._spec

    def _count_holding(self, delta: int) -> None:
        with self._lock:
            self._holding += delta

    def _start_heartbeat(self) -> None:
        with self._lock:
            if self._heartbeat is not None:
                return
            self._heartbeat = threading.Thread(
                target=self._beat, name="shared-queue-heartbeat", daemon=True
            )
            self._heartbeat.start()

    def _beat(self) -> None:
        while not self._closed.wait(self._heartbeat_interval_s):
            if self._holding:
                try:
                    self._call("Ack", qp.AckRequest(self._worker), timeout=self._heartbeat_interval_s * 4)
                except Exception as e:  # noqa: BLE001 - the next dequeue reports it
                    logger.debug("heartbeat to %s failed: %s", self._address, e)

    def batches(self, batch_size: int) -> Iterator[Any]:
        """Yields numpy batches of one epoch (structured like the elements).

        Each batch is acknowledged when the next one is requested, or when
        the generator is closed. The generator ends at the end of the epoch.

        Raises:
            SharedQueueError: a producer failed (the message has its traceback).
            SharedQueueUnavailableError: the server stopped answering.
        """
        if not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
            raise ConfigError(f"batch_size must be a positive integer. Received: batch_size={batch_size!r}.")
        for arrays in self.batch_arrays(int(batch_size)):
            yield self._spec.pack(arrays)

    def batch_arrays(self, batch_size: int) -> Iterator[list]:
        """Like :meth:`batches`, but each batch is a list of arrays in spec order."""
        n = int(batch_size)
        spec = self.element_spec()
        self._start_heartbeat()
        epoch = None
        pending: list[int] = []
        try:
            while True:
                meta, tensors = self._call(
                    "Dequeue",
                    qp.DequeueRequest(self._worker, n, epoch, self._last_epoch, tuple(pending), self._poll_s),
                )
                self._count_holding(-len(pending))
                pending = []
                status = meta["status"]
                if meta.get("epoch") is not None:
                    epoch = meta["epoch"]
                if status == "end":
                    if epoch is not None:
                        self._last_epoch = max(self._last_epoch, epoch)
                    return
                if status == "retry":
                    continue
                self._count_holding(1)
                pending = [meta["batch_id"]]
                yield [tensors[name] for name in spec.names]
        finally:
            if pending:
                try:
                    self._call("Ack", qp.AckRequest(self._worker, tuple(pending)))
                    self._count_holding(-len(pending))
                except Exception as e:  # noqa: BLE001 - the lease will expire instead
                    logger.warning("could not acknowledge batch %s: %s", pending, e)

    def as_dataset(self, batch_size: int, *, prefetch: int | None = None):
        """A ``tf.data.Dataset`` of batches; each iteration is one epoch.

        Args:
            batch_size: examples per batch (the last batch of an epoch, and a
                re-delivered batch of a worker with another batch size, may
                differ).
            prefetch: ``Dataset.prefetch`` buffer. Defaults to ``None``: a
                batch is then acknowledged only when the next training step
                asks for data, so a worker that dies loses at most the batch
                it was training on, which is re-delivered. Batches in a
                prefetch buffer count as delivered.

        An iteration stopped before its epoch ended (``steps_per_epoch``, a
        ``break``) acknowledges what its pipeline fetched and leaves this
        worker in the same epoch; Keras's ``fit``/``evaluate`` under a
        strategy build the model from the element spec instead of reading a
        batch (see :mod:`tfdist.data.symbolic_build`).

        Example:
            >>> ds = SharedQueue(address).as_dataset(batch_size=64)
            >>> model.fit(ds, epochs=3)   # every worker sees 3 epochs end together
        """
        from tfdist.data.dataset import dataset_from_blocks

        spec = self.element_spec()
        n = int(batch_size)

        def make_blocks():
            for arrays in self.batch_arrays(n):
                yield [a[None] for a in arrays]  # a block of one batch

        return dataset_from_blocks(
            make_blocks,
            spec,
            batch_size=n,
            drop_remainder=False,
            prefetch=prefetch,
        )

    # -- producer side ---------------------------------------------------------------

    def enqueue(self, element: Any) -> None:
        """Adds one element (see :meth:`enqueue_many`)."""
        spec = ElementSpec.infer(element)
        self.enqueue_many(spec.pack([np.asarray(c)[None] for c in spec.flatten(element)]))

    def enqueue_many(self, batch: Any, timeout: float | None = None) -> None:
        """Adds a batch of elements to the producing epoch, waiting for room.

        Args:
            batch: a tensor, tuple or dict of arrays with a leading batch dimension.
            timeout: seconds to wait for room. Defaults to ``None`` (no bound).

        Raises:
            QueueClosedError: the queue is closed.
            SharedQueueError: the batch does not match the queue's elements.
        """
        spec = ElementSpec.infer(batch, batched=True)
        arrays = [np.ascontiguousarray(a) for a in spec.flatten(batch)]
        total = len(arrays[0])
        done = 0
        deadline = None if timeout is None else time.monotonic() + timeout
        while done < total:
            if deadline is not None and time.monotonic() >= deadline:
                raise QueueTimeoutError(
                    f"enqueue_many to {self._address} timed out after {timeout} s with "
                    f"{done} of {total} elements in (the queue stayed full).",
                    num_enqueued=done,
                )
            meta, _ = self._call(
                "Enqueue",
                qp.EnqueueRequest(tuple(spec.names), tuple(a[done:] for a in arrays), spec.structure, self._poll_s),
            )
            done += int(meta["enqueued"])

    def end_epoch(self) -> int:
        """Ends the producing epoch (producer side); returns its number."""
        meta, _ = self._call("EndEpoch", qp.EndEpochRequest())
        return int(meta["ended"])

    def close(self) -> None:
        """Closes the shared queue (producer side): no more data, ever."""
        self._call("Close", qp.CloseRequest())

    def stats(self) -> dict:
        """The server's per-worker and per-epoch counters."""
        meta, _ = self._call("Stats", qp.StatsRequest())
        return meta

    # -- lifetime ------------------------------------------------------------------

    def disconnect(self) -> None:
        """Stops the heartbeat and closes the channel (the queue stays open)."""
        self._closed.set()
        if self._heartbeat is not None:
            self._heartbeat.join(self._heartbeat_interval_s * 5)
        self._channel.close()

    def __enter__(self) -> "SharedQueue":
        return self

    def __exit__(self, *exc) -> None:
        self.disconnect()
