"""Experiment config: one YAML file -> a validated, hashable ``RunConfig``.

Unknown keys are errors (pydantic ``extra="forbid"``) reported as ``file:line: field: message``
with the closest valid key; unknown model, strategy, dataset and metric names get a did-you-mean.
``config_hash`` is the sha256 of the canonical JSON of the validated config (defaults filled in,
``output_dir`` left out), so the same experiment always lands in the same run folder.

Validated once: the typed objects a run reads (``cfg.points``, ``cfg.sheet``) are built by
validation and kept as private attributes (not in the dump or the hash), never rebuilt.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    field_validator,
    model_validator,
)

import ragbench.retrieval as registries  # EMBEDDERS, RETRIEVERS, SPLITTERS, retriever options
from ragbench.cost.prices import PriceSheet, price_sheet
from ragbench.datasets import DATASETS, check_params
from ragbench.experiment.config_text import (  # noqa: F401 (re-exported)
    ConfigError,
    apply_overrides,
    explain_validation_error,
    located,
)
from ragbench.io import dumps_canonical
from ragbench.judge.prompts import DEFAULT_PROMPTS, load_prompt
from ragbench.llm import BACKENDS, backend_capabilities
from ragbench.metrics.answer import METRICS
from ragbench.models import PRESETS
from ragbench.registry import unknown
from ragbench.retrieval.precision import check_precision_param
from ragbench.secrets import collect, redact
from ragbench.strategies import get_strategy
from ragbench.strategies.params import RetrievalParams, StrategyParams
from ragbench.strategies.pipeline_target import imports_from
from ragbench.tokenizers import check_tokenizer


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class DatasetConfig(_Strict):
    name: str  # niah | ruler/<task> | multidoc | file: which builder makes the examples
    params: dict[str, Any] = Field(
        default_factory=dict
    )  # builder kwargs (lengths, depths, path...)
    limit: int | None = Field(None, ge=1)  # first N examples: quick looks without editing the grid

    @model_validator(mode="after")
    def _known(self) -> DatasetConfig:
        DATASETS.check(self.name)  # unknown name -> did-you-mean over the registered datasets
        check_params(self.name, self.params)
        return self


class ModelConfig(_Strict):
    backend: str = "hf"  # where generation runs: hf | openai | fake (ragbench.llm.BACKENDS)
    name: str = "smollm2-135m-instruct"  # preset name, HF id/folder, or served model name
    params: dict[str, Any] = Field(default_factory=dict)  # backend kwargs: device, base_url, ...
    preset: str | None = None  # architecture for FLOPs/KV bytes; default: `name` if it is a preset
    max_new_tokens: int = Field(32, ge=1)  # SmolLM2 restates the question: allow >= 32
    cache: bool = True  # sqlite completion cache: reruns and resumed runs cost nothing
    # records generated together, one LLM call per round: padded batches and shared document
    # prefixes on transformers, concurrent requests on a server; 1 = one request at a time
    batch_size: int = Field(8, ge=1)
    # torch CPU threads (torch.set_num_threads) for the transformers backend and local
    # embedders; None: torch's default (all cores). On a shared or loaded machine 1-2 threads
    # can be several times faster than the default, which oversubscribes the cores. Not part of
    # the config hash: it changes speed, not answers.
    threads: int | None = Field(None, ge=1)

    @field_validator("backend")
    @classmethod
    def _backend(cls, v: str) -> str:
        return BACKENDS.check(v)

    @model_validator(mode="after")
    def _known(self) -> ModelConfig:
        if self.preset is not None and self.preset not in PRESETS:
            raise unknown("model preset", self.preset, PRESETS)
        local = "/" in self.name or os.sep in self.name or self.name.endswith(".gguf")
        loads_weights = backend_capabilities(self.backend).local_weights  # by name, in-process
        if loads_weights and self.name not in PRESETS and not local:  # preset, HF id or path
            raise unknown("model", self.name, [*PRESETS, "<HF id or folder>"])
        return self

    @property
    def arch(self) -> str | None:
        return self.preset or (self.name if self.name in PRESETS else None)


def one_or_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


_R = RetrievalParams  # the retrieval settings' defaults live on the parameter class


class RetrievalConfig(_Strict):
    """The index the retrieving strategies (rag, self_route) read. The first five fields take a
    value or a list (a grid, crossed with each strategy's own parameter grid, and recorded in
    every record's params); a strategy's ``params`` may override them."""

    embedder: str | list[str] = _R.embedder  # minilm (embedded, offline) | hash (fast tests)
    retriever: str | list[str] = _R.retriever  # dense | bm25 | hybrid | rerank
    splitter: str | list[str] = _R.splitter  # llama-index splitter: sentence | token
    chunk_size: int | list[int] = _R.chunk_size  # tokens per chunk (the chunking tokenizer's)
    chunk_overlap: int | list[int] = _R.chunk_overlap  # tokens shared by neighbouring chunks
    retriever_params: dict[str, Any] = Field(default_factory=dict)  # e.g. hybrid weights
    # per embedder name, its constructor's arguments: {openai: {model, base_url, batch_size}},
    # {minilm: {precision: bf16}} (fp32 | bf16 | bf16-full), {minilm: {backend: onnx}}
    embedder_params: dict[str, dict[str, Any]] = Field(default_factory=dict)
    tokenizer: str | None = None  # chunking tokenizer; default: the model preset's, else whitespace

    @field_validator("embedder", "retriever", "splitter")
    @classmethod
    def _names(cls, v: Any, info: Any) -> Any:
        registry = getattr(registries, f"{info.field_name.upper()}S")
        for name in one_or_list(v):
            registry.check(name)
        return v

    @field_validator("tokenizer")
    @classmethod
    def _tokenizer(cls, v: str | None) -> str | None:
        return v if v is None else check_tokenizer(v)

    @model_validator(mode="after")
    def _combinations(self) -> RetrievalConfig:
        # every point of the section's grid (chunk overlap below each chunk size, ...) is
        # checked by the parameter class that owns the settings
        RetrievalParams.grid(self.grid_values())
        embedders = [e.lower() for e in one_or_list(self.embedder)]
        for name, params in self.embedder_params.items():
            if name.lower() not in embedders:  # settings for an embedder the run does not use
                raise unknown("embedder in embedder_params", name, embedders)
            check_precision_param(name, params)  # fp32 | bf16 | bf16-full, before any model loads
        names = one_or_list(self.retriever)
        for key in self.retriever_params:  # each key must serve at least one retriever
            if not any(key in self.params_for(name) for name in names):
                registries.check_retriever_params(names[0], {key: self.retriever_params[key]})
        return self

    def params_for(self, retriever: str) -> dict[str, Any]:
        """The ``retriever_params`` that ``retriever`` takes: a grid of retrievers shares one
        mapping (say a cross-encoder for rerank beside dense and bm25)."""
        options = registries.retriever_options(retriever)
        return {k: v for k, v in self.retriever_params.items() if k in options}

    def grid_values(self) -> dict[str, Any]:
        """The grid-able settings, as a strategy's parameter grid takes them."""
        return {k: getattr(self, k) for k in RetrievalParams.field_names()}


class StrategyConfig(_Strict):
    """One strategy to compare; its parameter points are built and validated by the run config
    (crossed with the retrieval grid, once: ``RunConfig.points``)."""

    name: str  # closed_book | long_context | rag | self_route (ragbench.strategies.STRATEGIES)
    params: dict[str, Any] = Field(default_factory=dict)  # list values expand into a grid

    @model_validator(mode="after")
    def _known(self) -> StrategyConfig:
        get_strategy(self.name)  # unknown name -> did-you-mean over the registered strategies
        return self


class JudgeConfig(_Strict):
    """The judge of ``judge_correct`` / ``judge_faithful`` and the embedder of
    ``semantic_similarity`` (``ragbench.judge``). The judge is its own model, never the model
    under test unless ``allow_model_under_test`` says so: a model grading itself is lenient in
    exactly the places it is wrong."""

    model: ModelConfig | None = None  # any backend: hf | openai | fake; needed by judge metrics
    allow_model_under_test: bool = False  # let the judge be the same model config as `model`
    samples: int = Field(1, ge=1)  # judgements per record; > 1 reports Fleiss' kappa across them
    temperature: float = Field(0.0, ge=0.0)  # > 0 when samples > 1 (else they are copies)
    max_attempts: int = Field(3, ge=1)  # tries per judgement when the reply cannot be parsed
    prompts: dict[str, str] = Field(default_factory=dict)  # metric -> template name or YAML path
    price_sheet: str | None = None  # prices the judge's calls (judge_dollars); None: no dollars
    embedder: str | None = None  # semantic_similarity; default: the retrieval embedder

    _sheet: PriceSheet | None = PrivateAttr(default=None)  # `price_sheet`, loaded by validation

    @model_validator(mode="after")
    def _valid(self) -> JudgeConfig:
        if self.samples > 1 and self.temperature <= 0:
            raise ValueError(
                f"judge.samples is {self.samples} but judge.temperature is 0: greedy samples of "
                "one prompt are copies; set judge.temperature > 0 (e.g. 0.7) or samples: 1"
            )
        for metric, name in self.prompts.items():
            if metric not in DEFAULT_PROMPTS:
                raise unknown("judge metric", metric, DEFAULT_PROMPTS)
            prompt = load_prompt(name)
            if prompt.metric != metric:
                raise ValueError(f"judge prompt {name!r} scores {prompt.metric}, not {metric}")
        if self.price_sheet is not None:
            self._sheet = price_sheet(self.price_sheet)
        if self.embedder is not None:
            registries.EMBEDDERS.check(self.embedder)
        return self

    @property
    def sheet(self) -> PriceSheet | None:
        """The loaded ``price_sheet`` that prices the judge's calls (None: no dollars)."""
        return self._sheet

    def prompt(self, metric: str):
        """The template that scores ``metric`` (``judge_correct``: ``correct-v1`` unless set)."""
        return load_prompt(self.prompts.get(metric, DEFAULT_PROMPTS[metric]))


PATH_PARAMS = ("path", "corpus", "questions")  # dataset parameters that name files


class RunConfig(_Strict):
    name: str = Field(pattern=r"^[A-Za-z0-9_.-]+$")  # run folder: <name>-<hash[:8]>
    seed: int = 0  # every generator and bootstrap takes it: same config, same table
    dataset: DatasetConfig
    model: ModelConfig = Field(default_factory=ModelConfig)
    retrieval: RetrievalConfig = Field(default_factory=RetrievalConfig)
    strategies: list[StrategyConfig] = Field(min_length=1)  # compared on the same examples
    metrics: list[str] = Field(default_factory=lambda: ["string_match_all"])  # answer metrics
    prompt_budget: int | None = Field(None, ge=1)  # matched budgets: one prompt-token cap for all
    price_sheet: str | None = None  # shipped sheet name or YAML path; None: no $ column
    # what an hourly sheet charges: calibrated = the seconds the model's measured rates give the
    # query's own tokens (same tokens, same dollars, whatever the load); measured = its measured
    # share of device time (varies with the load). Token sheets price tokens either way.
    cost_basis: Literal["calibrated", "measured"] = "calibrated"
    judge: JudgeConfig | None = None  # judge metrics' model and settings (ragbench.judge)
    output_dir: str = "data/results"  # where run folders go (not part of the hash)

    # the folder of the YAML file the config came from: relative dataset paths resolve there
    _source_dir: str | None = PrivateAttr(default=None)
    _source_file: str | None = PrivateAttr(default=None)  # that YAML file (error locations)
    # `--set dotted.path=value` overrides applied on top of the file (recorded in the manifest)
    _overrides: list[str] = PrivateAttr(default_factory=list)
    # built by validation (`_typed`), read by the run: not part of the dump or the hash
    _points: tuple[StrategyParams, ...] = PrivateAttr(default=())
    _sheet: PriceSheet | None = PrivateAttr(default=None)
    # the calibration the run priced with, set when its resources are built (for the manifest)
    _calibration: dict[str, Any] | None = PrivateAttr(default=None)

    @property
    def points(self) -> tuple[StrategyParams, ...]:
        """Every (strategy, parameter point) of the config, in config order: each strategy's
        ``params`` grid, crossed with the ``retrieval`` grid for the strategies that retrieve."""
        return self._points

    @property
    def sheet(self) -> PriceSheet | None:
        """The loaded ``price_sheet`` (None: no dollar column)."""
        return self._sheet

    def dataset_params(self) -> dict[str, Any]:
        """The dataset builder's kwargs, with relative file parameters (``PATH_PARAMS``) resolved
        against the config file's folder when the file is there (else as given: the working
        directory). Resolved here, not stored, so the config hash stays machine-independent."""
        params = dict(self.dataset.params)
        if self._source_dir is None:
            return params
        for key in PATH_PARAMS:
            value = params.get(key)
            if isinstance(value, str) and value and not Path(value).is_absolute():
                candidate = Path(self._source_dir) / value
                if candidate.exists():
                    params[key] = str(candidate)
        return params

    @field_validator("strategies", mode="before")
    @classmethod
    def _shorthand(cls, v: Any) -> Any:  # `- rag` is short for `- {name: rag}`
        return [{"name": s} if isinstance(s, str) else s for s in v] if isinstance(v, list) else v

    @field_validator("metrics")
    @classmethod
    def _metrics(cls, v: list[str]) -> list[str]:
        return [METRICS.check(name) for name in v]

    @model_validator(mode="after")
    def _typed(self) -> RunConfig:
        """The typed objects the run reads, built once: each strategy's grid crossed with the
        retrieval grid (a strategy's chunk_size with the section's chunk_overlap, say; every
        point must be valid before anything loads) and the price sheet. Errors name the place
        in the file they come from (``strategies.1``, ``price_sheet``)."""
        retrieval_grid = self.retrieval.grid_values()
        points: list[StrategyParams] = []
        for i, s in enumerate(self.strategies):
            grid = located(("strategies", i), get_strategy(s.name).grid, s.params, retrieval_grid)
            points.extend(grid)
        self._points = tuple(points)
        if not self.metrics and any(get_strategy(p.strategy).generates for p in points):
            raise ValueError("metrics: [] scores no answer; name one (e.g. string_match_all)")
        if self.price_sheet is not None:
            self._sheet = located(("price_sheet",), price_sheet, self.price_sheet)
        return self

    @model_validator(mode="after")
    def _judge(self) -> RunConfig:
        """Judge metrics need a judge model, and not the model under test unless allowed."""
        judged = [m for m in self.metrics if METRICS.get(m).kind == "judge"]
        judge = self.judge
        if judged and (judge is None or judge.model is None):
            raise ValueError(
                f"metrics {judged} need a judge model: add a `judge:` section with `model:` "
                "(backend, name, params), e.g. judge: {model: {backend: openai, name: ...}}"
            )
        same = lambda m: (m.backend, m.name, m.params)  # noqa: E731 (what makes it that model)
        if judge is not None and judge.model is not None and same(judge.model) == same(self.model):
            if not judge.allow_model_under_test:
                raise ValueError(
                    "judge.model is the model under test; a model grading its own answers is "
                    "biased. Name another model, or set judge.allow_model_under_test: true"
                )
        return self


# ---------------------------------------------------------------------------- loading and hashing
# (the text side: --set overrides and file:line validation messages live in config_text.py)


def config_hash(config: RunConfig) -> str:
    """Identity of a config's results. Credentials are masked first: a new password or key
    gives the same run folder, and the hash is never a function of a secret."""
    # threads change speed, not answers: the same run folder whatever the machine's load
    data = redact(
        config.model_dump(mode="json", exclude={"output_dir": True, "model": {"threads"}})
    )
    if data.get("judge") is None:  # configs written before the judge section hash as before
        data.pop("judge", None)
    if data.get("cost_basis") == "calibrated":  # added later: the default hashes as before
        data.pop("cost_basis")
    return hashlib.sha256(dumps_canonical(data).encode("utf-8")).hexdigest()


def parse_config(data: Any, source: str = "<config>", text: str | None = None) -> RunConfig:
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: a config must be a YAML mapping, got {type(data).__name__}")
    collect(data)  # credentials in it are masked in every later error, log and file
    try:
        return RunConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(explain_validation_error(exc, source, text, RunConfig)) from None


def load_config(
    path: str | os.PathLike | RunConfig | dict, overrides: Sequence[str] = ()
) -> RunConfig:
    """A RunConfig from a YAML path (or a dict, or an existing RunConfig), with ``overrides``
    (``dotted.path=value``, see :func:`apply_overrides`) applied before validation and kept in
    ``cfg._overrides`` for the manifest."""
    if isinstance(path, RunConfig):
        if not overrides:
            return path
        cfg = parse_config(apply_overrides(path.model_dump(mode="json"), overrides))
        cfg._source_dir, cfg._source_file = path._source_dir, path._source_file
        cfg._overrides = [*path._overrides, *overrides]
        return cfg
    if isinstance(path, dict):
        cfg = parse_config(apply_overrides(path, overrides))
        cfg._overrides = list(overrides)
        return cfg
    path = Path(path)
    if not path.exists():
        raise ConfigError(f"{path}: no such config file")
    text = path.read_text(encoding="utf-8")
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark else str(path)
        raise ConfigError(f"{where}: invalid YAML: {getattr(exc, 'problem', exc)}") from None
    if overrides:
        if not isinstance(data, dict):
            raise ConfigError(f"{path}: a config must be a YAML mapping")
        data = apply_overrides(data, overrides)
    with imports_from(path.resolve().parent):  # a pipeline target may sit beside the config
        cfg = parse_config(data, str(path), None if overrides else text)
    cfg._source_dir, cfg._source_file = str(path.resolve().parent), str(path)
    cfg._overrides = list(overrides)
    return cfg
