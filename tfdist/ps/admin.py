"""The operators' link to a job's parameter servers: status, the elastic engine's controls, done workers.

The launcher (did a worker say it is done? workers that ended), the elastic
engine (counters, drain/undrain, the job's total work) and the evaluator
loop talk to the PS tasks through this client with typed requests and read
typed replies; none of them builds a request from a method name.

Importing this module does not import TensorFlow.
"""

from __future__ import annotations

from typing import Iterable

from tfdist import constants
from tfdist.ps.client import PSClient
from tfdist.ps.protocol import ControlRequest, DoneRequest, StatusRequest
from tfdist.ps.replies import ControlReply, StatusReply

__all__ = ["AdminClient"]


class AdminClient:
    """Typed administrative calls to a job's PS tasks.

    Args:
        addresses: ``host:port`` of PS task 0, 1, ... (or a subset: the first only, for a quick question).
        token: The job token.
        rpc_timeout_s: Deadline of each call. Defaults to the job default.
        max_message_bytes: Largest message. Defaults to the job default.
        tls_ca: PEM root certificate when the job uses TLS.
    """

    def __init__(self, addresses, token: str | None, rpc_timeout_s: float = constants.DEFAULT_RPC_TIMEOUT_S,
                 max_message_bytes: int = constants.DEFAULT_MAX_MESSAGE_BYTES, tls_ca: str | None = None):
        self.client = PSClient(addresses, token, rpc_timeout_s=rpc_timeout_s, max_message_bytes=max_message_bytes,
                               tls_ca=tls_ca, tune_malloc=False)

    @classmethod
    def for_job(cls, config, token: str | None, first_only: bool = False, rpc_timeout_s: float | None = None
                ) -> "AdminClient":
        """The client of a :class:`~tfdist.config.JobConfig`'s PS tasks (``first_only``: task 0 alone)."""
        addresses = config.cluster.ps[:1] if first_only else config.cluster.ps
        return cls(addresses, token, rpc_timeout_s=config.ps.rpc_timeout_s if rpc_timeout_s is None else rpc_timeout_s,
                   max_message_bytes=config.ps.max_message_bytes, tls_ca=config.security.tls_ca)

    def wait_ready(self, timeout: float) -> None:
        """Waits until every PS task accepts connections (``PSUnavailableError`` after ``timeout`` s)."""
        self.client.wait_ready(timeout)

    def status(self, ps: int = 0, brief: bool = True, timeout: float | None = None) -> StatusReply:
        """One task's ``Status`` (``brief``: without the per-variable specs)."""
        return self.client.request(ps, StatusRequest(brief), timeout)

    def statuses(self, brief: bool = True, timeout: float | None = None) -> list[StatusReply]:
        """Every task's ``Status``, in task order."""
        replies = self.client.request_all(StatusRequest(brief), timeout)
        return [replies[ps] for ps in range(self.client.num_ps)]

    def control(self, drain: Iterable[int] | None = None, undrain: Iterable[int] | None = None,
                gone: Iterable[int] | None = None, total_batches: int | None = None,
                timeout: float | None = None) -> list[ControlReply]:
        """The elastic engine's ``Control`` to every task: drain, undrain, workers gone, the job's total work."""
        def ids(workers):
            return None if workers is None else frozenset(int(w) for w in workers)

        request = ControlRequest(ids(drain), ids(undrain), ids(gone), total_batches)
        replies = self.client.request_all(request, timeout)
        return [replies[ps] for ps in range(self.client.num_ps)]

    def done(self, worker: int, timeout: float | None = None, parallel: bool = True) -> None:
        """Tells every task that ``worker`` finished (it counts towards the tasks' exit)."""
        self.client.request_all(DoneRequest(worker), timeout, parallel=parallel)

    def close(self) -> None:
        self.client.close()

    def __enter__(self) -> "AdminClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
