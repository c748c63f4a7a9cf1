"""LocalJob.check_servers: a PS or input task that exited fails the job, naming it (fake processes, no sockets)."""

import collections

import pytest

from tfdist.cluster.local import LocalJob
from tfdist.config import JobConfig, TaskSpec
from tfdist.errors import LaunchError


class FakeTask:
    """The part of a TaskProcess that LocalJob's watch loop reads: poll, describe_exit, tail, stop."""

    def __init__(self, job: str, index: int, code: int | None = None):
        self.task = TaskSpec(job, index)
        self.code = code
        self.tail = collections.deque([f"last line of {job}:{index}"])
        self.log_path = f"/logs/{job}-{index}.log"
        self.signals: list[int] = []

    def poll(self):
        return self.code

    @property
    def running(self):
        return self.code is None

    def describe_exit(self):
        return f"{self.task} exited with code {self.code}"

    def signal(self, sig):
        self.signals.append(sig)

    def stop(self, grace=5.0):
        if self.code is None:
            self.code = -15
        return self.code


def job_with(*tasks: FakeTask) -> LocalJob:
    config = JobConfig.from_dict({"cluster": {"ps": ["127.0.0.1:5001"], "input": ["127.0.0.1:5002"],
                                              "worker": ["127.0.0.1:5003"]}})
    job = LocalJob(config, script="train.py", log_dir="/logs", forward=False)
    job.tasks = {str(t.task): t for t in tasks}
    return job


def test_running_servers_pass():
    job = job_with(FakeTask("ps", 0), FakeTask("input", 0), FakeTask("worker", 0, code=1))  # a worker is not a server
    job.check_servers()
    job.check_servers(clean_exit_ok=True)


@pytest.mark.parametrize("job_name", ["ps", "input"])
def test_a_failed_server_stops_the_job_and_is_named(job_name):
    dead = FakeTask(job_name, 0, code=1)
    worker = FakeTask("worker", 0)
    job = job_with(FakeTask("ps" if job_name == "input" else "input", 0), dead, worker)
    with pytest.raises(LaunchError, match=rf"(?s)Task {job_name}:0 exited with code 1.*last line of {job_name}:0"):
        job.check_servers(clean_exit_ok=True)
    assert worker.signals and not worker.running  # every task was stopped


def test_a_clean_exit_fails_only_while_the_servers_must_run():
    job = job_with(FakeTask("ps", 0, code=0), FakeTask("worker", 0))
    job.check_servers(clean_exit_ok=True)  # a PS exits 0 by itself once every worker is done
    with pytest.raises(LaunchError, match="ps:0 exited with code 0"):
        job.check_servers()


# ------------------------------------------------------------------------------------ task counts, ports
def test_local_task_limit_counts_memory_and_open_files():
    from tfdist.cluster.local import local_task_limit

    gib = 2 ** 30
    assert local_task_limit(memory_bytes=4 * gib, open_files=100_000) == 16  # 256 MiB per task
    assert local_task_limit(memory_bytes=1024 * gib, open_files=1024) == (1024 - 64) // 8
    assert local_task_limit(memory_bytes=1, open_files=1) == 1


def test_a_local_launch_refuses_more_tasks_than_the_machine_can_run():
    from tfdist.cluster.local import check_local_task_count
    from tfdist.errors import ConfigError

    config = JobConfig.from_dict({"cluster": {"ps": 1, "worker": 5000}})
    with pytest.raises(ConfigError) as e:
        check_local_task_count(config, limit=64)
    message = str(e.value)
    assert "`cluster.worker`" in message and "cluster.worker=5000" in message and "at most 64" in message
    assert "--task" in message and len(message) < 600
    with pytest.raises(ConfigError, match="cluster.worker"):  # this machine cannot run 5001 tasks either
        LocalJob(config, script="train.py", log_dir="/logs", forward=False)
    check_local_task_count(JobConfig.from_dict({"cluster": {"ps": 2, "worker": 8}}), limit=10)
    elastic = JobConfig.from_dict({"cluster": {"ps": 1, "worker": 1}, "elastic": {"max_workers": 500}})
    with pytest.raises(ConfigError, match="elastic.max_workers"):
        check_local_task_count(elastic, limit=64)


def test_free_ports_are_distinct_and_picked_at_once():
    import time

    from tfdist.cluster.local import assign_ports, free_ports

    t0 = time.monotonic()
    ports = free_ports(300)
    assert len(set(ports)) == 300 and time.monotonic() - t0 < 5
    config = assign_ports(JobConfig.from_dict({"cluster": {"ps": 3, "worker": ["127.0.0.1:5000", "127.0.0.1:0", "127.0.0.1:0"]}}))
    addresses = config.cluster.ps + config.cluster.worker
    assert len(set(addresses)) == 6 and "127.0.0.1:5000" in addresses
    assert not any(a.endswith(":0") for a in addresses)
