"""The straggler patterns of benchmarks/stragglers_vs_peers.py on real processes (no TensorFlow).

The benchmark's results depend on the throttle doing what its docs say: one worker at a time stopped for part
of every cycle, the moving pattern's bursts drawn from a seeded sequence (the same for every system of a run),
and no process left stopped when a run ends.
"""

import random
import subprocess
import sys
import time

import pytest

from benchmarks import stragglers_vs_peers as svp


def _state(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0]  # R, S, T (stopped), ...


@pytest.fixture
def sleepers():
    procs = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]) for _ in range(3)]
    yield [p.pid for p in procs]
    for p in procs:
        p.kill()
        p.wait(10)


def _wait_for(condition, bound_s: float = 10.0) -> bool:
    deadline = time.monotonic() + bound_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.005)
    return False


def test_the_moving_straggler_stops_one_worker_at_a_time_in_seeded_bursts_and_leaves_none_stopped(sleepers):
    throttle = svp.MovingThrottle(sleepers, slowdown=3.0, burst_s=0.18, seed=7).start()
    try:
        seen_stopped = set()

        def three_bursts_seen():
            stopped = [pid for pid in sleepers if _state(pid) == "T"]
            assert len(stopped) <= 1, stopped  # never two at once
            seen_stopped.update(stopped)
            return len(throttle.bursts) >= 4

        assert _wait_for(three_bursts_seen), throttle.bursts
    finally:
        throttle.stop()
    assert throttle.cycles_per_burst == 1  # 0.18 s = one 60 ms run + 120 ms stopped cycle
    expected = random.Random(7)
    assert throttle.bursts == [expected.randrange(3) for _ in throttle.bursts]  # the seeded sequence
    assert seen_stopped and seen_stopped <= set(sleepers)
    assert all(_state(pid) != "T" for pid in sleepers)  # stop() resumed every one of them


def test_the_persistent_straggler_slows_worker_3_only_and_the_pattern_picks_the_docs_section(sleepers):
    pids = [sleepers[0], sleepers[0], sleepers[1], sleepers[2]]  # worker 0..3; 3 is the slow one
    saved = dict(svp.PATTERN)
    try:
        svp.PATTERN.update(kind="persistent")
        throttle = svp._throttle(pids, 3.0)
        try:
            assert isinstance(throttle, svp.Throttle) and throttle.pid == sleepers[2]
            assert _wait_for(lambda: _state(sleepers[2]) == "T")
            assert _state(sleepers[0]) != "T" and _state(sleepers[1]) != "T"
        finally:
            throttle.stop()
        assert _state(sleepers[2]) != "T"
        assert svp._throttle(pids, 1.0) is None  # no straggler
        svp.PATTERN.update(kind="moving")
        moving = svp._throttle(pids, 3.0)
        moving.stop()
        assert moving.pids == pids[1:]  # worker 0, whose model is measured, is never slowed
    finally:
        svp.PATTERN.clear()
        svp.PATTERN.update(saved)
    assert svp._section({"pattern": {"kind": "persistent"}}) == "stragglers-vs-peers"
    assert svp._section({}) == "stragglers-vs-peers"  # JSON of runs before the pattern existed
    assert svp._section({"pattern": {"kind": "moving"}}) == "stragglers-vs-peers-moving"


def test_dtssp_over_ssp_is_paired_within_each_pass_and_skips_a_pass_either_missed():
    def run(system, n, t, first, reached=True, straggler=True):
        return {"system": system, "pass": n, "straggler": straggler, "reached": reached,
                "time_to_target_s": t, "time_to_target_from_first_step_s": first}

    result = {"runs": [run("ssp", 0, 20.0, 14.0), run("dtssp", 0, 15.0, 7.0),
                       run("dtssp", 1, 16.0, 9.0), run("ssp", 1, 10.0, 5.0, reached=False),  # SSP missed pass 1
                       run("ssp", 2, 10.0, 4.0), run("dtssp", 2, 12.0, 5.0),
                       run("ssp", 3, 30.0, 20.0, straggler=False), run("dtssp", 3, 3.0, 2.0, straggler=False)]}
    assert svp.dtssp_over_ssp_per_pass(result) == {"launch": [0.75, 1.2], "first_step": [0.5, 1.25]}
