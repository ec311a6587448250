"""``ragbench list KIND``: the valid names a config can use, one line each with what it is.

``KINDS`` maps each kind to the ``Registry`` that holds its names (``"module:ATTR"``), so the list
never drifts from what a config accepts, and a new registry is one line here (a test finds every
``Registry`` in the package and checks that it is listed). A description is the registry's
(``descriptions``), the entry's own (``Choice``, ``Metric``, ``ModelPreset``), the first line
of its docstring, or, for a
``"module:attr"`` entry not yet imported, the docstring read from the source with ``ast``:
listing imports no torch, faiss, transformers or llama-index.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import re
import sys
from collections.abc import Callable

import typer

from ragbench.cost.prices import price_sheet
from ragbench.io import user_errors
from ragbench.judge.prompts import load_prompt
from ragbench.registry import Registry, unknown

# the CLI kind -> "module:ATTR" of its registry
KINDS: dict[str, str] = {
    "datasets": "ragbench.datasets:DATASETS",
    "importers": "ragbench.datasets.formats:IMPORTERS",
    "task-types": "ragbench.datasets.task_types:TASK_TYPES",
    "strategies": "ragbench.strategies:STRATEGIES",
    "metrics": "ragbench.metrics.answer:METRICS",
    "models": "ragbench.models:PRESETS",
    "backends": "ragbench.llm:BACKENDS",
    "kv-caches": "ragbench.llm.kv.variants:KV_CACHES",
    "retrievers": "ragbench.retrieval.names:RETRIEVERS",
    "embedders": "ragbench.retrieval.names:EMBEDDERS",
    "embedder-backends": "ragbench.retrieval.names:EMBEDDER_BACKENDS",
    "precisions": "ragbench.retrieval.embedders.precision:PRECISIONS",
    "splitters": "ragbench.retrieval.names:SPLITTERS",
    "tokenizers": "ragbench.tokenizers:TOKENIZERS",
    "context-orders": "ragbench.retrieval.context:ORDERS",
    "overflow-policies": "ragbench.strategies.prompts:OVERFLOW",
    "judge-metrics": "ragbench.judge.metric:JUDGE_METRICS",
    "judge-prompts": "ragbench.judge.prompts:JUDGE_PROMPTS",
    "price-sheets": "ragbench.cost.prices:PRICE_SHEETS",
}


def registry(kind: str) -> Registry:
    """The registry behind ``kind`` (one of ``KINDS``); an unknown kind names the valid ones."""
    if kind not in KINDS:
        raise unknown("kind", kind, KINDS)
    module, _, attr = KINDS[kind].partition(":")
    return getattr(importlib.import_module(module), attr)


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
            documented = ast.get_docstring(node)
            if documented:
                return documented
    return ast.get_docstring(tree) or ""  # undocumented entry point: what its module is for


def _describe(target: object) -> str:
    if isinstance(target, str) and ":" in target:
        return _first_line(_source_doc(target))
    for attr in ("description", "note"):  # Choice, Metric, ModelPreset
        if getattr(target, attr, ""):
            return str(getattr(target, attr))
    steps = getattr(target, "steps", None)  # Strategy: its module says what it does
    if steps is not None:
        module = importlib.import_module(steps.__module__)
        return _first_line(steps.__doc__ or module.__doc__)
    doc = getattr(target, "__doc__", None)
    name = getattr(target, "__module__", None)  # imported already (``Registry.get``)
    if not doc and name in sys.modules:  # undocumented: what its module is for, as above
        doc = sys.modules[name].__doc__
    return _first_line(doc)


def _price_sheet(name: str) -> str:
    sheet = price_sheet(name)
    what = _first_line(sheet.note) or sheet.model or sheet.provider
    return f"{sheet.kind}, {sheet.date}" + (f": {what}" if what else "")


def _judge_prompt(name: str) -> str:
    prompt = load_prompt(name)
    return f"scores {prompt.metric}: {' / '.join(label for label, _ in prompt.labels)}"


# kinds whose entries are data files: described from the file, by name
_BY_NAME: dict[str, Callable[[str], str]] = {
    "price-sheets": _price_sheet,
    "judge-prompts": _judge_prompt,
}


def entries(kind: str) -> list[tuple[str, str]]:
    """``(name, one-line description)`` for every name of ``kind`` (one of ``KINDS``); an
    open-ended registry ends with what else it accepts."""
    reg = registry(kind)
    by_name = _BY_NAME.get(kind)
    out = [
        (n, reg.descriptions.get(n) or (by_name(n) if by_name else _describe(target)))
        for n, target in reg.items()
    ]
    if reg.other:
        out.append((reg.other, "also accepted"))
    return out


def register(app: typer.Typer) -> None:
    """Adds ``ragbench list KIND`` to the root typer app."""

    @app.command("list")
    def list_command(
        what: str = typer.Argument(
            ..., help=" | ".join(KINDS), metavar="{" + ",".join(KINDS) + "}"
        ),
    ) -> None:
        """The valid names of one kind, each with a one-line description."""
        with user_errors():
            rows = entries(what)
        width = max(len(name) for name, _ in rows)
        for name, description in rows:
            typer.echo(f"{name:{width}s}  {description}".rstrip())
