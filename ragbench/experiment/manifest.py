"""A run folder's ``manifest.json``: what produced its numbers (config and model identity with
credentials masked, dataset fingerprint, versions, commit, hardware, price sheet) and its history
(the first start, one ``sessions`` entry per invocation, so a resumed run keeps its past)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ragbench import secrets
from ragbench.datasets.formats import fingerprint
from ragbench.experiment import provenance
from ragbench.experiment.config import RunConfig, config_hash
from ragbench.io import atomic_write_text


def read_manifest(out: Path) -> dict[str, Any] | None:
    try:
        return json.loads((out / "manifest.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None  # a first run, or a manifest too damaged to keep its history


def sessions_of(previous: dict[str, Any] | None) -> list[dict[str, Any]]:
    """The earlier invocations of this run folder, oldest first (manifests written before the
    session log existed give one entry from their start and end times)."""
    if not previous:
        return []
    if isinstance(previous.get("sessions"), list):
        return list(previous["sessions"])
    return [{k: previous.get(k) for k in ("started_at", "finished_at")}]


def write_manifest(
    out: Path, cfg: RunConfig, examples, identity, sessions, status: str, records, judge=None
) -> dict:
    """manifest.json: what produced the run's numbers, credentials masked. ``started_at`` is the
    first invocation's start and ``sessions`` logs every invocation (start, end, records it had
    to generate, errors), so a resumed run keeps its history."""
    manifest: dict[str, Any] = {
        "name": cfg.name,
        "config": secrets.redact(cfg.model_dump(mode="json")),
        "config_hash": config_hash(cfg),
        "dataset": {
            "name": cfg.dataset.name,
            "fingerprint": fingerprint(examples),
            "n": len(examples),
        },
        "model": secrets.redact(identity),
        # which sheet priced the dollars, and as of when (a reprice writes its own beside it)
        "price_sheet": cfg.sheet.describe() if cfg.sheet is not None else None,
        "status": status,
        "versions": provenance.versions(),
        "git_commit": provenance.git_commit(),
        "hardware": provenance.hardware(),
        "started_at": sessions[0].get("started_at"),
        "finished_at": sessions[-1].get("finished_at"),
        "sessions": sessions,
    }
    if judge is not None:
        manifest["judge"] = judge
    if cfg._overrides:  # `ragbench run --set ...`: what the file alone does not say
        manifest["overrides"] = [secrets.redact_text(o) for o in cfg._overrides]
    if records is not None:
        manifest["records"] = len(records)
        manifest["errors"] = int(records["error"].notna().sum())
        manifest["resumed_records"] = len(records) - sessions[-1]["pending"]
    atomic_write_text(out / "manifest.json", json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    return manifest
