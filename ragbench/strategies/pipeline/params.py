"""The parameters of ``pipeline``, the user's own system under test (``strategies/pipeline/strategy.py``):
a typed, frozen ``StrategyParams`` like every strategy's (``strategies/params.py``)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar

from pydantic import Field

import ragbench.strategies.pipeline.target as pipeline_target
from ragbench import secrets
from ragbench.strategies.params import StrategyParams

# the full pipeline URL, when a config holds it with its credentials masked (compare.yaml)
URL_ENV = "RAGBENCH_PIPELINE_URL"


@dataclass(frozen=True)
class PipelineParams(StrategyParams):
    """Your own system under test (``strategies/pipeline/strategy.py``): a Python callable, a llama-index
    query engine or retriever, or an HTTP endpoint. Exactly one of ``target`` and ``url``.

    ``version`` is its identity, part of the parameter point (work keys, label): a changed
    pipeline reruns its rows, an unchanged one resumes. ``timeout``, ``retries`` and
    ``headers_env`` say how it is called, not what it answers: they are not in ``to_dict``.

    ``setup`` / ``setup_url``: the hook that receives the run's corpus before the questions on it
    (``strategies/pipeline/strategy.py``), so the pipeline answers from the documents long context reads;
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
    # seconds per call; past it the record is an error row
    timeout: Annotated[float, Field(gt=0, strict=True, description="seconds")] = 120.0
    # url: retries of 408/429/5xx, timeouts and dropped connections
    retries: Annotated[int, Field(ge=0, strict=True)] = 2
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
        """The endpoint as configured, credentials included (for the call only). A url stored
        with its credentials masked (``ragbench compare``'s compare.yaml) takes them from the full
        URL in ``$RAGBENCH_PIPELINE_URL`` (``secrets.fill_masked_url``; a ValueError without)."""
        raw = getattr(self, "_raw_url", self.url)
        return secrets.fill_masked_url(raw, URL_ENV, "strategies[N].params.url")

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
        self._validate_target()
        self._validate_setup()
        self._validate_calling()

    def _validate_target(self) -> None:
        """Exactly one of ``target`` and ``url``, each well formed, and its ``version``."""
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

    def _validate_setup(self) -> None:
        """At most one of ``setup`` and ``setup_url`` (beside a url pipeline), and its
        ``setup_version``."""
        owner = self.strategy
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

    def _validate_calling(self) -> None:
        """How it is called: ``headers_env`` (``timeout`` and ``retries`` declare their ranges)."""
        owner = self.strategy
        for header, env in self.headers.items():
            if not (isinstance(header, str) and isinstance(env, str) and env):
                raise ValueError(
                    f"{owner}: headers_env maps header names to environment variable names, "
                    f"got {header!r}: {env!r}"
                )

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in super().to_dict().items() if k not in self.CALLING}

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
