"""The documentation holds: every ``ragbench`` command and ``--option`` the README and the docs/
pages name exists in the CLI (the typer app's commands and their parameters, walked), every
``make`` target they name is in the Makefile, the README stays short and links every page, its
notebook and command tables are complete, and the site builds with ``mkdocs build --strict``
(offline: the Material theme without web fonts, no plugin that fetches anything)."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import typer

from ragbench.cli import app
from ragbench.cli.listing import KINDS

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
PAGES = [README, *sorted(DOCS.glob("*.md"))]

# Options that belong to other tools a page names beside ragbench (the tool each belongs to); an
# option in this list is not looked for in the CLI.
FOREIGN_OPTIONS = {
    "--allow-root": "jupyter lab",
    "--HistoryManager.enabled": "IPython",
    "--log_samples": "lm-evaluation-harness",
    "--task": "vllm serve",
    "--quick": "benchmarks/*.py",
    "--rounds": "benchmarks/retrieval.py",
    "--device": "benchmarks/llm.py, gpu_check.sh",
    "--only-kv": "benchmarks/llm.py",
    "--only-reproducibility": "benchmarks/cost.py",
    "--corpus-only": "benchmarks/runner.py",
    "--arms": "benchmarks/compare_speed.py, benchmarks/calibration_cost.py",
    "--trees": "benchmarks/compare_speed.py, benchmarks/calibration_cost.py",
    "--arm-timeout": "benchmarks/compare_speed.py",
    "--parts": "benchmarks/gpu_check.sh",
    "--wheels": "benchmarks/gpu_check.sh",
    "--no-deps": "pip install",
    "--strict": "mkdocs build",
}


def _cli() -> dict[tuple[str, ...], set[str] | None]:
    """Every command path of the ``ragbench`` app: a group maps to None, a command to the
    options it takes (``--help`` included)."""
    tree: dict[tuple[str, ...], set[str] | None] = {}

    def walk(command, path: tuple[str, ...]) -> None:
        if hasattr(command, "commands"):
            tree[path] = None
            for name, sub in command.commands.items():
                walk(sub, (*path, name))
        else:
            opts = {o for p in command.params for o in (*p.opts, *p.secondary_opts)}
            tree[path] = {o for o in opts if o.startswith("-")} | {"--help"}

    walk(typer.main.get_command(app), ())
    return tree


CLI = _cli()
ALL_OPTIONS = set().union(*(opts for opts in CLI.values() if opts))

_FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
_SPAN = re.compile(r"(?<!`)`([^`]+)`(?!`)")
_STARTS = re.compile(r"^(?:[A-Z_]+=\S+\s+)*(?:\S*/)?ragbench\s+(?=[a-z{])")
# a sub-command named without `ragbench` in front (`data docs`, `prices show NAME`)
_GROUPS = "|".join(p[0] for p, opts in CLI.items() if len(p) == 1 and opts is None)
_SUB = re.compile(rf"^(?=(?:{_GROUPS})\s+[a-z])")
_INSIDE = re.compile(r"(?:^|\s)(?:\S*/)?ragbench\s+(?=[a-z])")
_MAKE = re.compile(r"^make\s+([a-z][\w-]*)")


def _sections(text: str) -> list[str]:
    """A page cut at its headings (a fence's ``#`` comments are not headings)."""
    sections, current, fenced = [], [], False
    for line in text.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        if not fenced and re.match(r"#{1,6} ", line) and current:
            sections.append("\n".join(current))
            current = []
        current.append(line)
    sections.append("\n".join(current))
    return sections


def _mentions(section: str) -> tuple[list[str], list[str], list[str]]:
    """(ragbench command lines, standalone ``--option`` spans, make target names) of a section:
    from inline code spans and from fenced blocks (a line that continues with ``--`` belongs to
    the command above it; Python, JSON and CSV blocks name no commands)."""
    commands: list[str] = []
    options: list[str] = []
    makes: list[str] = []
    prose = _FENCE.sub("", section)
    for span in _SPAN.findall(prose):
        span = " ".join(span.split())
        if m := _STARTS.match(span) or _SUB.match(span):
            commands.append(span[m.end() :])
        elif span.startswith("--"):
            options.append(span)
        elif m := _MAKE.match(span):
            makes.append(m.group(1))
    for language, body in _FENCE.findall(section):
        if language in ("python", "json", "csv"):
            continue
        joined = body.replace("\\\n", " ")
        for line in joined.splitlines():
            stripped = line.strip()
            if m := _INSIDE.search(line):
                commands.append(line[m.end() :])
            elif stripped.startswith("--") and commands:
                commands[-1] += " " + stripped
            elif m := _MAKE.match(stripped):
                makes.append(m.group(1))
    return commands, options, makes


def _words(text: str) -> list[str]:
    try:
        return shlex.split(text, comments=True)
    except ValueError:  # an unbalanced quote in a placeholder
        return text.split()


def _resolve(words: list[str]) -> tuple[tuple[str, ...] | None, list[str], str]:
    """The command path the words name, the words after it, and what is wrong ('' if nothing)."""
    path: tuple[str, ...] = ()
    rest = list(words)
    while rest and CLI.get(path, set()) is None:  # a group: the next word names a sub-command
        names = [n for n in rest[0].split("|") if n]
        if (
            rest[0].startswith("-")
            or not names
            or not all(re.fullmatch(r"[a-z][\w-]*", n) for n in names)
        ):
            return path, rest, ""  # a group named alone, or with a placeholder
        missing = [n for n in names if (*path, n) not in CLI]
        if missing:
            return None, rest, f"no command {' '.join((*path, missing[0]))!r}"
        path = (*path, names[-1])
        rest = rest[1:]
    return path, rest, ""


def _problems() -> list[str]:
    found: list[str] = []
    targets = set(re.findall(r"^([a-z][\w-]*):", (ROOT / "Makefile").read_text(), re.M))
    for page in PAGES:
        name = page.relative_to(ROOT)
        for section in _sections(page.read_text(encoding="utf-8")):
            commands, options, makes = _mentions(section)
            named: list[tuple[str, ...]] = []
            for line in commands:
                path, rest, wrong = _resolve(_words(line))
                if wrong:
                    found.append(f"{name}: `ragbench {line}`: {wrong}")
                    continue
                named.append(path)
                kind = path == ("list",) and rest and re.fullmatch(r"[a-z][\w-]*", rest[0])
                if kind and rest[0] not in KINDS:
                    found.append(f"{name}: `ragbench list {rest[0]}`: no such kind")
                takes = CLI[path] or {"--help"}
                for word in rest:
                    option = word.split("=", 1)[0]
                    if option.startswith("-") and option != "-" and option not in takes:
                        found.append(f"{name}: `ragbench {' '.join(path)}` has no {option}")
            near = set().union(*(CLI[p] or set() for p in named)) if named else ALL_OPTIONS
            for span in options:
                option = span.split()[0].split("=", 1)[0]
                if option in FOREIGN_OPTIONS or option in near:
                    continue
                where = " or ".join(sorted({"ragbench " + " ".join(p) for p in named})) or "any"
                found.append(f"{name}: {option} (`{span}`) is an option of no command ({where})")
            found += [f"{name}: `make {t}`: no such target" for t in makes if t not in targets]
    return found


def test_every_command_and_option_the_docs_name_exists():
    assert _problems() == []


def test_the_check_sees_a_wrong_command_and_option():
    assert _resolve(["data", "docz", "x"])[2] == "no command 'data docz'"
    assert _resolve(["data", "niah|ruler", "--out", "x"])[0] == ("data", "ruler")
    section = "## X\n\n`ragbench run CONFIG --max-dolars 5` and `--until-decided`, `--yess`\n"
    commands, options, _ = _mentions(section)
    assert commands == ["run CONFIG --max-dolars 5"] and options == ["--until-decided", "--yess"]
    assert _mentions("`data docz PATH`, `data: x`")[0] == ["data docz PATH"]
    path, rest, _ = _resolve(_words(commands[0]))
    assert path == ("run",) and "--max-dolars" not in CLI[path] and "--until-decided" in CLI[path]
    block = (
        "```yaml\n- run: >\n    .venv/bin/ragbench check runs/x\n    --require 'a: b >= 1'\n```\n"
    )
    assert _mentions(block)[0] == ["check runs/x --require 'a: b >= 1'"]
    assert _resolve(_words(_mentions(block)[0][0]))[1][-2:] == ["--require", "a: b >= 1"]


def test_the_readme_fits_and_links_every_page():
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 250
    links = set(re.findall(r"\]\((docs/[\w-]+\.md)\)", text))
    assert links == {f"docs/{p.name}" for p in DOCS.glob("*.md") if p.name != "index.md"}
    assert "make demo" in text and "make test" in text  # the two commands


def test_the_readme_tables_are_complete():
    text = README.read_text(encoding="utf-8")
    notebooks = re.findall(r"^\| `(\d\d_\w+)` \|", text, re.M)
    assert notebooks == sorted(p.stem for p in (ROOT / "notebooks").glob("*.ipynb"))
    table = text.split("| command | what it does |", 1)[1].split("\n\n", 1)[0]
    leaves = [" ".join(p) for p, opts in CLI.items() if opts is not None]
    assert [c for c in leaves if not re.search(rf"(?<![\w-]){re.escape(c)}(?![\w-])", table)] == []
    phony = re.search(r"^\.PHONY:(.*)$", (ROOT / "Makefile").read_text(), re.M).group(1).split()
    assert [t for t in phony if f"make {t}" not in text] == []


def test_the_site_builds_strict_offline(tmp_path):
    """``make docs`` as CI runs it (into a temporary folder): a broken link or anchor, a page left
    out of the nav, a docstring the API reference cannot read or a README section a page includes
    gone missing is a warning, and --strict fails on it."""
    pytest.importorskip("mkdocs", reason="the dev extra installs mkdocs: make setup")
    config = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    assert re.search(r"^  font: false$", config, re.M)  # no Google Fonts fetched by the pages
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    site = tmp_path / "site"
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    pages = {p.parent.name for p in site.glob("*/index.html")}
    assert pages >= {p.stem for p in DOCS.glob("*.md") if p.name != "index.md"}
    home = (site / "index.html").read_text(encoding="utf-8")
    assert "--8&lt;--" not in home and "make demo" in home  # the README's sections included
    assert "fonts.googleapis.com" not in home
