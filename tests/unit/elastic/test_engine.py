"""ElasticEngine's bookkeeping with a dry-run actuator and a simulated PS (fake clock; no processes).

The simulated PS stands in for the counters a real PS reports (``Status``):
each running worker sends batches at a scripted rate once its warm-up is
over, the PS applies at most ``cap`` batches/s, and drained workers leave at
their next batch. Real processes are covered by tests/integration/test_elastic.py.
"""

import pytest

from tfdist import constants
from tfdist.config import JobConfig
from tfdist.elastic.actuators import DryRunActuator
from tfdist.elastic.engine import ElasticEngine


class Clock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self):
        return self.t


class SimulatedPS:
    """PS counters for a scripted cluster: ``rate(worker)`` batches/s per worker, ``cap`` in total."""

    def __init__(self, clock, actuator, rate, cap=float("inf"), warmup_s=3.0):
        self.clock, self.actuator, self.rate, self.cap, self.warmup_s = clock, actuator, rate, cap, warmup_s
        self.batches: dict[int, float] = {}
        self.started: dict[int, float] = {}
        self.progress = 0.0
        self.total = None
        self.draining: set[int] = set()
        self.gone: list[int] = []
        self.drained_at: dict[int, float] = {}

    def advance(self, seconds):
        self.clock.t += seconds
        for w in self.actuator.running():
            self.started.setdefault(w, self.clock.t - seconds)
        running = [w for w in self.actuator.running() if self.clock.t - self.started[w] >= self.warmup_s]
        wanted = {w: self.rate(w) * seconds for w in running}
        scale = min(1.0, self.cap * seconds / max(sum(wanted.values()), 1e-9))
        for w, n in wanted.items():
            self.batches[w] = self.batches.get(w, 0.0) + n * scale
            self.progress += n * scale
        for w in list(self.draining):
            self.actuator.end(w, 0)
            self.draining.discard(w)
            self.started.pop(w, None)
        if self.total is not None and self.progress >= self.total:
            for w in self.actuator.running():
                self.actuator.end(w, 0)

    def status(self):
        return {"initialized": True, "worker_batches": {str(w): int(n) for w, n in self.batches.items()},
                "progress": int(self.progress),
                "total_batches": self.total, "job_done": self.total is not None and self.progress >= self.total}

    def control(self, drain=None, total_batches=None, gone=None, undrain=None):
        self.draining |= set(drain or ())
        for w in drain or ():
            self.drained_at.setdefault(w, self.clock())
        if total_batches is not None:
            self.total = total_batches
        self.gone += list(gone or ())


def make(elastic, rate, cap=float("inf")):
    clock = Clock()
    config = JobConfig.from_dict({"cluster": {"ps": 1, "worker": 1}, "elastic": elastic})
    actuator = DryRunActuator(clock)
    ps = SimulatedPS(clock, actuator, rate, cap)
    engine = ElasticEngine(config, actuator, ps, clock=clock)
    engine.start()
    return engine, ps, actuator


def drive(engine, ps, seconds, step=0.5):
    for _ in range(int(seconds / step)):
        ps.advance(step)
        if not engine.poll():
            return False
    return True


def test_grows_while_throughput_scales_and_returns_to_the_knee():
    engine, ps, actuator = make({"max_workers": 6, "interval_batches": 20, "min_samples": 2, "warmup_batches": 2,
                                 "replace_stragglers": False}, rate=lambda w: 10.0, cap=31.0)
    drive(engine, ps, 120)
    assert engine.scaling.settled and engine.scaling.settled_size == 3  # 10, 20, 30, then 31: s = 0.03
    starts = [c for c in actuator.calls if c.method == "start"]
    assert [c.worker for c in starts] == [0, 1, 2, 3]
    assert starts[0].env[constants.ENV_WARMUP_BATCHES] == "0"  # the first worker has nothing to join
    assert all(c.env[constants.ENV_WARMUP_BATCHES] == "2" for c in starts[1:])
    assert actuator.running() == {0, 1, 2}  # worker 3 was drained (newest first), not killed
    assert [d["kind"] for d in engine.decisions if d["kind"] in ("scale_up", "scale_down")] == \
        ["scale_up", "scale_up", "scale_up", "scale_down"]
    # windows are measured only at stable sizes: every timeline row has one size and no warm-up in it
    assert {row["workers"] for row in engine.timeline} == {1, 2, 3, 4}
    assert engine.result().settled_s is not None


def test_no_window_closes_while_a_worker_warms_up():
    engine, ps, actuator = make({"max_workers": 2, "interval_batches": 5, "min_samples": 1, "replace_stragglers": False},
                                rate=lambda w: 10.0)
    drive(engine, ps, 6)  # worker 0 measured; worker 1 is started
    assert 1 in actuator.running()
    rows = len(engine.timeline)
    ps.warmup_s = 1e9  # worker 1 never finishes warming up
    drive(engine, ps, 20)
    assert len(engine.timeline) == rows  # worker 0 alone keeps training, but no window is mixed with a joiner


def test_crash_is_reported_to_the_ps_and_the_size_is_restored_while_autoscaling():
    engine, ps, actuator = make({"max_workers": 2, "initial_workers": 2, "interval_batches": 10,
                                 "replace_stragglers": False}, rate=lambda w: 10.0)
    drive(engine, ps, 4)
    actuator.end(1, -9)  # worker 1 crashes
    drive(engine, ps, 1)
    assert ps.gone == [1]
    crash = [d for d in engine.decisions if d["kind"] == "crash"]
    assert crash and crash[0]["worker"] == 1
    assert [d for d in engine.decisions if d["kind"] == "restart"]
    assert len(actuator.running()) == 2


def test_crash_without_autoscaling_just_drops_the_worker():
    engine, ps, actuator = make({"max_workers": 2, "initial_workers": 2, "autoscale": False,
                                 "replace_stragglers": False}, rate=lambda w: 10.0)
    drive(engine, ps, 4)
    actuator.end(1, 1)
    drive(engine, ps, 2)
    assert ps.gone == [1] and actuator.running() == {0}
    assert not [d for d in engine.decisions if d["kind"] == "restart"]


def test_a_crash_stops_the_elastic_job_under_on_worker_failure_stop():
    """One rule for every job (tfdist.cluster.failure): auto goes on without the worker, stop stops."""
    from tfdist.errors import LaunchError

    clock = Clock()
    config = JobConfig.from_dict({"cluster": {"ps": 1, "worker": 2}, "launch": {"on_worker_failure": "stop"},
                                  "elastic": {"max_workers": 2, "initial_workers": 2, "autoscale": False,
                                              "replace_stragglers": False}})
    actuator = DryRunActuator(clock)
    ps = SimulatedPS(clock, actuator, lambda w: 10.0)
    engine = ElasticEngine(config, actuator, ps, clock=clock)
    engine.start()
    drive(engine, ps, 2)
    actuator.end(1, 3)
    with pytest.raises(LaunchError, match=r"Worker 1 crashed \(exit 3\); launch.on_worker_failure=stop"):
        engine.poll()


def test_persistent_straggler_gets_a_spare_and_is_drained_only_after_the_spare_joined():
    engine, ps, actuator = make({"max_workers": 4, "initial_workers": 3, "autoscale": False, "interval_batches": 10,
                                 "max_spares": 1}, rate=lambda w: 2.0 if w == 1 else 10.0)
    drive(engine, ps, 60)
    spare = [d for d in engine.decisions if d["kind"] == "spare"]
    assert len(spare) == 1 and spare[0]["action"]["worker"] == 1
    new = spare[0]["spare"]
    joined = [d for d in engine.decisions if d["kind"] == "join" and d["worker"] == new]
    assert joined and 1 in ps.drained_at and engine.started_at + joined[0]["t"] <= ps.drained_at[1]
    assert list(ps.drained_at) == [1]  # no one else was drained
    assert actuator.running() == {0, 2, new}


def test_job_done_stops_workers_that_do_not_leave():
    engine, ps, actuator = make({"max_workers": 1, "autoscale": False, "total_batches": 40, "drain_timeout_s": 5,
                                 "replace_stragglers": False}, rate=lambda w: 10.0)
    ps.advance = _never_end(ps.advance, ps)  # a worker script without ElasticCallback keeps training
    assert not drive(engine, ps, 30)
    assert [c.method for c in actuator.calls] == ["start", "stop"]
    assert engine.exits[0] == [-15]


def _never_end(advance, ps):
    def wrapped(seconds):
        total, ps.total = ps.total, None
        advance(seconds)
        ps.total = total

    return wrapped


def test_engine_config_errors_name_the_field():
    from tfdist.errors import ConfigError

    with pytest.raises(ConfigError, match="elastic.initial_workers"):
        JobConfig.from_dict({"elastic": {"min_workers": 2, "max_workers": 4, "initial_workers": 5}})
    with pytest.raises(ConfigError, match="elastic.utility"):
        JobConfig.from_dict({"elastic": {"utility": {"kind": "quadratic"}}})


def test_a_worker_that_crashes_before_the_job_started_is_restarted_a_bounded_number_of_times():
    from tfdist.errors import LaunchError

    engine, ps, actuator = make({"max_workers": 2, "initial_workers": 2, "autoscale": False,
                                 "replace_stragglers": False}, rate=lambda w: 10.0)
    ps.status = lambda: {"initialized": False, "worker_batches": {}, "progress": 0}  # the chief never initialises
    for attempt in range(3):
        actuator.end(0, -11)  # the chief dies at start
        engine.poll()
        assert actuator.running() == {0, 1}, attempt  # started again in its slot
    actuator.end(0, -11)
    with pytest.raises(LaunchError, match="crashed 4 times before the job started"):
        engine.poll()


def test_result_lists_every_worker_process_with_its_times():
    engine, ps, actuator = make({"max_workers": 1, "autoscale": False, "total_batches": 30,
                                 "replace_stragglers": False}, rate=lambda w: 10.0)
    drive(engine, ps, 10)
    workers = engine.result().workers
    assert [(w["worker"], w["role"], w["exit"]) for w in workers] == [(0, "initial", 0)]
    assert workers[0]["started"] == 0.0 and 0 < workers[0]["joined"] <= workers[0]["ended"]


def test_last_status_is_the_latest_poll_read_only():
    engine, ps, actuator = make({"max_workers": 2, "replace_stragglers": False}, rate=lambda w: 10.0)
    assert engine.last_status == {}  # no poll yet
    drive(engine, ps, 5)
    assert engine.last_status == ps.status() and engine.last_status["progress"] > 0
    with pytest.raises(TypeError):
        engine.last_status["progress"] = 0
