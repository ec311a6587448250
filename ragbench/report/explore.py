"""The per-question view: one row per question, every variant beside it, as one self-contained
HTML page (``ragbench view``, ``ragbench.explore`` inline in Jupyter, the "Questions" section of
``compare``'s report and the notebooks).

Per question: the question, its gold answers and, per variant, its prediction, right or wrong on
the run's first metric, dollars per 1k queries and latency. Expanding a row shows per variant the
other metrics, the failure cause (``analysis.attribution``), the retrieved chunks in rank order
with their text, score and source document (gold chunks marked, a gold chunk that was not
retrieved listed as missed), what long context kept and cut, Self-Route's route, a judge's notes
and the error. Filters: outcome pairs between two chosen variants (A right / B wrong and the
reverse: the paired table's ``a_only`` / ``b_only``), both wrong, any disagreement, failure cause,
source document; free-text (or regex) search over question, answers and predictions; sort on
any column.

The interactive table is DataTables, embedded from the ``itables`` package's offline bundle
(nothing is fetched: the page opens from ``file://`` and inside a rendered notebook). What
DataTables does not do (the outcome filters and their counts, the expanded evidence) is the small
script below, written by hand: no maintained library pairs variants of one question that way.
Data travel as one JSON block per view; each chunk text once, by ref (``experiment.evidence``).
Two views on one page do not clash: every element and filter is keyed by the view's own id.
"""

from __future__ import annotations

import html
import json
import math
import uuid
from collections.abc import Hashable, Mapping, Sequence
from importlib.resources import files
from os import PathLike
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeAlias

from ragbench.analysis._common import default_metric, metric_columns, own_latency_seconds
from ragbench.analysis.attribution import attribute
from ragbench.analysis.labels import with_labels
from ragbench.experiment.evidence import read_chunks, read_questions
from ragbench.io import atomic_write_text
from ragbench.report.runs import load

if TYPE_CHECKING:
    import pandas as pd

# what the view shows: run folder(s), or a results table (``_frame``)
Runs: TypeAlias = "str | PathLike[str] | Sequence[str | PathLike[str]] | pd.DataFrame"

# long-context facts a record keeps (Self-Route's long-context branch with an lc_ prefix)
LC_FACTS = ("kept_tokens", "truncated_tokens", "evidence_truncated", "dropped_documents")
JUDGE_SUFFIXES = ("_note", "_rationale", "_reason", "_prompt")


def _plain(value: object) -> Any:
    """A table cell as JSON: NaN/NA -> None, numpy scalars and arrays -> Python, JSON text of a
    list (parquet keeps mixed lists so) -> the list."""
    if value is None:
        return None
    if hasattr(value, "tolist"):
        value = value.tolist()
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, str) and value[:1] == "[":
        try:
            return json.loads(value)
        except ValueError:
            return value
    try:
        if value != value:  # pandas NA and NaT
            return None
    except (TypeError, ValueError):
        pass
    return value


def _evidence(row: dict[Hashable, Any], chunks: dict[str, Any], used: dict[str, Any]) -> dict:
    """What one record read, for its expanded cell: retrieved chunks (rank order: ref, score,
    chunk id, gold?), gold chunks not retrieved, long-context cuts, route. The chunk texts it
    points to are put in ``used`` (the page's chunk table)."""
    out: dict[str, Any] = {}
    ids = _plain(row.get("retrieved")) or []
    if row.get("contexts") is not None and _plain(row.get("contexts")):  # a user's pipeline
        contexts = _plain(row["contexts"])
        out["r"] = [
            [None, c.get("score"), c.get("id") or "", False, c.get("doc_id"), c.get("text")]
            for c in contexts
            if isinstance(c, dict)
        ]
    elif ids:
        refs = _plain(row.get("retrieved_refs")) or [None] * len(ids)
        scores = _plain(row.get("retrieved_scores")) or [None] * len(ids)
        gold = set(_plain(row.get("gold_chunks")) or [])
        out["r"] = [
            [ref, score, cid, cid in gold]
            for cid, ref, score in zip(ids, refs, scores, strict=False)
        ]
        gold_refs = dict(
            zip(
                _plain(row.get("gold_chunks")) or [],
                _plain(row.get("gold_refs")) or [],
                strict=False,
            )
        )
        out["miss"] = [[gold_refs.get(g), g] for g in sorted(gold) if g not in ids]
        for ref in [r for r, *_ in out["r"]] + [r for r, _ in out["miss"]]:
            if ref is not None and ref in chunks:
                used[ref] = [chunks[ref]["doc_id"], chunks[ref]["text"]]
    if _plain(row.get("gold_hit")) is not None:
        out["hit"] = bool(_plain(row.get("gold_hit")))
    for prefix in ("", "lc_"):  # Self-Route's long-context branch: lc_
        facts = {k: _plain(row.get(prefix + k)) for k in LC_FACTS}
        if facts["kept_tokens"] is not None:
            out["lc"] = facts
    if _plain(row.get("route")) is not None:
        out["route"] = _plain(row["route"])
    return out


def _judge_notes(row: Mapping[Hashable, object], metrics: Sequence[str]) -> dict[str, object]:
    """A judge's notes beside its scores (``<metric>_note`` and the like), as text."""
    notes = {}
    for metric in metrics:
        for suffix in JUDGE_SUFFIXES:
            value = _plain(row.get(metric + suffix))
            if value not in (None, ""):
                notes[metric + suffix] = value
    return notes


def _cell(row: dict[Hashable, Any], metric: str, others: Sequence[str], cause: str) -> dict:
    """One variant's answer to one question, as the page shows it."""
    score = _plain(row.get(metric))
    dollars = _plain(row.get("dollars"))
    return {
        "p": row.get("prediction") or "",
        "s": score,
        "sc": {m: _plain(row.get(m)) for m in others if _plain(row.get(m)) is not None},
        "d": None if dollars is None else float(dollars) * 1000.0,
        "l": _plain(row.get("_latency")),
        "cause": cause,
        "err": row.get("error") or None,
        "j": _judge_notes(row, [metric, *others]),
    }


def _chunk_store(df: pd.DataFrame) -> tuple[dict[str, object], list[str]]:
    """Every run's chunk texts (refs are content hashes: runs merge safely) and what is missing."""
    chunks: dict[str, object] = {}
    for folder in (df.attrs.get("run_dirs") or {}).values():
        found = read_chunks(folder)
        if found is not None:
            chunks.update(found)
    missing = [f"{run}: {', '.join(what)}" for run, what in (df.attrs.get("missing") or {}).items()]
    return chunks, missing


def view_payload(
    df: pd.DataFrame,
    metric: str | None = None,
    title: str = "",
    pair: tuple[str, str] | None = None,
) -> dict[str, Any]:
    """The view's data: variants (label, run), questions (id, text, gold, source documents, one
    cell per variant or None), the chunk texts they point to, and what the runs lack. ``pair``:
    the labels the page starts with as A and B (default: the first two variants)."""
    df = with_labels(df).reset_index(drop=True)
    metric = metric or default_metric(df)
    others = [m for m in metric_columns(df) if m != metric]
    df = df.assign(_latency=own_latency_seconds(df))
    causes = attribute(df, metric)["outcome"].astype(str).tolist() if len(df) else []
    chunks, missing = _chunk_store(df)
    variants = list(dict.fromkeys(df["label"]))
    index = {label: i for i, label in enumerate(variants)}
    questions: dict[str, dict[str, Any]] = {}
    used: dict[str, Any] = {}
    for row, cause in zip(df.to_dict("records"), causes, strict=True):
        ex = str(row["example_id"])
        q = questions.setdefault(
            ex,
            {
                "id": ex,
                "q": row.get("question") or "",
                "a": _plain(row.get("answers")) or [],
                "docs": [],
                "c": [None] * len(variants),
            },
        )
        cell = _cell(row, metric, others, cause)
        cell["ev"] = _evidence(row, chunks, used)
        q["c"][index[row["label"]]] = cell
    _add_docs(questions, df)
    runs = df["run"] if "run" in df else [""] * len(df)
    run_of = dict(zip(df["label"], runs, strict=True))
    binary = bool(df[metric].dropna().isin([0, 1, 0.0, 1.0, True, False]).all())
    return {
        "title": title,
        "metric": metric,
        "binary": binary,
        "variants": [{"label": v, "run": run_of.get(v) or ""} for v in variants],
        "questions": list(questions.values()),
        "chunks": used,
        "missing": missing,
        "pair": [index.get(label, i) for i, label in enumerate(pair or ("", ""))],
    }


def _add_docs(questions: dict[str, dict[str, Any]], df: pd.DataFrame) -> None:
    """Each question's source documents (its evidence's), from the runs' questions files."""
    for folder in (df.attrs.get("run_dirs") or {}).values():
        table = read_questions(folder)
        if table is None:
            continue
        for ex, docs in zip(table["example_id"], table["gold_docs"], strict=True):
            if ex in questions and not questions[ex]["docs"]:
                questions[ex]["docs"] = [str(d) for d in _plain(docs) or []]


def _asset(name: str) -> str:
    """The view's script or style sheet, shipped beside the price sheets (``ragbench/data``)."""
    return (files("ragbench") / "data" / "view" / name).read_text(encoding="utf-8")


def _frame(runs: Runs) -> pd.DataFrame:
    """Run folder(s) through ``ragbench.load``; the table ``ragbench.run`` returned through its
    folder (``attrs["run_dir"]``: the question and chunk texts are there); another DataFrame
    as given."""
    import pandas as pd

    if not isinstance(runs, pd.DataFrame):
        return load(runs)
    if "run" not in runs.columns and runs.attrs.get("run_dir"):
        return load(runs.attrs["run_dir"])
    return runs


def view_fragment(
    runs: Runs, metric: str | None = None, title: str = "", pair: tuple[str, str] | None = None
) -> str:
    """The view as an HTML fragment (a notebook output, a section of a page)."""
    from itables.javascript import (
        _itables_ready_event,
        _itables_underscore_version,
        generate_init_offline_itables_html,
    )
    from itables.options import dt_bundle

    payload = view_payload(_frame(runs), metric, title, pair)
    vid = "rbv-" + uuid.uuid4().hex[:10]
    data = json.dumps(payload, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    data = data.replace("</", "<\\/")  # a "</script>" inside a text must not end the block
    script = (
        _asset("explore.js")
        .replace("__VID__", vid)
        .replace("__ITABLES_READY__", _itables_ready_event())
        .replace("__ITABLES__", _itables_underscore_version())
    )
    return (
        generate_init_offline_itables_html(dt_bundle)
        + f"<style>{_asset('explore.css')}</style>"
        + f'<div class="rbv" id="{vid}">'
        + f'<script type="application/json" id="{vid}-data">{data}</script>'
        + f'<div class="rbv-missing" id="{vid}-missing"></div>'
        + f'<div class="rbv-bar" id="{vid}-bar"></div>'
        + f'<table id="{vid}-table" class="display compact rbv-table"></table>'
        + "<noscript>The per-question view needs JavaScript.</noscript></div>"
        + f'<script type="module">{script}</script>'
    )


def view_html(
    runs: Runs, metric: str | None = None, title: str = "", pair: tuple[str, str] | None = None
) -> str:
    """The view as a whole page."""
    heading = html.escape(title or "ragbench: questions")
    return (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        f"<title>{heading}</title></head><body><h1>{heading}</h1>"
        + view_fragment(runs, metric, title, pair)
        + "</body></html>"
    )


def write_view(
    runs: Runs,
    out: str | PathLike[str],
    metric: str | None = None,
    title: str = "",
    pair: tuple[str, str] | None = None,
) -> Path:
    """``ragbench view``: the page for ``runs`` (folders or a loaded table), written atomically;
    ``pair``: the variants it starts with as A and B (``ragbench diff --html``: the first
    matched pair)."""
    return atomic_write_text(out, view_html(runs, metric, title, pair))


class Explorer:
    """What ``ragbench.explore`` returns: Jupyter shows the view (``_repr_html_``)."""

    def __init__(self, fragment: str) -> None:
        self.fragment = fragment

    def _repr_html_(self) -> str:
        return self.fragment


def explore(runs: Runs, metric: str | None = None, title: str = "") -> Explorer:
    """The per-question view of run folder(s) or a loaded table, inline in Jupyter."""
    return Explorer(view_fragment(runs, metric, title))
