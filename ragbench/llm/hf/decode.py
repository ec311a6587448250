"""transformers backend: the forward passes, a prefix KV, a batched prefill and the decode loop.

Decoding is a small greedy/sampling loop over ``model(...)`` with a KV cache instead of
``model.generate``. We hand-write it because ``generate`` cannot (1) time prefill (time to first
token) and decode separately, (2) batch several questions after one shared, precomputed prefix
KV cache (left padding sits between prefix and question, with explicit position ids), or
(3) drop finished rows from the batch. For full-attention models (Llama, Qwen, SmolLM2...) the
batch reads that prefix KV once per step through shared-prefix attention (``shared_prefix.py``)
instead of holding a copy per row; other architectures (sliding windows, e.g. Gemma 3) copy it.
``model.generate`` stays the reference in the tests and the benchmark (same greedy answers).
Prefill computes logits for the last position only. On the CPU in fp32 the loop runs the linear
layers on weights packed once (``cpu_linear.py``): a decode step's few rows no longer pay MKL's
per-call packing of every weight matrix.

Timing per row: ``prefill_seconds`` is the batch's prefill and ``decode_seconds`` the row's own
time to its last token, synchronised on GPU; ``padding_tokens`` the left padding its row computed.
The batch's device time (``meta["batch_seconds"]``) is split among its rows by the caller
(``hf/model.py``, by stand-alone cost: ``calibration.py``), not here. Peak memory is CUDA max
allocated, else the process RSS.

KV cache: ``kv_bytes_measured`` is each row's own share of the cache's tensors right after the
prefill (``kv_cache.cache_bytes``; padding positions are not its own), plus the shared prefix KV
where it is read through shared-prefix attention. A request with another KV-cache variant
(``kv``: offloaded, sinks, quantized, snapkv: ``kv/variants.py``) runs alone (batch of one, no prefix KV reuse) on
a cache of that kind; ``meta["kv_cache"]`` records what was done.

Decode path (``meta["decode"]``, ``decode: auto | eager | static | fused``): after the prefill,
on the CPU a supported model (Llama family) decodes with the fused step over a static cache
(``hf/fused.py``; ``auto`` and ``fused``), driven by the plain loop's driver here (``drive``: the
same picks, stop checks and dropped rows); ``static`` decodes greedy rows on a static cache with a
captured step on CUDA (``hf/static.py``); anything else runs the plain loop (``drive`` over
transformers' forward, ``_Eager``). ``meta["decode"]["path"]`` says which ran and ``reason`` why
not the faster one.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import inspect
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ragbench.llm import shared_prefix
from ragbench.llm.cpu_linear import PackedLinears
from ragbench.llm.hf.batch import Batch, Decoded, Engine
from ragbench.llm.hf.fused import FusedDecode
from ragbench.llm.hf.static import FastDecode
from ragbench.llm.kv import variants as kv_cache
from ragbench.registry import unknown
from ragbench.types import GenerationRequest

if TYPE_CHECKING:
    import torch
    from transformers import Cache, PreTrainedModel

MODES = ("auto", "eager", "static", "fused")


def choose_path(
    model: PreTrainedModel, device: torch.device, decode: str, cuda_graphs: bool
) -> FastDecode | FusedDecode:
    """The decode path of ``decode`` (see the module docstring): ``auto`` takes the fused step on
    the CPU where the model has it, else ``FastDecode``'s choice (the plain loop for now)."""
    if decode not in MODES:
        raise unknown("decode", decode, MODES)
    if decode == "fused":
        return FusedDecode.choose(model, device, decode)
    if decode == "auto" and device.type == "cpu":
        fused = FusedDecode.choose(model, device, decode)
        if fused.on:
            return fused
    return FastDecode.choose(model, device, decode, cuda_graphs)


@dataclass(frozen=True)
class Decoder:
    """Stateless forward passes over one loaded model; build it with :meth:`for_model`."""

    model: PreTrainedModel
    tokenizer: Any  # a PreTrainedTokenizerBase (its decode's type: str | list[str])
    device: torch.device  # torch.device of the inputs (the first layer's device)
    eos_ids: frozenset[int]
    pad_id: int
    cache_kw: str  # transformers 5.x renamed past_key_values to cache; both generations work
    last_logits_only: dict[str, int]  # {"logits_to_keep": 1} where the model accepts it
    packed: PackedLinears | None = None  # CPU fp32/bf16: weights packed for decode steps
    fast: FastDecode | FusedDecode | None = None  # the decode path; None: the plain loop
    groups: dict = field(default_factory=dict)  # CPU fp32: q/k/v, gate/up side by side

    @classmethod
    def for_model(
        cls,
        model,
        tokenizer,
        packed: PackedLinears | None = None,
        decode: str = "auto",
        cuda_graphs: bool = True,
        *,
        groups: dict | None = None,
    ) -> Decoder:
        """``decode``: auto (the fused step on the CPU, the plain loop on CUDA), eager (the plain
        loop), static (the static cache, also off CUDA: the CPU tests run it) or fused (the CPU
        step, ``hf/fused.py``); ``cuda_graphs``: capture the static path's step (CUDA only);
        ``groups``: sibling linears stored side by side (``cpu_linear.transpose_weights``)."""
        eos = model.generation_config.eos_token_id
        eos = eos if isinstance(eos, list) else [eos]
        eos_ids = frozenset(int(e) for e in [*eos, tokenizer.eos_token_id] if e is not None)
        pad = tokenizer.pad_token_id
        params = inspect.signature(model.forward).parameters
        device = next(model.parameters()).device
        return cls(
            model=model,
            tokenizer=tokenizer,
            device=device,
            eos_ids=eos_ids,
            pad_id=int(pad if pad is not None else min(eos_ids, default=0)),
            cache_kw="cache" if "cache" in params else "past_key_values",
            last_logits_only={"logits_to_keep": 1} if "logits_to_keep" in params else {},
            packed=packed,
            fast=choose_path(model, device, decode, cuda_graphs),
            groups=groups or {},
        )

    def prefill(self, prefix: list[int]) -> tuple[Cache, float]:
        """KV cache of a prefix (batch of one) and the seconds it took."""
        import torch
        from transformers import DynamicCache

        cache = DynamicCache(config=self.model.config)
        t0 = self.now()
        self.model(
            input_ids=torch.tensor([prefix], device=self.device),
            **{self.cache_kw: cache},
            use_cache=True,
            **self.last_logits_only,
        )
        return cache, self.now() - t0

    def decode(
        self,
        requests: Sequence[GenerationRequest],
        suffixes: list[list[int]],
        prefix_kv: Cache | None,
        plen: int,
        shared: bool,
        seed: int,
        *,
        kv: kv_cache.KVVariant | None = None,
        record_logits: int = 0,
    ) -> list[dict[str, Any]]:
        """Prefill left-padded suffixes after a prefix KV (or none), then decode until every row
        stops; one dict of Completion fields (``meta`` included) per row.

        ``shared``: read the prefix KV (batch of one) through shared-prefix attention; the
        per-row cache, mask and padding cover the suffix only and positions continue from the
        prefix. Otherwise each row gets its own copy of the prefix KV. ``seed`` seeds sampling.
        ``kv``: the KV-cache variant (None or plain: ``DynamicCache``); other variants take one
        request and no prefix KV. ``record_logits``: each row also gets ``_logits``, the logits
        (float32, on the host) its first ``record_logits`` tokens were picked from (a check's).
        """
        kv = kv or kv_cache.Plain()
        plain = isinstance(kv, kv_cache.Plain)
        if not plain and (len(suffixes) != 1 or prefix_kv is not None):
            raise ValueError(f"kv {kv.name} runs one request without a prefix KV")
        shared = shared and prefix_kv is not None
        lead = 0 if shared else plen  # prefix positions held in the per-row cache and mask
        input_ids, mask, positions = self._inputs(suffixes, lead, plen)
        extra: dict[str, object] = {}
        kv_meta: dict[str, Any] = kv.meta()
        if not plain:
            cache, kv_meta = kv.make_cache(self.model, self.device.type)
        else:
            cache = self._plain_cache(prefix_kv, shared, len(suffixes))
            if shared:
                extra["shared_prefix"] = shared_prefix.SharedPrefix(prefix_kv)
        attention = shared_prefix.active(self.model) if shared else contextlib.nullcontext()
        packed = self.packed.active() if self.packed else contextlib.nullcontext()
        why = self.fast.why_not(requests, kv) if self.fast else "decode=eager"
        with attention, packed:
            prefilled = self._prefill(input_ids, mask, positions, cache, extra, kv.prefill_chunk())
            batch = Batch(
                requests=list(requests),
                gens=[self.generator(r, seed) for r in requests],
                logits=prefilled.logits,
                cache=cache,
                mask=mask,
                positions=positions,
                extra=extra,
                t_first=prefilled.t_first,
                record=record_logits,
            )
            decoded = self.fast.run(self, batch) if self.fast and not why else self.plain(batch)
        if decoded.meta is None:  # the plain loop ran: why
            decoded.meta = self.fast.meta(why) if self.fast else {"path": "eager", "reason": why}
        rows = self._rows(prefilled, decoded)
        if record_logits:
            for row, logged in zip(rows, decoded.probes, strict=True):
                row["_logits"] = logged
        prefix_bytes = kv_cache.cache_bytes(prefix_kv) if shared and prefix_kv is not None else 0
        batch_size, width = input_ids.shape
        for row, s in zip(rows, suffixes, strict=True):
            row["padding_tokens"] = width - len(s)  # left padding its row computed
            # its own positions' share of the batch cache (exact for the plain cache, whose
            # every position costs the same), plus the one shared prefix it read
            total = row.pop("_kv_bytes")
            row["kv_bytes_measured"] = prefix_bytes + total * (lead + len(s)) // (
                batch_size * (lead + width)
            )
            row["meta"]["kv_cache"] = kv_meta
            row["meta"]["decode"] = dict(decoded.meta)
        return rows

    def _inputs(
        self, suffixes: list[list[int]], lead: int, plen: int
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Left-padded token ids (rows, width), the attention mask over ``lead`` cached prefix
        positions and the suffix, and the suffix's position ids (continuing from ``plen``)."""
        import torch

        batch, width = len(suffixes), max(len(s) for s in suffixes)
        input_ids = torch.full((batch, width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((batch, lead + width), dtype=torch.long)
        mask[:, :lead] = 1
        for b, s in enumerate(suffixes):
            input_ids[b, width - len(s) :] = torch.tensor(s)
            mask[b, lead + width - len(s) :] = 1
        positions = (mask.cumsum(-1) - 1).clamp(min=0)[:, lead:] + (plen - lead)
        dev = self.device
        return input_ids.to(dev), mask.to(dev), positions.to(dev)

    def _plain_cache(self, prefix_kv: Cache | None, shared: bool, rows: int) -> Cache:
        """The batch's own cache: empty (no prefix, or a shared one read apart), else a copy of
        the prefix KV per row (the stored prefix stays untouched)."""
        from transformers import DynamicCache

        if prefix_kv is None or shared:
            return DynamicCache(config=self.model.config)
        cache = copy.deepcopy(prefix_kv)
        cache.batch_repeat_interleave(rows)
        return cache

    def _prefill(self, input_ids, mask, positions, cache, extra, chunk=None) -> _Prefilled:
        """The suffixes' forward pass (in chunks of ``chunk`` tokens for a sinks cache): the last
        positions' logits, the times, the cache's bytes and the peak memory after it."""
        import torch

        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats()
        t0 = self.now()
        width = input_ids.shape[1]
        lead = mask.shape[1] - width  # prefix positions already in the cache and the mask
        step = chunk or width
        for c in range(0, width, step):  # one pass, or chunks (sinks: see kv/sinks.py, SinkPress)
            n = min(step, width - c)
            logits = self.model(
                input_ids=input_ids[:, c : c + n],
                attention_mask=mask[:, : lead + c + n],
                position_ids=positions[:, c : c + n],
                **{self.cache_kw: cache},
                use_cache=True,
                **self.last_logits_only,
                **extra,
            ).logits[:, -1, :]
        t_first = self.now()
        # the cache's bytes after the prefill, before any decode step
        return _Prefilled(logits, t0, t_first, kv_cache.cache_bytes(cache), self.peak_memory())

    def plain(self, batch: Batch) -> Decoded:
        """The plain loop: transformers' forward over the batch's cache, one step at a time."""
        return self.drive(batch, _Eager(self, batch))

    def drive(self, batch: Batch, engine: Engine) -> Decoded:
        """Pick each row's token (greedy, or its seeded sample), check its stop conditions, drop
        finished rows (``engine.keep``) and run the next step (``engine.step``) until every row
        has stopped. ``engine``: the plain loop's (``_Eager``) or the fused step's
        (``hf/fused.py``)."""
        requests, gens = batch.requests, batch.gens
        generated: list[list[int]] = [[] for _ in requests]
        done: dict[int, dict[str, Any]] = {}
        probes: list[list[torch.Tensor]] = [[] for _ in requests]
        active = list(range(len(requests)))  # request rows still decoding, in batch order
        logits = batch.logits
        assert logits is not None  # a prefill's batch
        while True:
            if len(probes[active[0]]) < batch.record:
                for j, b in enumerate(active):
                    probes[b].append(logits[j].float().cpu())
            nxt = self.pick(logits, [requests[b] for b in active], [gens[b] for b in active])
            now = self.now()  # the step's end: the time of rows finishing now
            keep = []
            for j, (b, token) in enumerate(zip(active, nxt.tolist(), strict=True)):
                generated[b].append(token)
                reason, text = self.finished(requests[b], generated[b], token)
                if reason:
                    done[b] = {"text": text, "finish_reason": reason, "t": now}
                else:
                    keep.append(j)
            if not keep:
                return Decoded(generated, done, now, None, probes)
            if len(keep) < len(active):  # drop finished rows from the batch and the cache
                engine.keep(keep)
                nxt = nxt[keep]
                active = [active[j] for j in keep]
            logits = engine.step(nxt)

    def _rows(self, prefilled: _Prefilled, decoded: Decoded) -> list[dict[str, Any]]:
        """One dict of Completion fields per row (``_times``, ``_kv_bytes``: for the caller)."""
        dev, t0, t_first = self.device, prefilled.t0, prefilled.t_first
        peak = max(prefilled.peak, self.peak_memory())
        rows = []
        for b, tokens in enumerate(decoded.generated):
            end = decoded.done[b]
            rows.append(
                {
                    "text": end["text"],
                    "finish_reason": end["finish_reason"],
                    "completion_tokens": len(tokens),
                    "prefill_seconds": t_first - t0,
                    "decode_seconds": end["t"] - t_first,
                    "_times": (t0, t_first, end["t"]),  # absolute: the caller adds its queue
                    "_kv_bytes": prefilled.kv_bytes,  # the whole batch cache's: caller's share
                    "peak_memory_bytes": peak,
                    "meta": {
                        "batch_size": len(decoded.generated),
                        "batch_seconds": decoded.now - t0,  # the batch's device time
                        "device": dev.type,
                        "peak_memory": "cuda_max_allocated"
                        if dev.type == "cuda"
                        else "process_rss",
                    },
                }
            )
        return rows

    def finished(self, request: GenerationRequest, tokens: list[int], last: int) -> tuple[str, str]:
        """("stop" | "length" | "", text so far): EOS, a stop string, or max_new_tokens."""
        if last in self.eos_ids:
            return "stop", self.tokenizer.decode(tokens[:-1], skip_special_tokens=True)
        text = self.tokenizer.decode(tokens, skip_special_tokens=True)
        # Stop strings count only once the answer has begun, so a reply that opens with a blank
        # line is not cut to nothing by the strategies' "\n\n" stop.
        begin = len(text) - len(text.lstrip())
        cuts = [i for s in request.stop if s and (i := text.find(s, begin)) >= 0]
        if cuts:
            return "stop", text[: min(cuts)]
        return ("length" if len(tokens) >= request.max_new_tokens else ""), text

    @staticmethod
    def pick(logits, requests, gens):
        """Greedy by default; temperature > 0 samples with the request's own seeded generator."""
        import torch

        chosen = logits.argmax(-1)
        for j, r in enumerate(requests):
            if r.temperature > 0:
                probs = torch.softmax(logits[j].float() / r.temperature, -1)
                chosen[j] = torch.multinomial(probs, 1, generator=gens[j])[0]
        return chosen

    def generator(self, request: GenerationRequest, seed: int):
        """A local RNG per request, seeded from (seed, request): results do not depend on batching."""
        import torch

        if request.temperature <= 0:
            return None
        digest = hashlib.sha256(f"{seed}|{request.to_json()}".encode()).hexdigest()
        return torch.Generator(device=self.device).manual_seed(int(digest[:15], 16))

    def now(self) -> float:
        """``time.perf_counter()`` after the device finished its queued work."""
        import torch

        if self.device.type == "cuda":
            torch.cuda.synchronize()
        elif self.device.type == "mps":
            torch.mps.synchronize()
        return time.perf_counter()

    def peak_memory(self) -> int:
        import torch

        if self.device.type == "cuda":
            return int(torch.cuda.max_memory_allocated())
        import psutil

        return int(psutil.Process().memory_info().rss)


@dataclass(frozen=True)
class _Prefilled:
    """A batch's prefill: its last logits, when it began and ended, and what it left."""

    logits: torch.Tensor
    t0: float
    t_first: float
    kv_bytes: int  # the batch cache's bytes right after the prefill
    peak: int  # peak memory after it (CUDA max allocated, else the process RSS)


class _Eager:
    """The plain loop's step: transformers' forward over the batch's ``DynamicCache`` (or a
    KV-cache variant's), the mask grown and the positions advanced by one each step."""

    def __init__(self, dec: Decoder, batch: Batch) -> None:
        self.dec, self.cache, self.extra = dec, batch.cache, batch.extra
        self.mask, self.positions = batch.mask, batch.positions

    def keep(self, rows: list[int]) -> None:
        import torch

        index = torch.tensor(rows, device=self.dec.device)
        self.cache.batch_select_indices(index)
        self.mask, self.positions = self.mask[index], self.positions[index]

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        import torch

        dec = self.dec
        ones = torch.ones((len(tokens), 1), dtype=self.mask.dtype, device=dec.device)
        self.mask = torch.cat([self.mask, ones], 1)
        self.positions = self.positions[:, -1:] + 1
        return dec.model(
            input_ids=tokens[:, None],
            attention_mask=self.mask,
            position_ids=self.positions,
            **{dec.cache_kw: self.cache},
            use_cache=True,
            **self.extra,
        ).logits[:, -1, :]
