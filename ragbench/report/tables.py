"""Tables for reading: numbers formatted with their units, predictions cut to their answer, and a
run's provenance from its manifest. ``ragbench.report`` re-exports them for the notebooks."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import ragbench.report.readable as readable
from ragbench.cost.accounting import format_bytes
from ragbench.experiment.provenance import dataset_name


def _short_hash(value: Any) -> Any:
    """``files-sha256:<64 hex>`` -> ``files-sha256:<16 hex>``, like the other hashes shown."""
    if isinstance(value, str) and "sha256:" in value:
        head, _, digest = value.rpartition(":")
        return f"{head}:{digest[:16]}"
    return value


def _with_unit(key: str, value: Any) -> tuple[str, Any]:
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


def formatted(table: Any, rates: Sequence[str] = ()) -> Any:
    """``table`` formatted for reading (a ``Styler``; the numbers stay in ``.data``): $ per
    1,000 queries in fixed notation, rates as percentages, counts as integers. See
    ``ragbench.report.readable.readable_table``."""
    return readable.readable_table(table, rates)


def provenance(run_dir: str | Path) -> Any:
    """The run manifest's key facts as a one-column table (config hash, dataset fingerprint,
    model identity, commit, hardware, times), so a rendered notebook says what produced it.
    Paths are shown relative to the run folder's parent, never as absolute machine paths."""
    import pandas as pd

    manifest = json.loads((Path(run_dir) / "manifest.json").read_text(encoding="utf-8"))
    model = manifest.get("model", {})
    versions = manifest.get("versions", {})
    hardware = manifest.get("hardware", {})
    facts: dict[str, Any] = {
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


def predictions(df: Any, width: int = 60) -> Any:
    """``df`` with its ``prediction`` column cut to ``width`` characters from the end, where
    the answer is: small models restate the question first ("The special magic number
    mentioned in the text is 7463343."), and a table cut from the start shows only that."""
    out = df.copy()
    out["prediction"] = [
        text if not isinstance(text, str) or len(text) <= width else "…" + text[-(width - 1) :]
        for text in (t.strip() if isinstance(t, str) else t for t in out["prediction"])
    ]
    return out
