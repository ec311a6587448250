"""A run folder's ``manifest.json``: what produced its numbers (config and model identity with
credentials masked, dataset fingerprint, versions, commit, hardware, price sheet, cost basis and
the calibration the dollars were modelled with) and its history (the first start, one
``sessions`` entry per invocation, so a resumed run keeps its past)."""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ragbench import secrets
from ragbench.datasets.formats import fingerprint
from ragbench.experiment import provenance
from ragbench.experiment.config.run import config_hash
from ragbench.experiment.session import RunSession
from ragbench.io import atomic_write_text
from ragbench.metrics.answer import metric_versions
from ragbench.schema import KEY as SCHEMA_KEY
from ragbench.schema import SCHEMA_VERSION, check

if TYPE_CHECKING:
    import pandas as pd

log = logging.getLogger(__name__)


def read_manifest(out: Path, keep_damaged: bool = False) -> dict[str, object] | None:
    """The run folder's manifest; None for a first run or a damaged file. ``keep_damaged`` (a
    run about to write a new one): a damaged file is moved aside, never silently replaced."""
    path = out / "manifest.json"
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None  # a first run
    except (OSError, ValueError) as exc:  # too damaged to keep its history
        if keep_damaged:
            stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
            kept = path.with_name(f"manifest.json.damaged-{stamp}")
            path.replace(kept)
            log.warning(
                "%s is unreadable (%s): kept as %s; a new manifest starts the run's history again",
                path,
                exc,
                kept.name,
            )
        return None


def check_schema(out: Path) -> None:
    """Refuse (``ragbench.schema.check``: one line naming its version) to resume a run folder
    another schema wrote; a first run, or a folder of this schema, passes."""
    manifest = read_manifest(out)
    if manifest is not None:
        check(manifest, out)


def sessions_of(previous: dict[str, Any] | None) -> list[dict[str, Any]]:
    """The earlier invocations of this run folder, oldest first (manifests written before the
    session log existed give one entry from their start and end times)."""
    if not previous:
        return []
    if isinstance(previous.get("sessions"), list):
        return list(previous["sessions"])
    return [{k: previous.get(k) for k in ("started_at", "finished_at")}]


def write_manifest(
    session: RunSession,
    identity: dict[str, Any],
    sessions: list[dict[str, Any]],
    status: str,
    records: pd.DataFrame | None,  # the results table (None: not written yet)
    judge: dict[str, Any] | None = None,
) -> dict:
    """manifest.json: what produced the run's numbers, credentials masked. ``started_at`` is the
    first invocation's start and ``sessions`` logs every invocation (start, end, records it had
    to generate, errors), so a resumed run keeps its history."""
    cfg, out, examples = session.cfg, session.out, session.examples
    calibration = session.loaded.calibration
    manifest: dict[str, Any] = {
        "name": cfg.name,
        "config": secrets.redact(cfg.model_dump(mode="json")),
        "config_hash": config_hash(cfg),
        SCHEMA_KEY: SCHEMA_VERSION,  # what its records are stored in (ragbench.schema)
        "dataset": {
            "name": cfg.dataset.name,
            "fingerprint": fingerprint(examples),
            "n": len(examples),
        },
        "model": secrets.redact(identity),
        # which sheet priced the dollars, and as of when (a reprice writes its own beside it)
        "price_sheet": cfg.sheet.describe() if cfg.sheet is not None else None,
        # how an hourly sheet found its seconds, and the calibration (key, cache file, rates)
        # that modelled them; a session that loaded no model keeps the last one
        "cost_basis": cfg.cost_basis,
        "calibration": calibration or (read_manifest(out) or {}).get("calibration"),
        # each metric's version: a scoring fix bumps it, so runs scored apart can be told apart
        "metric_versions": metric_versions(cfg.metrics),
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
    # where the run was logged (the MLflow run id: ragbench.workspace.tracking), so a resumed
    # run logs to the same tracking run
    if tracked := (read_manifest(out) or {}).get("tracking"):
        manifest["tracking"] = tracked
    if cfg._overrides:  # `ragbench run --set ...`: what the file alone does not say
        manifest["overrides"] = [secrets.redact_text(o) for o in cfg._overrides]
    if records is not None:
        manifest["records"] = len(records)
        manifest["errors"] = int(records["error"].notna().sum())
        manifest["resumed_records"] = len(records) - sessions[-1]["pending"]
    atomic_write_text(out / "manifest.json", json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    return manifest
