"""Every set of names users can type is one ``Registry``, and ``ragbench list`` lists them all."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from ragbench.cli import app
from ragbench.cli.listing import KINDS, entries, registry
from ragbench.models import PRESETS, get_preset
from ragbench.registry import Choice, Registry, UnknownNameError
from ragbench.retrieval.context import ORDERS
from ragbench.retrieval.embedders.precision import PRECISIONS, check_precision
from ragbench.strategies.prompts import OVERFLOW
from ragbench.tokenizers import check_tokenizer


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_ragbench_list_names_each_entry_of_every_registry_with_a_description(kind):
    result = CliRunner().invoke(app, ["list", kind])
    assert result.exit_code == 0, result.output
    rows = [line.split(None, 1) for line in result.output.splitlines()]
    reg = registry(kind)
    assert [name for name, *_ in rows][: len(reg)] == reg.names()
    assert len(reg) >= 1
    assert all(len(row) == 2 and row[1].strip() for row in rows), rows  # name + description


def test_an_unknown_kind_names_the_valid_kinds():
    result = CliRunner().invoke(app, ["list", "precision"])
    assert result.exit_code == 2
    assert "did you mean 'precisions'" in result.output
    assert all(kind in result.output for kind in KINDS)


def test_every_registry_in_the_package_is_listed():
    """Import every ragbench module, find every ``Registry`` object, and check that ``ragbench
    list`` has a kind for it: a new registry cannot be forgotten."""
    code = """
import importlib, json, pkgutil, ragbench
from ragbench.cli.listing import KINDS, registry
from ragbench.registry import Registry
listed = {id(registry(kind)) for kind in KINDS}
found = {}
for info in pkgutil.walk_packages(ragbench.__path__, "ragbench."):
    if info.name.endswith("__main__"):  # runs the command
        continue
    module = importlib.import_module(info.name)
    for attr, value in vars(module).items():
        if isinstance(value, Registry):
            found.setdefault(id(value), f"{info.name}:{attr}")
print(json.dumps({"found": len(found), "missing": sorted(n for i, n in found.items() if i not in listed)}))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report["missing"] == [], f"registries missing from cli/listing.py KINDS: {report}"
    assert report["found"] == len(KINDS)


def test_listing_reads_targets_without_importing_them():
    code = (
        "import sys; from ragbench.cli.listing import entries; entries('embedders');"
        "entries('splitters'); entries('backends'); entries('retrievers');"
        "heavy = ('torch', 'faiss', 'transformers', 'sentence_transformers', 'llama_index');"
        "print([m for m in heavy if m in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_registry_accessors_do_not_import():
    reg = Registry("thing", {"a": "no_such_module_xyz:Thing", "b": Choice("the b one")})
    assert reg.target("a") == "no_such_module_xyz:Thing"  # not imported
    assert reg.items() == [("a", "no_such_module_xyz:Thing"), ("b", Choice("the b one"))]
    assert reg["b"].description == "the b one"
    with pytest.raises(UnknownNameError, match=r"unknown thing 'c'; .*valid: a, b"):
        reg.target("c")


def test_name_sets_stay_usable_as_before():
    # `in` and iteration of names, as the tuples they replace
    assert "truncate_middle" in OVERFLOW and "spill" not in OVERFLOW
    assert set(ORDERS) == {"score", "document"}
    assert list(PRECISIONS) == ["bf16", "bf16-full", "fp32"]
    assert check_precision(None) == "fp32"
    with pytest.raises(UnknownNameError, match=r"unknown embedder precision 'fp16'.*bf16-full"):
        check_precision("fp16")
    # models: presets by name or [], open-ended beyond them (check), presets only (get_preset)
    assert PRESETS["smollm2-135m-instruct"].embedded
    assert PRESETS.check("Qwen/Qwen2.5-0.5B") == "Qwen/Qwen2.5-0.5B"
    with pytest.raises(UnknownNameError, match=r"did you mean 'smollm2-135m-instruct'\?"):
        get_preset("smolm2")
    with pytest.raises(UnknownNameError, match=r"did you mean 'whitespace'\?.*<folder or .gguf"):
        check_tokenizer("whitespac")
    assert dict(entries("models"))["<HF id, folder or .gguf>"] == "also accepted"


def test_each_importer_has_its_own_description_not_its_modules():
    rows = dict(entries("importers"))
    assert len(set(rows.values())) == len(rows), rows
    assert rows["longbench"].startswith("LongBench JSONL") and rows["ruler"].startswith("RULER")
