"""transformers backend: where the weights come from and how they are loaded.

A model name resolves to a preset, a local folder, a ``.gguf`` file (dequantised once, see
``gguf.py``) or a Hugging Face hub id. The weights load on the chosen device (``ragbench.devices``)
in the chosen dtype with the fastest attention available, and are identified for cache keys by a
hash of the local files or by the hub revision.

Weights load from safetensors only: a folder (or hub repo) whose weights are only in the
pickle-based ``.bin`` format is refused, since unpickling a file can run code hidden in it. The
model param ``allow_pickle_weights: true`` loads such weights from a source you trust (safetensors
are still preferred where both are present).

RoPE scaling (``rope_scaling``, ``rope_factor``) is a load-time option: the rotary frequencies are
built with the model, so a model trained on N positions can be run at factor x N. See
``rope_parameters`` for the methods and the papers.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ragbench import assets
from ragbench.devices import pick_device, quiet_transformers
from ragbench.llm.gguf import convert_gguf, file_sha256
from ragbench.models import PRESETS, ModelPreset
from ragbench.registry import unknown

DTYPES = ("float32", "bfloat16", "float16")
# transformers' rope_type names: dynamic NTK-aware scaling (bloc97 2023, as in Peng et al.
# 2023 §3.3) and YaRN (Peng et al. 2023, arXiv:2309.00071); "linear" is position interpolation
# (Chen et al. 2023, arXiv:2306.15595), for comparison
ROPE_SCALINGS = ("dynamic", "yarn", "linear")
PICKLE_WEIGHTS = ("*.bin", "*.pt", "*.pth", "*.ckpt")  # torch.save files: unpickled to load
PICKLE_OPTION = "allow_pickle_weights: true"


@dataclass(frozen=True)
class LoadedModel:
    """A causal LM and its tokenizer, ready for inference, and what identifies them."""

    model: Any  # transformers PreTrainedModel, in eval mode, on its device(s)
    tokenizer: Any
    device: str  # as picked: "cpu", "cuda", "cuda:1", "mps"
    dtype: object  # torch.dtype
    weights: str  # "gguf-sha256:...", "files-sha256:..." or "hub:<id>@<revision>"
    preset: ModelPreset | None


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


def set_threads(threads: int | None) -> None:
    """torch's CPU threads for everything after (``model.threads``): torch's default, one per
    core, oversubscribes a machine other jobs share; a run measured 4x slower that way."""
    if threads:
        import torch

        torch.set_num_threads(int(threads))


def load_model(
    model: str,
    device: str = "auto",
    dtype: str = "auto",
    attn_implementation: str = "auto",
    cache_dir: str | os.PathLike | None = None,
    rope: tuple[str, float] | None = None,
    allow_pickle_weights: bool = False,
) -> LoadedModel:
    """Load ``model`` (see :func:`resolve_model`). Several GPUs under ``device="cuda"`` share
    the layers (``device_map="auto"``); ``"cuda:N"`` pins one. ``rope``: ``(scaling, factor)``
    to run past the trained window (``rope_parameters``). ``allow_pickle_weights``: load
    ``.bin`` weights when a source has no safetensors (else a ValueError naming it)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    quiet_transformers()
    source, gguf, preset = resolve_model(model)
    weights = ""
    if gguf is not None:
        source = str(convert_gguf(gguf, cache_dir))
        weights = "gguf-sha256:" + file_sha256(gguf, cache_dir)
    if not allow_pickle_weights:
        refuse_pickle_weights(source)
    device = pick_device(device)
    torch_dtype = pick_dtype(dtype, device)
    multi_gpu = device == "cuda" and torch.cuda.device_count() > 1
    extra: dict[str, object] = {}
    if rope is not None:
        config = AutoConfig.from_pretrained(source)
        config.rope_parameters = rope_parameters(config, *rope)
        extra["config"] = config
    try:
        lm = AutoModelForCausalLM.from_pretrained(
            source,
            **extra,
            dtype=torch_dtype,
            attn_implementation=pick_attention(attn_implementation, device, torch_dtype),
            device_map="auto" if multi_gpu else None,
            use_safetensors=None if allow_pickle_weights else True,  # None: safetensors first
        )
    except OSError as exc:  # a hub repo without safetensors (a local folder is checked above)
        if allow_pickle_weights or "safetensors" not in str(exc):
            raise
        raise ValueError(_pickle_refusal(source, "has no safetensors weights")) from None
    if not multi_gpu:
        # PreTrainedModel.to is @wraps(nn.Module.to): typeshed's functools._Wrapped types the
        # bound method as if ``self`` were still to be passed
        lm.to(device)  # type: ignore[arg-type]
    lm.eval()
    tokenizer = AutoTokenizer.from_pretrained(source)
    return LoadedModel(
        model=lm,
        tokenizer=tokenizer,
        device=device,
        dtype=torch_dtype,
        weights=weights or weights_id(source, lm, cache_dir),
        preset=preset,
    )


def refuse_pickle_weights(
    source: str,
    kind: str = "model",
    option: str = f"the model param {PICKLE_OPTION}",
    recursive: bool = False,
) -> None:
    """A ValueError naming the folder and the option when a local model folder has weights
    only in a pickle-based format (``PICKLE_WEIGHTS``); hub ids are checked at load time.
    ``kind`` and ``option`` name what is loaded and how to opt in (embedders and
    cross-encoders: their own settings); ``recursive``: each subfolder too (a
    sentence-transformers model keeps a module's weights in its own folder: ``2_Dense/``)."""
    folder = Path(source)
    if not source or not folder.is_dir():
        return
    folders = [folder, *(sorted(p for p in folder.rglob("*") if p.is_dir()) if recursive else [])]
    pickled = []
    for each in folders:
        if any(each.glob("*.safetensors")):
            continue
        found = sorted(f for pattern in PICKLE_WEIGHTS for f in each.glob(pattern))
        pickled += [str(f.relative_to(folder)) for f in found if f.is_file()]
    if pickled:
        shown = ", ".join(pickled[:3]) + (", ..." if len(pickled) > 3 else "")
        raise ValueError(
            _pickle_refusal(source, f"has weights only as pickle files ({shown})", kind, option)
        )


def _pickle_refusal(
    source: str, what: str, kind: str = "model", option: str = f"the model param {PICKLE_OPTION}"
) -> str:
    return (
        f"{kind} {source} {what}: loading them unpickles, which can run code hidden in the file; "
        f"convert them to safetensors, or set {option} to trust the source"
    )


def rope_parameters(config: Any, scaling: str, factor: float) -> dict[str, Any]:
    """The ``rope_parameters`` that run ``config``'s model at ``factor`` x its trained window.

    - ``dynamic`` (NTK-aware): the rotary base grows with the sequence once it passes the trained
      length, so positions within it are unchanged. With a KV cache the keys keep the angles
      they were computed with while later tokens use a larger base: a known approximation.
    - ``yarn``: interpolates the low frequencies, keeps the high ones, and scales attention
      temperature (Peng et al. 2023); static, so cached keys and new queries agree.
    - ``linear``: position interpolation (positions divided by ``factor``).
    """
    if scaling not in ROPE_SCALINGS:
        raise unknown("rope_scaling", str(scaling), ROPE_SCALINGS)
    if isinstance(factor, bool) or not isinstance(factor, int | float) or factor <= 1:
        raise ValueError(f"rope_factor must be a number > 1, got {factor!r}")
    base = dict(getattr(config, "rope_parameters", None) or {})
    if base.get("rope_type", "default") != "default":
        raise ValueError(
            f"this model already uses rope_type {base['rope_type']!r}; ragbench scales only "
            "models with plain RoPE"
        )
    trained = int(config.max_position_embeddings)
    return {
        **base,
        "rope_type": scaling,
        "factor": float(factor),
        "original_max_position_embeddings": trained,
    }


def pick_dtype(dtype: str, device: str):
    """``"auto"``: bf16 (else fp16) on CUDA, fp16 on MPS, fp32 on CPU."""
    import torch

    if dtype != "auto":
        if dtype not in DTYPES:
            raise unknown("dtype", dtype, ["auto", *DTYPES])
        return getattr(torch, dtype)
    if device.startswith("cuda"):
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    return torch.float16 if device == "mps" else torch.float32


def pick_attention(attn_implementation: str, device: str, dtype) -> str:
    """``"auto"``: flash-attention 2 when installed, on CUDA and in half precision, else SDPA."""
    import torch

    if attn_implementation != "auto":
        return attn_implementation
    flash = importlib.util.find_spec("flash_attn") is not None
    half = dtype in (torch.bfloat16, torch.float16)
    return "flash_attention_2" if flash and device.startswith("cuda") and half else "sdpa"


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
