"""transformers backend: CUDA / MPS / CPU, GGUF weights, batching, prefix-KV reuse, accounting.

``HFModel`` renders prompts, groups a batch's requests by the prefix they share, keeps recent
prefix KV caches across calls and accounts each ``Completion``. Loading lives in ``hf/load.py``,
the forward passes and the decode loop in ``hf/decode.py``.

Scheduling: requests that share a prefix form a group (one prefix KV); within a group, requests
are bucketed by length (``plan_batches``) so a short prompt is not padded to a long one. A common
prefix found in undeclared prompts is shared within one strategy variant
(``GenerationRequest.variant``), each request with the variant's prompts it shares the most with
(``hf/schedule.plan_groups``): what a record reuses then does not depend on the other variants of
its call.

Accounting per Completion: ``prompt_tokens`` counts the chat template; ``cached_prompt_tokens``
are prefix tokens whose KV was reused: like a hosted prefix cache, the first request of a group
computes the prefix (cached 0, ``meta["prefix_seconds"]``) and the others, or any request of a
later call with the same prefix, reuse it. Latency, what its user waited, measured: ``queue_seconds``
(the call began until its work began: earlier buckets and groups), ``prefill_seconds`` (its work
began, including the prefix prefill it waited for, until the first token) and ``decode_seconds``
(to its own last token), synchronised on GPU. ``resource_seconds``, what cost charges: the call's
device time (prefix prefills + padded batches) split in proportion to each request's stand-alone
cost estimated from its own tokens with this model's measured rates (``calibration.py``); the
shares add up to the device time and every request of the call saves by the same factor
(``meta["call"]["batching_factor"]``). ``meta["work"]`` is the request's own work (tokens, prefix
computed or reused), which the calibrated cost basis prices with ``cost_rates()``. ``padding_tokens`` is the padding its row computed;
``meta["batch"]`` reports its padded batch once for all rows: seconds, padding tokens and
fraction, and an estimate of the seconds the padding cost. ``peak_memory_bytes`` is CUDA max
allocated, else the process RSS (``meta["peak_memory"]``). ``kv_bytes_measured``: its KV cache
after the prefill, measured (``hf/decode.py``).

KV-cache variants (``GenerationRequest.kv``: offloaded, sinks, quantized, snapkv;
``kv/variants.py``) run one request at a time, without prefix-KV reuse, and are charged their own
measured device time (not a share of the plain requests' batches, whose calibrated estimates do
not model them).
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from typing import TYPE_CHECKING, Any, cast

from ragbench.llm import calibration, cost_model, shared_prefix
from ragbench.llm.base import LLM
from ragbench.llm.cpu_linear import PackedLinears, transpose_weights
from ragbench.llm.hf import prompt as hf_prompt
from ragbench.llm.hf.decode import Decoder
from ragbench.llm.hf.load import load_model
from ragbench.llm.hf.schedule import common_prefix_len, plan_batches, plan_groups
from ragbench.llm.kv import variants as kv_cache
from ragbench.types import Completion, GenerationRequest

if TYPE_CHECKING:
    import torch
    from transformers import Cache

ENCODED_CACHE_TOKENS = 1 << 20  # token ids HFModel.encode keeps, most recent texts first
CALL_MIN_LONGEST = 512  # a generate call calibrates to its longest request, at least this far

# --------------------------------------------------------------------------- the backend


class HFModel(LLM):
    """A causal LM run with transformers on CUDA, MPS or CPU.

    ``model``: a preset name (``ragbench.models``), a local folder, a ``.gguf`` file
    (dequantised once, see ``convert_gguf``) or a Hugging Face hub id. ``prefix_cache_size``
    prefix KV caches are kept across calls, so one document asked many questions in separate
    ``generate`` calls is prefilled once; ``prefix_reuse=False`` is the baseline without any.
    ``packed_linear``: run batched decode steps on weights packed once (``cpu_linear.py``);
    None packs fp32 models on the CPU up to 4 GiB of linear weights (the copy doubles them).
    ``decode``: ``auto`` decodes greedy rows on a static KV cache with a CUDA-graph step on CUDA
    (``hf/static.py``; ``cuda_graphs=False``: uncaptured), ``eager`` in the plain loop,
    ``static`` the static cache on any device. Neither is part of the model's identity (completion
    cache keys) or a config's hash: they change speed, not what is computed.
    """

    capabilities = LLM.capabilities.replace(
        local_weights=True,
        own_tokenizer=True,
        reuses_prefix_kv=True,
        kv_variants=True,
        rescales_rope=True,
    )

    def __init__(
        self,
        model: str = "smollm2-135m-instruct",
        *,
        device: str = "auto",
        dtype: str = "auto",
        attn_implementation: str = "auto",
        instruct: bool | None = None,  # None: the preset's flag, else "tokenizer has a template"
        context_window: int | None = None,
        batch_size: int = 8,
        seed: int = 0,
        prefix_cache_size: int = 1,
        prefix_reuse: bool = True,  # False: no prefix KV at all, every prompt prefilled whole
        min_shared_prefix: int = 64,  # undeclared common prefixes shorter than this are recomputed
        max_padding: float = 0.25,  # most padding a length bucket may compute (of its positions)
        cache_dir: str | os.PathLike | None = None,
        rope_scaling: str | None = None,  # dynamic | yarn | linear: run past the trained window
        rope_factor: float | None = None,  # with rope_scaling: the window grows by this factor
        packed_linear: bool | None = None,  # None: pack fp32 CPU weights for decode steps if small
        allow_pickle_weights: bool = False,  # load pickle-based .bin weights (they can run code)
        decode: str = "auto",  # auto | eager | static: the decode path (hf/static.py); speed only
        cuda_graphs: bool = True,  # capture the static path's step in a CUDA graph (CUDA only)
    ) -> None:
        if (rope_scaling is None) != (rope_factor is None):
            raise ValueError("set rope_scaling (dynamic | yarn | linear) and rope_factor together")
        rope = (
            (rope_scaling, rope_factor)
            if rope_scaling is not None and rope_factor is not None
            else None
        )
        loaded = load_model(
            model,
            device,
            dtype,
            attn_implementation,
            cache_dir,
            rope=rope,
            allow_pickle_weights=allow_pickle_weights,
        )
        self.model, self.tokenizer, self.preset = loaded.model, loaded.tokenizer, loaded.preset
        self.device, self.dtype, self.weights = loaded.device, loaded.dtype, loaded.weights
        # fp32 on the CPU: weights stored transposed, q/k/v and gate/up side by side (one or two
        # rows' decode steps), then packed (a few rows'): cpu_linear.py
        loaded_dtype = cast("torch.dtype", self.dtype)  # load_model's: a torch.dtype
        groups = transpose_weights(self.model, self.device, loaded_dtype)
        packed = PackedLinears.auto(self.model, self.device, loaded_dtype, packed_linear)
        self.decoder = Decoder.for_model(
            self.model, self.tokenizer, packed, decode, cuda_graphs, groups=groups
        )
        self.input_device = self.decoder.device
        self.name = model
        preset = loaded.preset
        self.instruct = hf_prompt.is_instruct(self.tokenizer, preset, instruct)
        window = (
            preset.context_window
            if preset
            else getattr(self.model.config, "max_position_embeddings", 0)
        )
        # RoPE scaling: the trained window times the factor, unless a window is given
        scaled = int((window or 2048) * rope_factor) if rope_factor else None
        self.context_window = int(context_window or scaled or window or 2048)
        self.rope_scaling = f"{rope_scaling}-x{rope_factor:g}" if rope else None
        self.batch_size, self.seed = batch_size, seed
        self.prefix_cache_size, self.min_shared_prefix = prefix_cache_size, min_shared_prefix
        self.prefix_reuse = prefix_reuse
        self.max_padding, self.cache_dir = max_padding, cache_dir
        self._rates: cost_model.Rates | None = None  # measured on first use (cost_rates)
        self._prefix_kv: OrderedDict[tuple[int, ...], Cache] = OrderedDict()
        self._encoded: OrderedDict[tuple[str, bool], tuple[int, ...]] = OrderedDict()
        self._encoded_tokens = 0
        self._encode_lock = threading.Lock()
        # one read-only prefix KV for the whole batch (see llm/shared_prefix.py) where the
        # architecture allows; others copy the prefix per row
        self.shared_prefix_attention = shared_prefix.supported(self.model)

    # -- prompts and tokens ------------------------------------------------------------------

    def render(self, request: GenerationRequest) -> tuple[str, bool]:
        """The full prompt text and whether the tokenizer adds its special tokens to it."""
        return hf_prompt.render(self.tokenizer, self.instruct, request)

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        # memoised: a call tokenises each prompt for the window check, for the batch and its
        # shared document again for the prefix (a 4k-token document: ~6 ms a time on a CPU)
        key = (text, add_special_tokens)
        with self._encode_lock:
            ids = self._encoded.get(key)
            if ids is not None:
                self._encoded.move_to_end(key)
                return list(ids)
        ids = tuple(self.tokenizer(text, add_special_tokens=add_special_tokens)["input_ids"])
        with self._encode_lock:
            if key not in self._encoded:
                self._encoded[key] = ids
                self._encoded_tokens += len(ids)
            while self._encoded_tokens > ENCODED_CACHE_TOKENS and len(self._encoded) > 1:
                self._encoded_tokens -= len(self._encoded.popitem(last=False)[1])
        return list(ids)

    def count_tokens(self, text: str) -> int:
        return len(self.encode(text))

    def prompt_tokens(self, request: GenerationRequest) -> int:
        return len(self.encode(*self.render(request)))

    def _declared_prefix(
        self, request: GenerationRequest, text: str, special: bool, ids: list[int]
    ) -> int:
        if not request.prefix or not self.prefix_reuse:
            return 0
        end = text.rfind(request.prompt) + len(request.prefix)
        # Tokens may merge across the prefix boundary: reuse only what both tokenizations share.
        return common_prefix_len(self.encode(text[:end], special), ids)

    def identity(self) -> dict[str, Any]:
        return {
            **super().identity(),
            "weights": self.weights,
            "dtype": str(self.dtype).removeprefix("torch."),
            "instruct": self.instruct,
            # only when set: unscaled models keep the identity (and completion cache) they had
            **({"rope_scaling": self.rope_scaling} if self.rope_scaling else {}),
            # without prefix reuse the accounting differs (nothing cached): a completion cached
            # by a run with reuse must not stand in for one without (and the other way round)
            **({} if self.prefix_reuse else {"prefix_reuse": False}),
        }

    # -- generation --------------------------------------------------------------------------

    def _generate(self, requests: list[GenerationRequest]) -> list[Completion]:
        import torch

        t_submit = self.decoder.now()  # every request of the call was submitted now
        ids, declared = [], []
        for r in requests:
            text, special = self.render(r)
            ids.append(self.encode(text, special))
            declared.append(self._declared_prefix(r, text, special, ids[-1]))
        # measured on first use, probed as far as this call reaches (a run asks for its longest
        # request up front): not in anyone's wait, so the clock skips it
        t_rates = self.decoder.now()
        longest = max(len(i) + r.max_new_tokens for i, r in zip(ids, requests, strict=True))
        self.cost_rates(longest=max(longest, CALL_MIN_LONGEST))
        t_submit += self.decoder.now() - t_rates
        rows: dict[int, dict[str, Any]] = {}  # request index -> Completion fields
        work: dict[int, dict[str, Any]] = {}  # request index -> what it would cost alone
        batches: list[dict[str, Any]] = []  # per padded batch: its time and padding waste
        device = 0.0  # device seconds of the plain requests: prefix prefills + padded batches
        alone_seconds: dict[int, float] = {}  # kv variants: request index -> its own seconds
        with torch.inference_mode():
            for plen, members in self._groups(requests, ids, declared):
                spec = kv_cache.variant_of(requests[members[0]])
                t_group = self.decoder.now()
                keep = plen > 0 and declared[members[0]] == plen  # a document, not a preamble
                kv, miss_seconds, hit = (
                    self._prefix(ids[members[0]][:plen], keep) if plen else (None, 0.0, False)
                )
                device += miss_seconds
                lengths = [len(ids[i]) - plen for i in members]
                plan = plan_batches(lengths, self.batch_size, self.max_padding)
                for k, part in enumerate(plan):
                    batch = [members[j] for j in part]
                    results = self.decoder.decode(
                        [requests[i] for i in batch],
                        [ids[i][plen:] for i in batch],
                        kv,
                        plen,
                        shared=self.shared_prefix_attention,
                        seed=self.seed,
                        kv=spec,
                    )
                    if not isinstance(spec, kv_cache.Plain):  # alone: own batch, own time
                        (i,) = batch
                        res = results[0]
                        t0, t_first, t_last = res.pop("_times")
                        alone_seconds[i] = res["meta"].pop("batch_seconds")
                        rows[i] = {
                            **res,
                            "queue_seconds": t0 - t_submit,
                            "prefill_seconds": t_first - t0,
                            "decode_seconds": t_last - t_first,
                            "prompt_tokens": len(ids[i]),
                            "cached_prompt_tokens": 0,
                            "model": self.name,
                        }
                        continue
                    # The first batch after computing a prefix waited for it: its rows' work
                    # began with the prefix prefill; later batches queued behind it.
                    waited_prefix = k == 0 and plen > 0 and not hit
                    info = self._batch_info(len(batches), batch, results, ids, plen)
                    batches.append(info)
                    device += info["seconds"]
                    for i, res in zip(batch, results, strict=True):
                        t0, t_first, t_last = res.pop("_times")
                        began = t_group if waited_prefix else t0
                        # Like a hosted prefix cache: the first request of a group computes the
                        # prefix (a cache write, charged to it); the others, and later calls,
                        # reuse it.
                        computes = plen > 0 and not hit and i == members[0]
                        res["meta"]["prefix_seconds"] = round(miss_seconds, 6) if computes else 0.0
                        res["meta"]["batch"] = info  # shared by its rows: the waste is the batch's
                        rows[i] = {
                            **res,
                            "queue_seconds": began - t_submit,
                            "prefill_seconds": t_first - began,
                            "decode_seconds": t_last - t_first,
                            "prompt_tokens": len(ids[i]),
                            "cached_prompt_tokens": 0 if computes else plen,
                            "model": self.name,
                        }
                        work[i] = {
                            "prompt_tokens": len(ids[i]),
                            "completion_tokens": res["completion_tokens"],
                            "prefix_tokens": plen,
                            "prefix_computed": computes,
                            "shared": self.shared_prefix_attention and plen > 0,
                        }
        return self._account(rows, work, batches, device, alone_seconds)

    def _groups(self, requests, ids, declared) -> list[tuple[int, list[int]]]:
        """``plan_groups`` over the plain-cache requests (undeclared prefixes shared within each
        request's ``variant``); each request with another KV-cache variant is a group of its own
        without a prefix (it runs alone on its own cache)."""
        variants = [i for i, r in enumerate(requests) if r.kv is not None]
        for i in variants:  # refuse what this model cannot keep before any work starts
            requests[i].kv.check_model(self.model, self.name)
        plain = [i for i, r in enumerate(requests) if r.kv is None]
        groups = []
        if plain:
            planned = plan_groups(
                [ids[i] for i in plain],
                [declared[i] for i in plain],
                self.min_shared_prefix if self.prefix_reuse else 1 << 62,
                [requests[i].variant for i in plain],
            )
            groups = [(plen, [plain[j] for j in members]) for plen, members in planned]
        return groups + [(0, [i]) for i in variants]

    def cost_rates(self, longest: int | None = None) -> cost_model.Rates:
        """This model's measured per-device rates (``calibration.py``), probed to ``longest``
        prompt tokens (the run's longest prompt; a ``generate`` call's own longest request, at
        least ``CALL_MIN_LONGEST``; None: the default range, or whatever range was asked for
        before): measured on first use, then read from the on-disk cache. A longer ``longest``
        than the rates in hand were probed to measures again (timing only the longer probes)."""
        have = getattr(self, "_rates", None)
        probed = ((have.meta or {}).get("key") or {}).get("probed_tokens") if have else None
        # the length a calibration for ``longest`` probes (within the window), not ``longest``:
        # at the window, a longer request needs nothing more
        need = None
        if longest is not None and probed is not None:
            device = getattr(self.decoder.device, "type", "cpu")
            need = calibration.probed_length(longest, calibration.window_of(self.decoder), device)
        if have is None or (need is not None and probed is not None and need > probed):
            have = self._rates = calibration.rates_for(
                self.decoder, self.weights, self.cache_dir, longest=longest
            )
        return have

    def _batch_info(self, index, batch, results, ids, plen) -> dict[str, Any]:
        """One padded batch: its rows, device seconds and the padding it computed (reported here,
        once per batch, rather than hidden in a row's time)."""
        pads = [res["padding_tokens"] for res in results]
        width = max(len(ids[i]) - plen for i in batch)
        seconds = results[0]["meta"]["batch_seconds"]
        rates = self.cost_rates()
        # the padding's own forward work: each padded position in the prefill, then read as a
        # (masked) KV position by every decode step its row ran
        waste = sum(
            rates.forward(width, plen)
            - rates.forward(width - pad, plen)
            + pad * rates.d1 * max(res["completion_tokens"] - 1, 0)
            for pad, res in zip(pads, results, strict=True)
        )
        return {
            "index": index,
            "rows": len(batch),
            "width": width,
            "seconds": seconds,
            "padding_tokens": sum(pads),
            "padding_fraction": round(sum(pads) / (width * len(batch)), 4),
            "padding_seconds_estimate": round(min(waste, seconds), 6),
        }

    def _account(self, rows, work, batches, device, alone_seconds=None) -> list[Completion]:
        """Split the call's device time among its requests in proportion to what each would have
        cost alone (``cost_model.split_seconds``): the shares add up to the measured time, and
        every request of the call saves (or, with padding, pays) by the same factor. A KV-cache
        variant ran alone: it is charged its own measured seconds (``alone_seconds``)."""
        alone_seconds = alone_seconds or {}
        out = []
        for i in sorted(alone_seconds):
            fields = rows.pop(i)
            out.append((i, Completion(**fields, resource_seconds=alone_seconds[i])))
        if rows:
            out += self._split(rows, work, batches, device)
        return [c for _, c in sorted(out, key=lambda pair: pair[0])]

    def _split(self, rows, work, batches, device) -> list[tuple[int, Completion]]:
        order = sorted(rows)
        rates = self.cost_rates()
        alone = [rates.alone(**work[i]) for i in order]
        shares = cost_model.split_seconds(device, alone)
        factor = device / sum(alone) if sum(alone) > 0 else None
        call = {
            "requests": len(order),
            "batches": len(batches),
            "device_seconds": round(device, 6),
            "alone_seconds_estimate": round(sum(alone), 6),
            "batching_factor": None if factor is None else round(factor, 4),
            "padding_tokens": sum(b["padding_tokens"] for b in batches),
        }
        out = []
        for i, own, share in zip(order, alone, shares, strict=True):
            fields = rows[i]
            meta = {
                **fields.pop("meta"),
                "alone_seconds_estimate": own,  # unrounded: share / estimate is the call's factor
                # its own work, what the calibrated cost basis charges (cost.prices.work_of)
                "work": work[i],
                "call": call,
            }
            meta.pop("batch_seconds", None)
            out.append((i, Completion(**fields, resource_seconds=share, meta=meta)))
        return out

    def _prefix(self, prefix: list[int], keep: bool = True) -> tuple[Cache, float, bool]:
        """KV cache of a shared prefix (batch of one), the seconds it cost, whether it was found
        kept. Only declared prefixes (documents, a shared corpus) are ``keep``: a common preamble
        found among one call's prompts must not push a corpus out of the kept caches."""
        key = tuple(prefix)
        if key in self._prefix_kv:
            self._prefix_kv.move_to_end(key)
            return self._prefix_kv[key], 0.0, True
        cache, seconds = self.decoder.prefill(prefix)
        if self.prefix_cache_size > 0 and keep:
            self._prefix_kv[key] = cache
            while len(self._prefix_kv) > self.prefix_cache_size:
                self._prefix_kv.popitem(last=False)
        return cache, seconds, False
