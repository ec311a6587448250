"""Helpers for the notebooks' repeated set-up cells (notebooks stay thin: parameters, library
calls, plots)."""

from __future__ import annotations

import warnings
from typing import Any

# Without ipywidgets, tqdm.auto (transformers' "Loading weights", ingest bars) warns "IProgress
# not found" in every notebook, then falls back to a text bar, which is what a rendered notebook
# should show anyway: keep the bar, drop the warning.
warnings.filterwarnings("ignore", message="IProgress not found")

# the fake backend has no architecture of its own: FLOPs and KV bytes use the embedded model's
FAKE_PRESET = "smollm2-135m-instruct"


def model_block(
    backend: str, model: str, base_url: str = "", max_new_tokens: int = 32, tokenizer: str = ""
) -> tuple[dict[str, Any], str]:
    """(the run config's ``model`` section, the token counter for dataset lengths and chunks)
    from a notebook's model parameters. An empty ``tokenizer`` counts with the model's own
    tokenizer (whitespace for the fake backend, which has none)."""
    section = {
        "backend": backend,
        "name": model,
        "max_new_tokens": max_new_tokens,
        "params": {"base_url": base_url} if base_url else {},
        "preset": FAKE_PRESET if backend == "fake" else None,
    }
    if backend == "fake":  # the no-weights test model takes the KV variants too (flagged as such)
        section["params"]["simulate_kv_cache"] = True
    return section, tokenizer or ("whitespace" if backend == "fake" else model)


def judge_block(backend: str, model: str, base_url: str = "") -> dict[str, Any] | None:
    """The run config's ``judge`` section from a notebook's judge parameters; None when no judge
    model is named (then only string metrics score the answers)."""
    if not model:
        return None
    section, _ = model_block(backend, model, base_url, max_new_tokens=16)
    return {"model": section}
