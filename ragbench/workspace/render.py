"""Executed notebooks to standalone, shareable HTML (the tests look at it in headless Chromium:
``tests/browser.py``).

nbconvert's lab template, minus every external script (require.js, MathJax, mermaid come from
CDNs; none is needed to see tables and figures, and a report must open offline). Figures are the
PNG outputs matplotlib's inline backend already stores base64 in the notebook, so they show without
a kernel. A provenance header names the notebook, its papermill parameters and the manifests of the
runs the notebook executed (``ragbench.run`` records each one in the cell's outputs under
``RUN_MIME``; several runs: the facts they share, then per run what differs). Before anything is
written the notebook's cells are redacted (``kernels.redact_notebook``: code cells before syntax
highlighting splits an assignment into <span>s, a quoted literal of a credential name masked
whatever it looks like) and the HTML is scrubbed (``ragbench.workspace.scrub``, which
``kernels`` uses too): every credential ``ragbench.secrets`` recognises becomes ``***`` and the
machine's absolute paths (repo root, venv, $HOME, the notebook's folder) become placeholders.

Only executed notebooks are rendered: a file that is not a notebook, or a notebook no code cell of
which has run, is a ``RenderInputError`` (``ragbench render`` prints it as one line and exits 2).
``allow_unexecuted=True`` (``--allow-unexecuted``) renders an unexecuted notebook anyway, under a
banner saying it shows code without results.
"""

from __future__ import annotations

import html
import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ragbench import secrets
from ragbench.io import atomic_write_text
from ragbench.workspace.alt_text import describe_figures
from ragbench.workspace.kernels import redact_notebook
from ragbench.workspace.scrub import scrub

if TYPE_CHECKING:
    from nbformat import NotebookNode

# display_data mime type ragbench.experiment.runner writes in a kernel:
# {"run_dir": absolute path, "manifest": {...}}
RUN_MIME = "application/vnd.ragbench.run+json"
MANIFEST_FIELDS = {  # header label -> manifest keys (dotted: nested), as ragbench.experiment.runner writes
    "config hash": ("config_hash",),
    "dataset fingerprint": ("dataset.fingerprint", "dataset_fingerprint"),
    "model": ("model.model", "model"),
    "git commit": ("git_commit",),
    "run started": ("started_at",),
    "run finished": ("finished_at",),
}
# several runs: these show the earliest start and the latest finish (ISO 8601 UTC sorts as text)
_EARLIEST_LATEST = {"run started": min, "run finished": max}

_TEMPLATE = """{%- extends 'lab/index.html.j2' -%}
{%- block html_head_js_requirejs -%}{%- endblock html_head_js_requirejs -%}
{%- block html_head_js_mathjax -%}{%- endblock html_head_js_mathjax -%}
{%- block html_head_js_mermaidjs -%}{%- endblock html_head_js_mermaidjs -%}
{%- block body_header -%}
{{ super() }}
{{ resources.ragbench_header }}
{%- endblock body_header -%}
{%- block data_png scoped -%}
{%- set alt = output.metadata.get('image/png', {}).get('alt', '') -%}
{%- if alt -%}{{ super() | replace('<img ', '<img alt="' ~ (alt | escape_html) ~ '" ', 1) }}
{%- else -%}{{ super() }}{%- endif -%}
{%- endblock data_png -%}
"""
_HEADER_CSS = (
    "margin:1em auto;max-width:1000px;padding:0.6em 1em;border:1px solid #ccc;"
    "border-radius:6px;background:#f7f7f9;font:13px/1.4 sans-serif"
)
_BANNER_CSS = (
    "margin:1em auto;max-width:1000px;padding:0.8em 1em;border:2px solid #b45309;"
    "border-radius:6px;background:#fef3c7;color:#78350f;font:bold 15px/1.4 sans-serif"
)
UNEXECUTED_BANNER = (
    f"<section class='ragbench-unexecuted' style='{_BANNER_CSS}'>Not executed: no code cell of "
    "this notebook has run, so it shows code without results. Execute it (papermill, "
    "<code>ragbench sweep</code>, or Run All in Jupyter) and render the executed copy.</section>"
)


class RenderInputError(ValueError):
    """A file ``render`` cannot use (missing, not a notebook, not executed, a bad manifest);
    the message is ``<path>: <reason>``."""


def read_notebook(path: str | os.PathLike, allow_unexecuted: bool = False) -> NotebookNode:
    """The notebook at ``path`` (nbformat 4), or a ``RenderInputError`` saying why it is not one
    that can be rendered. An unexecuted notebook is an error unless ``allow_unexecuted``."""
    import nbformat

    path = Path(path)
    if not path.exists():
        raise RenderInputError(f"{path}: no such file")
    if path.is_dir():
        raise RenderInputError(f"{path}: is a directory, not a notebook")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise RenderInputError(f"{path}: not a Jupyter notebook (not UTF-8 text)") from None
    except OSError as exc:
        raise RenderInputError(f"{path}: cannot read it ({exc.strerror or exc})") from None
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise RenderInputError(
            f"{path}: not a Jupyter notebook (invalid JSON: {exc.msg} at line {exc.lineno} "
            f"column {exc.colno})"
        ) from None
    if not isinstance(raw, dict) or "cells" not in raw or "nbformat" not in raw:
        raise RenderInputError(
            f"{path}: not a Jupyter notebook (JSON without 'cells' and 'nbformat')"
        )
    try:
        nb = nbformat.reads(text, as_version=4)
    except Exception as exc:  # nbformat raises ValidationError, NBFormatError, TypeError, ...
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise RenderInputError(f"{path}: not a readable Jupyter notebook ({reason})") from None
    if not allow_unexecuted and not is_executed(nb):
        raise RenderInputError(
            f"{path}: not executed (no code cell has run, so there are no results to show); "
            "execute it first (papermill, ragbench sweep, or Run All in Jupyter) and render the "
            "executed copy, or pass --allow-unexecuted to render it under a warning banner"
        )
    return nb


def is_executed(nb: NotebookNode) -> bool:
    """True when some code cell has run (an execution count or outputs), or there is no code."""
    code = [c for c in nb.cells if c.get("cell_type") == "code"]
    return not code or any(c.get("execution_count") is not None or c.get("outputs") for c in code)


def render_notebook(
    executed_ipynb: str | os.PathLike,
    out_html: str | os.PathLike,
    include_code: bool = True,
    manifest: Mapping[str, object] | str | os.PathLike | None = None,
    keep_stderr: bool = False,
    allow_unexecuted: bool = False,
    run_dir: str | os.PathLike | None = None,
) -> Path:
    """Render an executed notebook to standalone HTML (atomically) and return the HTML path.
    Paths under ``run_dir`` (default: the notebook's folder) read ``$RUN_DIR``.

    stderr streams (progress bars, library warnings) are left out unless ``keep_stderr``: the
    page is for readers of the results; the executed .ipynb keeps everything. A file that is not
    an executed notebook raises ``RenderInputError`` (see :func:`read_notebook`);
    ``allow_unexecuted`` renders an unexecuted one under :data:`UNEXECUTED_BANNER`."""
    import jinja2
    import nbformat
    from nbconvert import HTMLExporter

    executed_ipynb = Path(executed_ipynb)
    nb = read_notebook(executed_ipynb, allow_unexecuted=allow_unexecuted)
    banner = "" if is_executed(nb) else UNEXECUTED_BANNER
    runs = _load_manifests(manifest, executed_ipynb, nb)
    # credentials masked in the cells themselves, before the exporter highlights code: pygments
    # splits ``api_key = "sk-..."`` into <span>s that the page's scrub below cannot see as a pair
    nb = nbformat.from_dict(redact_notebook(nb))
    if not keep_stderr:
        for cell in nb.cells:
            if "outputs" in cell:
                cell.outputs = [o for o in cell.outputs if o.get("name") != "stderr"]
    describe_figures(nb)  # each figure's alt text, from the markdown above it
    exporter = HTMLExporter(
        template_name="lab",
        extra_loaders=[jinja2.DictLoader({"ragbench_report.html.j2": _TEMPLATE})],
        template_file="ragbench_report.html.j2",
        exclude_input=not include_code,
        exclude_input_prompt=not include_code,
        exclude_output_prompt=not include_code,
        embed_images=True,  # markdown images as data: URIs too
    )
    resources = {
        "ragbench_header": banner + provenance_header(executed_ipynb.name, nb, runs),
        "metadata": {"name": executed_ipynb.stem, "path": str(executed_ipynb.parent)},
    }
    body, _ = exporter.from_notebook_node(nb, resources=resources)
    body = scrub(body, extra_paths=[Path(run_dir or executed_ipynb.resolve().parent)])
    return atomic_write_text(out_html, body)


# --- provenance -----------------------------------------------------------------------------------


def executed_runs(nb: NotebookNode) -> list[tuple[str, dict[str, object]]]:
    """(run folder name, manifest) of each run ``ragbench.run`` recorded in the notebook's outputs,
    in execution order, once per folder (its last record). A record without a manifest falls back
    to the folder's ``manifest.json``, if it is still there."""
    runs: dict[str, dict[str, object]] = {}
    for cell in nb.cells:
        for output in cell.get("outputs", []):
            record = output.get("data", {}).get(RUN_MIME)
            if not isinstance(record, Mapping) or not record.get("run_dir"):
                continue
            run_dir = Path(str(record["run_dir"]))
            manifest = record.get("manifest")
            if not isinstance(manifest, Mapping):
                path = run_dir / "manifest.json"
                manifest = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
            runs.pop(str(run_dir), None)  # a rerun of the same folder moves it to the end
            runs[str(run_dir)] = dict(manifest)
    return [(Path(run_dir).name, manifest) for run_dir, manifest in runs.items()]


def _load_manifests(
    manifest: Any, notebook: Path, nb: NotebookNode
) -> list[tuple[str, dict[str, Any]]]:
    """(run name, manifest) pairs for the header: the manifest given; else the runs the notebook
    recorded (:func:`executed_runs`); else, for notebooks that record none, the one
    ``manifest.json`` beside the notebook or under its ``output_dir`` parameter."""
    if isinstance(manifest, Mapping):
        return [("", dict(manifest))]
    if manifest is not None:
        path = Path(manifest)
        if not path.is_file():
            raise RenderInputError(f"{path}: no such manifest file")
        try:
            loaded = json.loads(path.read_text(encoding="utf-8"))
        except (ValueError, OSError) as exc:
            raise RenderInputError(f"{path}: not a readable manifest ({exc})") from None
        if not isinstance(loaded, Mapping):
            raise RenderInputError(f"{path}: not a manifest (expected a JSON object)")
        return [(path.parent.name, dict(loaded))]
    runs = executed_runs(nb)
    if runs:
        return runs
    found = [notebook.parent / "manifest.json"]
    output_dir = _parameters(nb).get("output_dir")
    if isinstance(output_dir, str) and output_dir and Path(output_dir).is_dir():
        found += sorted(Path(output_dir).glob("**/manifest.json"))
    found = [p for p in dict.fromkeys(found) if p.is_file()]
    # several and none recorded: which of them this notebook made is unknown, the header shows none
    if len(found) != 1:
        return []
    return [(found[0].parent.name, json.loads(found[0].read_text(encoding="utf-8")))]


def _lookup(manifest: Mapping[str, object], dotted: str) -> object:
    value: object = manifest
    for part in dotted.split("."):
        if not isinstance(value, Mapping) or part not in value:
            return None
        value = value[part]
    return None if isinstance(value, Mapping) or value == "" else value


def _field(manifest: Mapping[str, object], keys: Sequence[str]) -> str | None:
    """The first of ``keys`` the manifest has, as text."""
    return next((str(v) for k in keys if (v := _lookup(manifest, k)) is not None), None)


def _parameters(nb: NotebookNode) -> dict[str, object]:
    return dict(nb.metadata.get("papermill", {}).get("parameters", {}) or {})


def provenance_header(
    name: str,
    nb: NotebookNode,
    runs: Mapping[str, object] | Sequence[tuple[str, Mapping[str, object]]] = (),
) -> str:
    """A small HTML box: notebook, parameters, run facts. Every value is HTML-escaped.

    ``runs``: one manifest, or (run name, manifest) pairs. With several runs a fact they share is
    shown once, the earliest start and latest finish are shown, and any other fact that differs
    is listed per run."""
    if isinstance(runs, Mapping):
        runs = [("", runs)]
    rows: list[tuple[str, str]] = [("notebook", name)]
    params = secrets.redact(_parameters(nb))  # a notebook executed elsewhere may hold credentials
    if params:
        rows.append(("parameters", ", ".join(f"{k}={v!r}" for k, v in params.items())))
    names = [run for run, _ in runs if run]
    if names:
        rows.append(("runs" if len(names) > 1 else "run", ", ".join(names)))
    for label, keys in MANIFEST_FIELDS.items():
        values = [(run, v) for run, manifest in runs if (v := _field(manifest, keys)) is not None]
        distinct = list(dict.fromkeys(v for _, v in values))
        if len(distinct) == 1:
            rows.append((label, distinct[0]))
        elif distinct and label in _EARLIEST_LATEST:
            rows.append((label, _EARLIEST_LATEST[label](distinct)))
        elif distinct:
            rows.append((label, "; ".join(f"{v} ({run or '?'})" for run, v in values)))
    papermill = nb.metadata.get("papermill", {})
    if papermill.get("end_time"):
        rows.append(("executed", str(papermill["end_time"])))
    if papermill.get("duration") is not None:
        rows.append(("duration", f"{float(papermill['duration']):.1f} s"))
    cells = "".join(
        f"<tr><th style='text-align:left;padding-right:1em'>{html.escape(k)}</th>"
        f"<td><code>{html.escape(v)}</code></td></tr>"
        for k, v in rows
    )
    return f"<section class='ragbench-provenance' style='{_HEADER_CSS}'><table>{cells}</table></section>"
