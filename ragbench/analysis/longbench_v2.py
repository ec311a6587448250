"""LongBench v2's results table: accuracy overall, by difficulty and by length bucket.

``longbench_v2_table(df)`` is THUDM/LongBench ``result.py``'s table (columns Overall, Easy,
Hard, Short, Medium, Long: 100 x the mean accuracy, rounded to one decimal), one row per
strategy variant of a ragbench results table, plus ``n`` (the scored questions). As in
``result.py``, a question whose difficulty is not ``easy`` counts as hard and one whose length is
neither ``short`` nor ``medium`` as long; a bucket with no question is NaN (``result.py`` would
divide by zero); rows without a score (a generation error, which ``pred.py`` would have left out
of its file) are left out. ``compensated=True`` is ``result.py``'s switch: a reply from which
no letter can be extracted counts 0.25 instead of 0.

The facts come from the examples' meta (``datasets.longbench_v2``), which the results table
carries as columns (``difficulty``, ``length``; ``ex_difficulty`` / ``ex_length`` when a name
is taken by another section).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ragbench.analysis._common import _check_metric, check_one_row_each
from ragbench.analysis.labels import with_labels
from ragbench.metrics.longbench_v2 import COMPENSATED, METRIC, extract_answer

if TYPE_CHECKING:
    import pandas as pd

COLUMNS = ("Overall", "Easy", "Hard", "Short", "Medium", "Long")


def _fact(df: pd.DataFrame, name: str) -> pd.Series:
    for column in (name, f"ex_{name}"):
        if column in df:
            return df[column]
    raise ValueError(
        f"the results table has no {name!r} column: it is not a LongBench v2 run "
        "(import the data with `ragbench data import longbench-v2` or dataset longbench-v2)"
    )


def longbench_v2_table(
    df: pd.DataFrame, metric: str = METRIC, compensated: bool = False
) -> pd.DataFrame:
    """``result.py``'s table, one row per variant (``label``); see the module docstring."""
    import pandas as pd

    metric = _check_metric(df, metric)
    df = with_labels(df)
    check_one_row_each(df)
    scored = df[pd.to_numeric(df[metric], errors="coerce").notna()].copy()
    acc = pd.to_numeric(scored[metric]).astype(float)
    if compensated:
        none = [extract_answer(str(p)) is None for p in scored["prediction"]]
        acc = acc.where(~pd.Series(none, index=scored.index), COMPENSATED)
    scored["_acc"] = acc
    easy = _fact(scored, "difficulty") == "easy"
    length = _fact(scored, "length")
    groups = {
        "Overall": pd.Series(True, index=scored.index),
        "Easy": easy,
        "Hard": ~easy,
        "Short": length == "short",
        "Medium": length == "medium",
        "Long": ~length.isin(["short", "medium"]),
    }
    rows = []
    for label, part in scored.groupby("label", sort=False):
        row: dict[str, object] = {"label": label}
        for name in COLUMNS:
            values = part["_acc"][groups[name].loc[part.index]]
            row[name] = round(100 * float(values.mean()), 1) if len(values) else float("nan")
        row["n"] = len(part)
        rows.append(row)
    return pd.DataFrame(rows, columns=["label", *COLUMNS, "n"])
