"""Shared torch/transformers environment helpers: which device to run on, and quiet transformers.

Used by the LLM backend (``llm/hf/load.py``, ``llm/gguf.py``), the embedders and the tokenizers, so the
rules ("auto" = CUDA > MPS > CPU; explicit devices pass through) are written once. torch and
transformers are imported inside the functions: importing this module stays light.
"""

from __future__ import annotations

from pathlib import Path

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
