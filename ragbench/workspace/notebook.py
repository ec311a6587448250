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


def rope_runs(
    section: dict[str, Any], lengths: list[int], scaling: str = "yarn", factor: float = 2.0
) -> list[tuple[dict[str, Any], Any]]:
    """``[(model section, long_context strategy)]`` for the NIAH heatmap past the trained window:
    the model run as trained, its window opened to the longest haystack (positions it never saw
    in training, unscaled), then, on the transformers backend (the only one that can rescale
    positions), the same model loaded with RoPE scaling, which the records name. Other backends
    get the unscaled run only."""
    window = max(lengths) + 512  # room for the question and the answer after the haystack
    params = dict(section.get("params") or {})
    runs: list[tuple[dict[str, Any], Any]] = [
        ({**section, "params": {**params, "context_window": window}}, "long_context")
    ]
    if section.get("backend") == "hf":
        scaled = {**section, "params": {**params, "rope_scaling": scaling, "rope_factor": factor}}
        named = {"name": "long_context", "params": {"rope_scaling": f"{scaling}-x{factor:g}"}}
        runs.append((scaled, named))
    return runs
