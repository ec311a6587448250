"""The conditions a verdict holds for, read from a results table (and its run's manifest)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ragbench.cost.prices import price_sheet
from ragbench.io import read_json
from ragbench.judge.agreement import repeat_agreement


def conditions(df: Any, rows: Any, metric: str | None = None) -> dict[str, Any]:
    """What a verdict holds for, from a results table (``rows``: the compared variants' rows):
    question count (``questions``: scored; ``asked``: answered, where more were than scored),
    model, context or corpus size, the share of it long context cut to fit the window, the
    price sheet with its date, the pipelines that answered from their own index
    (``own_index``: their labels), and when ``metric`` is judged more than once per answer
    (``judge.repeats``) how far the repeats agree (``judge``: ``judge.repeat_agreement`` of
    ``rows``)."""
    out: dict[str, Any] = {"questions": int(rows["example_id"].nunique())}
    answered = df[df["error"].isna()] if "error" in df.columns else df
    if "example_id" in answered.columns:  # asked and paid for, scored or not (no gold answer)
        asked = int(answered["example_id"].nunique())
        if asked > out["questions"]:
            out["asked"] = asked
    if metric is not None and (judged := repeat_agreement(rows, metric)) is not None:
        out["judge"] = judged
    if "model" in df.columns and df["model"].notna().any():
        out["model"] = ", ".join(map(str, dict.fromkeys(df["model"].dropna())))
    elif df.attrs.get("run_dir"):
        manifest = read_json(Path(df.attrs["run_dir"]) / "manifest.json") or {}
        model = (manifest.get("config") or {}).get("model") or {}
        out["model"] = model.get("name") or (manifest.get("model") or {}).get("model")
    for col in ("context_tokens", "input_context_tokens"):
        if col in rows.columns and rows[col].notna().any():
            sizes = rows.groupby("example_id")[col].max().dropna().astype(float)
            lo, hi = int(sizes.min()), int(sizes.max())
            shared = lo == hi and "context_tokens" not in rows.columns
            out["context_tokens"] = (lo, hi)
            out["context"] = (f"a {lo:,}-token corpus" if shared else f"a {lo:,}-token context"
                              if lo == hi else f"contexts of {lo:,}-{hi:,} tokens")  # fmt: skip
            break
    fitted = (
        rows[rows["input_context_tokens"].notna()] if "input_context_tokens" in rows else rows[:0]
    )
    if len(fitted) and "context" in out:  # what long context had to cut to fit the window
        cut = fitted["truncated_tokens"].fillna(0).sum() if "truncated_tokens" in fitted else 0
        out["truncated"] = float(cut / max(fitted["input_context_tokens"].sum(), 1))
        read = f"cut {out['truncated']:.0%} of it to fit the window" if cut else "read all of it"
        out["context"] += f" (long context {read})"
    # a pipeline's own index: strategies/pipeline/strategy.py
    if "pipeline_index" in rows.columns and "label" in rows.columns:
        own = rows[rows["pipeline_index"] == "own index"]
        if len(own):  # it read other documents than long context and the built-in RAG
            out["own_index"] = list(dict.fromkeys(own["label"].astype(str)))
    if "price_sheet" in rows.columns and rows["price_sheet"].notna().any():
        names = list(dict.fromkeys(rows["price_sheet"].dropna().astype(str)))
        out["price_sheet"] = ", ".join(names)
        try:
            out["price_sheet_date"] = price_sheet(names[0]).date if len(names) == 1 else None
        except (ValueError, OSError, KeyError):
            out["price_sheet_date"] = None
    return out
