"""What a request would cost alone: measured per-model, per-device rates, and the fair split.

One job: measuring the cost model on the device and caching it (the probes are chosen for the
model's shape, the cache key names the probes). The shape, ``Rates``, the split and the fit are
``cost_model.py`` (pure).

Why: a padded batch (or a whole ``generate`` call) is timed as one piece of device work, and its
rows did very different amounts of it. Splitting the time evenly charged a 57-token question as
much as its 4k-token batch mates; splitting by FLOPs misses that on a CPU a short request's time
is mostly per-step overhead (a decode step of one token costs about what a 30-token prefill
does). So each row is charged in proportion to its *stand-alone* cost, estimated from its own
work with rates measured on this model and device:

* one forward pass of ``n`` new tokens after ``p`` positions already in the KV cache:
  ``max(floor, a + b*n + c*n*(p + (n+1)/2))`` seconds (fixed overhead, per-token dense work,
  attention over the positions each token sees; the same shape as ``cost.forward_flops``), never
  less than ``floor``: on a GPU a short forward pass is launch-bound (its time is flat, whatever
  its tokens) until the matmuls fill the device. A fit of ``a + b*n + c*n*p`` alone to such a
  device put the flat time into ``a`` and the dense work into the attention term ``c``, and
  overcharged long context 2.4x at 16k tokens and 4x at 30k on an H200. On a CPU ``floor`` fits
  to about 0 and the model is the plain sum;
* one decode step of a batch of ``r`` rows over ``k`` KV positions:
  ``d0 + d_row*(r-1) + d1*r*k`` (a stand-alone request has ``r = 1``);
* forward passes after a prefix read through shared-prefix attention (``shared_prefix.py``) have
  their own attention slopes (``c_shared``, ``d1_shared``): plain torch matmuls, not SDPA.

A request alone = the prefix prefill if it computed the prefix + its suffix prefill + one decode
step per further token. ``split_seconds`` then divides a measured total in proportion to those
estimates, so the shares add up exactly to the measured time and every row of it saves (or, with
padding, pays) by the same factor.

How the rates are measured: :func:`measure` times forward passes on random token ids after a
*random* KV cache (timing does not depend on the values; filling a 4k-position cache with random
tensors costs nothing, prefilling one would cost seconds) at the lengths the run will use
(:func:`probe_plan`): prefills doubling from 16 tokens to the run's longest prompt (on CUDA at
least 8k), a prefill after half the longest cached, decode steps at KV lengths up to the longest,
a 4-row step, and the shared-prefix variants. The longest prefill is held out: the rates fitted
without it predict it, and that relative error is ``validation_error`` (the manifest records it;
above 10% the run warns once with the figure); the rates the run uses are then fitted on every
probe. The cache key names the probed length (quarter-octave steps), so a run with longer
prompts measures again and one with shorter prompts reads a longer calibration. A prefill probe
keeps its fastest of a few repetitions (noise only ever adds time); a decode step, which varies by
10-30% from step to step even on a quiet CPU, its median. This takes from seconds (a GPU) to a
minute (8k tokens on a 2-core CPU) once per model, device, dtype, thread count and length (announced on stderr; sweep workers wait for one another under a file
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
import statistics
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from filelock import FileLock
from tqdm import tqdm

from ragbench import assets
from ragbench.io import atomic_write_text
from ragbench.llm import shared_prefix
from ragbench.llm.cost_model import Rates, fit, relative_error
from ragbench.types import GenerationRequest

log = logging.getLogger(__name__)

CALIBRATION_VERSION = 5  # bump when the probes or the cost model change: old files are ignored

# ------------------------------------------------------------------------ measuring (torch)

DEFAULT_LONGEST = {"cpu": 2048, "cuda": 8192}  # probed when the run names no longest prompt
CUDA_MIN_LONGEST = 8192  # a GPU is launch-bound below a few thousand tokens: probe past that
WARN_ERROR = 0.10  # a validation error above this is announced once


def probed_length(longest: int | None, window: int, device: str) -> int:
    """The length a calibration probes to: the run's longest prompt (on CUDA at least 8k) rounded
    up to a quarter of its power of two (4,212 -> 5,120: the held-out probe is the costliest, a
    whole octave more would double it), within the model's window. The cache key names it."""
    want = longest or DEFAULT_LONGEST.get(device, DEFAULT_LONGEST["cpu"])
    if device == "cuda":
        want = max(want, CUDA_MIN_LONGEST)
    return max(16, min(_quarter_up(want), window))


def _quarter_up(n: int) -> int:
    """``n`` rounded up to a quarter-octave: a multiple of an eighth of the power of two at or
    above it (a quarter of the octave below it)."""
    step = max(2, (1 << max(4, int(n - 1).bit_length())) // 8)
    return -(-n // step) * step


def longer_lengths(probed: int, window: int) -> list[int]:
    """``probed`` and every longer probed length up to the window: a calibration probed to any of
    them serves a run that needs ``probed``."""
    lengths = [probed]
    while lengths[-1] < min(window, 1 << 24):
        lengths.append(min(_quarter_up(lengths[-1] + 1), window))
    return lengths


@dataclass(frozen=True)
class ProbePlan:
    """What :func:`measure` times, for a calibration probed to ``longest`` tokens."""

    prefill: tuple[tuple[int, int], ...]  # (new, cached) fitted: new tokens on an empty cache
    holdout: tuple[int, int]  # the longest prefill: predicted by the fit without it
    after_cached: tuple[int, int]  # (new, cached): a check of the fit, recorded, not fitted
    decode: tuple[tuple[int, int], ...]  # (KV positions, rows)
    shared: tuple[int, int]  # (suffix tokens, shared-prefix positions)


def probe_plan(longest: int) -> ProbePlan:
    """Prefills doubling from 16 tokens (fewer for a tiny window) up to ``longest`` (held out);
    a check of ``longest/16`` tokens after ``longest/2`` cached; decode steps at KV lengths from
    16 up to ``longest`` (x4 apart) and one 4-row step; shared-prefix attention after
    ``longest/2``. The fit reads the prefills on an empty cache only: on an H200 a prefill after a
    cached past (a rectangle of attention, masked) ran at another efficiency than the causal
    square, and fitting both into one ``c`` missed a 32k prompt by 44%."""
    start = min(16, max(1, longest // 16))
    sizes, n = [], start
    while n < longest:
        sizes.append((n, 0))
        n *= 2
    half = max(1, longest // 2)
    kvs, k = [], min(16, max(2, longest // 8))
    while k < longest:
        kvs.append((k, 1))
        k *= 4
    decode = (*kvs, (longest, 1), (kvs[0][0] if kvs else 2, 4))
    after = (max(1, longest // 16), half)
    return ProbePlan(
        tuple(sizes), (longest, 0), after, decode, (min(32, max(1, longest // 8)), half)
    )


def calibration_key(decoder: Any, weights: str, probed_tokens: int | None = None) -> dict[str, Any]:
    """What the rates depend on: weights, device (and which one), dtype, attention, threads,
    packed weights, and the length the probes reached (``probed_length``)."""
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
        "probed_tokens": probed_tokens or probed_length(None, window_of(decoder), dev.type),
        "decode_path": decode_path(decoder),
    }


def decode_path(decoder: Any) -> str:
    """Which decode loop the loop probe times: ``fused`` (the CPU step, ``hf/fused.py``),
    ``static+graphs``, ``static`` (``hf/static.py``) or ``eager``. A part of the key: the captured
    step costs a fraction of the eager one, the fused step about half of it on a CPU."""
    fast = getattr(decoder, "fast", None)
    return getattr(fast, "path", "eager") if fast is not None else "eager"


def window_of(decoder: Any) -> int:
    """The positions a model reads (its config's ``max_position_embeddings``)."""
    config = getattr(getattr(decoder, "model", None), "config", None)
    return int(getattr(config, "max_position_embeddings", 0) or 1 << 30)


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


def rates_for(
    decoder: Any,
    weights: str,
    cache_dir: str | os.PathLike | None = None,
    longest: int | None = None,
) -> Rates:
    """The rates of this model on this device, probed to the run's ``longest`` prompt (tokens;
    None: ``DEFAULT_LONGEST``): memoised in the process, cached on disk (a calibration probed to
    a longer length serves too), else measured now and written for next time.

    Sweep workers on one machine share the cache: the measuring happens under one file lock per
    cache folder, so a second worker with the same key waits for the first and reads its file
    instead of measuring again (and two calibrations never time each other's load). The file is
    written atomically (``ragbench.io``): a reader sees the old file or the new one."""
    window = window_of(decoder)
    key = calibration_key(decoder, weights)
    probed = probed_length(longest, window, key["device"])
    key["probed_tokens"] = probed
    # this length and every longer power of two up to the window (a longer probe range serves)
    lengths = longer_lengths(probed, window)
    paths = [calibration_path({**key, "probed_tokens": n}, cache_dir) for n in lengths]
    for path in paths:
        if str(path) in _MEMO:
            return _MEMO[str(path)]
    rates = _read_first(paths)
    if rates is None:
        path = paths[0]
        path.parent.mkdir(parents=True, exist_ok=True)
        with FileLock(str(path.parent / LOCK)):
            rates = _read_first(paths)  # another worker measured it while this one waited
            if rates is None:
                threads = f" ({key['threads']} threads)" if key["device"] == "cpu" else ""
                announce(
                    f"calibrating {weights or 'the model'} on {key['hardware']}{threads} up to "
                    f"{probed:,} tokens, once per model/device/dtype/thread count/length; cached "
                    f"at {path}"
                )
                measured = measure(decoder, probed)
                rates = Rates(**{**asdict(measured), "meta": {**measured.meta, "key": key}})
                atomic_write_text(path, json.dumps(rates.to_dict(), indent=1, sort_keys=True))
                rates = Rates(**{**asdict(rates), "meta": {**rates.meta, "path": str(path)}})
    warn_validation(rates)
    _MEMO[rates.meta.get("path") or str(paths[0])] = rates
    return rates


def _read_first(paths: list[Path]) -> Rates | None:
    for path in paths:
        rates = _read(path)
        if rates is not None:
            return rates
    return None


_WARNED: set[str] = set()


def warn_validation(rates: Rates) -> None:
    """Once per calibration and process: a fit that missed its held-out probe by more than
    ``WARN_ERROR`` says so with the figure (its dollars are that uncertain at long prompts)."""
    check = (rates.meta or {}).get("validation") or {}
    error, where = check.get("error"), str((rates.meta or {}).get("path"))
    if error is None or error <= WARN_ERROR or where in _WARNED:
        return
    _WARNED.add(where)
    announce(
        f"warning: the calibrated cost model misses its held-out probe ({check.get('tokens'):,} "
        f"tokens: modelled {check.get('modelled'):.4g} s, measured {check.get('measured'):.4g} s) "
        f"by {100 * error:.1f}% (> {100 * WARN_ERROR:.0f}%): modelled seconds at long prompts are "
        "that uncertain; cost_basis: measured charges measured device time instead"
    )


def describe(rates: Rates | None) -> dict[str, Any] | None:
    """What a manifest records about the calibration that priced a run: its identity (the key
    and the cache file), when it was measured, and the rates themselves."""
    if rates is None:
        return None
    meta = rates.meta or {}
    numbers = {k: v for k, v in asdict(rates).items() if k != "meta"}
    check = meta.get("validation") or {}
    return {"key": meta.get("key"), "path": meta.get("path"),
            "measured_at": meta.get("measured_at"), "rates": numbers,
            "probed_tokens": (meta.get("key") or {}).get("probed_tokens"),
            "validation_error": check.get("error"), "validation": check or None}  # fmt: skip


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


def measure(
    decoder: Any,
    longest: int | None = None,
    rounds: int = 3,
    timer: Any = None,
    loop_timer: Any = None,
) -> Rates:
    """Time the probes of ``probe_plan(longest)`` on ``decoder``'s model and fit the rates.

    The probes run interleaved, one of each per round, so every probe sees the same background
    load; a prefill keeps its fastest round, a decode step its median. How often each is timed: :func:`_rounds_for`. ``timer(new, past, rows, shared)``
    returns a probe's seconds (default: a real forward pass, :func:`_forward`); a test passes a
    clock of its own. The longest prefill is held out of the fit and predicted by it: that
    relative error is ``meta["validation"]["error"]``; the returned rates are then fitted on
    every probe.

    A decode step of the decoder's loop is more than its forward pass: the loop picks the token,
    checks the stop conditions (detokenising), grows the mask, and waits for the device each step.
    On an H200 the 8B forward took 20 ms and the loop's step 22-34 ms, so the bare probes charged
    long-context requests' decode 25% short. ``loop_timer(steps)`` (default: the decoder's own
    loop, :func:`_loop_step`) gives seconds per step of that loop at a short cache; ``d0`` is set
    from it (the KV slope ``d1`` stays the bare probes'), also when it is less than a bare
    forward pass: the static path's captured step (``hf/static.py``) is."""
    import torch

    window = window_of(decoder) if timer is None else 1 << 30
    device = getattr(getattr(decoder, "device", None), "type", "cpu")
    longest = min(longest or DEFAULT_LONGEST["cpu"], window)
    plan = probe_plan(longest)
    if timer is None:
        gen = torch.Generator().manual_seed(0)  # deterministic token ids; values do not matter
        kv: dict[tuple[int, int], Any] = {}  # random KV tensors by (rows, positions), made once

        def timer(new: int, past: int, rows: int, shared: bool) -> float:
            return _forward(decoder, gen, kv, (new, past, rows, shared))

        shared_ok = _shared_supported(decoder)
        if loop_timer is None:

            def loop_timer(steps: int) -> float:
                return _loop_step(decoder, gen, steps)

    else:
        shared_ok = True
    probes: dict[tuple[str, int, int, int], tuple[int, int, int, bool]] = {}
    for n, p in (*plan.prefill, plan.holdout, plan.after_cached):
        probes[("prefill", n, p, 1)] = (n, p, 1, False)
    for k, r in plan.decode:
        probes[("decode", k, 0, r)] = (1, k - 1, r, False)
    n, p = plan.shared
    if shared_ok:
        probes[("shared_prefill", n, p, 1)] = (n, p, 1, True)
        probes[("shared_decode", 1, p, 1)] = (1, p, 1, True)
    times: dict[Any, list[float]] = {name: [] for name in probes}
    loop_times: list[float] = []
    with torch.inference_mode():
        timer(16, 0, 1, False)  # warm-up: the first call allocates
        for round_ in range(max(rounds, FAST_ROUNDS)):
            if loop_timer is not None:  # interleaved too: a GPU host's speed drifts for seconds
                loop_times.append(loop_timer(LOOP_STEPS))
            for name, args in probes.items():
                if round_ >= _rounds_for(min(times[name], default=float("inf")), rounds, device):
                    continue
                times[name].append(timer(*args))
    # a prefill keeps its fastest round (noise and one-off work only add time); a decode step,
    # tens of milliseconds that vary by 10-30% from step to step even on a quiet CPU, its median:
    # what the run's steps take on the whole, not the luckiest one
    best = {name: statistics.median(t) if name[0].endswith("decode") else min(t)
            for name, t in times.items()}  # fmt: skip
    prefill = [(n, p, t) for (kind, n, p, _), t in best.items() if kind == "prefill" and not p]
    decode = [(n, r, t) for (kind, n, _, r), t in best.items() if kind == "decode"]
    held = next(x for x in prefill if (x[0], x[1]) == plan.holdout)
    after = (*plan.after_cached, best[("prefill", *plan.after_cached, 1)])
    without = fit([x for x in prefill if x is not held], decode)
    rates = fit(prefill, decode)
    loop = None
    if loop_timer is not None:  # the decode loop's step at a short cache, median of its rounds
        loop = statistics.median(loop_times)
        rates = replace(rates, d0=max(0.0, loop - rates.d1 * LOOP_KV))
        without = replace(without, d0=rates.d0)
    shared = {}
    for (kind, n, p, _), t in best.items():
        # what the plain model leaves unexplained, per shared position
        if kind == "shared_prefill":
            shared["c_shared"] = max(0.0, (t - rates.forward(n)) / (n * p))
        elif kind == "shared_decode":
            shared["d1_shared"] = max(0.0, (t - rates.d0 - rates.d1) / p)
    meta = {
        "probes": {"/".join(map(str, name)): round(t, 6) for name, t in best.items()},
        "validation": {
            "tokens": held[0],
            "measured": round(held[2], 6),
            "modelled": round(without.forward(held[0]), 6),
            "error": round(relative_error(without, held), 4),
        },
        # a prefill after a cached past, against the fit (recorded, not fitted, not warned on)
        "after_cached": {
            "new": after[0],
            "cached": after[1],
            "measured": round(after[2], 6),
            "modelled": round(rates.forward(after[0], after[1]), 6),
            "error": round(relative_error(rates, after), 4),
        },
        "decode_loop_step": None if loop is None else round(loop, 6),
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    return Rates(**{**asdict(rates), **shared, "meta": meta})


LOOP_STEPS = 16  # decode steps the loop probe times
LOOP_KV = 16 + LOOP_STEPS // 2  # its mean KV positions: a 16-token prompt


def _loop_step(decoder: Any, gen: Any, steps: int) -> float:
    """Seconds per decode step of the decoder's own loop (``Decoder.decode``): a 16-token random
    prompt decoded ``steps + 1`` tokens with end-of-sequence ignored, its decode time (first
    token to last) over ``steps``."""
    import torch

    vocab = int(decoder.model.config.vocab_size)
    ids = torch.randint(0, vocab, (16,), generator=gen).tolist()
    endless = replace(decoder, eos_ids=frozenset())  # random tokens may say EOS: run every step
    request = GenerationRequest("calibration", max_new_tokens=steps + 1)
    row = endless.decode([request], [ids], None, 0, False, 0)[0]
    return row["decode_seconds"] / max(1, row["completion_tokens"] - 1)


FAST_ROUNDS = 5  # a probe under 0.1 s: a GPU decode step's launch time varies by 2x
SLOW_PROBE = 60.0  # a probe longer than this is timed once


def _rounds_for(best: float, rounds: int, device: str = "cpu") -> int:
    """How often a probe is timed, by its best time so far: under 0.1 s five times, else at
    least twice, a probe over a minute once. Twice because one time can be far off: on a GPU
    the first run of a shape carried one-off work (an H200 took 1.17 s for a 0.12 s prefill), and
    on a shared 2-core CPU one 4k-token prefill took 15.2 s against 12.5 s in the run before,
    which alone put the held-out 7k prediction 56% off."""
    if best < 0.1:
        return max(rounds, FAST_ROUNDS)
    return 1 if best > SLOW_PROBE else max(2, rounds if device == "cuda" else 2)


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


def _forward(decoder: Any, gen: Any, kv: dict, probe: tuple[int, int, int, bool]) -> float:
    """Seconds of one forward pass of ``probe`` = (new tokens, past cached positions, rows,
    shared: the past is a shared prefix), through the same arguments the decoder uses. A decode
    step (one new token) on a decoder whose path steps by itself (the fused CPU step,
    ``hf/fused.py``) is timed on that path: transformers' forward would charge it the
    ``DynamicCache`` copies it does not make."""
    import contextlib

    import torch

    new, past, rows, shared = probe
    vocab = int(decoder.model.config.vocab_size)
    ids = torch.randint(0, vocab, (rows, new), generator=gen).to(decoder.device)
    step = getattr(decoder.fast, "step_timer", None) if new == 1 else None
    extra: dict[str, Any] = {}
    if shared:
        extra["shared_prefix"] = shared_prefix.SharedPrefix(
            _random_cache(decoder, gen, kv, 1, past)
        )
        # the fused step continues a prefill: one own position (the question's last token)
        lead = 1 if step else 0
    else:
        lead = past
    cache = _random_cache(decoder, gen, kv, rows, lead)
    mask = torch.ones((rows, lead + new), dtype=torch.long, device=decoder.device)
    positions = torch.arange(past, past + new, device=decoder.device)[None].expand(rows, new)
    attention = shared_prefix.active(decoder.model) if shared else contextlib.nullcontext()
    # the decode loop's packed weights (CPU, 3-96 rows): rates of the code path that runs
    packed = decoder.packed.active() if decoder.packed else contextlib.nullcontext()
    with attention, packed:
        if step is not None:
            return step(decoder, cache, mask[:, :lead], positions - 1, extra, ids[:, 0])
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
