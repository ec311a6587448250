"""transformers backend: CUDA / MPS / CPU, GGUF weights, batching, prefix-KV reuse, accounting.

Decoding is a small greedy/sampling loop over ``model(...)`` with a KV cache instead of
``model.generate``. We hand-write it because ``generate`` cannot (1) time prefill (time to first
token) and decode separately, (2) batch several questions after one shared, precomputed prefix
KV cache (left padding sits between prefix and question, with explicit position ids), or
(3) drop finished rows from the batch. For full-attention models (Llama, Qwen, SmolLM2...) the
batch reads that prefix KV once per step through shared-prefix attention (``shared_prefix.py``)
instead of holding a copy per row; other architectures (sliding windows, e.g. Gemma 3) copy it.
``model.generate`` stays the reference in the tests and the benchmark (same greedy answers).
Prefill computes logits for the last position only.

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

import contextlib
import copy
import hashlib
import importlib.util
import inspect
import os
import time
from collections import OrderedDict
from pathlib import Path
from typing import Any

from ragbench import assets
from ragbench.llm import shared_prefix
from ragbench.llm.base import LLM
from ragbench.llm.gguf import _quiet_transformers, convert_gguf, file_sha256
from ragbench.llm.presets import PRESETS, ModelPreset
from ragbench.registry import unknown
from ragbench.types import Completion, GenerationRequest

DTYPES = ("float32", "bfloat16", "float16")


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


def resolve_model(model: str) -> tuple[str, Path | None, ModelPreset | None]:
    """``(folder or hub id, gguf file or None, preset or None)`` for a preset, path or hub id."""
    if model in PRESETS:
        preset = PRESETS[model]
        if preset.source.startswith("asset:"):
            return "", assets.asset_path(preset.source.removeprefix("asset:")), preset
        return preset.source, None, preset
    path = Path(model).expanduser()
    if path.suffix == ".gguf":
        if not path.is_file():
            raise FileNotFoundError(f"GGUF file not found: {path}")
        return "", path, None
    if path.is_dir():
        return str(path), None, None
    if model.count("/") == 1 and not path.exists() and not model.startswith((".", "/")):
        return model, None, None  # a Hugging Face hub id: downloaded only because it was named
    raise unknown("model", model, [*PRESETS, "<local folder>", "<file.gguf>", "<hub org/name>"])


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
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        _quiet_transformers()
        source, gguf, preset = resolve_model(model)
        if gguf is not None:
            source = str(convert_gguf(gguf, cache_dir))
            self.weights = "gguf-sha256:" + file_sha256(gguf, cache_dir)
        self.device = pick_device(device)
        self.dtype = pick_dtype(dtype, self.device)
        attn = attn_implementation
        if attn == "auto":
            flash = importlib.util.find_spec("flash_attn") is not None
            half = self.dtype in (torch.bfloat16, torch.float16)
            attn = (
                "flash_attention_2" if flash and self.device.startswith("cuda") and half else "sdpa"
            )
        multi_gpu = self.device == "cuda" and torch.cuda.device_count() > 1  # "cuda:N" pins one
        self.model = AutoModelForCausalLM.from_pretrained(
            source,
            dtype=self.dtype,
            attn_implementation=attn,
            device_map="auto" if multi_gpu else None,
        )
        if not multi_gpu:
            self.model.to(self.device)
        self.model.eval()
        self.tokenizer = AutoTokenizer.from_pretrained(source)
        self.input_device = next(self.model.parameters()).device
        if gguf is None:
            self.weights = weights_id(source, self.model, cache_dir)
        self.name = model
        self.preset = preset
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
        eos = self.model.generation_config.eos_token_id
        eos = eos if isinstance(eos, list) else [eos]
        self.eos_ids = {int(e) for e in [*eos, self.tokenizer.eos_token_id] if e is not None}
        pad = self.tokenizer.pad_token_id
        self.pad_id = int(pad if pad is not None else min(self.eos_ids, default=0))
        params = inspect.signature(self.model.forward).parameters
        self._last_logits_only = {"logits_to_keep": 1} if "logits_to_keep" in params else {}
        # transformers 5.x renamed past_key_values to cache; accept both generations
        self._cache_kw = "cache" if "cache" in params else "past_key_values"

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
                    suffixes = [ids[i][plen:] for i in rows]
                    results = self._decode([requests[i] for i in rows], suffixes, kv, plen)
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
        import torch
        from transformers import DynamicCache

        key = tuple(prefix)
        if key in self._prefix_kv:
            self._prefix_kv.move_to_end(key)
            return self._prefix_kv[key], 0.0, True
        cache = DynamicCache(config=self.model.config)
        t0 = self._now()
        self.model(
            input_ids=torch.tensor([prefix], device=self.input_device),
            **{self._cache_kw: cache},
            use_cache=True,
            **self._last_logits_only,
        )
        seconds = self._now() - t0
        if self.prefix_cache_size > 0:
            self._prefix_kv[key] = cache
            while len(self._prefix_kv) > self.prefix_cache_size:
                self._prefix_kv.popitem(last=False)
        return cache, seconds, False

    def _decode(self, requests, suffixes, prefix_kv, plen: int) -> list[dict[str, Any]]:
        """Prefill left-padded suffixes after a shared prefix, then decode until every row stops.

        With shared-prefix attention the per-row cache, mask and padding cover the suffix only
        and the prefix KV (batch of one) is passed to every layer; positions continue from it.
        """
        import torch
        from transformers import DynamicCache

        dev, batch, width = self.input_device, len(suffixes), max(len(s) for s in suffixes)
        # Shared-prefix attention keeps one read-only prefix KV and a per-row cache of the
        # suffix only; otherwise each row gets its own copy of the prefix KV.
        shared = prefix_kv is not None and self.shared_prefix_attention
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
        if prefix_kv is None or shared:
            cache = DynamicCache(config=self.model.config)
            if shared:
                extra["shared_prefix"] = shared_prefix.SharedPrefix(prefix_kv)
        else:  # each batch extends its own copy; the stored prefix stays untouched
            cache = copy.deepcopy(prefix_kv)
            cache.batch_repeat_interleave(batch)
        if dev.type == "cuda":
            torch.cuda.reset_peak_memory_stats()
        attention = shared_prefix.active(self.model) if shared else contextlib.nullcontext()
        with attention:
            return self._decode_loop(requests, input_ids, mask, positions, cache, extra, batch, dev)

    def _decode_loop(self, requests, input_ids, mask, positions, cache, extra, batch, dev):
        import torch

        gens = [self._generator(r, dev) for r in requests]
        generated: list[list[int]] = [[] for _ in requests]
        done: dict[int, dict[str, Any]] = {}
        active = list(range(batch))  # request rows still decoding, in cache-batch order
        t0 = self._now()
        logits = self.model(
            input_ids=input_ids,
            attention_mask=mask,
            position_ids=positions,
            **{self._cache_kw: cache},
            use_cache=True,
            **self._last_logits_only,
            **extra,
        ).logits[:, -1, :]
        t_first = self._now()
        peak = self._peak_memory(dev)
        # each row's share of the device time: prefill split evenly, every decode step split
        # among the rows it ran for; the shares add up to the batch's wall time
        device_share = [(t_first - t0) / batch] * batch
        t_step = t_first
        while True:
            nxt = self._pick(logits, [requests[b] for b in active], [gens[b] for b in active])
            keep = []
            now = self._now()  # the step's end: its share, and the time of rows finishing now
            for j, b in enumerate(active):
                device_share[b] += (now - t_step) / len(active)
                token = int(nxt[j])
                generated[b].append(token)
                reason, text = self._finished(requests[b], generated[b], token)
                if reason:
                    done[b] = {"text": text, "finish_reason": reason, "t": now}
                else:
                    keep.append(j)
            t_step = now
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
                **{self._cache_kw: cache},
                use_cache=True,
                **extra,
            ).logits[:, -1, :]
        peak = max(peak, self._peak_memory(dev))
        return [
            {
                "text": done[b]["text"],
                "finish_reason": done[b]["finish_reason"],
                "completion_tokens": len(generated[b]),
                "prefill_seconds": t_first - t0,
                "decode_seconds": done[b]["t"] - t_first,
                "peak_memory_bytes": peak,
                "meta": {
                    "batch_size": batch,
                    "gpu_seconds": device_share[b],
                    "device": dev.type,
                    "peak_memory": "cuda_max_allocated" if dev.type == "cuda" else "process_rss",
                },
            }
            for b in range(batch)
        ]

    def _finished(
        self, request: GenerationRequest, tokens: list[int], last: int
    ) -> tuple[str, str]:
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

    def _pick(self, logits, requests, gens):
        """Greedy by default; temperature > 0 samples with the request's own seeded generator."""
        import torch

        chosen = logits.argmax(-1)
        for j, r in enumerate(requests):
            if r.temperature > 0:
                probs = torch.softmax(logits[j].float() / r.temperature, -1)
                chosen[j] = torch.multinomial(probs, 1, generator=gens[j])[0]
        return chosen

    def _generator(self, request: GenerationRequest, device):
        """A local RNG per request, seeded from (seed, request): results do not depend on batching."""
        import torch

        if request.temperature <= 0:
            return None
        digest = hashlib.sha256(f"{self.seed}|{request.to_json()}".encode()).hexdigest()
        return torch.Generator(device=device).manual_seed(int(digest[:15], 16))

    def _now(self) -> float:
        import torch

        if self.input_device.type == "cuda":
            torch.cuda.synchronize()
        elif self.input_device.type == "mps":
            torch.mps.synchronize()
        return time.perf_counter()

    @staticmethod
    def _peak_memory(dev) -> int:
        import torch

        if dev.type == "cuda":
            return int(torch.cuda.max_memory_allocated())
        import psutil

        return int(psutil.Process().memory_info().rss)


def pick_device(device: str = "auto") -> str:
    import torch

    if device != "auto":
        if device.split(":")[0] not in ("cpu", "cuda", "mps"):
            raise unknown("device", device, ["auto", "cpu", "cuda", "cuda:N", "mps"])
        return device
    if torch.cuda.is_available():
        return "cuda"
    if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
        return "mps"
    return "cpu"


def pick_dtype(dtype: str, device: str):
    import torch

    if dtype != "auto":
        if dtype not in DTYPES:
            raise unknown("dtype", dtype, ["auto", *DTYPES])
        return getattr(torch, dtype)
    if device.startswith("cuda"):
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    return torch.float16 if device == "mps" else torch.float32


def weights_id(source: str, model, cache_dir=None) -> str:
    """sha256 over a local folder's weight files (memoised), else the hub revision."""
    folder = Path(source)
    files = (
        sorted(folder.glob("*.safetensors")) or sorted(folder.glob("*.bin"))
        if folder.is_dir()
        else []
    )
    if files:
        digests = "".join(f"{f.name}:{file_sha256(f, cache_dir)}\n" for f in files)
        return "files-sha256:" + hashlib.sha256(digests.encode()).hexdigest()
    revision = getattr(model.config, "_commit_hash", None)
    return f"hub:{source}@{revision or 'unknown-revision'}"
