"""transformers backend: the decode fast path (``decode: static``), used by ``hf.decode.Decoder``.

One job: decoding after the prefill on a static cache (the path's choice, its cache states, the
steps and their capture, whose check ``capture_agrees`` is kept beside the capture it judges).

The plain loop (``Decoder._loop``) is eager PyTorch over a ``DynamicCache``: every step launches
each kernel from Python (~500 for an 8B Llama), grows the cache by concatenation, and waits for
the device to read the chosen token and check the stop conditions. On an H200 that made a step
20-34 ms against a bandwidth floor of ~3.4 ms. This path keeps what the plain loop computes and
changes how it is driven:

- **static cache**: after the (unchanged) prefill, each layer's KV is copied into preallocated
  tensors of ``rows x kv heads x slots x head dim``; a step writes its keys/values at one slot
  (``index_copy_`` at a device-side slot counter) and attends over every slot through an explicit
  additive 4D mask (left padding and unfilled slots masked), so no tensor changes shape or address.
  The step's attention is ``shared_prefix.shared_prefix_attention`` (grouped-query matmuls, with or
  without a shared prefix), whatever the model's own: under a mask SDPA has no fast decode kernel;
- **bucketed rows**: a batch of n rows runs as ``bucket_rows(n)`` rows (1, 2, 4, 8, 16, 32);
  the spare rows and rows already finished keep computing (on a GPU a decode step costs about the
  same for 1 or 8 rows) and are ignored. Slots are bucketed too (``bucket_slots``), so one
  captured step serves many calls;
- **captured step** (CUDA only, ``cuda_graphs``): the whole step (unmask the slot, forward, argmax,
  record the token, advance position and slot) is captured once per (rows, slots, shared prefix)
  in a CUDA graph and replayed: one launch per step. A capture is checked against the same step
  run eagerly (``capture_agrees``: logits within a few units of the dtype's rounding, tokens equal
  but at near-ties); a failure or mismatch is recorded and that state runs the step uncaptured;
- **stop checks every k steps** (``check_every``): the tokens are copied to the host once per chunk
  of k steps, while the next chunk already runs, and checked there token by token with
  ``Decoder.finished`` (EOS, stop strings, max_new_tokens), exactly as the plain loop does: a row's
  text ends where the plain loop's would; tokens past its stop are computed and discarded.

Greedy only: a request with temperature > 0 samples with its own seeded generator in the plain
loop. Supported for models whose every layer is full attention (``shared_prefix.supported``),
on one device, with the plain KV cache; the prefill keeps the model's own attention, and the
shared-prefix attention is kept (its graph holds the prefix it was captured with).
Anything else runs the plain loop, and ``meta["decode"]`` says which path ran and why.

Timing: ``decode_seconds`` of a row is interpolated within the chunk it stopped in (the chunk's
end is a CUDA event, or the host clock off CUDA): per-step times are not observed without a sync
per step, which is what this path avoids.
"""

from __future__ import annotations

import math
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

from ragbench.llm import shared_prefix
from ragbench.llm.hf.batch import Batch, Decoded, Stepper
from ragbench.llm.kv import variants as kv_cache
from ragbench.types import GenerationRequest

if TYPE_CHECKING:
    import torch
    from transformers import Cache
    from transformers.cache_utils import DynamicLayer

MODES = ("auto", "eager", "static")
# Why auto runs the plain loop (measured on an H200, 8B shapes in bf16, benchmarks/results/
# gpu_check_h200.json): the captured step at batch 1 took 6.7-7.2 ms (1.8x the bandwidth floor,
# against 26-38 ms eager), but (1) captures at batch 8 and 32 failed the capture check (bf16
# logits differ from the eager step by 0.06-0.25), so they ran uncaptured at 25-40 ms; (2) the
# static cache's explicit 4D mask kept SDPA off its fast kernels, so a step after a 32k prompt
# took 31 ms against 8 ms after 1k: slower than the plain loop for long context, the very
# requests ragbench prices. Since then (not yet measured on a GPU): the check allows rounding
# (``capture_agrees``) and the steps attend through grouped-query matmuls (shared_prefix.py).
# gpu_check's decode part says whether the targets hold (``targets``); until a run shows they
# do, the static path is `decode: static`.
AUTO_REASON = "decode=auto runs the plain loop (the static path is opt-in: decode: static)"
ROW_BUCKETS = (1, 2, 4, 8, 16, 32)
CHECK_EVERY = 8  # decode steps between two reads of the tokens (stop checks)
MIN_SLOTS = 64  # the smallest slot bucket
MAX_STATES = 8  # static caches (and their graphs) kept for later calls, least recent dropped
STATE_MEMORY_SHARE = 0.25  # on CUDA: at most this share of device memory in kept states
# A captured step against the same step run eagerly: logits may differ by rounding (the graph's
# kernels are chosen at capture and may split reductions differently: the H200's bf16 captures at
# batch 8 and 32 differed by 0.06-0.25), up to CAPTURE_ULPS units of the dtype's rounding at the
# row's largest |logit|; a wrong input (a stale slot, mask or token) moves logits by their spread.
CAPTURE_ULPS = 8
CAPTURE_FLOAT32_RTOL = 1e-3  # float32: matmul algorithms differ by more than float32's eps
# why a KV-cache variant runs the plain loop
VARIANT_REASONS = {
    "offloaded": "keeps each layer's KV in host memory between uses; a preallocated device cache "
    "would defeat it",
    "sinks": "evicts positions while it decodes (its own cache layers)",
    "quantized": "keeps quantized codes and a residual, not one tensor per layer",
    "snapkv": "compresses the prompt's KV per head after the prefill (its own cache layers)",
}


def bucket_rows(n: int) -> int:
    """The rows a batch of ``n`` runs as: the smallest of ``ROW_BUCKETS`` that holds it, then
    multiples of the largest."""
    for b in ROW_BUCKETS:
        if n <= b:
            return b
    top = ROW_BUCKETS[-1]
    return top * math.ceil(n / top)


def bucket_slots(n: int) -> int:
    """The slots a static cache of at least ``n`` positions gets: ``MIN_SLOTS`` or a multiple of an
    eighth of the power of two below ``n`` (at most 1/8 of the slots unused; reused shapes)."""
    if n <= MIN_SLOTS:
        return MIN_SLOTS
    grain = max(MIN_SLOTS, 1 << (n.bit_length() - 1 - 3))
    return grain * math.ceil(n / grain)


def model_reason(model: object) -> str:
    """Why ``model`` cannot use the static path at all ("" when it can)."""
    if not shared_prefix.supported(model):
        return (
            "architecture: not every layer is plain full attention (or a composite model); "
            "the static path's 4D mask is full causal"
        )
    devices = {str(d) for d in (getattr(model, "hf_device_map", None) or {}).values()}
    if len(devices) > 1:
        return f"model split over {len(devices)} devices"
    return ""


@dataclass
class FastDecode:
    """A model's decode-path choice (``decode``: auto | eager | static; ``cuda_graphs``) and the
    static caches (and captured steps) kept for later calls. One per ``Decoder``, shared by its
    ``dataclasses.replace`` copies (calibration's loop probe)."""

    requested: str = "auto"
    static: bool = False  # the static path is on for this model and device
    reason: str = ""  # why it is off (static False)
    capture: bool = False  # capture the step in a CUDA graph (CUDA only)
    check_every: int = CHECK_EVERY
    states: OrderedDict = field(default_factory=OrderedDict)
    capture_error: str = ""  # set after a failed capture: later states run uncaptured

    @classmethod
    def choose(
        cls,
        model: object,
        device: torch.device,
        decode: str = "auto",
        cuda_graphs: bool = True,
        **kw: Any,
    ) -> FastDecode:
        if decode not in MODES:
            raise ValueError(f"decode must be one of {list(MODES)}, got {decode!r}")
        capture = bool(cuda_graphs) and device.type == "cuda"
        if decode == "eager":
            return cls(decode, False, "decode=eager", capture, **kw)
        if decode == "auto":  # opt-in for now: see AUTO_REASON
            return cls(decode, False, AUTO_REASON, capture, **kw)
        reason = model_reason(model)
        return cls(decode, not reason, reason, capture, **kw)

    def why_not(self, requests: Sequence[GenerationRequest], kv: kv_cache.KVVariant | None) -> str:
        """Why this call runs the plain loop ("" when it takes the static path)."""
        if not self.static:
            return self.reason
        if kv is not None and not isinstance(kv, kv_cache.Plain):
            return f"kv {kv.name}: {VARIANT_REASONS.get(kv.name, 'its own cache')}"
        if any(r.temperature > 0 for r in requests):
            return "sampling (temperature > 0): the plain loop's seeded generators"
        return ""

    def meta(self, reason: str) -> dict[str, object]:
        return {"path": "eager", "requested": self.requested, "reason": reason}

    # -- running ---------------------------------------------------------------------------

    @property
    def path(self) -> str:
        """The decode loop that runs (a part of the calibration key): ``static+graphs`` (the
        captured step costs a fraction of the eager one), ``static`` or ``eager``."""
        if not self.static:
            return "eager"
        return "static+graphs" if self.capture else "static"

    def run(self, dec: Stepper, batch: Batch) -> Decoded:
        """Decode ``batch`` after its prefill on a static cache: its prefill's ``DynamicCache``
        layers are released once copied; ``record``: the logits of the first ``record`` tokens
        of each row are kept (``Decoded.probes``)."""
        requests, logits, record = batch.requests, batch.logits, batch.record
        assert logits is not None  # a prefill's batch
        n = len(requests)
        used = batch.mask.shape[1]
        most = max(r.max_new_tokens for r in requests)
        rows, slots = bucket_rows(n), bucket_slots(used + most)
        prefix = cast("shared_prefix.SharedPrefix | None", batch.extra.get("shared_prefix"))
        # the plain cache's layers (``why_not``): an empty tensor of its kind: heads, head dim, dtype
        k0 = cast("list[DynamicLayer]", batch.cache.layers)[0].keys
        assert k0 is not None  # the prefill filled it
        like = k0.new_empty((0, k0.shape[1], 0, k0.shape[3]))
        del k0
        state, made = self._state(dec, rows, slots, prefix, like, len(batch.cache.layers))
        first = dec.pick(logits, requests, [None] * n)
        probes = [logits[:n].float().clone()] if record > 0 else []
        state.load(batch.cache, batch.mask, batch.positions, first, dec.pad_id)
        meta: dict[str, object] = {
            "path": "static",
            "requested": self.requested,
            "rows_bucket": rows,
            "cache_slots": slots,
            "check_every": self.check_every,
            "state": "new" if made else "reused",
        }
        with shared_prefix.active(dec.model):  # the steps' attention: the module docstring
            generated, done, meta["steps"] = self._steps(dec, batch, state, meta, probes)
        meta["graph"] = state.graph_status
        if state.graph_error:
            meta["fallback"] = state.graph_error
        if state.graph_check:
            meta["capture_check"] = state.graph_check
        per_row = [[step[b].cpu() for step in probes[:record]] for b in range(n)]
        return Decoded(generated, done, dec.now(), meta, per_row)

    def _steps(self, dec, batch, state, meta, probes):
        """Launch the steps in chunks of ``check_every`` (one at a time while logits are
        recorded) and read each chunk's tokens while the next runs: (tokens per row, done rows,
        steps run)."""
        requests, extra, record = batch.requests, batch.extra, batch.record
        n, used = len(requests), batch.mask.shape[1]
        timer = _Clock(dec.device, batch.t_first)
        generated: list[list[int]] = [[] for _ in requests]
        done: dict[int, dict[str, object]] = {}
        active = list(range(n))
        pending = [(state.fetch(n, used - 1, used), timer.mark(), 0, 1)]  # the first token
        launched, steps = 1, 0  # tokens per row launched; decode steps run
        t_prev = batch.t_first
        while True:
            want = max((requests[b].max_new_tokens for b in active), default=0)
            if active and launched < want and len(pending) < 2:
                todo = min(self.check_every, want - launched)
                if record > len(probes):  # one step at a time while logits are recorded
                    todo = 1
                for _ in range(todo):
                    out = state.step(dec, extra, meta, self)
                    if record > len(probes):
                        probes.append(out[:n].float().clone())
                col = used - 1 + launched
                pending.append((state.fetch(n, col, col + todo), timer.mark(), launched, todo))
                launched, steps = launched + todo, steps + todo
            if not pending:
                break
            (host, mark, c0, count) = pending.pop(0)
            tokens, t_end = host(), timer.at(mark)
            still = []
            for b in active:
                for i in range(count):
                    token = int(tokens[b][i])
                    generated[b].append(token)
                    reason, text = dec.finished(requests[b], generated[b], token)
                    if reason:  # this row's token i of the chunk: its share of the chunk's time
                        t = t_prev + (t_end - t_prev) * (i + 1) / count
                        done[b] = {"text": text, "finish_reason": reason, "t": t}
                        break
                else:
                    still.append(b)
            active, t_prev = still, t_end
            if not active:
                break
        return generated, done, steps

    def _state(
        self,
        dec: Stepper,
        rows: int,
        slots: int,
        prefix: shared_prefix.SharedPrefix | None,
        like: torch.Tensor,
        layers: int,
    ) -> tuple[_State, bool]:
        """A kept static cache for (rows, slots, shared prefix), or a new one (least recent
        dropped first, within ``MAX_STATES`` and ``STATE_MEMORY_SHARE``)."""
        import torch

        pkey = None if prefix is None else id(prefix[0][0])  # kept alive by the state
        key = (rows, slots, pkey, str(like.dtype), tuple(like.shape[1:2] + like.shape[3:]))
        if key in self.states:
            self.states.move_to_end(key)
            return self.states[key], False
        need = _State.bytes_for(rows, slots, like, layers)
        limit = None
        if like.device.type == "cuda":
            limit = STATE_MEMORY_SHARE * torch.cuda.get_device_properties(like.device).total_memory
        while self.states and (
            len(self.states) >= MAX_STATES
            or (limit and sum(s.bytes for s in self.states.values()) + need > limit)
        ):
            self.states.popitem(last=False)
        try:
            state = _State(dec, rows, slots, like, layers, prefix)
        except torch.OutOfMemoryError:  # kept states first, then try once more
            self.states.clear()
            torch.cuda.empty_cache()
            state = _State(dec, rows, slots, like, layers, prefix)
        state.capture = self.capture and not self.capture_error
        self.states[key] = state
        return state, True


class _Clock:
    """Chunk end times: CUDA events (no sync) on CUDA, the host clock elsewhere."""

    def __init__(self, device: torch.device, t0: float) -> None:
        import torch

        self.cuda = device.type == "cuda"
        self.t0 = t0
        if self.cuda:
            self.start = torch.cuda.Event(enable_timing=True)
            self.start.record()

    def mark(self) -> object:
        import torch

        if not self.cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def at(self, mark: Any) -> float:
        if not self.cuda:
            return mark
        mark.synchronize()
        return self.t0 + self.start.elapsed_time(mark) / 1e3


def _slot_layer_class():
    from transformers.cache_utils import StaticLayer

    class SlotLayer(StaticLayer):
        """A static layer whose keys/values are given (preallocated) and written at a shared
        device-side slot: one step writes one position for every row."""

        # given at construction, never None (the base's are None until its lazy initialization)
        keys: torch.Tensor
        values: torch.Tensor

        def __init__(self, keys: torch.Tensor, values: torch.Tensor, slot: torch.Tensor) -> None:
            super().__init__(max_cache_len=keys.shape[2])
            self.keys, self.values, self.slot = keys, values, slot
            self.device, self.dtype = keys.device, keys.dtype
            self.batch_size, self.num_heads = keys.shape[:2]
            self.k_head_dim = keys.shape[-1]
            self.v_head_dim = values.shape[-1]
            self.cumulative_length = slot
            self.is_initialized = True

        def update(
            self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
        ):
            self.keys.index_copy_(2, self.slot, key_states)
            self.values.index_copy_(2, self.slot, value_states)
            return self.keys, self.values

    return SlotLayer


class _State:
    """One static cache (rows x slots) with the step's inputs as fixed tensors, and its captured
    step. Every tensor is written in place, never replaced: a captured graph reads them."""

    @staticmethod
    def bytes_for(rows: int, slots: int, like: torch.Tensor, layers: int) -> int:
        return 2 * layers * rows * like.shape[1] * slots * like.shape[3] * like.element_size()

    def __init__(
        self,
        dec: Stepper,
        rows: int,
        slots: int,
        like: torch.Tensor,
        layers: int,
        prefix: shared_prefix.SharedPrefix | None,
    ):
        import torch
        from transformers.cache_utils import Cache

        dev, dtype = like.device, like.dtype
        shape = (rows, like.shape[1], slots, like.shape[3])
        self.keys = [torch.zeros(shape, dtype=dtype, device=dev) for _ in range(layers)]
        self.values = [torch.zeros(shape, dtype=dtype, device=dev) for _ in range(layers)]
        self.slot = torch.zeros(1, dtype=torch.long, device=dev)
        self.neg = torch.finfo(dtype).min
        self.mask = torch.full((rows, 1, 1, slots), self.neg, dtype=dtype, device=dev)
        self.ids = torch.zeros((rows, 1), dtype=torch.long, device=dev)
        self.pos = torch.zeros((rows, 1), dtype=torch.long, device=dev)
        self.tokens = torch.zeros((rows, slots), dtype=torch.long, device=dev)
        layer = _slot_layer_class()
        self.cache = Cache(
            layers=[layer(k, v, self.slot) for k, v in zip(self.keys, self.values, strict=True)]
        )
        self.prefix = prefix  # held: a captured step reads the prefix tensors it was captured with
        self.bytes = self.bytes_for(rows, slots, like, layers)
        self.capture = False
        self.graph: torch.cuda.CUDAGraph | None = None  # the captured step, once captured
        self.graph_out: torch.Tensor | None = None
        self.graph_status = "off"
        self.graph_error = ""
        self.graph_check: dict[str, object] = {}  # capture_agrees' figures

    def load(
        self,
        cache: Cache,
        mask: torch.Tensor,
        positions: torch.Tensor,
        first: torch.Tensor,
        pad_id: int,
    ) -> None:
        """The prefill's KV into slots [0, used) of the first n rows (the DynamicCache's layers
        are released as they are copied), the mask, the first token and the next positions."""
        n, used = mask.shape
        for i, layer in enumerate(cast("list[DynamicLayer]", cache.layers)):  # the plain cache's
            assert layer.keys is not None and layer.values is not None  # filled by the prefill
            self.keys[i][:n, :, :used].copy_(layer.keys)
            self.values[i][:n, :, :used].copy_(layer.values)
            layer.keys = layer.values = None
        self.mask.fill_(self.neg)
        own = self.mask[:n, 0, 0, :used]
        own.copy_(mask.to(own.device).eq(0).to(own.dtype) * self.neg)
        self.ids.fill_(pad_id)
        self.ids[:n, 0].copy_(first)
        self.pos.zero_()
        self.pos[:n].copy_(positions[:, -1:] + 1)
        self.slot.fill_(used)
        self.tokens[:n, used - 1].copy_(first)

    def fetch(self, n: int, c0: int, c1: int) -> object:
        """Tokens of columns [c0, c1) for the first n rows, copied to the host without waiting:
        a function that waits for them and returns them as lists."""
        import torch

        block = self.tokens[:n, c0:c1]
        if block.device.type != "cuda":
            host = block.clone()
            return host.tolist
        host = torch.empty(block.shape, dtype=block.dtype, pin_memory=True)
        host.copy_(block, non_blocking=True)
        event = torch.cuda.Event()
        event.record()

        def wait() -> list:
            event.synchronize()
            return host.tolist()

        return wait

    def _step(self, dec: Stepper, extra: dict) -> torch.Tensor:
        """One decode step for every row, all on the device: attend to the new slot, forward,
        pick greedily, record the token and advance position and slot."""
        self.mask.index_fill_(-1, self.slot, 0.0)
        logits = dec.model(
            input_ids=self.ids,
            attention_mask=self.mask,
            position_ids=self.pos,
            **{dec.cache_kw: self.cache},
            use_cache=True,
            **extra,
        ).logits[:, -1, :]
        nxt = logits.argmax(-1)
        self.ids.copy_(nxt[:, None])
        self.tokens.index_copy_(1, self.slot, nxt[:, None])
        self.pos.add_(1)
        self.slot.add_(1)
        return logits

    def step(self, dec: Stepper, extra: dict, meta: dict, owner: FastDecode) -> torch.Tensor:
        if self.graph is not None:
            self.graph.replay()
            assert self.graph_out is not None  # set with the graph
            return self.graph_out
        if not self.capture:
            return self._step(dec, extra)
        self.capture = False  # one try per state
        t0 = time.perf_counter()
        saved = self._inputs()
        try:
            out = self._capture(dec, extra, saved)
        except Exception as exc:  # noqa: BLE001 (recorded; the step runs uncaptured)
            import torch

            torch.cuda.synchronize()
            self._restore(saved)  # whatever ran, exactly one step stands: this one
            self.graph = None
            self.graph_error = f"capture failed: {type(exc).__name__}: {exc}"[:300]
            owner.capture_error = self.graph_error
            self.graph_status = "failed"
            return self._step(dec, extra)
        meta["capture_seconds"] = round(time.perf_counter() - t0, 4)
        return out

    def _inputs(self) -> list:
        """Copies of the step's inputs (token, position, slot, mask): what a step changes besides
        the KV at its slot (which the step that stands rewrites)."""
        return [t.clone() for t in (self.ids, self.pos, self.slot, self.mask)]

    def _restore(self, saved: list) -> None:
        for t, s in zip((self.ids, self.pos, self.slot, self.mask), saved, strict=True):
            t.copy_(s)

    def _capture(self, dec: Stepper, extra: dict, saved: list) -> torch.Tensor:
        """Run the step eagerly on a side stream (the warm-up capture needs), capture it from the
        same inputs, and replay it: the graph is kept only if its replay gives the eager run's
        tokens and logits within rounding (``capture_agrees``). Either way exactly one step
        stands (the replay's, or the eager run again). Returns that step's logits."""
        import torch

        def restore() -> None:
            self._restore(saved)

        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            eager = self._step(dec, extra).float().clone()
            eager_ids = self.ids.clone()
        torch.cuda.current_stream().wait_stream(stream)
        restore()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = self._step(dec, extra)
        restore()  # capture runs nothing, but keep the inputs exactly as before
        graph.replay()
        ok, self.graph_check = capture_agrees(eager, out.float(), eager_ids, self.ids, out.dtype)
        if not ok:
            self.graph_error = f"capture mismatch: {self.graph_check['why']}"
            self.graph_status = "mismatch"
            restore()
            return self._step(dec, extra)
        self.graph, self.graph_out, self.graph_status = graph, out, "captured"
        return out


def capture_agrees(
    eager: torch.Tensor,
    got: torch.Tensor,
    eager_ids: torch.Tensor,
    got_ids: torch.Tensor,
    dtype: torch.dtype,
) -> tuple[bool, dict]:
    """Whether a captured step's logits ``got`` (rows, vocab) and picks ``got_ids`` are the eager
    step's within rounding: every row within ``CAPTURE_ULPS`` units of ``dtype``'s rounding at
    its largest |logit| (float32: ``CAPTURE_FLOAT32_RTOL`` of it), and a row that picked another
    token only where the eager logits of the two picks are within twice that (a near-tie).
    Returns (agrees, figures for ``meta["decode"]["capture_check"]``)."""
    import torch

    eager, got = eager.float(), got.float()
    scale = eager.abs().amax(-1).clamp_min(1e-6)
    if dtype == torch.float32:
        tol = scale * CAPTURE_FLOAT32_RTOL
    else:
        tol = scale * (CAPTURE_ULPS * torch.finfo(dtype).eps)
    diff = (got - eager).abs().amax(-1)
    a, b = eager_ids.reshape(-1), got_ids.reshape(-1)
    flipped = (a != b).nonzero().flatten().tolist()
    gaps = {r: float(eager[r, a[r]] - eager[r, b[r]]) for r in flipped}
    far = [r for r in flipped if gaps[r] > 2 * float(tol[r])]
    over = (diff > tol).nonzero().flatten().tolist()
    figures: dict[str, object] = {
        "max_abs_diff": round(float(diff.max()), 5),
        "tolerance": round(float(tol[diff.argmax()]), 5),  # at the row of the largest difference
        "rows": int(eager.shape[0]),
        "near_tie_flips": len(flipped) - len(far),
    }
    why = []
    if over:
        r = over[0]
        why.append(f"row {r}: max |logit diff| {float(diff[r]):.3g} > {float(tol[r]):.3g}")
    if far:
        r = far[0]
        why.append(
            f"row {r} picked {int(b[r])} not {int(a[r])}, {gaps[r]:.3g} below in the eager logits"
        )
    if why:
        figures["why"] = "; ".join(why)
    return not why, figures
