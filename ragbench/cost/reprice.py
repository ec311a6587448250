"""Reprice a finished run with another price sheet, without calling a model.

A record's dollars are a pure function of what it logged (``ragbench.cost.money.dollars``): prompt,
cached, cache-write and completion tokens for a per-token (API) sheet, its own device seconds for
an hourly one. So ``reprice_run`` reads ``results.parquet`` (and ``records.jsonl`` when present),
recomputes the dollar column and the ``price_sheet`` name, and writes the result *beside* the
original (``results.<sheet>.parquet``, ``records.<sheet>.jsonl`` and ``results.<sheet>.json``
saying which sheet, dated and sourced, priced it from which table). The original files are never
written: the run's own numbers stay what the run measured.

Each row or record is read back into a ``Cost`` and priced by ``repriced_cost``, the one
reprice of a record (``Cost.repriced``, the same accounting the run used, with the cache writes
its meta logged); its ``price_sheet_sha256`` becomes the new sheet's content hash
(``PriceSheet.short_sha256``). A resumed run whose sheet file changed reprices its own stored
records through the same function (``reprice_stale``, called by the runner), so one table never
mixes two versions of a sheet. A one-time cost (``long_context preload``) is repriced with its record:
``one_time_dollars`` from ``one_time_seconds`` on an hourly sheet, and ``amortised_dollars`` =
dollars + one_time / ``amortised_over`` (``Cost.amortise``). On a per-token sheet the one-time
cost cannot be priced (a record keeps its seconds, not its tokens): both are left empty and
counted in ``warnings``, never kept from the old sheet.

What is not repriced, on purpose: ``peak_flops`` and ``mfu`` describe the hardware the run was
*measured* on, not the price paid, so they keep the original sheet's peak. Device seconds come
from the hardware the run used: pricing a CPU run's seconds at an H100's hourly rate is a
what-if, not a forecast.

Limit: a record of several model calls (Self-Route's RAG call, then long context) logs only the
sum of its calls' tokens, so a long-context tier or a minimum cacheable prefix is judged on the
sum; such rows are counted in the result's ``warnings``.
"""

from __future__ import annotations

import io
import json
import math
import re
from collections.abc import Container, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, SupportsFloat, TypeGuard

from ragbench.cost.accounting import Cost
from ragbench.cost.prices import PriceSheet, price_sheet
from ragbench.io import atomic_write_bytes, atomic_write_text, dumps_canonical, sha256_file
from ragbench.schema import read_folder_table
from ragbench.types import Record

if TYPE_CHECKING:
    import pandas as pd

RESULTS = "results.parquet"
RECORDS = "records.jsonl"
DOLLAR_COLUMNS = ("dollars",)  # the cost fields a price sheet sets (with price_sheet)
# also repriced: a one-time cost (long_context preload), and amortised_dollars = dollars + share
ONE_TIME_FIELDS = ("one_time_seconds", "amortised_over")
SECONDS_FIELDS = ("resource_seconds",)  # a record's own device time
# what a calibrated record's hourly dollars were charged from (its own work by the calibration)
MODELLED_FIELDS = ("modelled_seconds", "one_time_modelled_seconds")
TOKEN_FIELDS = ("prompt_tokens", "cached_prompt_tokens", "completion_tokens")
# a prefix another strategy variant computed, charged to this one (cost/alone.py): a cache write
# on an api sheet, its seconds on an hourly one under the measured basis
ALONE_FIELDS = ("prefix_paid_tokens", "prefix_paid_seconds")


@dataclass
class RepriceResult:
    table: pd.DataFrame  # the repriced DataFrame
    table_path: Path
    records_path: Path | None  # None: the run folder had no records.jsonl
    info_path: Path
    summary: pd.DataFrame  # per label: before / after mean $ per query
    warnings: list[str] = field(default_factory=list)


def _column(columns: Container[str], name: str) -> str | None:
    """``name`` as the table spells it: plain, or ``cost_``-prefixed when another section
    (a parameter, a score) uses the same name (``ragbench.experiment.results``)."""
    for candidate in (name, f"cost_{name}"):
        if candidate in columns:
            return candidate
    return None


def _finite(value: Any) -> TypeGuard[str | SupportsFloat]:
    """``value`` is a finite number, or a string of one."""
    try:
        return value is not None and math.isfinite(float(value))
    except (TypeError, ValueError):
        return False


def repriced_cost(
    cost: Cost, sheet: PriceSheet, meta: Mapping[str, object] | None = None, known: bool = True
) -> Cost:
    """A stored record's cost priced again with ``sheet``: the one reprice of a record, for a
    table row and a ``records.jsonl`` line (``ragbench reprice``) and for a resumed run's records
    its changed sheet priced (``reprice_stale``). The provider's cache writes come from the
    record's meta (``meta["cache_write_tokens"]``, where a backend that reports them puts them;
    a table row's column). ``known=False``: the fields the sheet prices were not logged."""
    write = (meta or {}).get("cache_write_tokens")
    return cost.repriced(sheet, float(write) if _finite(write) else 0.0, known=known)


def _repriced(sheet: PriceSheet, cost: Mapping[str, Any]) -> Cost:
    """A table row's logged accounting (a mapping of its cost columns; empty values left out)
    as a ``Cost``, priced with ``sheet`` (``repriced_cost``). Its own dollars are unknown
    (None) when the fields the sheet prices are missing (a failed record)."""
    known: dict[str, Any] = {
        k: cost[k]
        for k in (*TOKEN_FIELDS, *SECONDS_FIELDS, *MODELLED_FIELDS, *ONE_TIME_FIELDS, *ALONE_FIELDS)
        if _finite(cost.get(k))
    }
    if isinstance(cost.get("cost_basis"), str):  # calibrated | measured | mixed
        known["cost_basis"] = cost["cost_basis"]
    for k in ("amortised_over", "prefix_paid_tokens"):
        if k in known:
            known[k] = int(known[k])
    if sheet.kind == "gpu_hour":
        priceable = any(f in known for f in (*SECONDS_FIELDS, "modelled_seconds"))
    else:
        priceable = all(f in known for f in TOKEN_FIELDS)
    return repriced_cost(Cost.from_dict(known), sheet, cost, known=priceable)


def _approximate(sheet: PriceSheet, cost: dict[str, Any]) -> bool:
    """A multi-call record where a tier or the minimum prefix is judged on summed tokens."""
    calls = cost.get("llm_calls")
    if sheet.kind != "api" or not _finite(calls) or float(calls) <= 1:
        return False
    prompt = float(cost.get("prompt_tokens") or 0)
    tiered = bool(sheet.tiers) and prompt > sheet.tiers[0].above_prompt_tokens
    cached = float(cost.get("cached_prompt_tokens") or 0) + float(
        cost.get("cache_write_tokens") or 0
    )
    return tiered or (sheet.min_cacheable_prompt_tokens > 0 and cached > 0)


def reprice_table(df: pd.DataFrame, sheet: PriceSheet) -> tuple[pd.DataFrame, int]:
    """A copy of a results table with its dollar columns and ``price_sheet`` recomputed from its
    token and seconds columns; also the number of approximate rows (module docstring)."""
    cols = {
        name: _column(df.columns, name)
        for name in (
            *TOKEN_FIELDS,
            "cache_write_tokens",
            *SECONDS_FIELDS,
            "llm_calls",
            *ONE_TIME_FIELDS,
            *MODELLED_FIELDS,
            *ALONE_FIELDS,
            "cost_basis",
        )
    }
    need = TOKEN_FIELDS if sheet.kind == "api" else SECONDS_FIELDS
    found = [bool(cols[n]) for n in need]
    if not (all(found) if sheet.kind == "api" else any(found)):
        if "error" in df.columns and len(df) and df["error"].notna().all():  # nothing was costed
            raise ValueError(
                f"every record of the table failed ({len(df)}), so none has a cost to price "
                "again; rerun the run to retry them"
            )
        which = "all of" if sheet.kind == "api" else "one of"
        raise ValueError(
            f"the table cannot be priced with {sheet.kind!r} sheet {sheet.name!r}: it needs "
            f"{which} the columns {list(need)} (also accepted with a cost_ prefix)"
        )
    out = df.copy()
    present = {name: col for name, col in cols.items() if col}
    rows = out[list(present.values())].to_dict("records")
    costs = [{name: row[col] for name, col in present.items()} for row in rows]
    repriced = [_repriced(sheet, cost) for cost in costs]
    priced = [r.dollars for r in repriced]
    for name in DOLLAR_COLUMNS:
        out[_column(out.columns, name) or name] = [float("nan") if d is None else d for d in priced]
    if cols["one_time_seconds"] or _column(out.columns, "amortised_dollars"):
        once = [
            float("nan") if r.one_time_dollars is None else r.one_time_dollars for r in repriced
        ]
        amortised = [
            float("nan") if r.amortised_dollars is None else r.amortised_dollars for r in repriced
        ]
        out[_column(out.columns, "amortised_dollars") or "amortised_dollars"] = amortised
        had = [_finite(c.get("one_time_seconds")) for c in costs]
        if any(had):  # the rows with a one-time cost; the others keep theirs (none)
            col = _column(out.columns, "one_time_dollars") or "one_time_dollars"
            old = out[col].tolist() if col in out else [None] * len(out)
            out[col] = [o if h else k for o, h, k in zip(once, had, old, strict=True)]
    for name, value in (("price_sheet", sheet.name), ("price_sheet_sha256", sheet.short_sha256())):
        col = _column(out.columns, name) or name
        old_values = list(out[col]) if col in out else [None] * len(out)
        out[col] = [value if d is not None else o for d, o in zip(priced, old_values, strict=True)]
    approximate = sum(_approximate(sheet, c) for c in costs)
    return out, approximate


def reprice_records_text(text: str, sheet: PriceSheet) -> str:
    """``records.jsonl`` text with each record's cost priced again (``repriced_cost``). Lines
    are kept as the runner wrote them otherwise; a torn last line (no newline: a killed run) is
    left out, as the runner's reader does; an unreadable line is kept verbatim (the reader
    skips it)."""
    lines = []
    for line in text.splitlines(keepends=True):
        if not line.endswith("\n"):
            break
        try:
            row = json.loads(line)
            record = row["record"]
            cost = Cost.from_dict(record["cost"]) if record.get("cost") else None
        except (json.JSONDecodeError, KeyError, TypeError, AttributeError, ValueError):
            lines.append(line)
            continue
        if cost is not None:
            record["cost"] = repriced_cost(cost, sheet, record.get("meta")).to_dict()
        lines.append(dumps_canonical(row) + "\n")
    return "".join(lines)


@dataclass
class StaleRecords:
    """What ``reprice_stale`` did to a run's stored records (by work key)."""

    repriced: dict[str, Record] = field(default_factory=dict)  # key -> Record, repriced
    stamped: dict[str, Record] = field(default_factory=dict)  # key -> Record, hash added only
    was: dict[str, int] = field(default_factory=dict)  # old hash ("unknown") -> records repriced
    warnings: list[str] = field(default_factory=list)

    @property
    def changed(self) -> dict[str, Record]:
        """Every record to write again: the repriced and the stamped ones."""
        return {**self.stamped, **self.repriced}


def reprice_stale(records: Mapping[str, Record], sheet: PriceSheet) -> StaleRecords:
    """The stored records (``Record``s by work key) of a run that ``sheet`` would not have
    priced as they are: each record whose ``price_sheet_sha256`` is not ``sheet``'s content
    hash is priced again with ``sheet`` by ``Cost.repriced``, as ``ragbench reprice`` does, so a
    resumed run's table never mixes two versions of its sheet.

    A record written before records kept the hash (none: unknown) whose dollars ``sheet`` gives
    again is taken as priced by it: only the hash is added (``stamped``), so nothing a reprice
    cannot recompute (an api sheet's one-time preload dollars) is lost. One whose dollars differ
    is repriced (``repriced_cost``, as ``ragbench reprice`` reprices a record). Records without
    a cost (failed ones) are left alone."""
    import dataclasses

    out = StaleRecords()
    sha = sheet.short_sha256()
    approximate = one_time = 0
    for key, record in records.items():
        cost = getattr(record, "cost", None)
        if cost is None or cost.price_sheet_sha256 == sha:
            continue
        new = repriced_cost(cost, sheet, getattr(record, "meta", None))
        if cost.price_sheet_sha256 is None and _same(cost.dollars, new.dollars):
            out.stamped[key] = dataclasses.replace(
                record, cost=dataclasses.replace(cost, price_sheet_sha256=sha)
            )
            continue
        was = cost.price_sheet_sha256 or "unknown"
        out.was[was] = out.was.get(was, 0) + 1
        out.repriced[key] = dataclasses.replace(record, cost=new)
        approximate += _approximate(sheet, cost.to_dict())
        one_time += cost.one_time_seconds is not None and new.one_time_dollars is None
    if one_time:
        out.warnings.append(
            f"{one_time} repriced record(s) with a one-time cost (long_context preload): a "
            f"per-token sheet cannot price it again, so their one_time_dollars and "
            f"amortised_dollars are now empty"
        )
    if approximate:
        out.warnings.append(
            f"{approximate} repriced record(s) of several model calls: the sheet's long-context "
            f"tier or minimum cacheable prefix was applied to their summed tokens"
        )
    return out


def _same(a: float | None, b: float | None) -> bool:
    if a is None or b is None:
        return a is b
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-15)


def compare(before: pd.DataFrame, after: pd.DataFrame) -> pd.DataFrame:
    """Mean dollars per query per strategy variant (label), successful rows only, before and
    after repricing; rows in first-seen (config) order."""
    import pandas as pd

    key = "label" if "label" in before else "strategy"
    ok = before["error"].isna() if "error" in before else pd.Series(True, index=before.index)
    col_b = _column(before.columns, "dollars")
    col_a = _column(after.columns, "dollars")
    b = pd.to_numeric(before[col_b], errors="coerce") if col_b else float("nan")
    frame = pd.DataFrame(
        {
            key: before[key],
            "strategy": before["strategy"] if "strategy" in before else before[key],
            "before": b,
            "after": pd.to_numeric(after[col_a], errors="coerce"),
        }
    )[ok.to_numpy()]
    table = frame.groupby(key, sort=False).agg(
        strategy=("strategy", "first"),
        n=("after", "size"),
        dollars_per_query_before=("before", "mean"),
        dollars_per_query_after=("after", "mean"),
    )
    table["after_over_before"] = table["dollars_per_query_after"] / table[
        "dollars_per_query_before"
    ].where(table["dollars_per_query_before"] > 0)
    return table.reset_index()


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-") or "sheet"


def check_run_dir(run_dir: str | Path) -> Path:
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise FileNotFoundError(f"{run_dir}: no such run folder")
    if not (run_dir / RESULTS).is_file():
        raise FileNotFoundError(
            f"{run_dir}: not a finished run folder (no {RESULTS}; a run writes it when it ends)"
        )
    return run_dir


def reprice_run(
    run_dir: str | Path, sheet: str | PriceSheet, out: str | Path | None = None
) -> RepriceResult:
    """Reprice a run folder's table (and records) with ``sheet``; writes beside the originals.

    ``out``: the repriced table's path (default ``RUN_DIR/results.<sheet>.parquet``); the records
    and the provenance JSON go in the same folder, named after the sheet and the table.
    """
    import pandas as pd

    run_dir = check_run_dir(run_dir)
    sheet = price_sheet(sheet) if not isinstance(sheet, PriceSheet) else sheet
    tag = _safe(sheet.name)
    table_path = Path(out) if out is not None else run_dir / f"results.{tag}.parquet"
    records_src = run_dir / RECORDS
    records_path = table_path.parent / f"records.{tag}.jsonl" if records_src.exists() else None
    info_path = table_path.with_suffix(".json")
    originals = {(run_dir / name).resolve() for name in (RESULTS, RECORDS, "manifest.json")}
    for path in (table_path, records_path, info_path):
        if path is not None and path.resolve() in originals:
            raise ValueError(f"{path}: would overwrite the run's own file; choose another --out")

    before = read_folder_table(run_dir)  # another schema's folder: refused
    after, approximate = reprice_table(before, sheet)
    buf = io.BytesIO()  # read from parquet: every column is one pyarrow can type again
    after.to_parquet(buf, index=False)
    atomic_write_bytes(table_path, buf.getvalue())
    if records_path is not None:
        text = records_src.read_text(encoding="utf-8")
        atomic_write_text(records_path, reprice_records_text(text, sheet))
    warnings = []
    one_time = _column(before.columns, "one_time_seconds")
    unpriced = (
        int(pd.to_numeric(before[one_time], errors="coerce").notna().sum())
        if one_time and sheet.kind != "gpu_hour"
        else 0
    )
    if unpriced:
        warnings.append(
            f"{unpriced} record(s) with a one-time cost (long_context preload): a per-token "
            f"sheet cannot price it (records keep its seconds, not its tokens), so their "
            f"one_time_dollars and amortised_dollars are left empty"
        )
    if approximate:
        warnings.append(
            f"{approximate} record(s) of several model calls: the sheet's long-context tier or "
            f"minimum cacheable prefix was applied to their summed tokens (an approximation)"
        )
    summary = compare(before, after)
    info = {
        "repriced_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "price_sheet": sheet.describe(),
        "from": {"table": str(run_dir / RESULTS), "sha256": sha256_file(run_dir / RESULTS)},
        "table": str(table_path),
        "records": str(records_path) if records_path else None,
        "warnings": warnings,
        "summary": json.loads(summary.to_json(orient="records")),
    }
    atomic_write_text(info_path, json.dumps(info, indent=2, sort_keys=True) + "\n")
    return RepriceResult(after, table_path, records_path, info_path, summary, warnings)
