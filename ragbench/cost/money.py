"""Money in one place: every dollar ragbench shows comes from ``dollars(sheet, usage, seconds,
basis)``: a record's cost (``Cost.of``), a reprice (``Cost.repriced``), a dry run's bound, the
question generator's usage and the planning arithmetic. Nothing else reads a sheet's rates
(``tests/test_money.py`` scans the package for it).

What a sheet (``ragbench.cost.prices``) charges:

* ``kind: api``: tokens (``Usage``), per million, at the rates of the long-context tier the whole
  prompt falls in (``PriceSheet.rates``): uncached input, cached input (read from the provider's
  prefix cache), cache writes, output. A cache read or write shorter than the sheet's
  ``min_cacheable_prompt_tokens`` would not have happened at that provider: plain input.
  Seconds are ignored.
* ``kind: gpu_hour``: device seconds, ``gpu_hour x gpus x seconds / 3600`` (``seconds``: one
  device's worth, the query's own share). Which seconds is the ``basis``: ``Seconds`` carries the
  measured ones and the calibrated model's (``modelled``); ``calibrated`` charges the modelled
  ones where known, every other basis (``measured``, ``mixed``: a query of calls on both, None:
  unknown) the measured ones. A plain float is the seconds to charge. Tokens are ignored.

``queries`` prices that many queries of the same shape ($ per 1,000 queries: ``queries=1000``),
multiplied in where the planning arithmetic always did, so its figures keep their last digit.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ragbench.cost.prices import PriceSheet
from ragbench.types import Completion

# how an hourly sheet finds a query's device seconds: "calibrated" (the default) prices the
# query's own work with its model's measured rates; "measured" charges its measured share
COST_BASES = ("calibrated", "measured")
# what a summed or logged cost may say besides: calls on both bases, or not known
_BASES = (*COST_BASES, "mixed", None)


@dataclass(frozen=True)
class Usage:
    """The tokens an api sheet prices. ``prompt_tokens`` is the whole prompt; of it,
    ``cached_prompt_tokens`` were read from the provider's cache and ``cache_write_tokens``
    written to it (Anthropic's ``cache_creation_input_tokens``); the rest is plain input."""

    prompt_tokens: float = 0
    cached_prompt_tokens: float = 0
    completion_tokens: float = 0
    cache_write_tokens: float = 0

    @classmethod
    def of(cls, completion: Completion) -> Usage:
        """A completion's tokens; a backend that knows how many prompt tokens it wrote to a
        provider's cache reports them in ``meta["cache_write_tokens"]``."""
        return cls(
            prompt_tokens=completion.prompt_tokens,
            cached_prompt_tokens=completion.cached_prompt_tokens,
            completion_tokens=completion.completion_tokens,
            cache_write_tokens=(completion.meta or {}).get("cache_write_tokens") or 0,
        )


NO_USAGE = Usage()


@dataclass(frozen=True)
class Seconds:
    """The device seconds an hourly sheet may charge: ``measured`` (the query's own share of
    device time, plus any prefix the alone rule charges) and ``modelled`` (its tokens by the
    calibrated model; None: no model)."""

    measured: float = 0.0
    modelled: float | None = None

    def charged(self, basis: str | None) -> float:
        """The modelled seconds under the calibrated basis where they are known, else the
        measured ones."""
        if basis not in _BASES:
            raise ValueError(f"cost basis must be one of {list(_BASES)}, got {basis!r}")
        return (
            self.modelled if basis == "calibrated" and self.modelled is not None else self.measured
        )


def _count(name: str, value: Any) -> float:
    v = float(value)
    if not v >= 0:  # also rejects NaN: an unknown count has no price
        raise ValueError(f"{name} must be a number >= 0, got {value!r}")
    return v


def dollars(
    sheet: PriceSheet,
    usage: Usage = NO_USAGE,
    seconds: Seconds | float = 0.0,
    basis: str | None = "measured",
    *,
    queries: int = 1,
) -> float:
    """Dollars of ``queries`` queries of this ``usage`` (an api sheet) or these device
    ``seconds`` on ``basis`` (an hourly sheet); see the module docstring."""
    if sheet.kind == "gpu_hour":
        p = sheet.prices
        charged = seconds.charged(basis) if isinstance(seconds, Seconds) else seconds
        # (queries x hourly) first: the order $/1k always had, and x1 changes no bit
        hourly = p["gpu_hour"] * p["gpus"]
        return queries * hourly * _count("device_seconds", charged) / 3600.0
    prompt = _count("prompt_tokens", usage.prompt_tokens)
    cached = _count("cached_prompt_tokens", usage.cached_prompt_tokens)
    written = _count("cache_write_tokens", usage.cache_write_tokens)
    output = _count("completion_tokens", usage.completion_tokens)
    if cached + written > prompt:
        raise ValueError(
            f"cached_prompt_tokens ({cached:g}) + cache_write_tokens ({written:g}) exceed "
            f"prompt_tokens ({prompt:g})"
        )
    # a prefix shorter than the provider's minimum is never cached there: plain input
    if cached < sheet.min_cacheable_prompt_tokens:
        cached = 0.0
    if written < sheet.min_cacheable_prompt_tokens:
        written = 0.0
    r = sheet.rates(prompt)
    return queries * (
        (
            (prompt - cached - written) * r["input_per_million"]
            + cached * r["cached_input_per_million"]
            + written * r["cache_write_per_million"]
            + output * r["output_per_million"]
        )
        / 1e6
    )
