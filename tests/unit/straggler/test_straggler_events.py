"""EventDispatcher / StragglerListener and StragglerHistory."""

import json

import pytest

from tfdist.straggler import (
    DetectorName,
    EventDispatcher,
    EventKind,
    ExchangeFailure,
    StragglerEvent,
    StragglerHistory,
    StragglerListener,
)


def event(kind, worker=1, detector=DetectorName.DYNAMIC_THRESHOLD):
    return StragglerEvent(kind, worker, detector, 0, 7, 7, 123.0, 0.5, 0.2, counter=3, limit=3)


def test_listener_subclass_and_callables_receive_events_in_order():
    calls = []

    class Recorder(StragglerListener):
        def on_straggler_detected(self, worker, info):
            calls.append(("obj-detected", worker, info.kind))

    bus = EventDispatcher()
    bus.subscribe(Recorder())
    handle = bus.subscribe(on_detected=lambda w, i: calls.append(("fn-detected", w)),
                           on_recovered=lambda w, i: calls.append(("fn-recovered", w)))
    bus.dispatch([event(EventKind.DETECTED), event(EventKind.RECOVERED, worker=2)])
    assert calls == [("obj-detected", 1, EventKind.DETECTED), ("fn-detected", 1), ("fn-recovered", 2)]
    bus.unsubscribe(handle)
    bus.dispatch([event(EventKind.RECOVERED)])
    assert len(calls) == 3


def test_listener_errors_propagate_and_bad_listeners_rejected():
    bus = EventDispatcher()

    def boom(worker, info):
        raise RuntimeError("hook failed")

    bus.subscribe(on_detected=boom)
    with pytest.raises(RuntimeError, match="hook failed"):
        bus.dispatch([event(EventKind.DETECTED)])
    with pytest.raises(TypeError, match="on_detected"):
        bus.subscribe(on_detected=42)
    with pytest.raises(TypeError, match="StragglerListener"):
        bus.subscribe()
    with pytest.raises(TypeError, match="on_straggler_detected"):
        bus.subscribe(object())


def test_history_selects_and_serialises():
    h = StragglerHistory()
    h.events += [event(EventKind.DETECTED), event(EventKind.RECOVERED), event(EventKind.DETECTED, 2, DetectorName.EWMA)]
    h.failures.append(ExchangeFailure(0, 9, 1.0, "CollectivePeerError", "peer gone", (1,)))
    h.times.append((0.1, float("nan")))
    assert [e.worker for e in h.detections()] == [1, 2]
    assert [e.worker for e in h.detections(detector="ewma")] == [2]
    assert [e.worker for e in h.detections(detector=DetectorName.DYNAMIC_THRESHOLD)] == [1]
    assert len(h.recoveries(worker=1)) == 1
    data = json.loads(json.dumps(h.to_dict()))
    assert data["events"][0]["kind"] == "detected" and data["times"] == [[0.1, None]]
    assert data["failures"][0]["peers"] == [1]
