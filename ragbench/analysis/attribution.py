"""Failure attribution: why each wrong answer was wrong (retrieval, reader, distractor,
truncation), and where in the context the missed evidence sat.

A long-context miss is ``truncated`` when its record says the overflow policy cut evidence away
(meta ``evidence_truncated``, ``lc_evidence_truncated`` for Self-Route's long-context branch),
``reader_miss`` when every evidence span was in the kept text, and ``context_truncated`` only
when tokens were cut and the example has no evidence spans to tell (or the table predates the
column)."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, cast

from ragbench.analysis._common import _check_metric, check_one_row_each
from ragbench.analysis.labels import with_labels
from ragbench.strategies import FULL_CONTEXT, NO_CONTEXT, RETRIEVED, Contexts, contexts_of
from ragbench.strategies.fit import document_layout
from ragbench.strategies.prompts import is_declined
from ragbench.types import Example

if TYPE_CHECKING:
    import pandas as pd

# Causes of a wrong answer, in the order they are checked (the first that applies wins): missing
# evidence explains everything after it, so it comes first.
CAUSES = (
    "retrieval_miss",  # RAG: no gold evidence in the retrieved context (meta gold_hit False)
    "truncated",  # long context: the overflow policy cut evidence away (evidence_truncated)
    "distractor_answer",  # the answer names another key's value (RULER multikey, hard needles)
    "context_truncated",  # long context: the context was cut; no evidence spans tell what went
    "reader_miss",  # the evidence was in the prompt (kept by any cut) and the answer is wrong
    "no_context",  # closed book: the model was given no context
    "unattributed",  # a miss with nothing recorded to explain it (no evidence spans)
)
OUTCOMES = ("correct", *CAUSES, "error")

# RULER / multidoc needle: "One of the special magic numbers for quiet-lake is: 4817263."
_NEEDLE = re.compile(
    r"special magic [a-z]+ for (?P<key>[^\n:]+?) (?:is|are):?\s+(?P<value>[^\s,;]+?)"
    r"(?=[.,;]?(?:\s|$))",
    re.IGNORECASE,
)


def distractor_values(example: Example) -> tuple[str, ...]:
    """Values in ``example``'s context that answer some *other* key: ``meta["distractor_values"]``
    when the dataset stores it, else every keyed needle ("special magic ... for KEY is: VALUE")
    whose key is not asked (``meta["keys"]``) and whose value is not a gold answer. Covers RULER
    multikey (distractor keys and, with the needles haystack, filler needles) and multidoc."""
    meta = example.meta or {}
    if meta.get("distractor_values") is not None:
        return tuple(str(v) for v in meta["distractor_values"])
    asked = {str(k).lower() for k in meta.get("keys", ())}
    gold = {a.lower() for a in example.answers}
    found = []
    for m in _NEEDLE.finditer(example.context):
        key, value = m["key"].strip().lower(), m["value"]
        if key not in asked and value.lower() not in gold:
            found.append(value)
    return tuple(dict.fromkeys(found))


def names_value(prediction: str, values: Iterable[str]) -> bool:
    """Whether ``prediction`` contains one of ``values`` as a whole token (case-insensitive), so
    "123" is not found inside "41234"."""
    text = prediction or ""
    return any(
        re.search(rf"(?<![\w-]){re.escape(v)}(?![\w-])", text, re.IGNORECASE) for v in values if v
    )


def evidence_depth(example: Example) -> float:
    """Where the (first) evidence span starts in the long-context prompt's context, as a
    percentage of its characters (NaN without evidence spans)."""
    spans = (example.meta or {}).get("evidence") or []
    if not spans:
        return float("nan")
    offsets: dict[str, int] = {}
    layout = document_layout(example.documents)  # where join_documents puts each text
    for doc_id, _, text_start, _ in layout:
        offsets.setdefault(doc_id, text_start)
    total = max(1, layout[-1][3] if layout else 0)
    starts = [offsets[d] + s for d, s, _ in spans if d in offsets]
    return 100.0 * min(starts) / total if starts else float("nan")


def _cell(row: Mapping[str, object], name: str) -> Any:
    """A row's value, None when absent or NaN (a column other strategies' rows fill)."""
    value = row.get(name)
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    return value


def _source(read: Contexts) -> str:
    """Which call produced the answer (``NO_CONTEXT``, ``RETRIEVED``, ``FULL_CONTEXT``), as the
    row's strategy declares it (``strategies.contexts_of``; a router: the branch its ``route``
    names); the strategy name when it declares none."""
    return read.source or read.strategy


def _flag(value: Any) -> bool | None:
    """A stored boolean (None: unknown); parquet may keep a mixed column as JSON text."""
    if isinstance(value, str):
        return {"true": True, "false": False}.get(value.strip().lower())
    return None if value is None else bool(value)


def _cause(row: Mapping[str, Any], read: Contexts, distractor: bool) -> str:
    source = _source(read)
    lc = read.meta_prefix  # a router's long-context branch records its facts with an lc_ prefix
    if source == RETRIEVED:
        hit = _cell(row, "gold_hit")
        if hit is not None and not bool(hit):
            return "retrieval_miss"
        if distractor:
            return "distractor_answer"
        return "reader_miss" if hit is not None else "unattributed"
    if source == FULL_CONTEXT:
        # ``evidence_truncated`` (strategies.fit.kept_facts): whether the evidence spans lie
        # outside the text the overflow policy kept; None (or an older table without it) when
        # the example has no spans, and then only the tokens cut say the context lost something
        cut = _flag(_cell(row, f"{lc}evidence_truncated"))
        if cut:
            return "truncated"
        if distractor:
            return "distractor_answer"
        if cut is None and (_cell(row, f"{lc}truncated_tokens") or 0) > 0:
            return "context_truncated"
        return "reader_miss"
    if source == NO_CONTEXT:
        return "distractor_answer" if distractor else "no_context"
    return "distractor_answer" if distractor else "unattributed"


def attribute(
    df: pd.DataFrame,
    metric: str | None = None,
    examples: Iterable[Example] | Mapping[str, Example] | None = None,
    threshold: float = 1.0,
) -> pd.DataFrame:
    """Why each record's answer was wrong: one row per record with ``example_id``, ``strategy``,
    ``label``, ``source`` (the call that answered: rag, long_context, closed_book; Self-Route's
    routed branch), ``score``, ``correct`` (score >= ``threshold``), ``outcome`` ("correct",
    one of ``CAUSES``, or "error"), ``distractor_named`` (the prediction names another key's
    value, whatever the cause), ``declined`` (it said "unanswerable"), ``evidence_depth``
    (percent) and ``distractors_known``.

    ``examples`` (the run's ``Example``s, a list or a dict by id) supply what the table does not
    hold: distractor values (parsed from the needles) and the evidence depth. Without them the
    depth comes from a ``depth_percent`` column (NIAH) and no answer is called a distractor.
    """
    import pandas as pd

    df = with_labels(df)
    check_one_row_each(df)  # attribution_table counts records per variant
    metric = _check_metric(df, metric)
    if isinstance(examples, Mapping):
        by_id = dict(examples)
    else:
        by_id = {e.id: e for e in examples or ()}
    distractors = {i: distractor_values(e) for i, e in by_id.items()}
    depths = {i: evidence_depth(e) for i, e in by_id.items()}
    out = []
    for row in cast("list[dict[str, Any]]", df.to_dict("records")):
        ex = row["example_id"]
        score = _cell(row, metric)
        error = _cell(row, "error")
        values = distractors.get(ex, ())
        stored = _cell(row, "distractor_values")  # a future column wins over parsing
        if stored is not None:
            # parquet keeps a list column as JSON text when pyarrow cannot type it
            values = tuple(json.loads(stored) if isinstance(stored, str) else stored)
        prediction = row.get("prediction") or ""
        named = names_value(prediction, values)
        read = contexts_of(row)
        source = _source(read)
        correct = score is not None and error is None and score >= threshold
        if error is not None or score is None:
            outcome = "error"
        elif correct:
            outcome = "correct"
        else:
            outcome = _cause(row, read, named)
        depth = depths.get(ex, float("nan"))
        if math.isnan(depth) and _cell(row, "depth_percent") is not None:
            depth = float(row["depth_percent"])
        out.append(
            {
                "example_id": ex,
                "strategy": row["strategy"],
                "label": row["label"],
                "source": source,
                "score": score,
                "correct": bool(correct),
                "outcome": outcome,
                "distractor_named": bool(named),
                "declined": is_declined(prediction),
                "evidence_depth": depth,
                "distractors_known": bool(values),
            }
        )
    table = pd.DataFrame(out)
    if len(table):
        table["outcome"] = pd.Categorical(table["outcome"], categories=OUTCOMES)
    table.attrs.update(metric=metric, threshold=threshold)
    return table


def attribution_table(records: pd.DataFrame) -> pd.DataFrame:
    """Per variant (config order): ``n`` records, ``correct``, ``misses``, one count column per
    outcome in ``CAUSES`` and ``error``, and ``mean_miss_depth`` (mean evidence depth of the
    misses, percent). ``records``: the output of ``attribute``."""
    import pandas as pd

    order = list(dict.fromkeys(records["label"]))
    counts = pd.crosstab(records["label"], records["outcome"], dropna=False)
    counts = counts.reindex(index=order, columns=list(OUTCOMES), fill_value=0)
    misses = records[~records["correct"] & (records["outcome"] != "error")]
    depth = misses.groupby("label", sort=False)["evidence_depth"].mean()
    strategy = records.drop_duplicates("label").set_index("label")["strategy"]
    table = pd.DataFrame({"strategy": strategy.reindex(order), "n": counts.sum(axis=1)})
    table["correct"] = counts["correct"]
    table["misses"] = counts[list(CAUSES)].sum(axis=1)
    table = table.join(counts[[*CAUSES, "error"]])
    table["mean_miss_depth"] = depth.reindex(order)
    return table.rename_axis("label").reset_index()
