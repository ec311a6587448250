"""Price sheets: dated YAML data files that say what a query's tokens or device seconds cost
(``ragbench.cost.money.dollars`` is the one function that turns them into dollars).

A sheet is ``kind: api`` ($ per million tokens) or ``kind: gpu_hour`` ($ per hour x devices
held, charged on device seconds: by default the seconds the calibrated model of the hardware
gives the query's own tokens, ``modelled_seconds``; with ``cost_basis: measured`` its measured
share, ``resource_seconds``; see ``money.COST_BASES``). Every sheet names its date and source; no
price lives in code. Shipped sheets are in ``ragbench/data/prices`` and are looked up by name
through ``PRICE_SHEETS`` (a path to any YAML file works too).

An ``api`` sheet prices, per million tokens:

* ``input_per_million``: prompt tokens neither read from nor written to a prompt cache;
* ``cached_input_per_million``: prompt tokens read from the provider's prefix cache;
* ``cache_write_per_million`` (optional; default: the input price): prompt tokens written to the
  cache. Anthropic charges a premium for writes (1.25x input for its 5-minute TTL, 2x for 1
  hour: ``cache_ttl`` names the one a sheet prices); OpenAI and Gemini's implicit caching charge
  writes as plain input, so their sheets leave it out;
* ``output_per_million``: completion tokens;
* ``long_context_tiers``: prices that replace the above when the prompt (all of its tokens,
  cached or not) is longer than ``above_prompt_tokens`` (Anthropic's 1M-context beta and Gemini
  2.5 Pro above 200k tokens). Providers price such a request *entirely* at the tier's rates (a
  cliff, not a marginal rate), so do we;
* ``min_cacheable_prompt_tokens``: the shortest prefix a provider caches (1024 for OpenAI).
  A cache read or write shorter than that would not have happened at that provider, so it is
  priced as plain input: what makes repricing a run measured elsewhere (vLLM caches any block)
  honest.

Why dated YAML sheets and not the ``genai-prices`` package at run time: it does install and works
offline from its bundled snapshot (checked with 0.2.3), but it pulls in its own HTTP client
(``httpx2``) that nothing else here needs, has no minimum-cacheable-prefix field, and its
snapshot changes with every release, so the same run would price differently after an upgrade.
A sheet is a file with a date that a run's table names, diffable and editable.
``ragbench prices import-genai`` writes a sheet from an installed genai-prices snapshot when a
model is missing here: ``ragbench.cost.prices_import`` (``sheet_from_genai``, ``import_genai_sheet``),
written out by ``sheet_yaml``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NotRequired, TypedDict, cast

import yaml

from ragbench.io import InputFileError, dumps_canonical, load_yaml, read_text, yaml_problem
from ragbench.llm.cost_model import Rates
from ragbench.registry import Registry, did_you_mean, unknown
from ragbench.types import Completion

PRICES_DIR = Path(__file__).parent.parent / "data" / "prices"

# the token prices of an api sheet; a long-context tier may override any of them
_TOKEN_PRICES = (
    "input_per_million",
    "cached_input_per_million",
    "cache_write_per_million",
    "output_per_million",
)
_API_REQUIRED = ("input_per_million", "cached_input_per_million", "output_per_million")
_API_OPTIONAL = (
    "cache_write_per_million",
    "cache_ttl",
    "long_context_tiers",
    "min_cacheable_prompt_tokens",
)
_GPU_REQUIRED = ("gpu_hour", "gpus")
_COMMON = ("name", "kind", "date", "source", "currency")
CURRENCY = "USD"  # what every sheet prices in; a sheet in another currency is refused
SHEET_HASH_CHARS = 16  # hex digits of the content hash a record keeps (price_sheet_sha256)
_OPTIONAL = ("hardware", "peak_flops", "note", "provider", "model")


@dataclass(frozen=True)
class PriceTier:
    """Token prices for a prompt longer than ``above_prompt_tokens`` (the whole request)."""

    above_prompt_tokens: int
    prices: dict[str, float] = field(default_factory=dict)  # the _TOKEN_PRICES it overrides


@dataclass(frozen=True)
class PriceSheet:
    """One price sheet. ``kind="api"``: $ per million tokens; ``kind="gpu_hour"``: $ per hour."""

    name: str
    kind: str
    date: str
    source: str
    currency: str = "USD"  # the only one (CURRENCY): every figure ragbench shows is in dollars
    prices: dict[str, float] = field(default_factory=dict)
    hardware: str = ""
    peak_flops: float | None = None
    path: str = ""
    tiers: tuple[PriceTier, ...] = ()  # ascending above_prompt_tokens
    min_cacheable_prompt_tokens: int = 0
    cache_ttl: str = ""  # the cache lifetime cache_write_per_million buys ("5m", "1h")
    note: str = ""
    provider: str = ""
    model: str = ""

    def rates(self, prompt_tokens: float = 0) -> dict[str, float]:
        """The four token prices ($ per million) for a request with ``prompt_tokens`` prompt
        tokens: the highest tier it exceeds, else the base prices; a cache write without its own
        price costs plain input."""
        if self.kind != "api":
            raise ValueError(f"price sheet {self.name!r} is {self.kind!r}: it has no token prices")
        rates = dict(self.prices)
        for tier in self.tiers:
            if prompt_tokens > tier.above_prompt_tokens:
                rates.update(tier.prices)
        rates.setdefault("cache_write_per_million", rates["input_per_million"])
        return rates

    def content_sha256(self) -> str:
        """sha256 of the sheet's parsed content (every field but ``path``), as canonical JSON: a
        price, tier, date or note edited in the file changes it; a YAML comment, the keys'
        order, the number's spelling (``3`` / ``3.0``) or the file's place do not. A run
        records it (``short_sha256`` on each record, the whole in the manifest) so a resumed run
        can tell that its sheet changed (``ragbench.cost.reprice.reprice_stale``)."""
        content = dataclasses.asdict(self)
        content.pop("path")
        return hashlib.sha256(dumps_canonical(content).encode("utf-8")).hexdigest()

    def short_sha256(self) -> str:
        """The content hash as a record's ``price_sheet_sha256`` column keeps it."""
        return self.content_sha256()[:SHEET_HASH_CHARS]

    def describe(self) -> dict[str, str]:
        """What a manifest or a repriced table records about the sheet that priced it."""
        return {
            "name": self.name,
            "date": self.date,
            "source": self.source,
            "path": self.path,
            "sha256": self.content_sha256(),
        }


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
    text = read_text(path)
    try:
        data = load_yaml(text)
    except yaml.YAMLError as exc:
        line, problem = yaml_problem(exc)
        raise InputFileError(path, line, f"invalid YAML: {problem}") from None
    try:
        return parse_price_sheet(data, str(path))
    except InputFileError as exc:  # name the line of the field at fault
        line = _line_of(text, exc.field or "")
        if line is None:
            raise
        raise InputFileError(path, line, exc.message, exc.field) from None


def _line_of(text: str, field: str) -> int | None:
    """1-based line of ``field`` (``long_context_tiers[1].above_prompt_tokens``) in a sheet's
    YAML: of the deepest part present, or None when not even its first is."""
    node, line = yaml.compose(text), None
    for part in re.findall(r"[^.\[\]]+", field):
        if isinstance(node, yaml.MappingNode):
            node = next((v for k, v in node.value if k.value == part), None)
        elif isinstance(node, yaml.SequenceNode) and part.isdigit() and int(part) < len(node.value):
            node = node.value[int(part)]
        else:
            node = None
        if node is None:
            break
        line = node.start_mark.line + 1
    return line


def _number(where: str, key: str, value: object) -> float:
    if isinstance(value, str):  # YAML 1.1 reads `192.0e9` (no exponent sign) as a string
        with contextlib.suppress(ValueError):
            value = float(value)
    # a price of .inf (or .nan) priced every call at NaN (0 x inf): no total, no cap
    if (
        not isinstance(value, int | float)
        or isinstance(value, bool)
        or not (value >= 0 and math.isfinite(value))
    ):
        raise InputFileError(where, None, f"must be a finite number >= 0, got {value!r}", key)
    return float(value)


def _count(where: str, key: str, value: object, minimum: int = 0) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise InputFileError(where, None, f"must be an integer >= {minimum}, got {value!r}", key)
    return value


def _tiers(where: str, raw: object) -> tuple[PriceTier, ...]:
    key = "long_context_tiers"
    if not isinstance(raw, list):
        raise InputFileError(where, None, "must be a list of tiers", key)
    tiers: list[PriceTier] = []
    valid = ("above_prompt_tokens", *_TOKEN_PRICES)
    for i, tier in enumerate(raw):
        at = f"{key}[{i}]"
        if not isinstance(tier, dict):
            raise InputFileError(where, None, "a tier must be a mapping", at)
        for k in tier:
            if k not in valid:
                raise InputFileError(where, None, f"unknown key; {did_you_mean(k, valid)}", at)
        if "above_prompt_tokens" not in tier:
            raise InputFileError(where, None, "required", f"{at}.above_prompt_tokens")
        above = _count(where, f"{at}.above_prompt_tokens", tier["above_prompt_tokens"], 1)
        if tiers and above <= tiers[-1].above_prompt_tokens:
            raise InputFileError(
                where, None, "tiers must be in ascending order", f"{at}.above_prompt_tokens"
            )
        prices = {k: _number(where, f"{at}.{k}", v) for k, v in tier.items() if k in _TOKEN_PRICES}
        if not prices:
            raise InputFileError(where, None, f"a tier sets at least one of {_TOKEN_PRICES}", at)
        tiers.append(PriceTier(above, prices))
    return tuple(tiers)


def parse_price_sheet(data: object, where: str = "<price sheet>") -> PriceSheet:
    if not isinstance(data, dict):
        raise InputFileError(where, None, "a price sheet must be a YAML mapping")
    kind = data.get("kind")
    if kind not in ("api", "gpu_hour"):
        raise InputFileError(where, None, f"kind must be 'api' or 'gpu_hour', got {kind!r}", "kind")
    required = _API_REQUIRED if kind == "api" else _GPU_REQUIRED
    valid = set(_COMMON + _OPTIONAL + required + (_API_OPTIONAL if kind == "api" else ()))
    for key in data:
        if key not in valid:
            raise InputFileError(where, None, f"unknown key; {did_you_mean(key, valid)}", key)
    for key in ("name", "date", "source", *required):
        if data.get(key) in (None, ""):
            why = " (every sheet carries a date and a source)" if key in ("date", "source") else ""
            raise InputFileError(where, None, f"required{why}", key)
    currency = data.get("currency", CURRENCY)
    if currency != CURRENCY:  # every figure and report is in dollars: no conversion is made
        raise InputFileError(
            where, None, f"{currency!r}: prices are in US dollars; valid: {CURRENCY}", "currency"
        )
    prices = {key: _number(where, key, data[key]) for key in required if key != "gpus"}
    if kind == "gpu_hour":  # devices held: a sheet for none would price every query at $0
        prices["gpus"] = float(_count(where, "gpus", data["gpus"], minimum=1))
    if data.get("cache_write_per_million") is not None:
        prices["cache_write_per_million"] = _number(
            where, "cache_write_per_million", data["cache_write_per_million"]
        )
    peak = data.get("peak_flops")
    return PriceSheet(
        name=str(data["name"]),
        kind=kind,
        date=str(data["date"]),
        source=str(data["source"]).strip(),
        currency=CURRENCY,
        prices=prices,
        hardware=str(data.get("hardware", "")),
        peak_flops=_number(where, "peak_flops", peak) if peak is not None else None,
        path=where,
        tiers=_tiers(where, data["long_context_tiers"]) if "long_context_tiers" in data else (),
        min_cacheable_prompt_tokens=_count(
            where, "min_cacheable_prompt_tokens", data.get("min_cacheable_prompt_tokens", 0)
        ),
        cache_ttl=str(data.get("cache_ttl", "") or ""),
        note=str(data.get("note", "") or "").strip(),
        provider=str(data.get("provider", "") or ""),
        model=str(data.get("model", "") or ""),
    )


def sheet_yaml(sheet: dict[str, Any]) -> str:
    """YAML text of a sheet mapping, keys in the order written (parses back to the same)."""
    text = yaml.safe_dump(sheet, sort_keys=False, allow_unicode=True, width=100)
    parse_price_sheet(yaml.safe_load(text), sheet.get("name", "<sheet>"))  # never write a bad one
    return text


# ---------------------------------------------------------------------------- device seconds


class Work(TypedDict):
    """A request's own work as ``Rates.alone`` takes it (``work_of``)."""

    prompt_tokens: int
    completion_tokens: int
    prefix_tokens: NotRequired[int]
    prefix_computed: NotRequired[bool]
    shared: NotRequired[bool]


def work_of(completion: Completion) -> Work | None:
    """A completion's own work as ``Rates.alone`` takes it (``ragbench.llm.calibration``): what the
    transformers backend logged (``meta["work"]``: tokens, the prefix it computed or reused,
    shared-prefix attention), else, for a completion stored before that, its tokens (cached
    tokens read as a reused prefix). None: not a request the calibrated model describes (a
    KV-cache variant ran alone on its own cache; a server; the fake backend)."""
    meta = completion.meta or {}
    if isinstance(meta.get("work"), dict):
        return cast("Work", dict(meta["work"]))
    if "alone_seconds_estimate" not in meta:
        return None
    return {
        "prompt_tokens": completion.prompt_tokens,
        "completion_tokens": completion.completion_tokens,
        "prefix_tokens": completion.cached_prompt_tokens,
        "prefix_computed": False,
    }


def modelled_seconds(completion: Completion, rates: Rates | None) -> float | None:
    """Device seconds the completion's own work takes on its model and device by the calibrated
    model (``rates``: ``ragbench.llm.cost_model.Rates``): a function of its tokens and the
    rates, not of what else the machine was doing. None without rates or a describable work."""
    work = work_of(completion) if rates is not None else None
    return None if work is None or rates is None else float(rates.alone(**work))


def modelled_seconds_for(
    rates: Rates, prompt_tokens: int, cached_prompt_tokens: int = 0, completion_tokens: int = 1
) -> float:
    """``modelled_seconds`` from plain counts (a dry run's prompts and its completion bound):
    cached tokens are a reused prefix. With ``money.dollars(sheet, seconds=...)`` it prices a
    device-hour sheet before anything runs (rates: ``calibration.cached_rates``)."""
    return float(rates.alone(prompt_tokens, completion_tokens, cached_prompt_tokens, False))


def resource_seconds(completion: Completion, gpus: float = 1.0) -> float:
    """Device seconds charged for one completion: its resource seconds x devices held.

    ``completion.resource_seconds`` is its own share of the device time (the transformers backend
    splits a batch's time by each row's stand-alone cost; the shares add up to the batch's wall
    time); an OpenAI-compatible server's, its share of the server's busy time
    (``ragbench.llm.server_time``: the shares add up to the busy wall time). Never latency:
    queueing is not charged. Completion-cache entries stored before that field existed carry the
    share in ``meta["gpu_seconds"]`` (the completion cache's own format); a backend that measures neither falls back to prefill + decode, the
    time it held the device for (on a shared server, an over-charge by the concurrency).
    ``resource_seconds_basis`` names which of these a completion's seconds are.
    """
    if completion.resource_seconds is not None:
        return float(completion.resource_seconds) * gpus
    share = (completion.meta or {}).get("gpu_seconds")
    own = completion.prefill_seconds + completion.decode_seconds
    return (own if share is None else float(share)) * gpus


# what a completion's resource seconds are (the ``resource_seconds_basis`` cost column):
# device_measured: its share of device time measured in this process (the transformers backend);
# server_busy_share: its share of a server's busy time (ragbench.llm.server_time); simulated: the
# fake backend's simulated seconds; slot_time: its own prefill + decode, the fallback of a
# backend that measured neither (server completions stored before the busy share existed)
RESOURCE_SECONDS_BASES = ("device_measured", "server_busy_share", "simulated", "slot_time")


def resource_seconds_basis(completion: Completion) -> str:
    """Which of ``RESOURCE_SECONDS_BASES`` ``resource_seconds(completion)`` is: the backend's own
    word (``meta["resource_seconds_basis"]``), else what the completion carries."""
    meta = completion.meta or {}
    named = meta.get("resource_seconds_basis")
    if isinstance(named, str) and named:
        return named
    if completion.resource_seconds is not None or meta.get("gpu_seconds") is not None:
        return "device_measured"
    return "simulated" if meta.get("simulated_timing") else "slot_time"


def one_basis(*bases: str | None) -> str | None:
    """The basis of a query made of calls on ``bases`` (None: unknown, ignored): theirs where
    they agree, else "mixed" (a reprice charges a mixed query its measured seconds)."""
    known = {b for b in bases if b is not None}
    return known.pop() if len(known) == 1 else ("mixed" if known else None)
