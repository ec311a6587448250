"""Linear weights laid out for decode steps on the CPU: packed once for a few rows (fp32 or bf16,
oneDNN: ``PackedLinears``; from one row where torch runs two or more threads), and stored
transposed, siblings side by side, for one or two rows on one thread (fp32: ``transpose_weights``).

A decode step multiplies a few rows (one per question still decoding) by every weight matrix.
``torch.nn.functional.linear`` hands that to MKL's sgemm, which re-packs the whole weight matrix
into its blocked layout on every call; with 3-64 rows the packing costs more than the multiply.
Measured on this project's 2-core machine with SmolLM2-135M's 211 weight matrices (one decode
step's linears, one thread): 10 rows take 121 ms through ``F.linear`` against 40 ms for one row
(which takes MKL's gemv path, no packing), and 64 ms with the weights packed once. Rows >= 128
(prefills) gain nothing and keep ``F.linear``.

One row (a decode step of one question) in fp32: MKL's gemv runs on one thread whatever torch's
thread count, oneDNN's packed multiply on all of them. With 2 threads (quiet, AMD EPYC, the 30
layers' shapes), one row took 20.2 ms packed against 27.9 ms for the transposed gemv below (q/k/v
side by side 2.8 vs 4.3, o 1.6 vs 3.4, gate/up side by side 10.2 vs 11.4, down 5.5 vs 8.8; the
output head 4.3 vs 5.2). On one thread the gemv wins (q/k/v 4.6 vs 5.7, gate/up 11.6 vs 17.4).
So fp32 packs from one row where torch runs two or more threads, from three on one
(``min_rows``), each sibling on its own packed weight: packing q/k/v and gate/up as one weight
each was ~3% faster on SmolLM2's whole step, within the noise, and needs a third packed copy of
their weights (the plain loop's short prefills pack theirs anyway: a cold compare with it
peaked 243 MB above one without).
The linears' gain shows less in SmolLM2's whole step, whose other work (attention, norms, the
step's Python) is as large: ``benchmarks/llm.py`` (quiet, load 1.0-1.6, best of 3) 48.0 ms
against 48.3 with the gemv at a 1k context and 62.7 against 66.1 at 4k; alternating 8 times at
1k, 44.8 against 47.2 (medians 48.3 and 49.7).

bf16 (``dtype: bfloat16`` on the CPU): ``F.linear`` in bf16 takes a slow path for a few rows
(one row: 37 ms of CPU time for SmolLM2's linears against 47 ms in fp32, for half the bytes),
while the packed bf16 weights run on oneDNN's bf16 kernels (avx512_bf16 / AMX where the CPU has
them): 22 ms for one row, 27 ms for ten (AMD EPYC, one thread, benchmarks/llm.py). So bf16 packs
every decode-sized call, from one row up.

The weights are reordered once per model into oneDNN's blocked layout with
``torch.ops.mkldnn._reorder_linear_weight`` and multiplied with ``torch.ops.mkldnn._linear_
pointwise``: the two ops torch's own CPU weight-prepacking (inductor's freezing pass) emits.
Hand-written because the maintained route for eager models, intel-extension-for-pytorch's
``ipex.optimize``, is retired and has no build for this torch, and ``torch.compile`` would compile
every decode shape. The packed copy doubles the linear weights' memory, so ``PackedLinears.auto``
packs only fp32 and bf16 models on the CPU up to ``AUTO_LIMIT_BYTES`` of linear weights.

Results are the same multiply in another summation order: differences of ~1e-6 relative, like
those between batch sizes; greedy answers stay those of ``model.generate`` (tested).

One or two rows in fp32 on one thread: ``F.linear(x, W)`` with ``W`` stored as usual (out x in)
runs MKL's dot-product gemv, a horizontal reduction per output over rows of 576 floats, and read
SmolLM2's 538 MB in 47 ms on one core (11 GB/s) where ``torch.sum`` reads 24 GB/s. Stored
transposed (in x out, contiguous) and handed to ``F.linear`` as its (out x in) view, the same
call becomes ``x @ Wt``, the gemv that streams whole rows into an accumulator: 38 ms (AMD EPYC,
one thread; benchmarks/llm.py), and a prefill's gemm is as fast either way.
``transpose_weights`` does that in place (no copy kept) at load, and stores q/k/v and gate/up,
which read the same input, side by side in one matrix each (``Fused``): the fused decode step
(``hf/fused.py``) multiplies each group at once (fewer, longer streams: the small matrices ran at
7-11 GB/s), while the model's own modules keep their views, so transformers' forward and the
fused step compute the same values bit for bit (tested on 1 and 2 threads).
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)

MAX_ROWS = 96  # rows (tokens) per call up to which the packed weights run
MIN_ROWS = {"float32": 3, "bfloat16": 1}  # and from which, by dtype, on one thread ...
MIN_ROWS_THREADED = {"float32": 1, "bfloat16": 1}  # ... and on more (see the docstring)
AUTO_LIMIT_BYTES = 4 << 30  # auto packs models with at most this many bytes of linear weights
_BATCH_HINT = 16  # oneDNN picks the packed layout for about this many rows
# sibling linears that read the same input, stored side by side (``transpose_weights``)
GROUPS = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))


def linears(model: torch.nn.Module) -> list[torch.nn.Linear]:
    """The ``torch.nn.Linear`` modules of ``model``, each once (tied weights included)."""
    import torch

    seen: set[int] = set()
    out: list[torch.nn.Linear] = []
    for module in model.modules():
        # exactly nn.Linear: subclasses (quantized, LoRA...) have forwards of their own
        if type(module) is torch.nn.Linear and id(module) not in seen:
            seen.add(id(module))
            out.append(module)
    return out


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def min_rows(dtype: torch.dtype) -> int | None:
    """The fewest rows a call of ``dtype`` runs on the packed weights with torch's current
    thread count (None: the dtype is never packed)."""
    import torch

    table = MIN_ROWS_THREADED if torch.get_num_threads() > 1 else MIN_ROWS
    return table.get(_dtype_name(dtype))


def available(dtype: torch.dtype | None = None) -> bool:
    """Whether this torch can pack a linear weight of ``dtype`` (default float32) for oneDNN
    (probes a tiny one: bf16 needs a CPU oneDNN runs bf16 on)."""
    import torch

    dtype = dtype or torch.float32
    if _dtype_name(dtype) not in MIN_ROWS or not torch.backends.mkldnn.is_available():
        return False
    try:
        w = torch.ones(4, 4, dtype=dtype)
        out = torch.ops.mkldnn._linear_pointwise(
            torch.ones(3, 4, dtype=dtype),
            torch.ops.mkldnn._reorder_linear_weight(w, 3),
            None,
            "none",
            [],
            "",
        )
        return bool(torch.equal(out.float(), torch.full((3, 4), 4.0)))
    except (RuntimeError, AttributeError, NotImplementedError):
        return False


class PackedLinears:
    """The linear layers of one model, their weights packed on first use (``auto`` packs them
    all at once).

    ``with packed.active(): model(...)`` routes every ``nn.Linear`` forward whose input has
    ``min_rows(dtype)``..``MAX_ROWS`` rows through the packed weights, all others through
    ``F.linear``; ``packed.linear(module, x)`` is the same choice for one call (the fused decode
    step's, ``hf/fused.py``). The packed copies follow the weights they were made from: a weight
    replaced or changed in place (``data_ptr`` or version differs) is packed again.
    """

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self._packed: dict[int, tuple[torch.Tensor, tuple[int, int]]] = {}
        self._lock = threading.Lock()
        self.packed_calls = 0  # forwards that ran on packed weights (tests read it)

    @classmethod
    def auto(
        cls,
        model: torch.nn.Module,
        device: torch.device | str,
        dtype: torch.dtype,
        enabled: bool | None,
    ) -> PackedLinears | None:
        """``enabled``: True packs where possible, False never, None (auto) packs fp32 and bf16
        models on the CPU whose linear weights fit ``AUTO_LIMIT_BYTES``. None when not packed."""
        if enabled is False or getattr(device, "type", str(device)) != "cpu":
            return None
        if not available(dtype):
            if enabled:
                log.warning(
                    "packed linear weights need fp32 or bf16 on a CPU oneDNN runs them on; "
                    "not packing %s",
                    _dtype_name(dtype),
                )
            return None
        size = sum(m.weight.numel() * m.weight.element_size() for m in linears(model))
        if enabled is None and size > AUTO_LIMIT_BYTES:
            return None
        return cls(model).pack_all()

    def pack_all(self) -> PackedLinears:
        """Pack every weight now (at load: ~0.7 s for SmolLM2-135M's 513 MiB on 2 cores), so the
        first batch's time and cost do not include it."""
        for module in linears(self.model):
            self._weight(module)
        return self

    def _weight(self, module: torch.nn.Linear) -> torch.Tensor:
        """``module``'s weight packed, once per version of it."""
        w = module.weight
        key = (w.data_ptr(), w._version)
        hit = self._packed.get(id(module))
        if hit is None or hit[1] != key:
            import torch

            with self._lock:
                packed = torch.ops.mkldnn._reorder_linear_weight(w.detach(), _BATCH_HINT)
                self._packed[id(module)] = hit = (packed, key)
        return hit[0]

    @staticmethod
    def takes(x: torch.Tensor, weight: torch.Tensor) -> bool:
        """Whether an input ``x`` runs on the packed weights: decode-sized for its dtype and
        torch's thread count (``min_rows``), of the weight's dtype, on the CPU."""
        rows = x.numel() // x.shape[-1] if x.dim() else 0
        low = min_rows(x.dtype)
        return (
            low is not None
            and low <= rows <= MAX_ROWS
            and x.dtype == weight.dtype
            and not x.is_cuda
        )

    def linear(self, module: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
        """``module(x)`` for an ``nn.Linear``: on the packed weights for a decode-sized CPU input
        of the weights' dtype, else ``F.linear``."""
        import torch

        if self.takes(x, module.weight):
            self.packed_calls += 1
            return torch.ops.mkldnn._linear_pointwise(
                x, self._weight(module), module.bias, "none", [], ""
            )
        return torch.nn.functional.linear(x, module.weight, module.bias)

    @contextlib.contextmanager
    def active(self) -> Iterator[None]:
        """Route the model's linear layers through the packed weights inside the block."""
        mods = linears(self.model)

        def forward_of(module: torch.nn.Linear) -> Callable[[torch.Tensor], torch.Tensor]:
            def forward(x: torch.Tensor) -> torch.Tensor:
                return self.linear(module, x)

            return forward

        patched = [m for m in mods if "forward" not in vars(m)]  # leave others' patches alone
        for m in patched:
            m.forward = forward_of(m)  # type: ignore[method-assign,assignment]  # an instance's own forward
        try:
            yield
        finally:
            for m in patched:
                vars(m).pop("forward", None)


@dataclass(frozen=True)
class Fused:
    """Sibling linears stored side by side: ``weight`` (their outputs stacked x in, a view of
    transposed storage), ``bias`` (stacked, or None), ``sizes`` (each one's outputs, in order)."""

    weight: torch.Tensor
    bias: torch.Tensor | None
    sizes: tuple[int, ...]


def transpose_weights(
    model: torch.nn.Module, device: torch.device | str, dtype: torch.dtype
) -> dict[tuple[int, str], Fused]:
    """On the CPU in fp32: store every ``nn.Linear`` weight of ``model`` transposed (in x out,
    contiguous) behind its usual (out x in) view, in place, and each group of ``GROUPS`` side by
    side in one such storage (see the module docstring). Returns the groups (``group_of`` finds
    one); elsewhere {} and the model untouched."""
    import torch

    if getattr(device, "type", str(device)) != "cpu" or dtype != torch.float32:
        return {}
    done: set[int] = set()
    fused: dict[tuple[int, str], Fused] = {}
    for parent in model.modules():
        for names in GROUPS:
            members = [getattr(parent, n, None) for n in names]
            if _groupable(members):
                fused[_group_key(parent, names)] = _side_by_side(
                    cast("list[torch.nn.Linear]", members)
                )
                done.update(id(m) for m in members)
    for module in linears(model):
        if id(module) not in done and module.weight.is_contiguous():
            with torch.no_grad():
                module.weight.data = module.weight.data.t().contiguous().t()
    return fused


def group_of(fused: dict, parent: object, names: tuple[str, ...]) -> Fused | None:
    """The ``Fused`` of ``parent``'s group ``names`` (None: stored apart)."""
    return fused.get(_group_key(parent, names))


def _group_key(parent: object, names: tuple[str, ...]) -> tuple[int, str]:
    return (id(parent), names[0])


def _groupable(members: list[object]) -> bool:
    """Plain ``nn.Linear`` siblings on one input, all with or all without a bias."""
    import torch

    if any(type(m) is not torch.nn.Linear for m in members):
        return False
    linear = cast("list[torch.nn.Linear]", members)
    first = linear[0]
    return all(
        m.in_features == first.in_features
        and (m.bias is None) == (first.bias is None)
        and m.weight.dtype == first.weight.dtype
        and m.weight.is_contiguous()
        for m in linear
    )


def _side_by_side(members: list[torch.nn.Linear]) -> Fused:
    """One transposed storage for ``members`` (in x sum of outs); each weight becomes its view."""
    import torch

    with torch.no_grad():
        storage = torch.cat([m.weight.data.t() for m in members], dim=1).contiguous()
        start = 0
        for m in members:
            m.weight.data = storage[:, start : start + m.out_features].t()
            start += m.out_features
        bias = None
        if members[0].bias is not None:
            bias = torch.cat([m.bias.data for m in members])
    return Fused(storage.t(), bias, tuple(m.out_features for m in members))
