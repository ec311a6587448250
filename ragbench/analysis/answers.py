"""What the answers say about the model, before any comparison is read: too many empty answers
(a server's chat template or stop strings cutting every answer short), or a model too weak for
the questions (every variant near the floor, or none above closed book), where the verdict's
comparison of RAG and long context says nothing about how a stronger model would compare.

The verdict leads with these lines (``analysis.verdict``); they are computed here so that the
sentence and its caveats read the same table.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ragbench.analysis._common import _higher_is_better, counted
from ragbench.analysis.families import BASELINE
from ragbench.metrics.answer import aggregate
from ragbench.strategies import strategies_where

if TYPE_CHECKING:
    import pandas as pd

EMPTY_SHARE = 0.1  # more than this share of a variant's answers empty: the verdict says so
WEAK_FLOOR = 0.30  # every variant's upper 95% bound below this: the model is too weak to tell


@dataclass(frozen=True)
class EmptyAnswers:
    """One variant's empty answers: ``empty`` of its ``answered`` (error rows apart)."""

    label: str
    empty: int
    answered: int

    @property
    def text(self) -> str:
        return (
            f"{self.empty:,} of {counted(self.answered, 'answer')} empty for {self.label}: "
            "check the server's chat template and stop strings"
        )


def count_empty_answers(df: pd.DataFrame, share: float = EMPTY_SHARE) -> list[EmptyAnswers]:
    """The variants (``label``, config order) more than ``share`` of whose answers are empty: a
    prediction blank after stripping, error rows apart (they have no answer to judge), and
    strategies that generate no answer (``retrieve_only``) left out. An empty answer scores 0
    whatever the model knows, so a variant full of them measures the server's settings (a chat
    template the model does not follow, a stop string that ends every answer at once), not the
    strategy."""
    if "prediction" not in df or "label" not in df:
        return []
    rows = df[df["error"].isna()] if "error" in df else df
    if "strategy" in rows:
        rows = rows[~rows["strategy"].isin(strategies_where(generates=False))]
    blank = rows["prediction"].fillna("").astype(str).str.strip().eq("")
    counts = blank.groupby(rows["label"], sort=False).agg(["sum", "size"])
    return [
        EmptyAnswers(str(label), int(row["sum"]), int(row["size"]))
        for label, row in counts.iterrows()
        if row["size"] and row["sum"] > share * row["size"]
    ]


def weak_model_line(
    df: pd.DataFrame, table: pd.DataFrame, metric: str, floor: float = WEAK_FLOOR, seed: int = 0
) -> str | None:
    """Why the model is too weak for the verdict's comparison to say anything, or None. Two
    ways, for a higher-is-better metric scored 0 to 1 (a share of questions answered):

    - every variant's upper 95% bound (the summary's interval: Wilson for 0/1 scores) is below
      ``floor``: at most that share could be answered by any variant, so RAG and long context
      differ by a few lucky questions and a stronger model may rank them either way;
    - closed book (no documents) scores strictly higher than every variant that reads the
      documents: the model does not use them. A tie is not this case: a model that knows the
      answers without the documents (a strong one) scores the same with them.

    ``table``: the verdict's variants (``score``, ``family``) indexed by label. The line names
    the numbers and what to do: try a stronger model."""
    scores = df[metric].dropna()
    shares = len(scores) and scores.min() >= 0 and scores.max() <= 1
    if not shares or not _higher_is_better(metric) or table.empty:
        return None
    bounds = aggregate(df[df[metric].notna()], ["label"], metric, seed=seed)["ci_high"]
    if (bounds < floor).all():
        return (
            f"every variant answered at most {_share(table['score'].max())} of the questions "
            f"(the highest upper 95% bound, {_share(bounds.max())}, is below {_share(floor)}): "
            "the model is too weak for these questions to tell how a stronger one would "
            "compare; try a stronger model"
        )
    base = table[table["family"] == BASELINE]["score"]
    readers = table[table["family"] != BASELINE]["score"]
    if base.empty or readers.empty or base.max() <= readers.max():
        return None
    return (
        f"no variant beats closed book: {base.idxmax()} scored {_share(base.max())} without the "
        f"documents, more than every variant that reads them (best {readers.idxmax()}: "
        f"{_share(readers.max())}): the model does not use the documents, so it is too weak "
        "for these questions to tell how a stronger one would compare; try a stronger model"
    )


def _share(x: float) -> str:
    """A share as the verdict writes a 0/1 score: 15.4%, 0%."""
    return f"{100 * x:.3g}%"
