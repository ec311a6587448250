"""The planning tables: KV-cache memory and sequences per GPU per model and context length,
long context's $ per question with and without a prefix cache, and, from a run's table, how many
questions per document make long context with a prefix cache as cheap as RAG
(``prefix_cache_break_even``). Notebook 04 plots them (``ragbench.report.planning_plots``); the
arithmetic under each cell (capacity, dollars, break-even) is ``ragbench.cost.planning``'s.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

from ragbench.cost.accounting import DEFAULT_KV_BYTES_PER_VALUE, kv_cache_bytes
from ragbench.cost.money import Usage, dollars
from ragbench.cost.planning import (
    GIB,
    api_dollars_per_1k,
    api_sheet,
    break_even_questions,
    cached_dollars_per_question,
    cheaper_from,
    long_context_question_dollars,
    max_concurrent_sequences,
    preset_of,
    self_hosted_dollars_per_1k,
)
from ragbench.cost.prices import PriceSheet
from ragbench.models import ModelPreset

if TYPE_CHECKING:
    import pandas as pd


def kv_cache_table(
    presets: Sequence[str | ModelPreset],
    context_lengths: Sequence[int],
    bytes_per_value: int = DEFAULT_KV_BYTES_PER_VALUE,
) -> pd.DataFrame:
    """KV-cache bytes of one sequence holding ``context_length`` positions, per model and length
    (``bytes_per_value`` 2 assumes a bf16/fp16 cache)."""
    import pandas as pd

    rows = []
    for p in map(preset_of, presets):
        for n in context_lengths:
            size = kv_cache_bytes(p.layers, p.kv_heads, p.head_dim, n, 1, bytes_per_value)
            rows.append(
                {"model": p.name, "context_tokens": n, "kv_bytes": size, "kv_gib": size / GIB}
            )
    return pd.DataFrame(rows)


def kv_cache_wide(kv: pd.DataFrame) -> pd.DataFrame:
    """``kv_cache_table``'s GiB as a context length x model table, models and lengths in the
    order they were given (as ``capacity_table`` lays them out), not sorted by name."""
    wide = kv.pivot_table(index="context_tokens", columns="model", values="kv_gib")
    wide = wide.loc[list(dict.fromkeys(kv["context_tokens"])), list(dict.fromkeys(kv["model"]))]
    return wide.rename_axis(index="context_tokens", columns="model")


def capacity_table(
    presets: Sequence[str | ModelPreset],
    context_lengths: Sequence[int],
    gpu_memory_gib: float,
    kv_bytes_per_value: int = DEFAULT_KV_BYTES_PER_VALUE,
) -> pd.DataFrame:
    """``max_concurrent_sequences`` as a context length x model table of integers."""
    import pandas as pd

    rows = {
        preset_of(p).name: {
            n: max_concurrent_sequences(p, n, gpu_memory_gib, kv_bytes_per_value=kv_bytes_per_value)
            for n in context_lengths
        }
        for p in presets
    }
    return pd.DataFrame(rows).rename_axis(index="context_tokens", columns="model")


def planned_queries(
    document_tokens: int, question_tokens: int, rag_prompt_tokens: int, completion_tokens: int
) -> pd.DataFrame:
    """One planned query per strategy, the table ``dollars_per_1k_table`` and
    ``prefix_cache_break_even`` price: long context's prompt is the document and the question
    after it (``document_tokens + question_tokens``, what ``prefix_caching_table`` prices too),
    RAG's is ``rag_prompt_tokens`` (chunks, instructions and question); both answer in
    ``completion_tokens``."""
    import pandas as pd

    return pd.DataFrame(
        [
            {
                "strategy": "long_context",
                "prompt_tokens": document_tokens + question_tokens,
                "completion_tokens": completion_tokens,
            },
            {
                "strategy": "rag",
                "prompt_tokens": rag_prompt_tokens,
                "completion_tokens": completion_tokens,
            },
        ]
    )


def dollars_per_1k_table(
    planned: pd.DataFrame,
    api_sheet: str | PriceSheet,
    gpu_sheet: str | PriceSheet,
    prefill_tokens_per_s: float,
    decode_tokens_per_s: float,
    concurrency: int = 1,
) -> pd.DataFrame:
    """$ per 1,000 queries of each ``planned_queries`` row on a per-token (hosted API) sheet and
    on a GPU-hour (self-hosted) sheet at the given throughputs: columns ``strategy``,
    ``prompt_tokens``, ``hosted API $/1k`` and ``self-hosted GPU $/1k``."""
    import pandas as pd

    rows = []
    for r in planned.itertuples(index=False):
        gpu = self_hosted_dollars_per_1k(
            gpu_sheet,
            cast("int", r.prompt_tokens),
            cast("int", r.completion_tokens),
            prefill_tokens_per_s,
            decode_tokens_per_s,
            concurrency,
        )
        rows.append(
            {
                "strategy": r.strategy,
                "prompt_tokens": r.prompt_tokens,
                "hosted API $/1k": api_dollars_per_1k(
                    api_sheet, cast("int", r.prompt_tokens), cast("int", r.completion_tokens)
                ),
                "self-hosted GPU $/1k": gpu,
            }
        )
    return pd.DataFrame(rows)


def prefix_caching_table(
    sheet: str | PriceSheet,
    document_tokens: int,
    question_tokens: int,
    completion_tokens: int,
    questions_per_document: Sequence[int],
) -> pd.DataFrame:
    """Long-context $/question with and without a prefix cache on a per-token price sheet.

    With the cache, the first question on a document writes the document to the cache (at the
    sheet's cache-write price: Anthropic's premium, plain input elsewhere); the others read it at
    the cached-input price. A document shorter than the sheet's minimum cacheable prefix is never
    cached. Shows how many questions per document it takes for long context to get cheap.
    """
    import pandas as pd

    sheet = api_sheet(sheet)
    prompt = document_tokens + question_tokens
    full = long_context_question_dollars(sheet, prompt, completion_tokens, 0, "none")
    first = long_context_question_dollars(
        sheet, prompt, completion_tokens, document_tokens, "write"
    )
    warm = long_context_question_dollars(sheet, prompt, completion_tokens, document_tokens, "read")
    rows = []
    for q in questions_per_document:
        cached = cached_dollars_per_question(first, warm, q)
        rows.append(
            {
                "questions_per_document": q,
                "dollars_per_question_no_cache": full,
                "dollars_per_question_prefix_cache": cached,
                "saving": 1 - cached / full,
            }
        )
    return pd.DataFrame(rows)


# ---------------------------------------------------------------------------- break-even from a run


def _col(df: pd.DataFrame, name: str) -> str | None:
    """A results-table column by its field name, also when a section prefix was added."""
    for c in (name, *(p + name for p in ("cost_", "meta_", "ex_", "param_"))):
        if c in df.columns:
            return c
    return None


def _prefix_tokens(
    lc: pd.DataFrame, ok: pd.DataFrame, prefix_tokens: int | None, closed_book: str
) -> pd.Series:
    """The cacheable prefix of each long-context row: ``prefix_tokens`` when given; else the
    document tokens the strategy kept (``kept_tokens``; the prompt puts the document first);
    else the long-context prompt minus the same example's prompt without context (the
    ``closed_book`` strategy's rows: instructions and question, what is not the document). Both
    undercount the prefix by the few instruction tokens before the document: the cache's
    benefit is understated, never overstated."""
    import pandas as pd

    prompt = lc[_col(lc, "prompt_tokens")]
    if prefix_tokens is not None:
        return pd.Series(float(prefix_tokens), index=lc.index).clip(upper=prompt)
    kept = _col(lc, "kept_tokens")
    if kept is not None and lc[kept].notna().all():
        return lc[kept].astype(float).clip(upper=prompt)
    closed = ok[ok["strategy"] == closed_book]
    if len(closed):
        cb = closed.groupby("example_id")[cast("str", _col(closed, "prompt_tokens"))].first()
        paired = lc["example_id"].map(cb)
        if paired.notna().all():
            return (prompt - paired).clip(lower=0)
    raise ValueError(
        "cannot tell the long-context prompt's cacheable prefix: the table has no kept_tokens "
        f"column and no {closed_book} row for every example; pass prefix_tokens="
    )


@dataclass(frozen=True)
class _LongContextCost:
    """Long context's mean dollars per question over one group's rows, under one sheet."""

    first: float  # the first question on a document: writes the prefix to the cache
    later: float  # each later question on it: reads the prefix
    plain: float  # with no prefix cache
    prefix_tokens: float  # the mean cacheable prefix

    @classmethod
    def of(cls, sheet: PriceSheet, lc: pd.DataFrame) -> _LongContextCost:
        """From long context's rows (their ``_prefix`` column set), priced with ``sheet``."""
        lc_dollars = functools.partial(long_context_question_dollars, sheet)
        prompt, completion = lc[_col(lc, "prompt_tokens")], lc[_col(lc, "completion_tokens")]
        cells = list(zip(prompt, completion, lc["_prefix"], strict=True))
        return cls(
            first=sum(lc_dollars(p, g, x, "write") for p, g, x in cells) / len(cells),
            later=sum(lc_dollars(p, g, x, "read") for p, g, x in cells) / len(cells),
            plain=sum(lc_dollars(p, g, 0, "none") for p, g, _ in cells) / len(cells),
            prefix_tokens=float(lc["_prefix"].mean()),
        )


def _compared(
    ok: pd.DataFrame, groups: list[str], long_context: str, rag: str
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The successful rows' long-context rows (a copy) and RAG rows; a table that cannot be
    compared (a missing column, no rows of either, several long-context variants) is an error."""
    missing = [c for c in groups if c not in ok.columns]
    if missing:
        raise ValueError(f"by: no column {missing} in the table; columns: {list(ok.columns)}")
    for name in ("prompt_tokens", "completion_tokens"):
        if _col(ok, name) is None:
            raise ValueError(f"the table has no {name!r} column: is it a ragbench results table?")
    lc = ok[ok["strategy"] == long_context].copy()
    rg = ok[ok["strategy"] == rag]
    if lc.empty or rg.empty:
        found = sorted(ok["strategy"].unique())
        raise ValueError(
            f"need successful {long_context!r} and {rag!r} rows; the table has {found}"
        )
    if "label" in lc and lc["label"].nunique() > 1:
        raise ValueError(
            f"several long-context variants {sorted(lc['label'].unique())}: filter the table to one"
        )
    return lc, rg


def _grouped(
    lc: pd.DataFrame, rg: pd.DataFrame, groups: list[str]
) -> Iterator[tuple[dict[str, object], pd.DataFrame, pd.DataFrame]]:
    """Per group of ``lc`` with RAG rows: the group's values by column, its long-context rows
    and its RAG rows (no ``groups``: one group, every row)."""
    if not groups:
        yield {}, lc, rg
        return
    for k, lc_g in lc.groupby(groups):
        key = k if isinstance(k, tuple) else (k,)
        rg_g = rg
        for col, value in zip(groups, key, strict=True):
            rg_g = rg_g[rg_g[col] == value]
        if not rg_g.empty:
            yield dict(zip(groups, key, strict=True)), lc_g, rg_g


def _rag_dollars(sheet: PriceSheet, rg: pd.DataFrame) -> float:
    """RAG's mean dollars per question: its prompt differs per question, every token at full
    price."""
    prompt, completion = rg[_col(rg, "prompt_tokens")], rg[_col(rg, "completion_tokens")]
    per_rag = [
        dollars(sheet, Usage(prompt_tokens=p, completion_tokens=g))
        for p, g in zip(prompt, completion, strict=True)
    ]
    return sum(per_rag) / len(per_rag)


def _break_even_row(
    sheet: PriceSheet,
    where: dict[str, object],
    label: object,
    rag_cost: float,
    lc: _LongContextCost,
) -> dict[str, object]:
    """``prefix_cache_break_even``'s table row for one (sheet, group, RAG variant)."""
    import pandas as pd

    q_star = break_even_questions(lc.first, lc.later, rag_cost)
    cheaper = cheaper_from(q_star)
    return {
        "sheet": sheet.name,
        "sheet_date": sheet.date,
        **where,
        "rag_label": label,
        "rag_dollars_per_query": rag_cost,
        "lc_first_question_dollars": lc.first,
        "lc_later_question_dollars": lc.later,
        "lc_no_cache_dollars_per_query": lc.plain,
        "prefix_tokens": lc.prefix_tokens,
        "break_even_questions_per_document": q_star,
        "lc_cheaper_from": pd.NA if cheaper is None else cheaper,
    }


def _curve_point(
    sheet: PriceSheet, where: dict[str, object], series: object, q: int, dollars_per_query: float
) -> dict[str, object]:
    """One point of ``prefix_cache_break_even``'s curve."""
    return {
        "sheet": sheet.name,
        **where,
        "series": series,
        "questions_per_document": q,
        "dollars_per_query": dollars_per_query,
    }


def prefix_cache_break_even(
    results: pd.DataFrame,
    sheets: Sequence[str | PriceSheet],
    *,
    prefix_tokens: int | None = None,
    by: str | Sequence[str] | None = None,
    questions_per_document: Sequence[int] = (1, 2, 3, 5, 10, 20, 50, 100),
    long_context: str = "long_context",
    rag: str = "rag",
    closed_book: str = "closed_book",
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """How many questions per document make long context with a prefix cache as cheap as RAG,
    from a run's measured tokens, per price sheet: ``(table, curve)``.

    Long context sends the same document first for every question on it, so with a provider's
    prefix cache its first question writes the document (at the cache-write price: Anthropic's
    premium) and the later ones read it (cached-input price); the question, the instructions
    and the answer pay full price every time. RAG's prompt differs per question: it pays full
    price each time. Over q questions long context costs ``(first + (q - 1) later) / q`` per
    question, so it matches RAG at ``q* = (first - later) / (rag - later)`` when RAG costs more
    than a cached question (else never: inf). A prefix shorter than the sheet's minimum
    cacheable prompt is never cached. Assumes the questions on a document arrive within the
    cache's lifetime (``sheet.cache_ttl``; 5 minutes by default at Anthropic); each miss costs
    another write.

    ``results``: a run's table (``ragbench.run``); failed rows are dropped. Every row's tokens
    are priced with each sheet (long-context tiers apply per row), then averaged per group.
    ``by``: columns to group by (e.g. ``"context_length"``: longer documents break even sooner);
    None pools all rows. One row per (sheet, group, RAG variant) in ``table``: ``rag_label``,
    ``rag_dollars_per_query``, ``lc_first_question_dollars``, ``lc_later_question_dollars``,
    ``lc_no_cache_dollars_per_query``, ``prefix_tokens`` (mean), ``break_even_questions_per_
    document`` (float, inf: never; 1.0: long context is no dearer from the first question) and
    ``lc_cheaper_from`` (the smallest whole number of questions per document at which long
    context costs no more than RAG; <NA>: never). ``curve`` is long: per sheet, group and series
    (each RAG variant, "long context, prefix cache", "long context, no cache"), the dollars per
    query at each of ``questions_per_document``.

    ``long_context``, ``rag`` and ``closed_book`` name the strategies whose rows are compared
    (and, without ``kept_tokens`` or ``prefix_tokens``, whose prompt without context gives the
    prefix). The arithmetic per row is ``ragbench.cost.planning``'s.
    """
    import pandas as pd

    ok = results[results["error"].isna()] if "error" in results else results
    groups = [by] if isinstance(by, str) else list(by or [])
    lc, rg = _compared(ok, groups, long_context, rag)
    lc["_prefix"] = _prefix_tokens(lc, ok, prefix_tokens, closed_book)
    rag_key = "label" if "label" in rg else "strategy"
    rows, curve = [], []
    for sheet in map(api_sheet, sheets):
        for where, lc_g, rg_g in _grouped(lc, rg, groups):
            cost = _LongContextCost.of(sheet, lc_g)
            for label, r in rg_g.groupby(rag_key, sort=False):
                rag_cost = _rag_dollars(sheet, r)
                rows.append(_break_even_row(sheet, where, label, rag_cost, cost))
                curve += [
                    _curve_point(sheet, where, label, q, rag_cost) for q in questions_per_document
                ]
            for q in questions_per_document:
                cached = cached_dollars_per_question(cost.first, cost.later, q)
                curve.append(_curve_point(sheet, where, "long context, prefix cache", q, cached))
                curve.append(_curve_point(sheet, where, "long context, no cache", q, cost.plain))
    table = pd.DataFrame(rows)
    if len(table):
        table["lc_cheaper_from"] = table["lc_cheaper_from"].astype("Int64")
    return table, pd.DataFrame(curve)
