"""``ragbench list WHAT``: the valid names a config can use, one line each with what it is.

Read from the registries themselves (``ragbench.registry.Registry``), so the list never drifts
from what a config accepts. A description is the first line of the docstring of what the entry
points to, read from the source with ``ast``: listing imports no torch, faiss or llama-index.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import re
from collections.abc import Callable
from typing import Any

KINDS = ("datasets", "strategies", "metrics", "models", "price-sheets", "retrievers", "embedders")


def _first_line(doc: str | None) -> str:
    lines = [line.strip() for line in (doc or "").strip().splitlines()]
    first = []
    for line in lines:  # the first sentence or paragraph, on one line
        if not line:
            break
        first.append(line)
    text = " ".join(first).replace("``", "")
    # the first sentence: a period before a capital, not an abbreviation ("Cormack et al. ")
    match = re.search(r"(?<!\bal)(?<!\be\.g)(?<!\bi\.e)\.\s+(?=[A-Z])", text)
    text = text[: match.start() + 1] if match else text
    return text if len(text) <= 110 else text[:107].rstrip() + "..."


def _source_doc(target: str) -> str:
    """The docstring of ``"module:attr"`` without importing the module."""
    module, _, attr = target.partition(":")
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        return ""
    with open(spec.origin, encoding="utf-8") as f:
        tree = ast.parse(f.read())
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.ClassDef) and node.name == attr:
            if ast.get_docstring(node):
                return ast.get_docstring(node) or ""
    return ast.get_docstring(tree) or ""  # undocumented entry point: what its module is for


def _describe(target: Any) -> str:
    if isinstance(target, str) and ":" in target:
        return _first_line(_source_doc(target))
    for attr in ("description", "note"):  # Metric, ModelPreset
        if getattr(target, attr, ""):
            return str(getattr(target, attr))
    steps = getattr(target, "steps", None)  # Strategy: its module says what it does
    if steps is not None:
        module = importlib.import_module(steps.__module__)
        return _first_line(steps.__doc__ or module.__doc__)
    return _first_line(getattr(target, "__doc__", None))


def entries(kind: str) -> list[tuple[str, str]]:
    """``(name, one-line description)`` for every name of ``kind`` (one of ``KINDS``)."""
    from ragbench.registry import unknown

    listers: dict[str, Callable[[], list[tuple[str, str]]]] = {
        "datasets": lambda: _registry("ragbench.datasets", "DATASETS"),
        "strategies": lambda: _registry("ragbench.strategies", "STRATEGIES"),
        "metrics": lambda: _registry("ragbench.metrics.answer", "METRICS"),
        "models": _models,
        "price-sheets": _price_sheets,
        "retrievers": lambda: _registry("ragbench.retrieval.names", "RETRIEVERS"),
        "embedders": lambda: _registry("ragbench.retrieval.names", "EMBEDDERS"),
    }
    if kind not in listers:
        raise unknown("list", kind, KINDS)
    return listers[kind]()


def _registry(module: str, name: str) -> list[tuple[str, str]]:
    registry = getattr(importlib.import_module(module), name)
    out = [(n, _describe(registry._entries[n])) for n in registry.names()]
    if registry.other:  # open-ended: say what else it accepts
        out.append((registry.other, "also accepted"))
    return out


def _models() -> list[tuple[str, str]]:
    from ragbench.models import PRESETS

    out = [(name, _describe(preset)) for name, preset in sorted(PRESETS.items())]
    out.append(("<HF id, folder or .gguf>", "any other transformers model (backend hf)"))
    return out


def _price_sheets() -> list[tuple[str, str]]:
    from ragbench.cost.prices import PRICE_SHEETS, price_sheet

    out = []
    for name in PRICE_SHEETS.names():
        sheet = price_sheet(name)
        what = _first_line(sheet.note) or sheet.model or sheet.provider
        out.append((name, f"{sheet.kind}, {sheet.date}" + (f": {what}" if what else "")))
    return out


def register(app) -> None:
    """Adds ``ragbench list WHAT`` to the root typer app."""
    import typer

    @app.command("list")
    def list_command(
        what: str = typer.Argument(
            ..., help=" | ".join(KINDS), metavar="{" + ",".join(KINDS) + "}"
        ),
    ) -> None:
        """The valid names of one kind, each with a one-line description."""
        from ragbench.io import user_errors

        with user_errors():
            rows = entries(what)
        width = max(len(name) for name, _ in rows)
        for name, description in rows:
            typer.echo(f"{name:{width}s}  {description}".rstrip())
