"""The one version of what a run writes, and the refusal of any other.

``SCHEMA_VERSION`` enters every config hash (so a new schema is a new run folder), every work
key and every stored record line (``records.jsonl``) and ``manifest.json``. Whatever changes
the shape of what is stored (a renamed field, a nested parameter) bumps it once, here; no field
keeps an older name or drops out of a hash anywhere else.

A run folder or record line of another schema is neither read nor resumed: ``check`` refuses it
with one line naming the schema it was written by (rerun its config: a new run folder). Schema 1
is every folder written before the version existed (no ``schema_version`` anywhere); schema 2
nests a long-context point's KV-cache variant (``kv: {name: quantized, bits: 4}``), stores every
parameter at its default too, and names ``Cost``'s times ``resource_seconds`` and
``latency_seconds``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

SCHEMA_VERSION = 2
KEY = "schema_version"  # its name in a manifest, a record line and the config hash


class SchemaError(ValueError):
    """A run folder (or record line) written by another schema."""


def version_of(data: dict[str, Any] | None) -> int:
    """The schema a manifest or record line was written by (none named: schema 1)."""
    return int((data or {}).get(KEY, 1))


def check(data: dict[str, object] | None, where: Path | str) -> None:
    """Raise SchemaError, one line naming the schema ``data`` (a manifest or a record line, read
    from ``where``) was written by, unless it is this schema."""
    version = version_of(data)
    if version == SCHEMA_VERSION:
        return
    fix = (
        "rerun its config (it writes a new run folder)"
        if version < SCHEMA_VERSION
        else "upgrade ragbench to read it"
    )
    raise SchemaError(
        f"{where} was written by ragbench schema {version}; this is schema {SCHEMA_VERSION}: {fix}"
    )


def check_folder(run_dir: Path | str) -> None:
    """``check`` a run folder's ``manifest.json``; a folder without a readable one passes (a
    first run, a bare ``results.parquet``): its record lines are checked one by one."""
    try:
        manifest = json.loads((Path(run_dir) / "manifest.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return
    check(manifest if isinstance(manifest, dict) else {KEY: SCHEMA_VERSION}, run_dir)


def read_folder_table(run_dir: Path | str) -> Any:
    """A run folder's ``results.parquet``, after ``check_folder``."""
    import pandas as pd

    check_folder(run_dir)
    return pd.read_parquet(Path(run_dir) / "results.parquet")
