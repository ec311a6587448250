"""plan_rounds: the runner's rounds are balanced, keep plan order and every item once."""

from __future__ import annotations

from ragbench.experiment.runner import plan_rounds


def test_rounds_are_balanced_in_plan_order_and_keep_every_item_once():
    pending = [f"item{i}" for i in range(18)]
    rounds = plan_rounds(pending, 8)
    assert [len(r) for r in rounds] == [6, 6, 6]  # not 8 + 8 + 2
    assert [x for r in rounds for x in r] == pending  # plan order: a round mixes strategies
    assert [len(r) for r in plan_rounds(pending[:9], 8)] == [5, 4]
    assert [len(r) for r in plan_rounds(pending[:16], 8)] == [8, 8]
    assert [len(r) for r in plan_rounds(pending, 1)] == [1] * 18
    assert [len(r) for r in plan_rounds(pending[:3], 8)] == [3]
    assert plan_rounds([], 8) == []
