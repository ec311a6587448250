"""plan_rounds: the runner's rounds are balanced, keep plan order and every item once; with a
variant key each round holds one strategy variant's items, cut as that variant alone cuts them."""

from __future__ import annotations

from ragbench.experiment.runner import plan_rounds


def test_rounds_are_balanced_in_plan_order_and_keep_every_item_once():
    pending = [f"item{i}" for i in range(18)]
    rounds = plan_rounds(pending, 8)
    assert [len(r) for r in rounds] == [6, 6, 6]  # not 8 + 8 + 2
    assert [x for r in rounds for x in r] == pending  # plan order (no variant key: all one)
    assert [len(r) for r in plan_rounds(pending[:9], 8)] == [5, 4]
    assert [len(r) for r in plan_rounds(pending[:16], 8)] == [8, 8]
    assert [len(r) for r in plan_rounds(pending, 1)] == [1] * 18
    assert [len(r) for r in plan_rounds(pending[:3], 8)] == [3]
    assert plan_rounds([], 8) == []


def test_each_round_holds_one_variant_cut_as_that_variant_alone_cuts_it():
    # plan order: examples x points, as the runner lists its work
    variants = ["rag", "long", "self_route", "closed_book"]
    pending = [(f"q{q}", v) for q in range(10) for v in variants]

    def variant(item):
        return item[1]

    rounds = plan_rounds(pending, 8, variant)
    assert all(len({v for _, v in r}) == 1 for r in rounds)  # one variant per round
    assert sorted(x for r in rounds for x in r) == sorted(pending)  # every item once
    for v in variants:
        own = [r for r in rounds if r[0][1] == v]
        alone = plan_rounds([item for item in pending if item[1] == v], 8, variant)
        assert own == alone  # the same rounds as in a run of that variant alone
        assert [len(r) for r in own] == [5, 5]  # its 10 items balanced, questions in order
        assert [q for q, _ in own[0]] == ["q0", "q1", "q2", "q3", "q4"]
    # in turn: the first round of every variant, then the second of every variant
    assert [r[0][1] for r in rounds] == variants + variants
    # a variant with fewer items left (a resumed run) leaves the turn when it is done
    uneven = [(f"q{q}", "rag") for q in range(6)] + [("q0", "long"), ("q1", "long")]
    assert [r[0][1] for r in plan_rounds(uneven, 2, variant)] == ["rag", "long", "rag", "rag"]
