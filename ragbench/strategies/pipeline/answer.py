"""A pipeline's answer, checked: the return contract ``PipelineAnswer`` (``answer``, optional
``contexts`` and ``usage``) and its parser. A pipeline may return a string, a ``PipelineAnswer``,
a dict with its fields (an HTTP service's JSON) or an object with those attributes; anything
else, an unknown field or a value of the wrong type is a ``MalformedAnswer`` naming the field
(``contexts[2].span``, ``usage.prompt_tokens``)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any


class MalformedAnswer(ValueError):
    """A pipeline's answer is not a ``PipelineAnswer``; the message names the field."""


@dataclass(frozen=True)
class Context:
    """One passage the pipeline used, best first: its text and, where known, ids and span."""

    text: str
    doc_id: str | None = None
    id: str | None = None
    span: tuple[int, int] | None = None  # character offsets in the document
    score: float | None = None


@dataclass(frozen=True)
class Usage:
    """What the pipeline's model calls consumed (None: not reported; counted locally)."""

    prompt_tokens: int | None = None
    cached_prompt_tokens: int = 0
    completion_tokens: int | None = None
    model: str = ""
    latency_seconds: float | None = None  # as the pipeline measured it (the record's is ours)


@dataclass(frozen=True)
class PipelineAnswer:
    """The return contract: ``answer``, optionally ``contexts`` and ``usage`` (and ``version``,
    what an HTTP service says it runs). ``parse`` accepts a string, a dict, an object with
    these attributes, or a PipelineAnswer, and validates every field."""

    answer: str
    # None: the pipeline reported none (a plain string, no ``contexts`` field): its retrieval
    # cannot be scored; ``()``: it reported that it retrieved nothing (scored as such)
    contexts: tuple[Context, ...] | None = None
    usage: Usage | None = None
    version: str | None = None

    @classmethod
    def parse(cls, raw: Any) -> PipelineAnswer:
        if isinstance(raw, str):
            return cls(raw)
        fields = [f.name for f in dataclasses.fields(cls)]
        data = _fields_of(raw, fields, "the answer", "a string, a dict or an object with `answer`")
        if not isinstance(data.get("answer"), str):
            raise MalformedAnswer(f"answer must be a string, got {shown(data.get('answer'))}")
        version = data.get("version")
        if version is not None and not isinstance(version, str):
            raise MalformedAnswer(f"version must be a string or null, got {shown(version)}")
        contexts = data.get("contexts")
        if contexts is not None and not isinstance(contexts, list | tuple):
            raise MalformedAnswer(f"contexts must be a list, got {shown(contexts)}")
        parsed = (
            None
            if contexts is None
            else tuple(_context(c, f"contexts[{i}]") for i, c in enumerate(contexts))
        )
        usage = data.get("usage")
        return cls(data["answer"], parsed, None if usage is None else _usage(usage), version)


def shown(value: object) -> str:
    text = repr(value)
    return f"{type(value).__name__} {text[:60]}{'...' if len(text) > 60 else ''}"


def _fields_of(raw: object, fields: list[str], what: str, expected: str) -> dict[str, Any]:
    if isinstance(raw, dict):
        unknown = sorted(set(raw) - set(fields))
        if unknown:
            raise MalformedAnswer(f"{what} has unknown field(s) {unknown}; valid: {fields}")
        return dict(raw)
    if not any(hasattr(raw, f) for f in fields) or isinstance(raw, list | tuple | int | float):
        raise MalformedAnswer(f"{what} must be {expected}, got {shown(raw)}")
    return {f: getattr(raw, f) for f in fields if hasattr(raw, f)}


def _context(raw: Any, where: str) -> Context:
    if isinstance(raw, str):
        return Context(raw)
    fields = [f.name for f in dataclasses.fields(Context)]
    data = _fields_of(raw, fields, where, "a string or a dict with `text`")
    if not isinstance(data.get("text"), str):
        raise MalformedAnswer(f"{where}.text must be a string, got {shown(data.get('text'))}")
    for name in ("doc_id", "id"):
        if data.get(name) is not None and not isinstance(data[name], str | int):
            raise MalformedAnswer(f"{where}.{name} must be a string, got {shown(data[name])}")
        if data.get(name) is not None:
            data[name] = str(data[name])
    span = data.get("span")
    if span is not None:
        ok = isinstance(span, list | tuple) and len(span) == 2
        if not ok or not all(isinstance(v, int) and not isinstance(v, bool) for v in span):
            raise MalformedAnswer(f"{where}.span must be [start, end] integers, got {shown(span)}")
        data["span"] = (int(span[0]), int(span[1]))
    score = data.get("score")
    if score is not None and (isinstance(score, bool) or not isinstance(score, int | float)):
        raise MalformedAnswer(f"{where}.score must be a number, got {shown(score)}")
    return Context(**data)


def _usage(raw: Any) -> Usage:
    fields = [f.name for f in dataclasses.fields(Usage)]
    data = _fields_of(raw, fields, "usage", "a dict of token counts")
    for name in ("prompt_tokens", "cached_prompt_tokens", "completion_tokens"):
        value = data.get(name)
        if value is None and name not in data or (value is None and name != "cached_prompt_tokens"):
            continue
        if value is None or isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise MalformedAnswer(f"usage.{name} must be an integer >= 0, got {shown(value)}")
    latency = data.get("latency_seconds")
    if latency is not None and (isinstance(latency, bool) or not isinstance(latency, int | float)):
        raise MalformedAnswer(f"usage.latency_seconds must be a number, got {shown(latency)}")
    if not isinstance(data.get("model", ""), str):
        raise MalformedAnswer(f"usage.model must be a string, got {shown(data['model'])}")
    usage = Usage(**data)
    if usage.prompt_tokens is not None and usage.cached_prompt_tokens > usage.prompt_tokens:
        raise MalformedAnswer("usage.cached_prompt_tokens exceeds usage.prompt_tokens")
    return usage
