"""Value ranges declared once, on a frozen dataclass's fields, in the run config's schema
language: ``top_k: Annotated[int, Field(ge=1, strict=True)] | None = 5``.

The run config's sections are pydantic models whose fields declare their ranges with ``Field``;
the parameter classes its ``strategies`` (and their ``kv``) build are frozen dataclasses (built
in code too, and stored in records), and declare theirs the same way. ``violation`` checks an
instance against those declarations with pydantic (strict: ``True`` is no integer, ``"0.5"`` no
number) and says which field is outside which range; the class words the error (``must``,
``needs``), which names the field, the valid range and the value given.
"""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import TypeAdapter, ValidationError
from pydantic.fields import FieldInfo

_KINDS = {int: "an integer", float: "a number", bool: ""}
BOUNDS = ("gt", "ge", "lt", "le")  # pydantic's (annotated-types') bounds, as Field names them


@dataclass(frozen=True)
class Violation:
    """A field's value outside its declared range (``range``: ``in (0, 1]``, ``>= 1``)."""

    field: str
    value: Any
    kind: str  # "an integer", "a number", "" (a flag: the range says it)
    range: str
    nullable: bool  # null is valid too
    help: str  # the field's description, shown in parentheses

    def _help(self) -> str:
        return f" ({self.help})" if self.help else ""

    def must(self, owner: str) -> str:
        """``rag: top_k must be an integer >= 1 or null, got 0``."""
        expected = " ".join(p for p in (self.kind, self.range) if p)
        null = " or null" if self.nullable else ""
        return f"{owner}: {self.field} must be {expected}{null}{self._help()}, got {self.value!r}"

    def needs(self, owner: str) -> str:
        """``kv sinks needs window_tokens >= 1, got 0``."""
        return f"{owner} needs {self.field} {self.range}{self._help()}, got {self.value!r}"


def range_text(info: FieldInfo, base: Any) -> str:
    """``in (0, 1]``, ``>= 1``, ``true or false``: the bounds ``info`` declares. Pure."""
    if base is bool:
        return "true or false"
    bound = {k: getattr(m, k) for m in info.metadata for k in BOUNDS if hasattr(m, k)}
    low = ("(", bound["gt"]) if "gt" in bound else ("[", bound["ge"]) if "ge" in bound else None
    high = (bound["lt"], ")") if "lt" in bound else (bound["le"], "]") if "le" in bound else None
    if low and high:
        return f"in {low[0]}{low[1]}, {high[0]}{high[1]}"
    if low:
        return f"{'>' if low[0] == '(' else '>='} {low[1]}"
    if high:
        return f"{'<' if high[1] == ')' else '<='} {high[0]}"
    return ""


def _declared(hint: Any) -> tuple[FieldInfo, Any, bool] | None:
    """(the ``Field`` of an ``Annotated`` hint, its base type, whether None is valid too)."""
    union = typing.get_origin(hint) in (typing.Union, types.UnionType)
    args = typing.get_args(hint) if union else (hint,)
    for arg in args:
        if typing.get_origin(arg) is Annotated:
            base, *meta = typing.get_args(arg)
            infos = [m for m in meta if isinstance(m, FieldInfo)]
            if infos:
                return infos[0], base, type(None) in args
    return None


@functools.cache
def _checks(cls: type) -> tuple[tuple[str, TypeAdapter[Any], Violation], ...]:
    """Per declared field of dataclass ``cls``: its name, a validator and its violation."""
    hints = typing.get_type_hints(cls, include_extras=True)
    out = []
    for f in dataclasses.fields(cls):
        declared = _declared(hints.get(f.name))
        if declared is None:
            continue
        info, base, nullable = declared
        kind, text, help = _KINDS.get(base, ""), range_text(info, base), info.description or ""
        template = Violation(f.name, None, kind, text, nullable, help)
        out.append((f.name, TypeAdapter(hints[f.name]), template))
    return tuple(out)


def violation(obj: Any) -> Violation | None:
    """The first field of dataclass ``obj`` (in field order) outside its declared range."""
    cls: type = type(obj)
    for name, adapter, template in _checks(cls):
        value = getattr(obj, name)
        try:
            adapter.validate_python(value)
        except ValidationError:
            return dataclasses.replace(template, value=value)
    return None
