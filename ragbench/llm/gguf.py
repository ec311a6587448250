"""GGUF weights: dequantise once with transformers, save as safetensors, reuse by file hash.

Loading SmolLM2's GGUF takes ~18 s of dequantisation on a 2-core CPU; the converted folder loads
in ~2 s. ``transformers serve`` cannot load a GGUF directly but serves the converted folder.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from pathlib import Path
from typing import Any

from ragbench import assets
from ragbench.devices import gguf_parsed_once, quiet_transformers
from ragbench.io import atomic_write_text, sha256_file

CONVERT_MARKER = "ragbench-converted.json"


# --------------------------------------------------------------------------- weights hashing


def _hash_cache_path(root: Path) -> Path:
    return root / "file-hashes.json"


def file_sha256(path: str | os.PathLike, cache_dir: str | os.PathLike | None = None) -> str:
    """sha256 of a (large) file, memoised in a small JSON keyed by path + size + mtime."""
    path = Path(path).resolve()
    root = Path(cache_dir) if cache_dir is not None else assets.cache_dir()
    root.mkdir(parents=True, exist_ok=True)
    st = path.stat()
    key = f"{path}|{st.st_size}|{st.st_mtime_ns}"
    index = _hash_cache_path(root)
    try:
        table = json.loads(index.read_text(encoding="utf-8"))
    except (FileNotFoundError, json.JSONDecodeError):
        table = {}
    if key in table:
        return table[key]
    digest = sha256_file(path)
    # Re-read right before writing so concurrent callers lose as little as possible; a lost
    # entry only costs a re-hash later, never a wrong answer (the key includes size and mtime).
    try:
        table = json.loads(index.read_text(encoding="utf-8"))
    except (FileNotFoundError, json.JSONDecodeError):
        table = {}
    table[key] = digest
    atomic_write_text(index, json.dumps(table, indent=1, sort_keys=True))
    return digest


# --------------------------------------------------------------------------- GGUF conversion


def convert_gguf(gguf_path: str | os.PathLike, cache_dir: str | os.PathLike | None = None) -> Path:
    """Dequantise a GGUF file once with transformers and save model + tokenizer as safetensors.

    The folder is ``<cache>/converted/<sha256(gguf)[:16]>``; later calls return it at once
    (loading it takes ~2 s against ~18 s for dequantising SmolLM2 on a 2-core CPU). The folder is
    written under a temporary name and renamed, so concurrent callers are safe: the first rename
    wins and the others discard their copy.
    """
    gguf_path = Path(gguf_path).resolve()
    if not gguf_path.is_file():
        raise FileNotFoundError(f"GGUF file not found: {gguf_path}")
    root = Path(cache_dir) if cache_dir is not None else assets.cache_dir()
    digest = file_sha256(gguf_path, root)
    target = root / "converted" / digest[:16]
    if (target / CONVERT_MARKER).exists():
        return target

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    quiet_transformers()
    tmp = target.parent / f".{target.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp"
    tmp.mkdir(parents=True)
    try:
        with gguf_parsed_once():
            model: Any = AutoModelForCausalLM.from_pretrained(  # a PreTrainedModel
                str(gguf_path.parent), gguf_file=gguf_path.name, dtype=torch.float32
            )
            tokenizer = AutoTokenizer.from_pretrained(
                str(gguf_path.parent), gguf_file=gguf_path.name
            )
        # save_pretrained refuses a GGUF-loaded model ("quantized with gguf ... not
        # serializable"); the weights are already dequantised, so drop the quantizer markers.
        model.hf_quantizer = None
        model.is_quantized = False
        if hasattr(model.config, "quantization_config"):
            delattr(model.config, "quantization_config")
        model.config.architectures = [type(model).__name__]
        model.save_pretrained(str(tmp), safe_serialization=True)
        tokenizer.save_pretrained(str(tmp))
        marker = {
            "source": str(gguf_path),
            "gguf_sha256": digest,
            "architecture": type(model).__name__,
        }
        atomic_write_text(tmp / CONVERT_MARKER, json.dumps(marker, indent=1))
        del model
        try:
            os.rename(tmp, target)
        except OSError:
            if not (target / CONVERT_MARKER).exists():  # a half-written leftover: replace it
                shutil.rmtree(target, ignore_errors=True)
                os.rename(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target
