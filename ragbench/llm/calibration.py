"""What a request would cost alone: measured per-model, per-device rates, and the fair split.

Why: a padded batch (or a whole ``generate`` call) is timed as one piece of device work, and its
rows did very different amounts of it. Splitting the time evenly charged a 57-token question as
much as its 4k-token batch mates; splitting by FLOPs misses that on a CPU a short request's time
is mostly per-step overhead (a decode step of one token costs about what a 30-token prefill
does). So each row is charged in proportion to its *stand-alone* cost, estimated from its own
work with rates measured on this model and device:

* one forward pass of ``n`` new tokens after ``p`` positions already in the KV cache:
  ``a + b*n + c*n*(p + (n+1)/2)`` seconds (fixed overhead, per-token dense work, attention over
  the positions each token sees; the same shape as ``cost.forward_flops``);
* one decode step of a batch of ``r`` rows over ``k`` KV positions:
  ``d0 + d_row*(r-1) + d1*r*k`` (a stand-alone request has ``r = 1``);
* forward passes after a prefix read through shared-prefix attention (``shared_prefix.py``) have
  their own attention slopes (``c_shared``, ``d1_shared``): plain torch matmuls, not SDPA.

A request alone = the prefix prefill if it computed the prefix + its suffix prefill + one decode
step per further token. ``split_seconds`` then divides a measured total in proportion to those
estimates, so the shares add up exactly to the measured time and every row of it saves (or, with
padding, pays) by the same factor.

How the rates are measured: :func:`measure` times a handful of forward passes on random token
ids after a *random* KV cache (timing does not depend on the values; filling a 4k-position cache
with random tensors costs nothing, prefilling one would cost seconds): prefills of 16/128/512
tokens, 128 tokens after 2048 cached positions, decode steps at 16/1024/4096 positions, a
4-row step, and the shared-prefix variants. Each probe keeps its fastest of a few repetitions:
on a shared machine noise only ever adds time. This takes a few seconds once per model, device,
dtype and thread count (announced on stderr; sweep workers wait for one another under a file
lock, see :func:`rates_for`); the rates are cached as JSON under ``assets.cache_dir()/calibration``
keyed by that identity (see :func:`calibration_key`), so later loads read them. We chose
measuring at load over fitting online from observed batches because the split then does not
depend on what ran before (the same batch is split the same way in every run) and a batch's
time alone cannot separate its rows' costs, which is the very thing to estimate. The same
estimate, not a share of measured time, is what the default cost basis charges (``modelled
seconds``, ``ragbench.cost.prices.modelled_seconds``): it depends on tokens and these rates only.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from filelock import FileLock
from tqdm import tqdm

from ragbench import assets
from ragbench.io import atomic_write_text
from ragbench.llm import shared_prefix

log = logging.getLogger(__name__)

CALIBRATION_VERSION = 2  # bump when the probes or the cost model change: old files are ignored

# ------------------------------------------------------------------------ the cost model (pure)


@dataclass(frozen=True)
class Rates:
    """Seconds per unit of work on one model and device (see the module docstring)."""

    a: float  # fixed seconds of one forward pass
    b: float  # seconds per new token
    c: float  # seconds per (new token x position it attends to), plain attention
    d0: float  # fixed seconds of one decode step
    d1: float  # seconds per KV position read by one row in a decode step, plain attention
    d_row: float = 0.0  # seconds per extra row of a batched decode step
    c_shared: float | None = None  # c when the positions are a shared prefix (None: as c)
    d1_shared: float | None = None  # d1 when the positions are a shared prefix (None: as d1)
    meta: dict[str, Any] = field(default_factory=dict)  # key, probes, when: provenance only

    def forward(self, new: int, past: int = 0, shared_past: int = 0) -> float:
        """One forward pass of ``new`` tokens after ``past`` plain and ``shared_past`` shared-prefix
        positions (batch of one)."""
        if new <= 0:
            return 0.0
        c_shared = self.c if self.c_shared is None else self.c_shared
        seen = past + (new + 1) / 2  # mean positions attended per new token, causal
        return self.a + self.b * new + self.c * new * seen + c_shared * new * shared_past

    def decode(self, steps: int, first_kv: int, shared_past: int = 0) -> float:
        """``steps`` decode steps of one row, the first over ``first_kv`` positions (its own,
        plain), each next one over one more; plus ``shared_past`` shared-prefix positions."""
        if steps <= 0:
            return 0.0
        d1_shared = self.d1 if self.d1_shared is None else self.d1_shared
        kv_sum = steps * first_kv + steps * (steps - 1) / 2  # arithmetic series
        return steps * (self.d0 + d1_shared * shared_past) + self.d1 * kv_sum

    def alone(
        self,
        prompt_tokens: int,
        completion_tokens: int,
        prefix_tokens: int = 0,
        prefix_computed: bool = True,
        shared: bool = False,
    ) -> float:
        """Seconds one request would take on its own: its prefix prefill (if it computed the
        prefix rather than reusing a cached one), its suffix prefill after the prefix, and a
        decode step for every completion token after the first (the prefill emits the first)."""
        suffix = prompt_tokens - prefix_tokens
        seconds = self.forward(prefix_tokens) if prefix_tokens and prefix_computed else 0.0
        plain, via_shared = (0, prefix_tokens) if shared else (prefix_tokens, 0)
        seconds += self.forward(suffix, plain, via_shared)
        # decode step j (1-based) feeds completion token j: the suffix and j own positions
        first_kv = (suffix if shared else prompt_tokens) + 1
        return seconds + self.decode(completion_tokens - 1, first_kv, via_shared)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Rates:
        return cls(**data)


def split_seconds(total: float, estimates: list[float]) -> list[float]:
    """``total`` split in proportion to ``estimates`` (each row's stand-alone seconds); the shares
    add up to ``total``. All estimates zero (nothing known): an even split."""
    if not estimates:
        return []
    weight = sum(max(e, 0.0) for e in estimates)
    if weight <= 0:
        return [total / len(estimates)] * len(estimates)
    shares = [total * max(e, 0.0) / weight for e in estimates]
    shares[-1] = total - sum(shares[:-1])  # exact sum despite float rounding
    return shares


# ------------------------------------------------------------------------ fitting (pure)


def fit(prefill: list[tuple[int, int, float]], decode: list[tuple[int, int, float]]) -> Rates:
    """Rates from probe timings: ``prefill`` = [(new, past, seconds)] (plain, batch of one),
    ``decode`` = [(kv, rows, seconds)] (one step). Non-negative least squares on relative errors,
    so the short probes weigh as much as the long ones."""
    import numpy as np
    from scipy.optimize import nnls

    def solve(rows: list[list[float]], seconds: list[float]) -> list[float]:
        x, y = np.asarray(rows, float), np.asarray(seconds, float)
        w = 1.0 / np.maximum(y, 1e-9)
        coef, _ = nnls(x * w[:, None], y * w)
        return [float(v) for v in coef]

    a, b, c = solve(
        [[1.0, n, n * (p + (n + 1) / 2)] for n, p, _ in prefill], [t for *_, t in prefill]
    )
    single = [(k, t) for k, r, t in decode if r == 1]
    d0, d1 = solve([[1.0, k] for k, _ in single], [t for _, t in single])
    extra = [(t - d0 - d1 * r * k) / (r - 1) for k, r, t in decode if r > 1]
    d_row = max(0.0, sum(extra) / len(extra)) if extra else 0.0
    return Rates(a=a, b=b, c=c, d0=d0, d1=d1, d_row=d_row)


# ------------------------------------------------------------------------ measuring (torch)

PREFILL_PROBES = ((16, 0), (128, 0), (512, 0), (2048, 0), (128, 2048))  # (new, cached)
DECODE_PROBES = ((16, 1), (1024, 1), (4096, 1), (16, 4))  # (KV positions, rows)
SHARED_PROBES = (32, 4096)  # suffix tokens of a prefill, and prefix positions, shared attention


def calibration_key(decoder: Any, weights: str) -> dict[str, Any]:
    """What the rates depend on: weights, device (and which one), dtype, attention, threads,
    packed weights."""
    import torch
    import transformers

    dev = decoder.device
    if dev.type == "cuda":
        hardware = torch.cuda.get_device_name(dev)
    else:
        hardware = cpu_name()
    config = decoder.model.config
    return {
        "version": CALIBRATION_VERSION,
        "weights": weights,
        "device": dev.type,
        "hardware": hardware,
        "dtype": str(next(decoder.model.parameters()).dtype).removeprefix("torch."),
        "attention": str(getattr(config, "_attn_implementation", "")),
        "threads": torch.get_num_threads() if dev.type == "cpu" else 0,
        "packed_linear": decoder.packed is not None,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
    }


def cpu_name() -> str:
    """This machine's CPU model (``/proc/cpuinfo``): a CPU calibration's ``hardware``."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


_MEMO: dict[str, Rates] = {}
LOCK = ".lock"  # one calibration at a time per cache folder (see rates_for)


def calibration_path(key: dict[str, Any], cache_dir: str | os.PathLike | None = None) -> Path:
    """The cache file of the rates measured under ``key`` (``calibration_key``)."""
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:24]
    folder = Path(cache_dir) if cache_dir is not None else assets.cache_dir()
    return folder / "calibration" / f"{digest}.json"


def _read(path: Path) -> Rates | None:
    if not path.is_file():
        return None
    try:
        rates = Rates.from_dict(json.loads(path.read_text(encoding="utf-8")))
    except (ValueError, TypeError, OSError):
        return None  # unreadable or from another layout: measure again
    return Rates(**{**asdict(rates), "meta": {**rates.meta, "path": str(path)}})


def announce(message: str) -> None:
    """One line on stderr that a progress bar does not tear (and the same in the log): slow
    one-time work (a model load, a calibration) must not pass for a hung run."""
    log.info("%s", message)
    tqdm.write(message, file=sys.stderr)


def rates_for(decoder: Any, weights: str, cache_dir: str | os.PathLike | None = None) -> Rates:
    """The rates of this model on this device: memoised in the process, cached on disk, else
    measured now and written for next time.

    Sweep workers on one machine share the cache: the measuring happens under one file lock per
    cache folder, so a second worker with the same key waits for the first and reads its file
    instead of measuring again (and two calibrations never time each other's load). The file is
    written atomically (``ragbench.io``): a reader sees the old file or the new one."""
    key = calibration_key(decoder, weights)
    path = calibration_path(key, cache_dir)
    if str(path) in _MEMO:
        return _MEMO[str(path)]
    rates = _read(path)
    if rates is None:
        path.parent.mkdir(parents=True, exist_ok=True)
        with FileLock(str(path.parent / LOCK)):
            rates = _read(path)  # another worker measured it while this one waited
            if rates is None:
                threads = f" ({key['threads']} threads)" if key["device"] == "cpu" else ""
                announce(
                    f"calibrating {weights or 'the model'} on {key['hardware']}{threads}, once "
                    f"per model/device/dtype/thread count; cached at {path}"
                )
                measured = measure(decoder)
                rates = Rates(**{**asdict(measured), "meta": {**measured.meta, "key": key}})
                atomic_write_text(path, json.dumps(rates.to_dict(), indent=1, sort_keys=True))
                rates = Rates(**{**asdict(rates), "meta": {**rates.meta, "path": str(path)}})
    _MEMO[str(path)] = rates
    return rates


def describe(rates: Rates | None) -> dict[str, Any] | None:
    """What a manifest records about the calibration that priced a run: its identity (the key
    and the cache file), when it was measured, and the rates themselves."""
    if rates is None:
        return None
    meta = rates.meta or {}
    numbers = {k: v for k, v in asdict(rates).items() if k != "meta"}
    return {"key": meta.get("key"), "path": meta.get("path"),
            "measured_at": meta.get("measured_at"), "rates": numbers}  # fmt: skip


def cached_rates(match: dict[str, Any], cache_dir: str | os.PathLike | None = None) -> Rates | None:
    """The newest cached calibration whose key has every item of ``match`` (say ``{"weights":
    ..., "device": "cpu", "threads": 2}``), without loading the model: what a dry run can price
    a device-hour sheet with. None when no such calibration was measured on this machine."""
    folder = (Path(cache_dir) if cache_dir is not None else assets.cache_dir()) / "calibration"
    found = [r for p in sorted(folder.glob("*.json")) if (r := _read(p)) is not None]
    fits = [r for r in found
            if all((r.meta.get("key") or {}).get(k) == v for k, v in match.items())
            and (r.meta.get("key") or {}).get("version") == CALIBRATION_VERSION]  # fmt: skip
    return max(fits, key=lambda r: str(r.meta.get("measured_at", "")), default=None)


def measure(decoder: Any, rounds: int = 3) -> Rates:
    """Time the probes on ``decoder``'s model and fit the rates. The probes run interleaved, one
    of each per round, and each keeps its fastest round: on a shared machine noise only adds
    time, and interleaving exposes every probe to the same background load, so the *ratios*
    between rates (all that the split uses) are not skewed by a busy moment."""
    import torch

    gen = torch.Generator().manual_seed(0)  # deterministic token ids; values do not matter
    window = int(getattr(decoder.model.config, "max_position_embeddings", 0) or 1 << 30)
    kv: dict[tuple[int, int], Any] = {}  # random KV tensors by (rows, positions), made once
    probes: dict[tuple[str, int, int, int], Any] = {}
    for n, p in PREFILL_PROBES:  # a small window (a test model) gets the probes scaled into it
        n, p = min(n, window // 4), min(p, window // 2)
        probes[("prefill", n, p, 1)] = (n, p, 1, False)
    for k, r in DECODE_PROBES:
        k = max(2, min(k, window * k // 4096))
        probes[("decode", k, 0, r)] = (1, k - 1, r, False)
    n, p = SHARED_PROBES
    n, p = min(n, window // 8), min(p, window // 2)
    if _shared_supported(decoder):
        probes[("shared_prefill", n, p, 1)] = (n, p, 1, True)
        probes[("shared_decode", 1, p, 1)] = (1, p, 1, True)
    best = dict.fromkeys(probes, float("inf"))
    with torch.inference_mode():
        _forward(decoder, gen, kv, 16, 0, 1, False)  # warm-up: the first call allocates
        for _ in range(rounds):
            for name, args in probes.items():
                best[name] = min(best[name], _forward(decoder, gen, kv, *args))
    prefill = [(n, p, t) for (kind, n, p, _), t in best.items() if kind == "prefill"]
    decode = [(n, r, t) for (kind, n, _, r), t in best.items() if kind == "decode"]
    rates = fit(prefill, decode)
    shared = {}
    for (kind, n, p, _), t in best.items():
        # what the plain model leaves unexplained, per shared position
        if kind == "shared_prefill":
            shared["c_shared"] = max(0.0, (t - rates.forward(n)) / (n * p))
        elif kind == "shared_decode":
            shared["d1_shared"] = max(0.0, (t - rates.d0 - rates.d1) / p)
    meta = {
        "probes": {"/".join(map(str, name)): round(t, 6) for name, t in best.items()},
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    return Rates(**{**asdict(rates), **shared, "meta": meta})


def _shared_supported(decoder: Any) -> bool:
    return shared_prefix.supported(decoder.model)


def _random_cache(decoder: Any, gen: Any, kv: dict, rows: int, positions: int) -> Any:
    """A KV cache of ``positions`` random keys/values per layer (timing ignores the values); the
    random tensors are made once per shape in ``kv`` (each cache copies them as it fills)."""
    import torch
    from transformers import DynamicCache

    config = decoder.model.config
    cache = DynamicCache(config=config)
    if positions <= 0:
        return cache
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    dtype = next(decoder.model.parameters()).dtype
    if (rows, positions) not in kv:
        shape = (rows, kv_heads, positions, head_dim)
        kv[rows, positions] = torch.randn(shape, generator=gen).to(decoder.device, dtype)
    for layer in range(config.num_hidden_layers):
        cache.update(kv[rows, positions], kv[rows, positions], layer)
    return cache


def _forward(
    decoder: Any, gen: Any, kv: dict, new: int, past: int, rows: int, shared: bool
) -> float:
    """Seconds of one forward pass of ``rows`` x ``new`` tokens after ``past`` cached positions,
    through the same arguments the decoder uses (``shared``: the past is a shared prefix)."""
    import contextlib

    import torch

    vocab = int(decoder.model.config.vocab_size)
    ids = torch.randint(0, vocab, (rows, new), generator=gen).to(decoder.device)
    extra: dict[str, Any] = {}
    if shared:
        extra["shared_prefix"] = shared_prefix.SharedPrefix(
            _random_cache(decoder, gen, kv, 1, past)
        )
        cache, lead = _random_cache(decoder, gen, kv, rows, 0), 0
    else:
        cache, lead = _random_cache(decoder, gen, kv, rows, past), past
    mask = torch.ones((rows, lead + new), dtype=torch.long, device=decoder.device)
    positions = torch.arange(past, past + new, device=decoder.device)[None].expand(rows, new)
    attention = shared_prefix.active(decoder.model) if shared else contextlib.nullcontext()
    # the decode loop's packed weights (CPU, 3-96 rows): rates of the code path that runs
    packed = decoder.packed.active() if decoder.packed else contextlib.nullcontext()
    with attention, packed:
        t0 = decoder.now()
        decoder.model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=positions,
            **{decoder.cache_kw: cache},
            use_cache=True,
            **decoder.last_logits_only,
            **extra,
        )
        return decoder.now() - t0
