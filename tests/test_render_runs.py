"""The provenance header names the runs the notebook itself executed, never a neighbour's.

``ragbench.run`` inside a kernel records its run folder and manifest in the cell's outputs; render
reads them back, however many other runs share the notebook's ``output_dir``.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import nbformat
import pytest

from ragbench.workspace.render import RUN_MIME, executed_runs, provenance_header, render_notebook
from ragbench.workspace.scrub import repo_root

HEADER = re.compile(r"<section class=.ragbench-provenance.*?</section>", re.S)
DECOYS = {"decoy-aaaa1111": "cfg-decoy-one", "decoy-bbbb2222": "cfg-decoy-two"}
RUN_CELL = """\
df = ragbench.run({{
    "name": "{name}",
    "dataset": {{"name": "niah", "params": {{"context_lengths": [400], "depth_percents": [50],
                "tokenizer": "whitespace", "final_context_length_buffer": 50}}}},
    "model": {{"backend": "fake", "name": "fake", "preset": "smollm2-135m-instruct", "cache": False}},
    "retrieval": {{"embedder": "hash", "chunk_size": 64, "chunk_overlap": 8, "tokenizer": "whitespace"}},
    "strategies": {strategies},
    "metrics": ["string_match_all"],
    "output_dir": output_dir,
}}, progress=False)
"""


def _notebook(runs: dict[str, list]) -> nbformat.NotebookNode:
    params = nbformat.v4.new_code_cell('output_dir: str = ""  # run folders go here')
    params.metadata["tags"] = ["parameters"]
    cells = [params, nbformat.v4.new_code_cell("import ragbench")]
    for name, strategies in runs.items():
        cells.append(nbformat.v4.new_code_cell(RUN_CELL.format(name=name, strategies=strategies)))
    nb = nbformat.v4.new_notebook(cells=cells)
    nb.metadata["kernelspec"] = {
        "name": "python3",
        "display_name": "Python 3",
        "language": "python",
    }
    return nb


def _header(page: str) -> str:
    match = HEADER.search(page)
    assert match, "no provenance header"
    return match.group(0)


def _manifest(run_dir: Path) -> dict:
    return json.loads((run_dir / "manifest.json").read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def executed(tmp_path_factory):
    """A notebook making two runs, executed with papermill into an output_dir that already holds
    two other runs (earlier executions, other notebooks)."""
    import papermill

    folder = tmp_path_factory.mktemp("render-runs")
    results = folder / "results"
    for run, config_hash in DECOYS.items():
        (results / run).mkdir(parents=True)
        decoy = {"config_hash": config_hash, "model": {"model": "decoy-model"}}
        (results / run / "manifest.json").write_text(json.dumps(decoy), encoding="utf-8")
    source = folder / "two_runs.ipynb"
    nbformat.write(_notebook({"first": ["closed_book"], "second": ["long_context"]}), source)
    target = folder / "two_runs_run.ipynb"
    papermill.execute_notebook(
        str(source),
        str(target),
        parameters={"output_dir": str(results)},
        kernel_name="ragbench",
        progress_bar=False,
        cwd=str(repo_root() or folder),
    )
    runs = {p.parent.name: _manifest(p.parent) for p in results.glob("[fs]*/manifest.json")}
    return {"folder": folder, "results": results, "notebook": target, "runs": runs}


def test_the_output_dir_holds_more_runs_than_the_notebook_made(executed):
    # the situation the header must survive: four manifests, two of them this notebook's
    assert len(list(executed["results"].glob("*/manifest.json"))) == 4
    assert sorted(name.split("-")[0] for name in executed["runs"]) == ["first", "second"]


def test_the_notebook_records_its_runs_in_order(executed):
    nb = nbformat.read(executed["notebook"], as_version=4)
    runs = executed_runs(nb)
    assert [name.split("-")[0] for name, _ in runs] == ["first", "second"]
    for name, manifest in runs:
        assert manifest == executed["runs"][name]  # the manifest the runner wrote, verbatim
    text = "".join(o.get("data", {}).get("text/plain", "") for c in nb.cells for o in c.outputs)
    assert text.count("run folder: ") == 2  # what Jupyter and the HTML show of the record


def test_header_shows_the_executed_runs_and_not_the_others(executed):
    html = render_notebook(executed["notebook"], executed["folder"] / "two_runs.html")
    header = _header(html.read_text(encoding="utf-8"))
    first, second = sorted(executed["runs"])
    assert f"{first}, {second}" in header and ">runs<" in header
    for name, manifest in executed["runs"].items():
        assert f"{manifest['config_hash']} ({name})" in header  # differs: listed per run
    fingerprints = {m["dataset"]["fingerprint"] for m in executed["runs"].values()}
    assert len(fingerprints) == 1 and header.count(fingerprints.pop()) == 1  # shared: once
    assert "dataset fingerprint" in header and "run started" in header
    starts = sorted(m["started_at"] for m in executed["runs"].values())
    assert starts[0] in header and starts[1] not in header  # the earliest start
    for decoy in (*DECOYS, *DECOYS.values(), "decoy-model"):
        assert decoy not in header
    assert str(executed["folder"]) not in html.read_text(encoding="utf-8")  # scrubbed


def test_the_record_outlives_the_run_folder(executed, tmp_path):
    # the executed notebook carries its own provenance: moved elsewhere, its runs deleted
    moved = tmp_path / "moved.ipynb"
    shutil.copy(executed["notebook"], moved)
    backup = tmp_path / "results"
    shutil.move(executed["results"], backup)
    try:
        page = render_notebook(moved, tmp_path / "moved.html").read_text(encoding="utf-8")
    finally:
        shutil.move(backup, executed["results"])
    header = _header(page)
    for manifest in executed["runs"].values():
        assert manifest["config_hash"] in header


def _nb_with_records(*records: dict) -> nbformat.NotebookNode:
    outputs = [
        nbformat.v4.new_output("display_data", data={"text/plain": "run", RUN_MIME: r})
        for r in records
    ]
    cell = nbformat.v4.new_code_cell("df = ragbench.run(config)", outputs=outputs)
    return nbformat.v4.new_notebook(cells=[cell])


def test_executed_runs_once_per_folder_and_manifest_file_fallback(tmp_path):
    (tmp_path / "b-2").mkdir()
    (tmp_path / "b-2" / "manifest.json").write_text('{"config_hash": "from-file"}')
    nb = _nb_with_records(
        {"run_dir": str(tmp_path / "a-1"), "manifest": {"config_hash": "old"}},
        {"run_dir": str(tmp_path / "b-2")},  # no manifest in the record: read the folder's
        {"run_dir": str(tmp_path / "a-1"), "manifest": {"config_hash": "rerun"}},
        {"something": "else"},  # not a run record
    )
    assert executed_runs(nb) == [
        ("b-2", {"config_hash": "from-file"}),
        ("a-1", {"config_hash": "rerun"}),
    ]


def test_header_of_several_runs_common_and_per_run_fields():
    runs = [
        (
            "r1-aaaa",
            {
                "config_hash": "h1",
                "git_commit": "c0ffee",
                "started_at": "2025-01-02T00:00",
                "finished_at": "2025-01-02T01:00",
                "model": {"model": "m"},
            },
        ),
        (
            "r2-bbbb",
            {
                "config_hash": "h2",
                "git_commit": "c0ffee",
                "started_at": "2025-01-01T00:00",
                "finished_at": "2025-01-03T00:00",
                "model": {"model": "m"},
            },
        ),
    ]
    header = provenance_header("nb.ipynb", nbformat.v4.new_notebook(), runs)
    rows = dict(re.findall(r"<th[^>]*>([^<]+)</th><td><code>([^<]*)</code>", header))
    assert rows["runs"] == "r1-aaaa, r2-bbbb"
    assert rows["config hash"] == "h1 (r1-aaaa); h2 (r2-bbbb)"
    assert rows["git commit"] == "c0ffee" and rows["model"] == "m"
    assert rows["run started"] == "2025-01-01T00:00" and rows["run finished"] == "2025-01-03T00:00"
    one = provenance_header("nb.ipynb", nbformat.v4.new_notebook(), runs[:1])
    assert ">run<" in one and "r1-aaaa" in one and "h1 (" not in one
