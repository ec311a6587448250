"""Typed strategy parameters: one frozen dataclass per strategy.

Each class owns its fields' defaults (one default per field, here), their validation
(``__post_init__``: a bad value is an error naming the valid choices), grid expansion
(``grid``: list values in a config become axes) and the label that tells variants apart in
tables and figures. A ``Record`` carries one of these; ``to_dict`` is what the results table and
the run's work keys store.

Retrieval settings (retriever, embedder, splitter, chunk size and overlap) are parameters of the
strategies that retrieve, so a config can sweep them like ``top_k`` and every record says which
index answered it. The run config's ``retrieval`` section gives their run-wide values (also
grid-able); a strategy's own ``params`` may override them.
"""

from __future__ import annotations

import dataclasses
import itertools
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Self

import ragbench.strategies.pipeline_target as pipeline_target
from ragbench import secrets
from ragbench.llm import kv_cache
from ragbench.registry import did_you_mean, unknown
from ragbench.retrieval import EMBEDDERS, RETRIEVERS, check_chunking
from ragbench.retrieval.context import ORDERS
from ragbench.strategies.prompts import OVERFLOW


def _positive_or_none(owner: str, name: str, value: Any) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise ValueError(f"{owner}: {name} must be a positive integer or null, got {value!r}")


def _choice(owner: str, name: str, value: Any, choices: Any) -> None:
    if value not in choices:
        raise unknown(f"{owner} {name}", str(value), choices)


@dataclass(frozen=True)
class StrategyParams:
    """Base class. Subclasses add fields (with a short "why" comment each) and ``validate``."""

    strategy: ClassVar[str] = ""  # the strategy these parameters belong to (error messages)
    # label: field -> short name; a field is shown when it differs from its default
    # (``always`` fields are shown always). Fields not listed are shown by their own name.
    short: ClassVar[dict[str, str]] = {}
    always: ClassVar[tuple[str, ...]] = ()

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raise ValueError naming the field and the valid choices for a bad value."""

    @classmethod
    def field_names(cls) -> list[str]:
        return [f.name for f in dataclasses.fields(cls)]

    @classmethod
    def check_keys(cls, keys: Any) -> None:
        valid = cls.field_names()
        for key in keys:
            if key not in valid:
                hint = did_you_mean(str(key), valid or ["(none)"])
                raise ValueError(f"unknown {cls.strategy} parameter {key!r}; {hint}")

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Self:
        """Parameters from a mapping (missing fields take their defaults; unknown are errors)."""
        cls.check_keys(data)
        return cls(**data)

    @classmethod
    def grid(cls, spec: Mapping[str, Any], base: Mapping[str, Any] | None = None) -> list[Self]:
        """Every parameter point of ``spec`` (list values are axes), over ``base`` values (the
        run-wide retrieval settings) and the defaults; points in field order, last field
        fastest. Keys of ``base`` this class has no field for are ignored."""
        cls.check_keys(spec)
        names = cls.field_names()
        merged = {k: v for k, v in (base or {}).items() if k in names} | dict(spec)
        keys = [n for n in names if n in merged]
        axes = [merged[k] if isinstance(merged[k], list) else [merged[k]] for k in keys]
        return [cls(**dict(zip(keys, point, strict=True))) for point in itertools.product(*axes)]

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def label(self) -> str:
        """``rag k=4 order=document cite=False``: the strategy, then every set value that is not
        its default (``always`` fields first, and shown even at their default)."""
        parts = [self.strategy]
        fields = sorted(dataclasses.fields(self), key=lambda f: f.name not in self.always)
        for f in fields:
            value = getattr(self, f.name)
            if value is not None and (f.name in self.always or value != f.default):
                parts.append(f"{self.short.get(f.name, f.name)}={value}")
        return " ".join(parts)


@dataclass(frozen=True)
class ClosedBookParams(StrategyParams):
    """The question alone: no parameters."""

    strategy: ClassVar[str] = "closed_book"


@dataclass(frozen=True)
class LongContextParams(StrategyParams):
    """Long context, and the techniques that make it affordable: how the KV cache is kept
    (``ragbench.llm.kv_cache``; the transformers backend runs them, other backends refuse)."""

    strategy: ClassVar[str] = "long_context"

    # past the window (or the run's prompt_budget): error | truncate_middle | truncate_head |
    # truncate_tail; the record says how many tokens were cut
    overflow: str = "error"
    # plain | offloaded (layers in host memory between uses; a recorded no-op on CPU) | sinks
    # (StreamingLLM: first sink_tokens + last window_tokens) | quantized (kv_bits, kv_backend)
    # | snapkv (SnapKV: keep the kv_ratio of the prompt its last kv_window positions attend to)
    kv_cache: str = "plain"
    kv_bits: int | None = None  # quantized: 8 or 4 (hqq: 1-4, 8; quanto: 2, 4)
    kv_backend: str | None = None  # quantized: hqq | quanto (null: hqq, which does 8 and 4 bits)
    sink_tokens: int | None = None  # sinks: first positions always kept (null: 4, the paper's)
    window_tokens: int | None = None  # sinks: most recent positions kept (null: 1024)
    kv_ratio: float | None = None  # snapkv: fraction of the prompt before the window kept (0.5)
    kv_window: int | None = None  # snapkv: observation window, the question's end (null: 32)
    # the model's RoPE scaling, "yarn-x2" / "dynamic-x1.5" / "linear-x2": a load-time option of
    # the hf backend (llm params rope_scaling + rope_factor), named here so each record says
    # what ran; the strategy checks it against the loaded model
    rope_scaling: str | None = None
    # cache-augmented generation: the corpus KV computed once, in its own call, before the
    # questions (strategies/preload.py); its cost is reported apart and amortised
    preload: bool = False

    ROPE = re.compile(r"(dynamic|yarn|linear)-x\d+(\.\d+)?")

    def __post_init__(self) -> None:
        # the flat keys are the YAML surface (and part of existing configs' hashes); the variant
        # is built once from them and validates itself. Its defaults are written back into the
        # flat fields, so a record names exactly what ran (kv_backend hqq, sink_tokens 4, ...).
        try:
            kv = kv_cache.kv_from_fields(
                self.kv_cache,
                kv_bits=self.kv_bits,
                kv_backend=self.kv_backend,
                sink_tokens=self.sink_tokens,
                window_tokens=self.window_tokens,
                kv_ratio=self.kv_ratio,
                kv_window=self.kv_window,
            )
        except ValueError as exc:
            raise ValueError(f"{self.strategy}: {exc}") from None
        object.__setattr__(self, "_kv", kv)
        for name, value in kv.fields().items():
            if name in self.field_names():
                object.__setattr__(self, name, value)
        super().__post_init__()

    @property
    def kv(self) -> kv_cache.KVVariant:
        """The KV-cache variant these parameters name (what ``GenerationRequest.kv`` carries)."""
        return self._kv

    def validate(self) -> None:
        _choice(self.strategy, "overflow policy", self.overflow, OVERFLOW)
        # a real bool: 1 and 0 pass `in (True, False)` (1 == True) and would label "preload" x1
        plain = isinstance(self.kv, kv_cache.Plain)
        if not isinstance(self.preload, bool) or (self.preload and not plain):
            raise ValueError(f"{self.strategy}: preload must be true or false, with kv_cache plain")
        if self.rope_scaling is not None and not self.ROPE.fullmatch(str(self.rope_scaling)):
            raise ValueError(
                f"{self.strategy}: rope_scaling must be null or <dynamic|yarn|linear>-x<factor> "
                f"(e.g. yarn-x2), got {self.rope_scaling!r}"
            )

    def to_dict(self) -> dict[str, Any]:
        data = super().to_dict()  # preload only when set: runs written before it keep their keys
        return data if self.preload else {k: v for k, v in data.items() if k != "preload"}

    def label(self) -> str:
        """``long_context``, ``long_context truncate_middle``, ``long_context kv=quantized-hqq-int4``."""
        parts = [self.strategy]
        if self.overflow != "error":
            parts.append(self.overflow)
        if not isinstance(self.kv, kv_cache.Plain):
            parts.append(f"kv={self.kv.label()}")
        if self.rope_scaling:
            parts.append(f"rope={self.rope_scaling}")
        return " ".join(parts + ["preload"] * self.preload)


@dataclass(frozen=True)
class RetrievalParams(StrategyParams):
    """The index a retrieving strategy reads: chunking and retriever. Defaults here are the run
    config's defaults too (``config.RetrievalConfig`` reads them)."""

    retriever: str = "dense"  # dense | bm25 | hybrid | rerank
    embedder: str = "minilm"  # minilm (embedded, offline) | hash (fast tests); bm25 ignores it
    splitter: str = "sentence"  # llama-index splitter: sentence | token
    chunk_size: int = 128  # tokens per chunk (the chunking tokenizer's)
    chunk_overlap: int = 16  # tokens shared by neighbouring chunks (< chunk_size)

    short: ClassVar[dict[str, str]] = {"chunk_size": "chunk", "chunk_overlap": "overlap"}

    def validate(self) -> None:
        RETRIEVERS.check(self.retriever)
        EMBEDDERS.check(self.embedder)
        check_chunking(self.splitter, self.chunk_size, self.chunk_overlap)

    def retrieval(self) -> RetrievalParams:
        """Only the index settings (the key an index is built and cached under)."""
        names = [f.name for f in dataclasses.fields(RetrievalParams)]
        return RetrievalParams(**{n: getattr(self, n) for n in names})


@dataclass(frozen=True)
class RagParams(RetrievalParams):
    strategy: ClassVar[str] = "rag"

    top_k: int | None = 5  # chunks retrieved (null: as many as the budget holds)
    budget: int | None = None  # context-token cap for the chunks (null: the window's room)
    order: str = "score"  # chunks in the prompt: score (best first) | document (reading order)
    cite: bool = True  # prefix each chunk with its document id

    short: ClassVar[dict[str, str]] = {**RetrievalParams.short, "top_k": "k"}
    always: ClassVar[tuple[str, ...]] = ("top_k",)

    def validate(self) -> None:
        super().validate()
        _positive_or_none(self.strategy, "top_k", self.top_k)
        _positive_or_none(self.strategy, "budget", self.budget)
        _choice(self.strategy, "order", self.order, ORDERS)
        if not isinstance(self.cite, bool):
            raise ValueError(f"{self.strategy}: cite must be true or false, got {self.cite!r}")
        if self.top_k is None and self.budget is None:
            raise ValueError(f"{self.strategy}: set top_k, budget or both (both are null)")


@dataclass(frozen=True)
class SelfRouteParams(RagParams):
    strategy: ClassVar[str] = "self_route"

    overflow: str = "error"  # the long-context leg's overflow policy (see LongContextParams)

    def validate(self) -> None:
        super().validate()
        _choice(self.strategy, "overflow policy", self.overflow, OVERFLOW)


@dataclass(frozen=True)
class PipelineParams(StrategyParams):
    """Your own system under test (``strategies/pipeline.py``): a Python callable, a llama-index
    query engine or retriever, or an HTTP endpoint. Exactly one of ``target`` and ``url``.

    ``version`` is its identity, part of the parameter point (work keys, label): a changed
    pipeline reruns its rows, an unchanged one resumes. ``timeout``, ``retries`` and
    ``headers_env`` say how it is called, not what it answers: they are not in ``to_dict``.

    ``setup`` / ``setup_url``: the hook that receives the run's corpus before the questions on it
    (``strategies/pipeline.py``), so the pipeline answers from the documents long context reads;
    without one it answers from its own index (each record's ``pipeline_index`` says which).
    They and ``setup_version`` are in ``to_dict`` only when set (older work keys stay valid)."""

    strategy: ClassVar[str] = "pipeline"

    # "module:function" (question, example_id, corpus) -> answer; or "module:attr" naming a
    # llama-index QueryEngine / BaseRetriever, or a no-argument factory returning one
    target: str | None = None
    url: str | None = None  # POST {"question", "id", "corpus"} -> answer JSON; kept redacted
    # null: the target's __version__ (or its module's), else sha256 of its module file; a url
    # pipeline has none unless given here
    version: str | None = None
    timeout: float = 120.0  # seconds per call; past it the record is an error row
    retries: int = 2  # url: retries of 408/429/5xx, timeouts and dropped connections
    headers_env: Any = None  # url: {header: ENV_VAR}, each value read from the environment
    # "module:function" given (documents, corpus id) once per corpus, before its questions: the
    # run's documents (ragbench Documents: id, text, title, meta) for the pipeline to index
    setup: str | None = None
    # url pipelines: POST {"corpus", "documents": [{id, text, title, meta}]} here instead
    setup_url: str | None = None
    setup_version: str | None = None  # null: the setup's identity (as `version` for target)

    CALLING: ClassVar[tuple[str, ...]] = ("timeout", "retries", "headers_env")
    SETUP: ClassVar[tuple[str, ...]] = ("setup", "setup_url", "setup_version")

    def __post_init__(self) -> None:
        if isinstance(self.headers_env, Mapping):  # hashable, like every parameter point
            object.__setattr__(self, "headers_env", tuple(sorted(self.headers_env.items())))
        if isinstance(self.url, str):  # the credentials stay in memory only (never stored)
            secrets.collect(self.url)
            object.__setattr__(self, "_raw_url", self.url)
            object.__setattr__(self, "url", secrets.redact_url(self.url))
        if isinstance(self.setup_url, str):
            secrets.collect(self.setup_url)
            object.__setattr__(self, "_raw_setup_url", self.setup_url)
            object.__setattr__(self, "setup_url", secrets.redact_url(self.setup_url))
        super().__post_init__()
        if self.target is not None and self.version is None:
            object.__setattr__(
                self, "version", pipeline_target.identity(self.target, self.strategy)
            )
        if self.setup is not None and self.setup_version is None:
            owner = f"{self.strategy} setup"
            object.__setattr__(self, "setup_version", pipeline_target.identity(self.setup, owner))

    @property
    def raw_url(self) -> str | None:
        """The endpoint as configured, credentials included (for the call only)."""
        return getattr(self, "_raw_url", self.url)

    @property
    def raw_setup_url(self) -> str | None:
        """``setup_url`` as configured, credentials included (for the call only)."""
        return getattr(self, "_raw_setup_url", self.setup_url)

    @property
    def indexes_corpus(self) -> bool:
        """Whether the run's corpus is handed to the pipeline (a setup hook) to answer from."""
        return self.setup is not None or self.setup_url is not None

    @property
    def headers(self) -> dict[str, str]:
        """``headers_env`` as {header: ENV_VAR}."""
        return dict(self.headers_env or ())

    def validate(self) -> None:
        owner = self.strategy
        if (self.target is None) == (self.url is None):
            raise ValueError(f"{owner}: set exactly one of target ('module:function') and url")
        if self.target is not None:
            pipeline_target.check_target(owner, self.target)
            if self.headers_env:
                raise ValueError(f"{owner}: headers_env applies to a url pipeline only")
        if self.url is not None and not re.match(r"^https?://[^/\s]+", self.url):
            raise ValueError(f"{owner}: url must be an http(s):// URL, got {self.url!r}")
        if self.version is not None and (not isinstance(self.version, str) or not self.version):
            raise ValueError(f"{owner}: version must be a non-empty string or null")
        if self.setup is not None and self.setup_url is not None:
            raise ValueError(f"{owner}: set at most one of setup ('module:function') and setup_url")
        if self.setup is not None:
            pipeline_target.check_target(f"{owner} setup", self.setup)
        if self.setup_url is not None and (
            self.url is None or not re.match(r"^https?://[^/\s]+", self.setup_url)
        ):
            raise ValueError(
                f"{owner}: setup_url must be an http(s):// URL beside a url pipeline, "
                f"got {self.setup_url!r}"
            )
        ver = self.setup_version
        if ver is not None and (not isinstance(ver, str) or not ver or not self.indexes_corpus):
            raise ValueError(f"{owner}: setup_version must be a non-empty string, with a setup")
        timeout = self.timeout
        if isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout <= 0:
            raise ValueError(f"{owner}: timeout must be a number of seconds > 0, got {timeout!r}")
        if isinstance(self.retries, bool) or not isinstance(self.retries, int) or self.retries < 0:
            raise ValueError(f"{owner}: retries must be an integer >= 0, got {self.retries!r}")
        for header, env in self.headers.items():
            if not (isinstance(header, str) and isinstance(env, str) and env):
                raise ValueError(
                    f"{owner}: headers_env maps header names to environment variable names, "
                    f"got {header!r}: {env!r}"
                )

    def to_dict(self) -> dict[str, Any]:
        data = {k: v for k, v in super().to_dict().items() if k not in self.CALLING}
        return {k: v for k, v in data.items() if k not in self.SETUP or v is not None}

    def label(self) -> str:
        """``pipeline mypkg.rag:answer v=1a2b3c4d`` or ``pipeline http://host/answer v=2``, then
        ``setup=mypkg.rag:index`` when the run's corpus is handed to it."""
        version = (self.version or "").removeprefix("sha256:")[:12]
        setup = self.setup or self.setup_url
        return " ".join(
            [self.strategy, self.target or self.url or ""]
            + [f"v={version}"] * bool(version)
            + [f"setup={setup}"] * bool(setup)
        )
