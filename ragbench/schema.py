"""The one version of what a run writes, and the one way older run folders are read.

``SCHEMA_VERSION`` enters every config hash (so a new schema is a new run folder), every work
key and every stored record line (``records.jsonl``) and ``manifest.json``. Whatever changes
the shape of what is stored (a renamed field, a nested parameter) bumps it once, here, and
teaches ``migrate_record`` / ``migrate_table`` the step; no field keeps an older name or drops
out of a hash anywhere else.

Old folders, two ways:

- *read* (``ragbench reprice``, ``export``, ``check``, the verdict, the notebooks): their records
  go through ``migrate_line`` and their tables through ``migrate_table`` (``read_folder_table``)
  and read as this schema's;
- *resumed* (a run writing into one): refused by ``refuse_resume`` with one line naming the
  folder's version; rerun the config, which writes a new folder.

Schema 1 is every folder written before this module (no ``schema_version`` anywhere). Schema 2:
a long-context point's KV-cache variant is nested (``kv: {name: quantized, bits: 4}``, not the
flat ``kv_cache`` / ``kv_bits`` / ... fields); every parameter is stored, at its default too;
``Cost`` stores ``resource_seconds`` and ``latency_seconds`` (schema-1 records may carry
``gpu_seconds`` and ``total_seconds``, and latency with the queue in it when they have no
``latency_basis``).
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

from ragbench.io import dumps_canonical

SCHEMA_VERSION = 2
KEY = "schema_version"  # its name in a manifest, a record line and the config hash

# schema 1's flat long-context keys -> (the variant they belong to, its parameter's name)
V1_KV_FIELDS: dict[str, tuple[str, str]] = {
    "kv_bits": ("quantized", "bits"),
    "kv_backend": ("quantized", "backend"),
    "sink_tokens": ("sinks", "sink_tokens"),
    "window_tokens": ("sinks", "window_tokens"),
    "kv_ratio": ("snapkv", "ratio"),
    "kv_window": ("snapkv", "window"),
}
V1_COST_NAMES = {"gpu_seconds": "resource_seconds", "total_seconds": "latency_seconds"}


class SchemaError(ValueError):
    """A run folder (or record) written by another schema, where it cannot be used as it is."""


def v1_kv_hint(key: str, params: dict[str, Any] | None = None) -> str | None:
    """How schema 2 writes a schema-1 flat KV key (``kv_bits``), for the config error: the
    variant ``params`` (the strategy's parameters, when known) name, nested; None when ``key``
    is not such a key."""
    if key != "kv_cache" and key not in V1_KV_FIELDS:
        return None
    if params and "kv_cache" in params:
        kv = _kv_v1(params)
        shown = kv if isinstance(kv, list) else [kv]
        text = ", ".join(
            "{" + ", ".join(f"{k}: {v}" for k, v in one.items()) + "}" for one in shown
        )
        return f"the variant is now nested: kv: {'[' + text + ']' if len(shown) > 1 else text}"
    if key == "kv_cache":
        return "the variant is now nested: kv: {name: quantized, bits: 4} (or kv: sinks)"
    variant, name = V1_KV_FIELDS[key]
    return f"it is now nested under kv: kv: {{name: {variant}, {name}: ...}}"


def version_of(data: dict[str, Any] | None) -> int:
    """The schema a manifest or record line was written by (none named: schema 1)."""
    return int((data or {}).get(KEY, 1))


def refuse_resume(folder: Path | str, version: int) -> None:
    """Raise SchemaError unless ``version`` is this schema's: a run never resumes into, nor
    appends to, a folder written by another schema."""
    if version != SCHEMA_VERSION:
        raise SchemaError(
            f"error: {folder} was written by ragbench schema {version}; this is schema "
            f"{SCHEMA_VERSION}: rerun it (its config writes a new run folder; the old one stays "
            "readable by reprice, export, check and the notebooks)"
        )


def _kv_v1(params: dict[str, Any]) -> dict[str, Any] | list[dict[str, Any]]:
    """The ``kv`` value that schema 2 writes for a schema-1 point's (or a config's) flat KV
    fields: ``{"name": variant, <its parameter>: ...}``; a config's list of variants (a grid
    axis) as a list of them, each with only its own parameters."""
    names = params.get("kv_cache") or "plain"
    kvs = []
    for name in names if isinstance(names, list) else [names]:
        kv: dict[str, Any] = {"name": name}
        for key, (variant, field) in V1_KV_FIELDS.items():
            if params.get(key) is not None and variant == name:
                kv[field] = params[key]
        if isinstance(names, list):  # a list of variants cannot nest another axis: expand it
            axes = [v if isinstance(v, list) else [v] for v in kv.values()]
            kvs += [dict(zip(kv, point, strict=True)) for point in itertools.product(*axes)]
        else:
            kvs.append(kv)
    return kvs if isinstance(names, list) else kvs[0]


def _kv_params_v1(params: dict[str, Any]) -> dict[str, Any]:
    """A schema-1 long-context parameter dict (a record's point or a config's spec) with its
    flat KV fields nested under ``kv``; another strategy's (no such field) as it was."""
    if "kv_cache" not in params and not any(k in params for k in V1_KV_FIELDS):
        return params
    kv = _kv_v1(params)
    rest = {k: v for k, v in params.items() if k != "kv_cache" and k not in V1_KV_FIELDS}
    return rest | {"kv": kv}


def _cost_v1(cost: dict[str, Any]) -> dict[str, Any]:
    cost = dict(cost)
    for old, new in V1_COST_NAMES.items():
        if old in cost:
            value = cost.pop(old)
            cost.setdefault(new, value)
    if "latency_basis" not in cost and cost.get("latency_seconds") is not None:
        # before latency_basis, latency included the harness's queue: taken out
        cost["latency_seconds"] -= cost.get("queue_seconds") or 0.0
    cost.setdefault("latency_basis", "own")
    return cost


def migrate_record(record: dict[str, Any], version: int) -> dict[str, Any]:
    """A stored record (``Record.to_dict``'s form) written by schema ``version``, as this schema
    writes it. Raises SchemaError for a version it does not know (a newer ragbench's)."""
    if version == SCHEMA_VERSION:
        return record
    if version != 1:
        raise SchemaError(
            f"a record of ragbench schema {version}; this is schema {SCHEMA_VERSION}, which "
            "reads schema 1 and 2: upgrade ragbench"
        )
    record = dict(record)
    if isinstance(record.get("params"), dict):
        record["params"] = _kv_params_v1(record["params"])
    if isinstance(record.get("cost"), dict) and record["cost"]:
        record["cost"] = _cost_v1(record["cost"])
    return record


def migrate_config(config: dict[str, Any], version: int) -> dict[str, Any]:
    """A run's config as stored in its ``manifest.json`` by schema ``version``, as this schema
    reads it (``parse_config``): each strategy's flat KV fields nested under ``kv``. A copy;
    this schema's config is returned as it is. Raises SchemaError for an unknown version."""
    if version == SCHEMA_VERSION:
        return config
    migrate_record({}, version)  # unknown versions: the same error
    strategies = config.get("strategies")
    if not isinstance(strategies, list):
        return config
    migrated = [
        s | {"params": _kv_params_v1(s["params"])}
        if isinstance(s, dict) and isinstance(s.get("params"), dict)
        else s
        for s in strategies
    ]
    return config | {"strategies": migrated}


def migrate_line(row: dict[str, Any]) -> dict[str, Any]:
    """One ``records.jsonl`` line (``{"key", "record", "schema_version"}``) of any schema this
    one reads, as this schema writes it: THE migration of stored records. Raises SchemaError
    for a newer schema's line."""
    version = version_of(row)
    if version == SCHEMA_VERSION:
        return row
    record = migrate_record(row["record"], version)
    params = record.get("params") if isinstance(record.get("params"), dict) else {}
    return {"key": migrate_key(row["key"], params), "record": record, KEY: SCHEMA_VERSION}


def migrate_key(key: str, params: dict[str, Any]) -> str:
    """A schema-1 work key (``[example, strategy, params, format?]``) as this schema writes it
    (``ragbench.experiment.results.work_key``): the migrated ``params`` and the version."""
    try:
        parts = json.loads(key)
    except ValueError:
        parts = None
    if not (isinstance(parts, list) and len(parts) >= 2):
        return key  # not a work key this module knows: kept as it was
    return dumps_canonical([SCHEMA_VERSION, parts[0], parts[1], params, *parts[3:]])


def migrate_table(df: Any, version: int) -> Any:
    """A results table (``results.parquet``) written by schema ``version``, as this schema's:
    the ``params`` JSON and the parameter columns of a KV variant nested, cost columns under
    their names. A copy; the table of this schema is returned as it is."""
    if version == SCHEMA_VERSION:
        return df
    migrate_record({}, version)  # unknown versions: the same error
    df = df.rename(columns={o: n for o, n in V1_COST_NAMES.items() if n not in df.columns})
    df = df.drop(columns=[o for o in V1_COST_NAMES if o in df.columns])
    if "params" not in df.columns or "kv_cache" not in df.columns:
        return df
    df = df.copy()
    nested = [
        _kv_params_v1(json.loads(p)) if isinstance(p, str) and p.startswith("{") else None
        for p in df["params"]
    ]
    lc = [n is not None and "kv" in n for n in nested]
    df["params"] = [
        dumps_canonical(n) if n is not None else p
        for n, p in zip(nested, df["params"], strict=True)
    ]
    columns: dict[str, list[Any]] = {}
    for i, (n, is_lc) in enumerate(zip(nested, lc, strict=True)):
        for field, value in n["kv"].items() if is_lc else ():
            columns.setdefault(field, [None] * len(df))[i] = value
    at = list(df.columns).index("kv_cache")
    df = df.drop(columns=["kv_cache", *[k for k in V1_KV_FIELDS if k in df.columns]])
    for offset, (field, values) in enumerate(columns.items()):
        df.insert(at + offset, "kv" if field == "name" else f"kv_{field}", values)
    return df


def read_folder_table(run_dir: Path | str) -> Any:
    """A run folder's ``results.parquet`` as this schema's table (``migrate_table``, the
    version from its ``manifest.json``)."""
    import pandas as pd

    run_dir = Path(run_dir)
    return migrate_table(pd.read_parquet(run_dir / "results.parquet"), folder_version(run_dir))


def folder_version(run_dir: Path | str) -> int:
    """The schema of a run folder (its manifest's; a folder without a readable one: this)."""
    try:
        manifest = json.loads((Path(run_dir) / "manifest.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return SCHEMA_VERSION
    return version_of(manifest if isinstance(manifest, dict) else None)
