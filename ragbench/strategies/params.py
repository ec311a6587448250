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
from typing import Annotated, Any, ClassVar, Self

from pydantic import Field

from ragbench.llm.kv import variants as kv_cache
from ragbench.ranges import violation
from ragbench.registry import did_you_mean, unknown
from ragbench.retrieval import EMBEDDERS, RETRIEVERS, check_chunking, needs_embedder
from ragbench.retrieval.context import ORDERS
from ragbench.strategies.prompts import OVERFLOW

# ranges declared on the fields (ragbench.ranges): checked before ``validate``, errors name them
Positive = Annotated[int, Field(ge=1, strict=True)]  # an integer >= 1 (True is none)
Flag = Annotated[bool, Field(strict=True)]  # true or false (1 and 0 are neither)


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
        bad = violation(self)  # the ranges the fields declare (``Positive``, ``Flag``, ...)
        if bad is not None:
            raise ValueError(bad.must(self.strategy))
        self.validate()

    def validate(self) -> None:
        """Raise ValueError naming the field and the valid choices for a bad value (beyond the
        ranges the fields declare, checked before)."""

    @classmethod
    def field_names(cls) -> list[str]:
        return [f.name for f in dataclasses.fields(cls)]

    @classmethod
    def check_keys(cls, keys: Any) -> None:
        """Raise ValueError for a key that is no field (``keys``: names, or a mapping)."""
        valid = cls.field_names()
        for key in keys:
            if key not in valid:
                hint = did_you_mean(str(key), valid or ["(none)"])
                raise ValueError(f"unknown {cls.strategy} parameter {key!r}; {hint}")

    @classmethod
    def from_dict(cls, data: Mapping[str, object]) -> Self:
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
        for key, axis in zip(keys, axes, strict=True):
            if not axis:  # a product with an empty axis has no point: the strategy would vanish
                raise ValueError(
                    f"{key}: [] gives no parameter point; valid: a value or a non-empty list"
                )
        points: list[Self] = []
        raw: dict[str, tuple] = {}  # a point's repr -> the first values that made it
        for values in itertools.product(*axes):
            point = cls(**dict(zip(keys, values, strict=True)))
            if raw.setdefault(repr(point), values) != values:
                # other values that make the same point (the embedders of a grid, for bm25,
                # which names none): once. A value listed twice stays (the run refuses it).
                continue
            points.append(point)
        return points

    def to_dict(self) -> dict[str, object]:
        """Every field, at its default too (results, work keys)."""
        return dataclasses.asdict(self)

    def label(self) -> str:
        """``rag k=4 order=document cite=False``: the strategy, then every set value that is not
        its default (``always`` fields first, and shown even at their default; a true flag by
        its name alone: ``long_context cot``)."""
        parts = [self.strategy]
        fields = sorted(dataclasses.fields(self), key=lambda f: f.name not in self.always)
        for f in fields:
            value = getattr(self, f.name)
            if value is not None and (f.name in self.always or value != f.default):
                name = self.short.get(f.name, f.name)
                parts.append(name if value is True else f"{name}={value}")
        return " ".join(parts)


# chain of thought: the example's prompt format's two-call protocol (strategies.prompt_format;
# LongBench v2's pred.py): a reasoning call, then the answer step with its reply
COT = "cot"


@dataclass(frozen=True)
class ClosedBookParams(StrategyParams):
    """The question alone."""

    strategy: ClassVar[str] = "closed_book"

    cot: Flag = False  # chain of thought (a prompt format that has one: longbench_v2)


@dataclass(frozen=True)
class LongContextParams(StrategyParams):
    """Long context, and the techniques that make it affordable: how the KV cache is kept
    (``ragbench.llm.kv.variants``; the transformers backend runs them, other backends refuse)."""

    strategy: ClassVar[str] = "long_context"

    # past the window (or the run's prompt_budget): error | truncate_middle | truncate_head |
    # truncate_tail; the record says how many tokens were cut
    overflow: str = "error"
    # how the KV cache is kept: a variant of ragbench.llm.kv.variants, which declares its own
    # parameters; YAML: kv: sinks, or kv: {name: quantized, bits: 4} (plain | offloaded | sinks |
    # quantized | snapkv; a list of them is a grid axis, and so is a list inside one)
    kv: kv_cache.KVVariant = kv_cache.Plain()
    # the model's RoPE scaling, "yarn-x2" / "dynamic-x1.5" / "linear-x2": a load-time option of
    # the hf backend (llm params rope_scaling + rope_factor), named here so each record says
    # what ran; the strategy checks it against the loaded model
    rope_scaling: str | None = None
    # cache-augmented generation: the corpus KV computed once, in its own call, before the
    # questions (strategies/preload.py); its cost is reported apart and amortised
    preload: Flag = False
    cot: Flag = False  # chain of thought (a prompt format that has one: longbench_v2)

    ROPE = re.compile(r"(dynamic|yarn|linear)-x\d+(\.\d+)?")

    def __post_init__(self) -> None:
        # the variant validates its own parameters (a mapping or name from YAML or a record)
        try:
            object.__setattr__(self, "kv", kv_cache.kv_from_spec(self.kv))
        except (ValueError, TypeError) as exc:
            raise ValueError(f"{self.strategy}: {exc}") from None
        super().__post_init__()

    @classmethod
    def grid(
        cls, spec: Mapping[str, object], base: Mapping[str, object] | None = None
    ) -> list[Self]:
        """As ``StrategyParams.grid``; a list inside ``kv`` (``kv: {name: quantized, bits: [8,
        4]}``) is an axis too, as a list of ``kv`` mappings is."""
        kv = spec.get("kv")
        if isinstance(kv, Mapping) and any(isinstance(v, list) for v in kv.values()):
            keys = list(kv)
            axes = [kv[k] if isinstance(kv[k], list) else [kv[k]] for k in keys]
            kvs = [dict(zip(keys, v, strict=True)) for v in itertools.product(*axes)]
            spec = {**spec, "kv": kvs}
        return super().grid(spec, base)

    def to_dict(self) -> dict[str, object]:
        """As stored; ``kv`` as the variant's ``spec()`` (``{"name": ..., <parameter>: ...}``)."""
        return super().to_dict() | {"kv": self.kv.spec()}

    def validate(self) -> None:
        _choice(self.strategy, "overflow policy", self.overflow, OVERFLOW)
        if self.preload and not isinstance(self.kv, kv_cache.Plain):
            raise ValueError(f"{self.strategy}: preload must be true or false, with kv plain")
        if self.preload and self.cot:  # the preloaded prefix is the one-call prompt's
            raise ValueError(f"{self.strategy}: preload and cot cannot be combined")
        if self.rope_scaling is not None and not self.ROPE.fullmatch(str(self.rope_scaling)):
            raise ValueError(
                f"{self.strategy}: rope_scaling must be null or <dynamic|yarn|linear>-x<factor> "
                f"(e.g. yarn-x2), got {self.rope_scaling!r}"
            )

    def label(self) -> str:
        """``long_context``, ``long_context truncate_middle``, ``long_context kv=quantized-hqq-int4``."""
        parts = [self.strategy]
        if self.overflow != "error":
            parts.append(self.overflow)
        if not isinstance(self.kv, kv_cache.Plain):
            parts.append(f"kv={self.kv.label()}")
        if self.rope_scaling:
            parts.append(f"rope={self.rope_scaling}")
        return " ".join(parts + ["preload"] * self.preload + [COT] * self.cot)


@dataclass(frozen=True)
class RetrievalParams(StrategyParams):
    """The index a retrieving strategy reads: chunking and retriever. Defaults here are the run
    config's defaults too (``config.RetrievalConfig`` reads them)."""

    retriever: str = "dense"  # dense | bm25 | hybrid | rerank
    # minilm (embedded, offline) | hash (fast tests); None for a retriever that embeds nothing
    # (bm25: ``needs_embedder``), whatever was given: such a point names no embedder
    embedder: str | None = "minilm"
    splitter: str = "sentence"  # llama-index splitter: sentence | token
    chunk_size: int = 128  # tokens per chunk (the chunking tokenizer's)
    chunk_overlap: int = 16  # tokens shared by neighbouring chunks (< chunk_size)

    short: ClassVar[dict[str, str]] = {"chunk_size": "chunk", "chunk_overlap": "overlap"}

    def __post_init__(self) -> None:
        RETRIEVERS.check(self.retriever)
        if not needs_embedder(self.retriever):  # the run-wide embedder does not apply
            object.__setattr__(self, "embedder", None)
        super().__post_init__()

    def validate(self) -> None:
        if self.embedder is None and needs_embedder(self.retriever):
            raise ValueError(f"{self.strategy}: retriever {self.retriever!r} needs an embedder")
        if self.embedder is not None:
            EMBEDDERS.check(self.embedder)
        check_chunking(self.splitter, self.chunk_size, self.chunk_overlap)

    def to_dict(self) -> dict[str, object]:
        """As stored; a retriever that embeds nothing names no embedder (not even null)."""
        data = super().to_dict()
        if self.embedder is None:
            data.pop("embedder", None)
        return data

    def retrieval(self) -> RetrievalParams:
        """Only the index settings (the key an index is built and cached under)."""
        names = [f.name for f in dataclasses.fields(RetrievalParams)]
        return RetrievalParams(**{n: getattr(self, n) for n in names})


@dataclass(frozen=True)
class RagParams(RetrievalParams):
    strategy: ClassVar[str] = "rag"

    top_k: Positive | None = 5  # chunks retrieved (null: as many as the budget holds)
    budget: Positive | None = None  # context-token cap for the chunks (null: the window's room)
    order: str = "score"  # chunks in the prompt: score (best first) | document (reading order)
    cite: Flag = True  # prefix each chunk with its document id
    cot: Flag = False  # chain of thought (a prompt format that has one: longbench_v2)

    short: ClassVar[dict[str, str]] = {**RetrievalParams.short, "top_k": "k"}
    always: ClassVar[tuple[str, ...]] = ("top_k",)

    def validate(self) -> None:
        super().validate()
        _choice(self.strategy, "order", self.order, ORDERS)
        if self.top_k is None and self.budget is None:
            raise ValueError(f"{self.strategy}: set top_k, budget or both (both are null)")


@dataclass(frozen=True)
class SelfRouteParams(RagParams):
    strategy: ClassVar[str] = "self_route"

    overflow: str = "error"  # the long-context leg's overflow policy (see LongContextParams)

    def validate(self) -> None:
        super().validate()
        _choice(self.strategy, "overflow policy", self.overflow, OVERFLOW)
        if self.cot:
            raise ValueError(f"{self.strategy}: cot is not supported (the route reads one reply)")
