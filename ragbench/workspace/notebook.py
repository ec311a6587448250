"""Helpers for the notebooks' repeated set-up cells (notebooks stay thin: parameters, library
calls, plots)."""

from __future__ import annotations

import warnings
from typing import Any, NotRequired, TypedDict

from ragbench.llm import backend_capabilities, backend_params
from ragbench.secrets import redact_url

# Without ipywidgets, tqdm.auto (transformers' "Loading weights", ingest bars) warns "IProgress
# not found" in every notebook, then falls back to a text bar, which is what a rendered notebook
# should show anyway: keep the bar, drop the warning.
warnings.filterwarnings("ignore", message="IProgress not found")

# a backend with no architecture of its own (the fake one): FLOPs and KV bytes use the embedded
# model's
STAND_IN_PRESET = "smollm2-135m-instruct"


class ModelSection(TypedDict):
    """A run config's ``model`` section as ``model_block`` writes it (YAML, then ``ModelConfig``)."""

    backend: str
    name: str
    max_new_tokens: int
    params: dict[str, object]  # the backend's (base_url, simulate_kv_cache, ...)
    preset: str | None
    threads: NotRequired[int]  # compare's: changes speed, not the config hash


def model_block(
    backend: str, model: str, base_url: str = "", max_new_tokens: int = 32, tokenizer: str = ""
) -> tuple[ModelSection, str]:
    """(the run config's ``model`` section, the token counter for dataset lengths and chunks)
    from a notebook's model parameters. An empty ``tokenizer`` counts with the model's own
    tokenizer, or the backend's default counter (whitespace for the fake backend, which has
    none). A ``base_url`` left set for a backend that takes none (fake, hf: switching backends
    in the parameters cell) is dropped with a warning saying so, not passed on to fail."""
    can = backend_capabilities(backend)
    if base_url and "base_url" not in backend_params(backend):
        warnings.warn(
            f"base_url={redact_url(base_url)!r} is ignored: the {backend!r} backend talks to no server "
            "(clear base_url, or set backend to one that does, e.g. openai)",
            UserWarning,
            stacklevel=2,
        )
        base_url = ""
    section: ModelSection = {
        "backend": backend,
        "name": model,
        "max_new_tokens": max_new_tokens,
        "params": {"base_url": base_url} if base_url else {},
        "preset": STAND_IN_PRESET if can.needs_preset else None,
    }
    if can.simulates_kv_cache:  # a no-weights test model takes the KV variants too (flagged)
        section["params"]["simulate_kv_cache"] = True
    return section, tokenizer or can.default_tokenizer or model


def judge_block(backend: str, model: str, base_url: str = "") -> dict[str, object] | None:
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
    in training, unscaled), then, on a backend that can rescale positions (``rescales_rope``:
    the transformers one), the same model loaded with RoPE scaling, which the records name.
    Other backends get the unscaled run only."""
    window = max(lengths) + 512  # room for the question and the answer after the haystack
    params = dict(section.get("params") or {})
    runs: list[tuple[dict[str, Any], Any]] = [
        ({**section, "params": {**params, "context_window": window}}, "long_context")
    ]
    backend = section.get("backend")
    if backend is not None and backend_capabilities(backend).rescales_rope:
        scaled = {**section, "params": {**params, "rope_scaling": scaling, "rope_factor": factor}}
        named = {"name": "long_context", "params": {"rope_scaling": f"{scaling}-x{factor:g}"}}
        runs.append((scaled, named))
    return runs
