"""The two baselines ragbench's prefix-KV reuse is compared against, at the model level on token
ids, shared by ``llm.py`` (the embedded model, CPU) and ``gpu_check.py`` (random-weight 7-8B
architectures on a GPU). Imports only torch and transformers.

- ``plain_generate``: one ``model.generate`` per question on its whole prompt (document again
  every time).
- ``prompt_cache_reuse``: the transformers docs' "re-use the prompt cache" recipe, what a
  transformers user would write: compute the document's KV once (last-position logits only, the
  strongest form of it), then per question ``copy.deepcopy`` that cache and ``generate`` with it,
  so only the question and the answer run through the model.

Both decode greedily with the caller's ``generate`` keywords (``max_new_tokens``, stop strings,
EOS), so they are held to the same answers and the same stopping rule as ragbench.
"""

from __future__ import annotations

import copy
import inspect
from collections.abc import Callable, Sequence
from typing import Any


def cache_kw(model: Any) -> str:
    """transformers 5.x calls the cache ``cache``; earlier versions ``past_key_values``."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def _generate(model: Any, ids: list[int], device: Any, cache: Any, **kwargs: Any) -> list[int]:
    import torch

    x = torch.tensor([ids], device=device)
    extra = {cache_kw(model): cache} if cache is not None else {}
    out = model.generate(x, attention_mask=torch.ones_like(x), do_sample=False, **extra, **kwargs)
    return [int(t) for t in out[0, len(ids) :]]


def plain_generate(
    model: Any, prompts: Sequence[list[int]], device: Any, now: Callable[[], float], **kwargs: Any
) -> dict[str, Any]:
    """One ``generate`` per prompt: {"outputs": generated ids per prompt, "seconds": total}."""
    import torch

    outs = []
    with torch.inference_mode():
        t0 = now()
        for ids in prompts:
            outs.append(_generate(model, ids, device, None, **kwargs))
        seconds = now() - t0
    return {"outputs": outs, "seconds": seconds}


def prompt_cache_reuse(
    model: Any,
    prompts: Sequence[list[int]],
    prefix_len: int,
    device: Any,
    now: Callable[[], float],
    **kwargs: Any,
) -> dict[str, Any]:
    """The prefix KV computed once, deep-copied per prompt, ``generate`` with the copy.

    Returns generated ids per prompt, the prefill seconds, the seconds after it (copies +
    generates) and the total."""
    import torch
    from transformers import DynamicCache

    if any(p[:prefix_len] != prompts[0][:prefix_len] for p in prompts):
        raise ValueError("prompt_cache_reuse: the prompts do not share the first prefix_len ids")
    if any(len(p) <= prefix_len for p in prompts):
        raise ValueError("prompt_cache_reuse: every prompt needs a token after the prefix")
    outs = []
    params = inspect.signature(model.forward).parameters
    last_only = {"logits_to_keep": 1} if "logits_to_keep" in params else {}
    with torch.inference_mode():
        t0 = now()
        cache = DynamicCache(config=model.config)
        model(
            input_ids=torch.tensor([list(prompts[0][:prefix_len])], device=device),
            use_cache=True,
            **{cache_kw(model): cache},
            **last_only,
        )
        t1 = now()
        for ids in prompts:
            outs.append(_generate(model, ids, device, copy.deepcopy(cache), **kwargs))
        t2 = now()
    return {
        "outputs": outs,
        "prefill_seconds": t1 - t0,
        "after_prefill_seconds": t2 - t1,
        "seconds": t2 - t0,
    }
