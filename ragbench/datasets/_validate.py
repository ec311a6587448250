"""Field validation for dataset importers: JSON-path-aware type checks and file:line errors.

Importers raise ``FieldError(where, message)`` with the JSON path of the bad value;
``read_jsonl`` and ``parse_json_file`` turn it into one ``InputFileError`` naming file, line and
field.
``nonempty`` makes an input that yields no examples an ``InputFileError`` too.
"""

from __future__ import annotations

import bisect
import json
import json.decoder
import json.scanner
import os
import re
from collections.abc import Callable, Iterable
from typing import Any, Protocol, TypeVar

from ragbench.io import InputFileError, iter_jsonl, read_text
from ragbench.registry import did_you_mean
from ragbench.types import Document

T = TypeVar("T")

STRINGS = "list of strings"  # a pseudo-type for check
_DOCUMENT_KEYS = ("id", "text", "title", "meta")


class FieldError(Exception):
    """A field-level validation failure; ``where`` is the JSON path of the offending value."""

    def __init__(self, where: tuple[str | int, ...], message: str):
        super().__init__(message)
        self.where, self.message = where, message

    @property
    def field(self) -> str | None:
        out = ""
        for part in self.where:
            out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else part)
        return out or None


def json_type(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    return {
        str: "a string",
        int: "an integer",
        float: "a number",
        list: "a list",
        dict: "an object",
    }[type(value)]


def check(value: Any, kind: Any, where: tuple) -> Any:
    if kind is STRINGS:
        if not isinstance(value, list):
            raise FieldError(where, f"expected a list of strings, got {json_type(value)}")
        for i, item in enumerate(value):
            if not isinstance(item, str):
                raise FieldError(
                    where + (i,), f"expected a string (list of strings), got {json_type(item)}"
                )
        return value
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        names = {
            str: "a string",
            int: "an integer",
            dict: "an object",
            list: "a list",
            bool: "a boolean",
        }
        raise FieldError(where, f"expected {names[kind]}, got {json_type(value)}")
    return value


def req(obj: dict, key: str, kind: object, where: tuple = ()) -> Any:
    if key not in obj:
        raise FieldError(where + (key,), "missing required field")
    return check(obj[key], kind, where + (key,))


def opt(obj: dict, key: str, kind: object, default: object, where: tuple = ()) -> Any:
    if obj.get(key) is None:
        return default
    return check(obj[key], kind, where + (key,))


def no_unknown(obj: dict, valid: Iterable[str], where: tuple = ()) -> None:
    extra = sorted(set(obj) - set(valid))
    if extra:
        raise FieldError(where + (extra[0],), f"unknown field; valid: {', '.join(sorted(valid))}")


class _HasId(Protocol):
    @property
    def id(self) -> str: ...


_Item = TypeVar("_Item", bound=_HasId)
_T = TypeVar("_T")


def read_jsonl(
    path: str | os.PathLike,
    convert: Callable[..., _Item],
    id_field: str,
    repeats: list[int] | None = None,
    with_line: bool = False,
) -> list[_Item]:
    """Convert each JSONL row (``convert(row, line)`` when ``with_line``), turning a FieldError
    into InputFileError(file, line, field).

    A repeated id is an error naming both lines; with a ``repeats`` list, a record equal to the
    earlier one with its id is skipped instead and its line appended there (verbatim repeats);
    a same-id record with other content is still an error."""
    out: list[_Item] = []
    first: dict[str, tuple[int, _Item]] = {}  # id -> (its first line, its item)
    for lineno, row in iter_jsonl(path):
        try:
            item = convert(row, lineno) if with_line else convert(row)
        except FieldError as bad:
            raise InputFileError(path, lineno, bad.message, bad.field) from None
        if item.id in first:
            line, earlier = first[item.id]
            if repeats is not None and item == earlier:
                repeats.append(lineno)
                continue
            msg = f"duplicate id {item.id!r} (first on line {line})"
            if repeats is not None:
                msg = (
                    f"id {item.id!r} is also on line {line} with different content "
                    "(identical repeats are dropped; conflicting ones must be renamed or removed)"
                )
            raise InputFileError(path, lineno, msg, id_field)
        first[item.id] = (lineno, item)
        out.append(item)
    return out


def nonempty(path: str | os.PathLike, examples: list[_T], why: str) -> list[_T]:
    """``examples`` unchanged, or, when there are none, an ``InputFileError`` saying ``why``."""
    if not examples:
        raise InputFileError(path, None, why)
    return examples


def json_line_of(text: str, where: tuple) -> int:
    """Line of the value at JSON path ``where``: re-parses with the pure-Python scanner, which
    lets us record where each object starts (the C scanner, used for the fast path, cannot)."""
    spans: dict[int, tuple[int, int]] = {}

    def parse_object(s_and_end, *args, **kwargs):
        # json's pure-Python object parser: in the module, not in typeshed's stub
        obj, end = json.decoder.JSONObject(  # type: ignore[attr-defined]
            s_and_end, *args, **kwargs
        )
        spans[id(obj)] = (s_and_end[1] - 1, end)
        return obj, end

    decoder = json.JSONDecoder()
    decoder.parse_object = parse_object  # type: ignore[attr-defined]
    decoder.scan_once = json.scanner.py_make_scanner(decoder)  # type: ignore[attr-defined]
    node = decoder.decode(text)
    newlines = [m.start() for m in re.finditer("\n", text)]
    pos = 0
    for part in where:
        if isinstance(node, dict) and id(node) in spans:
            start, end = spans[id(node)]
            pos = _key_position(text, part, start, end, spans.values()) if part in node else start
        try:
            node = node[part]
        except (KeyError, IndexError, TypeError):
            break
    else:
        if isinstance(node, dict) and id(node) in spans:
            pos = spans[id(node)][0]
    return bisect.bisect_right(newlines, pos) + 1


def _key_position(text: str, key: object, start: int, end: int, spans: Iterable[tuple]) -> int:
    """Offset of ``"key":`` directly inside the object spanning [start, end)."""
    nested = [(s, e) for s, e in spans if start < s < end]
    for m in re.finditer(re.escape(json.dumps(key)) + r"\s*:", text[start:end]):
        at = start + m.start()
        if not any(s <= at < e for s, e in nested):
            return at
    return start


def refuse_duplicate_ids(ids: Iterable[str], what: str, where: str) -> None:
    """A ValueError naming the first id that repeats (``what``: "example", "document")."""
    seen: set[str] = set()
    for i in ids:
        if i in seen:
            raise ValueError(f"duplicate {what} id {i!r}; ids must be unique in {where}")
        seen.add(i)


def document_from_row(d: Any, where: tuple = ()) -> Document:
    """A Document from its JSON object (``id``, ``text``, optional ``title`` and ``meta``),
    strictly: unknown fields and wrong types raise ``FieldError`` at ``where``."""
    check(d, dict, where)
    no_unknown(d, _DOCUMENT_KEYS, where)
    return Document(
        id=req(d, "id", str, where),
        text=req(d, "text", str, where),
        title=opt(d, "title", str, "", where),
        meta=opt(d, "meta", dict, {}, where),
    )


# --------------------------------------------------------------------------- generator parameters


class DatasetParamError(ValueError):
    """A generator parameter of the wrong type or out of its range. ``key`` names it: a run
    reports it at ``dataset.params.<key>`` in its config file (``experiment.resources``)."""

    def __init__(self, key: str, message: str):
        super().__init__(f"dataset parameter {key!r}: {message}")
        self.key, self.message = key, message


def _shown(value: object) -> str:
    return (
        json.dumps(value)
        if isinstance(value, str | list | dict | bool) or value is None
        else f"{value}"
    )


def int_param(key: str, value: object, lo: int = 1, hi: int | None = None) -> int:
    """``value`` as an integer in [lo, hi] (hi: no bound when None), else ``DatasetParamError``."""
    rng = f">= {lo}" if hi is None else f"within [{lo}, {hi}]"
    if not isinstance(value, int) or isinstance(value, bool):
        raise DatasetParamError(key, f"expected an integer {rng}, got {_shown(value)}")
    if value < lo or (hi is not None and value > hi):
        raise DatasetParamError(key, f"{value} is out of range; valid: an integer {rng}")
    return value


def int_list_param(key: str, value: Any, lo: int = 1, why: str = "") -> list[int]:
    """An integer or a list of integers, each >= ``lo`` (``why``: what the bound is, shown in
    the message), as a list; else ``DatasetParamError``."""
    bound = f">= {lo}{f' ({why})' if why else ''}"
    items = value if isinstance(value, list | tuple) else [value]
    if not items or not all(isinstance(v, int) and not isinstance(v, bool) for v in items):
        raise DatasetParamError(
            key, f"expected an integer or a list of integers, each {bound}; got {_shown(value)}"
        )
    for v in items:
        if v < lo:
            raise DatasetParamError(key, f"{v} is out of range; valid: integers {bound}")
    return list(items)


def lengths_param(
    context_lengths: object, final_context_length_buffer: object
) -> tuple[list[int], int]:
    """(context lengths, buffer) of a sized generator: the buffer an integer >= 0 and each
    length more than it, else ``DatasetParamError``."""
    buffer = int_param("final_context_length_buffer", final_context_length_buffer, lo=0)
    why = f"more than final_context_length_buffer, {buffer}"
    return int_list_param("context_lengths", context_lengths, lo=buffer + 1, why=why), buffer


def number_list_param(key: str, value: Any, lo: float, hi: float) -> list[float]:
    """A number or a list of numbers, each within [lo, hi], as floats; else
    ``DatasetParamError``."""
    items = value if isinstance(value, list | tuple) else [value]
    ok = all(isinstance(v, int | float) and not isinstance(v, bool) for v in items)
    if not items or not ok:
        raise DatasetParamError(
            key, f"expected a list of numbers within [{lo:g}, {hi:g}], got {_shown(value)}"
        )
    for v in items:
        if not lo <= v <= hi:
            raise DatasetParamError(
                key, f"{v:g} is out of range; valid: numbers within [{lo:g}, {hi:g}]"
            )
    return [float(v) for v in items]


def choice_param(key: str, value: object, valid: Iterable[str]) -> str:
    """``value`` when it is one of ``valid``, else ``DatasetParamError`` listing them (with a
    did-you-mean)."""
    valid = tuple(valid)
    if value not in valid:
        raise DatasetParamError(
            key, f"{_shown(value)} is not valid; {did_you_mean(str(value), valid)}"
        )
    return value


def read_json_file(path: str | os.PathLike) -> tuple[str, object]:
    """(text, parsed) of a whole-file JSON input (SQuAD, HotpotQA); a missing file or invalid
    JSON is one error naming the file (and the line)."""
    text = read_text(path)  # a missing file or a folder: one error naming it
    try:
        return text, json.loads(text)
    except json.JSONDecodeError as exc:
        msg = f"invalid JSON ({exc.msg} at column {exc.colno})"
        raise InputFileError(path, exc.lineno, msg) from None


def parse_json_file(path: str | os.PathLike, parse: Callable[[object], T]) -> T:
    """``parse`` of a whole-file JSON input (``read_json_file``); the ``FieldError`` it raises
    for a bad field is one ``InputFileError`` naming the file, the field and its line."""
    text, data = read_json_file(path)
    try:
        return parse(data)
    except FieldError as bad:
        raise InputFileError(path, json_line_of(text, bad.where), bad.message, bad.field) from None
