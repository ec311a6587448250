"""The sections of a run config (``ragbench.experiment.config.run.RunConfig``): dataset, model,
retrieval, strategies, judge, sequential, tracking. Each validates itself; the run config checks how they combine."""

from __future__ import annotations

import inspect
import os
from pathlib import Path
from typing import Annotated, Any, Literal, cast
from urllib.parse import urlparse

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    field_validator,
    model_validator,
    with_config,
)
from typing_extensions import TypedDict  # pydantic reads typing's only from Python 3.12

import ragbench.retrieval as registries  # EMBEDDERS, RETRIEVERS, SPLITTERS, retriever options
from ragbench.cost.prices import PriceSheet, price_sheet
from ragbench.datasets import UnknownParamError, check_name, check_params
from ragbench.experiment.config.text import located
from ragbench.judge.calls import QUESTIONS  # answer_relevancy's default (RAGAS: 3)
from ragbench.judge.metric import get_judge_metric, judged_metrics
from ragbench.judge.prompts import JudgePrompt, load_prompt
from ragbench.llm import BACKENDS, backend_capabilities, backend_params, check_backend_params
from ragbench.llm.hf.load import PICKLE_OPTION, refuse_pickle_weights
from ragbench.llm.openai import payload as wire
from ragbench.models import PRESETS, get_preset
from ragbench.registry import unknown
from ragbench.retrieval.embedders.precision import check_precision_param
from ragbench.secrets import names_a_credential
from ragbench.strategies import get_strategy
from ragbench.strategies.params import RetrievalParams
from ragbench.tokenizers import check_tokenizer

MAX_NEW_TOKENS = 1_000_000  # answer tokens per call: above any model's window today


@with_config(ConfigDict(extra="allow"))
class ModelParams(TypedDict, total=False):
    """``model.params``: the backend's keyword arguments, any it takes (``ModelConfig._params``
    names one it does not); those the config reads before the model loads are declared here,
    with their ranges."""

    # tokens; leave it out for the model's own (strict: 8192.0 or "8192" is no window)
    context_window: Annotated[int, Field(strict=True, ge=1)] | None


def _known_window(fields: dict[str, Any]) -> int | None:
    """The context window of a model section's (validated so far) ``fields``, when it is known
    without loading anything: ``params.context_window``, else the backend's default for it,
    else (a backend that loads weights, unscaled) the preset's; None otherwise."""
    params = fields.get("params") or {}
    window = params.get("context_window")
    if window is not None:  # declared and checked (ModelParams)
        return window
    if "backend" not in fields or any(k.startswith("rope") for k in params):
        return None
    default = inspect.signature(BACKENDS.get(fields["backend"]).__init__).parameters.get(
        "context_window"
    )
    if default is not None and isinstance(default.default, int):
        return default.default
    name = fields.get("preset") or fields.get("name")
    local = backend_capabilities(fields["backend"]).local_weights
    if local and isinstance(name, str) and name in PRESETS:
        return get_preset(name).context_window
    return None


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
        check_name(self.name)  # unknown name -> did-you-mean; an import format -> dataset file
        try:
            check_params(self.name, self.params)
        except UnknownParamError as exc:  # at its own line: dataset.params.<key>
            located(("params", exc.key), _refuse, str(exc))
        return self


def _refuse(message: str) -> None:
    raise ValueError(message)


class RateLimitConfig(_Strict):
    """A server's or API's limits (``ragbench.llm.rate_limit``): the backend waits before each
    request so the run stays under them. None: unlimited (the server's headers still pause it)."""

    requests_per_minute: float | None = Field(None, gt=0)
    tokens_per_minute: float | None = Field(None, gt=0)  # prompt + max_new_tokens per request

    def share(self, workers: int) -> RateLimitConfig:
        """One of ``workers`` equal shares: what each Ray worker's own limiter holds to, so the
        run together stays under the account's limit."""
        rpm, tpm = self.requests_per_minute, self.tokens_per_minute
        return self.model_copy(
            update={
                "requests_per_minute": rpm / workers if rpm else None,
                "tokens_per_minute": tpm / workers if tpm else None,
            }
        )


class ModelConfig(_Strict):
    backend: str = "hf"  # where generation runs: hf | openai | fake (ragbench.llm.BACKENDS)
    name: str = "smollm2-135m-instruct"  # preset name, HF id/folder, or served model name
    params: ModelParams = Field(
        default_factory=ModelParams
    )  # backend kwargs: device, base_url, ...
    preset: str | None = None  # architecture for FLOPs/KV bytes; default: `name` if it is a preset
    # SmolLM2 restates the question: allow >= 32; below the window where it is known (_room)
    max_new_tokens: int = Field(32, ge=1, le=MAX_NEW_TOKENS)
    cache: bool = True  # sqlite completion cache: reruns and resumed runs cost nothing
    # records generated together, one LLM call per round: padded batches and shared document
    # prefixes on transformers, concurrent requests on a server; 1 = one request at a time
    batch_size: int = Field(8, ge=1)
    # torch CPU threads (torch.set_num_threads) for the transformers backend and local
    # embedders; None: torch's default (all cores). On a shared or loaded machine 1-2 threads
    # can be several times faster than the default, which oversubscribes the cores. Not part of
    # the config hash: it changes speed, not answers.
    threads: int | None = Field(None, ge=1)
    # requests/tokens per minute, for a backend that takes ``rate_limit`` (openai), for the whole
    # run: on Ray each worker holds to its share (``share``). Not part of the config hash: like
    # threads, it changes speed, not answers
    rate_limit: RateLimitConfig | None = None

    @field_validator("backend")
    @classmethod
    def _backend(cls, v: str) -> str:
        return BACKENDS.check(v)

    @field_validator("params")
    @classmethod
    def _params(cls, v: dict[str, Any], info: Any) -> dict[str, Any]:
        """The values a backend would otherwise refuse only when built (or, for a URL's port,
        at its first request): named here, at ``model.params``."""
        takes = backend_params(info.data["backend"]) if "backend" in info.data else []
        if "backend" in info.data:  # a key the backend does not take, named at its line
            check_backend_params(info.data["backend"], v)
        if isinstance(v.get("base_url"), str) and "base_url" in takes:
            try:
                wire.api_root(v["base_url"])
            except ValueError as exc:
                raise ValueError(str(exc)) from None
        if "headers" in v and "headers" in takes:
            try:
                wire.check_headers(v["headers"])
            except ValueError as exc:
                raise ValueError(str(exc)) from None
        return v

    @field_validator("max_new_tokens")
    @classmethod
    def _room(cls, v: int, info: Any) -> int:
        """Answer tokens must leave room for a prompt in the window, where it is known before
        the model loads (``params.context_window``, the backend's default, a preset's)."""
        window = _known_window(info.data)
        if window is not None and v >= window:
            raise ValueError(
                f"{v} answer tokens leave no room for a prompt in the {window:,}-token context "
                f"window; valid: 1..{window - 1}"
            )
        return v

    @model_validator(mode="after")
    def _known(self) -> ModelConfig:
        if self.preset is not None and self.preset not in PRESETS:
            raise unknown("model preset", self.preset, PRESETS)
        local = "/" in self.name or os.sep in self.name or self.name.endswith(".gguf")
        loads_weights = backend_capabilities(self.backend).local_weights  # by name, in-process
        if loads_weights and self.name not in PRESETS and not local:  # preset, HF id or path
            raise unknown("model", self.name, [*PRESETS, "<HF id or folder>"])
        check_credential_types("params", self.params)
        if "rate_limit" in self.params:
            raise ValueError("model.params.rate_limit: set it as model.rate_limit")
        if self.rate_limit is not None and "rate_limit" not in backend_params(self.backend):
            takes = [b for b in BACKENDS.names() if "rate_limit" in backend_params(b)]
            raise ValueError(
                f"model.rate_limit: backend {self.backend!r} sends no requests to limit; "
                f"backends that take one: {', '.join(takes)}"
            )
        return self

    def backend_options(self) -> dict[str, Any]:
        """What the backend gets besides ``params`` (``rate_limit`` when set)."""
        if self.rate_limit is None:
            return {}
        return {"rate_limit": self.rate_limit.model_dump(exclude_none=True)}

    @property
    def arch(self) -> str | None:
        return self.preset or (self.name if self.name in PRESETS else None)


def check_credential_types(where: str, params: Any) -> None:
    """A credential (``api_key``, ``token``, ``password``...) given as anything but text would
    be sent as its repr (``Bearer {'a': 1}``): a ValueError naming the key, never its value."""
    if not isinstance(params, dict):
        return
    for key, value in params.items():
        if names_a_credential(key) and value is not None and not isinstance(value, str):
            env = " (or leave it out and set RAGBENCH_API_KEY)" if key == "api_key" else ""
            raise ValueError(
                f"{where}.{key}: a credential must be a string, not {type(value).__name__} "
                f"(its value is not shown); write it as quoted text{env}"
            )


def one_or_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


_R = RetrievalParams  # the retrieval settings' defaults live on the parameter class


class RetrievalConfig(_Strict):
    """The index the retrieving strategies (rag, self_route) read. The first five fields take a
    value or a list (a grid, crossed with each strategy's own parameter grid, and recorded in
    every record's params); a strategy's ``params`` may override them."""

    # minilm (embedded, offline) | hash (fast tests); the class default is a name, not None
    embedder: str | list[str] = cast(str, _R.embedder)
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
            check_credential_types(f"embedder_params.{name}", params)
        self._refuse_pickle_weights()
        names = one_or_list(self.retriever)
        for key in self.retriever_params:  # each key must serve at least one retriever
            if not any(key in self.params_for(name) for name in names):
                registries.check_retriever_params(names[0], {key: self.retriever_params[key]})
        return self

    def _refuse_pickle_weights(self) -> None:
        """Embedder and cross-encoder folders with weights only in pickle-based ``.bin`` files
        are refused here, before a run folder exists, as the LLM's are at load: unpickling can
        run code. ``allow_pickle_weights: true`` in the embedder's ``embedder_params`` (or in
        ``retriever_params`` for the cross-encoder) trusts the source."""
        params = {k.lower(): v for k, v in self.embedder_params.items()}
        for name in one_or_list(self.embedder):
            if not (params.get(str(name).lower()) or {}).get("allow_pickle_weights"):
                option = f"retrieval.embedder_params: {{{name}: {{{PICKLE_OPTION}}}}}"
                refuse_pickle_weights(str(name), "embedder", option, recursive=True)
        cross = self.retriever_params.get("cross_encoder")
        if isinstance(cross, str) and not self.retriever_params.get("allow_pickle_weights"):
            option = f"retrieval.retriever_params.{PICKLE_OPTION}"
            refuse_pickle_weights(cross, "cross-encoder", option, recursive=True)

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
    """The judge of ``judge_correct`` / ``judge_faithful`` and of the RAGAS-style
    ``context_precision`` / ``context_recall`` / ``answer_relevancy``, and the embedder of
    ``semantic_similarity`` and ``answer_relevancy`` (``ragbench.judge``). The judge is its own
    model, never the model under test unless ``allow_model_under_test`` says so: a model
    grading itself is lenient in exactly the places it is wrong."""

    model: ModelConfig | None = None  # any backend: hf | openai | fake; needed by judge metrics
    allow_model_under_test: bool = False  # let the judge be the same model config as `model`
    # judgements per record (``samples``, its older name, is read as this): > 1 keeps each
    # judged metric's per-record mean (the score) and spread (``<metric>_spread``) and reports
    # agreement across the repeats (Fleiss' kappa), which the verdict's conditions cite
    repeats: int = Field(1, ge=1)
    temperature: float = Field(0.0, ge=0.0)  # > 0 when repeats > 1 (else they are copies)
    max_attempts: int = Field(3, ge=1)  # tries per judgement when the reply cannot be parsed
    prompts: dict[str, str] = Field(default_factory=dict)  # metric -> template name or YAML path
    price_sheet: str | None = None  # prices the judge's calls (judge_dollars); None: no dollars
    embedder: str | None = None  # semantic_similarity, answer_relevancy; default: retrieval's
    # answer_relevancy: questions the judge writes per answer (RAGAS's strictness); each is its
    # own request, so they differ at temperature > 0 (at 0 they are often the same question)
    questions: int = Field(QUESTIONS, ge=1)

    _sheet: PriceSheet | None = PrivateAttr(default=None)  # `price_sheet`, loaded by validation

    @model_validator(mode="before")
    @classmethod
    def _samples_is_repeats(cls, data: Any) -> Any:
        """``samples``, the key's name before ``repeats``, is read as ``repeats``."""
        if isinstance(data, dict) and "samples" in data:
            if "repeats" in data:
                raise ValueError(
                    "judge.samples is the older name of judge.repeats; give only repeats"
                )
            data = {("repeats" if k == "samples" else k): v for k, v in data.items()}
        return data

    @model_validator(mode="after")
    def _valid(self) -> JudgeConfig:
        if self.repeats > 1 and self.temperature <= 0:
            raise ValueError(
                f"judge.repeats is {self.repeats} but judge.temperature is 0: greedy repeats of "
                "one prompt are copies; set judge.temperature > 0 (e.g. 0.7) or repeats: 1"
            )
        for metric, name in self.prompts.items():
            if metric not in judged_metrics():
                raise unknown("judge metric", metric, judged_metrics())
            prompt = load_prompt(name)
            if prompt.metric != metric:
                raise ValueError(f"judge prompt {name!r} scores {prompt.metric}, not {metric}")
        if self.price_sheet is not None:
            self._sheet = price_sheet(self.price_sheet)
        if self.embedder is not None:
            registries.EMBEDDERS.check(self.embedder)
        return self

    @property
    def samples(self) -> int:
        """``repeats`` under its older name."""
        return self.repeats

    @property
    def sheet(self) -> PriceSheet | None:
        """The loaded ``price_sheet`` that prices the judge's calls (None: no dollars)."""
        return self._sheet

    def prompt(self, metric: str) -> JudgePrompt:
        """The template that scores ``metric``: the one ``prompts`` names, else the metric's own
        (``judge_correct``: ``correct-v1``)."""
        if metric in self.prompts:
            return load_prompt(self.prompts[metric])
        return get_judge_metric(metric).template()


def mlflow_uri_problem(uri: str | None) -> str | None:
    """Why MLflow would refuse ``uri`` as a tracking store, or None. A ``file:`` URI is MLflow's
    plain-folder store, which MLflow 3 keeps in maintenance mode: it fails when the run is
    logged, after the (maybe paid) run; a folder path, taken as a path, would be a folder
    literally named ``file:``. Refused before anything runs, naming the SQLite form of the same
    place."""
    if uri is None or not uri.lower().startswith("file:"):
        return None
    folder = Path(urlparse(uri).path or ".").expanduser().resolve()
    return (
        f"MLflow URI {uri!r}: MLflow's file store is not supported (MLflow 3 keeps it in "
        f"maintenance mode and fails after the run); use its SQLite form, "
        f"sqlite:///{folder / 'mlflow.db'}, or the folder path {folder} (the same store)"
    )


class MlflowConfig(_Strict):
    """Where ``ragbench.workspace.tracking`` logs the run in MLflow (the ``tracking`` extra)."""

    # None: ./mlruns in the working directory (a SQLite store + artifacts: `mlflow ui
    # --backend-store-uri sqlite:///mlruns/mlflow.db`); a folder path: the same layout there;
    # any MLflow URI (sqlite:///..., http://server:5000, databricks) as MLflow reads it, but
    # file: (mlflow_uri_problem)
    tracking_uri: str | None = None
    experiment: str = Field("ragbench", min_length=1)  # MLflow experiment, created if missing

    @field_validator("tracking_uri")
    @classmethod
    def _tracking_uri(cls, v: str | None) -> str | None:
        problem = mlflow_uri_problem(v)
        if problem:
            raise ValueError(problem)
        return v


class TrackingConfig(_Strict):
    """Where a run is logged besides its run folder. Not part of the config hash: where a run
    is reported changes nothing it computes."""

    mlflow: MlflowConfig | None = None


class SequentialConfig(_Strict):
    """Stop when decided (``ragbench run --until-decided``; ``ragbench.analysis.sequential``):
    the questions in a seeded random order, in rounds; after each round a group-sequential test
    of the verdict's two variants (the best retrieval against the best long-context one) says
    "recommend X", "equivalent within the margin" or "continue". Where a run stops, not what it
    computes: not part of the config hash (a run without it resumes and answers the rest)."""

    rounds: int | None = Field(None, ge=1)  # looks, equal in questions (default 5)
    round_size: int | None = Field(None, ge=1)  # or: questions per look
    # Lan-DeMets alpha spending: obrien_fleming (little early, nearly the fixed test at the end)
    # or pocock (even: stops sooner on large differences, costs more at the end)
    spending: Literal["obrien_fleming", "pocock"] = "obrien_fleming"
    alpha: float = Field(0.05, gt=0, lt=1)  # the level all looks' intervals hold together
    margin: float = Field(0.05, gt=0, lt=1)  # "not worse" / "equivalent" within this much
    seed: int | None = None  # the question order; None: the run's seed

    @model_validator(mode="after")
    def _one_size(self) -> SequentialConfig:
        if self.rounds is not None and self.round_size is not None:
            raise ValueError("give rounds or round_size, not both")
        return self

    def looks(self, questions: int) -> list[int]:
        """Questions answered at each look (cumulative), the last one ``questions``."""
        if questions < 1:
            return []
        if self.round_size is not None:
            return [*range(self.round_size, questions, self.round_size), questions]
        rounds = min(self.rounds or 5, questions)
        return sorted({round(questions * (k + 1) / rounds) for k in range(rounds)})
