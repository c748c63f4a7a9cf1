"""Who is in the worker group and where its collective servers listen (pure, no TF).

**Address scheme.** The collective group is the job's training tasks (the
chief, if any, then the workers: worker id order). Each task's collective
server listens, in order of precedence, on:

1. the address given explicitly (``addresses=[...]``, worker-id order);
2. the JSON list in ``TFDIST_COLLECTIVE_ADDRESSES``;
3. the task's own address in the cluster (``TF_CONFIG``), its port shifted
   by ``port_offset`` (default 0).

Rule 3 is TF's own convention — a task's address in the cluster is where its
TF server listens — and needs nothing from the launcher: tfdist's training
tasks bind no port of their own today (they are gRPC *clients* of the PS),
and the local launcher already gives every task a free port. A component
that later binds a worker's address itself must move the collective servers
with ``port_offset`` or explicit addresses.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from typing import Mapping, Sequence

from tfdist.collective.errors import CollectiveSetupError

__all__ = ["GroupMember", "GroupSpec", "resolve_group", "peers_in_message", "ENV_COLLECTIVE_ADDRESSES"]

#: JSON list of ``host:port``, one per training task in worker-id order (move to tfdist.constants).
from tfdist.constants import ENV_COLLECTIVE_ADDRESSES  # noqa: E402  (re-exported)
TRAINING_JOBS = ("chief", "worker")
_TASK_RE = re.compile(r"/job:(\w+)/(?:replica:\d+/)?task:(\d+)")


@dataclass(frozen=True)
class GroupMember:
    """One task of the group: its worker id, TF job/index and collective address."""

    worker_id: int
    job: str
    index: int
    address: str

    @property
    def device(self) -> str:
        return f"/job:{self.job}/replica:0/task:{self.index}/device:CPU:0"


@dataclass(frozen=True)
class GroupSpec:
    """The resolved group as seen from one task.

    Attributes:
        members: Every training task, in worker-id order.
        worker_id: This task's worker id.
    """

    members: tuple[GroupMember, ...]
    worker_id: int

    @property
    def size(self) -> int:
        return len(self.members)

    @property
    def me(self) -> GroupMember:
        return self.members[self.worker_id]

    @property
    def leader(self) -> str:
        """Device string of the collective leader (worker id 0)."""
        m = self.members[0]
        return f"/job:{m.job}/replica:0/task:{m.index}"

    def jobs(self) -> dict[str, list[str]]:
        """``{job: [address, ...]}`` of the group (the TF cluster of the collective servers)."""
        out: dict[str, list[str]] = {}
        for m in self.members:
            out.setdefault(m.job, []).append(m.address)
        return out

    def worker_of(self, job: str, index: int) -> int | None:
        for m in self.members:
            if m.job == job and m.index == index:
                return m.worker_id
        return None


def _shift(address: str, offset: int) -> str:
    host, _, port = address.rpartition(":")
    new = int(port) + offset
    if not 0 < new < 65536:
        raise CollectiveSetupError(
            f"port_offset={offset} moves {address} outside 1..65535. Choose a smaller `port_offset`."
        )
    return f"{host}:{new}"


def resolve_group(
    jobs: Mapping[str, Sequence[str]],
    job: str,
    index: int,
    addresses: Sequence[str] | None = None,
    port_offset: int = 0,
    environ: Mapping[str, str] | None = None,
) -> GroupSpec:
    """Resolves the group from a cluster (``{job: [addresses]}``) and this task.

    Args:
        jobs: The job's cluster, as in ``TF_CONFIG["cluster"]``.
        job: This task's job (``"chief"`` or ``"worker"``).
        index: This task's index.
        addresses: Collective addresses in worker-id order. Defaults to the
            environment, then the cluster addresses shifted by ``port_offset``.
        port_offset: Added to each cluster port when no address is given.
        environ: Environment to read. Defaults to ``os.environ``.

    Raises:
        CollectiveSetupError: this task is not a training task, an address is
            malformed or used twice, or the number of addresses is wrong.
    """
    environ = os.environ if environ is None else environ
    tasks = [(j, i, a) for j in TRAINING_JOBS for i, a in enumerate(jobs.get(j, ()))]
    if not tasks:
        raise CollectiveSetupError(f"The cluster has no chief or worker task. Received: cluster={dict(jobs)!r}.")
    ids = {(j, i): w for w, (j, i, _) in enumerate(tasks)}
    if (job, index) not in ids:
        raise CollectiveSetupError(
            f"Task {job}:{index} is not a training task; only chief and worker tasks join the collective "
            f"group. Training tasks: {[f'{j}:{i}' for j, i, _ in tasks]}."
        )
    source = "addresses"
    if addresses is None and environ.get(ENV_COLLECTIVE_ADDRESSES):
        source = ENV_COLLECTIVE_ADDRESSES
        try:
            addresses = json.loads(environ[ENV_COLLECTIVE_ADDRESSES])
        except ValueError as e:
            raise CollectiveSetupError(
                f"{ENV_COLLECTIVE_ADDRESSES} is not a JSON list: {e}. "
                f"Received: {environ[ENV_COLLECTIVE_ADDRESSES]!r}."
            ) from e
    if addresses is None:
        addresses = [_shift(a, port_offset) if port_offset else a for _, _, a in tasks]
        source = "cluster"
    addresses = list(addresses)
    if len(addresses) != len(tasks):
        raise CollectiveSetupError(
            f"Give one collective address per training task ({len(tasks)}: "
            f"{[f'{j}:{i}' for j, i, _ in tasks]}). Received from {source}: {addresses!r}."
        )
    for a in addresses:
        host, _, port = str(a).rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise CollectiveSetupError(
                f'Collective addresses are "host:port" with a port in 1..65535. Received from {source}: {a!r}. '
                "A cluster still at 127.0.0.1:0 needs real ports: start it with `python -m tfdist.launch`."
            )
    if len(set(addresses)) != len(addresses):
        raise CollectiveSetupError(f"Collective addresses must differ. Received from {source}: {addresses!r}.")
    members = tuple(GroupMember(w, j, i, addresses[w]) for w, (j, i, _) in enumerate(tasks))
    return GroupSpec(members=members, worker_id=ids[(job, index)])


def peers_in_message(message: str, spec: GroupSpec) -> tuple[int, ...]:
    """Worker ids of the other tasks a TF error message names (dead or unreachable peers).

    >>> spec = resolve_group({"worker": ["h:1", "h:2", "h:3"]}, "worker", 0)
    >>> peers_in_message("from remote target /job:worker/replica:0/task:2 while calling RecvBuf", spec)
    (2,)
    """
    found = []
    for job, index in _TASK_RE.findall(message or ""):
        w = spec.worker_of(job, int(index))
        if w is not None and w != spec.worker_id and w not in found:
            found.append(w)
    return tuple(found)
