"""Price sheets: dated YAML data files that turn a query's tokens or device seconds into dollars.

A sheet is ``kind: api`` ($ per million input, cached-input and output tokens) or
``kind: gpu_hour`` ($ per hour x devices held, charged on measured device seconds). Every sheet
names its date and source; no price lives in code. Shipped sheets are in ``ragbench/data/prices``
and are looked up by name through ``PRICE_SHEETS`` (a path to any YAML file works too).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from ragbench.io import InputFileError
from ragbench.registry import Registry, did_you_mean, unknown
from ragbench.types import Completion

PRICES_DIR = Path(__file__).parent / "data" / "prices"

_API_FIELDS = ("input_per_million", "cached_input_per_million", "output_per_million")
_GPU_FIELDS = ("gpu_hour", "gpus")
_COMMON = ("name", "kind", "date", "source", "currency")
_OPTIONAL = ("hardware", "peak_flops", "note")


@dataclass(frozen=True)
class PriceSheet:
    """One price sheet. ``kind="api"``: $ per million tokens; ``kind="gpu_hour"``: $ per hour."""

    name: str
    kind: str
    date: str
    source: str
    currency: str = "USD"
    prices: dict[str, float] = field(default_factory=dict)
    hardware: str = ""
    peak_flops: float | None = None
    path: str = ""


# shipped sheets by name -> their YAML file (a Registry like every other set of names)
PRICE_SHEETS = Registry("price sheet", {p.stem: p for p in sorted(PRICES_DIR.glob("*.yaml"))})


def available_price_sheets() -> list[str]:
    return PRICE_SHEETS.names()


def price_sheet(name_or_path: str | os.PathLike) -> PriceSheet:
    """Load a shipped sheet by name (``ragbench/data/prices/<name>.yaml``) or any YAML path."""
    path = Path(name_or_path)
    if not (path.suffix in (".yaml", ".yml") and path.exists()):
        if str(name_or_path) not in PRICE_SHEETS:
            raise unknown("price sheet", str(name_or_path), [*PRICE_SHEETS.names(), "<path.yaml>"])
        path = PRICE_SHEETS.get(str(name_or_path))
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        line = getattr(getattr(exc, "problem_mark", None), "line", None)
        raise InputFileError(
            path, None if line is None else line + 1, f"invalid YAML: {exc}"
        ) from None
    return parse_price_sheet(data, str(path))


def parse_price_sheet(data: Any, where: str = "<price sheet>") -> PriceSheet:
    if not isinstance(data, dict):
        raise InputFileError(where, None, "a price sheet must be a YAML mapping")
    kind = data.get("kind")
    if kind not in ("api", "gpu_hour"):
        raise InputFileError(where, None, f"kind must be 'api' or 'gpu_hour', got {kind!r}", "kind")
    price_fields = _API_FIELDS if kind == "api" else _GPU_FIELDS
    valid = set(_COMMON + _OPTIONAL + price_fields)
    for key in data:
        if key not in valid:
            raise InputFileError(where, None, f"unknown key; {did_you_mean(key, valid)}", key)
    for key in ("name", "date", "source", *price_fields):
        if data.get(key) in (None, ""):
            raise InputFileError(
                where, None, "required (every sheet carries a date and a source)", key
            )
    prices: dict[str, float] = {}
    for key in price_fields:
        value = data[key]
        if not isinstance(value, int | float) or isinstance(value, bool) or value < 0:
            raise InputFileError(where, None, f"must be a number >= 0, got {value!r}", key)
        prices[key] = float(value)
    peak = data.get("peak_flops")
    return PriceSheet(
        name=str(data["name"]),
        kind=kind,
        date=str(data["date"]),
        source=str(data["source"]).strip(),
        currency=str(data.get("currency", "USD")),
        prices=prices,
        hardware=str(data.get("hardware", "")),
        peak_flops=float(peak) if peak is not None else None,
        path=where,
    )


def gpu_seconds(completion: Completion, gpus: float = 1.0) -> float:
    """Device seconds charged for one completion: its resource seconds x devices held.

    ``completion.resource_seconds`` is its own share of the device time (the transformers backend
    splits a batch's time by each row's stand-alone cost; the shares add up to the batch's wall
    time). Never latency: queueing is not charged. Completions recorded before that field existed
    carry the share in ``meta["gpu_seconds"]``; a backend that measures neither falls back to
    prefill + decode, the time it held the device for (an estimate on a shared server).
    """
    if completion.resource_seconds is not None:
        return float(completion.resource_seconds) * gpus
    share = (completion.meta or {}).get("gpu_seconds")
    own = completion.prefill_seconds + completion.decode_seconds
    return (own if share is None else float(share)) * gpus


def dollars_per_query(completion: Completion, sheet: PriceSheet) -> float:
    """API: uncached input, cached input and output tokens at their per-million prices.
    Self-hosted: the hourly price x measured GPU-seconds / 3600."""
    p = sheet.prices
    if sheet.kind == "api":
        uncached = completion.prompt_tokens - completion.cached_prompt_tokens
        return (
            uncached * p["input_per_million"]
            + completion.cached_prompt_tokens * p["cached_input_per_million"]
            + completion.completion_tokens * p["output_per_million"]
        ) / 1e6
    return p["gpu_hour"] * gpu_seconds(completion, p["gpus"]) / 3600.0
