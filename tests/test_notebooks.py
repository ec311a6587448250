"""Every notebook is a thin, typed, documented driver and executes through papermill.

The executions use tiny parameters and the no-weights backends (FakeLLM, HashEmbedder), so they
check the notebooks' wiring and plots quickly; the real models are exercised by `make demo` and
the `slow` tests.
"""

from __future__ import annotations

import base64
import re
from pathlib import Path

import nbformat
import papermill as pm
import pytest
from browser import screenshot_html, table_layouts
from test_docs import build_folder

from ragbench.workspace.kernels import execute_notebook
from ragbench.workspace.render import render_notebook

NOTEBOOKS = Path(__file__).parents[1] / "notebooks"
FIXTURES = Path(__file__).parent / "fixtures"
FAKE = {"backend": "fake", "model": "fake", "embedder": "hash"}
TINY = {
    "00_quickstart": {**FAKE, "context_lengths": [500, 1000], "depth_percents": [10, 90]},
    "01_niah_heatmap": {**FAKE, "context_lengths": [500, 1000], "n_depths": 2},
    "02_rag_vs_long_context": {
        **FAKE,
        "n_documents": 4,
        "gold_positions": [0, 3],
        "n_examples": 2,
        "top_ks": [1, 2],
        "matched_budget": 200,
        "task_length": 600,
    },
    "03_retrieval_tuning": {
        **FAKE,
        "context_length": 800,
        "depth_percents": [50],
        "chunk_sizes": [64],
        "top_ks": [1, 2],
        "retrievers": ["dense", "bm25"],
    },
    "04_cost_planning": {
        "context_lengths": [1024, 8192],
        "models": ["smollm2-135m-instruct", "qwen2.5-7b-instruct"],  # not alphabetical
        "document_tokens": 20000,
        "question_tokens": 5000,  # not the default: every table must price it
    },
    # `docs` is a folder the `executed` fixture writes (PDF, HTML, Markdown, DOCX, text, a broken
    # DOCX); the fake reader answers "What is the X?" from "the X is Y", so strategies differ
    "06_long_context_techniques": {
        **FAKE,
        "context_lengths": [500],
        "depth_percents": [50],
        "ruler_examples": 1,
        "kv_variants": [
            {"name": "quantized", "bits": 4},
            {"name": "sinks"},
            {"name": "snapkv"},
        ],
        "top_k": 1,
        "rope_lengths": [600],  # the fake has no positions: the unscaled heatmap only
    },
    "07_ruler": {
        **FAKE,
        "context_lengths": [600],
        "num_examples": 1,
        "presets": ["niah_single_1", "niah_multikey_2", "vt", "fwe"],
    },
    "08_explore_runs": {"runs": []},  # makes two fake-backend runs itself
    "05_your_documents": {
        **FAKE,
        "docs": "",
        "questions": str(FIXTURES / "your_documents_questions.csv"),
        "chunk_size": 32,
        "top_k": 1,
    },
}
PARAM_LINE = re.compile(r"^(\w+): (int|float|str|bool|list|dict) = .+  # \S.*$")


def test_every_notebook_is_covered():
    assert sorted(p.stem for p in NOTEBOOKS.glob("*.ipynb")) == sorted(TINY)


@pytest.mark.parametrize("name", sorted(TINY))
def test_parameters_cell_is_the_typed_documented_interface(name):
    nb = nbformat.read(NOTEBOOKS / f"{name}.ipynb", as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert "parameters" in code[0].metadata.get("tags", [])
    lines = [line for line in code[0].source.splitlines() if line.strip()]
    bad = [line for line in lines if not PARAM_LINE.match(line)]
    assert not bad, f"parameter lines must read `name: type = default  # help`: {bad}"
    declared = pm.inspect_notebook(str(NOTEBOOKS / f"{name}.ipynb"))
    assert len(declared) == len(lines), "papermill could not parse every parameter line"
    assert set(TINY[name]) <= set(declared)
    for cell in code[1:]:  # thin: logic lives in ragbench/, not in notebook functions
        assert not re.search(r"^\s*(def|class) ", cell.source, re.M), cell.source[:80]
    assert all(not c.get("outputs") for c in code), "commit notebooks without outputs"


FIGURE_CHECK = "figures checked:"


def _with_figure_check(notebook: Path, folder: Path) -> Path:
    """A copy of ``notebook`` that keeps its figures open and, in a last cell, runs
    ``readable.figure_problems`` over every one of them (overlapping tick labels, a legend on
    data), on the data the notebook itself plotted."""
    nb = nbformat.read(notebook, as_version=4)
    keep = nbformat.v4.new_code_cell("%config InlineBackend.close_figures = False")
    check = nbformat.v4.new_code_cell(
        "import matplotlib.pyplot as plt\n"
        "from ragbench.report.readable import figure_problems\n"
        "problems = [p for n in plt.get_fignums() for p in figure_problems(plt.figure(n))]\n"
        f"print('{FIGURE_CHECK}', len(plt.get_fignums()), 'problems:', problems)"
    )
    nb.cells = [keep, *nb.cells, check]
    copy = folder / "with-check" / notebook.name
    copy.parent.mkdir(exist_ok=True)
    nbformat.write(nb, copy)
    return copy


class _Executed(dict):
    """name -> executed notebook, run the first time a test asks for it (selecting one
    notebook's tests with -k executes that notebook only)."""

    def __init__(self, folder: Path) -> None:
        super().__init__()
        self.folder = folder

    def __missing__(self, name: str) -> Path:
        target = self.folder / f"{name}.ipynb"
        params = dict(TINY[name])
        if "backend" in params or "runs" in params:
            params["output_dir"] = str(self.folder / "runs")
        if name == "05_your_documents":
            params["docs"] = str(build_folder(self.folder / "docs"))
        execute_notebook(
            _with_figure_check(NOTEBOOKS / f"{name}.ipynb", self.folder),
            target,
            parameters=params,
            cwd=str(NOTEBOOKS.parent),
            progress_bar=False,
            kernel_name="ragbench",
        )
        self[name] = target
        return target


@pytest.fixture(scope="module")
def executed(tmp_path_factory):
    return _Executed(tmp_path_factory.mktemp("notebooks"))


class _Rendered(dict):
    """name -> the executed notebook rendered without code (``ragbench render --no-code``), once
    for every test that reads that page."""

    def __init__(self, executed: _Executed, folder: Path) -> None:
        super().__init__()
        self.executed, self.folder = executed, folder

    def __missing__(self, name: str) -> Path:
        html = render_notebook(
            self.executed[name], self.folder / f"{name}.html", include_code=False
        )
        self[name] = html
        return html


@pytest.fixture(scope="module")
def rendered(executed, tmp_path_factory):
    return _Rendered(executed, tmp_path_factory.mktemp("rendered"))


def _images(path: Path) -> list[bytes]:
    nb = nbformat.read(path, as_version=4)
    return [
        base64.b64decode(o["data"]["image/png"])
        for c in nb.cells
        if c.cell_type == "code"
        for o in c.get("outputs", [])
        if "image/png" in o.get("data", {})
    ]


@pytest.mark.slow  # papermill executes every notebook (about a minute on 2 cores)
@pytest.mark.parametrize("name", sorted(TINY))
def test_notebook_executes_and_draws(executed, name):
    images = _images(executed[name])
    assert images and all(img.startswith(b"\x89PNG") for img in images)
    text = executed[name].read_text(encoding="utf-8")
    assert '"output_type": "error"' not in text
    [check] = [line for line in _text_outputs(executed[name]).splitlines() if FIGURE_CHECK in line]
    assert check == f"{FIGURE_CHECK} {len(images)} problems: []", check  # every figure readable


@pytest.mark.slow
def test_quickstart_reports_accuracy_cost_and_provenance(executed):
    nb = nbformat.read(executed["00_quickstart"], as_version=4)
    text = "\n".join(  # tables are shown formatted: HTML (a pandas Styler)
        o.get("data", {}).get("text/plain", "") + o.get("data", {}).get("text/html", "")
        for c in nb.cells
        for o in c.get("outputs", [])
    )
    for needle in ("long_context", "rag k=3", "string_match_all", "$ / 1k queries", "config hash"):
        assert needle in text
    assert "e-0" not in text.split("config hash")[0]  # no dollars in scientific notation


@pytest.mark.slow
def test_quickstart_names_the_interval_its_table_shows(executed):
    nb = nbformat.read(executed["00_quickstart"], as_version=4)
    i = next(i for i, c in enumerate(nb.cells) if c.source.startswith("table = report.summary("))
    above, [shown] = nb.cells[i - 1].source, _html_tables_of(nb.cells[i : i + 1])
    methods = set(re.findall(r">(wilson|bootstrap)</td>", shown))
    assert methods == {"wilson"}  # string_match_all is 0/1
    assert "Wilson" in above and "ci_method" in above, above


def _html_tables_of(cells: list) -> list[str]:
    return [
        o["data"]["text/html"]
        for c in cells
        if c.cell_type == "code"
        for o in c.get("outputs", [])
        if "text/html" in o.get("data", {})
    ]


def _html_tables(path: Path) -> list[str]:
    return _html_tables_of(nbformat.read(path, as_version=4).cells)


@pytest.mark.slow
def test_cost_planning_prices_every_table_at_the_parameters_prompt_sizes(executed):
    from ragbench.cost.planning import api_dollars_per_1k

    params = TINY["04_cost_planning"]
    kv, capacity, per_1k, caching, break_even = _html_tables(executed["04_cost_planning"])
    for table in (kv, capacity):  # models in the order the parameter gives them
        first, second = (table.index(m) for m in params["models"])
        assert first < second
    prompt = params["document_tokens"] + params["question_tokens"]
    right = api_dollars_per_1k("example-hosted-api", prompt, 32)  # long context, no cache
    for table in (per_1k, caching, break_even):
        shown = [float(x.replace(",", "")) for x in re.findall(r"\$([\d,]+\.\d+)", table)]
        assert any(x == pytest.approx(right, rel=1e-3) for x in shown), (right, shown)
        if table is not break_even:  # one sheet: long context without a cache is the dearest
            assert max(shown) == pytest.approx(right, rel=1e-3), (right, shown)


def _text_outputs(path: Path) -> str:
    nb = nbformat.read(path, as_version=4)
    return "\n".join(
        o.get("text", "")
        + o.get("data", {}).get("text/plain", "")
        + o.get("data", {}).get("text/html", "")
        for c in nb.cells
        for o in c.get("outputs", [])
    )


@pytest.mark.slow
def test_rag_vs_long_context_runs_self_route_at_every_top_k(executed):
    import pandas as pd

    runs = executed["02_rag_vs_long_context"].parent / "runs"  # executed first
    # the main run's folder, not rag-vs-lc-matched-*
    [results] = runs.glob("rag-vs-lc-[0-9a-f]*/results.parquet")
    df = pd.read_parquet(results)
    ks = {s: sorted(df.loc[df["strategy"] == s, "top_k"].unique()) for s in ("rag", "self_route")}
    assert ks == {"rag": [1, 2], "self_route": [1, 2]}  # TINY's top_ks, not Self-Route's 5


@pytest.mark.slow
def test_your_documents_ingests_runs_every_strategy_and_compares(executed):
    import pandas as pd

    text = _text_outputs(executed["05_your_documents"])
    assert "5 documents from 7 files" in text  # one per readable file
    assert "skipped broken.docx: not a DOCX file" in text  # reported, never silent
    for needle in (
        "closed_book",
        "long_context truncate_middle",
        "rag k=1",
        "self_route",
        "contains",
        "dollars",
        "paired questions",
        "config hash",
    ):
        assert needle in text, needle
    [results] = (executed.folder / "runs").glob("your-documents*/results.parquet")
    df = pd.read_parquet(results)
    assert sorted(df["example_id"].unique()) == ["ferry", "island", "keeper", "master", "neap"]
    assert df["error"].isna().all()
    by = df.groupby("strategy")["contains"].mean()
    assert by["long_context"] > by["closed_book"] == 0.0  # the documents make the difference
    # one corpus prefix for every question: the fake backend, like a prefix-caching server,
    # reports it cached when an earlier request of the same round (8 records) computed it
    cached = df.loc[df["strategy"] == "long_context", "cached_prompt_tokens"]
    assert cached.max() > 0 and set(cached) == {0, cached.max()}


@pytest.mark.slow
def test_rendered_quickstart_shows_its_figures_in_chromium(executed, rendered, tmp_path):
    import shutil

    import numpy as np
    from PIL import Image

    html = rendered["00_quickstart"]
    page = html.read_text(encoding="utf-8")
    assert page.count('src="data:image/png;base64,') >= 2
    assert str(Path.home()) not in page
    assert "rec/s" in executed["00_quickstart"].read_text(encoding="utf-8")  # tqdm ran ...
    assert "rec/s" not in page  # ... but progress bars on stderr stay out of the shared page
    if shutil.which("chromium") is None:
        pytest.skip("Debian's chromium is not installed (.ci/run installs it)")
    shot = np.asarray(Image.open(screenshot_html(html, tmp_path / "q.png")).convert("RGB"))
    non_white = (shot.min(axis=2) < 240).mean()
    colours = len(np.unique(shot.reshape(-1, 3), axis=0))
    assert non_white > 0.01 and colours > 100, (non_white, colours)


# the comparison notebooks: each opens its results with the verdict
VERDICT_FIRST = [
    "00_quickstart",
    "02_rag_vs_long_context",
    "03_retrieval_tuning",
    "05_your_documents",
    "06_long_context_techniques",
]


@pytest.mark.slow
@pytest.mark.parametrize("name", VERDICT_FIRST)
def test_the_first_output_after_the_run_is_the_verdict(executed, name):
    nb = nbformat.read(executed[name], as_version=4)
    shown = [
        o.get("data", {})
        for c in nb.cells
        if c.cell_type == "code"
        for o in c.get("outputs", [])
        if o.get("output_type") != "stream"
    ]
    run = next(i for i, d in enumerate(shown) if "run folder:" in d.get("text/plain", ""))
    verdict = shown[run + 1]
    assert verdict.get("text/markdown", "").startswith("**Verdict:** "), verdict
    text = verdict["text/markdown"]
    assert any(w in text for w in ("Use ", "Not decided yet", "No variant meets")), text
    assert "Holds for" in text and "e-0" not in text  # conditions; dollars in fixed notation


@pytest.mark.slow
def test_rendered_quickstart_opens_with_the_verdict(rendered):
    html = rendered["00_quickstart"]
    page = html.read_text(encoding="utf-8")
    header = page.index("ragbench-provenance")
    verdict = page.index("Verdict:</strong>")
    first_table = page.index("<table", page.index("</section>", header))
    assert header < verdict < first_table < page.index('src="data:image/png;base64,')


@pytest.fixture(scope="module")
def layouts():
    """``browser.table_layouts``: one Chromium measures every page (None without chromium)."""
    import shutil

    chromium = shutil.which("chromium")
    if chromium is None:
        yield None
        return
    with table_layouts(chromium) as measure:
        yield measure


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(TINY))
def test_rendered_tables_fit_the_page_and_read_numbers_in_chromium(rendered, layouts, name):
    """Every table of the rendered page fits its output area in a 1,000 px wide window (none
    clipped or scrolled sideways, the page itself neither), and no cell reads inf, nan or
    <NA> where a number is expected (a break-even never reached reads "never")."""
    html = rendered[name]
    if layouts is None:
        pytest.skip("Debian's chromium is not installed (.ci/run installs it)")
    layout = layouts(html, (1000, 1600))
    assert layout["tables"], "no table on the page"
    clipped = [t for t in layout["tables"] if t["width"] > t["container"]]
    assert clipped == [], [(t["header"], t["width"], t["container"]) for t in clipped]
    assert layout["page"] <= layout["viewport"]
    bad = [(t["header"], t["bad_cells"]) for t in layout["tables"] if t["bad_cells"]]
    assert bad == []
