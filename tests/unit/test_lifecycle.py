"""The worker lifecycle's transitions: the only ones its docstring lists."""

from tfdist.strategies._lifecycle import Role, WorkerLifecycle


def test_a_reader_stays_a_reader_until_it_closes():
    life = WorkerLifecycle(-1)
    assert life.reader and life.reads_as_reader
    assert not life.leave() and not life.rejoin() and not life.warmup_step(True)
    assert life.role is Role.READER and life.close() and life.closed and not life.close()


def test_a_joining_worker_warms_up_then_trains_leaves_and_comes_back():
    life = WorkerLifecycle(3, warmup_batches=2)
    assert life.role is Role.WARMING_UP
    assert life.warmup_step(True) and life.reads_as_reader
    life.end_warmup_step()
    assert not life.reads_as_reader
    assert life.warmup_step(True) and not life.warmup_step(True)  # two warm-up steps, then it trains
    assert life.role is Role.TRAINING and not life.reads_as_reader
    assert life.leave() and life.left and life.reads_as_reader and not life.leave()
    assert life.rejoin() and life.role is Role.TRAINING and not life.rejoin()
    assert life.close() and not life.leave() and not life.rejoin() and life.closed


def test_a_worker_that_joined_before_its_warm_up_ended_trains():
    life = WorkerLifecycle(2, warmup_batches=5)
    assert not life.warmup_step(may_warm_up=False)  # it has a session already (an evaluation step made one)
    assert life.role is Role.TRAINING
