"""StragglerDetector (Keras callback) in one process, with a scripted fake worker group."""

import numpy as np
import pytest

keras = pytest.importorskip("keras")

from tfdist.callbacks import StragglerDetector  # noqa: E402
from tfdist.callbacks.verdict_log import JsonLinesLog  # noqa: E402
from tfdist.collective import CollectivePeerError, CollectiveSetupError  # noqa: E402

STEPS = 16


class FakeGroup:
    """Worker 0 of ``size``. Every worker's times, worker 0's included (its real, machine-dependent
    measurement is replaced), are scripted per global step, so verdicts are deterministic."""

    def __init__(self, size, script, fail_at=None):
        self.size, self.worker_id, self.timeout_s = size, 0, 5.0
        self.script = script  # step -> list of times of workers 0..size-1
        self.step = 0
        self.calls = 0
        self.fail_at = fail_at

    def all_gather(self, values, timeout_s=None):
        self.calls += 1
        if self.fail_at is not None and self.calls >= self.fail_at:
            raise CollectivePeerError("worker 1 (worker:1 at 127.0.0.1:1) is unreachable", peers=(1,))
        values = np.asarray(values, dtype=np.float64)
        epoch, count = values[0], int(values[1])
        table = np.full((self.size, values.size), np.nan)
        table[:, 0], table[:, 1] = epoch, count
        for i in range(count):
            table[:, 2 + i] = self.script(self.step + i)
        self.step += count
        return table


def fit(callback, epochs=3):
    x = np.random.default_rng(0).normal(size=(STEPS * 4, 4)).astype("float32")
    y = (x[:, 0] > 0).astype("float32")
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1, activation="sigmoid")])
    model.compile(optimizer="sgd", loss="binary_crossentropy")
    return model.fit(x, y, batch_size=4, epochs=epochs, verbose=0, callbacks=[callback], shuffle=False)


def slow_worker_2(step):
    # worker 1 normal (10 ms), worker 2 slow (5 s) during global steps 10..25, else normal
    return [0.010, 0.011, 5.0 if 10 <= step < 26 else 0.012]


def test_detection_recovery_logs_hooks_and_jsonl(tmp_path):
    seen = []

    class Hooked(StragglerDetector):
        def on_straggler_detected(self, worker, info):
            seen.append(("sub-detected", worker, info.step))

    log = tmp_path / "verdicts-{worker}.jsonl"
    det = Hooked(limit=3, ewma_window=2, warmup_iterations=0, log_path=str(log), group=FakeGroup(3, slow_worker_2),
                 on_straggler_recovered=lambda w, info: seen.append(("fn-recovered", w, info.step)))
    hist = fit(det).history
    dyn = det.history.detections(detector="dynamic_threshold")
    assert [(e.worker, e.step) for e in dyn] == [(2, 12)]  # slow from step 10: 3 iterations
    rec = det.history.recoveries(detector="dynamic_threshold")
    assert [(e.worker, e.epoch, e.step) for e in rec] == [(2, 1, 26)]  # first fast iteration
    assert ("sub-detected", 2, 12) in seen and ("fn-recovered", 2, 26) in seen
    # epoch logs reach History
    assert hist["straggler_count"] == [1, 0, 0]
    assert hist["straggler_detections"] == [1, 0, 0] and hist["straggler_recoveries"] == [0, 1, 0]
    assert hist["straggler_counter_w2"][0] == 3 and hist["straggler_counter_w0"] == [0, 0, 0]
    assert all(t > 0 for t in hist["straggler_threshold"])
    assert "persistent_straggler_count" in hist and hist["straggler_limit"] == [3, 3, 3]
    # the EWMA detector flagged the persistent 500x straggler, too
    assert [e.worker for e in det.history.detections(detector="ewma")] == [2]
    # per-iteration record and JSON lines
    assert len(det.history.times) == 3 * STEPS and len(det.history.epochs) == 3
    records = JsonLinesLog.read(str(log).format(worker=0))
    types = [r["type"] for r in records]
    assert types[0] == "config" and types.count("epoch") == 3 and types.count("threshold") == 3
    events = [r for r in records if r["type"] == "event"]
    assert {(r["kind"], r["detector"], r["worker"]) for r in events} >= {
        ("detected", "dynamic_threshold", 2), ("recovered", "dynamic_threshold", 2)}
    assert all(isinstance(r["time"], float) for r in events)


def test_jitter_does_not_trigger():
    rng = np.random.default_rng(1)
    det = StragglerDetector(group=FakeGroup(4, lambda step: list(0.01 * rng.uniform(0.8, 1.2, 4))), ewma_window=1)
    fit(det)
    assert not det.history.events and max(max(c) for c in det.history.counters) == 0


def test_exchange_every_batches_times():
    group = FakeGroup(2, lambda step: [0.01, 5.0 if step >= 8 else 0.01])
    det = StragglerDetector(limit=3, exchange_every=4, ewma=False, group=group, warmup_iterations=0)
    fit(det, epochs=1)
    assert group.calls == STEPS // 4
    assert [(e.worker, e.step) for e in det.history.detections()] == [(1, 10)]
    assert det.stragglers == frozenset({1}) and det.excluded() == frozenset({1})
    assert det.persistent_stragglers == frozenset()


def test_warmup_iterations_are_not_exchanged():
    group = FakeGroup(2, lambda step: [0.01, 0.01])
    det = StragglerDetector(group=group, warmup_iterations=3)
    fit(det, epochs=2)
    assert group.calls == 2 * STEPS - 3 and len(det.history.times) == 2 * STEPS
    assert det.history.times[:3] == [(None, None)] * 3 and det.history.times[3] == (0.01, 0.01)
    assert det.history.epochs[0].profile_minima == (0.01, 0.01)  # iterations 3 and 4


def test_peer_failure_is_reported_and_training_goes_on(tmp_path):
    failures = []

    class Hooked(StragglerDetector):
        def on_exchange_failed(self, failure):
            failures.append(failure)

    det = Hooked(group=FakeGroup(2, lambda s: [0.01, 0.01], fail_at=5), log_path=str(tmp_path / "v.jsonl"))
    hist = fit(det, epochs=2).history
    assert len(hist["loss"]) == 2 and not det.active
    assert len(failures) == 1 and failures[0].peers == (1,) and failures[0].error == "CollectivePeerError"
    assert [f.step for f in det.history.failures] == [5]  # iteration 0 is warm-up, exchanges 1..5
    assert [r["type"] for r in JsonLinesLog.read(tmp_path / "v.jsonl")].count("failure") == 1


def test_peer_failure_raises_when_asked():
    det = StragglerDetector(group=FakeGroup(2, lambda s: [0.01, 0.01], fail_at=3), on_failure="raise")
    with pytest.raises(CollectivePeerError, match="unreachable"):
        fit(det)


def test_single_process_without_group_works_and_multi_worker_without_group_fails(monkeypatch):
    monkeypatch.delenv("TF_CONFIG", raising=False)
    det = StragglerDetector()
    fit(det, epochs=1)
    assert det.group.size == 1 and len(det.history.epochs) == 1
    monkeypatch.setenv("TF_CONFIG", '{"cluster": {"worker": ["127.0.0.1:1", "127.0.0.1:2"], "ps": ["127.0.0.1:3"]}, '
                       '"task": {"type": "worker", "index": 0}}')
    with pytest.raises(CollectiveSetupError, match="init_worker_group"):
        fit(StragglerDetector(), epochs=1)


@pytest.mark.parametrize("kwargs, field", [({"exchange_every": 0}, "exchange_every"), ({"on_failure": "x"}, "on_failure"),
                                            ({"timeout_s": 0}, "timeout_s"), ({"warmup_iterations": -1}, "warmup_iterations"), ({"factor": 0.5}, "factor"),
                                            ({"ewma_alpha": 2}, "alpha")])
def test_bad_arguments_fail_at_construction(kwargs, field):
    with pytest.raises(ValueError, match=f"`{field}`"):
        StragglerDetector(**kwargs)
