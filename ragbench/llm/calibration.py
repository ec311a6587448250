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
prompts measures again (timing only the probes past the length an earlier calibration reached:
:func:`shorter_samples`) and one with shorter prompts reads a longer calibration. A prefill
probe stands for its fastest sample (noise only adds time), a decode step for its median
(:func:`estimate`); a cheap probe is timed three to five times, a long prefill once, and again
only where it disagrees with the fit of the others (most of a calibration's time is its two
longest prefills: :func:`_retime`); on a GPU every probe at least twice (one-off work in the
first run of a shape). This takes from seconds (a GPU)
to about a minute (8k tokens on a quiet 2-core CPU) once per model, device, dtype, thread count
and length (announced on stderr with the reason for its length; sweep workers wait for one
another under a file lock, see :func:`rates_for`); the rates, their samples and the load average
around them are cached as JSON under ``assets.cache_dir()/calibration``
keyed by that identity (see :func:`calibration_key`), so later loads read them. We chose
measuring at load over fitting online from observed batches because the split then does not
depend on what ran before (the same batch is split the same way in every run) and a batch's
time alone cannot separate its rows' costs, which is the very thing to estimate. The same
estimate, not a share of measured time, is what the default cost basis charges (``modelled
seconds``, ``ragbench.cost.prices.modelled_seconds``): it depends on tokens and these rates only.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from filelock import FileLock
from tqdm import tqdm

from ragbench import assets
from ragbench.io import atomic_write_text
from ragbench.llm import shared_prefix
from ragbench.llm.cost_model import Rates, fit, relative_error
from ragbench.llm.cpu_share import CpuShare
from ragbench.llm.hf.decode import Decoder
from ragbench.types import GenerationRequest

if TYPE_CHECKING:
    import torch

# a probe's seconds: timer(new, past, rows, shared); the decode loop's per step: loop_timer(steps)
ProbeTimer = Callable[[int, int, int, bool], float]
LoopTimer = Callable[[int], float]

log = logging.getLogger(__name__)

CALIBRATION_VERSION = 7  # bump when the probes or the cost model change: old files are ignored

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


def calibration_key(
    decoder: Decoder, weights: str, probed_tokens: int | None = None
) -> dict[str, Any]:
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


def decode_path(decoder: Decoder) -> str:
    """Which decode loop the loop probe times: ``fused`` (the CPU step, ``hf/fused.py``),
    ``static+graphs``, ``static`` (``hf/static.py``) or ``eager``. A part of the key: the captured
    step costs a fraction of the eager one, the fused step about half of it on a CPU."""
    fast = getattr(decoder, "fast", None)
    return getattr(fast, "path", "eager") if fast is not None else "eager"


def window_of(decoder: Decoder) -> int:
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


def calibration_path(key: dict[str, object], cache_dir: str | os.PathLike | None = None) -> Path:
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
    decoder: Decoder,
    weights: str,
    cache_dir: str | os.PathLike | None = None,
    longest: int | None = None,
) -> Rates:
    """The rates of this model on this device, probed to the run's ``longest`` prompt (tokens;
    None: ``DEFAULT_LONGEST``): memoised in the process, cached on disk (a calibration probed to
    a longer length serves too), else measured now and written for next time. A calibration of
    the same model and device to a shorter length lends its probes (:func:`shorter_samples`):
    only the longer ones are timed.

    Sweep workers on one machine share the cache: the measuring happens under one file lock per
    cache folder, so a second worker with the same key waits for the first and reads its file
    instead of measuring again (and two calibrations never time each other's load). The file is
    written atomically (``ragbench.io``): a reader sees the old file or the new one."""
    window = window_of(decoder)
    key = calibration_key(decoder, weights)
    key["probed_tokens"] = probed_length(longest, window, key["device"])
    # this length and every longer power of two up to the window (a longer probe range serves)
    lengths = longer_lengths(key["probed_tokens"], window)
    paths = [calibration_path({**key, "probed_tokens": n}, cache_dir) for n in lengths]
    for path in paths:
        if str(path) in _MEMO:
            return _MEMO[str(path)]
    rates = _read_first(paths)
    if rates is None:
        paths[0].parent.mkdir(parents=True, exist_ok=True)
        with FileLock(str(paths[0].parent / LOCK)):
            # another worker measured it while this one waited
            rates = _read_first(paths) or _calibrate(decoder, key, paths[0], longest)
    warn_validation(rates)
    _MEMO[rates.meta.get("path") or str(paths[0])] = rates
    return rates


def _calibrate(decoder: Decoder, key: dict[str, Any], path: Path, longest: int | None) -> Rates:
    """Measured now (announced: what, why, what is reused, where it is cached), written to
    ``path``; the meta records the key and the load average around it."""
    known, source = shorter_samples(key, path.parent.parent)
    threads = f" ({key['threads']} threads)" if key["device"] == "cpu" else ""
    why = _WHY.get()
    if longest and longest > key["probed_tokens"]:
        why += f"{'; ' if why else ''}the model's window is {key['probed_tokens']:,}"
    reuse = f"; probes up to {source[0]:,} tokens reused from {source[1]}" if source else ""
    announce(
        f"calibrating {key['weights'] or 'the model'} on {key['hardware']}{threads} up to "
        f"{key['probed_tokens']:,} tokens{f' ({why})' if why else ''}, once per "
        f"model/device/dtype/thread count/length{reuse}; cached at {path}"
    )
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    measured = measure(decoder, key["probed_tokens"], known=known)
    end = os.getloadavg()[0] if load is not None else None
    meta = {
        **measured.meta,
        "key": key,
        "load_avg_1min": [load, end],
        "reused_from": str(source[1]) if source else None,
    }
    rates = replace(measured, meta=meta)
    atomic_write_text(path, json.dumps(rates.to_dict(), indent=1, sort_keys=True))
    return replace(rates, meta={**meta, "path": str(path)})


def shorter_samples(
    key: dict[str, object], cache_dir: str | os.PathLike | None = None
) -> tuple[dict[str, list[float]], tuple[int, Path] | None]:
    """(probe samples, (its probed length, its file)) of the longest cached calibration whose
    key is ``key`` but for a shorter ``probed_tokens``; ``({}, None)`` when there is none. A run
    that needs a longer range than the last one times only the probes that one did not: the
    prefills and decode steps past its length, the check after a cached past, the shared-prefix
    probes (they sit at half the length)."""
    folder = (Path(cache_dir) if cache_dir is not None else assets.cache_dir()) / "calibration"
    same = {k: v for k, v in key.items() if k != "probed_tokens"}
    best: tuple[int, Path, dict] | None = None
    for path in sorted(folder.glob("*.json")):
        rates = _read(path)
        if rates is None:
            continue
        meta = rates.meta or {}
        theirs = dict(meta.get("key") or {})
        probed = theirs.pop("probed_tokens", None)
        if theirs != same or not probed or probed >= key["probed_tokens"]:
            continue
        if best is None or probed > best[0]:
            best = (probed, path, meta.get("samples") or {})
    return ({}, None) if best is None else (best[2], (best[0], best[1]))


_WHY: ContextVar[str] = ContextVar("calibration_why", default="")


@contextlib.contextmanager
def because(why: str):
    """Within the block, a calibration's announcement says ``why`` it probes to its length (the
    run's strategies that reach it: ``experiment.resources.longest_reason``)."""
    token = _WHY.set(why)
    try:
        yield
    finally:
        _WHY.reset(token)


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


def describe(rates: Rates | None) -> dict[str, object] | None:
    """What a manifest records about the calibration that priced a run: its identity (the key
    and the cache file), when it was measured, and the rates themselves."""
    if rates is None:
        return None
    meta = rates.meta or {}
    numbers = {k: v for k, v in asdict(rates).items() if k != "meta"}
    check = meta.get("validation") or {}
    return {
        "key": meta.get("key"),
        "path": meta.get("path"),
        "measured_at": meta.get("measured_at"),
        "rates": numbers,
        "probed_tokens": (meta.get("key") or {}).get("probed_tokens"),
        "validation_error": check.get("error"),
        "validation": check or None,
        # the 1-minute load average when it began and ended: a run at another load measures
        # another device time (cost_basis: measured charges that)
        "load_avg_1min": meta.get("load_avg_1min"),
        "reused_from": meta.get("reused_from"),
    }


def cached_rates(
    match: dict[str, object], cache_dir: str | os.PathLike | None = None
) -> Rates | None:
    """The newest cached calibration whose key has every item of ``match`` (say ``{"weights":
    ..., "device": "cpu", "threads": 2}``), without loading the model: what a dry run can price
    a device-hour sheet with. None when no such calibration was measured on this machine."""
    folder = (Path(cache_dir) if cache_dir is not None else assets.cache_dir()) / "calibration"
    found = [r for p in sorted(folder.glob("*.json")) if (r := _read(p)) is not None]
    fits = [
        r
        for r in found
        if all((r.meta.get("key") or {}).get(k) == v for k, v in match.items())
        and (r.meta.get("key") or {}).get("version") == CALIBRATION_VERSION
    ]
    return max(fits, key=lambda r: str(r.meta.get("measured_at", "")), default=None)


def measure(
    decoder: Decoder,
    longest: int | None = None,
    rounds: int = 3,
    timer: ProbeTimer | None = None,
    loop_timer: LoopTimer | None = None,
    *,
    known: dict[str, list[float]] | None = None,
    share: CpuShare | None = None,
) -> Rates:
    """Time the probes of ``probe_plan(longest)`` on ``decoder``'s model and fit the rates.

    The probes run interleaved, one of each per round, so every probe sees the same background
    load; how often each is timed: :func:`_rounds_for`, and what its samples stand for:
    :func:`estimate`. ``timer(new, past, rows, shared)`` returns a probe's seconds (default: a
    real forward pass, :func:`_forward`); a test passes a clock of its own. ``known``: samples
    of probes already timed (a calibration to a shorter length, :func:`rates_for`; by probe
    name, ``LOOP`` for the loop probe): they are not timed again. The longest prefill is held
    out of the fit and predicted by it: that relative error is ``meta["validation"]["error"]``;
    a probe the fit misses by more than ``RETIME_ERROR`` is timed again (:func:`_retime`) unless
    it ran on its threads' whole CPU share (``share``: the real timer's on a CPU, or a test's),
    and the returned rates are then fitted on every probe.

    A decode step of the decoder's loop is more than its forward pass: the loop picks the token,
    checks the stop conditions (detokenising), grows the mask, and waits for the device each step.
    On an H200 the 8B forward took 20 ms and the loop's step 22-34 ms, so the bare probes charged
    long-context requests' decode 25% short. ``loop_timer(steps)`` (default: the decoder's own
    loop, :func:`_loop_step`) gives seconds per step of that loop at a short cache; ``d0`` is set
    from it (the KV slope ``d1`` stays the bare probes'), also when it is less than a bare
    forward pass: the static path's captured step (``hf/static.py``) is."""
    import torch

    device = getattr(getattr(decoder, "device", None), "type", "cpu")
    plan = probe_plan(min(longest or DEFAULT_LONGEST["cpu"], window_of(decoder)))
    shared_ok = True
    if timer is None:
        timer, loop_timer, shared_ok, share = _device_timers(decoder, loop_timer)
    probes = _probes(plan, shared_ok)
    known = known or {}
    samples = {name: list(known.get(name, ())) for name in probes}
    if loop_timer is not None:
        samples[LOOP] = list(known.get(LOOP, ()))
    reused = sorted(name for name, got in samples.items() if got)
    with torch.inference_mode():
        if len(reused) < len(samples):
            timer(16, 0, 1, False)  # warm-up: the first call allocates
        _time_rounds(samples, probes, timer, loop_timer, rounds, device)
        rates, meta = _fit_samples(plan, samples)
        for _ in range(RETIMES):
            again = _retime(rates, meta, probes, samples, share)
            if not again:
                break
            for name in again:
                samples[name].append(timer(*probes[name]))
            rates, meta = _fit_samples(plan, samples)
    if share is not None:
        meta["cpu_share"] = share.report(probes)
    meta["reused"] = reused
    meta["measured_at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    return replace(rates, meta=meta)


def _time_rounds(
    samples: dict[str, list[float]],
    probes: dict[str, tuple],
    timer: ProbeTimer,
    loop_timer: LoopTimer | None,
    rounds: int,
    device: str,
) -> None:
    """Each probe's samples filled up to :func:`_rounds_for`, one of each per round (the loop
    probe interleaved too: a GPU host's speed drifts for seconds; each of its samples is already a
    mean over ``LOOP_STEPS`` steps: 3 of them on a CPU); a probe with samples already (reused)
    counts them as its first rounds."""
    loop_rounds = FAST_ROUNDS if device == "cuda" else max(rounds, MAX_SAMPLES)
    for round_ in range(max(rounds, FAST_ROUNDS)):
        for name, got in samples.items():
            args = probes.get(name)
            wanted = _rounds_for(got, rounds, device) if args else loop_rounds
            if len(got) <= round_ < wanted and args:
                got.append(timer(*args))
            elif len(got) <= round_ < wanted:
                assert loop_timer is not None  # the loop probe is sampled only with its timer
                got.append(loop_timer(LOOP_STEPS))


LOOP = "loop"  # the decode loop probe's name among the samples
# a probe the fit misses by more than this (or the held-out check by more than WARN_ERROR) is
# timed again ... The fit's shape alone missed SmolLM2's held-out 8k prefill by 5.4-6.8% on
# this 2-core CPU (three calibrations): a 5% bar re-timed the two longest prefills for nothing
RETIME_ERROR = 0.10
RETIMES = 2  # ... at most this many more times
AGREE = 0.05  # samples within this of one another agree: another one would change nothing
MAX_SAMPLES = 3  # and never past this many samples


def _device_timers(
    decoder: Decoder, loop_timer: LoopTimer | None
) -> tuple[ProbeTimer, LoopTimer, bool, CpuShare | None]:
    """(timer, loop timer, shared-prefix attention supported, the prefills' CPU shares: None
    off the CPU) on ``decoder``'s device."""
    import torch

    gen = torch.Generator().manual_seed(0)  # deterministic token ids; values do not matter
    kv: dict[tuple[int, int], object] = {}  # random KV tensors by (rows, positions), made once
    on_cpu = getattr(decoder.device, "type", "cpu") == "cpu"
    share = CpuShare(min(torch.get_num_threads(), os.cpu_count() or 1)) if on_cpu else None

    def timer(new: int, past: int, rows: int, shared: bool) -> float:
        return _forward(decoder, gen, kv, (new, past, rows, shared), share)

    if loop_timer is None:

        def loop_timer(steps: int) -> float:
            return _loop_step(decoder, gen, steps)

    return timer, loop_timer, _shared_supported(decoder), share


def _probes(plan: ProbePlan, shared_ok: bool) -> dict[str, tuple[int, int, int, bool]]:
    """Every probe of ``plan`` by name (``kind/new/past/rows``, decode by its KV positions) ->
    the timer's arguments ``(new, past, rows, shared)``."""
    probes = {}
    for n, p in (*plan.prefill, plan.holdout, plan.after_cached):
        probes[f"prefill/{n}/{p}/1"] = (n, p, 1, False)
    for k, r in plan.decode:
        probes[f"decode/{k}/0/{r}"] = (1, k - 1, r, False)
    n, p = plan.shared
    if shared_ok:
        probes[f"shared_prefill/{n}/{p}/1"] = (n, p, 1, True)
        probes[f"shared_decode/1/{p}/1"] = (1, p, 1, True)
    return probes


def estimate(samples: list[float], kind: str, statistic: str = "fastest") -> float:
    """What a probe's samples (seconds, interleaved rounds) stand for. ``fastest`` (what a run
    uses): a prefill its fastest sample, since noise and one-off work only add time (the first
    run of a shape on an H200 took 1.17 s for a 0.12 s prefill; on a 2-core CPU at load 8-11 a
    calibration whose prefills stood for their medians missed its held-out 8k prefill by 33%,
    one of fastest samples in the same session by 5.4%), and a decode step its median (tens of
    milliseconds that vary by 10-30%
    from step to step even on a quiet CPU: what the run's steps take on the whole, not the
    luckiest one). ``median``: every probe its median (``benchmarks/cost.py`` reports what that
    would have charged)."""
    if statistic == "median" or kind.endswith("decode") or kind == LOOP:
        return statistics.median(samples)
    return min(samples)


def _fit_samples(
    plan: ProbePlan, samples: dict[str, list[float]], statistic: str = "fastest"
) -> tuple[Rates, dict[str, object]]:
    """The rates fitted on every probe's estimate, and their provenance: the estimates, the
    samples, the held-out check (fitted without the longest prefill) and the after-cached one."""
    best = {
        name: estimate(got, name.split("/")[0], statistic)
        for name, got in samples.items()
        if name != LOOP
    }
    parsed = {name: _parse_probe(name) for name in best}
    prefill: list[tuple[int, int, float]] = [  # (new, past, seconds), on an empty cache
        (n, p, best[k]) for k, (kind, n, p, _) in parsed.items() if kind == "prefill" and not p
    ]
    decode = [(n, r, best[k]) for k, (kind, n, _, r) in parsed.items() if kind == "decode"]
    held = next(x for x in prefill if (x[0], x[1]) == plan.holdout)
    without = fit([x for x in prefill if x is not held], decode)
    rates = fit(prefill, decode)
    loop = estimate(samples[LOOP], LOOP, statistic) if samples.get(LOOP) else None
    if loop is not None:  # the decode loop's step at a short cache
        rates = replace(rates, d0=max(0.0, loop - rates.d1 * LOOP_KV))
        without = replace(without, d0=rates.d0)
    rates = replace(rates, **_shared_slopes(rates, best, parsed))
    after = (*plan.after_cached, best["prefill/{}/{}/1".format(*plan.after_cached)])
    meta = {
        "probes": {name: round(t, 6) for name, t in best.items()},
        "samples": {name: [round(t, 6) for t in got] for name, got in samples.items()},
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
        "statistic": statistic,
    }
    return rates, meta


def _parse_probe(name: str) -> tuple[str, int, int, int]:
    """A probe's name (``kind/new/past/rows``, see :func:`_probes`) split into its parts."""
    kind, n, p, r = name.split("/")
    return kind, int(n), int(p), int(r)


def _shared_slopes(
    rates: Rates, best: dict[str, float], parsed: dict[str, tuple[str, int, int, int]]
) -> dict:
    """``c_shared`` and ``d1_shared``: what the plain model leaves unexplained of the shared-prefix
    probes, per shared position."""
    shared = {}
    for name, (kind, n, p, _) in parsed.items():
        if kind == "shared_prefill":
            shared["c_shared"] = max(0.0, (best[name] - rates.forward(n)) / (n * p))
        elif kind == "shared_decode":
            shared["d1_shared"] = max(0.0, (best[name] - rates.d0 - rates.d1) / p)
    return shared


def _retime(
    rates: Rates,
    meta: dict[str, Any],
    probes: dict[str, tuple],
    samples: dict[str, list],
    share: CpuShare | None = None,
) -> list[str]:
    """The prefills on an empty cache to time once more: those the fit (``rates``, on every
    probe) misses by more than ``RETIME_ERROR``, and when the held-out check misses by more than
    ``WARN_ERROR`` (it would warn), the held-out probe and the longest fitted one; each while
    :func:`_unsettled` and not steady (``share``: its fastest sample ran on its threads' whole
    share of the CPU, :class:`CpuShare`). A long prefill is timed once at first
    (:func:`_rounds_for`), again only where it disagrees with the rest: on a shared 2-core CPU
    one 4k-token prefill took 15.2 s against 12.5 s in the run before, which alone put the
    held-out 7k prediction 56% off."""
    plain = {
        name: args for name, args in probes.items() if name.startswith("prefill/") and not args[1]
    }
    longest = max(plain, key=lambda name: plain[name][0])
    fitted = max((n for n in plain if n != longest), key=lambda name: plain[name][0])
    again = [
        name
        for name, (n, _, _, _) in plain.items()
        if abs(rates.forward(n) / meta["probes"][name] - 1) > RETIME_ERROR
    ]
    if meta["validation"]["error"] > WARN_ERROR:
        again += [longest, fitted]
    return [
        name
        for name in dict.fromkeys(again)
        if _unsettled(samples[name])
        and not (share is not None and share.steady(probes[name], samples[name]))
    ]


def _unsettled(samples: list[float]) -> bool:
    """Whether one more sample can still change a probe's estimate: fewer than ``MAX_SAMPLES``,
    and not two or more that agree within ``AGREE`` (then a miss is the model's shape,
    not noise, and timing it again would only cost)."""
    if len(samples) >= MAX_SAMPLES:
        return False
    return len(samples) < 2 or max(samples) / min(samples) - 1 > AGREE


LOOP_STEPS = 16  # decode steps the loop probe times
LOOP_KV = 16 + LOOP_STEPS // 2  # its mean KV positions: a 16-token prompt


def _loop_step(decoder: Decoder, gen: torch.Generator, steps: int) -> float:
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


FAST_PROBE = 0.1  # a probe under this many seconds is timed FAST_ROUNDS times ...
FAST_ROUNDS = 5  # (a GPU decode step's launch time varies by 2x; a CPU's by 10-30%)
CHEAP_PROBE = 1.0  # on a CPU, a probe under this is timed MAX_SAMPLES times, a longer one once
SLOW_PROBE = 60.0  # on a GPU, a probe longer than this is timed once


def _rounds_for(samples: list[float], rounds: int, device: str = "cpu") -> int:
    """How often a probe is timed, by its fastest sample so far (none yet: at least once).

    Under ``FAST_PROBE`` ``FAST_ROUNDS`` times. On a GPU, at least twice (the first run of a
    shape can carry one-off work), a probe over a minute once. On a CPU, a cheap probe
    ``MAX_SAMPLES`` times, and a long prefill once: most of a calibration's time is its two
    longest prefills, and a second timing is spent only where the first disagrees with the fit
    (:func:`_retime`)."""
    best = min(samples, default=0.0)
    if best < FAST_PROBE:
        return max(rounds, FAST_ROUNDS)
    if device == "cuda":
        return 1 if best > SLOW_PROBE else max(2, rounds)
    return max(rounds, MAX_SAMPLES) if best < CHEAP_PROBE else 1


def _shared_supported(decoder: Decoder) -> bool:
    return shared_prefix.supported(decoder.model)


def _random_cache(
    decoder: Decoder, gen: torch.Generator, kv: dict, rows: int, positions: int
) -> Any:
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
    decoder: Decoder,
    gen: torch.Generator,
    kv: dict,
    probe: tuple[int, int, int, bool],
    share: CpuShare | None = None,
) -> float:
    """Seconds of one forward pass of ``probe`` = (new tokens, past cached positions, rows,
    shared: the past is a shared prefix), through the same arguments the decoder uses. A decode
    step (one new token) on a decoder whose path steps by itself (the fused CPU step,
    ``hf/fused.py``) is timed on that path: transformers' forward would charge it the
    ``DynamicCache`` copies it does not make. ``share``: where a forward pass's process CPU time
    is recorded (:class:`CpuShare`)."""
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
        cpu, t0 = time.process_time(), decoder.now()
        decoder.model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=positions,
            **{decoder.cache_kw: cache},
            use_cache=True,
            **decoder.last_logits_only,
            **extra,
        )
        seconds = decoder.now() - t0
        if share is not None:
            share.record(probe, seconds, time.process_time() - cpu)
        return seconds
