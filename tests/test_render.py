"""Rendered notebooks: standalone HTML with embedded figures, provenance, no secrets or paths."""

from __future__ import annotations

import base64
import io
import json
import os
import re
import shutil
import sys
from pathlib import Path

import pytest
from browser import screenshot_html, table_layout

from ragbench.secrets import env_secret_values
from ragbench.workspace.kernels import redact_notebook
from ragbench.workspace.render import render_notebook
from ragbench.workspace.scrub import repo_root, scrub

FIXTURE = Path(__file__).parent / "fixtures" / "notebooks" / "figure.ipynb"
FAKE_KEY = "fake-openai-key-0123456789abcdef"  # no known key shape: only the env scan catches it
FAKE_TOKEN = "hf-token-for-tests-7777"
CHROMIUM = Path("/usr/bin/chromium")
IMG = re.compile(r'<img [^>]*src="data:image/png;base64,([A-Za-z0-9+/=\s]+)"')
MANIFEST = {  # the shape ragbench.experiment.runner writes
    "config_hash": "cfg-1a2b3c",
    "dataset": {"name": "niah", "fingerprint": "fp-9f8e7d", "n": 4},
    "model": {"backend": "HFLLM", "model": "smollm2-135m-instruct"},
    "git_commit": "abc1234",
    "started_at": "2025-01-01T00:00:00+00:00",
}


@pytest.fixture(scope="module")
def rendered(tmp_path_factory):
    """Execute the figure notebook once (with secrets in the environment) and render both ways."""
    import papermill

    folder = tmp_path_factory.mktemp("render")
    executed = folder / "figure_run.ipynb"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("OPENAI_API_KEY", FAKE_KEY)
        mp.setenv("HF_TOKEN", FAKE_TOKEN)
        papermill.execute_notebook(
            str(FIXTURE),
            str(executed),
            parameters={"n_points": 8, "output_dir": str(folder / "results")},
            kernel_name="ragbench",
            progress_bar=False,
            cwd=str(repo_root() or folder),
        )
        with_code = render_notebook(executed, folder / "with_code.html", manifest=MANIFEST)
        no_code = render_notebook(executed, folder / "no_code.html", include_code=False)
    return {
        "folder": folder,
        "executed": executed,
        "with_code": with_code.read_text(encoding="utf-8"),
        "no_code": no_code.read_text(encoding="utf-8"),
        "no_code_path": no_code,
    }


def test_the_executed_notebook_really_printed_the_secret(rendered):
    # guards the scrub tests below: the raw notebook does leak, the HTML must not
    raw = rendered["executed"].read_text(encoding="utf-8")
    assert FAKE_KEY in raw and str(rendered["folder"]) in raw


def test_figures_are_embedded_png_and_no_external_script(rendered):
    from PIL import Image

    for variant in ("with_code", "no_code"):
        page = rendered[variant]
        images = IMG.findall(page)
        assert len(images) == 1, variant
        png = Image.open(io.BytesIO(base64.b64decode(re.sub(r"\s", "", images[0]))))
        assert png.format == "PNG" and png.width > 300 and png.height > 200
        assert not re.search(r"<script[^>]+src=", page), "external script in a standalone report"
        stylesheets = [t for t in re.findall(r"<link[^>]*>", page) if "stylesheet" in t]
        assert not stylesheets, f"external stylesheet in a standalone report: {stylesheets}"


def test_code_variants(rendered):
    # pygments wraps each token in a span: look for single tokens
    assert "subplots" in rendered["with_code"] and "set_xlabel" in rendered["with_code"]
    assert "subplots" not in rendered["no_code"] and "set_xlabel" not in rendered["no_code"]


def test_provenance_header(rendered):
    header = re.search(r"<section class=.ragbench-provenance.*?</section>", rendered["with_code"])
    assert header, "no provenance header"
    text = header.group(0)
    for expected in ("figure_run.ipynb", "n_points=8", "cfg-1a2b3c", "fp-9f8e7d", "smollm2-135m"):
        assert expected in text
    assert "abc1234" in text and "duration" in text
    assert "cfg-1a2b3c" not in rendered["no_code"]  # rendered without a manifest


@pytest.mark.parametrize("variant", ["with_code", "no_code"])
def test_no_secret_and_no_machine_path_in_html(rendered, variant):
    page = rendered[variant]
    assert FAKE_KEY not in page and FAKE_TOKEN not in page
    assert "key in use: ***" in page
    forbidden = [str(rendered["folder"]), sys.prefix, os.path.expanduser("~")]
    if repo_root():
        forbidden.append(str(repo_root()))
    for path in forbidden:
        assert path not in page, f"absolute path {path} leaked"
    assert "interpreter: $VENV/bin/python" in page


def test_scrub_is_precise():
    env = {"MY_API_KEY": "abcdefgh12345", "SHORT_TOKEN": "abc", "PATH": "/usr/bin:/bin"}
    assert env_secret_values(env) == ["abcdefgh12345"]
    png = "data:image/png;base64,QUJDREVGR0gxMjM0NQ==/" + os.path.expanduser("~") + "+"
    text = f"k=abcdefgh12345 short=abc {png} sk-{'x' * 24} /usr/bin"
    out = scrub(text, environ=env)
    assert "abcdefgh12345" not in out and "short=abc" in out and "/usr/bin" in out
    assert png in out  # base64 image data is never edited
    assert f"sk-{'x' * 24}" not in out
    home = os.path.expanduser("~")
    if home not in ("/", ""):
        assert scrub(f"{home}/x {home}line", environ={}) == f"~/x {home}line"


def test_scrub_masks_credentials_in_links_and_leaves_other_links_as_written():
    link = '<a href="https://example.com/search?q=rag+vs+lc&amp;page=2">paper</a>'
    assert scrub(link, environ={}) == link  # an escaped & must survive (no "&amp%3B")
    page = (
        '<a href="http://alice:pw-4242@llm.internal/v1?model=m&amp;api_key=k-777">x</a> '
        "api_key = 'k-888-plain' <code>Authorization: Bearer tok-123456</code>"
    )
    out = scrub(page, environ={"MY_TOKEN": "abcdefgh12345"})
    for secret in ("pw-4242", "k-777", "k-888-plain", "tok-123456"):
        assert secret not in out
    assert '"http://***@llm.internal/v1?model=m&amp;api_key=***"' in out
    assert scrub("see https://h/p/abcdefgh12345?x=1", environ={"MY_TOKEN": "abcdefgh12345"}) == (
        "see https://h/p/***?x=1"
    )  # a credential's value is masked inside a link it does not make a credential link


@pytest.mark.skipif(not CHROMIUM.exists(), reason="needs Debian's chromium at /usr/bin/chromium")
def test_headless_chromium_shows_the_figure(rendered, tmp_path):
    import numpy as np
    from PIL import Image

    def screenshot(html: Path) -> np.ndarray:
        png = screenshot_html(html, tmp_path / f"{html.stem}.png", chromium=str(CHROMIUM))
        return np.asarray(Image.open(png).convert("RGB")).astype(int)

    def line_pixels(shot: np.ndarray, rgb: tuple[int, int, int]) -> int:
        return int((np.abs(shot - np.array(rgb)).max(axis=2) < 40).sum())

    shot = screenshot(rendered["no_code_path"])
    non_white = (shot.min(axis=2) < 240).mean()
    colours = len(np.unique(shot.reshape(-1, 3), axis=0))
    assert non_white > 0.005 and colours > 100, (non_white, colours)
    # the two curves in matplotlib's tab:blue and tab:orange are on screen ...
    blue, orange = (31, 119, 180), (255, 127, 14)
    assert line_pixels(shot, blue) > 300 and line_pixels(shot, orange) > 300
    # ... and come from the embedded image: the same page without it has none of them
    bare = rendered["folder"] / "bare.html"
    bare.write_text(IMG.sub("<img ", rendered["no_code"]), encoding="utf-8")
    bare_shot = screenshot(bare)
    assert line_pixels(bare_shot, blue) < 50 and line_pixels(bare_shot, orange) < 50


# --- credentials a notebook printed or raised with ------------------------------------------------

SHORT_KEY = "sk-plant3d-k"  # too short for a known key shape, in no environment variable
URL_PASSWORD = "pw-4u7h-99"
SCRIPT = (  # an interactive view: operators HTML would escape, a link with & in its query
    "<script>const rows = [1, 2]; if (rows.length > 1 && rows[0] < 2) "
    "{ document.title = 'n=' + rows.length; }\n"
    "fetch('http://u:" + URL_PASSWORD + "@llm.internal/v1?a=1&b=2');</script>"
)


def printed_secrets_notebook(path: Path) -> Path:
    """A notebook whose cell holds a short key and a URL with a password, then prints both,
    shows them in HTML (a <script> too) and Markdown, and raises with them (IPython colours a
    traceback's source line, which splits ``api_key="..."`` with ANSI codes)."""
    import nbformat
    from nbformat import v4

    url = f"http://bob:{URL_PASSWORD}@llm.internal/v1"
    source = f'api_key = "{SHORT_KEY}"\nbase_url = "{url}"\nprint(api_key, base_url)'
    cell = v4.new_code_cell(source, execution_count=1)
    ansi_line = (  # as IPython writes it
        f"\x1b[0;32m----> 1\x1b[0m client \x1b[38;5;241m=\x1b[39m OpenAI(api_key\x1b[38;5;241m="
        f'\x1b[39m\x1b[38;5;124m"{SHORT_KEY}\x1b[39m\x1b[38;5;124m"\x1b[39m)'
    )
    cell.outputs = [
        v4.new_output(
            "stream", name="stdout", text=f"{SHORT_KEY} {url}\npassword {URL_PASSWORD}\n"
        ),
        v4.new_output(
            "display_data",
            data={
                "text/plain": f"Client(key={SHORT_KEY!r})",
                "text/html": f"<b>{SHORT_KEY}</b> <a href='{url}'>server</a>{SCRIPT}",
                "text/markdown": f"**key** `{SHORT_KEY}` at {url}",
            },
        ),
        v4.new_output(
            "error",
            ename="AuthenticationError",
            evalue=f"key {SHORT_KEY} refused by {url}",
            traceback=[ansi_line, f"AuthenticationError: key {SHORT_KEY} refused"],
        ),
    ]
    nbformat.write(v4.new_notebook(cells=[cell]), str(path))
    return path


@pytest.mark.parametrize("include_code", [True, False])
def test_credentials_printed_or_raised_are_masked_in_every_output(tmp_path, include_code):
    """A key the code cell masked was shown as is in the outputs: stream, display data
    (text/plain, text/html, text/markdown) and the error's name, value and traceback."""
    notebook = printed_secrets_notebook(tmp_path / "printed.ipynb")
    raw = notebook.read_text(encoding="utf-8")
    assert raw.count(SHORT_KEY) >= 8 and URL_PASSWORD in raw  # the outputs do hold them
    page = render_notebook(notebook, tmp_path / "p.html", include_code=include_code)
    text = page.read_text(encoding="utf-8")
    assert SHORT_KEY not in text and URL_PASSWORD not in text
    assert "plant3d" not in text and "4u7h" not in text  # no part of them either
    assert "AuthenticationError" in text and "http://***@llm.internal/v1" in text
    # the executed .ipynb papermill saves goes through the same redaction: every output field
    redacted = json.dumps(redact_notebook(json.loads(raw)))
    assert SHORT_KEY not in redacted and URL_PASSWORD not in redacted
    assert redacted.count("***") >= 12  # masked where they were, nothing dropped


def test_a_script_in_an_html_output_still_works_once_masked(tmp_path):
    """Scrubbing masks text inside a <script> but never HTML-escapes it: ``&&``, ``<`` and a
    link's ``&`` stay as written (``&amp;`` inside a script is a syntax error or a wrong URL)."""
    notebook = printed_secrets_notebook(tmp_path / "printed.ipynb")
    text = render_notebook(notebook, tmp_path / "p.html").read_text(encoding="utf-8")
    masked = SCRIPT.replace(f"u:{URL_PASSWORD}@", "***@")
    assert masked in text, re.findall(r"<script>const rows.*?</script>", text, re.S)


def test_render_cli_default_path(rendered, tmp_path, monkeypatch):
    import typer
    from typer.testing import CliRunner

    from ragbench.cli.sweep import register

    app = typer.Typer()
    register(app)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "out").mkdir()
    shutil.copy(rendered["executed"], tmp_path / "out" / "run.ipynb")
    result = CliRunner().invoke(app, ["render", "out/run.ipynb", "--no-code"])
    assert result.exit_code == 0, result.output
    # beside the notebook, not under the directory the command ran in
    assert not (tmp_path / "reports").exists()
    page = (tmp_path / "out" / "run-nocode.html").read_text(encoding="utf-8")
    assert len(IMG.findall(page)) == 1 and "subplots" not in page


def test_manifest_found_under_the_output_dir_parameter(rendered):
    # ragbench.experiment.runner writes <output_dir>/<name>-<hash>/manifest.json; output_dir is a parameter
    run_dir = rendered["folder"] / "results" / "quick-12345678"
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "manifest.json").write_text(json.dumps(MANIFEST), encoding="utf-8")
    try:
        html = render_notebook(rendered["executed"], rendered["folder"] / "auto.html")
        page = html.read_text(encoding="utf-8")
        assert "cfg-1a2b3c" in page and "fp-9f8e7d" in page and "run started" in page
    finally:
        (run_dir / "manifest.json").unlink()


# --- what `ragbench render` refuses ---------------------------------------------------------------


def _render_cli(*args: str):
    import typer
    from typer.testing import CliRunner

    from ragbench.cli.sweep import register

    app = typer.Typer()
    register(app)
    return CliRunner().invoke(app, ["render", *args])


@pytest.mark.parametrize(
    "name, content, reason",
    [
        ("missing.ipynb", None, "no such file"),
        (
            "notes.txt",
            "plain text",
            "not a Jupyter notebook (invalid JSON: Expecting value at line 1 column 1)",
        ),
        (
            "cut.ipynb",
            '{"cells": [], "nbformat": 4',
            "not a Jupyter notebook (invalid JSON: Expecting ',' delimiter at line 1 column 28)",
        ),
        (
            "data.json",
            '{"rows": [1, 2]}',
            "not a Jupyter notebook (JSON without 'cells' and 'nbformat')",
        ),
        ("list.json", "[1, 2]", "not a Jupyter notebook (JSON without 'cells' and 'nbformat')"),
        (
            "old.ipynb",
            '{"cells": [], "nbformat": 9}',
            "not a readable Jupyter notebook (Unsupported nbformat version 9)",
        ),
        ("folder.ipynb", "<dir>", "is a directory, not a notebook"),
        ("binary.ipynb", b"\x89PNG\xff\xfe", "not a Jupyter notebook (not UTF-8 text)"),
    ],
)
def test_render_cli_refuses_a_file_that_is_not_a_notebook(
    tmp_path, monkeypatch, name, content, reason
):
    monkeypatch.chdir(tmp_path)
    path = tmp_path / name
    if content == "<dir>":
        path.mkdir()
    elif isinstance(content, bytes):
        path.write_bytes(content)
    elif content is not None:
        path.write_text(content, encoding="utf-8")
    result = _render_cli(str(path))
    assert result.exit_code == 2, result.output
    assert isinstance(result.exception, SystemExit)  # no traceback: a clean exit
    assert result.stderr == f"error: {path}: {reason}\n"
    assert result.stdout == "" and not (tmp_path / "reports").exists()


@pytest.fixture
def unexecuted(tmp_path):
    nb = nbformat_v4().new_notebook(
        cells=[nbformat_v4().new_markdown_cell("# Title"), nbformat_v4().new_code_cell("x = 1\nx")]
    )
    path = tmp_path / "fresh.ipynb"
    path.write_text(json.dumps(nb), encoding="utf-8")
    return path


def nbformat_v4():
    import nbformat

    return nbformat.v4


def test_render_cli_refuses_an_unexecuted_notebook_unless_allowed(unexecuted, tmp_path):
    out = tmp_path / "fresh.html"
    result = _render_cli(str(unexecuted), "--out", str(out))
    assert result.exit_code == 2 and isinstance(result.exception, SystemExit)
    (line,) = result.stderr.splitlines()
    assert line.startswith(f"error: {unexecuted}: not executed (no code cell has run")
    assert "execute it first" in line and "--allow-unexecuted" in line
    assert not out.exists()

    result = _render_cli(str(unexecuted), "--out", str(out), "--allow-unexecuted")
    assert result.exit_code == 0, result.output
    page = out.read_text(encoding="utf-8")
    banner = re.search(r"<section class=.ragbench-unexecuted.*?</section>", page, re.S)
    assert banner and "Not executed" in banner.group(0)
    assert banner.start() < page.index(
        '<div class="jp-Cell'
    )  # above the notebook, where it is seen first


def test_executed_notebooks_get_no_banner(rendered):
    assert "ragbench-unexecuted" not in rendered["with_code"]
    assert "ragbench-unexecuted" not in rendered["no_code"]


def test_render_cli_bad_manifest_is_one_line(rendered, tmp_path):
    bad = tmp_path / "manifest.json"
    bad.write_text("{not json", encoding="utf-8")
    for manifest, reason in (
        (tmp_path / "none.json", "no such manifest file"),
        (bad, "not a readable manifest"),
    ):
        result = _render_cli(
            str(rendered["executed"]),
            "--out",
            str(tmp_path / "x.html"),
            "--manifest",
            str(manifest),
        )
        assert result.exit_code == 2 and isinstance(result.exception, SystemExit)
        (line,) = result.stderr.splitlines()
        assert line.startswith(f"error: {manifest}: {reason}")


@pytest.mark.skipif(not CHROMIUM.exists(), reason="needs Debian's chromium at /usr/bin/chromium")
def test_the_layout_check_sees_a_clipped_table_and_an_inf_cell(tmp_path):
    import pandas as pd

    from ragbench import report

    wide = pd.DataFrame({f"a_rather_long_column_name_{i}": [1.5e-3 * i] for i in range(30)})
    wide["break_even_questions_per_document"] = float("inf")
    page = tmp_path / "page.html"
    page.write_text(  # a notebook's output area: a block as wide as the page, tables inside
        "<html><body><div class='out'>" + wide.to_html() + "</div>"
        "<div class='out'>" + report.formatted(wide).to_html() + "</div></body></html>",
        encoding="utf-8",
    )
    layout = table_layout(page, chromium=str(CHROMIUM), window=(1000, 800))
    raw, *formatted = layout["tables"]
    assert raw["width"] > raw["container"] and raw["bad_cells"] == ["inf"]  # pandas as is
    assert formatted and all(t["width"] <= t["container"] for t in formatted)  # split to fit
    assert all(t["bad_cells"] == [] for t in formatted)  # "never", not inf


def test_render_cli_writes_into_an_existing_folder(unexecuted, tmp_path):
    folder = tmp_path / "pages"
    folder.mkdir()
    result = _render_cli(str(unexecuted), "--out", str(folder), "--allow-unexecuted", "--no-code")
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == str(folder / "fresh-nocode.html")
    assert (folder / "fresh-nocode.html").read_text(encoding="utf-8").startswith("<!DOCTYPE")
    assert [p.name for p in folder.iterdir()] == ["fresh-nocode.html"]  # no temporary file left
