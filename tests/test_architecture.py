"""The package's shape, checked: folders name the layers, imports flow down, no import circles
(imports inside functions count), few and justified lazy imports, small files, short
signatures (at most 6 required positional parameters), no strategy or
backend names compared outside their packages, no re-export shims, and a Layout section
(docs/layout.md) that names every module. Static (ast): nothing here imports the package."""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "ragbench"

# The small shared core at the top: contracts, registries, I/O, locks, redaction, assets,
# devices, token counting, model facts, the stored schema. Nothing here imports a layer above it.
CORE = {
    "types",
    "registry",
    "io",
    "locks",
    "secrets",
    "assets",
    "devices",
    "tokenizers",
    "models",
    "schema",
    "ranges",  # the declared ranges of strategy parameters and KV variants (pydantic bounds)
}
# Layers, lowest first: a module may import its own package, the core, and lower layers only.
LAYERS = [
    {"core"},
    {"metrics"},
    {"datasets", "llm"},
    {"retrieval", "cost"},
    {"strategies"},
    {"judge"},
    {"analysis"},  # reads a results table: no experiment import (runs call their verdicts)
    {"experiment"},
    {"report"},
    {"workspace"},
    {"cli"},
]
RANK = {name: i for i, layer in enumerate(LAYERS) for name in layer}
# size follows the job (DESIGN.md): past GUIDE_LINES a module says in its docstring why it is one
# job ("One job: ..."); past MAX_LINES it has two. Never split for a count alone.
MAX_LINES = 800
GUIDE_LINES = 500
MAX_TOP_LEVEL = 12  # modules directly in ragbench/, __init__.py included
MAX_LAZY_IMPORTS = 20
# the packages allowed to compare strategy / backend names (they own them)
NAME_OWNERS = {"strategy": "strategies", "backend": "llm"}


@dataclass(frozen=True)
class Import:
    source: str  # importing module, dotted
    target: str  # imported ragbench module, dotted
    line: int
    in_function: bool
    type_checking: bool
    comment: str  # the import statement's lines and the line above it


def _modules() -> dict[str, Path]:
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


MODULES = _modules()


def _resolve(name: str) -> str | None:
    """The module a dotted import name lands in (``ragbench.cost.Cost`` -> ``ragbench.cost``)."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _imports(module: str, path: Path) -> list[Import]:
    source = path.read_text(encoding="utf-8")
    lines = source.splitlines()
    out: list[Import] = []
    is_package = path.name == "__init__.py"

    def targets(node: ast.Import | ast.ImportFrom) -> list[str]:
        if isinstance(node, ast.Import):
            return [a.name for a in node.names]
        base = node.module or ""
        if node.level:  # relative import
            pkg = module.split(".") if is_package else module.split(".")[:-1]
            pkg = pkg[: len(pkg) - (node.level - 1)]
            base = ".".join(pkg + ([base] if base else []))
        return [f"{base}.{a.name}" for a in node.names]

    def visit(node: ast.AST, in_function: bool, type_checking: bool) -> None:
        for child in ast.iter_child_nodes(node):
            fn = in_function or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef)
            tc = type_checking or (
                isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test)
            )
            if isinstance(child, ast.Import | ast.ImportFrom):
                end = child.end_lineno or child.lineno
                text = "\n".join(lines[max(child.lineno - 2, 0) : end])
                for name in targets(child):
                    target = _resolve(name) if name.startswith("ragbench") else None
                    if target and target != module:
                        out.append(
                            Import(module, target, child.lineno, in_function, type_checking, text)
                        )
            visit(child, fn, tc)

    visit(ast.parse(source), False, False)
    return out


IMPORTS = [imp for module, path in MODULES.items() for imp in _imports(module, path)]


def _where(imp: Import) -> str:
    return f"{MODULES[imp.source].relative_to(ROOT)}:{imp.line}"


def _layer(module: str) -> str:
    parts = module.split(".")
    if len(parts) == 1:
        return "core"  # ragbench/__init__.py: lazy re-exports only
    return "core" if parts[1] in CORE else parts[1]


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []
    counter = 0
    for root in sorted(MODULES):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_no_import_circles_counting_imports_inside_functions():
    edges: dict[str, set[str]] = defaultdict(set)
    for imp in IMPORTS:
        edges[imp.source].add(imp.target)
    assert _cycles(edges) == []


def test_the_cycle_finder_finds_a_planted_circle():
    edges: dict[str, set[str]] = defaultdict(set)
    a, b, c = sorted(MODULES)[:3]
    edges[a].add(b)
    edges[b].add(c)
    edges[c].add(a)
    assert _cycles(edges) == [sorted([a, b, c])]


def test_imports_flow_down_the_layers():
    upward = []
    for imp in IMPORTS:
        src, dst = _layer(imp.source), _layer(imp.target)
        if src == dst:
            continue
        assert src in RANK and dst in RANK, f"{_where(imp)}: package not in LAYERS: {src}/{dst}"
        if RANK[dst] >= RANK[src]:
            upward.append(f"{_where(imp)}: {imp.source} ({src}) imports {imp.target} ({dst})")
    assert upward == []


def test_every_package_is_a_known_layer():
    packages = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists()}
    assert packages - {"data"} == set(RANK) - {"core"}


def test_no_type_checking_imports_of_ragbench_modules():
    hidden = [_where(imp) for imp in IMPORTS if imp.type_checking]
    assert hidden == []


def test_lazy_imports_are_few_and_each_says_why():
    lazy = [imp for imp in IMPORTS if imp.in_function]
    statements = {(imp.source, imp.line) for imp in lazy}
    assert len(statements) <= MAX_LAZY_IMPORTS, sorted(_where(i) for i in lazy)
    unexplained = [_where(imp) for imp in lazy if "# lazy:" not in imp.comment]
    assert unexplained == [], "a function-level import needs a '# lazy: <reason>' comment"


MAX_REQUIRED_POSITIONAL = 6  # more, and a call site reads as a row of unnamed values


def required_positional(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """The parameters a call must give by position or name with no default (self/cls apart):
    what ruff's PLR0917 cannot count, since it counts the ones with defaults too."""
    args = fn.args.posonlyargs + fn.args.args
    first = args[0].arg if args else ""
    return len(args) - len(fn.args.defaults) - (first in ("self", "cls"))


def long_signatures(root: Path) -> list[str]:
    out = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            is_def = isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
            if is_def and required_positional(node) > MAX_REQUIRED_POSITIONAL:
                out.append(f"{path.relative_to(root.parent)}:{node.lineno} {node.name}")
    return out


def test_no_function_takes_more_than_six_required_positional_parameters(tmp_path):
    assert long_signatures(PACKAGE) == []  # the rest keyword-only, or one dataclass
    planted = tmp_path / "pkg" / "m.py"
    planted.parent.mkdir()
    planted.write_text(
        "class C:\n    def f(self, a, b, c, d, e, f, g=1, *, h): ...\n"
        "def g(a, b, c, d, e, f, g): ...\n"
    )
    assert long_signatures(planted.parent) == ["pkg/m.py:3 g"]


def test_top_level_modules_and_file_sizes():
    top = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(top) <= MAX_TOP_LEVEL, top
    assert {p.removesuffix(".py") for p in top} - {"__init__"} <= CORE
    sizes = {p: len(p.read_text(encoding="utf-8").splitlines()) for p in MODULES.values()}
    big = {str(p.relative_to(ROOT)): n for p, n in sizes.items() if n > MAX_LINES}
    assert big == {}
    unexplained = [
        str(p.relative_to(ROOT))
        for p, n in sizes.items()
        if n > GUIDE_LINES and "One job:" not in (ast.get_docstring(ast.parse(p.read_text())) or "")
    ]
    assert unexplained == [], f"over {GUIDE_LINES} lines: say 'One job: ...' in the docstring"


def _defined_names(path: Path) -> set[str]:
    """The names a module defines at its top level (def, class, assignment; inside a top-level
    ``if`` or ``try`` too), not the ones it imports."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names: set[str] = set()
    nodes = [
        n
        for top in tree.body
        for n in ([top] if not isinstance(top, ast.If | ast.Try) else ast.walk(top))
    ]
    for node in nodes:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign | ast.AugAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
    return names


def _reexports(sources: dict[str, str]) -> list[str]:
    """``from ragbench.x.y import name`` where module ``x/y.py`` does not define ``name`` (it
    imported it from elsewhere: a re-export shim), in ``sources`` (label -> code); and, in the
    package's modules other than ``__init__.py``, an ``__all__`` naming what the module does not
    define or a ``noqa: F401`` (an import kept for others)."""
    modules = {m: p for m, p in MODULES.items() if p.name != "__init__.py"}
    defined = {m: _defined_names(p) for m, p in modules.items()}
    found = []
    for label, source in sources.items():
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.ImportFrom) and not node.level and node.module in modules:
                for alias in node.names:
                    if alias.name not in defined[node.module] | {"*"} and (
                        f"{node.module}.{alias.name}" not in MODULES
                    ):
                        found.append(
                            f"{label}:{node.lineno}: {node.module} does not define {alias.name}"
                        )
    for module, path in modules.items():
        source = path.read_text(encoding="utf-8")
        if "noqa: F401" in source:
            found.append(f"{path.relative_to(ROOT)}: '# noqa: F401' keeps an import for others")
        for node in ast.parse(source).body:
            if isinstance(node, ast.Assign) and any(
                getattr(t, "id", "") == "__all__" for t in node.targets
            ):
                names = {e.value for e in ast.walk(node.value) if isinstance(e, ast.Constant)}
                if extra := sorted(names - defined[module]):
                    found.append(f"{path.relative_to(ROOT)}: __all__ re-exports {extra}")
    return found


def test_every_import_names_the_module_that_defines_the_name():
    """No re-export shims (DESIGN.md): the package, the tests and the benchmarks import each name
    from the module that defines it. A package's ``__init__`` may re-export (ragbench's top level
    is the documented API); a module may not."""
    files = [
        *PACKAGE.rglob("*.py"),
        *(ROOT / "tests").rglob("*.py"),
        *(ROOT / "benchmarks").rglob("*.py"),
    ]
    sources = {str(p.relative_to(ROOT)): p.read_text(encoding="utf-8") for p in files}
    assert _reexports(sources) == []


def test_the_reexport_check_sees_a_shim():
    # rag.py defines rag_prompt and imports assemble_context (from retrieval/context.py)
    planted = "from ragbench.strategies.rag import assemble_context, rag_prompt\n"
    found = _reexports({"planted.py": planted})
    assert found == ["planted.py:1: ragbench.strategies.rag does not define assemble_context"]


def _registry_names(path: Path, variable: str) -> set[str]:
    """The string keys of a registry literal (``BACKENDS = Registry("...", {"hf": ...})``) or the
    ``Strategy("name", ...)`` entries, read with ast."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == variable for t in node.targets
        ):
            for sub in ast.walk(node.value):
                if isinstance(sub, ast.Dict):
                    names |= {k.value for k in sub.keys if isinstance(k, ast.Constant)}
                if isinstance(sub, ast.Call) and getattr(sub.func, "id", "") == "Strategy":
                    first = sub.args[0] if sub.args else None
                    if isinstance(first, ast.Constant):
                        names.add(first.value)
    return {n for n in names if isinstance(n, str)}


STRATEGY_NAMES = _registry_names(PACKAGE / "strategies" / "registry.py", "STRATEGIES")
BACKEND_NAMES = _registry_names(PACKAGE / "llm" / "__init__.py", "BACKENDS")


def test_the_name_sets_are_read():
    assert {"closed_book", "long_context", "rag", "self_route"} <= STRATEGY_NAMES
    assert {"hf", "fake", "openai"} <= BACKEND_NAMES


def _compared_names(tree: ast.AST, names: set[str]) -> list[tuple[int, str]]:
    """(line, name) of every ``x == "name"``, ``x in ("name", ...)`` or ``x.startswith("name")``."""
    out = []
    for node in ast.walk(tree):
        constants: list[ast.AST] = []
        if isinstance(node, ast.Compare):
            for operand in [node.left, *node.comparators]:
                if isinstance(operand, ast.Tuple | ast.List | ast.Set):
                    constants.extend(operand.elts)
                else:
                    constants.append(operand)
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", "") in (
            "startswith",
            "endswith",
        ):
            constants.extend(node.args)
        for c in constants:
            if isinstance(c, ast.Constant) and c.value in names:
                out.append((node.lineno, c.value))
    return out


@pytest.mark.parametrize("kind", sorted(NAME_OWNERS))
def test_strategy_and_backend_names_are_compared_only_by_their_owners(kind):
    names = STRATEGY_NAMES if kind == "strategy" else BACKEND_NAMES
    owner = PACKAGE / NAME_OWNERS[kind]
    found = []
    for path in MODULES.values():
        if owner in path.parents:
            continue
        for line, name in _compared_names(ast.parse(path.read_text(encoding="utf-8")), names):
            found.append(f"{path.relative_to(ROOT)}:{line}: compares {kind} name {name!r}")
    assert found == [], "declare a capability or a strategy property instead"


def test_the_name_comparison_check_sees_one():
    tree = ast.parse('if cfg.backend == "hf" or s in ("rag", "x") or n.startswith("rag"): pass')
    assert _compared_names(tree, {"hf", "rag"}) == [(1, "hf"), (1, "rag"), (1, "rag")]


def _layout_section() -> str:
    page = (ROOT / "docs" / "layout.md").read_text(encoding="utf-8")
    match = re.search(r"^## Layout\n(.*?)(?=^## )", page, flags=re.S | re.M)
    assert match, "docs/layout.md has no '## Layout' section"
    return match.group(1)


def test_the_docs_layout_names_every_module():
    """Each folder has a line ``  folder/`` in the Layout block, and every module of the folder
    is named (``name.py``; in a sub-package ``sub/name.py``) between it and the next folder's
    line (a package's ``__init__.py`` goes without saying)."""
    layout = _layout_section()
    blocks: dict[str, str] = {}
    current = "ragbench/"
    for line in layout.splitlines():
        m = re.match(r"^\s{0,4}([a-z_]+/)\s", line + " ")
        if m and line.startswith("  ") and not line.startswith("   "):
            current = m.group(1)
        blocks[current] = blocks.get(current, "") + line + "\n"
    missing = []
    for path in MODULES.values():
        rel = path.relative_to(PACKAGE)
        folder = "ragbench/" if len(rel.parts) == 1 else f"{rel.parts[0]}/"
        if folder != "ragbench/" and path.name == "__init__.py":
            continue
        name = "/".join(rel.parts[1:]) if len(rel.parts) > 2 else path.name
        if not re.search(rf"(?<![\w/]){re.escape(name)}", blocks.get(folder, "")):
            missing.append(str(path.relative_to(ROOT)))
    assert missing == [], "docs/layout.md's Layout section does not name these modules"
