"""Placement: round-robin in creation order, greedy by bytes, row partitioning."""

import pytest

from tfdist.errors import PlacementError
from tfdist.ps.placement import GreedyPlacement, RoundRobinPlacement, VariableSpec, make_placement


def specs(*shapes):
    return [VariableSpec(f"{i:04d}/v{i}", "float32", s) for i, s in enumerate(shapes)]


def test_round_robin_follows_creation_order():
    plan = RoundRobinPlacement().place(specs((4, 4), (4,), (8, 8), (8,), (2,)), 2)
    assert [ps for _, ps, _ in plan.as_table()] == [0, 1, 0, 1, 0]
    plan3 = RoundRobinPlacement().place(specs((1,), (1,), (1,), (1,)), 3)
    assert [ps for _, ps, _ in plan3.as_table()] == [0, 1, 2, 0]


def test_placement_is_deterministic():
    s = specs((300, 10), (10,), (10, 10), (3,))
    for placement in (RoundRobinPlacement(1000), GreedyPlacement(1000)):
        assert placement.place(s, 3) == placement.place(list(s), 3)


def test_greedy_balances_bytes():
    s = specs((1000,), (10,), (10,), (990,))
    rr = RoundRobinPlacement().place(s, 2).bytes_per_ps(s)
    greedy = GreedyPlacement().place(s, 2).bytes_per_ps(s)
    assert rr == [4040, 4000] and greedy == [4040, 4000] or max(greedy) <= max(rr)
    s2 = specs((1000,), (1,), (1000,), (1,))  # round robin puts both big ones on ps 0
    assert RoundRobinPlacement().place(s2, 2).bytes_per_ps(s2) == [8000, 8]
    assert GreedyPlacement().place(s2, 2).bytes_per_ps(s2) == [4004, 4004]


def test_partitioning_splits_rows_across_all_ps():
    s = specs((10, 4), (3,))
    plan = RoundRobinPlacement(partition_threshold_bytes=100).place(s, 3)
    table = plan.as_table()
    assert table[:3] == [("0000/v0", 0, (0, 3)), ("0000/v0", 1, (3, 7)), ("0000/v0", 2, (7, 10))]
    assert table[3] == ("0001/v1", 0, None)  # the counter continues after the parts
    assert sum(plan.bytes_per_ps(s)) == 10 * 4 * 4 + 3 * 4
    assert [sh.key for sh in plan.shards_of("0000/v0")] == ["0000/v0/part_0", "0000/v0/part_1", "0000/v0/part_2"]


def test_small_or_scalar_variables_are_never_split():
    s = [VariableSpec("a", "float32", ()), VariableSpec("b", "float32", (1, 100))]
    plan = RoundRobinPlacement(partition_threshold_bytes=4).place(s, 2)
    assert all(rows is None for _, _, rows in plan.as_table())


def test_errors():
    with pytest.raises(PlacementError, match="num_ps=0"):
        RoundRobinPlacement().place(specs((1,)), 0)
    with pytest.raises(PlacementError, match="duplicates"):
        RoundRobinPlacement().place([VariableSpec("a", "float32", (1,))] * 2, 1)
    with pytest.raises(PlacementError, match="diagonal"):
        make_placement("diagonal")


def test_describe_lists_every_variable():
    s = specs((2, 2), (2,))
    text = RoundRobinPlacement().place(s, 2).describe(s)
    assert "0000/v0 -> ps:0" in text and "0001/v1 -> ps:1" in text and "bytes per ps" in text
