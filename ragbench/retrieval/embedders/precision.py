"""Embedding precision: fp32 (the reference), bf16 autocast, bf16 weights; whether the hardware
computes bf16 natively (where it does not, oneDNN emulates it and bf16 runs slower than fp32).

Which embedders take which precision is each class's own fact (its ``precisions``);
``check_precision_param`` reads it through the ``EMBEDDERS`` registry."""

from __future__ import annotations

import logging
import platform
from pathlib import Path

from ragbench.registry import Choice, Registry
from ragbench.retrieval.names import EMBEDDERS

log = logging.getLogger(__name__)

PRECISIONS = Registry(
    "embedder precision",
    {
        "fp32": Choice("float32 throughout: the reference (and the default)"),
        # linear layers and attention, softmax included, in bfloat16; the residual stream,
        # layer norms and pooling stay fp32 by type promotion
        "bf16": Choice("torch.autocast to bfloat16 over fp32 weights (minilm-bf16)"),
        "bf16-full": Choice("the weights themselves cast to bfloat16"),
    },
)


def check_precision(precision: str | None) -> str:
    """``precision`` as one of ``PRECISIONS`` (None -> "fp32"), else an error naming them."""
    if precision is None:
        return "fp32"
    return PRECISIONS.check(str(precision))


def check_precision_param(name: str, params: dict) -> None:
    """Config-time check of ``retrieval.embedder_params.<name>.precision``: a known precision,
    given to an embedder that has one (PyTorch sentence-transformers: not hash, a server or
    ONNX, whose only precision is fp32)."""
    if "precision" not in params:
        return
    precision = check_precision(params["precision"])
    key = name.lower()
    cls = EMBEDDERS.get(key if key in EMBEDDERS else "minilm")  # any other name: a ST model
    if not getattr(cls, "precisions", ()):
        raise ValueError(f"embedder {name!r} has no precision option (precision={precision!r})")
    onnx = params.get("backend") == "onnx" or "quantize" in params or cls.backend == "onnx"
    if onnx and precision != "fp32":
        raise ValueError(
            f"embedder {name!r} runs on ONNX Runtime: precision={precision!r} is "
            "the PyTorch backend's (embedder minilm-bf16)"
        )


def bf16_native(device: str = "cpu") -> bool:
    """Whether ``device`` computes bfloat16 matmuls in hardware: on a CPU, oneDNN with AMX or
    avx512_bf16 (x86) or the BF16 extension (aarch64); on CUDA, compute capability 8.0 or newer.
    Elsewhere (oneDNN emulates bf16 on older CPUs) bf16 runs slower than fp32."""
    import torch

    kind = torch.device(device).type
    if kind == "cuda":
        return torch.cuda.is_available() and torch.cuda.is_bf16_supported(False)
    if kind != "cpu":
        return True  # mps and others: no known way to tell, so no warning
    if not torch.backends.mkldnn.is_available():
        return False
    if not torch.ops.mkldnn._is_mkldnn_bf16_supported():
        return False
    cpu = torch.cpu
    for check in ("_is_amx_tile_supported", "_is_avx512_bf16_supported"):
        if getattr(cpu, check, lambda: False)():
            return True
    if platform.machine().lower() in ("aarch64", "arm64"):
        return "bf16" in _cpu_features()
    return False


def _cpu_features() -> set[str]:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith(("features", "flags")):
                return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


_bf16_warned: set[str] = set()


def warn_if_bf16_emulated(device: str) -> None:
    """Log once per device kind that bf16 is emulated there (slower than fp32)."""
    kind = device.split(":")[0]
    if kind in _bf16_warned or bf16_native(device):
        return
    _bf16_warned.add(kind)
    if kind == "cpu":
        vnni = {"avx512_vnni", "avx_vnni"} & _cpu_features()
        # without VNNI, full-range int8 weights saturate (u8s8): the 7-bit setting is the safe one
        quantize = "" if vnni else " with quantize: int8-avx2"
        hint = f"this CPU has no AMX or avx512_bf16; embedder minilm-onnx-int8{quantize} is faster"
    else:
        hint = "this GPU has no native bf16 (compute capability < 8.0)"
    log.warning("bf16 embedding will be slower than fp32 on %s: %s", device, hint)
