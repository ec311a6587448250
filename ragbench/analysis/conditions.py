"""The conditions a verdict holds for, read from a results table (and its run's manifest)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, TypedDict

from ragbench.cost.prices import price_sheet
from ragbench.io import read_json
from ragbench.judge.agreement import RepeatAgreement, repeat_agreement

if TYPE_CHECKING:
    import pandas as pd


class Conditions(TypedDict, total=False):
    """What a verdict holds for (``conditions``; every key optional)."""

    questions: int  # scored
    asked: int  # answered, where more were than scored
    judge: RepeatAgreement
    model: str | None
    context_tokens: tuple[int, int]  # smallest, largest
    context: str  # in words
    truncated: float  # the share of the context long context cut to fit the window
    own_index: list[str]  # the labels of pipelines that answered from their own index
    price_sheet: str
    price_sheet_date: str | None


def conditions(df: pd.DataFrame, rows: pd.DataFrame, metric: str | None = None) -> Conditions:
    """What a verdict holds for, from a results table (``rows``: the compared variants' rows):
    question count (``questions``: scored; ``asked``: answered, where more were than scored),
    model, context or corpus size, the share of it long context cut to fit the window, the
    price sheet with its date, the pipelines that answered from their own index
    (``own_index``: their labels), and when ``metric`` is judged more than once per answer
    (``judge.repeats``) how far the repeats agree (``judge``: ``judge.repeat_agreement`` of
    ``rows``)."""
    out: Conditions = {"questions": int(rows["example_id"].nunique())}
    answered = df[df["error"].isna()] if "error" in df.columns else df
    if "example_id" in answered.columns:  # asked and paid for, scored or not (no gold answer)
        asked = int(answered["example_id"].nunique())
        if asked > out["questions"]:
            out["asked"] = asked
    if metric is not None and (judged := repeat_agreement(rows, metric)) is not None:
        out["judge"] = judged
    out.update(_model(df))
    out.update(_context(rows))
    # a pipeline's own index: strategies/pipeline/strategy.py
    if "pipeline_index" in rows.columns and "label" in rows.columns:
        own = rows[rows["pipeline_index"] == "own index"]
        if len(own):  # it read other documents than long context and the built-in RAG
            out["own_index"] = list(dict.fromkeys(own["label"].astype(str)))
    out.update(_price_sheet(rows))
    return out


def _model(df: pd.DataFrame) -> Conditions:
    """``model``: the table's model column, else its run's manifest (nothing: neither)."""
    if "model" in df.columns and df["model"].notna().any():
        return {"model": ", ".join(map(str, dict.fromkeys(df["model"].dropna())))}
    if not df.attrs.get("run_dir"):
        return {}
    manifest = read_json(Path(df.attrs["run_dir"]) / "manifest.json") or {}
    model = (manifest.get("config") or {}).get("model") or {}
    return {"model": model.get("name") or (manifest.get("model") or {}).get("model")}


def _context(rows: pd.DataFrame) -> Conditions:
    """``context_tokens`` (smallest, largest), ``context`` (in words) and ``truncated``: the
    share of it long context cut to fit the window (nothing: no context size in ``rows``)."""
    out: Conditions = {}
    for col in ("context_tokens", "input_context_tokens"):
        if col in rows.columns and rows[col].notna().any():
            sizes = rows.groupby("example_id")[col].max().dropna().astype(float)
            lo, hi = int(sizes.min()), int(sizes.max())
            shared = lo == hi and "context_tokens" not in rows.columns
            out["context_tokens"] = (lo, hi)
            out["context"] = _context_words(lo, hi, shared)
            break
    if "context" not in out:
        return out
    fitted = (
        rows[rows["input_context_tokens"].notna()] if "input_context_tokens" in rows else rows[:0]
    )
    if len(fitted):  # what long context had to cut to fit the window
        cut = fitted["truncated_tokens"].fillna(0).sum() if "truncated_tokens" in fitted else 0
        out["truncated"] = float(cut / max(fitted["input_context_tokens"].sum(), 1))
        read = f"cut {out['truncated']:.0%} of it to fit the window" if cut else "read all of it"
        out["context"] += f" (long context {read})"
    return out


def _context_words(lo: int, hi: int, shared: bool) -> str:
    """The context size in words: one shared corpus, one size, or a range."""
    if shared:
        return f"a {lo:,}-token corpus"
    if lo == hi:
        return f"a {lo:,}-token context"
    return f"contexts of {lo:,}-{hi:,} tokens"


def _price_sheet(rows: pd.DataFrame) -> Conditions:
    """``price_sheet`` (the names) and ``price_sheet_date`` (one sheet's; None: several, or
    unreadable); nothing when no row was priced."""
    if "price_sheet" not in rows.columns or not rows["price_sheet"].notna().any():
        return {}
    names = list(dict.fromkeys(rows["price_sheet"].dropna().astype(str)))
    try:
        date = price_sheet(names[0]).date if len(names) == 1 else None
    except (ValueError, OSError, KeyError):
        date = None
    return {"price_sheet": ", ".join(names), "price_sheet_date": date}
