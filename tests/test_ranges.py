"""Ranges declared once on the parameter classes' fields (``ragbench.ranges``): the error names
the field, the valid range and the value, for strategy parameters and KV-cache variants alike."""

from __future__ import annotations

import pytest
from pydantic import Field

from ragbench.llm.kv import variants as kv_cache
from ragbench.ranges import range_text
from ragbench.strategies.params import ClosedBookParams, RagParams


@pytest.mark.parametrize(
    ("field", "want"),
    [
        (Field(gt=0, le=1), "in (0, 1]"),
        (Field(ge=0, lt=1), "in [0, 1)"),
        (Field(ge=1), ">= 1"),
        (Field(gt=0), "> 0"),
        (Field(le=8), "<= 8"),
    ],
)
def test_range_text_writes_the_declared_bounds(field, want):
    assert range_text(field, float) == want


@pytest.mark.parametrize("top_k", [0, -1, True, 2.0, "4"])
def test_strategy_ranges_name_the_field_and_the_range(top_k):
    with pytest.raises(ValueError, match=r"^rag: top_k must be an integer >= 1 or null, got "):
        RagParams(top_k=top_k)
    with pytest.raises(ValueError, match=r"^closed_book: cot must be true or false, got 1$"):
        ClosedBookParams(cot=1)  # type: ignore[arg-type]
    assert RagParams(top_k=None, budget=100).top_k is None  # null is valid where declared


def test_kv_ranges_are_declared_on_the_variant():
    with pytest.raises(ValueError, match=r"^kv sinks needs sink_tokens >= 1, got 0$"):
        kv_cache.Sinks(sink_tokens=0)
    with pytest.raises(ValueError, match=r"^kv snapkv needs window >= 1, got True$"):
        kv_cache.SnapKV(window=True)
    assert kv_cache.SnapKV(ratio=1, window=1).spec() == {"name": "snapkv", "ratio": 1, "window": 1}
