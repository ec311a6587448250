"""How far to trust a judge: agreement of its repeated samples (Fleiss' kappa) and with the
string metrics where gold answers exist (Cohen's kappa against exact match and F1 >= 0.5).

The context metrics (``context_metrics``; any metric whose class says ``by_unit``) give one
verdict per context, statement or generated question in each sample; their Fleiss' kappa is over those units (the items), each rated by every
sample: do the samples agree on which contexts were useful, which statements supported, whether
the answer was committal.

Kappa is agreement corrected for chance: 1 perfect, 0 what chance alone gives, below 0 worse
than chance. Landis and Koch's reading (0.41-0.60 moderate, 0.61-0.80 substantial) is the usual
yardstick; below ``LOW_KAPPA`` the summary warns. When every rating is the same category kappa
is undefined (chance agreement is already 1) and reported as NaN, never as 1.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, TypedDict, cast

import numpy as np

from ragbench.judge.metric import JUDGE_METRICS, get_judge_metric, judged_metrics
from ragbench.metrics.answer import exact_match, f1

if TYPE_CHECKING:
    import pandas as pd

LOW_KAPPA = 0.4  # below this (Landis-Koch: "fair" or worse) the summary warns
# judges that are known to be too small to trust: the summary names them with their kappa
SMALL_JUDGES = ("smollm2-135m-instruct", "gemma-3-270m")


def cohen_kappa(a: Sequence[int], b: Sequence[int]) -> float:
    """Cohen's kappa of two raters' labels over the same items (any hashable labels).
    NaN when there are no items or chance agreement is 1 (both raters constant and equal)."""
    a, b = list(a), list(b)
    if len(a) != len(b):
        raise ValueError(f"cohen_kappa: {len(a)} labels against {len(b)}")
    n = len(a)
    if n == 0:
        return math.nan
    cats = sorted(set(a) | set(b), key=str)
    observed = sum(x == y for x, y in zip(a, b, strict=True)) / n
    expected = sum((a.count(c) / n) * (b.count(c) / n) for c in cats)
    return math.nan if expected >= 1.0 else (observed - expected) / (1.0 - expected)


def fleiss_kappa(ratings: Sequence[Sequence[int]]) -> float:
    """Fleiss' kappa of items each rated by the same number (>= 2) of raters (here: judge
    samples); ``ratings[i]`` is item i's labels. NaN when undefined (no items, one category)."""
    rows = [list(r) for r in ratings]
    if not rows:
        return math.nan
    n = len(rows[0])
    if n < 2 or any(len(r) != n for r in rows):
        raise ValueError("fleiss_kappa: every item needs the same number (>= 2) of ratings")
    cats = sorted({c for r in rows for c in r}, key=str)
    counts = np.array([[r.count(c) for c in cats] for r in rows], dtype=float)  # items x cats
    p_item = ((counts**2).sum(axis=1) - n) / (n * (n - 1))
    p_cat = counts.sum(axis=0) / counts.sum()
    p_bar, p_exp = float(p_item.mean()), float((p_cat**2).sum())
    return math.nan if p_exp >= 1.0 else (p_bar - p_exp) / (1.0 - p_exp)


def _column(df: pd.DataFrame, name: str) -> pd.Series | None:
    """A table column by its name, or with the section prefix results.py adds on a clash."""
    for candidate in (name, f"score_{name}", f"meta_{name}"):
        if candidate in df.columns:
            return df[candidate]
    return None


def _as_list(value: object) -> list | None:
    """A meta list cell as a list (parquet gives numpy arrays, a JSON fallback text)."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return None
    return list(value) if hasattr(value, "__iter__") else None


def _items(cell: object, by_unit: bool) -> list[list]:
    """A verdicts cell as items rated by the samples: a judge metric's cell (one verdict per
    sample) is one item; a context metric's (per sample, per unit) is one item per unit."""
    rows = _as_list(cell)
    if not rows or not by_unit:
        return [rows] if rows else []
    per_sample = [_as_list(r) for r in rows]
    lists = [r for r in per_sample if r is not None]
    if len(lists) != len(per_sample) or len({len(r) for r in lists}) != 1:
        return []
    return [list(unit) for unit in zip(*lists, strict=True)]


def judge_agreement(df: pd.DataFrame) -> pd.DataFrame:
    """One row per judge metric in the results table ``df``:

    - ``n_scored`` / ``n_unscored``: records with a verdict / without one (NaN, the reason in
      ``<metric>_note``: no gold answers, no context, over the judge's window, unreadable), and
      of those ``n_unreadable``: the judge answered but no reply could be parsed; error rows
      are left out;
    - ``samples``: judge samples per record; ``fleiss_kappa`` over the records where every
      sample was read (``n_fleiss`` of them), NaN with one sample; for the context metrics
      over their units (contexts, statements, questions: ``n_fleiss`` of those) instead;
    - for ``judge_correct`` (a metric whose class says ``against_strings``) on records with
      gold answers (``n_gold``): ``agree_exact_match``
      (share of records where the judge's majority verdict equals exact match),
      ``kappa_exact_match`` and ``kappa_f1`` (Cohen's kappa against exact match and against
      F1 >= 0.5, both computed here from the prediction and the gold answers);
    - ``judge_model``: the judge that produced the verdicts.
    """
    import pandas as pd

    rows = []
    ok = df[df["error"].isna()] if "error" in df.columns else df
    for metric in judged_metrics():
        kind = get_judge_metric(metric)
        scores = _column(ok, metric)
        if scores is None:
            continue
        scores = pd.to_numeric(scores, errors="coerce")
        samples_col = _column(ok, f"{metric}_samples")
        note_col = _column(ok, f"{metric}_note")
        attempted = scores.notna() | (note_col.notna() if note_col is not None else False)
        if not attempted.any():
            continue
        model_col = _column(ok, "judge_model")
        row: dict[str, Any] = {
            "metric": metric,
            "judge_model": (
                ", ".join(sorted({str(m) for m in model_col[attempted].dropna()}))
                if model_col is not None
                else None
            ),
            "n_scored": int(scores.notna().sum()),
            "n_unscored": int((attempted & scores.isna()).sum()),
            "n_unreadable": int(
                (scores.isna() & note_col.astype(str).str.contains("unreadable", regex=False)).sum()
                if note_col is not None
                else 0
            ),
        }
        full = []
        if kind.by_unit:  # items: the units of every record, rated by each sample
            samples_col = _column(ok, f"{metric}_verdicts")
        for cell in samples_col[attempted] if samples_col is not None else []:
            for verdicts in _items(cell, kind.by_unit):
                if verdicts and all(v is not None and v == v for v in verdicts):
                    full.append([int(v) for v in verdicts])
        sizes = {len(r) for r in full}
        row["samples"] = max(sizes) if sizes else 1
        same_size = [r for r in full if len(r) == row["samples"]]
        row["n_fleiss"] = len(same_size) if row["samples"] > 1 else 0
        row["fleiss_kappa"] = fleiss_kappa(same_size) if row["n_fleiss"] else math.nan
        if kind.against_strings:
            judged, em, f1_ok = [], [], []
            for i in ok.index[scores.notna()]:
                cell = ok.at[i, "answers"] if "answers" in ok else []
                answers = [a for a in cast("list[str]", cell) if a]
                if not answers:
                    continue
                prediction = str(ok.at[i, "prediction"] or "")
                judged.append(int(scores[i] >= 0.5))  # majority of the samples; a tie counts
                em.append(int(exact_match(prediction, answers)))
                f1_ok.append(int(f1(prediction, answers) >= 0.5))
            row["n_gold"] = len(judged)
            row["agree_exact_match"] = (
                float(np.mean([j == e for j, e in zip(judged, em, strict=True)]))
                if judged
                else math.nan
            )
            row["kappa_exact_match"] = cohen_kappa(judged, em)
            row["kappa_f1"] = cohen_kappa(judged, f1_ok)
        rows.append(row)
    columns = [
        "metric",
        "judge_model",
        "n_scored",
        "n_unscored",
        "n_unreadable",
        "samples",
        "n_fleiss",
        "fleiss_kappa",
        "n_gold",
        "agree_exact_match",
        "kappa_exact_match",
        "kappa_f1",
    ]
    return pd.DataFrame(rows, columns=columns)


class RepeatAgreement(TypedDict):
    """``repeat_agreement``'s result (a dict, read by key)."""

    metric: str
    repeats: int
    kappa: float  # Fleiss' kappa across the repeats; NaN when undefined
    n_kappa: int
    n_scored: int
    differed: float
    mean_spread: float
    low: bool
    judge_model: str | None


def repeat_agreement(df: pd.DataFrame, metric: str) -> RepeatAgreement | None:
    """How far a judged ``metric``'s repeats (``judge.repeats`` > 1) agree in the table ``df``
    (None: not a judged metric, or judged once): ``repeats`` per record, ``kappa`` (Fleiss'
    kappa across them, as ``judge_agreement``; NaN when undefined) over ``n_kappa`` items,
    ``n_scored`` records, ``differed``: the share of those whose readable repeats did not all
    give the same score, ``mean_spread``: their mean ``<metric>_spread`` (standard deviation of
    the repeats, ``calls.keep_repeats``), ``low``: kappa below ``LOW_KAPPA``, and
    ``judge_model``. Read from ``<metric>_samples`` (and ``_verdicts``), so a table written
    before ``<metric>_spread`` existed gives the same numbers."""
    if metric not in JUDGE_METRICS or not get_judge_metric(metric).asks_llm:
        return None
    table = judge_agreement(df)
    found = table[table["metric"] == metric]
    if found.empty or int(found.iloc[0]["samples"]) < 2:
        return None
    row = found.iloc[0]
    ok = df[df["error"].isna()] if "error" in df.columns else df
    spreads = []
    cells = _column(ok, f"{metric}_samples")
    for cell in cells if cells is not None else []:
        read = [float(x) for x in (_as_list(cell) or []) if x is not None and x == x]
        if len(read) > 1:
            mean = sum(read) / len(read)
            spreads.append((sum((x - mean) ** 2 for x in read) / len(read)) ** 0.5)
    kappa = float(row["fleiss_kappa"])
    return {
        "metric": metric,
        "repeats": int(row["samples"]),
        "kappa": kappa,
        "n_kappa": _count(row["n_fleiss"]),
        "n_scored": _count(row["n_scored"]),
        "differed": float(np.mean([x > 1e-12 for x in spreads])) if spreads else math.nan,
        "mean_spread": float(np.mean(spreads)) if spreads else math.nan,
        "low": kappa == kappa and kappa < LOW_KAPPA,
        "judge_model": row["judge_model"],
    }


def _count(n: float | None) -> int:
    """A count cell of the agreement table (NaN where it does not apply) as an int."""
    return 0 if n is None or n != n else int(n)


def _fmt(k: float) -> str:
    return "undefined (every verdict the same)" if k != k else f"{k:.2f}"


def judge_warnings(df: pd.DataFrame, agreement: pd.DataFrame | None = None) -> list[str]:
    """Plain-language warnings about the judge numbers in ``df`` (empty: nothing to say): a
    small embedded judge (always, with its measured kappa), low agreement with exact match or
    F1, judge repeats that disagree, and verdicts that could not be read."""
    table = judge_agreement(df) if agreement is None else agreement
    out = []
    for row in table.to_dict("records"):
        metric, model = row["metric"], row["judge_model"] or "the judge"
        kappas = [
            f"Cohen's kappa {_fmt(row[k])} against {what} (n={_count(row['n_gold'])})"
            for k, what in (("kappa_exact_match", "exact match"), ("kappa_f1", "F1 >= 0.5"))
            if _count(row.get("n_gold")) and k in row
        ]
        if row["n_fleiss"]:
            kappas.append(
                f"Fleiss' kappa {_fmt(row['fleiss_kappa'])} across {row['samples']} repeats "
                f"(n={row['n_fleiss']})"
            )
        measured = "; ".join(kappas) or "no agreement measured (one repeat, no gold answers)"
        if any(small in str(model) for small in SMALL_JUDGES):
            out.append(
                f"{metric}: the judge is the small embedded model {model}, whose verdicts agree "
                f"poorly with the string metrics and with themselves ({measured}); use it to try "
                "the pipeline, and a stronger judge model for numbers you act on."
            )
        else:
            low = [
                name
                for key, name in (
                    ("kappa_exact_match", "exact match"),
                    ("kappa_f1", "F1 >= 0.5"),
                    ("fleiss_kappa", "its own repeats"),
                )
                if row.get(key) is not None and row[key] == row[key] and row[key] < LOW_KAPPA
            ]
            if low:
                out.append(
                    f"{metric}: the judge {model} agrees poorly with {' and '.join(low)} "
                    f"({measured}); read its scores with care."
                )
        if row["n_unreadable"]:
            out.append(
                f"{metric}: {row['n_unreadable']} of {row['n_scored'] + row['n_unscored']} "
                "judgements could not be read from the judge's replies after retries; they are "
                f"unscored (NaN, see the {metric}_note column), not counted as wrong."
            )
    return out
