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
from collections.abc import Sequence
from os import PathLike
from pathlib import Path
from typing import Any

from ragbench.analysis._common import default_metric, metric_columns, own_latency_seconds
from ragbench.analysis.attribution import attribute
from ragbench.analysis.labels import with_labels
from ragbench.experiment.evidence import read_chunks, read_questions
from ragbench.io import atomic_write_text
from ragbench.report.runs import load

# long-context facts a record keeps (Self-Route's long-context branch with an lc_ prefix)
LC_FACTS = ("kept_tokens", "truncated_tokens", "evidence_truncated", "dropped_documents")
JUDGE_SUFFIXES = ("_note", "_rationale", "_reason", "_prompt")


def _plain(value: Any) -> Any:
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


def _evidence(row: dict[str, Any], chunks: dict[str, Any], used: dict[str, Any]) -> dict:
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


def _judge_notes(row: dict[str, Any], metrics: Sequence[str]) -> dict[str, Any]:
    """A judge's notes beside its scores (``<metric>_note`` and the like), as text."""
    notes = {}
    for metric in metrics:
        for suffix in JUDGE_SUFFIXES:
            value = _plain(row.get(metric + suffix))
            if value not in (None, ""):
                notes[metric + suffix] = value
    return notes


def _cell(row: dict[str, Any], metric: str, others: Sequence[str], cause: str) -> dict:
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


def _chunk_store(df: Any) -> tuple[dict[str, Any], list[str]]:
    """Every run's chunk texts (refs are content hashes: runs merge safely) and what is missing."""
    chunks: dict[str, Any] = {}
    for folder in (df.attrs.get("run_dirs") or {}).values():
        found = read_chunks(folder)
        if found is not None:
            chunks.update(found)
    missing = [f"{run}: {', '.join(what)}" for run, what in (df.attrs.get("missing") or {}).items()]
    return chunks, missing


def view_payload(df: Any, metric: str | None = None, title: str = "") -> dict[str, Any]:
    """The view's data: variants (label, run), questions (id, text, gold, source documents, one
    cell per variant or None), the chunk texts they point to, and what the runs lack."""
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
        q = questions.setdefault(ex, {
            "id": ex,
            "q": row.get("question") or "",
            "a": _plain(row.get("answers")) or [],
            "docs": [],
            "c": [None] * len(variants),
        })  # fmt: skip
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
    }


def _add_docs(questions: dict[str, dict[str, Any]], df: Any) -> None:
    """Each question's source documents (its evidence's), from the runs' questions files."""
    for folder in (df.attrs.get("run_dirs") or {}).values():
        table = read_questions(folder)
        if table is None:
            continue
        for ex, docs in zip(table["example_id"], table["gold_docs"], strict=True):
            if ex in questions and not questions[ex]["docs"]:
                questions[ex]["docs"] = [str(d) for d in _plain(docs) or []]


def _frame(runs: Any) -> Any:
    """Run folder(s) through ``ragbench.load``; the table ``ragbench.run`` returned through its
    folder (``attrs["run_dir"]``: the question and chunk texts are there); another DataFrame
    as given."""
    import pandas as pd

    if not isinstance(runs, pd.DataFrame):
        return load(runs)
    if "run" not in runs.columns and runs.attrs.get("run_dir"):
        return load(runs.attrs["run_dir"])
    return runs


def view_fragment(runs: Any, metric: str | None = None, title: str = "") -> str:
    """The view as an HTML fragment (a notebook output, a section of a page)."""
    from itables.javascript import (
        _itables_ready_event,
        _itables_underscore_version,
        generate_init_offline_itables_html,
    )
    from itables.options import dt_bundle

    payload = view_payload(_frame(runs), metric, title)
    vid = "rbv-" + uuid.uuid4().hex[:10]
    data = json.dumps(payload, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    data = data.replace("</", "<\\/")  # a "</script>" inside a text must not end the block
    script = (
        _VIEW_JS.replace("__VID__", vid)
        .replace("__ITABLES_READY__", _itables_ready_event())
        .replace("__ITABLES__", _itables_underscore_version())
    )
    return (
        generate_init_offline_itables_html(dt_bundle)
        + f"<style>{_VIEW_CSS}</style>"
        + f'<div class="rbv" id="{vid}">'
        + f'<script type="application/json" id="{vid}-data">{data}</script>'
        + f'<div class="rbv-missing" id="{vid}-missing"></div>'
        + f'<div class="rbv-bar" id="{vid}-bar"></div>'
        + f'<table id="{vid}-table" class="display compact rbv-table"></table>'
        + "<noscript>The per-question view needs JavaScript.</noscript></div>"
        + f'<script type="module">{script}</script>'
    )


def view_html(runs: Any, metric: str | None = None, title: str = "") -> str:
    """The view as a whole page."""
    heading = html.escape(title or "ragbench: questions")
    return (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        f"<title>{heading}</title></head><body><h1>{heading}</h1>"
        + view_fragment(runs, metric, title)
        + "</body></html>"
    )


def write_view(
    runs: str | PathLike[str] | Sequence[str | PathLike[str]] | Any,
    out: str | PathLike[str],
    metric: str | None = None,
    title: str = "",
) -> Path:
    """``ragbench view``: the page for ``runs`` (folders or a loaded table), written atomically."""
    return atomic_write_text(out, view_html(runs, metric, title))


class Explorer:
    """What ``ragbench.explore`` returns: Jupyter shows the view (``_repr_html_``)."""

    def __init__(self, fragment: str) -> None:
        self.fragment = fragment

    def _repr_html_(self) -> str:
        return self.fragment


def explore(runs: Any, metric: str | None = None, title: str = "") -> Explorer:
    """The per-question view of run folder(s) or a loaded table, inline in Jupyter."""
    return Explorer(view_fragment(runs, metric, title))


_VIEW_CSS = """
.rbv{font:14px/1.4 system-ui,sans-serif;max-width:100%}
.rbv-bar{display:flex;flex-wrap:wrap;gap:.5em 1em;align-items:center;margin:.5em 0}
.rbv-bar label{white-space:nowrap}
.rbv-missing{color:#8a4b00}
.rbv-table td{vertical-align:top;white-space:pre-wrap;overflow-wrap:anywhere;word-break:break-word}
.rbv-ok{color:#176b2c;font-weight:600}.rbv-bad{color:#a4161a;font-weight:600}
.rbv-na{color:#777}.rbv-meta{color:#555;font-size:12px}
.rbv-detail{display:grid;grid-template-columns:repeat(auto-fit,minmax(320px,1fr));gap:1em}
.rbv-detail h4{margin:.2em 0}
.rbv-chunk{border-left:3px solid #ccc;padding-left:.5em;margin:.4em 0;white-space:pre-wrap;
 overflow-wrap:anywhere}
.rbv-gold{border-left-color:#176b2c}.rbv-missed{border-left-color:#a4161a}
.rbv-chunk summary{cursor:pointer}
tr.rbv-open>td{background:#f4f7fb}
"""

# Hand-written (module docstring): filters over pairs of variants, their counts, the expanded
# evidence. Text goes through esc() before it reaches innerHTML.
_VIEW_JS = r"""
(() => {
const VID = "__VID__";
const root = document.getElementById(VID);
if (!root || root.dataset.ready) return;
root.dataset.ready = "1";
const D = JSON.parse(document.getElementById(VID + "-data").textContent);
const V = D.variants, Q = D.questions, FOLD = 400;
const esc = s => String(s ?? "").replace(/[&<>"']/g,
  c => ({"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;"}[c]));
const num = (x, d) => x == null ? "n/a" : Number(x).toFixed(d);
const ok = c => c && !c.err && c.s != null ? (D.binary ? c.s >= 1 : null) : null;
const scored = c => c && !c.err && c.s != null;
const state = {a: 0, b: Math.min(1, V.length - 1), outcome: "all", cause: "", doc: "",
  match: null};

function pairOf(q) {  // -1: A better, 1: B better, 0: same, null: not both scored
  const ca = q.c[state.a], cb = q.c[state.b];
  if (!scored(ca) || !scored(cb)) return null;
  return ca.s > cb.s ? -1 : ca.s < cb.s ? 1 : 0;
}
const OUTCOMES = {
  all: () => true,
  a_only: q => pairOf(q) === -1,
  b_only: q => pairOf(q) === 1,
  both_wrong: q => { const c = [q.c[state.a], q.c[state.b]];
    return c.every(scored) && c.every(x => D.binary ? x.s < 1 : x.s <= 0); },
  disagree: q => new Set(q.c.filter(scored).map(c => c.s)).size > 1,
};
function keep(q) {
  if (!OUTCOMES[state.outcome](q)) return false;
  if (state.cause && !q.c.some(c => c && c.cause === state.cause)) return false;
  if (state.doc && !q.docs.includes(state.doc)) return false;
  if (state.match && ![q.id, q.q, ...q.a, ...q.c.map(c => c ? c.p : "")].some(state.match))
    return false;
  return true;
}

function cellHtml(c) {
  if (!c) return '<span class="rbv-na">not run</span>';
  if (c.err) return '<span class="rbv-bad">error</span> <span class="rbv-meta">' +
    esc(c.err.slice(0, 200)) + "</span>";
  const mark = c.s == null ? '<span class="rbv-na">unscored</span>' : D.binary
    ? (c.s >= 1 ? '<span class="rbv-ok">\u2713</span>' : '<span class="rbv-bad">\u2717</span>')
    : '<span class="rbv-meta">' + esc(D.metric) + " " + num(c.s, 3) + "</span>";
  return mark + " " + esc(c.p || "(empty answer)") + '<div class="rbv-meta">$' +
    num(c.d, 4) + " / 1k \u00b7 " + num(c.l, 2) + " s" +
    (c.cause && c.cause !== "correct" ? " \u00b7 " + esc(c.cause) : "") + "</div>";
}
function chunkHtml(ref, score, id, gold, doc, text, cls) {
  const ch = ref != null ? D.chunks[ref] : null;
  const body = text ?? (ch ? ch[1] : null), src = doc ?? (ch ? ch[0] : "");
  const head = esc(id) + (score != null ? " \u00b7 score " + num(score, 3) : "") +
    (src ? " \u00b7 " + esc(src) : "") + (gold ? " \u00b7 gold" : "");
  if (body == null) return '<div class="rbv-chunk ' + cls + '">' + head +
    ' <span class="rbv-na">(text not stored in this run folder)</span></div>';
  if (body.length <= FOLD) return '<div class="rbv-chunk ' + cls + '"><div class="rbv-meta">' +
    head + "</div>" + esc(body) + "</div>";
  return '<details class="rbv-chunk ' + cls + '"><summary><span class="rbv-meta">' + head +
    "</span><br>" + esc(body.slice(0, FOLD)) + "\u2026</summary>" + esc(body.slice(FOLD)) +
    "</details>";
}
function detailHtml(q) {
  const parts = q.c.map((c, i) => {
    if (!c) return "";
    let h = "<div><h4>" + esc(V[i].label) + "</h4>" + cellHtml(c);
    const sc = Object.entries(c.sc).map(([k, v]) => esc(k) + " " + num(v, 3)).join(" \u00b7 ");
    if (sc) h += '<div class="rbv-meta">' + sc + "</div>";
    if (c.cause) h += '<div class="rbv-meta">outcome: ' + esc(c.cause) + "</div>";
    const ev = c.ev || {};
    if (ev.route) h += '<div class="rbv-meta">route: ' + esc(ev.route) + "</div>";
    if (ev.r) {
      h += '<div class="rbv-meta">retrieved (rank order)' +
        (ev.hit === true ? ": gold retrieved" : ev.hit === false ? ": gold NOT retrieved" : "") +
        "</div>";
      h += ev.r.map(r => chunkHtml(r[0], r[1], r[2], r[3], r[4], r[5],
                                   r[3] ? "rbv-gold" : "")).join("");
      h += (ev.miss || []).map(m => chunkHtml(m[0], null, m[1] + " (gold, not retrieved)",
                                              true, null, null, "rbv-missed")).join("");
    }
    if (ev.lc) h += '<div class="rbv-meta">long context kept ' + esc(ev.lc.kept_tokens) +
      " tokens, cut " + esc(ev.lc.truncated_tokens ?? 0) + "; evidence cut: " +
      esc(ev.lc.evidence_truncated ?? "unknown") + "; documents dropped: " +
      esc(JSON.stringify(ev.lc.dropped_documents ?? 0)) + "</div>";
    for (const [k, v] of Object.entries(c.j || {}))
      h += '<div class="rbv-meta">' + esc(k) + ": " + esc(v) + "</div>";
    return h + "</div>";
  });
  return '<div class="rbv-detail">' + parts.join("") + "</div>";
}

function select(name, options, onChange) {
  const label = document.createElement("label");
  label.textContent = name + " ";
  const sel = document.createElement("select");
  sel.dataset.filter = name;
  options.forEach(([value, text]) => sel.add(new Option(text, value)));
  sel.addEventListener("change", () => onChange(sel.value));
  label.appendChild(sel);
  return [label, sel];
}

async function start() {
  const lib = await window.__ITABLES__;
  const DT = lib.default;  // DataTable itself (ITable is itables' wrapper, which takes no data option)
  if (D.missing.length) document.getElementById(VID + "-missing").textContent =
    "Not in the run folder (written before ragbench kept it): " + D.missing.join("; ");
  const columns = [
    {title: "id", data: "id"},
    {title: "question", data: "q", render: (q, t) => t === "display" ? esc(q) : q},
    {title: "gold", data: "a", render: (a, t) => t === "display" ? esc(a.join(" | ")) : a.join(" ")},
    ...V.map((v, i) => ({title: v.label, data: row => row.c[i], render: (c, t) =>
      t === "display" ? cellHtml(c) : t === "sort" || t === "type"
        ? (c && c.s != null && !c.err ? c.s : -1) : (c ? c.p : "")})),
  ];
  const table = document.getElementById(VID + "-table");
  columns.forEach(c => { c.className = "dt-left"; });
  const dt = new DT(table, {data: Q, columns, deferRender: true, pageLength: 25,
    order: [], autoWidth: false, searching: true,
    layout: {topStart: "pageLength", topEnd: null}});
  const bar = document.getElementById(VID + "-bar");
  const search = document.createElement("input");
  search.type = "search"; search.placeholder = "search question, answers, predictions";
  search.size = 40; search.dataset.filter = "search";
  const regex = document.createElement("input");
  regex.type = "checkbox"; regex.dataset.filter = "regex";
  const rl = document.createElement("label");
  rl.append(regex, " regex");
  const apply = () => {  // over each text on its own, so a regex's ^ and $ mean its ends
    state.match = null;
    search.setCustomValidity("");
    if (search.value) {
      try {
        const re = new RegExp(regex.checked ? search.value
          : search.value.replace(/[.*+?^${}()|[\]\\]/g, "\\$&"), "i");
        state.match = t => re.test(t);
      } catch (e) { search.setCustomValidity(String(e)); search.reportValidity(); }
    }
    dt.draw();
  };
  search.addEventListener("input", apply); regex.addEventListener("change", apply);
  const names = V.map((v, i) => [String(i), v.label]);
  const [la, sa] = select("A", names, v => { state.a = +v; counts(); dt.draw(); });
  const [lb, sb] = select("B", names, v => { state.b = +v; counts(); dt.draw(); });
  sb.value = String(state.b);
  const [lo, so] = select("outcome", [["all", "all"]], v => { state.outcome = v; dt.draw(); });
  const causeCount = {}, docCount = {};
  Q.forEach(q => {
    new Set(q.c.filter(c => c).map(c => c.cause)).forEach(c => causeCount[c] = (causeCount[c] || 0) + 1);
    q.docs.forEach(d => docCount[d] = (docCount[d] || 0) + 1);
  });
  const [lc] = select("cause", [["", "any cause"], ...Object.keys(causeCount).sort()
    .map(c => [c, c + " (" + causeCount[c] + ")"])], v => { state.cause = v; dt.draw(); });
  const [ld] = select("source document", [["", "any document"], ...Object.keys(docCount).sort()
    .map(d => [d, d + " (" + docCount[d] + ")"])], v => { state.doc = v; dt.draw(); });
  bar.append(search, rl, la, lb, lo, lc, ld);
  function counts() {
    const n = k => Q.filter(OUTCOMES[k]).length;
    const A = V[state.a].label, B = V[state.b].label;
    const good = D.binary ? [" right, ", " wrong"] : [" higher than ", ""];
    const opts = [["all", "all (" + Q.length + ")"],
      ["a_only", "A" + good[0] + "B" + good[1] + " (" + n("a_only") + ")"],
      ["b_only", "B" + good[0] + "A" + good[1] + " (" + n("b_only") + ")"],
      ["both_wrong", "both wrong (" + n("both_wrong") + ")"],
      ["disagree", "any disagreement (" + n("disagree") + ")"]];
    const was = so.value;
    so.innerHTML = "";
    opts.forEach(([v, t]) => so.add(new Option(t, v)));
    so.value = was || "all";
    so.title = "A: " + A + "\nB: " + B;
  }
  counts();
  DT.ext.search.push((settings, _data, i) =>
    settings.nTable !== table || keep(Q[i]));
  table.addEventListener("click", ev => {
    const tr = ev.target.closest("tbody > tr");
    if (!tr || tr.classList.contains("child") || ev.target.closest("details")) return;
    const row = dt.row(tr);
    if (!row.data()) return;
    if (row.child.isShown()) { row.child.hide(); tr.classList.remove("rbv-open"); }
    else { row.child(detailHtml(row.data())).show(); tr.classList.add("rbv-open"); }
  });
  root.dataset.rows = String(Q.length);
  root.dataset.shownMs = String(Math.round(performance.now()));  // since the page began loading
  root.dataset.loaded = "1";
}
if (window.__ITABLES__) start();
else window.addEventListener("__ITABLES_READY__", start, {once: true});
})();
"""
