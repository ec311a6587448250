"""What a run loads before it generates: its examples (checked), its model (or a judge's) behind
the completion cache, the retrieval index builder and the strategies' ``Resources``. The runner,
the judge pass and the dry run all load through here, so they read the same model, the same
index and the same price sheet."""

from __future__ import annotations

import importlib
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from ragbench.assets import cache_dir
from ragbench.datasets import build_dataset
from ragbench.datasets._validate import DatasetParamError
from ragbench.datasets.haystack import HaystackTooShortError
from ragbench.experiment.config.run import RunConfig, load_config
from ragbench.experiment.config.sections import ModelConfig
from ragbench.experiment.config.text import ConfigError, explain_validation_error, located
from ragbench.io import dumps_canonical
from ragbench.llm import backend_capabilities, load_llm
from ragbench.llm.base import LLM
from ragbench.llm.calibration import announce, because
from ragbench.llm.cost_model import Rates
from ragbench.llm.hf.load import set_threads
from ragbench.metrics.answer import METRICS
from ragbench.models import PRESETS, get_preset
from ragbench.retrieval import build_index, needs_embedder
from ragbench.retrieval.embedders.base import get_embedder
from ragbench.strategies import Resources, RetrievalParams, get_strategy
from ragbench.strategies.base import IndexFn
from ragbench.strategies.params import StrategyParams
from ragbench.strategies.prompt_format import prompt_format
from ragbench.strategies.registry import preflight_points, strategies_where
from ragbench.tokenizers import HubUnavailableError
from ragbench.types import Example


class DatasetError(ValueError):
    """The dataset cannot be scored (no examples, missing gold answers, duplicate ids)."""


def no_gold_answer(n: int, noun: str) -> str:
    """``none of its 3 examples has a gold answer`` (``its only example has no gold answer``
    when ``n`` is 1)."""
    if n == 1:
        return f"its only {noun} has no gold answer"
    return f"none of its {n} {noun}s has a gold answer"


def check_examples(examples: list[Example], dataset: str, generates: bool = True) -> None:
    """A dataset a run can use: some examples, unique ids, and gold answers for at least one
    example when a strategy generates answers (questions without answers are run and reported
    unscored; a retrieval-only run scores against relevance judgements instead)."""
    if not examples:
        raise DatasetError(f"dataset {dataset!r} produced no examples")
    if generates and not any(a.strip() for e in examples for a in e.answers):
        raise DatasetError(
            f"dataset {dataset!r}: {no_gold_answer(len(examples), 'example')}; "
            "answer metrics need at least one (give some examples `answers`: the others are "
            "run and reported unscored)"
        )
    seen: set[str] = set()
    for e in examples:
        if e.id in seen:
            raise DatasetError(f"dataset {dataset!r}: duplicate example id {e.id!r}")
        seen.add(e.id)
        if isinstance(e.answers, str):  # scored character by character: silently wrong
            raise DatasetError(
                f"dataset {dataset!r}: example {e.id!r}: answers is a string; valid: a list "
                f"of strings, e.g. [{e.answers!r}]"
            )
        if not isinstance(e.question, str) or not (e.question.strip() or "source" in e.meta):
            raise DatasetError(
                f"dataset {dataset!r}: example {e.id!r} has an empty question; every example "
                "needs one"
            )


def check_metrics(cfg: RunConfig, examples: list[Example]) -> None:
    """A metric that reads each example's meta (``longbench``: the subset's official metric)
    must be able to score every example, or each record of the run would fail: a ConfigError
    at ``metrics.<i>`` naming what it needs, before anything runs."""
    if not generates_answers(cfg):
        return
    for i, name in enumerate(cfg.metrics):
        problem_of = METRICS.get(name).meta_problem
        if problem_of is None:
            continue
        bad = [(e.id, p) for e in examples if (p := problem_of(e.meta)) is not None]
        if bad:
            raise error_at(
                cfg,
                ("metrics", i),
                (
                    f"{name} cannot score {len(bad)} of the {len(examples)} examples of dataset "
                    f"{cfg.dataset.name!r} (the first: {bad[0][0]!r}): it {bad[0][1]}; name a metric "
                    "that fits this dataset (`ragbench list metrics`)"
                ),
                None,
            )


def check_queries(cfg: RunConfig, examples: list[Example]) -> None:
    """A strategy that retrieves searches with each example's question, so an example that asks
    nothing (LongBench's summaries, passage counts and code completion; an imported file may
    hold them) could only fail under it, at every rerun: a ConfigError at ``strategies.<i>``
    naming how many, the first and what to do, before anything runs."""
    empty = [e for e in examples if not e.question.strip()]
    if not empty:
        return
    for i, s in enumerate(cfg.strategies):
        if not get_strategy(s.name).needs_retrieval:
            continue
        subsets = sorted({str(e.meta["dataset"]) for e in empty if "dataset" in e.meta})
        among = f"; subsets: {', '.join(subsets)}" if subsets else ""
        others = strategies_where(needs_retrieval=False, generates=True, external=False)
        raise error_at(
            cfg,
            ("strategies", i),
            (
                f"{s.name} retrieves with each example's question, but {len(empty)} of the "
                f"{len(examples)} examples of dataset {cfg.dataset.name!r} have an empty question "
                f"(the first: {empty[0].id!r}{among}): drop those examples from the dataset, or run "
                f"them in a config of their own with {' or '.join(others)}"
            ),
            None,
        )


def load_examples(config: str | os.PathLike | RunConfig | dict) -> list[Example]:
    """The examples a config (path, dict or RunConfig) runs on, as the run builds them: what
    failure attribution needs beside the table (evidence spans, needles, distractors)."""
    cfg = load_config(config)
    source = str(config) if isinstance(config, str | os.PathLike) else None
    source = source or getattr(cfg, "_source_file", None)
    try:
        examples = list(build_dataset(cfg.dataset.name, **cfg.dataset_params()))
    except DatasetParamError as exc:  # reported at dataset.params.<key> of the config file
        raise param_error(cfg, exc, source) from None
    except HaystackTooShortError as exc:  # a context length the haystack cannot fill
        if "context_lengths" not in cfg.dataset.params:
            raise
        raise param_error(cfg, DatasetParamError("context_lengths", str(exc)), source) from None
    except HubUnavailableError as exc:  # the dataset's tokenizer, from the Hub
        if "tokenizer" not in cfg.dataset.params:
            raise
        local = "; or name a local tokenizer (a folder, a .gguf file or whitespace)"
        raise error_at(cfg, ("dataset", "params", "tokenizer"), str(exc) + local, source) from None
    return examples[: cfg.dataset.limit] if cfg.dataset.limit else examples


def param_error(cfg: RunConfig, exc: DatasetParamError, source: str | None) -> ConfigError:
    """A generator's bad parameter as the config loader reports one: ``file:line:
    dataset.params.<key>: message`` (no line when ``--set`` overrides changed the file's text)."""
    return error_at(cfg, ("dataset", "params", exc.key), exc.message, source)


def error_at(cfg: RunConfig, loc: tuple, message: str, source: str | None) -> ConfigError:
    """``message`` about the config key at ``loc`` as the config loader reports one:
    ``file:line: <key>: message`` (no line when ``--set`` overrides changed the file's text;
    ``source``: the config file, else the one ``cfg`` was read from)."""

    def fail(message: str) -> None:
        raise ValueError(message)

    source = source or cfg._source_file
    text = None
    if source and Path(source).is_file() and not cfg._overrides:
        text = Path(source).read_text(encoding="utf-8")
    try:
        located(loc, fail, message)
    except ValidationError as err:
        return ConfigError(explain_validation_error(err, source or "<config>", text, RunConfig))
    raise AssertionError("located() always raises")


def generates_answers(cfg: RunConfig) -> bool:
    """Whether any strategy of the config calls the model (``retrieve_only`` does not)."""
    return any(get_strategy(s.name).generates for s in cfg.strategies)


def load_model(m: ModelConfig) -> LLM:
    """The LLM a ``ModelConfig`` names (the model under test, or a judge), behind the shared
    completion cache (``cache_dir()/completions.sqlite``) when ``m.cache``."""
    if m.threads:
        set_threads(m.threads)
    cache = cache_dir() / "completions.sqlite" if m.cache else None
    loads = backend_capabilities(m.backend).local_weights  # seconds to minutes: say so
    threads = f", {m.threads} threads" if m.threads else ""
    if loads:
        announce(f"loading model {m.name} ({m.backend}{threads}) ...")
    t0 = time.perf_counter()
    llm = load_llm(m.backend, cache=cache, model=m.name, **m.params, **m.backend_options())
    if loads:
        announce(f"loaded model {m.name} in {time.perf_counter() - t0:.1f} s")
    return llm


class Warmup:
    """A run's model loaded in a background thread while the command does other work, then
    calibrated to the run's longest request when told the run's config (:meth:`calibrate`), so
    ``runner.run(cfg, llm=warmup.llm())`` finds both done.

    Why a thread: a first load converts the GGUF weights (tens of seconds, mostly one core) and
    a calibration times forward passes for a minute or more; ``ragbench compare`` reads the
    documents, writes the config and makes its estimate meanwhile. Why the calibration waits to
    be told: it times the device, and the estimate embeds and retrieves on the same cores; timed
    beside it, the probes would charge the run for the command's own work. A backend without
    local weights needs neither (``needed``)."""

    def __init__(self, model: ModelConfig) -> None:
        set_threads(model.threads)  # here, before any thread runs torch: one setting for both
        _import_shared()
        self._cfg: RunConfig | None = None
        self._go = threading.Event()
        self._llm: LLM | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(
            target=self._work, args=(model,), name="ragbench-warmup", daemon=True
        )
        self._thread.start()

    @staticmethod
    def needed(model: ModelConfig) -> bool:
        """Whether loading this model takes long enough to be worth a thread (local weights)."""
        return backend_capabilities(model.backend).local_weights

    def _work(self, model: ModelConfig) -> None:
        try:
            self._llm = load_model(model)
            self._go.wait()
            if self._cfg is not None and generates_answers(self._cfg):
                calibrate(self._cfg, self._llm, load_examples(self._cfg))
        except BaseException as exc:  # handed to the caller of llm()
            self._error = exc

    def calibrate(self, cfg: RunConfig) -> None:
        """Calibrate to ``cfg``'s longest request once the model is loaded; call it when nothing
        else of the command's runs on the device."""
        self._cfg = cfg
        self._go.set()

    def llm(self) -> LLM:
        """The loaded model, once it is loaded (and calibrated, if :meth:`calibrate` was called);
        an error in the thread is raised here."""
        self._go.set()  # not told by now: nothing to calibrate beforehand
        self._thread.join()
        if self._error is not None:
            raise self._error
        assert self._llm is not None  # loaded: else the thread's error was raised above
        return self._llm


def _import_shared() -> None:
    """The libraries both threads import, imported in this one first: the command's estimate
    (tokenizer, embedder) and the model's load import transformers, and one thread importing it
    while the other is half-way through saw a partial module ("cannot import name
    'AutoTokenizer' from 'transformers'")."""
    for module in ("torch", "transformers.modeling_utils"):
        importlib.import_module(module)
    transformers = importlib.import_module("transformers")
    for name in ("AutoConfig", "AutoModelForCausalLM", "AutoTokenizer"):  # lazy until first read
        getattr(transformers, name)


def rates_of(llm: object, longest: int | None = None) -> Rates | None:
    """The model's calibration (``llm.calibration``: measured once per model, device, dtype,
    thread count and probed length, then read from its cache), probed to ``longest`` prompt
    tokens, through a completion cache; None for a backend without one (a server, the fake
    backend)."""
    for _ in range(4):  # CachedLLM(llm): the wrapped model is .llm
        get = getattr(llm, "cost_rates", None)
        if callable(get):
            rates = get(longest) if longest else get()
            return rates if isinstance(rates, Rates) else None
        llm = getattr(llm, "llm", None)
    return None


def calibrate(cfg: RunConfig, llm: object, examples: Iterable[Example]) -> Rates | None:
    """``rates_of`` the run's model probed to its longest request (``prompt_reach``), its
    announcement saying which strategies reach that far (``calibration.because``)."""
    reach = prompt_reach(llm, examples, cfg.points, cfg.model.max_new_tokens)
    with because(reach.why() if reach is not None else ""):
        return rates_of(llm, reach.tokens if reach is not None else None)


def longest_prompt(
    llm: object,
    examples: Iterable[Example],
    points: Iterable[StrategyParams],
    max_new_tokens: int = 0,
) -> int | None:
    """The most positions a request of the run can reach: what its calibration probes to, and
    no further, since timing long prefills on a CPU takes minutes. The most over the parameter
    points that call the model, of a request's prompt and its new tokens.

    A point's prompt is its strategy's ``context_bound`` (closed book: nothing; RAG: its
    retrieval budget), the longest question and ``TEMPLATE_TOKENS``. A strategy that declares no
    bound reads everything: the whole example, the one with the most text (its documents and
    question, counted with the model's tokenizer) plus the template, which also caps every
    bound. So a RAG-only run is calibrated to a few chunks, not to its longest haystack, and a
    run that also has long context to the haystack. A chain-of-thought point's request adds its
    format's reasoning tokens (its answer step holds the reasoning and generates the answer).
    None: no examples."""
    reach = prompt_reach(llm, examples, points, max_new_tokens)
    return None if reach is None else reach.tokens


@dataclass(frozen=True)
class Reach:
    """How far a run's requests reach (``prompt_reach``): the most positions, and why."""

    tokens: int  # prompt + new tokens of the longest request
    strategies: tuple[str, ...]  # the strategies whose requests reach it
    whole: bool  # they read a whole example (no context bound)

    def why(self) -> str:
        """The calibration's reason, in words (``llm.calibration.because``)."""
        what = "a whole example" if self.whole else "their context bound"
        who = ", ".join(self.strategies) or "every request"
        return f"the longest request this run sends: {who}, {what}, {self.tokens:,} tokens"


def prompt_reach(
    llm: Any,
    examples: Iterable[Example],
    points: Iterable[StrategyParams],
    max_new_tokens: int = 0,
) -> Reach | None:
    """``longest_prompt`` with the strategies that reach it (the calibration says why it probes
    so far). None: no examples."""
    examples = list(examples)
    most = max(examples, key=lambda e: sum(len(d.text) for d in e.documents), default=None)
    if most is None:
        return None
    text = "\n\n".join([*(d.text for d in most.documents), most.question])
    whole = llm.count_tokens(text) + TEMPLATE_TOKENS
    points = [p for p in points if get_strategy(p.strategy).generates]
    bounded = [p for p in points if get_strategy(p.strategy).context_bound is not None]
    asked = max(llm.count_tokens(e.question) for e in examples) if bounded else 0
    cot = [p for p in points if getattr(p, "cot", False)]  # the first call: the reasoning budget
    reasoning = max(prompt_format(e).cot_tokens or 0 for e in examples) if cot else 0

    def reach(point: StrategyParams) -> int:  # one request of ``point``: its prompt, new tokens
        bound = get_strategy(point.strategy).context_bound
        prompt = whole if bound is None else min(bound(point) + asked + TEMPLATE_TOKENS, whole)
        return prompt + max_new_tokens + (reasoning if point in cot else 0)

    if not points:  # none: reads everything
        return Reach(whole + max_new_tokens, (), True)
    tokens = max(map(reach, points))
    top = [p for p in points if reach(p) == tokens]
    unbounded = any(get_strategy(p.strategy).context_bound is None for p in top)
    return Reach(tokens, tuple(dict.fromkeys(p.strategy for p in top)), unbounded)


TEMPLATE_TOKENS = 64  # a prompt template's instruction and chat markup, beyond the text


def check_server(llm: object, points: Iterable[StrategyParams] = ()) -> None:
    """One short request to the model's server (backends that have one) before any work: a dead
    server fails the run in seconds with its URL, instead of every record after its retries.
    Then each parameter point's own preflight (``Strategy.preflight``: a pipeline's endpoint)."""
    check = getattr(llm, "check", None)
    if callable(check):
        check()
    preflight_points(points)


def chunk_tokenizer(cfg: RunConfig) -> str:
    """The tokenizer documents are chunked with: the configured one, else the model's own when
    its backend counts with the tokenizer its name names and the name is an embedded preset
    (offline), else whitespace."""
    if cfg.retrieval.tokenizer:
        return cfg.retrieval.tokenizer
    name = cfg.model.name
    embedded = name in PRESETS and PRESETS[name].embedded
    own = backend_capabilities(cfg.model.backend).own_tokenizer
    return name if own and embedded else "whitespace"


def make_index(cfg: RunConfig, cache_size: int = 8) -> IndexFn:
    """(example, retrieval settings) -> (chunks, retriever), memoised by documents and settings
    (many questions share one corpus); each embedder is loaded once per run, and none for a
    retriever that embeds nothing (``needs_embedder``: bm25)."""
    tokenizer = chunk_tokenizer(cfg)
    embedders: dict[str, object] = {}
    memo: OrderedDict[tuple[str, RetrievalParams], tuple[list, object]] = OrderedDict()

    def index(example: Example, settings: RetrievalParams) -> tuple[list, object]:
        # a shared corpus is named by its fingerprint (serialising it per question would cost
        # more than the lookup saves); an example's own documents by their content
        shared = example.meta.get("corpus_fingerprint")
        docs = shared or dumps_canonical([d.to_dict() for d in example.documents])
        key = (str(docs), settings)
        if key not in memo:
            options = cfg.retrieval.params_for(settings.retriever)
            # a retriever that embeds nothing (bm25, rerank over bm25) loads no embedder
            name = settings.embedder if needs_embedder(settings.retriever, options) else None
            if name is not None and name not in embedders:
                params = cfg.retrieval.embedder_params.get(name, {})
                embedders[name] = get_embedder(name, **params)
            memo[key] = build_index(
                example.documents,
                retriever=settings.retriever,
                embedder=embedders[name] if name is not None else None,  # None: embeds nothing
                splitter=settings.splitter,
                chunk_size=settings.chunk_size,
                chunk_overlap=settings.chunk_overlap,
                tokenizer=tokenizer,
                retriever_params=options,
            )
            if len(memo) > cache_size:
                memo.popitem(last=False)
        memo.move_to_end(key)
        return memo[key]

    return index


def build_resources(
    cfg: RunConfig, llm: Any, kv_dtype: str | None = None, examples: Iterable[Example] = ()
) -> Resources:
    """What the strategies read besides the example: the LLM, the metrics, the token limits, the
    architecture preset, the config's price sheet (loaded once, by the config) and, when a
    strategy retrieves, the index builder. ``kv_dtype``: the transformers backend's dtype
    (``identity()["dtype"]``), which its KV cache is stored in. The model's calibration (its
    rates: what the default ``cost_basis`` charges) is read here, before any record; the
    manifest records it from ``res.rates`` (``session.RunSession.use``). ``examples``: what the
    run will ask, so the calibration probes up to the longest prompt its strategies can send
    them (``longest_prompt``; none: the default range)."""
    needs_index = any(get_strategy(s.name).needs_retrieval for s in cfg.strategies)
    rates = None
    if generates_answers(cfg):
        rates = calibrate(cfg, llm, examples)
    return Resources(
        llm=llm,
        metrics=tuple(cfg.metrics),
        max_new_tokens=cfg.model.max_new_tokens,
        prompt_budget=cfg.prompt_budget,
        preset=get_preset(cfg.model.arch) if cfg.model.arch else None,
        kv_dtype=kv_dtype,
        sheet=cfg.sheet,
        rates=rates,
        cost_basis=cfg.cost_basis,
        index=make_index(cfg) if needs_index else None,
    )
