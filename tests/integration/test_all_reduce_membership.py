"""Pure pieces of partial all-reduce (no processes): the membership rule, group keys, detector state copy.

They live with the AllReduceStrategy tests; they open no socket and take milliseconds.
"""

import pickle

import pytest

from tfdist.collective import CollectiveError, subgroup_key
from tfdist.straggler import (
    DynamicThresholdDetector,
    EwmaDetector,
    Participation,
    plan_members,
    plan_participation,
)


def test_members_shrink_within_an_epoch_and_everyone_returns_when_nobody_is_excluded():
    everyone = frozenset(range(4))
    assert plan_members(4, everyone, frozenset()) == everyone
    assert plan_members(4, everyone, {2}) == {0, 1, 3}
    assert plan_members(4, {0, 1, 3}, {2, 3}) == {0, 1}  # a second straggler leaves too
    assert plan_members(4, {0, 1}, {2, 3}) == {0, 1}
    assert plan_members(4, {0, 1}, set()) == everyone  # profiling iterations: all back
    # an excluded worker never comes back mid-epoch: excluded workers stay excluded until profiling
    assert 2 not in plan_members(4, {0, 1, 3}, {2})


def test_the_last_members_are_never_excluded():
    assert plan_members(2, {1}, {0, 1}) == {1}
    assert plan_members(3, {0, 2}, {0, 1, 2}) == {0, 2}


def test_participation_names_joiners_and_the_source():
    p = plan_participation(40, 3, previous={1, 2}, excluded=set())
    assert p == Participation(step=40, members=frozenset({0, 1, 2}), joined=frozenset({0}), left=frozenset(),
                              source=1)
    q = plan_participation(7, 3, previous={0, 1, 2}, excluded={0})
    assert q.members == {1, 2} and q.left == {0} and q.joined == frozenset() and q.source is None
    assert q.to_dict() == {"step": 7, "members": [1, 2], "joined": [], "left": [0], "source": None}


def test_subgroup_keys_are_per_member_set_and_purpose():
    keys = {subgroup_key(m, p) for m in ({0, 1}, {0, 2}, {1, 2}, {0, 1, 2}) for p in (0, 1)}
    assert len(keys) == 8
    assert subgroup_key([2, 0, 0]) == subgroup_key({0, 2})
    assert all(0 < k < 2**31 for k in keys)
    assert subgroup_key(range(24), 15) < 2**31
    with pytest.raises(CollectiveError):
        subgroup_key({24})
    with pytest.raises(CollectiveError):
        subgroup_key(set())


def test_detector_state_copies_to_a_worker_that_was_out():
    # members' detector sees real times; the out worker (2) saw None for everyone while out
    member, out = DynamicThresholdDetector(3, limit=3), DynamicThresholdDetector(3, limit=3)
    for det in (member, out):
        det.start_epoch(0, iterations=20)
    for i in range(12):
        slow = [0.1, 0.1, 0.5]
        member.observe(slow if i < 8 else [0.1, 0.4, None])  # worker 1 slows down after 2 is out
        out.observe(slow if i < 8 else [None, None, None])
    assert member.counters != out.counters
    out.load_state_dict(pickle.loads(pickle.dumps(member.state_dict())))
    assert out.counters == member.counters and out.stragglers == member.stragglers
    assert out.step == member.step and out.threshold == member.threshold
    # from now on both decide the same
    for det in (member, out):
        det.start_epoch(1, iterations=20)
    times = [[0.1, 0.1, 0.1]] * 6
    assert [member.observe(t).counters for t in times] == [out.observe(t).counters for t in times]
    ew1, ew2 = EwmaDetector(3), EwmaDetector(3)
    for _ in range(10):
        ew1.observe_times([0.1, 0.1, 0.5])
    ew2.load_state_dict(ew1.state_dict())
    assert ew2.ewma == ew1.ewma and ew2.stragglers == ew1.stragglers
