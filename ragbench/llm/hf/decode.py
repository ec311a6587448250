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

Decode path (``meta["decode"]``): after the prefill, greedy rows on a supported model decode on a
static cache with a captured step on CUDA (``hf/static.py``, ``decode: auto | eager | static``),
else in the plain loop here; ``meta["decode"]["path"]`` says which ran and ``reason`` why not the
fast path.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import inspect
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ragbench.llm import shared_prefix
from ragbench.llm.cpu_linear import PackedLinears
from ragbench.llm.hf.static import FastDecode
from ragbench.llm.kv import variants as kv_cache
from ragbench.types import GenerationRequest


@dataclass(frozen=True)
class Decoder:
    """Stateless forward passes over one loaded model; build it with :meth:`for_model`."""

    model: Any
    tokenizer: Any
    device: Any  # torch.device of the inputs (the first layer's device)
    eos_ids: frozenset[int]
    pad_id: int
    cache_kw: str  # transformers 5.x renamed past_key_values to cache; both generations work
    last_logits_only: dict[str, int]  # {"logits_to_keep": 1} where the model accepts it
    packed: PackedLinears | None = None  # CPU fp32: weights packed for decode steps
    fast: FastDecode | None = None  # the decode path (hf/static.py); None: the plain loop

    @classmethod
    def for_model(
        cls,
        model,
        tokenizer,
        packed: PackedLinears | None = None,
        decode: str = "auto",
        cuda_graphs: bool = True,
    ) -> Decoder:
        """``decode``: auto (the static path on CUDA where the model allows it), eager (the plain
        loop) or static (also off CUDA: the CPU tests run it); ``cuda_graphs``: capture its step
        (CUDA only)."""
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
            fast=FastDecode.choose(model, device, decode, cuda_graphs),
        )

    def prefill(self, prefix: list[int]) -> tuple[Any, float]:
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
        prefix_kv: Any,
        plen: int,
        shared: bool,
        seed: int,
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
        import torch
        from transformers import DynamicCache

        kv = kv or kv_cache.Plain()
        plain = isinstance(kv, kv_cache.Plain)
        if not plain and (len(suffixes) != 1 or prefix_kv is not None):
            raise ValueError(f"kv {kv.name} runs one request without a prefix KV")
        dev, batch, width = self.device, len(suffixes), max(len(s) for s in suffixes)
        shared = shared and prefix_kv is not None
        lead = 0 if shared else plen  # prefix positions held in the per-row cache and mask
        input_ids = torch.full((batch, width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((batch, lead + width), dtype=torch.long)
        mask[:, :lead] = 1
        for b, s in enumerate(suffixes):
            input_ids[b, width - len(s) :] = torch.tensor(s)
            mask[b, lead + width - len(s) :] = 1
        positions = (mask.cumsum(-1) - 1).clamp(min=0)[:, lead:] + (plen - lead)
        input_ids, mask, positions = input_ids.to(dev), mask.to(dev), positions.to(dev)
        extra: dict[str, Any] = {}
        kv_meta: dict[str, Any] = kv.meta()
        if not plain:
            cache, kv_meta = kv.make_cache(self.model, dev.type)
        elif prefix_kv is None or shared:
            cache = DynamicCache(config=self.model.config)
            if shared:
                extra["shared_prefix"] = shared_prefix.SharedPrefix(prefix_kv)
        else:  # each batch extends its own copy; the stored prefix stays untouched
            cache = copy.deepcopy(prefix_kv)
            cache.batch_repeat_interleave(batch)
        if dev.type == "cuda":
            torch.cuda.reset_peak_memory_stats()
        gens = [self.generator(r, seed) for r in requests]
        attention = shared_prefix.active(self.model) if shared else contextlib.nullcontext()
        packed = self.packed.active() if self.packed else contextlib.nullcontext()
        chunk = kv.prefill_chunk()  # sinks: the window, so no prompt token sees past it
        why = self.fast.why_not(requests, kv) if self.fast else "decode=eager"
        fast = self.fast if not why else None
        with attention, packed:
            rows = self._loop(
                list(requests),
                gens,
                input_ids,
                mask,
                positions,
                cache,
                extra,
                chunk,
                fast,
                record_logits,
            )
        decode_meta = rows[0]["meta"].pop("_decode", None) if rows else None
        if decode_meta is None:  # the plain loop ran: why
            decode_meta = self.fast.meta(why) if self.fast else {"path": "eager", "reason": why}
        prefix_bytes = kv_cache.cache_bytes(prefix_kv) if shared else 0
        for row, s in zip(rows, suffixes, strict=True):
            row["padding_tokens"] = width - len(s)  # left padding its row computed
            # its own positions' share of the batch cache (exact for the plain cache, whose
            # every position costs the same), plus the one shared prefix it read
            total = row.pop("_kv_bytes")
            row["kv_bytes_measured"] = prefix_bytes + total * (lead + len(s)) // (
                batch * (lead + width)
            )
            row["meta"]["kv_cache"] = kv_meta
            row["meta"]["decode"] = dict(decode_meta)
        return rows

    def _loop(
        self,
        requests,
        gens,
        input_ids,
        mask,
        positions,
        cache,
        extra,
        chunk=None,
        fast=None,
        record=0,
    ):
        import torch

        dev, batch = self.device, len(requests)
        generated: list[list[int]] = [[] for _ in requests]
        done: dict[int, dict[str, Any]] = {}
        active = list(range(batch))  # request rows still decoding, in cache-batch order
        t0 = self.now()
        width = input_ids.shape[1]
        lead = mask.shape[1] - width  # prefix positions already in the cache and the mask
        step = chunk or width
        for c in range(0, width, step):  # one pass, or chunks (sinks: see kv_cache.SinkLayer)
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
        kv_bytes = kv_cache.cache_bytes(cache)  # after the prefill, before any decode step
        peak = self.peak_memory()
        probes: list[list[Any]] = [[] for _ in requests]
        decode_meta = None
        if fast is not None:  # the static cache (and captured step): hf/static.py
            generated, done, now, decode_meta = fast.run(
                self, requests, logits, cache, mask, positions, extra, t_first, record
            )
            for step in decode_meta.pop("_logits", []):
                for b in range(batch):
                    probes[b].append(step[b].cpu())
        while fast is None:
            if len(probes[active[0]]) < record:
                for j, b in enumerate(active):
                    probes[b].append(logits[j].float().cpu())
            nxt = self.pick(logits, [requests[b] for b in active], [gens[b] for b in active])
            keep = []
            now = self.now()  # the step's end: the time of rows finishing now
            for j, b in enumerate(active):
                token = int(nxt[j])
                generated[b].append(token)
                reason, text = self.finished(requests[b], generated[b], token)
                if reason:
                    done[b] = {"text": text, "finish_reason": reason, "t": now}
                else:
                    keep.append(j)
            if not keep:
                break
            if len(keep) < len(active):  # drop finished rows from the batch and the cache
                index = torch.tensor(keep, device=dev)
                cache.batch_select_indices(index)
                nxt, mask, positions = nxt[index], mask[index], positions[index]
                active = [active[j] for j in keep]
            mask = torch.cat([mask, torch.ones((len(active), 1), dtype=mask.dtype, device=dev)], 1)
            positions = positions[:, -1:] + 1
            logits = self.model(
                input_ids=nxt[:, None],
                attention_mask=mask,
                position_ids=positions,
                **{self.cache_kw: cache},
                use_cache=True,
                **extra,
            ).logits[:, -1, :]
        peak = max(peak, self.peak_memory())
        rows = [
            {
                "text": done[b]["text"],
                "finish_reason": done[b]["finish_reason"],
                "completion_tokens": len(generated[b]),
                "prefill_seconds": t_first - t0,
                "decode_seconds": done[b]["t"] - t_first,
                "_times": (t0, t_first, done[b]["t"]),  # absolute: the caller adds its queue
                "_kv_bytes": kv_bytes,  # the whole batch cache's; the caller takes its share
                "peak_memory_bytes": peak,
                "meta": {
                    "batch_size": batch,
                    "batch_seconds": now - t0,  # the whole batch's device time, prefill to end
                    "device": dev.type,
                    "peak_memory": "cuda_max_allocated" if dev.type == "cuda" else "process_rss",
                },
            }
            for b in range(batch)
        ]
        if decode_meta is not None:
            rows[0]["meta"]["_decode"] = decode_meta
        if record:
            for row, logged in zip(rows, probes, strict=True):
                row["_logits"] = logged
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
