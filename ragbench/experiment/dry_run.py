"""``ragbench run CONFIG --dry-run``: what a run will send, and what it will cost, before it runs.

The dataset is built, indexes are built (retrieval is local CPU work, and RAG prompts depend on
what it retrieves) and every strategy assembles its prompts exactly as in a real run; each
request then goes to a ``PromptCounter`` instead of the model. The counter counts the prompt's
tokens the way the configured backend will (the transformers backend: its tokenizer and chat
template, read without loading the weights; a server: the tokenizer named in ``model.params``, else
the backend's own estimate), so the prompt tokens a dry run reports are the ones the run logs.
Which way is the backend's declaration (``ragbench.llm.Capabilities``): one that loads weights
(``local_weights``) is counted by its tokenizer alone; any other is built, which sends nothing.

What cannot be known before generating is reported as a bound, never as a measurement:

- completion tokens: ``max_new_tokens`` per call (an upper bound; answers usually stop earlier);
- Self-Route: its RAG call only (the long-context fallback happens for the questions the model
  declines, known only after it answers);
- cached prompt tokens: a backend that reuses a document prefix it has just computed
  (``reuses_prefix_kv``: transformers) is counted as reusing the same declared prefix when it
  came earlier in the run (an estimate); else 0;
- dollars: from tokens for an ``api`` price sheet; a ``gpu_hour`` sheet charges measured device
  seconds, which a dry run does not have (the column is empty and the note says so).

``over_window`` counts the prompts that do not fit. A real run counts the long-context ones the
same way before it loads the model (``ragbench.experiment.preflight``, with ``prompt_counter``)
and stops when any is over the window under the ``error`` overflow policy. A record that would
fail for another reason is not counted there: a note names how many and the first error.

With ``max_dollars``, a config whose total (the bound above; the judge's calls and the noise
pass's are not estimated: notes say so, and the run holds those passes to the cap as they go)
exceeds it is refused: ``attrs["over_budget"]`` says by how much, and ``ragbench run
--dry-run`` prints the table, then that line, and exits 2.

Nothing is written: no records, no cache, no run folder.

``RoundCounter`` is the same count for each round of a real run: the budget's estimate of the
round (``ragbench.experiment.budget``).
"""

from __future__ import annotations

import dataclasses
import math
import os
from typing import TYPE_CHECKING, Any, Protocol

from tqdm import tqdm

if TYPE_CHECKING:
    import pandas as pd

from ragbench.cost.alone import PrefixLedger
from ragbench.cost.money import Usage, dollars
from ragbench.cost.prices import PriceSheet, modelled_seconds_for
from ragbench.experiment.budget import Counted, RoundBound, over_budget
from ragbench.experiment.config.run import RunConfig, load_config
from ragbench.experiment.noise_pass import measures_noise
from ragbench.experiment.resources import (
    build_resources,
    check_examples,
    check_metrics,
    check_queries,
    error_at,
    generates_answers,
    load_examples,
)
from ragbench.llm import backend_capabilities, load_llm
from ragbench.llm.base import LLM, ContextOverflowError
from ragbench.llm.calibration import cached_rates, cpu_name
from ragbench.llm.cost_model import Rates
from ragbench.llm.gguf import file_sha256
from ragbench.llm.hf.load import resolve_model
from ragbench.llm.hf.prompt import is_instruct, render
from ragbench.metrics.answer import deferred_metrics
from ragbench.strategies import get_strategy, run_batch
from ragbench.strategies.base import Resources
from ragbench.strategies.driver import outcome_parts
from ragbench.strategies.prompt_format import check_cot
from ragbench.strategies.prompts import OVERFLOW, OVERFLOW_ERROR
from ragbench.tokenizers import HFTokenizer, HubUnavailableError, get_tokenizer
from ragbench.types import Completion, GenerationRequest

COLUMNS = (
    "label",
    "records",
    "over_window",
    "prompt_tokens",
    "cached_prompt_tokens",
    "completion_tokens_max",
    "dollars_per_query_max",
    "dollars_total_max",
)


class Counter(Protocol):
    """What counts a run's prompts: a built backend, or ``HFPromptCounter`` (its tokenizer)."""

    @property
    def context_window(self) -> int: ...

    def count_tokens(self, text: str) -> int: ...

    def prompt_tokens(self, request: GenerationRequest) -> int: ...


class PromptCounter(LLM):
    """Counts each request's tokens as ``counter`` (an LLM or a tokenizer-backed stand-in)
    would, and answers with ``max_new_tokens`` filler words, charged ``max_new_tokens`` tokens:
    a prompt built from a reply (chain of thought's answer step) counts the longest reply."""

    def __init__(self, counter: Counter, track_prefixes: bool = False) -> None:
        self.counter = counter
        self.name = getattr(counter, "name", "model")
        self.context_window = counter.context_window
        self.track_prefixes = track_prefixes
        self._seen: set[str] = set()

    def count_tokens(self, text: str) -> int:
        return self.counter.count_tokens(text)

    def prompt_tokens(self, request: GenerationRequest) -> int:
        return self.counter.prompt_tokens(request)

    def identity(self) -> dict[str, object]:
        return {"backend": "dry-run", "counts_like": self.name}

    def _generate(self, requests: list[GenerationRequest]) -> list[Completion]:
        out = []
        for r in requests:
            cached = 0
            if self.track_prefixes and r.prefix:
                if r.prefix in self._seen:
                    cached = self.counter.count_tokens(r.prefix)
                self._seen.add(r.prefix)
            out.append(
                Completion(
                    text=" ".join(["x"] * r.max_new_tokens),
                    prompt_tokens=self.prompt_tokens(r),
                    completion_tokens=r.max_new_tokens,
                    cached_prompt_tokens=cached,
                    usage_estimated=True,
                    model=self.name,
                    meta={"dry_run": True},
                )
            )
        return out


class HFPromptCounter:
    """The transformers backend's prompt accounting without its weights: the model's tokenizer
    and chat template (``ragbench.llm.hf.prompt``), the preset's context window."""

    def __init__(
        self,
        model: str,
        instruct: bool | None = None,
        context_window: int | None = None,
        rope_factor: float | None = None,
        **_load_options: object,  # device, dtype, rope_scaling...: they change no token count
    ):
        source, gguf, preset = resolve_model(model)
        self.name = model
        tokenizer = get_tokenizer(str(gguf) if gguf and not preset else model)
        if not isinstance(tokenizer, HFTokenizer):  # a model's tokenizer always is one
            raise TypeError(f"{model!r}: no transformers tokenizer to count prompts with")
        self.tokenizer = tokenizer.hf
        self.instruct = is_instruct(self.tokenizer, preset, instruct)
        window = context_window or (preset.context_window if preset else 0)
        if not window:
            from transformers import AutoConfig

            window = getattr(AutoConfig.from_pretrained(source), "max_position_embeddings", 0)
        # as HFModel: RoPE scaling multiplies the trained window unless a window is given
        scaled = int((window or 2048) * rope_factor) if rope_factor and not context_window else 0
        self.context_window = int(scaled or window or 2048)

    def count_tokens(self, text: str) -> int:
        return len(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def prompt_tokens(self, request: GenerationRequest) -> int:
        text, special = render(self.tokenizer, self.instruct, request)
        return len(self.tokenizer(text, add_special_tokens=special)["input_ids"])


def prompt_counter(cfg: RunConfig) -> Counter:
    """What counts the run's prompts without running the model: the tokenizer-backed
    ``HFPromptCounter`` for a backend that loads weights, else the backend itself (building it
    sends nothing). The preflight (``ragbench.experiment.preflight``) counts with it too."""
    m = cfg.model
    if backend_capabilities(m.backend).local_weights:  # building it would load the weights
        try:
            return HFPromptCounter(m.name, **m.params)
        except HubUnavailableError as exc:  # the model's tokenizer, from the Hub
            raise error_at(cfg, ("model", "name"), str(exc), None) from None
    return load_llm(m.backend, model=m.name, **m.params)  # no request is sent by building it


def dry_run(config: str | os.PathLike | RunConfig | dict, progress: bool = True) -> pd.DataFrame:
    """Per strategy variant: records, prompts over the window, mean prompt / cached tokens,
    the completion-token bound and dollars (``COLUMNS``). ``df.attrs["notes"]`` says what is a
    bound or an estimate. Loads no model and sends no request."""
    cfg = load_config(config)
    examples = load_examples(cfg)
    check_examples(examples, cfg.dataset.name, generates=generates_answers(cfg))
    check_metrics(cfg, examples)  # a metric that could score none of them
    check_queries(cfg, examples)  # a retrieving strategy with nothing to search for
    check_cot(cfg.points, examples)  # as the run: cot without a protocol is refused
    # an external system (the user's pipeline) would really be called: it is not estimated
    points = [p for p in cfg.points if not get_strategy(p.strategy).external]
    work = [(e, p) for e in examples for p in points]
    reuses_prefix = backend_capabilities(cfg.model.backend).reuses_prefix_kv
    llm = PromptCounter(prompt_counter(cfg), track_prefixes=reuses_prefix)
    res = build_resources(cfg, llm)
    pricing = _Pricing.of(cfg, res)
    counts = _count(cfg, work, res, pricing, progress)
    table = _table(counts.rows)
    table.attrs["notes"] = _notes(cfg)
    skipped = sorted({p.label() for p in cfg.points} - {p.label() for p in points})
    if skipped:
        table.attrs["notes"].append(
            f"not estimated (they call your own system): {', '.join(skipped)}"
        )
    _budget(table, cfg, res, pricing)
    if table["over_window"].any():
        table.attrs["notes"].append(
            "over_window: prompts that do not fit the window; a real run stops before loading "
            f"the model when a long-context variant has any under overflow {OVERFLOW_ERROR!r} "
            f"(policies: {' | '.join(OVERFLOW)})"
        )
    if counts.failed:
        eid, label, exc = counts.failed[0]
        table.attrs["notes"].append(
            f"failed: {len(counts.failed)} of {len(counts.rows)} records would fail, not for the "
            f"window (the first: {label} on {eid!r}: {type(exc).__name__}: {exc})"
        )
    return table


@dataclasses.dataclass(frozen=True)
class _Pricing:
    """How the dry run prices a counted call: by the sheet, and for an hourly sheet from the
    seconds this model's cached calibration on this machine models (as a calibrated run
    charges); ``priced`` False: no dollars (never $0)."""

    sheet: PriceSheet | None  # the config's price sheet (None: none)
    rates: (
        Rates | None
    )  # the calibration an hourly sheet's seconds come from (None: an api sheet, none)

    @classmethod
    def of(cls, cfg: RunConfig, res: Resources) -> _Pricing:
        sheet = res.sheet
        rates = cached_calibration(cfg) if sheet is not None and sheet.kind != "api" else None
        return cls(sheet, rates)

    @property
    def priced(self) -> bool:
        return self.sheet is not None and (self.sheet.kind == "api" or self.rates is not None)

    def dollars(self, c: object) -> float | None:
        return _priced(c, self.sheet, self.rates) if self.priced else None


@dataclasses.dataclass
class _Counts:
    """What the dry run counted: one row per record (``label``, ``over_window`` and the
    completion's tokens and dollars) and the records that would fail, not for the window."""

    rows: list[dict[str, object]] = dataclasses.field(default_factory=list)
    failed: list[tuple[str, str, BaseException]] = dataclasses.field(default_factory=list)


def _count(
    cfg: RunConfig, work: list, res: Resources, pricing: _Pricing, progress: bool
) -> _Counts:
    """``work`` run through the strategies in rounds of ``batch_size``, its LLM the counter."""
    counts, size = _Counts(), cfg.model.batch_size
    rounds = tqdm(
        range(0, len(work), size),
        desc=f"{cfg.name} (dry run)",
        disable=not progress,
        unit="batch",
    )
    for start in rounds:
        chunk = work[start : start + size]
        for (example, params), outcome in zip(chunk, run_batch(chunk, res), strict=True):
            error, c = outcome_parts(outcome)  # a failure after a counted call keeps its count
            row = {
                "label": params.label(),
                "over_window": isinstance(error, ContextOverflowError),
            }
            if error is not None and not row["over_window"]:
                counts.failed.append((example.id, params.label(), error))
            if c is not None:
                row |= {
                    "prompt_tokens": c.prompt_tokens,
                    "cached_prompt_tokens": c.cached_prompt_tokens,
                    "completion_tokens_max": c.completion_tokens,
                    "dollars": pricing.dollars(c),
                }
            counts.rows.append(row)
    return counts


def _table(rows: list[dict[str, object]]) -> pd.DataFrame:
    """The rows aggregated per strategy variant (``COLUMNS``)."""
    import pandas as pd

    df = pd.DataFrame(rows) if rows else pd.DataFrame(columns=["label", "over_window"])
    for col in ("prompt_tokens", "cached_prompt_tokens", "completion_tokens_max", "dollars"):
        if col not in df:
            df[col] = float("nan")
    table = df.groupby("label", sort=False).agg(
        records=("label", "size"),
        over_window=("over_window", "sum"),
        prompt_tokens=("prompt_tokens", "mean"),
        cached_prompt_tokens=("cached_prompt_tokens", "mean"),
        completion_tokens_max=("completion_tokens_max", "mean"),
        dollars_per_query_max=("dollars", "mean"),
        dollars_total_max=("dollars", lambda s: s.sum(min_count=1)),
    )
    table = table.reset_index()[list(COLUMNS)]
    for col in ("prompt_tokens", "cached_prompt_tokens", "completion_tokens_max"):
        table[col] = table[col].round(1)
    return table


def _budget(table: pd.DataFrame, cfg: RunConfig, res: Resources, pricing: _Pricing) -> None:
    """The total held to ``max_dollars`` (``table.attrs["over_budget"]``), long_context
    preload's one-time calls included (run_batch sent them before the questions), and its
    notes."""
    preloads = [c for c in res.preloaded.values() if not isinstance(c, Exception)]
    once = (
        sum(_as_float(_priced(c, pricing.sheet, pricing.rates)) for c in preloads)
        if pricing.priced
        else float("nan")
    )
    total = table["dollars_total_max"].sum(min_count=1)
    if preloads:
        total += once
        table.attrs["notes"].append(
            f"long_context preload: {len(preloads)} preload call(s), a one-time ${once:,.6f}, "
            "not in the per-query columns; in the total held to max_dollars"
        )
    table.attrs["over_budget"] = over_budget(total, cfg.max_dollars)
    if cfg.max_dollars is not None and total != total:  # NaN: no dollars estimated
        table.attrs["notes"].append("max_dollars: not checked (no dollar estimate)")


class RoundCounter:
    """At most what each round of a real run costs, counted as ``dry_run`` counts it: the
    budget's estimate of every round (``ragbench.experiment.budget``). Called with a round's
    ``items`` ((example, params) pairs), it returns a ``RoundBound``: each item's prompts
    assembled as they will be sent and counted by the backend's tokenizer, every answer at
    ``max_new_tokens``, priced by the config's sheet, and the preload call of each preload group
    of the round. ``res``: the run's resources, used with their LLM swapped for a counter
    (nothing is sent; their caches are not touched), else built here once, as the dry run builds
    them. A pipeline's items are not counted (that would call it: None in ``items``). None when
    no dollars can be estimated: no sheet, or an hourly sheet with no calibration to model the
    seconds from. Each round is counted afresh (no prefix it shares with an earlier round is
    taken as cached), so a round's bound does not lean on what earlier rounds sent."""

    def __init__(self, cfg: RunConfig, res: Resources | None = None) -> None:
        self.cfg, self.res = cfg, res
        self.fitted: dict = {}  # a shared corpus fitted to the window once, for every round

    def __call__(self, items: list) -> RoundBound | None:
        cfg, sheet = self.cfg, self.cfg.sheet
        counted = [i for i, (_, p) in enumerate(items) if not get_strategy(p.strategy).external]
        if sheet is None:
            return None
        rates = None
        if sheet.kind != "api":
            rates = getattr(self.res, "rates", None) or cached_calibration(cfg)
            if rates is None:
                return None
        reuses_prefix = backend_capabilities(cfg.model.backend).reuses_prefix_kv
        if self.res is None:  # built once: an index is built once for the run's rounds
            counter = PromptCounter(prompt_counter(cfg), track_prefixes=reuses_prefix)
            examples = {e.id: e for e, _ in items}.values()
            self.res = build_resources(cfg, counter, None, examples)
        llm = self.res.llm  # the run's model, or the counter built above (counted by its own)
        counter = PromptCounter(
            llm.counter if isinstance(llm, PromptCounter) else llm, track_prefixes=reuses_prefix
        )
        # a ledger of its own: the run's must not take the counted prompts for sent ones (its
        # variants' first prefixes, the preload's corpus, would go uncharged: cost/alone.py)
        res = dataclasses.replace(
            self.res,
            llm=counter,
            fitted=self.fitted,
            preloaded={},
            preload_over=dict(self.res.preload_over),
            alone=PrefixLedger(),
        )
        per_item: list[float | None] = [None] * len(items)
        prompts: list[Counted | None] = [None] * len(items)
        outcomes = run_batch([items[i] for i in counted], res) if counted else []
        for i, outcome in zip(counted, outcomes, strict=True):
            cost = outcome_parts(outcome)[1]
            # an error row costs what its finished calls did: nothing when none finished (over
            # the window under overflow "error")
            per_item[i] = 0.0 if cost is None else _as_float(_priced(cost, sheet, rates))
            prompts[i] = None if cost is None else _counted(cost, sheet, rates)
        # and the preload calls run_batch sent before their questions (a one-time cost)
        preloads = {
            key: _as_float(_priced(c, sheet, rates))
            for key, c in res.preloaded.items()
            if not isinstance(c, Exception)
        }
        return RoundBound(tuple(per_item), preloads, tuple(prompts))


def _as_float(value: float | None) -> float:
    """A counted call's dollars; NaN when the sheet gave none (the budget cannot hold it)."""
    return float("nan") if value is None else float(value)


def _counted(c: Any, sheet: PriceSheet, rates: Rates | None) -> Counted:
    """A counted item's prompts (``budget.Counted``): its prompt tokens and calls, and its
    dollars at ``r`` times those prompt tokens (cached ones too), its answers unchanged: by the
    sheet from tokens, or (``rates``: a calibration) from the seconds they model to."""

    def at(r: float) -> float:
        p, g = math.ceil(c.prompt_tokens * r), c.completion_tokens
        cached = math.floor(c.cached_prompt_tokens * r)  # read for less: counted low
        if rates is None:
            return _as_float(dollars(sheet, Usage(p, cached, g)))
        return _as_float(dollars(sheet, seconds=modelled_seconds_for(rates, p, cached, g)))

    return Counted(c.prompt_tokens, c.llm_calls, at)


def _priced(c: Any, sheet: PriceSheet | None, rates: Rates | None) -> float | None:
    """A counted call's dollars: by the sheet from its tokens, or (``rates``: a calibration)
    from the seconds they model to."""
    if rates is None:
        return c.dollars
    assert sheet is not None  # rates come with an hourly sheet (_Pricing.of)
    seconds = modelled_seconds_for(
        rates, c.prompt_tokens, c.cached_prompt_tokens, c.completion_tokens
    )
    return dollars(sheet, seconds=seconds)


def cached_calibration(cfg: RunConfig) -> Rates | None:
    """The newest calibration of the config's model measured on this CPU (cached by an earlier
    run that loaded it), found without loading anything; None when there is none (a model from
    a folder or the Hub, a server, or never run here)."""
    if not backend_capabilities(cfg.model.backend).local_weights:
        return None
    try:
        _, gguf, _ = resolve_model(cfg.model.name)
    except (OSError, ValueError):
        return None
    if gguf is None:
        return None
    # a calibration of the dtype that runs: bf16 steps cost about half the fp32 ones
    dtype = str(cfg.model.params.get("dtype", "auto"))
    match: dict[str, object] = {
        "weights": "gguf-sha256:" + file_sha256(gguf),
        "hardware": cpu_name(),
        "dtype": "float32" if dtype == "auto" else dtype,  # auto: fp32 on the CPU
    }
    if cfg.model.threads:
        match["threads"] = cfg.model.threads
    return cached_rates(match)


def _notes(cfg: RunConfig) -> list[str]:
    notes = [f"completion tokens: at most max_new_tokens={cfg.model.max_new_tokens} per call"]
    if any(getattr(p, "cot", False) for p in cfg.points):
        notes[0] += " (a cot point's reasoning call: the prompt format's own budget)"
    if routers := sorted({p.strategy for p in cfg.points if get_strategy(p.strategy).routes}):
        notes.append(
            f"{', '.join(routers)}: its RAG call only; declined questions add a long-context call"
        )
    if deferred_metrics(cfg.metrics):
        notes.append("judge metrics: the judge's calls are not in this table")
    if measures_noise(cfg):
        notes.append(
            "noise_sensitivity: after generation, retrieving records are answered once more "
            "with distractors (about their cost again); not in this table"
        )
    if backend_capabilities(cfg.model.backend).reuses_prefix_kv:
        notes.append("cached prompt tokens: estimated (a document prefix seen earlier is reused)")
    sheet = cfg.sheet  # loaded whenever price_sheet is set
    if cfg.price_sheet is None or sheet is None:
        notes.append("dollars: no price_sheet in the config")
    elif sheet.kind != "api" and cached_calibration(cfg) is not None:
        notes.append(
            f"dollars: price sheet {cfg.price_sheet!r} charges device seconds, modelled here from "
            "the tokens and this model's cached calibration on this CPU (an upper bound: every "
            "completion at max_new_tokens)"
        )
    elif sheet.kind != "api":
        notes.append(
            f"dollars: price sheet {cfg.price_sheet!r} charges device seconds; no calibration of "
            "this model on this machine is cached yet (a real run measures one), so none here"
        )
    return notes
