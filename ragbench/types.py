"""Core data contracts: plain frozen dataclasses that round-trip through JSON exactly.

Data flow: Example -> GenerationRequest(s) -> Completion -> Record (one results-table row).
Nested values in ``meta`` must be JSON types (dict/list/str/int/float/bool/None); tuples are
used for the typed sequence fields so the objects stay hashable-ish and immutable.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any, TypeVar

T = TypeVar("T")


def _jsonable(value: object, nested: bool = False) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        to_dict = getattr(value, "to_dict", None)
        if nested and callable(to_dict):  # its own stored form
            return _jsonable(to_dict())  # (a Record's params: StrategyParams.to_dict)
        return {f.name: _jsonable(getattr(value, f.name), True) for f in dataclasses.fields(value)}
    if isinstance(value, tuple | list):
        return [_jsonable(v, True) for v in value]
    if isinstance(value, dict):
        return {str(k): _jsonable(v, True) for k, v in value.items()}
    return value


class JsonMixin:
    """to_dict / from_dict / to_json / from_json shared by every contract type."""

    def to_dict(self) -> dict[str, Any]:
        return _jsonable(self)

    def to_json(self) -> str:
        # sort_keys + fixed separators: the canonical form used for fingerprints and byte-identical files
        return json.dumps(self.to_dict(), sort_keys=True, ensure_ascii=False, separators=(",", ":"))

    @classmethod
    def from_dict(cls: type[T], data: dict[str, Any]) -> T:
        names = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
        unknown = set(data) - set(names)
        if unknown:
            raise ValueError(
                f"{cls.__name__}: unknown field(s) {sorted(unknown)}; valid: {sorted(names)}"
            )
        kwargs = {}
        for name, value in data.items():
            kwargs[name] = _coerce(cls, name, value)
        return cls(**kwargs)

    @classmethod
    def from_json(cls: type[T], text: str) -> T:
        return cls.from_dict(json.loads(text))  # type: ignore[attr-defined]


def _coerce(cls: type, name: str, value: Any) -> Any:
    nested = _NESTED.get((cls.__name__, name))
    if nested is not None and value is not None:
        return tuple(nested.from_dict(v) for v in value)
    if name in _TUPLE_FIELDS.get(cls.__name__, ()) and value is not None:
        return tuple(value)
    return value


@dataclass(frozen=True)
class Document(JsonMixin):
    """One source document of an example's long context."""

    id: str
    text: str
    title: str = ""
    meta: dict[str, object] = field(default_factory=dict)


@dataclass(frozen=True)
class Example(JsonMixin):
    """A question over a long context.

    ``documents`` are the full long context, in order. ``meta`` holds task facts: context tokens,
    needle depth, task name, and ``evidence``: a list of ``[doc_id, start, end]`` character spans
    that contain the answer, so gold chunks can be computed after any chunking.
    """

    id: str
    question: str
    answers: tuple[str, ...]
    documents: tuple[Document, ...]
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def evidence(self) -> list[tuple[str, int, int]]:
        return [(str(d), int(s), int(e)) for d, s, e in self.meta.get("evidence", [])]

    @property
    def context(self) -> str:
        """The documents joined as they are placed in a long-context prompt."""
        return join_documents(self.documents)


DOCUMENT_SEPARATOR = "\n\n"


def join_documents(documents: tuple[Document, ...] | list[Document]) -> str:
    parts = []
    for d in documents:
        parts.append(f"{d.title}\n{d.text}" if d.title else d.text)
    return DOCUMENT_SEPARATOR.join(parts)


@dataclass(frozen=True)
class Chunk(JsonMixin):
    """A retrievable piece of a document; ``start``/``end`` are character offsets in it."""

    id: str
    doc_id: str
    text: str
    start: int
    end: int
    meta: dict[str, object] = field(default_factory=dict)


@dataclass(frozen=True)
class ScoredChunk(JsonMixin):
    chunk: Chunk
    score: float


@dataclass(frozen=True)
class GenerationRequest(JsonMixin):
    """One prompt for an LLM.

    ``prompt`` is the user content (a chat template is applied by backends for instruct models).
    ``prefix`` optionally names the leading part of ``prompt`` that other requests share (the long
    document, placed first), so backends can compute its KV cache once and reuse it.

    ``kv`` says how the backend keeps this request's KV cache: a KV-cache variant
    (``ragbench.llm.kv.variants``: ``Offloaded()``, ``Sinks()``, ``Quantized(bits=4)``, ``SnapKV()``,
    which validates its own parameters) or None for the plain cache; a backend that cannot keep
    it that way raises an error naming what it supports. ``to_dict`` writes it as the variant's
    ``spec()`` under ``kv`` (``{"name": "quantized", "bits": 4, ...}``), left out for the plain
    cache, so a plain request's completion-cache key does not depend on the variants.

    ``cacheable=False``: never served from or stored in a completion cache, because what it
    costs depends on state outside the request (a question on a preloaded corpus KV: a stored
    answer would carry the corpus prefill its run paid). Left out of ``to_dict`` when True.

    ``variant`` names the strategy variant that sends it (its records' label; the strategy
    driver sets it). A backend that finds common prefixes in undeclared prompts (transformers)
    shares them only among one variant's requests, so what a record reuses does not depend on
    which other variants share its call (``ragbench.cost.alone`` prices each variant as if it
    ran alone). Like ``id``, a label, not an input of the model: left out of ``to_dict`` when
    empty and of the completion cache's key.
    """

    prompt: str
    max_new_tokens: int = 32
    temperature: float = 0.0  # 0 = greedy
    stop: tuple[str, ...] = ()
    prefix: str = ""
    system: str = ""
    id: str = ""
    kv: Any = None  # ragbench.llm.kv.variants.KVVariant; None: plain
    cacheable: bool = True  # False: past the completion cache (see the docstring)
    variant: str = ""  # the strategy variant sending it: undeclared prefixes shared within it

    def __post_init__(self) -> None:
        if self.prefix and not self.prompt.startswith(self.prefix):
            raise ValueError("GenerationRequest.prefix must be a prefix of prompt")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.kv is not None and not callable(getattr(self.kv, "spec", None)):
            raise TypeError(
                "GenerationRequest.kv must be a KV-cache variant of ragbench.llm.kv.variants "
                f"(e.g. Quantized(bits=4)) or None for the plain cache, got {self.kv!r}"
            )
        if getattr(self.kv, "name", None) == "plain":  # one spelling of the plain cache
            object.__setattr__(self, "kv", None)

    def to_dict(self) -> dict[str, Any]:
        data = super().to_dict()
        data.pop("kv")
        if data["cacheable"]:
            data.pop("cacheable")
        if not data["variant"]:
            data.pop("variant")
        return data | ({"kv": self.kv.spec()} if self.kv is not None else {})

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> GenerationRequest:
        """A request from ``to_dict``'s form, without its ``kv`` (this core module knows no
        variant: give ``kv=ragbench.llm.kv.variants.kv_from_spec(data["kv"])`` yourself)."""
        if "kv" in data:
            raise ValueError(
                "GenerationRequest.from_dict: a KV-cache variant (kv="
                f"{data['kv']!r}) is typed by ragbench.llm.kv.variants.kv_from_spec"
            )
        return super().from_dict(data)


@dataclass(frozen=True)
class Completion(JsonMixin):
    """Generated text plus the accounting every cost number is computed from.

    Two kinds of time, never mixed:

    * latency, the request's own time: ``prefill_seconds`` (its work began until the first
      token) + ``decode_seconds`` (first token until its last) = ``latency_seconds``; the
      harness's queue before it, ``queue_seconds`` (submitted until its work began: earlier
      batches of the same call, a concurrency slot), is apart: it measures how the run was
      scheduled, not the strategy;
    * ``resource_seconds``, its share of the device time: what cost is charged from. A batch's
      rows split the batch's device time (they add up to it); None means the backend did not
      measure it, and cost falls back to prefill + decode (see ``ragbench.cost.prices.resource_seconds``).

    ``padding_tokens`` are padding positions its row computed in a padded batch (0 alone).
    ``kv_bytes_measured`` is what the transformers backend measured of its KV cache.
    """

    text: str
    prompt_tokens: int
    completion_tokens: int
    cached_prompt_tokens: int = 0
    prefill_seconds: float = 0.0  # work began -> first token (time to first token after queue)
    decode_seconds: float = 0.0  # first token -> last token
    peak_memory_bytes: int | None = None
    finish_reason: str = ""
    model: str = ""
    cached: bool = False  # served from the completion cache (accounting is the original run's)
    usage_estimated: bool = False  # token counts estimated locally, not reported by the server
    meta: dict[str, Any] = field(default_factory=dict)
    queue_seconds: float = 0.0  # submitted -> its work began (waiting behind other batches)
    resource_seconds: float | None = None  # its share of device time; None: not measured
    padding_tokens: int = 0  # padding positions computed in its row of a padded batch
    # bytes of its KV cache after the prefill, measured on the cache's tensors in their real
    # dtype (its own positions; quantized codes and scales included); None: not measured
    kv_bytes_measured: int | None = None

    @property
    def latency_seconds(self) -> float:
        """The request's own time: its work began until its last token (prefill + decode); the
        queue before it is ``queue_seconds``."""
        return self.prefill_seconds + self.decode_seconds


@dataclass(frozen=True)
class Record(JsonMixin):
    """One results-table row: (example, strategy, parameter point) -> prediction, scores, cost.

    ``params`` is the strategy's typed parameter point (``ragbench.strategies.params``) and
    ``cost`` a ``ragbench.cost.Cost`` (None on an error row); both are stored as JSON objects.
    ``from_dict`` keeps them as plain dicts (this core module knows no strategy); where records
    are read back, ``ragbench.experiment.results.record_from_dict`` types them again.
    """

    example_id: str
    strategy: str
    params: Any  # ragbench.strategies.params.StrategyParams
    prediction: str
    answers: tuple[str, ...] = ()
    scores: dict[str, float | None] = field(default_factory=dict)
    cost: Any = (
        None  # ragbench.cost.accounting.Cost; None: the record failed before any call was costed
    )
    meta: dict[str, Any] = field(default_factory=dict)
    error: str | None = None


_TUPLE_FIELDS: dict[str, tuple[str, ...]] = {
    "Example": ("answers",),
    "GenerationRequest": ("stop",),
    "Record": ("answers",),
}
_NESTED: dict[tuple[str, str], type[JsonMixin]] = {("Example", "documents"): Document}


def _scored_from_dict(data: dict[str, Any]) -> ScoredChunk:
    return ScoredChunk(chunk=Chunk.from_dict(data["chunk"]), score=float(data["score"]))


ScoredChunk.from_dict = staticmethod(_scored_from_dict)  # type: ignore[method-assign]
