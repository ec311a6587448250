"""The run folder's records and table: ``records.jsonl`` (append-only, crash-safe) and the flat
``results.parquet`` view of it, one row per (example, strategy, parameter point).

Table columns come in a fixed order, whatever order the records were written or resumed in:
identity (``example_id``, ``strategy``, ``label``, ``params``, ``prediction``, ``answers``,
``error``), then the parameters, the scores, the cost (``Cost`` field order), the record's meta
and the example's scalar facts. A name used by two sections (a score named like a parameter)
never overwrites: every section that uses it gets its prefix (``param_``, ``score_``, ``cost_``,
``meta_``, ``ex_``).

A one-time cost (``long_context preload``) is amortised here, over the questions the table
answers (``strategies.preload.amortise_answered``): the run stopped early, a sequential look
mid-run and the finished run each get ``amortised_over`` = the questions answered with it.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

from ragbench.cost import Cost
from ragbench.cost.prices import PriceSheet
from ragbench.cost.reprice import reprice_stale
from ragbench.io import dumps_canonical
from ragbench.schema import KEY as SCHEMA_KEY
from ragbench.schema import SCHEMA_VERSION, SchemaError, check, check_folder
from ragbench.secrets import redact_text
from ragbench.strategies import params_from_dict
from ragbench.strategies.driver import outcome_parts
from ragbench.strategies.params import StrategyParams
from ragbench.strategies.preload import amortise_answered
from ragbench.types import Example, Record

if TYPE_CHECKING:
    import pandas as pd

log = logging.getLogger(__name__)
RECORDS = "records.jsonl"
ID_COLUMNS = ("example_id", "strategy", "label", "params", "prediction", "answers", "error")
SECTIONS = ("param_", "score_", "cost_", "meta_", "ex_")  # in column order


def work_key(
    example_id: str, strategy: str, params: dict[str, object], fmt: str = "ragbench"
) -> str:
    """A record's identity in its run folder: the schema it is stored in
    (``ragbench.schema``), the example, the strategy and its parameters. A prompt format other
    than ragbench's (the example's, ``strategies.prompt_format``) is part of it: records
    answered with other prompts are not taken for these."""
    fmts = [fmt] if fmt != "ragbench" else []
    return dumps_canonical([SCHEMA_VERSION, example_id, strategy, params, *fmts])


def record_from_dict(data: dict[str, Any]) -> Record:
    """A stored record with its ``params`` and ``cost`` typed again (the strategy's parameter
    class, ``Cost``); ``Record.from_dict`` alone leaves them as the JSON objects they were."""
    data = dict(data)
    if isinstance(data.get("params"), dict):
        data["params"] = params_from_dict(str(data.get("strategy")), data["params"])
    if isinstance(data.get("cost"), dict):
        data["cost"] = Cost.from_dict(data["cost"]) if data["cost"] else None
    return Record.from_dict(data)


def read_records(path: Path) -> dict[str, Record]:
    """Records already written, by work key. A torn last line (killed mid-write) is cut off.
    A folder (its manifest) or line of another schema is refused (``ragbench.schema.check``:
    SchemaError)."""
    done: dict[str, Record] = {}
    if not path.exists():
        return done
    check_folder(path.parent)
    data = path.read_bytes()
    good_end = 0
    for lineno, line in enumerate(data.splitlines(keepends=True), start=1):
        if not line.endswith(b"\n"):
            break  # torn write: the line never got its newline; only this is cut off
        good_end += len(line)
        try:
            row = json.loads(line)
            check(row, f"{path}:{lineno}")
            done[row["key"]] = record_from_dict(row["record"])
        except SchemaError:
            raise  # another schema's records: not "unreadable", never run again over them
        except (json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            # a complete but unreadable line (another version's fields, a bad edit): skip it,
            # keep every record after it; its work item is simply run again
            log.warning("%s:%d: skipping unreadable record (%s)", path, lineno, exc)
    if good_end < len(data):
        log.warning("%s: dropping %d bytes of a torn last record", path, len(data) - good_end)
        with path.open("r+b") as f:
            f.truncate(good_end)
            f.flush()
            os.fsync(f.fileno())
    return done


def record_line(key: str, record: Record) -> str:
    """One ``records.jsonl`` line: the work key, the record and the schema they are in."""
    return dumps_canonical({"key": key, "record": record.to_dict(), SCHEMA_KEY: SCHEMA_VERSION})


def append_record(f: BinaryIO, key: str, record: Record) -> None:
    f.write((record_line(key, record) + "\n").encode("utf-8"))
    f.flush()
    os.fsync(f.fileno())


def reprice_resumed(
    done: dict[str, Record], sheet: PriceSheet | None, path: Path
) -> dict[str, Any] | None:
    """Resuming a run whose price sheet changed since some of its records were priced: those
    records priced again with the sheet as it is now (``ragbench.cost.reprice.reprice_stale``,
    what ``ragbench reprice`` does), appended to ``records.jsonl`` (the last line of a key wins,
    so the file stays append-only and a crash midway is finished by the next resume) and put in
    ``done``; one warning line says so, naming both hashes. Returns what the session's manifest
    entry logs, or None when nothing was repriced (no sheet; every record already priced by it;
    records older than the hash whose dollars the sheet gives again only get the hash added)."""
    if sheet is None or not done:
        return None
    stale = reprice_stale(done, sheet)
    if not stale.changed:
        return None
    with path.open("ab") as f:  # one fsync for them all: an old run may have thousands
        for key, record in stale.changed.items():
            f.write((record_line(key, record) + "\n").encode("utf-8"))
            done[key] = record
        f.flush()
        os.fsync(f.fileno())
    if not stale.repriced:
        return None
    was = ", ".join(f"{sha} ({n})" for sha, n in stale.was.items())
    log.warning(
        "%s: price sheet %r changed since %d stored record(s) were priced (sha256 %s -> "
        "%s): repriced them with the sheet as it is now, as `ragbench reprice` does",
        path,
        sheet.name,
        len(stale.repriced),
        was,
        sheet.short_sha256(),
    )
    for message in stale.warnings:
        log.warning("%s", message)
    return {
        "price_sheet": sheet.name,
        "sha256": sheet.short_sha256(),
        "from": stale.was,
        "records": len(stale.repriced),
        "warnings": stale.warnings,
    }


def error_record(example: Example, params: StrategyParams, exc: BaseException) -> Record:
    """The failed item's record; one that failed after some of its calls finished
    (``FailedAfterPaying``) carries their cost (analyses leave error rows out; a budget counts
    what they spent)."""
    error, cost = outcome_parts(exc)
    return Record(
        example_id=example.id,
        strategy=params.strategy,
        params=params,
        prediction="",
        answers=example.answers,
        cost=cost,
        error=redact_text(f"{type(error).__name__}: {error}"),  # errors quote URLs and payloads
    )


def _sections(record: Record, example_meta: dict[str, object]) -> list[dict[str, object]]:
    """(params, scores, cost, meta, example facts) of one record, in SECTIONS order."""
    facts = {k: v for k, v in example_meta.items() if not isinstance(v, list | dict)}
    cost = record.cost.to_dict() if record.cost is not None else {}
    meta = dict(sorted(record.meta.items()))
    params = flat_params(record.params.to_dict())
    return [params, dict(record.scores), cost, meta, dict(sorted(facts.items()))]


def flat_params(params: dict[str, object]) -> dict[str, object]:
    """Parameters as table columns: a nested one named by its ``name`` (``kv: {name: sinks,
    sink_tokens: 4}``) is a column of its name (``kv``: ``sinks``) and one per setting
    (``kv_sink_tokens``: 4); ``params`` keeps the nested JSON."""
    out: dict[str, object] = {}
    for key, value in params.items():
        if isinstance(value, dict) and "name" in value:
            out[key] = value["name"]
            out.update({f"{key}_{k}": v for k, v in value.items() if k != "name"})
        else:
            out[key] = value
    return out


def flatten(record: Record, example_meta: dict[str, object]) -> dict[str, object]:
    """One table row: identity, then params, scores, cost, record meta, scalar example facts."""
    return _flatten(record, example_meta)[0]


def _flatten(
    record: Record, example_meta: dict[str, object]
) -> tuple[dict[str, object], dict[str, tuple[int, int]]]:
    """The row, and for each non-identity column its (section, position in the section)."""
    row: dict[str, object] = {
        "example_id": record.example_id,
        "strategy": record.strategy,
        "label": record.params.label(),
        "params": dumps_canonical(record.params.to_dict()),
        "prediction": record.prediction,
        "answers": list(record.answers),
        "error": record.error,
    }
    sections = _sections(record, example_meta)
    seen: dict[str, int] = {}
    for section in sections:
        for key in section:
            seen[key] = seen.get(key, 0) + 1
    where: dict[str, tuple[int, int]] = {}
    for s, (prefix, section) in enumerate(zip(SECTIONS, sections, strict=True)):
        for position, (key, value) in enumerate(section.items()):
            name = prefix + key if seen[key] > 1 or key in ID_COLUMNS else key
            row[name] = value
            where[name] = (s, position)
    return row, where


def table(
    records: list[Record], example_meta: dict[str, dict[str, object]], metrics: list[str]
) -> Any:  # a pandas DataFrame (pandas imported when a table is made)
    """The results DataFrame: rows in the given order, columns in the fixed order above; a
    one-time cost amortised over the records given that answered with it."""
    import pandas as pd

    records = amortise_answered(records, example_meta)
    rows: list[dict[str, object]] = []
    rank: dict[str, tuple[object, int, str]] = {}  # column -> (section, position, name)
    score_order = {m: i for i, m in enumerate(metrics)}
    for record in records:
        row, where = _flatten(record, example_meta[record.example_id])
        rows.append(row)
        for name, (section, position) in where.items():
            # parameters and cost keep their field order, scores the config's metric order,
            # meta and example facts sort by name
            if SECTIONS[section] == "score_":
                position = score_order.get(name.removeprefix("score_"), len(score_order))
            elif SECTIONS[section] in ("meta_", "ex_"):
                position = 0
            rank.setdefault(name, (section, position, name))
    for name in metrics:  # a score column exists even when no record has it (all failed)
        if name not in rank and f"score_{name}" not in rank:
            rank[name] = (SECTIONS.index("score_"), score_order[name], name)
    columns = list(ID_COLUMNS) + sorted(rank, key=lambda n: rank[n])
    return pd.DataFrame(rows, columns=columns)


def parquet_bytes(df: pd.DataFrame) -> bytes:
    """Parquet of ``df``; object columns pyarrow cannot type (mixed kinds) become JSON text."""
    import io

    import pandas as pd
    import pyarrow as pa

    df = df.copy()
    for col in [c for c in df.columns if pd.api.types.is_object_dtype(df[c])]:
        try:
            pa.array(df[col])
        except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError):
            df[col] = [None if v is None else json.dumps(v, default=str) for v in df[col]]
    buf = io.BytesIO()
    df.to_parquet(buf, index=False)
    return buf.getvalue()
