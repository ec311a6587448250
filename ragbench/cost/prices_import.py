"""A price sheet from the ``genai-prices`` package (optional): ``ragbench prices import-genai``.

When a model has no shipped sheet in ``ragbench/data/prices``, ``import_genai_sheet`` looks it
up in the installed genai-prices bundled snapshot (offline) and ``sheet_from_genai`` turns its
``ModelPrice`` into a sheet mapping that ``ragbench.cost.prices.parse_price_sheet`` reads and
``ragbench.cost.prices.sheet_yaml`` writes. The package is used only here, and only when asked
(why it is not the run-time source of prices: the ``ragbench.cost.prices`` docstring).
"""

from __future__ import annotations

import re
from typing import Any


def _decimal(value: Any) -> float | None:
    return None if value is None else float(value)


def sheet_from_genai(
    model_price: object,
    *,
    name: str,
    provider: str,
    model: str,
    date: str,
    source: str,
    note: str = "",
) -> dict[str, object]:
    """A price-sheet mapping (``parse_price_sheet`` input) from a genai-prices ``ModelPrice``.

    genai-prices gives each token price as a number or as ``TieredPrices(base, tiers)`` whose
    tiers are cliffs on the prompt length, as ours are; tiers of different prices are merged by
    threshold. It has no minimum cacheable prefix: the sheet leaves it at 0, so add it by hand.
    """
    fields = {
        "input_per_million": "input_mtok",
        "cached_input_per_million": "cache_read_mtok",
        "cache_write_per_million": "cache_write_mtok",
        "output_per_million": "output_mtok",
    }
    sheet: dict[str, object] = {
        "name": name,
        "kind": "api",
        "provider": provider,
        "model": model,
        "date": date,
        "source": source,
        "currency": "USD",
    }
    tiers: dict[int, dict[str, float | None]] = {}
    for ours, theirs in fields.items():
        value = getattr(model_price, theirs, None)
        if value is None:
            continue
        if hasattr(value, "base"):  # TieredPrices
            sheet[ours] = _decimal(value.base)
            for tier in value.tiers:
                tiers.setdefault(int(tier.start), {})[ours] = _decimal(tier.price)
        else:
            sheet[ours] = _decimal(value)
    if "input_per_million" not in sheet or "output_per_million" not in sheet:
        raise ValueError(f"genai-prices has no token prices for {provider}/{model}")
    # no cache-read price: the provider has no prompt cache, so a "cached" token costs input
    sheet.setdefault("cached_input_per_million", sheet["input_per_million"])
    if getattr(model_price, "cache_write_mtok", None) is not None:
        sheet["cache_ttl"] = "5m"  # genai-prices' cache_write_mtok is the default (5-minute) write
    if tiers:
        # genai-prices applies a tier when the input has more than ``start`` tokens: our cliff
        sheet["long_context_tiers"] = [
            {"above_prompt_tokens": start, **p} for start, p in sorted(tiers.items())
        ]
    if note:
        sheet["note"] = note
    return sheet


def import_genai_sheet(model: str, provider: str | None = None) -> dict[str, object]:
    """Look ``model`` up in the installed genai-prices snapshot (offline) -> a sheet mapping."""
    try:
        import genai_prices
        from genai_prices.data_snapshot import get_snapshot
    except ImportError:
        raise ValueError(
            "genai-prices is not installed; `pip install genai-prices` (it works offline from "
            "its bundled snapshot), or write a sheet by hand from ragbench/data/prices"
        ) from None
    from datetime import UTC, datetime

    try:
        prov, info = get_snapshot().find_provider_model(model, None, provider, None)
    except LookupError as exc:
        raise ValueError(f"genai-prices has no model {model!r}: {exc}") from None
    now = datetime.now(tz=UTC)
    price = info.get_prices(now)
    urls = [*(getattr(prov, "pricing_urls", None) or [])]
    version = getattr(genai_prices, "__version__", "?")
    safe = re.sub(r"[^A-Za-z0-9._-]+", "-", f"{prov.id}-{info.id}")
    return sheet_from_genai(
        price,
        name=safe,
        provider=prov.id,
        model=info.id,
        date=now.date().isoformat(),
        source=" ".join(urls) or "genai-prices",
        note=(
            f"Imported from the genai-prices {version} bundled snapshot (github.com/pydantic/"
            f"genai-prices), prices in force on the date above. Not verified by hand; no "
            f"minimum cacheable prefix: add min_cacheable_prompt_tokens from the provider's docs."
        ),
    )
