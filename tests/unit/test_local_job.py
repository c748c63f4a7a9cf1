"""LocalJob.check_servers: a PS or input task that exited fails the job, naming it (fake processes, no sockets)."""

import collections
import os

import pytest

from tfdist.cluster.local import LocalJob
from tfdist.config import JobConfig, TaskSpec
from tfdist.errors import ConfigError, LaunchError


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


# ------------------------------------------------------------------------ launch.on_worker_failure
from tfdist.cluster.failure import FailureAction, decide_worker_failure  # noqa: E402


def _config(consistency="async", workers=2, chief=0, policy="auto", ps=1, **strategy):
    return JobConfig.from_dict({"cluster": {"ps": ps, "chief": chief, "worker": workers},
                                "strategy": {"consistency": consistency, **strategy},
                                "launch": {"on_worker_failure": policy}})


@pytest.mark.parametrize("consistency", ["async", "ssp", "dtssp", "bsp"])
def test_auto_goes_on_without_a_non_chief_worker_where_the_mode_allows(consistency):
    config = _config(consistency, workers=3)
    for worker in (1, 2):
        decision = decide_worker_failure(config, worker)
        assert decision.action is FailureAction.CONTINUE and not decision.stop, decision
    assert decide_worker_failure(config, 2, failed=[1]).action is FailureAction.CONTINUE


@pytest.mark.parametrize("policy", ["auto", "continue", "stop"])
def test_the_chief_always_stops_the_job(policy):
    for config in (_config(policy=policy), _config(policy=policy, chief=1)):
        decision = decide_worker_failure(config, 0)
        assert decision.stop and "chief" in decision.reason, decision


def test_sync_replicas_goes_on_while_m_workers_remain():
    config = _config("sync_replicas", workers=4, replicas_to_aggregate=2)
    assert not decide_worker_failure(config, 3).stop
    assert not decide_worker_failure(config, 2, failed=[3]).stop  # 2 remain: still M
    decision = decide_worker_failure(config, 1, failed=[3, 2])  # 1 would remain
    assert decision.stop and "strategy.replicas_to_aggregate" in decision.reason and "1 worker" in decision.reason
    every = _config("sync_replicas", workers=3)  # M defaults to all workers: none may go
    assert decide_worker_failure(every, 2).stop


def test_continue_and_stop_override_the_mode():
    strict = _config("sync_replicas", workers=3, policy="continue")
    assert decide_worker_failure(strict, 2).action is FailureAction.CONTINUE
    decision = decide_worker_failure(_config("async", policy="stop"), 1)
    assert decision.stop and "launch.on_worker_failure" in decision.reason


def test_an_all_reduce_job_stops_under_auto():
    decision = decide_worker_failure(_config("async", ps=0), 1)
    assert decision.stop and "parameter server" in decision.reason
    assert not decide_worker_failure(_config("async", ps=0, policy="continue"), 1).stop


def test_elastic_jobs_go_on_under_auto_and_stop_when_asked():
    def elastic(policy):
        return JobConfig.from_dict({"cluster": {"ps": 1, "worker": 3}, "launch": {"on_worker_failure": policy},
                                    "elastic": {"min_workers": 1, "max_workers": 3, "autoscale": False}})

    for worker in (0, 1, 2):  # the engine replaces or does without any worker, worker 0 included
        assert decide_worker_failure(elastic("auto"), worker).action is FailureAction.CONTINUE
    assert decide_worker_failure(elastic("stop"), 1).stop


def job_of(config, *tasks):
    job = LocalJob(config, script="train.py", log_dir="/logs", forward=False)
    job.tasks = {str(t.task): t for t in tasks}
    job.reported_gone = []
    job._said_done = lambda worker: False  # what a PS task answers for a worker that did not say Done
    job.report_gone = job.reported_gone.extend
    return job


def test_wait_goes_on_without_a_dead_worker_and_succeeds_with_the_chief(caplog):
    config = _config("async", workers=3)
    w0, w1, w2, ps = FakeTask("worker", 0, code=0), FakeTask("worker", 1, code=3), FakeTask("worker", 2, code=0), \
        FakeTask("ps", 0)
    job = job_of(config, ps, w0, w1, w2)
    with caplog.at_level("WARNING"):
        job.wait(timeout=5, poll_s=0.01)
    assert job.reported_gone == [1]  # the PS stops waiting for it at once, as the elastic engine does
    assert [str(t) for t in job.failed_workers] == ["worker:1"]
    assert "worker:1 exited with code 3" in caplog.text and "launch.on_worker_failure" in caplog.text
    assert not ps.signals  # nothing was stopped by wait(); the caller stops the servers


def test_wait_stops_the_job_for_a_worker_the_mode_needs():
    config = _config("sync_replicas", workers=2)
    w0, w1 = FakeTask("worker", 0), FakeTask("worker", 1, code=-9)
    job = job_of(config, FakeTask("ps", 0), w0, w1)
    with pytest.raises(LaunchError, match=r"(?s)worker:1 exited with code -9.*replicas_to_aggregate.*stopped the other"):
        job.wait(timeout=5, poll_s=0.01)
    assert w0.signals and not w0.running


def test_wait_stops_the_job_when_the_chief_dies_after_a_tolerated_worker():
    config = _config("async", workers=3)
    config.launch.restart_chief = False  # restarting it would start train.py for real
    w0, w1, w2 = FakeTask("worker", 0), FakeTask("worker", 1, code=1), FakeTask("worker", 2)
    job = job_of(config, FakeTask("ps", 0), w0, w1, w2)
    w0.code = 2
    with pytest.raises(LaunchError, match=r"(?s)worker:0 exited with code 2.*chief"):
        job.wait(timeout=5, poll_s=0.01)


# ------------------------------------------------------------------------ launch.restart_chief
from tfdist.cluster.failure import decide_chief_restart  # noqa: E402


@pytest.mark.parametrize("code", [-9, -11, -6, 137, 143])
def test_a_killed_chief_is_restarted(code):
    decision = decide_chief_restart(_config(), code, said_done=False, restarts=0)
    assert decision.restart and "killed" in decision.reason, decision


@pytest.mark.parametrize("code", [1, 2, 3, 127])
def test_a_chief_that_ended_with_an_error_is_not_restarted_and_says_why(code):
    decision = decide_chief_restart(_config(), code, said_done=False, restarts=0)
    assert not decision.restart
    assert f"exit code {code}" in decision.reason and "Python exception" in decision.reason
    assert "launch.restart_chief" in decision.reason


def test_a_chief_is_not_restarted_when_done_past_its_restarts_or_where_it_cannot_rejoin():
    assert "finished" in decide_chief_restart(_config(), -9, said_done=True, restarts=0).reason
    past = decide_chief_restart(_config(), -9, said_done=False, restarts=3)
    assert not past.restart and "launch.max_restarts=3" in past.reason
    off = JobConfig.from_dict({"cluster": {"ps": 1, "worker": 2}, "launch": {"restart_chief": False}})
    assert not decide_chief_restart(off, -9, False, 0).restart
    assert not decide_chief_restart(_config(ps=0), -9, False, 0).restart
    elastic = JobConfig.from_dict({"cluster": {"ps": 1, "worker": 2}, "elastic": {"min_workers": 1, "max_workers": 2}})
    assert not decide_chief_restart(elastic, -9, False, 0).restart


def test_wait_stops_the_job_for_a_chief_that_raised_and_says_why_it_was_not_restarted():
    w0, w1 = FakeTask("worker", 0, code=1), FakeTask("worker", 1)
    job = job_of(_config(), FakeTask("ps", 0), w0, w1)
    with pytest.raises(LaunchError, match=r"(?s)worker:0 exited with code 1.*not restarted: it ended by itself"):
        job.wait(timeout=5, poll_s=0.01)
    assert job.restarts == {} and w1.signals


def test_wait_names_the_setting_whose_time_ran_out():
    job = job_of(_config(), FakeTask("ps", 0), FakeTask("worker", 0), FakeTask("worker", 1))
    with pytest.raises(LaunchError, match=r"within 0.05 s \(--timeout\)"):
        job.wait(timeout=0.05, poll_s=0.01, timeout_setting="--timeout")


def test_a_job_that_stops_making_progress_fails_long_before_its_timeout():
    workers = FakeTask("worker", 0), FakeTask("worker", 1)
    job = job_of(_config(), FakeTask("ps", 0), *workers)
    polls = []

    def progress():  # two results, then nothing more
        polls.append(1)
        return min(len(polls), 2)

    with pytest.raises(LaunchError, match=r"no progress for 0.05 s \(progress stayed at 2\)"):
        job.wait(timeout=60, poll_s=0.01, progress=progress, stall_s=0.05)
    assert len(polls) < 100  # well before the 60 s timeout
    assert all(w.signals and not w.running for w in workers)  # every task was stopped


def test_a_job_that_keeps_making_progress_runs_past_the_stall_bound():
    w0, w1 = FakeTask("worker", 0), FakeTask("worker", 1)
    job = job_of(_config(), FakeTask("ps", 0), w0, w1)
    polls = []

    def progress():  # a result at every poll; the workers finish after 30 polls (0.3 s, six stall bounds)
        polls.append(1)
        if len(polls) == 30:
            w0.code = w1.code = 0
        return len(polls)

    job.wait(timeout=60, poll_s=0.01, progress=progress, stall_s=0.05)
    assert len(polls) >= 30


def test_progress_and_stall_go_together():
    job = job_of(_config(), FakeTask("ps", 0), FakeTask("worker", 0, code=0))
    with pytest.raises(ValueError, match="go together"):
        job.wait(timeout=5, progress=lambda: 0)

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
    from tfdist.cluster.local import assign_ports, free_ports

    ports = free_ports(300)
    assert len(set(ports)) == 300
    config = assign_ports(JobConfig.from_dict({"cluster": {"ps": 3, "worker": ["127.0.0.1:5000", "127.0.0.1:0",
                                                                                  "127.0.0.1:0"]}}))
    addresses = config.cluster.ps + config.cluster.worker
    assert len(set(addresses)) == 6 and "127.0.0.1:5000" in addresses
    assert not any(a.endswith(":0") for a in addresses)


def test_free_ports_come_from_below_the_ephemeral_range_where_no_outgoing_connection_takes_them(monkeypatch):
    from tfdist.cluster import local

    monkeypatch.delenv(local.ENV_LISTEN_PORTS, raising=False)  # (an xdist worker has a slice: tests/conftest.py)
    span = local.listen_port_range()
    with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
        low, high = (int(x) for x in f.read().split())
    if low - local.LISTEN_PORT_MIN < 1000:
        pytest.skip(f"this machine's ephemeral range starts at {low}: nothing below it to pick from")
    assert span == (local.LISTEN_PORT_MIN, low)
    ports = local.free_ports(50)
    assert len(set(ports)) == 50 and all(local.LISTEN_PORT_MIN <= p < low for p in ports), ports
    assert local.LISTEN_PORT_MIN <= local.free_port() < low


def test_tfdist_listen_ports_confines_the_picks_and_a_malformed_value_is_refused(monkeypatch):
    """TFDIST_LISTEN_PORTS=LOW-HIGH: every pick in [LOW, HIGH) (the suite gives each xdist worker its own slice,
    so two workers never pick the same port); a value that is not such a range is a LaunchError naming it."""
    from tfdist.cluster import local
    from tfdist.errors import LaunchError

    monkeypatch.setenv(local.ENV_LISTEN_PORTS, "23000-23200")
    assert local.listen_port_range() == (23000, 23200)
    ports = local.free_ports(20)
    assert len(set(ports)) == 20 and all(23000 <= p < 23200 for p in ports), ports
    for bad in ("23000", "a-b", "23200-23000", "23000-23050", "80-2000", "60000-70000"):
        monkeypatch.setenv(local.ENV_LISTEN_PORTS, bad)
        with pytest.raises(LaunchError, match="TFDIST_LISTEN_PORTS=.*LOW-HIGH"):
            local.free_ports(1)
    if os.environ.get("PYTEST_XDIST_WORKER_COUNT", "").isdigit():  # this run's own slice (tests/conftest.py)
        monkeypatch.undo()
        low, high = local.listen_port_range()
        assert high - low >= 100


def test_free_ports_skip_a_port_in_use_and_fall_back_to_the_kernel(monkeypatch, tmp_path):
    import socket

    from tfdist.cluster import local

    monkeypatch.delenv(local.ENV_LISTEN_PORTS, raising=False)
    if local.listen_port_range() is None:
        pytest.skip("no room below this machine's ephemeral range")
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    taken = busy.getsockname()[1]
    free = local.free_port()

    class Candidates:  # the first candidate is a listening port, the second one free
        def __init__(self):
            self.left = [taken, free]

        def randrange(self, start, stop):
            return self.left.pop(0)

    try:
        monkeypatch.setattr(local.random, "SystemRandom", Candidates)
        assert local.free_ports(1) == [free]
    finally:
        busy.close()
    monkeypatch.setattr(local, "_EPHEMERAL_RANGE_FILE", str(tmp_path / "missing"))  # not Linux: the kernel picks
    assert local.listen_port_range() is None
    ports = local.free_ports(3)
    assert len(set(ports)) == 3 and all(p > 0 for p in ports)


# ------------------------------------------------------------------ deterministic failures, a finished job
def test_wait_never_restarts_a_task_that_exited_with_the_config_error_code():
    from tfdist.errors import TaskConfigError
    from tfdist.exit_status import EXIT_CONFIG_ERROR

    config = _config("async", workers=2)  # launch.restart_chief and restart_ps are on
    w0, w1 = FakeTask("worker", 0, code=EXIT_CONFIG_ERROR), FakeTask("worker", 1)
    job = job_of(config, FakeTask("ps", 0), w0, w1)
    job.start_task = lambda task: pytest.fail(f"{task} was restarted")
    with pytest.raises(TaskConfigError, match=r"(?s)worker:0 exited with code 78 .*ConfigError.*not restarted"):
        job.wait(timeout=5, poll_s=0.01)
    assert w1.signals and not w1.running
    assert job.restarts == {}


@pytest.mark.parametrize("job_name", ["ps", "worker"])
def test_wait_never_restarts_a_config_error_of_any_task(job_name):
    from tfdist.errors import TaskConfigError

    config = _config("async", workers=1)
    tasks = {"ps": FakeTask("ps", 0), "worker": FakeTask("worker", 0)}
    tasks[job_name].code = 78
    job = job_of(config, *tasks.values())
    job.start_task = lambda task: pytest.fail(f"{task} was restarted")
    with pytest.raises(TaskConfigError, match=f"{job_name}:0 exited with code 78"):
        job.wait(timeout=5, poll_s=0.01)


def test_a_chief_that_fails_after_the_ps_tasks_ended_the_job_counts_as_finished(caplog):
    config = _config("async", workers=2)
    ps, w0, w1 = FakeTask("ps", 0, code=0), FakeTask("worker", 0, code=1), FakeTask("worker", 1, code=0)
    job = job_of(config, ps, w0, w1)
    job.start_task = lambda task: pytest.fail(f"{task} was restarted")
    with caplog.at_level("WARNING"):
        job.wait(timeout=5, poll_s=0.01)
    assert [str(t) for t in job.finished_with_error] == ["worker:0"]
    assert "after its training finished (the parameter servers had ended the job" in caplog.text


class EndingTask(FakeTask):
    """A PS task ending the job: it still runs for its first ``polls`` polls, then exits 0."""

    def __init__(self, job, index, polls):
        super().__init__(job, index)
        self.polls = polls

    def poll(self):
        self.polls -= 1
        if self.polls < 0:
            self.code = 0
        return self.code


def test_a_chief_failing_while_the_ps_tasks_end_the_job_counts_as_finished(caplog):
    """The PS tasks no longer answer (they are ending the job) but have not exited yet: the launcher waits for them
    (bounded) before it counts the chief's exit as a failure (seen under load with TFDIST_FAST_START=0)."""
    config = _config("async", workers=2)
    ps, w0, w1 = EndingTask("ps", 0, polls=5), FakeTask("worker", 0, code=1), FakeTask("worker", 1, code=0)
    job = job_of(config, ps, w0, w1)
    job._said_done = lambda worker: None  # no PS task answers
    job.start_task = lambda task: pytest.fail(f"{task} was restarted")
    with caplog.at_level("WARNING"):
        job.wait(timeout=5, poll_s=0.01)
    assert [str(t) for t in job.finished_with_error] == ["worker:0"]
    assert "after its training finished (the parameter servers had ended the job" in caplog.text


def test_a_worker_that_said_done_and_then_failed_is_not_restarted_while_the_others_train(caplog):
    config = _config("async", workers=2)
    ps, w0, w1 = FakeTask("ps", 0), FakeTask("worker", 0, code=1), FakeTask("worker", 1)
    job = job_of(config, ps, w0, w1)
    job._said_done = lambda worker: worker == 0  # what ps:0's Status answers: done_workers [0]
    job.start_task = lambda task: pytest.fail(f"{task} was restarted")
    finished = []
    job.stop = lambda grace=5.0: finished.append("stopped")
    w1.code = 0  # the other worker ends; the job ends with it
    with caplog.at_level("WARNING"):
        job.wait(timeout=5, poll_s=0.01)
    assert [str(t) for t in job.finished_with_error] == ["worker:0"]
    assert "it had told the parameter servers it was done" in caplog.text


def test_a_chief_killed_before_saying_done_is_restarted():
    config = _config("async", workers=2)
    ps, w0, w1 = FakeTask("ps", 0), FakeTask("worker", 0, code=-9), FakeTask("worker", 1, code=0)
    job = job_of(config, ps, w0, w1)
    job._said_done = lambda worker: False
    started = []

    def start_task(task):
        started.append(str(task))
        job.tasks[str(task)] = FakeTask(task.job, task.index, code=0)  # the new incarnation ends cleanly

    job.start_task = start_task
    job.wait(timeout=5, poll_s=0.01)
    assert started == ["worker:0"] and job.restarts == {"worker:0": 1}


def test_a_fixed_stream_port_is_refused_for_a_local_launch_of_several_ps_tasks():
    """Each PS task would bind the same port on this machine: refused before anything starts, saying what to do."""
    from tfdist.cluster.local import check_local_stream_port

    def config(ps, **fields):
        return JobConfig.from_dict({"cluster": {"ps": ps, "worker": 1}, "ps": fields})

    with pytest.raises(ConfigError, match=r"`ps.stream_port`.*all 2 PS tasks on this machine.*null"):
        check_local_stream_port(config(2, stream_port=2223))
    check_local_stream_port(config(1, stream_port=2223))  # one PS task: its port
    check_local_stream_port(config(2, stream_port=2223, transport="grpc"))  # no stream at all
    check_local_stream_port(config(2))  # free ports
