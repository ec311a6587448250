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

from ragbench.render import render_notebook, screenshot_html

NOTEBOOKS = Path(__file__).parents[1] / "notebooks"
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
    },  # fmt: skip
    "03_retrieval_tuning": {
        **FAKE,
        "context_length": 800,
        "depth_percents": [50],
        "chunk_sizes": [64],
        "top_ks": [1, 2],
        "retrievers": ["dense", "bm25"],
    },  # fmt: skip
    "04_cost_planning": {"context_lengths": [1024, 8192]},
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


@pytest.fixture(scope="module")
def executed(tmp_path_factory):
    folder = tmp_path_factory.mktemp("notebooks")
    out = {}
    for name, params in TINY.items():
        target = folder / f"{name}.ipynb"
        params = {**params, "output_dir": str(folder / "runs")} if "backend" in params else params
        pm.execute_notebook(
            str(NOTEBOOKS / f"{name}.ipynb"), str(target), parameters=params,
            cwd=str(NOTEBOOKS.parent), progress_bar=False, kernel_name="python3",
        )  # fmt: skip
        out[name] = target
    return out


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


@pytest.mark.slow
def test_quickstart_reports_accuracy_cost_and_provenance(executed):
    nb = nbformat.read(executed["00_quickstart"], as_version=4)
    text = "\n".join(
        o.get("data", {}).get("text/plain", "") for c in nb.cells for o in c.get("outputs", [])
    )
    for needle in ("long_context", "rag k=3", "string_match_all", "dollars", "config hash"):
        assert needle in text


@pytest.mark.slow
def test_rendered_quickstart_shows_its_figures_in_chromium(executed, tmp_path):
    import shutil

    import numpy as np
    from PIL import Image

    html = render_notebook(
        executed["00_quickstart"], tmp_path / "quickstart.html", include_code=False
    )
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
