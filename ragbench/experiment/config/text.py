"""The text side of configs: ``--set dotted.path=value`` overrides applied to the raw mapping
before validation, and pydantic errors explained as ``file:line: field: message`` lines with a
did-you-mean over the valid keys (shared by run configs and sweep specs)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError
from pydantic_core import PydanticCustomError

from ragbench import secrets
from ragbench.io import load_yaml, yaml_problem
from ragbench.registry import did_you_mean


class ConfigError(ValueError):
    """A bad config; the message names the file, line and field."""


_STEP = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)((?:\[\d+\])*)")


def _override_path(expr: str, path: str) -> list[str | int]:
    """``strategies[1].params.top_k`` -> ``["strategies", 1, "params", "top_k"]``."""
    steps: list[str | int] = []
    for part in path.split("."):
        match = _STEP.fullmatch(part)
        if match is None:
            raise ConfigError(
                f"--set {expr}: bad path {path!r}; write dotted keys with list indices, "
                "e.g. model.max_new_tokens=64 or strategies[1].params.top_k=[2,4]"
            )
        steps.append(match.group(1))
        steps.extend(int(i) for i in re.findall(r"\d+", match.group(2)))
    return steps


def apply_overrides(data: dict[str, Any], overrides: Sequence[str]) -> dict[str, Any]:
    """``data`` (a config mapping, not modified) with each ``dotted.path=value`` set; values
    are YAML (``64``, ``[2, 4]``, ``{device: cpu}``, ``null``), as in the file. A strategy given
    by name (``- rag``) is expanded to ``{name: rag}`` when a path goes into it; a missing
    mapping on the way is created. The result is validated like the file."""
    import copy

    data = copy.deepcopy(data)
    for expr in overrides:
        path, sep, text = expr.partition("=")
        expr = _shown(expr, path, text)  # every message below quotes a credential masked
        if not sep or not path.strip():
            raise ConfigError(f"--set {expr}: expected dotted.path=value")
        try:
            value = load_yaml(text)
        except yaml.YAMLError as exc:  # one line: PyYAML's own message quotes the text
            _, problem = yaml_problem(exc)
            raise ConfigError(f"--set {expr}: invalid YAML value: {problem}") from None
        steps = _override_path(expr, path.strip())
        node: Any = data
        for i, step in enumerate(steps):
            last = i == len(steps) - 1
            where = "".join(f"[{s}]" if isinstance(s, int) else f".{s}" for s in steps[:i])
            where = where.lstrip(".") or "the config"
            if isinstance(step, int):
                if not isinstance(node, list) or not -len(node) <= step < len(node):
                    size = len(node) if isinstance(node, list) else 0
                    raise ConfigError(
                        f"--set {expr}: {where} has no item [{step}] (valid: 0..{size - 1})"
                    )
            elif not isinstance(node, dict):
                raise ConfigError(f"--set {expr}: {where} is not a mapping")
            if last:
                node[step] = value
                break
            child = node[step] if isinstance(step, int) else node.get(step)
            if isinstance(child, str) and where == "strategies":  # `- rag` short for {name: rag}
                child = {"name": child}
            if child is None:
                child = {}
            node[step] = child
            node = child
    return data


def _shown(expr: str, path: str, text: str) -> str:
    """``path=value`` as messages quote it: a credential-named path's value (``api_key``,
    ``token``...) is remembered as a secret (so the YAML parser's own excerpt of it is masked
    too) and shown as ``***``."""
    last = re.split(r"[.\[\]]", path.strip().rstrip("]"))[-1]
    if not text.strip() or not secrets.names_a_credential(last):
        return expr
    secrets.remember(text, text.strip(), text.strip().strip("[]{}\"'"))
    return f"{path}={secrets.MASK}"


def located(loc: tuple, build: Any, *args: Any) -> Any:
    """``build(*args)`` inside a model validator, its ValueError reported at ``loc`` in the
    config (``("strategies", 1)``): a model validator's own errors are reported at the root,
    with no line."""
    try:
        return build(*args)
    except ValueError as exc:
        error = PydanticCustomError("value_error", "{error}", {"error": str(exc)})
        raise ValidationError.from_exception_data(
            "config", [{"type": error, "loc": loc, "input": args[0] if args else None}]
        ) from None


def explain_validation_error(
    exc: ValidationError, source: str, text: str | None, root: type[BaseModel]
) -> str:
    """pydantic errors as ``file:line: field: message`` lines; unknown keys get a did-you-mean
    over the valid keys of the model at that place (``root`` is the validated top-level model).
    Shared by run configs and sweep specs."""
    lines = []
    for err in exc.errors():
        loc = tuple(err["loc"])
        field = ".".join(str(p) for p in loc) or "<root>"
        line = _line_of(text, loc) if text else None
        where = f"{source}:{line}" if line else source
        if err["type"] == "extra_forbidden":
            model = _model_at(root, loc[:-1])
            valid = list(model.model_fields) if model else []
            msg = f"unknown key {loc[-1]!r}; {did_you_mean(str(loc[-1]), valid)}"
        else:
            msg = _message(err, field)
        lines.append(f"{where}: {field}: {msg}")
    return "\n".join(lines)


# pydantic's parsing errors of a text given where a number or a flag belongs, by what belongs
_EXPECTED = {
    "int_parsing": "an integer",
    "float_parsing": "a number",
    "bool_parsing": "true or false",
}
# e-notation without a dot: YAML 1.1 (PyYAML) reads ``1e15`` as text (``1.0e+15`` is a number)
_E_NOTATION = re.compile(r"[-+]?[0-9]+[eE][-+]?[0-9]+")


def _message(err: Any, field: str) -> str:
    """One pydantic error's message, naming the value it refused: a validator's own message as
    it is (it names the value itself), a text where a number belongs as ``'1e15' is not an
    integer`` (pydantic's "unable to parse string" names neither), anything else pydantic's
    message with ``(given: VALUE)``. A credential-named field's value is shown as ``***``."""
    ctx = err.get("ctx", {}).get("error")
    if ctx is not None and str(ctx):
        return str(ctx)
    msg = err["msg"].removeprefix("Value error, ")
    value = err.get("input")
    if err["type"] == "missing" or not isinstance(value, str | int | float | bool):
        return msg
    if secrets.names_a_credential(field.rsplit(".", 1)[-1]):
        shown = secrets.MASK
    else:
        shown = secrets.redact_text(repr(value))
    if err["type"] in _EXPECTED and isinstance(value, str):
        return f"{shown} is not {_EXPECTED[err['type']]}{_yaml_number_hint(value)}"
    return f"{msg} (given: {shown})"


def _yaml_number_hint(text: str) -> str:
    """Why a number in e-notation arrived as text, and what to write instead."""
    if not _E_NOTATION.fullmatch(text.strip()):
        return ""
    number = float(text)
    written = str(int(number)) if number.is_integer() else "the number out"
    return f" (YAML reads {text.strip()} as text, not a number: write {written})"


def _model_at(root: type[BaseModel], loc: tuple) -> type[BaseModel] | None:
    """The pydantic model class at a location path (for the list of valid keys)."""
    model: type[BaseModel] | None = root
    for part in loc:
        if isinstance(part, int) or model is None:
            continue
        field = model.model_fields.get(str(part))
        if field is None:
            return None
        ann = field.annotation
        args = getattr(ann, "__args__", ()) or (ann,)
        model = next((a for a in args if isinstance(a, type) and issubclass(a, BaseModel)), None)
    return model


def _line_of(text: str, loc: tuple) -> int | None:
    """1-based YAML line of the key or item at ``loc`` (closest existing ancestor)."""
    try:
        node = yaml.compose(text)
    except yaml.YAMLError:
        return None
    line = None
    for part in loc:
        if isinstance(node, yaml.MappingNode):
            match = next(((k, v) for k, v in node.value if k.value == str(part)), None)
            if match is None:
                break
            line, node = match[0].start_mark.line + 1, match[1]
        elif (
            isinstance(node, yaml.SequenceNode) and isinstance(part, int) and part < len(node.value)
        ):
            node = node.value[part]
            line = node.start_mark.line + 1
        else:
            break
    return line
