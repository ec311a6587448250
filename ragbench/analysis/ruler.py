"""A results table laid out as RULER reports it: tasks down, context lengths across, an average.

RULER (NVIDIA/RULER, ``scripts/eval/evaluate.py``) scores each task with its own metric,
``string_match_all`` for the NIAH family, vt, cwe and fwe and ``string_match_part`` for qa_1 and
qa_2, as a percentage of the examples rounded to two decimals, and summarises a model by the
mean over tasks at each length. ``ruler_table`` does the same for every strategy variant of a
ragbench results table, so its rows can sit beside RULER's published numbers: a ``(label,
task)`` row per variant and task, a column per context length and ``avg`` (the row's mean over
lengths), and per variant an ``all tasks`` row (the mean over tasks at each length, RULER's
headline). Each row is scored by the metric its examples name (``meta["ruler_metric"]``, the
``ruler_metric`` column: every ragbench RULER task sets it), unless ``metric`` names one for
all. Failed records have no score and are left out, as in ``summary``; the notes say so.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ragbench.analysis._common import _scored, default_metric, resolve_metric
from ragbench.analysis.labels import with_labels
from ragbench.datasets import RULER_PRESETS, RULER_TASKS

if TYPE_CHECKING:
    import pandas as pd

ALL_TASKS = "all tasks"  # the per-variant row averaging the tasks at each length
AVERAGE = "avg"  # the column averaging the lengths of a row
ORDER = tuple(dict.fromkeys((*RULER_PRESETS, *RULER_TASKS, "qa")))  # RULER's order first, once


def ruler_scores(df: pd.DataFrame, metric: str | None = None) -> pd.Series:
    """Each row's score under RULER's metric for its task (``ruler_metric``), or ``metric``
    for every row; NaN where a row has none (an error record)."""
    import pandas as pd

    if metric is not None or "ruler_metric" not in df.columns:
        name = resolve_metric(df, metric)
        return _scored(df, name)[name].reindex(df.index)
    fallback = default_metric(df)
    wanted = df["ruler_metric"].fillna(fallback)
    missing = sorted(set(wanted) - set(df.columns))
    if missing:
        tasks = sorted(set(df.loc[wanted.isin(missing), "task"].astype(str)))
        raise ValueError(
            f"RULER scores {', '.join(tasks)} with {', '.join(missing)}, which the table does not "
            f"have: add it to the config's metrics (metrics: [string_match_all, "
            f"string_match_part] covers every RULER task)"
        )
    ok = df["error"].isna() if "error" in df.columns else pd.Series(True, index=df.index)
    values = [
        df.at[i, m] if good else float("nan")
        for (i, m), good in zip(wanted.items(), ok, strict=True)
    ]
    return pd.Series(values, index=df.index, dtype=float)


def _count(sizes: pd.Series) -> str:
    low, high = int(sizes.min()), int(sizes.max())
    return f"{low}" if low == high else f"{low} to {high}"


def ruler_table(
    df: pd.DataFrame, metric: str | None = None, task: str = "task", length: str = "context_length"
) -> pd.DataFrame:
    """Scores in percent (two decimals, as RULER rounds), indexed by ``(label, task)``, one
    column per value of ``length`` and ``avg``; see the module docstring."""
    import pandas as pd

    for column in (task, length):
        if column not in df.columns:
            raise ValueError(
                f"no {column!r} column; the table has {', '.join(map(str, df.columns))}: "
                "a RULER table needs the examples' task and context length"
            )
    df = with_labels(df)
    scored = df.assign(
        _score=ruler_scores(df, metric) * 100, _task=df[task].astype(str).str.removeprefix("ruler/")
    )
    kept = scored.dropna(subset=["_score"])
    cells = kept.groupby(["label", "_task", length])["_score"].agg(["mean", "size"])
    table = cells["mean"].unstack(length)
    lengths = sorted(table.columns)
    table = table[lengths]
    rank = {name: i for i, name in enumerate(ORDER)}
    rows = []
    for label in dict.fromkeys(kept["label"]):
        part = table.loc[label]
        part = part.loc[sorted(part.index, key=lambda t: (rank.get(t, len(rank)), t))]
        if len(part) > 1:
            part = pd.concat([part, part.mean().to_frame(ALL_TASKS).T])
        part.index = pd.MultiIndex.from_product([[label], part.index], names=["label", "task"])
        rows.append(part)
    out = pd.concat(rows) if rows else table
    out[AVERAGE] = out[lengths].mean(axis=1)
    out = out.round(2)
    out.columns.name = "context length (tokens)" if length == "context_length" else length
    sizes = cells["size"]
    dropped = len(scored) - len(kept)
    out.attrs["metric"] = metric or "RULER's per task (ruler_metric)"
    out.attrs["notes"] = [
        f"scores in % of examples; {_count(sizes)} examples per cell"
        + (f"; {dropped} records without a score (failed) left out" if dropped else "")
    ]
    return out


def ruler_text(table: pd.DataFrame) -> str:
    """``ruler_table`` as plain text, every score with the same two decimals (pandas would
    print a column whose scores are all whole as ``100.0`` beside another's ``100.00``), then
    its notes, one a line."""
    text = table.to_string(float_format=lambda x: f"{x:.2f}", na_rep="-")
    return "\n".join([text, *table.attrs.get("notes", [])])
