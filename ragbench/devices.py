"""Shared torch/transformers environment helpers: which device to run on, quiet transformers, and
GGUF files parsed once while transformers reads them (``gguf_parsed_once``).

Used by the LLM backend (``llm/hf/load.py``, ``llm/gguf.py``), the embedders and the tokenizers, so the
rules ("auto" = CUDA > MPS > CPU; explicit devices pass through) are written once. torch and
transformers are imported inside the functions: importing this module stays light.
"""

from __future__ import annotations

import contextlib
import functools
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

from ragbench.registry import unknown

DEVICES = ("auto", "cpu", "cuda", "mps")  # "cuda:N" is accepted too


def pick_device(device: str = "auto") -> str:
    """``"auto"`` -> ``"cuda"`` > ``"mps"`` > ``"cpu"``; explicit devices (``"cuda:1"``) pass."""
    if device.split(":")[0] not in DEVICES:
        raise unknown("device", device, [*DEVICES, "cuda:N"])
    if device != "auto":
        return device
    import torch

    if torch.cuda.is_available():
        return "cuda"
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        return "mps"
    return "cpu"


def quiet_transformers(progress_bars: bool = True) -> None:
    """Silence transformers' info/warning logs (and, by default, its progress bars)."""
    import logging

    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    if progress_bars:
        hf_logging.disable_progress_bar()
    logging.getLogger("transformers").setLevel(logging.ERROR)


def cpu_flags() -> list[str]:
    """This CPU's feature flags (``/proc/cpuinfo``; [] elsewhere): benchmarks record them beside
    each figure."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return sorted(line.split(":", 1)[1].split())
    except OSError:
        pass
    return []


class _ParsedOnce:
    """The state of ``gguf_parsed_once``: how many blocks are open, gguf's own names meanwhile."""

    lock = threading.Lock()
    open = 0
    saved: tuple[Any, Any] | None = None


@contextlib.contextmanager
def gguf_parsed_once() -> Iterator[None]:
    """Inside the block, each GGUF file is parsed once and gguf's tensor-name map built once per
    (architecture, layer count), however often transformers asks.

    Converting a GGUF with transformers reads the file three times (the config, the weights and
    the tokenizer: ``load_gguf_checkpoint`` each time), and every read parses every metadata
    field anew (SmolLM2's 49k-entry vocabulary, field by field: 4.9 s a parse on a 2-core CPU);
    the weights' names are matched through ``gguf.get_tensor_name_map``, which builds the map
    again on each of 397 calls (19 ms each). Profiled: 14.7 s and 7.4 s of a 40 s conversion at
    load 2 (``llm/gguf.py``); 13.6 s against 21.6 s with the block, the same files byte for byte.
    transformers imports both names from ``gguf`` when it calls them, so replacing the module's
    attributes reaches it; both are read-only once built (a reader maps the file read-only, the
    map is only looked up). Blocks may overlap across threads (the model's conversion and the
    tokenizer's): the first one in replaces the names, the last one out puts gguf's own back and
    drops the parsed files. Hand-written: neither library caches them."""
    import gguf

    with _ParsedOnce.lock:
        if _ParsedOnce.open == 0:
            _ParsedOnce.saved = (gguf.GGUFReader, gguf.get_tensor_name_map)
            reader_class, name_map = _ParsedOnce.saved
            gguf.GGUFReader = _once_reader(reader_class)  # type: ignore[misc]  # for the block
            gguf.get_tensor_name_map = functools.lru_cache(maxsize=None)(name_map)
        _ParsedOnce.open += 1
    try:
        yield
    finally:
        with _ParsedOnce.lock:
            _ParsedOnce.open -= 1
            if _ParsedOnce.open == 0 and _ParsedOnce.saved is not None:
                gguf.GGUFReader, gguf.get_tensor_name_map = _ParsedOnce.saved  # type: ignore[misc]
                _ParsedOnce.saved = None


def _once_reader(reader_class: Any) -> Any:
    """A stand-in for gguf's ``GGUFReader`` class: ``GGUFReader(path)`` is the file's one parsed
    reader (a gguf ``GGUFReader``)."""
    readers: dict[tuple[str, str], Any] = {}
    lock = threading.Lock()

    class OnceReader(reader_class):
        def __new__(cls, path: str | os.PathLike, mode: Literal["r", "r+", "c"] = "r") -> Any:
            key = (os.fspath(path), mode)
            with lock:
                if key not in readers:
                    readers[key] = reader_class(path, mode)
                return readers[key]

    return OnceReader
