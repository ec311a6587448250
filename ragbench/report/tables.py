"""Tables for reading: numbers formatted with their units, predictions cut to their answer, and a
run's provenance from its manifest. ``ragbench.report`` re-exports them for the notebooks."""

from __future__ import annotations

import functools
import html
import json
import re
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pandas as pd
    from pandas.io.formats.style import Styler

import ragbench.report.readable as readable
from ragbench.analysis.verdict import Verdict
from ragbench.cost.accounting import format_bytes
from ragbench.experiment.provenance import dataset_name


def _short_hash(value: object) -> object:
    """``files-sha256:<64 hex>`` -> ``files-sha256:<16 hex>``, like the other hashes shown."""
    if isinstance(value, str) and "sha256:" in value:
        head, _, digest = value.rpartition(":")
        return f"{head}:{digest[:16]}"
    return value


def _with_unit(key: str, value: object) -> tuple[str, object]:
    """A provenance fact as a reader takes it: bytes as GiB (``hardware memory``, not
    ``memory_bytes``), the fake model's simulated throughput in tokens/s, lists comma-joined,
    long hashes shortened."""
    if key.endswith("_bytes") and isinstance(value, int | float):
        return key.removesuffix("_bytes"), format_bytes(value) if value else value
    if key == "model throughput" and isinstance(value, list | tuple) and len(value) == 2:
        return (
            "model simulated throughput",
            f"prefill {value[0]:g} tok/s, decode {value[1]:g} tok/s",
        )
    if isinstance(value, list | tuple):
        return key, ", ".join(str(v) for v in value)
    return key, _short_hash(value)


def table_remarks(table: pd.DataFrame) -> list[str]:
    """What a table says about itself, for reading under it: its ``attrs["warnings"]`` (what
    the numbers hide), as ``warning: ...``, then its ``attrs["notes"]`` (e.g. rows on fewer than
    30 questions), as ``note: ...``. ``ragbench run`` prints these lines under each summary."""
    attrs = getattr(table, "attrs", {})
    return [f"warning: {w}" for w in attrs.get("warnings", ())] + [
        f"note: {n}" for n in attrs.get("notes", ())
    ]


# the columns a reader needs first, right after the row names: what the table is there to say
LEAD_COLUMNS = (
    "break_even_questions_per_document",
    "lc_cheaper_from",
    "effective_length",
    "censored",
    "winner",
    "significant",
)
# kept, but last, and in a second table when one would not fit the page: how the numbers were
# made (interval method, missing scores, the test), the one-time-cost and FLOP variants, the
# parts a break-even is computed from
DETAIL_COLUMNS = (
    "n_missing",
    "ci_method",
    "amortised_dollars",
    "amortised_resource_seconds",
    "flops",
    "kv_bytes_measured",
    "a_only",
    "b_only",
    "test",
    "p_value",
    "sheet_date",
    "prefix_tokens",
    "lc_first_question_dollars",
    "lc_later_question_dollars",
    "lc_no_cache_dollars_per_query",
)
# what one table may take: a page about 1,000 px wide. 12 px text is about 7.5 px a character
# and a cell's padding 16 px; a header or cell takes up to LINE characters a line (headers break
# after underscores and at spaces, text cells at spaces and after hyphens)
PAGE_PX, CHAR_PX, CELL_PX, LINE = 940, 7.5, 16, 12
HEADER_EM = 11  # a header line at most (about 16 characters of bold 12 px text)
MORE_COLUMNS = "more columns for the same rows"
# value column -> the boolean column saying it is only a lower bound (the longest length tested
# still passed: the effective length is at least that); shown as "≥ 8,192"
LOWER_BOUNDS = {"effective_length": "censored"}


def _chars(text: str, breaks: str) -> int:
    """The characters ``text`` takes a line once wrapped at ``breaks`` into lines of ``LINE``."""
    longest = max((len(part) for part in re.split(breaks, text)), default=0)
    return min(len(text), max(longest, LINE))


def _width(header: object, values: Iterable[object]) -> float:
    """About how wide (px) a column reads comfortably: its header or widest cell, wrapped."""
    cells = [_chars(str(v), r"\s+|(?<=-)") for v in values]
    chars = max([_chars(str(header), r"\s+|(?<=_)"), *cells])
    return CHAR_PX * chars + CELL_PX


def _row_names(table: pd.DataFrame) -> bool:
    """Whether the index names the rows (a RangeIndex 0, 1, 2... says nothing and is hidden)."""
    import pandas as pd

    return not (isinstance(table.index, pd.RangeIndex) and table.index.name is None)


def _split(table: pd.DataFrame, rates: Sequence[str]) -> tuple[list[str], list[list[str]]]:
    """(the columns every part repeats, each part's other columns). The row names (the first
    text columns, at most two; else the first column) come first, then ``LEAD_COLUMNS``, the
    rest, ``DETAIL_COLUMNS``. A table wider than ``PAGE_PX`` is split before its first detail
    column, or before the column that would not fit, and so on."""
    import pandas as pd

    columns = list(table.columns)
    ids: list[str] = []
    for c in (c for c in columns if c not in DETAIL_COLUMNS + LEAD_COLUMNS):
        if pd.api.types.is_numeric_dtype(table[c]) or len(ids) == 2:
            break
        ids.append(c)
    if not ids and not _row_names(table) and columns:
        ids = columns[:1]
    rest = [c for c in columns if c not in ids]
    rest = (
        [c for c in LEAD_COLUMNS if c in rest]
        + [c for c in rest if c not in LEAD_COLUMNS + DETAIL_COLUMNS]
        + [c for c in DETAIL_COLUMNS if c in rest]
    )
    shown, headers = readable.shown_values(table, rates)
    width = {c: _width(headers.get(c, c), shown[c]) for c in columns}
    used: float = sum(width[c] for c in ids)
    if _row_names(table):
        used += _width(
            " ".join(str(n) for n in table.index.names if n is not None),
            [str(v) for v in table.index],
        )
    if used + sum(width[c] for c in rest) <= PAGE_PX:
        return ids, [rest]
    parts: list[list[str]] = [[]]
    taken = used
    for c in rest:
        detail = len(parts) == 1 and c in DETAIL_COLUMNS
        if parts[-1] and (taken + width[c] > PAGE_PX or detail):
            parts.append([])
            taken = used
        parts[-1].append(c)
        taken += width[c]
    return ids, parts


def _header(headers: Mapping[Hashable, str]) -> Callable[[object], str]:
    """A header as HTML that may break after each underscore (``string_<wbr>match_<wbr>all``)
    and takes at most ``HEADER_EM`` a line, so a long name wraps instead of widening its
    column."""

    def show(column: object) -> str:
        text = html.escape(
            headers.get(column, str(column)) if isinstance(column, Hashable) else str(column)
        ).replace("_", "_<wbr>")
        return f'<span style="display:inline-block;max-width:{HEADER_EM}em">{text}</span>'

    return show


def _styled(
    styler: Styler | None, table: pd.DataFrame, rates: Sequence[str], caption: Sequence[str]
) -> Styler:
    styler = readable.readable_table(table, rates, styler=styler)
    for column, flag in LOWER_BOUNDS.items():
        if column in table and flag in table:
            rows = table.index[table[flag].fillna(False).astype(bool)]
            if len(rows):
                styler = styler.format(lambda v: f"≥ {v:,.0f}", subset=(rows, [column]))
    styler = styler.format_index(_header(readable.shown_values(table, rates)[1]), axis=1)
    if not _row_names(table):
        styler = styler.hide(axis="index")
    if caption:
        styler = styler.set_caption("<br>".join(html.escape(r) for r in caption))
        styler = styler.set_table_styles(
            [{"selector": "caption", "props": "caption-side: top; text-align: left;"}],
            overwrite=False,
        )
    return styler


@functools.cache
def _tables_class() -> type:
    """``Styler`` whose HTML is its own table and then its ``more`` tables (made on first use:
    pandas' styling loads jinja2)."""
    from pandas.io.formats.style import Styler

    class FormattedTable(Styler):
        more: Sequence[Styler] = ()
        remarks: Sequence[str] = ()  # its caption's lines
        parts: Sequence[
            pd.DataFrame
        ] = ()  # each table as text cells under plain headers (``_plain``)
        show_index: bool = False

        # plain text of its own: Styler's layout options (sparse_index, delimiter) do not apply
        def to_string(  # type: ignore[override]
            self, buf: str | Path | IO[str] | None = None, encoding: str | None = None
        ) -> str | None:
            """The table as plain text, for a script or a terminal: its caption's lines, then
            the rows with their values as the HTML shows them, under headers without markup,
            then each ``more`` table under ``MORE_COLUMNS`` (``str()`` and ``print`` give the
            same; Jupyter renders the HTML)."""
            blocks = [
                "\n".join([*([MORE_COLUMNS] if i else []), part.to_string(index=self.show_index)])
                for i, part in enumerate(self.parts)
            ]
            text = "\n".join([*self.remarks, "\n\n".join(blocks)])
            if buf is None:
                return text
            if hasattr(buf, "write"):
                buf.write(text)
                return None
            Path(buf).write_text(text, encoding=encoding or "utf-8")
            return None

        def __str__(self) -> str:
            return str(self.to_string())

        __repr__ = __str__

        def to_html(self, buf: Any = None, **kwargs: Any) -> Any:  # Styler.to_html's own
            styles = {"exclude_styles": kwargs.get("exclude_styles", False)}
            text = super().to_html(**kwargs) + "".join(m.to_html(**styles) for m in self.more)
            if buf is None:
                return text
            if hasattr(buf, "write"):
                return buf.write(text)
            return Path(buf).write_text(text, encoding=kwargs.get("encoding") or "utf-8")

    return FormattedTable


def formatted(table: pd.DataFrame, rates: Sequence[str] = ()) -> Styler:
    """``table`` formatted for reading (a ``Styler``; the numbers stay in ``.data``): $ per
    1,000 queries in fixed notation, rates as percentages, counts as integers, "never" where a
    break-even is never reached, every column kept (a summary's ``n`` too). It fits a page
    about ``PAGE_PX`` wide: the row names, then the columns a reader needs first
    (``LEAD_COLUMNS``), the others, then ``DETAIL_COLUMNS``; headers break after underscores;
    columns that do not fit go to a second table under it (the same rows, their names
    repeated; ``.more``). A RangeIndex is not shown. The table's warnings and notes
    (``table_remarks``) become its caption, so they stay with the numbers in a rendered
    notebook, whose stderr is left out. Jupyter renders it as HTML; ``str()``, ``print`` and
    ``to_string()`` give the same tables as plain text. See
    ``ragbench.report.readable.readable_table``."""
    ids, parts = _split(table, rates)
    ordered = table[ids + [c for part in parts for c in part]]
    table_ = _tables_class()(ordered)
    styler = _styled(table_, ordered, rates, table_remarks(table))
    hidden: list[Hashable] = [c for part in parts[1:] for c in part]
    if hidden:
        styler = styler.hide(subset=hidden, axis="columns")
    # styling changes the styler in place: styler is table_
    table_.more = [_styled(None, ordered[ids + part], rates, [MORE_COLUMNS]) for part in parts[1:]]
    table_.remarks = table_remarks(table)
    table_.parts = _plain(ordered, rates, [ids + part for part in parts])
    table_.show_index = _row_names(ordered)
    return styler


def _plain(
    table: pd.DataFrame, rates: Sequence[str], parts: Sequence[Sequence[str]]
) -> list[pd.DataFrame]:
    """Each part of ``table`` (its columns) as the text its HTML shows, under plain headers
    (with their units; no markup): what ``FormattedTable.to_string`` prints."""
    shown, headers = readable.shown_values(table, rates)
    for column, flag in LOWER_BOUNDS.items():
        if column in table and flag in table:
            rows = table[flag].fillna(False).astype(bool)
            shown.loc[rows, column] = [f"≥ {v:,.0f}" for v in table.loc[rows, column]]
    return [shown[list(part)].rename(columns=lambda c: headers.get(c, c)) for part in parts]


def provenance(run_dir: str | Path) -> pd.DataFrame:
    """The run manifest's key facts as a one-column table (config hash, dataset fingerprint,
    model identity, commit, hardware, times), so a rendered notebook says what produced it.
    Paths are shown relative to the run folder's parent, never as absolute machine paths."""
    import pandas as pd

    manifest = json.loads((Path(run_dir) / "manifest.json").read_text(encoding="utf-8"))
    model = manifest.get("model", {})
    versions = manifest.get("versions", {})
    hardware = manifest.get("hardware", {})
    facts: dict[str, object] = {
        "run": Path(run_dir).name,
        "config hash": manifest.get("config_hash", "")[:16],
        "dataset": dataset_name(manifest),
        "dataset fingerprint": manifest["dataset"]["fingerprint"][:16],
        # one row per model, hardware and version fact: joined they were cut by pandas' display
        **{f"model {k}": v for k, v in model.items() if k != "path"},
        "records": f"{manifest.get('records')} ({manifest.get('errors')} errors, "
        f"{manifest.get('resumed_records')} reused)",
        "git commit": (manifest.get("git_commit") or "")[:12],
        **{f"hardware {k}": v for k, v in hardware.items()},
        **{f"version {k}": v for k, v in versions.items() if v},
        "started": manifest.get("started_at", ""),
        "finished": manifest.get("finished_at", ""),
    }
    facts = dict(_with_unit(k, v) for k, v in facts.items())
    return pd.Series({k: str(v) for k, v in facts.items()}, name="provenance").to_frame()


def predictions(df: pd.DataFrame, width: int = 60) -> pd.DataFrame:
    """``df`` with its ``prediction`` column cut to ``width`` characters from the end, where
    the answer is: small models restate the question first ("The special magic number
    mentioned in the text is 7463343."), and a table cut from the start shows only that."""
    out = df.copy()
    out["prediction"] = [
        text if not isinstance(text, str) or len(text) <= width else "…" + text[-(width - 1) :]
        for text in (t.strip() if isinstance(t, str) else t for t in out["prediction"])
    ]
    return out


def verdict_detail(verdict: Verdict) -> Styler:
    """The verdict's detail for reading: every comparison behind its sentence, ``formatted``.
    A verdict with no detail (no variant meets the constraints: nothing was compared) shows
    each variant against the constraints instead: its score, $ per 1,000 queries (prompt
    tokens per query without a price sheet), mean latency and whether it meets them, under a
    caption saying why there is no comparison."""
    if verdict.detail is not None:  # the means and their difference read as their interval does
        return formatted(verdict.detail, rates=("mean_a", "mean_b", "diff", "ci_level"))
    variants = verdict.variants
    assert variants is not None  # a verdict without detail has its variants
    cost = "prompt_tokens" if verdict.cost == "prompt_tokens" else "dollars_per_1k"
    table = variants[["score", "n", "cost_per_1k", "latency_s", "meets"]].rename(
        columns={
            "score": verdict.metric,
            "cost_per_1k": cost,
            "latency_s": "latency_seconds",
            "meets": "meets_constraints",
        }
    )
    table.attrs["notes"] = [
        "no variant meets the constraints, so none was compared: each variant against them"
    ]
    return formatted(table)
