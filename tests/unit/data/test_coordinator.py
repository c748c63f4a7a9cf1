"""Coordinator: stop requests, first error re-raised with its traceback, joins."""

import threading
import traceback

import pytest

from tfdist.data import Coordinator, QueueClosedError

T = 5.0


def _fail_here():
    raise ValueError("bad record 17")


def test_first_exception_is_kept_and_reraised_with_its_traceback():
    coord = Coordinator()

    def worker():
        with coord.stop_on_exception():
            _fail_here()

    t = threading.Thread(target=worker)
    coord.register_thread(t)
    t.start()
    assert coord.wait_for_stop(T)
    coord.request_stop(RuntimeError("second error is ignored"))
    with pytest.raises(ValueError, match="bad record 17") as info:
        coord.join(stop_grace_period_secs=T)
    frames = [f.name for f in traceback.extract_tb(info.value.__traceback__)]
    assert "_fail_here" in frames


def test_with_block_reraises_the_producer_error_over_the_training_error():
    with pytest.raises(ValueError, match="bad record") as info:
        with Coordinator() as coord:
            coord.request_stop(ValueError("bad record 3"))
            raise RuntimeError("what tf.data reported in the training thread")
    assert isinstance(info.value.__context__, RuntimeError)


def test_clean_stop_types_are_not_errors_and_callbacks_run_once():
    coord = Coordinator()
    seen = []
    coord.add_stop_callback(seen.append)
    coord.request_stop(QueueClosedError("end of data"))
    coord.request_stop()
    assert coord.should_stop() and seen == [None]
    coord.join(threads=[], stop_grace_period_secs=T)  # nothing raised
    late = []
    coord.add_stop_callback(late.append)  # already stopped: called at once
    assert late == [None]


def test_join_raises_when_threads_outlive_the_grace_period():
    coord = Coordinator()
    release = threading.Event()
    t = threading.Thread(target=release.wait, args=(T,))
    coord.register_thread(t)
    t.start()
    coord.request_stop()
    try:
        with pytest.raises(RuntimeError, match="stop_grace_period_secs=0.05"):
            coord.join(stop_grace_period_secs=0.05)
    finally:
        release.set()
        t.join(T)


def test_clear_stop_allows_reuse():
    coord = Coordinator()
    coord.request_stop(ValueError("x"))
    coord.clear_stop()
    assert not coord.should_stop()
    coord.raise_requested_exception()  # nothing kept
