"""Cost per query: tokens, latency, resource seconds, FLOPs, KV-cache bytes, MFU and dollars.

Three times per query, never mixed: ``latency_seconds`` is the request's own time, what its user
waited for it (its retrieval search + prefill + decode; the harness's queue, ``queue_seconds``,
apart); ``resource_seconds`` is its own share of the measured device time (a batched row: split
by its stand-alone cost, see ``ragbench.llm.calibration``); ``modelled_seconds`` is what its own
work (tokens) takes by the calibrated model of its model and device. Dollars come from tokens
(APIs) or, self-hosted, from the modelled seconds (``cost_basis: calibrated``, the default: the
same tokens cost the same whatever else the machine was doing) or the measured ones
(``measured``; also where no calibration exists); MFU from the measured ones. Never latency.
Charged as if its strategy variant ran alone: cached tokens of a prefix another variant computed
are charged as computed (``ragbench.cost.alone``; ``prefix_paid_tokens`` / ``_seconds``).

Everything here is a pure function of a ``Completion`` (the backend's accounting), a model's
architecture facts (``ragbench.models.ModelPreset``) and a price sheet
(``ragbench.cost.prices``: a YAML data file with a date and a source; no price lives in code). A
record's cost is a ``Cost``: it adds (a query of several calls) and flattens to columns.

FLOPs model (forward pass only, per query). Write P = prompt tokens, C = cached prompt tokens
(a reused prefix KV cache: those positions are not recomputed), G = completion tokens,
N = non-embedding parameters (Kaplan et al. 2020), L = layers, H = query heads, d = head dim.

* Positions that run through the network: the prefill computes positions C+1..P and emits the
  first completion token; each further completion token is one decode step, so positions
  P+1..P+G-1 run too. Tokens processed T = (P - C) + max(G - 1, 0).
* Dense term: each parameter is one multiply-add (2 FLOPs) per processed token: ``2 N T``.
  Embedding lookups and the LM head are excluded, as in Kaplan's N (the transformers backend
  computes logits for the last position only).
* Attention term: the token at position i attends to i keys (causal, itself included). Per
  layer and head, QK^T is i*d multiply-adds and the weighted sum AV another i*d, so
  4*i*d FLOPs; summed over heads and layers, 4*L*H*d*i. Query heads count: grouped-query
  attention shrinks the KV cache, not these products. Over the processed positions:
  ``4 L H d * sum_{i=C+1}^{P+G-1} i``. For a full prefill of n tokens that is
  4*L*H*d*n(n+1)/2 ~= 2*L*H*d*n^2: the causal half of the 4*L*H*d*n^2 a bidirectional pass
  would cost. It passes the dense term once n > N / (L*H*d) tokens (about 2.7k for SmolLM2).
* Softmax, norms and sliding windows are ignored; with sliding-window layers (Gemma 3) the
  attention term is an upper bound.

KV cache per query (the ``kv_cache_bytes`` record column): after the last step the cache holds
the positions that ran plus the cached prefix, P + max(G - 1, 0) (the last completion token is
sampled, never fed back), times 2 (keys and values) x L x KV heads x d x bytes per value. Bytes per
value come from the dtype the cache is stored in (``dtype_bytes``): the transformers backend keeps
it in the model's dtype, which its ``identity()["dtype"]`` reports (float32 on CPU by default: 4
bytes). When the dtype is unknown (hosted APIs, servers) 2 bytes is *assumed*, the common serving
dtype (bf16/fp16); the record's ``kv_bytes_per_value`` says which was used. Batch padding and a
server's block rounding are not counted: this is one sequence's own cache.

Measured beside the formula: ``kv_bytes_measured`` is what the transformers backend found in its
cache's tensors right after the prefill (their real dtype: a quantized cache's packed codes plus
its scales and zero points; a sink cache only its kept positions), and ``kv_bytes_prefill`` is the
formula at the same moment (P positions, the cache's dtype), so the two compare directly: equal
for the plain cache, smaller measured for a technique that shrinks the cache. None where nothing
was measured (servers, the fake backend, completions cached before the column existed).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from ragbench.cost.alone import charged_work, paid_tokens
from ragbench.cost.money import COST_BASES, Seconds, Usage, dollars
from ragbench.cost.prices import PriceSheet, one_basis, resource_seconds, resource_seconds_basis
from ragbench.llm.cost_model import Rates
from ragbench.models import ModelPreset
from ragbench.registry import unknown
from ragbench.types import Completion, JsonMixin

_N = TypeVar("_N", int, float)  # a count or an amount: sums and maxima keep its type

# ---------------------------------------------------------------------------- memory and compute


def kv_cache_bytes(
    layers: int,
    kv_heads: int,
    head_dim: int,
    seq_len: int,
    batch: int = 1,
    bytes_per_value: int = 2,
) -> int:
    """Bytes of keys + values: ``2 x layers x kv_heads x head_dim x seq_len x batch x bytes``.

    The textbook example (100 layers, 80 heads, head dim 128, 10^6 tokens, batch 1, 2 bytes)
    gives 4,096,000,000,000 bytes: 4.1 TB, 3.7 TiB, or the "3.8 TB" quoted as 3,815 GiB / 1000.
    """
    args = dict(layers=layers, kv_heads=kv_heads, head_dim=head_dim, seq_len=seq_len, batch=batch)
    for name, v in {**args, "bytes_per_value": bytes_per_value}.items():
        if v < 0:
            raise ValueError(f"kv_cache_bytes: {name} must be >= 0, got {v}")
    return 2 * layers * kv_heads * head_dim * seq_len * batch * bytes_per_value


DEFAULT_KV_BYTES_PER_VALUE = 2  # assumed when the dtype is unknown: bf16/fp16 serving
# dtype name (torch's, without "torch.") -> bytes per value; float8_* variants are 1 byte
_DTYPE_BYTES = {
    "float64": 8,
    "float32": 4,
    "bfloat16": 2,
    "float16": 2,
    "half": 2,
    "bf16": 2,
    "fp16": 2,
    "fp32": 4,
    "fp8": 1,
    "int8": 1,
    "uint8": 1,
}


def dtype_bytes(dtype: object = None, default: int = DEFAULT_KV_BYTES_PER_VALUE) -> int:
    """Bytes per value of ``dtype`` ("float32", "torch.bfloat16", a torch dtype, "float8_e4m3fn").

    None or "" (unknown) gives ``default``, an assumption; an unrecognised name is an error.
    """
    if dtype is None or str(dtype).strip() == "":
        return default
    name = str(dtype).strip().lower().removeprefix("torch.")
    if name in _DTYPE_BYTES:
        return _DTYPE_BYTES[name]
    if name.startswith(("float8", "fp8")):
        return 1
    raise unknown("dtype", str(dtype), [*_DTYPE_BYTES, "float8_*"])


def query_kv_positions(prompt_tokens: int, completion_tokens: int) -> int:
    """Positions in one query's KV cache when generation ends: P + max(G - 1, 0)."""
    return prompt_tokens + max(completion_tokens - 1, 0)


def _arch(preset_or_arch: ModelPreset | Mapping[str, int]) -> tuple[int, int, int, int]:
    """(non_embedding_params, layers, heads, head_dim) from a ModelPreset or a mapping."""
    keys = ("non_embedding_params", "layers", "heads", "head_dim")
    if isinstance(preset_or_arch, dict):
        missing = [k for k in keys if k not in preset_or_arch]
        if missing:
            raise ValueError(f"architecture is missing {missing}; needs {list(keys)}")
        return tuple(int(preset_or_arch[k]) for k in keys)  # type: ignore[return-value]
    return tuple(int(getattr(preset_or_arch, k)) for k in keys)  # type: ignore[return-value]


def processed_positions(prompt_tokens: int, cached_tokens: int, completion_tokens: int) -> range:
    """1-based positions that run through the network (see the module docstring)."""
    if not 0 <= cached_tokens <= prompt_tokens:
        raise ValueError(
            f"cached_tokens {cached_tokens} must be in [0, prompt_tokens={prompt_tokens}]"
        )
    if completion_tokens < 0:
        raise ValueError(f"completion_tokens must be >= 0, got {completion_tokens}")
    return range(cached_tokens + 1, prompt_tokens + max(completion_tokens - 1, 0) + 1)


def forward_flops(
    preset_or_arch: ModelPreset | Mapping[str, int],
    prompt_tokens: int,
    cached_tokens: int = 0,
    completion_tokens: int = 0,
) -> dict[str, int]:
    """Forward FLOPs of one query: {"dense", "attention", "total"} (formula in the module doc)."""
    n_params, layers, heads, head_dim = _arch(preset_or_arch)
    pos = processed_positions(prompt_tokens, cached_tokens, completion_tokens)
    tokens = len(pos)
    position_sum = (pos.start + pos.stop - 1) * tokens // 2 if tokens else 0  # arithmetic series
    dense = 2 * n_params * tokens
    attention = 4 * layers * heads * head_dim * position_sum
    return {"dense": dense, "attention": attention, "total": dense + attention}


def mfu(flops: float, seconds: float, peak_flops: float) -> float | None:
    """Model FLOPs utilisation: achieved FLOP/s over the hardware peak (None if unmeasurable)."""
    if not seconds or seconds <= 0 or not peak_flops or peak_flops <= 0:
        return None
    return float(flops) / (seconds * peak_flops)


# ---------------------------------------------------------------------------- a query's cost


@dataclass(frozen=True)
class Cost(JsonMixin):
    """What one query cost: the record's cost columns (``to_dict()``, in field order). ``a + b``
    is a query made of two calls (Self-Route: its RAG call, then long context): counts and
    seconds add, memory takes the larger, MFU is recomputed. A field is None when it is
    unknown (no architecture preset: no FLOPs; no price sheet: no dollars), never guessed."""

    prompt_tokens: int = 0
    cached_prompt_tokens: int = 0  # served from a reused prefix KV cache (not recomputed)
    completion_tokens: int = 0
    padding_tokens: int = 0  # padding positions its rows computed in padded batches
    queue_seconds: float = 0.0  # submitted -> its work began (behind other batches, a slot)
    prefill_seconds: float = 0.0  # work began -> first token
    decode_seconds: float = 0.0  # first token -> last token
    latency_seconds: float = 0.0  # search + prefill + decode: its own time (not charged)
    resource_seconds: float = 0.0  # its share of measured device time x devices
    modelled_seconds: float | None = None  # its tokens by the calibrated rates; None: no model
    retrieval_seconds: float | None = None  # index build + search; None: did not retrieve
    peak_memory_bytes: int | None = None
    usage_estimated: bool = False  # token counts estimated locally, not reported by a server
    llm_calls: int = 0
    flops: int | None = None
    flops_attention: int | None = None
    kv_cache_bytes: int | None = None  # this query's own KV cache at its last step
    kv_bytes_per_value: int | None = None  # dtype bytes used for kv_cache_bytes
    kv_bytes_prefill: int | None = None  # the formula after the prefill (P positions)
    kv_bytes_measured: int | None = None  # the cache's tensors after the prefill, measured
    dollars: float | None = None
    peak_flops: float | None = None  # the price sheet's hardware peak MFU is relative to
    mfu: float | None = None
    price_sheet: str | None = None
    # the sheet's content hash (``PriceSheet.short_sha256``) when these dollars were priced: a
    # resumed run reprices records whose sheet changed; None: no sheet, or written before this
    price_sheet_sha256: str | None = None
    cost_basis: str | None = None  # calibrated: dollars from modelled_seconds; else measured
    resource_seconds_basis: str | None = None  # what resource_seconds is: RESOURCE_SECONDS_BASES
    # work done once and shared by many queries (a preloaded corpus KV: long_context preload),
    # in none of the fields above; amortised_* add this query's share, one_time / amortised_over
    # (without a one-time cost they equal resource_seconds and dollars)
    # the one-time work's charged seconds: its resource seconds plus a prefix it found computed
    # by another variant (``prefix_paid_seconds``, cost/alone.py), as if it ran alone
    one_time_seconds: float | None = None
    one_time_modelled_seconds: float | None = None  # and its modelled seconds
    one_time_dollars: float | None = None
    # queries that share the one-time cost: those answered (the results table recounts them,
    # strategies.preload.amortise_answered)
    amortised_over: int | None = None
    amortised_resource_seconds: float | None = None
    amortised_dollars: float | None = None
    # cost/alone.py: cached tokens of a prefix another variant computed, charged as computed
    prefix_paid_tokens: int = 0  # (not in cached_prompt_tokens)
    prefix_paid_seconds: float = 0.0  # the device seconds they add to the charged seconds
    search_seconds: float | None = None  # this query's retrieval search (in latency); None: none
    latency_basis: str | None = "own"  # own: the harness's queue apart

    def __post_init__(self) -> None:
        if self.one_time_seconds is not None:  # None there: unknown (a repriced api sheet)
            return
        if self.amortised_resource_seconds is None and self.resource_seconds is not None:
            object.__setattr__(self, "amortised_resource_seconds", self.resource_seconds)
        if self.amortised_dollars is None and self.dollars is not None:
            object.__setattr__(self, "amortised_dollars", self.dollars)

    @classmethod
    def of(
        cls,
        completion: Completion,
        preset: ModelPreset | None = None,
        sheet: PriceSheet | None = None,
        kv_dtype: object = None,
        rates: Rates | None = None,
        basis: str = "calibrated",
    ) -> Cost:
        """The cost of one completion. ``preset`` (architecture) gives FLOPs and KV bytes,
        ``sheet`` dollars and MFU. ``kv_dtype`` is the dtype the KV cache was stored in (the
        transformers backend: ``llm.identity()["dtype"]``); unknown (None) assumes 2 bytes per
        value (bf16/fp16) and ``kv_bytes_per_value`` records the value used. ``rates``: the
        model's calibration (``llm.cost_model.Rates``), which gives ``modelled_seconds``; an
        hourly sheet charges those under ``basis="calibrated"``, else the measured seconds."""
        if basis not in COST_BASES:
            raise ValueError(f"cost_basis must be one of {list(COST_BASES)}, got {basis!r}")
        c = completion
        arch: dict[str, Any] = {}  # Cost's architecture fields, known with a preset
        if preset is not None:
            f = forward_flops(preset, c.prompt_tokens, c.cached_prompt_tokens, c.completion_tokens)
            per_value = dtype_bytes(kv_dtype)
            kv = lambda n: kv_cache_bytes(  # noqa: E731 (this query's KV at n positions)
                preset.layers, preset.kv_heads, preset.head_dim, n, 1, per_value
            )
            arch = dict(
                flops=f["total"],
                flops_attention=f["attention"],
                kv_bytes_per_value=per_value,
                kv_cache_bytes=kv(query_kv_positions(c.prompt_tokens, c.completion_tokens)),
                kv_bytes_prefill=kv(c.prompt_tokens),
            )
        seconds = resource_seconds(c)  # never latency
        # the alone rule (cost/alone.py); FLOPs, MFU, resource seconds: what the device did
        charged, modelled, paid_seconds = charged_work(c, rates)
        used = "calibrated" if basis == "calibrated" and modelled is not None else "measured"
        peak, flops = (sheet.peak_flops if sheet is not None else None), arch.get("flops")
        own = {k: getattr(c, k) for k in _FROM_COMPLETION}
        own["cached_prompt_tokens"] = charged.cached_prompt_tokens
        return cls(
            **own,
            **arch,
            resource_seconds=seconds,
            modelled_seconds=modelled,
            llm_calls=1,
            dollars=None
            if sheet is None
            else dollars(sheet, Usage.of(charged), Seconds(seconds + paid_seconds, modelled), used),
            peak_flops=peak,
            mfu=mfu(flops, seconds, peak) if flops is not None and peak else None,
            price_sheet=sheet.name if sheet is not None else None,
            cost_basis=used,
            resource_seconds_basis=resource_seconds_basis(c),
            price_sheet_sha256=sheet.short_sha256() if sheet is not None else None,
            prefix_paid_tokens=paid_tokens(c),
            prefix_paid_seconds=paid_seconds,
        )

    def __add__(self, other: Cost) -> Cost:
        if not isinstance(other, Cost):
            return NotImplemented

        # unknown in either part: unknown in the whole
        def known_sum(a: _N | None, b: _N | None) -> _N | None:
            return None if a is None or b is None else a + b

        def larger(a: _N | None, b: _N | None) -> _N | None:
            return max((v for v in (a, b) if v is not None), default=None)

        # None means "not done" (retrieval): the parts that did
        def applicable_sum(a: float | None, b: float | None) -> float | None:
            return None if a is None and b is None else (a or 0.0) + (b or 0.0)

        summed: dict[str, Any] = {
            f: known_sum(getattr(self, f), getattr(other, f)) for f in _ADDITIVE
        }
        bases: dict[str, Any] = {f: one_basis(getattr(self, f), getattr(other, f)) for f in _BASES}
        flops, seconds = summed["flops"], summed["resource_seconds"]
        peak = self.peak_flops if self.peak_flops is not None else other.peak_flops
        return Cost(
            **summed,
            retrieval_seconds=applicable_sum(self.retrieval_seconds, other.retrieval_seconds),
            search_seconds=applicable_sum(self.search_seconds, other.search_seconds),
            latency_basis=self.latency_basis if self.latency_basis == other.latency_basis else None,
            peak_memory_bytes=larger(self.peak_memory_bytes, other.peak_memory_bytes),
            usage_estimated=self.usage_estimated or other.usage_estimated,
            kv_cache_bytes=larger(self.kv_cache_bytes, other.kv_cache_bytes),
            kv_bytes_per_value=other.kv_bytes_per_value or self.kv_bytes_per_value,
            kv_bytes_prefill=larger(self.kv_bytes_prefill, other.kv_bytes_prefill),
            kv_bytes_measured=larger(self.kv_bytes_measured, other.kv_bytes_measured),
            peak_flops=peak,
            mfu=mfu(flops, seconds, peak) if flops is not None and peak else None,
            price_sheet=other.price_sheet or self.price_sheet,
            **bases,
            price_sheet_sha256=other.price_sheet_sha256 or self.price_sheet_sha256,
            one_time_seconds=applicable_sum(self.one_time_seconds, other.one_time_seconds),
            one_time_modelled_seconds=known_sum(
                self.one_time_modelled_seconds, other.one_time_modelled_seconds
            ),
            one_time_dollars=applicable_sum(self.one_time_dollars, other.one_time_dollars),
            amortised_over=larger(self.amortised_over, other.amortised_over),
        )

    def with_retrieval(self, seconds: float, search_seconds: float | None = None) -> Cost:
        """``seconds`` (index build + search) apart; the search, what its user waits for, in
        its latency too (an index is built once per document or corpus)."""
        search = 0.0 if search_seconds is None else float(search_seconds)
        return dataclasses.replace(
            self,
            retrieval_seconds=seconds,
            search_seconds=search_seconds,
            latency_seconds=self.latency_seconds + search,
        )

    def amortise(self, one_time: Cost, over: int) -> Cost:
        """This query's cost with a one-time cost (``one_time``: the cost of the work done once,
        e.g. the preload call) shared by ``over`` queries: its own fields unchanged, the one-time
        seconds and dollars beside them, and the amortised columns = own + one_time / over."""
        if over < 1:
            raise ValueError(f"a one-time cost is amortised over >= 1 queries, got {over}")
        # charged as if it ran alone (cost/alone.py): a prefix it found computed by another
        # variant counts as computed; its dollars already include it
        once = one_time.resource_seconds + (one_time.prefix_paid_seconds or 0.0)
        dollars = one_time.dollars
        return dataclasses.replace(
            self,
            one_time_seconds=once,
            one_time_modelled_seconds=one_time.modelled_seconds,
            one_time_dollars=dollars,
            amortised_over=over,
            amortised_resource_seconds=self.resource_seconds + once / over,
            amortised_dollars=None
            if self.dollars is None or dollars is None
            else self.dollars + dollars / over,
        )

    def shared_by(self, over: int) -> Cost:
        """This cost with its one-time cost (its ``one_time_*`` fields) amortised over ``over``
        queries instead (itself when it has none)."""
        if self.one_time_seconds is None:
            return self
        once = Cost(
            resource_seconds=self.one_time_seconds,
            dollars=self.one_time_dollars,
            modelled_seconds=self.one_time_modelled_seconds,
        )
        return self.amortise(once, over)

    def repriced(
        self, sheet: PriceSheet, cache_write_tokens: float = 0, known: bool = True
    ) -> Cost:
        """This cost under another price sheet, from what it logged (``ragbench.cost.reprice``):
        its dollars from its tokens (an api sheet; ``cache_write_tokens`` of them written to the
        provider's cache) or its device seconds on its own basis (gpu_hour: modelled under
        ``cost_basis`` calibrated, else resource seconds); ``known=False``: its own accounting
        was not logged (a failed record), its dollars are unknown. A one-time cost is priced by
        its seconds on an hourly sheet, unknown on an api one (a record keeps its seconds, not its
        tokens), and shared through ``amortise``. MFU keeps the hardware it was measured on."""
        hourly = sheet.kind == "gpu_hour"
        paid = None
        calibrated = self.cost_basis == "calibrated"
        if known and hourly:  # a prefix charged by the alone rule: its seconds too
            measured = self.resource_seconds + (self.prefix_paid_seconds or 0.0)
            paid = dollars(
                sheet, seconds=Seconds(measured, self.modelled_seconds), basis=self.cost_basis
            )
        elif known:  # (prefix_paid_tokens are not in cached_prompt_tokens: input here)
            paid = dollars(
                sheet,
                Usage(
                    self.prompt_tokens,
                    self.cached_prompt_tokens,
                    self.completion_tokens,
                    cache_write_tokens,
                ),
            )
        named = sheet.name if paid is not None else self.price_sheet
        sha = sheet.short_sha256() if paid is not None else self.price_sheet_sha256
        if self.one_time_seconds is None:  # nothing shared: amortised = its own
            return dataclasses.replace(
                self,
                dollars=paid,
                price_sheet=named,
                price_sheet_sha256=sha,
                amortised_dollars=paid,
            )
        once_modelled = self.one_time_modelled_seconds if calibrated else None
        once_seconds = Seconds(self.one_time_seconds, once_modelled)
        once = dollars(sheet, seconds=once_seconds, basis=self.cost_basis) if hourly else None
        out = dataclasses.replace(
            self,
            dollars=paid,
            price_sheet=named,
            one_time_dollars=once,
            price_sheet_sha256=sha,
            amortised_dollars=None,
        )
        over = self.amortised_over
        if once is None or paid is None or not over or over < 1:
            return out
        one = Cost(
            resource_seconds=self.one_time_seconds, modelled_seconds=once_modelled, dollars=once
        )
        return out.amortise(one, over)


# the Completion's own accounting, copied as it is
_FROM_COMPLETION = (
    "prompt_tokens",
    "cached_prompt_tokens",
    "completion_tokens",
    "padding_tokens",
    "queue_seconds",
    "prefill_seconds",
    "decode_seconds",
    "latency_seconds",
    "peak_memory_bytes",
    "usage_estimated",
    "kv_bytes_measured",
)
_BASES = ("cost_basis", "resource_seconds_basis")  # each call's, or "mixed"
# counts and seconds that add up over the calls of one query (None: unknown)
_ADDITIVE = (
    "prompt_tokens",
    "cached_prompt_tokens",
    "completion_tokens",
    "padding_tokens",
    "queue_seconds",
    "prefill_seconds",
    "decode_seconds",
    "latency_seconds",
    "resource_seconds",
    "modelled_seconds",
    "flops",
    "flops_attention",
    "dollars",
    "llm_calls",
    "amortised_resource_seconds",  # own + share: the shares add as the own costs do
    "amortised_dollars",
    "prefix_paid_tokens",
    "prefix_paid_seconds",
)


def format_bytes(n: float) -> str:
    """Human-readable binary size, e.g. 3.7 TiB."""
    if n <= 0:
        return "0 B"
    units = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"]
    i = min(int(math.log(n, 1024)), len(units) - 1)
    return f"{n / 1024**i:.1f} {units[i]}"
