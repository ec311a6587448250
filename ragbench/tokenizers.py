"""Token counting with a named tokenizer, shared by datasets (context lengths), chunking and
context assembly (token budgets).

``get_tokenizer(name)`` accepts a name in ``TOKENIZERS`` (``"whitespace"``: a dependency-free
tokenizer for fast tests and for users with no model at hand), a model preset name (the embedded
SmolLM2 tokenizer is read from its GGUF file, offline), a local folder holding a Hugging Face
tokenizer, or a ``.gguf`` file. ``check_tokenizer(name)`` validates a name without loading it.
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

from ragbench.assets import asset_path, cache_dir
from ragbench.devices import gguf_parsed_once, quiet_transformers
from ragbench.models import PRESETS
from ragbench.registry import Choice, Registry, unknown

LOCAL = "<folder or .gguf path>"


def _path_like(name: str) -> bool:
    """A tokenizer beyond the entries: a folder or a ``.gguf`` file (anything with a path
    separator passes, and is looked up when loaded, so a config can name a path relative to
    itself)."""
    return "/" in name or os.sep in name or name.endswith(".gguf") or Path(name).is_dir()


# tokenizers by name: whitespace, and each model preset's own (ragbench.models); a path too
TOKENIZERS = Registry(
    "tokenizer",
    {
        "whitespace": "ragbench.tokenizers:WhitespaceTokenizer",
        **{
            name: Choice(
                f"model preset {name}'s tokenizer"
                + (" (embedded, offline)" if preset.embedded else " (from the Hub)")
            )
            for name, preset in PRESETS.items()
        },
    },
    other=LOCAL,
    accepts=_path_like,
)


class HubUnavailableError(ValueError):
    """A tokenizer from the Hugging Face Hub that is not in the local cache and cannot be
    downloaded now (offline, or the Hub unreachable or refusing)."""


def hub_offline() -> bool:
    """Whether the environment forbids Hub downloads (``HF_HUB_OFFLINE`` or
    ``TRANSFORMERS_OFFLINE``, as the Makefile and tests set them)."""
    flags = (os.environ.get(v, "") for v in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))
    return any(f.strip().lower() in ("1", "true", "yes", "on") for f in flags)


class Tokenizer(Protocol):
    name: str

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...

    def count(self, text: str) -> int: ...

    def offsets(self, text: str) -> list[tuple[int, int]]:
        """Character span of each token of ``encode(text)`` in ``text``."""
        ...


class WhitespaceTokenizer:
    """Each run of non-space characters is a token; ids are stable hashes (no vocabulary)."""

    name = "whitespace"
    _re = re.compile(r"\S+")

    def __init__(self) -> None:
        self._vocab: dict[str, int] = {}
        self._inv: list[str] = []

    def encode(self, text: str) -> list[int]:
        ids = []
        for m in self._re.finditer(text):
            tok = m.group()
            if tok not in self._vocab:
                self._vocab[tok] = len(self._inv)
                self._inv.append(tok)
            ids.append(self._vocab[tok])
        return ids

    def decode(self, ids: Sequence[int]) -> str:
        return " ".join(self._inv[i] for i in ids)

    def count(self, text: str) -> int:
        return sum(1 for _ in self._re.finditer(text))

    def offsets(self, text: str) -> list[tuple[int, int]]:
        return [m.span() for m in self._re.finditer(text)]


class HFTokenizer:
    """A transformers fast tokenizer without special tokens (they belong to the prompt template)."""

    def __init__(self, name: str, tok) -> None:
        self.name = name
        self.hf = tok

    def encode(self, text: str) -> list[int]:
        return self.hf(text, add_special_tokens=False)["input_ids"]

    def decode(self, ids: Sequence[int]) -> str:
        return self.hf.decode(list(ids), skip_special_tokens=True)

    def count(self, text: str) -> int:
        return len(self.encode(text))

    def offsets(self, text: str) -> list[tuple[int, int]]:
        enc = self.hf(text, add_special_tokens=False, return_offsets_mapping=True)
        return [tuple(span) for span in enc["offset_mapping"]]


def check_tokenizer(name: str) -> str:
    """``name`` if it can name a tokenizer: a ``TOKENIZERS`` entry (``whitespace`` or a model
    preset) or a path (see ``_path_like``). Else a did-you-mean error."""
    return TOKENIZERS.check(name)


@functools.lru_cache(maxsize=8)
def get_tokenizer(name: str = "smollm2-135m-instruct") -> Tokenizer:
    if name in PRESETS:
        preset = PRESETS.get(name)
        if preset.source.startswith("asset:"):
            return HFTokenizer(name, _load_gguf(asset_path(preset.source.removeprefix("asset:"))))
        return HFTokenizer(name, _load_hub(name, preset.source))
    if name in TOKENIZERS:
        return TOKENIZERS.get(name)()
    path = Path(name)
    if path.suffix == ".gguf" and path.exists():
        return HFTokenizer(name, _load_gguf(path))
    if path.is_dir():
        return HFTokenizer(name, _load_hf(str(path)))
    raise unknown("tokenizer", name, TOKENIZERS.choices())


def _load_gguf(gguf: Path):
    """Reading a tokenizer out of a GGUF file takes ~6 s; keep a converted copy in the cache dir
    (keyed by path, size and mtime) so later loads take well under a second."""
    import hashlib

    st = gguf.stat()
    key = hashlib.sha256(f"{gguf.resolve()}|{st.st_size}|{st.st_mtime_ns}".encode()).hexdigest()[
        :16
    ]
    folder = cache_dir() / "tokenizers" / f"{gguf.stem}-{key}"
    if (folder / "tokenizer.json").exists():
        return _load_hf(str(folder))
    with gguf_parsed_once():  # its config and its tokenizer: one parse
        tok = _load_hf(str(gguf.parent), gguf_file=gguf.name)
    import os
    import tempfile

    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = tempfile.mkdtemp(dir=folder.parent, prefix=".tmp-")
    tok.save_pretrained(tmp)
    try:
        os.replace(tmp, folder)  # atomic; a concurrent writer may have won, which is fine
    except OSError:
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)
    return tok


def _load_hub(name: str, repo: str):
    """Preset ``name``'s tokenizer, Hugging Face id ``repo``: from the local cache (no network),
    else downloaded, unless the environment is offline (then at once, not after the Hub's
    retries). Either failure is one HubUnavailableError saying how to get it."""
    try:
        return _load_hf(repo, local_files_only=True)
    except OSError:
        pass
    where = f"tokenizer {name!r} ({repo} on the Hugging Face Hub) is not in the local cache"
    download = f"run `hf download {repo}` where the Hub can be reached"
    if hub_offline():
        raise HubUnavailableError(
            f"{where} and HF_HUB_OFFLINE is set: unset it to let ragbench download it once, "
            f"or {download}"
        )
    try:
        return _load_hf(repo)
    except OSError as exc:
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise HubUnavailableError(
            f"{where} and could not be downloaded ({reason}): {download}"
        ) from None


def _load_hf(source: str, **kwargs):
    from transformers import AutoTokenizer

    quiet_transformers(progress_bars=False)  # quiet logs; progress bars left as they are
    return AutoTokenizer.from_pretrained(source, **kwargs)
