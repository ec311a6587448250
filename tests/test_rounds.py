"""plan_rounds: the runner's rounds hold alike work, are balanced, and keep every item once."""

from __future__ import annotations

from ragbench.runner import plan_rounds
from ragbench.strategies.params import ClosedBookParams, LongContextParams, RagParams
from ragbench.types import Document, Example


def example(ex_id: str, words: int, doc: str | None = None) -> Example:
    text = "word " * words
    return Example(id=ex_id, question="q?", answers=("a",),
                   documents=(Document(id=doc or f"{ex_id}-doc", text=text),))  # fmt: skip


def items(examples, params_list):
    work = [(e, p) for e in examples for p in params_list]  # the runner's plan order
    return [(w, f"{w[0].id}|{w[1].label()}") for w in work]


def test_rounds_are_balanced_and_keep_every_item_once():
    exs = [example(f"L{n}-D{d}", n) for n in (1000, 4000) for d in (10, 50, 90)]
    pending = items(exs, [ClosedBookParams(), LongContextParams(), RagParams(top_k=3)])
    rounds = plan_rounds(pending, 8)
    assert [len(r) for r in rounds] == [6, 6, 6]  # not 8 + 8 + 2
    assert sorted(k for r in rounds for _, k in r) == sorted(k for _, k in pending)
    assert [len(r) for r in plan_rounds(pending[:9], 8)] == [5, 4]
    assert [len(r) for r in plan_rounds(pending, 1)] == [1] * 18
    assert plan_rounds([], 8) == []


def test_rounds_group_one_strategy_and_order_by_context_size():
    exs = [example(f"L{n}-D{d}", n) for n in (1000, 4000) for d in (10, 50, 90)]
    pending = items(exs, [ClosedBookParams(), LongContextParams(), RagParams(top_k=3)])
    rounds = plan_rounds(pending, 6)
    labels = [{p.label() for (_, p), _ in r} for r in rounds]
    assert labels == [{"closed_book"}, {"long_context"}, {"rag k=3"}]
    lc = [e.id for (e, _), _ in rounds[1]]
    assert lc == ["L1000-D10", "L1000-D50", "L1000-D90", "L4000-D10", "L4000-D50", "L4000-D90"]
    assert plan_rounds(pending, 6) == rounds  # deterministic


def test_questions_on_one_document_stay_together():
    # same-length documents: the document id keeps each document's questions adjacent
    exs = [example(f"{doc}-q{i}", 500, doc=doc) for i in range(3) for doc in ("A", "B")]
    pending = items(exs, [LongContextParams()])
    (one,) = plan_rounds(pending, 8)
    assert [e.id for (e, _), _ in one] == ["A-q0", "A-q1", "A-q2", "B-q0", "B-q1", "B-q2"]
