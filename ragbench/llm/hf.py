"""transformers backend: CUDA / MPS / CPU, GGUF weights, batching, prefix-KV reuse, accounting.

``HFModel`` renders prompts, groups a batch's requests by the prefix they share, keeps recent
prefix KV caches across calls and accounts each ``Completion``. Loading lives in ``hf_load.py``,
the forward passes and the decode loop in ``hf_decode.py``.

Accounting per Completion: ``prompt_tokens`` counts the chat template; ``cached_prompt_tokens``
are prefix tokens whose KV was reused: like a hosted prefix cache, the first request of a group
computes the prefix (cached 0, its ``prefill_seconds`` includes ``meta["prefix_seconds"]``) and
the others, or any request of a later call with the same prefix, reuse it. ``prefill_seconds``
is the batch's prefill and ``decode_seconds`` the row's own time to its last token, synchronised
on GPU: the latency the row saw. ``meta["gpu_seconds"]`` is its share of the device time (prefill
split evenly, each decode step among the rows it ran for; the shares of a batch add up to its wall
time), which ``cost.gpu_seconds`` charges. ``peak_memory_bytes`` is CUDA max allocated, else the
process RSS (``meta["peak_memory"]``).
"""

from __future__ import annotations

import os
from collections import OrderedDict
from typing import Any

from ragbench.llm import shared_prefix
from ragbench.llm.base import LLM
from ragbench.llm.hf_decode import Decoder
from ragbench.llm.hf_load import load_model
from ragbench.types import Completion, GenerationRequest

# --------------------------------------------------------------------------- pure helpers


def common_prefix_len(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def plan_groups(
    ids: list[list[int]], declared: list[int], min_shared: int
) -> list[tuple[int, list[int]]]:
    """Group requests that can share a prefix KV cache: ``[(prefix_len, [request indices])]``.

    ``declared[i]`` is the token length of request i's declared prefix (0 = none). Requests with a
    declared prefix group by its tokens; the others group by the longest common token prefix of
    neighbours in sorted order when it is at least ``min_shared`` tokens. A prefix always leaves
    one prompt token per request, whose forward pass yields the first generated token. Requests
    that share nothing form one group with prefix length 0 (plain batched prefill).
    """
    by_prefix: dict[tuple[int, ...], list[int]] = {}
    loose: list[int] = []
    for i, n in enumerate(declared):
        n = min(n, len(ids[i]) - 1)
        if n > 0:
            by_prefix.setdefault(tuple(ids[i][:n]), []).append(i)
        else:
            loose.append(i)
    groups = [(len(key), members) for key, members in by_prefix.items()]
    alone: list[int] = []
    cluster: list[int] = []
    shared = 0
    for i in sorted(loose, key=lambda j: ids[j]) + [-1]:
        n = common_prefix_len(ids[cluster[-1]], ids[i]) if cluster and i >= 0 else 0
        if cluster and n >= min_shared:
            cluster.append(i)
            shared = min(shared, n)
            continue
        if len(cluster) > 1:
            cap = min(len(ids[j]) for j in cluster) - 1
            groups.append((min(shared, cap), sorted(cluster)))
        else:
            alone.extend(cluster)
        cluster, shared = ([i], 1 << 62) if i >= 0 else ([], 0)
    if alone:
        groups.append((0, sorted(alone)))
    return sorted(groups, key=lambda g: g[1][0])


# --------------------------------------------------------------------------- the backend


class HFModel(LLM):
    """A causal LM run with transformers on CUDA, MPS or CPU.

    ``model``: a preset name (``ragbench.llm.presets``), a local folder, a ``.gguf`` file
    (dequantised once, see ``convert_gguf``) or a Hugging Face hub id. ``prefix_cache_size``
    prefix KV caches are kept across calls, so one document asked many questions in separate
    ``generate`` calls is prefilled once.
    """

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
        min_shared_prefix: int = 64,  # undeclared common prefixes shorter than this are recomputed
        cache_dir: str | os.PathLike | None = None,
    ) -> None:
        loaded = load_model(model, device, dtype, attn_implementation, cache_dir)
        self.model, self.tokenizer, self.preset = loaded.model, loaded.tokenizer, loaded.preset
        self.device, self.dtype, self.weights = loaded.device, loaded.dtype, loaded.weights
        self.decoder = Decoder.for_model(self.model, self.tokenizer)
        self.input_device = self.decoder.device
        self.name = model
        preset = loaded.preset
        has_template = bool(getattr(self.tokenizer, "chat_template", None))
        self.instruct = (
            instruct if instruct is not None else (preset.instruct if preset else has_template)
        )
        window = (
            preset.context_window
            if preset
            else getattr(self.model.config, "max_position_embeddings", 0)
        )
        self.context_window = int(context_window or window or 2048)
        self.batch_size, self.seed = batch_size, seed
        self.prefix_cache_size, self.min_shared_prefix = prefix_cache_size, min_shared_prefix
        self._prefix_kv: OrderedDict[tuple[int, ...], Any] = OrderedDict()
        # one read-only prefix KV for the whole batch (see llm/shared_prefix.py) where the
        # architecture allows; others copy the prefix per row
        self.shared_prefix_attention = shared_prefix.supported(self.model)

    # -- prompts and tokens ------------------------------------------------------------------

    def render(self, request: GenerationRequest) -> tuple[str, bool]:
        """The full prompt text and whether the tokenizer adds its special tokens to it."""
        if self.instruct:
            messages = [{"role": "system", "content": request.system}] if request.system else []
            messages.append({"role": "user", "content": request.prompt})
            text = self.tokenizer.apply_chat_template(
                messages, tokenize=False, add_generation_prompt=True
            )
            return text, False  # the template writes its own special tokens
        return (f"{request.system}\n\n{request.prompt}" if request.system else request.prompt), True

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=add_special_tokens)["input_ids"])

    def count_tokens(self, text: str) -> int:
        return len(self.encode(text))

    def prompt_tokens(self, request: GenerationRequest) -> int:
        return len(self.encode(*self.render(request)))

    def _declared_prefix(
        self, request: GenerationRequest, text: str, special: bool, ids: list[int]
    ) -> int:
        if not request.prefix:
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
        }

    # -- generation --------------------------------------------------------------------------

    def _generate(self, requests: list[GenerationRequest]) -> list[Completion]:
        import torch

        ids, declared = [], []
        for r in requests:
            text, special = self.render(r)
            ids.append(self.encode(text, special))
            declared.append(self._declared_prefix(r, text, special, ids[-1]))
        out: list[Completion | None] = [None] * len(requests)
        with torch.inference_mode():
            for plen, members in plan_groups(ids, declared, self.min_shared_prefix):
                kv, miss_seconds, hit = (
                    self._prefix(ids[members[0]][:plen]) if plen else (None, 0.0, False)
                )
                for start in range(0, len(members), self.batch_size):
                    rows = members[start : start + self.batch_size]
                    results = self.decoder.decode(
                        [requests[i] for i in rows],
                        [ids[i][plen:] for i in rows],
                        kv,
                        plen,
                        shared=self.shared_prefix_attention,
                        seed=self.seed,
                    )
                    for i, res in zip(rows, results, strict=True):
                        # Like a hosted prefix cache: the first request of a group computes the
                        # prefix (and pays its time); the others, and later calls, reuse it.
                        miss = plen > 0 and not hit and i == members[0]
                        res["prefill_seconds"] += miss_seconds if miss else 0.0
                        res["meta"]["prefix_seconds"] = round(miss_seconds, 6) if miss else 0.0
                        res["meta"]["gpu_seconds"] += miss_seconds if miss else 0.0
                        out[i] = Completion(
                            prompt_tokens=len(ids[i]),
                            cached_prompt_tokens=0 if miss else plen,
                            model=self.name,
                            **res,
                        )
        return out  # type: ignore[return-value]

    def _prefix(self, prefix: list[int]) -> tuple[Any, float, bool]:
        """KV cache of a shared prefix (batch of one), the seconds it cost, whether it was kept."""
        key = tuple(prefix)
        if key in self._prefix_kv:
            self._prefix_kv.move_to_end(key)
            return self._prefix_kv[key], 0.0, True
        cache, seconds = self.decoder.prefill(prefix)
        if self.prefix_cache_size > 0:
            self._prefix_kv[key] = cache
            while len(self._prefix_kv) > self.prefix_cache_size:
                self._prefix_kv.popitem(last=False)
        return cache, seconds, False
