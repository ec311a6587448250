"""Model presets: where the weights come from and the architecture facts the cost model needs.

Parameter counts follow Kaplan et al.: ``non_embedding_params`` excludes the token embedding and
an untied LM head; it is the N in the "2 N FLOPs per token" rule. The presets are data,
``ragbench/data/models.yaml`` (facts from each model's published config.json).

``PRESETS`` is the ``Registry`` of model names; it is open-ended: a Hugging Face id, a model
folder or a ``.gguf`` file names a model too (``PRESETS.check``), while ``get_preset`` serves the
presets only.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from ragbench.registry import Registry, unknown


@dataclass(frozen=True)
class ModelPreset:
    name: str
    source: str  # "asset:<name>" (embedded, offline) or a Hugging Face id (opt-in network)
    instruct: bool  # apply the tokenizer's chat template
    context_window: int
    params: int
    non_embedding_params: int
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    embedded: bool = False  # ships with `make setup`; usable offline
    sliding_window: int | None = None  # local-attention window, when some layers use one
    note: str = ""


def _local_or_hub(name: str) -> bool:
    """A model beyond the presets: a Hugging Face id, a ``.gguf`` file or a model folder."""
    return "/" in name or name.endswith(".gguf") or Path(name).expanduser().is_dir()


PRESETS_FILE = Path(__file__).parent / "data" / "models.yaml"  # one entry per preset


def _preset(name: str, facts: dict[str, Any]) -> ModelPreset:
    """A preset from its ``models.yaml`` entry: the embedding (and an untied LM head) out of
    ``params`` give ``non_embedding_params``."""
    facts = dict(facts)
    heads = 1 if facts.pop("tied_embeddings") else 2
    non_embedding = facts["params"] - heads * facts["vocab"] * facts["hidden"]
    return ModelPreset(name=name, non_embedding_params=non_embedding, **facts)


PRESETS = Registry(
    "model",
    {
        name: _preset(name, facts)
        for name, facts in yaml.safe_load(PRESETS_FILE.read_text(encoding="utf-8")).items()
    },
    other="<HF id, folder or .gguf>",
    accepts=_local_or_hub,
)


def get_preset(name: str) -> ModelPreset:
    """The preset ``name``; an error names the presets (a model id or path has no preset)."""
    if name not in PRESETS:
        raise unknown("model", name, PRESETS.names())
    return PRESETS.get(name)
