"""Credentials given to a sweep as notebook parameters are never written: not in the executed
notebooks, the markers, summary.json, the results table, the printed summary or rendered HTML."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import nbformat
import pandas as pd
import pytest
import yaml

from ragbench.workspace.kernels import redact_notebook
from ragbench.workspace.render import render_notebook
from ragbench.workspace.sweep.run import execute_sweep
from ragbench.workspace.sweep.spec import SweepSpecError, load_spec, point_id

PROBE = Path(__file__).parent / "fixtures" / "notebooks" / "sweep_probe.ipynb"
PASSWORD = "hunter2-pw-5150"
URL = f"http://alice:{PASSWORD}@llm.internal:8000/v1"
KEY = "qz-test-credential-8e1f4a"  # no well-known key shape: only its name gives it away
SECRETS = (PASSWORD, KEY)
LINK = "https://example.com/search?q=rag+vs+long+context&page=2"


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    """Two points, two workers (spawned processes: they share no memory with this one); the
    notebook prints both credentials and x=2 fails with an error quoting them."""
    folder = tmp_path_factory.mktemp("secret-sweep")
    spec = folder / "sweep.yaml"
    spec.write_text(
        yaml.safe_dump(
            {
                "notebook": str(PROBE),
                "output_dir": str(folder / "out"),
                "parameters": {"base_url": URL, "api_key": KEY, "fail_at": 2},
                "grid": {"x": [1, 2]},
            }
        ),
        encoding="utf-8",
    )
    outcome = execute_sweep(spec, workers=2)
    return {"folder": folder, "spec": spec, "outcome": outcome}


def test_the_notebook_really_used_the_credentials(swept):
    # guards the tests below: the secrets went in, and came out masked where they were printed
    by_x = {p.params["x"]: p for p in swept["outcome"].points}
    assert (by_x[1].status, by_x[2].status) == ("done", "failed")
    printed = "".join(
        o.get("text", "")
        for c in nbformat.read(by_x[1].notebook, as_version=4).cells
        for o in c.get("outputs", [])
    )
    assert "connecting to http://***@llm.internal:8000/v1 with ***" in printed
    assert by_x[2].error == "ConnectionError: cannot reach http://***@llm.internal:8000/v1 with ***"


def test_no_file_the_sweep_wrote_holds_a_credential(swept):
    files = [p for p in (swept["folder"] / "out").rglob("*") if p.is_file()]
    names = {p.name for p in files}
    assert {"summary.json", "done.json", "failed.json", "results.parquet"} <= names
    assert sum(p.suffix == ".ipynb" for p in files) == 2
    for path in files:
        data = path.read_bytes()
        for secret in SECRETS:
            assert secret.encode() not in data, f"{secret} written to {path}"


def test_stored_parameters_are_masked_not_dropped(swept):
    out = swept["folder"] / "out"
    masked = {"base_url": "http://***@llm.internal:8000/v1", "api_key": "***", "fail_at": 2}
    summary = json.loads((out / "summary.json").read_text())
    assert [p["params"] for p in summary] == [{**masked, "x": 1}, {**masked, "x": 2}]
    for point in summary:
        marker = "done.json" if point["status"] == "done" else "failed.json"
        stored = json.loads((Path(point["notebook"]).parent / marker).read_text())
        assert stored["params"] == point["params"]
    table = pd.read_parquet(out / "results.parquet")
    assert table[["base_url", "api_key"]].drop_duplicates().to_dict("records") == [
        {"base_url": masked["base_url"], "api_key": "***"}
    ]
    executed = nbformat.read(summary[0]["notebook"], as_version=4)
    assert executed.metadata.papermill.parameters["api_key"] == "***"
    injected = next(
        c for c in executed.cells if "injected-parameters" in c.metadata.get("tags", [])
    )
    assert 'api_key = "***"' in injected.source and "http://***@llm.internal" in injected.source


def test_printed_summary_and_rendered_html_hold_no_credential(swept, tmp_path):
    import typer
    from typer.testing import CliRunner

    from ragbench.cli.sweep import register

    app = typer.Typer()
    register(app)
    result = CliRunner().invoke(app, ["sweep", str(swept["spec"]), "--no-rerun-failed"])
    assert result.exit_code == 1 and "1 failed" in result.output
    for point in swept["outcome"].points:
        page = render_notebook(point.notebook, tmp_path / f"{point.point_id}.html")
        text = page.read_text(encoding="utf-8")
        assert "llm.internal" in text  # the page shows the parameters ...
        for secret in SECRETS:  # ... without their credentials
            assert secret not in text and secret not in result.output


def test_point_ids_and_spec_errors_never_spell_a_credential(tmp_path):
    pid = point_id({"base_url": URL, "api_key": KEY, "x": 1}, ["base_url", "api_key", "x"])
    assert PASSWORD not in pid and KEY not in pid
    assert pid.startswith("base_url=http-xxx-llm.internal-8000-v1,api_key=xxx,x=1-")
    # differing only in the credential: still two points
    assert pid != point_id(
        {"base_url": URL, "api_key": "other", "x": 1}, ["base_url", "api_key", "x"]
    )

    spec = tmp_path / "bad.yaml"
    spec.write_text(yaml.safe_dump({"notebook": str(PROBE), "grid": {"api_key": [KEY, KEY]}}))
    with pytest.raises(SweepSpecError, match="repeated values") as raised:
        load_spec(spec)
    assert KEY not in str(raised.value)


def test_redact_notebook_masks_text_and_leaves_images_alone():
    png = base64.b64encode(b"\x89PNG AKIA" + b"ABCDEFGHIJKLMNOP" * 4).decode()
    uri = f"data:image/png;base64,{png}"
    cell = nbformat.v4.new_code_cell(
        f'api_key = "{KEY}"\nprint(key)',
        outputs=[
            nbformat.v4.new_output("stream", text=[f"url {URL}\n", f"see {LINK}\n"]),
            nbformat.v4.new_output(
                "display_data",
                data={
                    "image/png": png,
                    "text/html": f'<img src="{uri}"> Bearer abcdef123456',
                    "application/json": {"token": "abc-123-xyz", "n": 3},
                },
            ),
            nbformat.v4.new_output("error", ename="E", evalue=f"at {URL}", traceback=[f"{URL}"]),
        ],
    )
    nb = nbformat.v4.new_notebook(cells=[cell])
    nb.metadata["papermill"] = {"parameters": {"api_key": KEY, "x": 1}}
    out = redact_notebook(nb)
    text = json.dumps(out)
    assert PASSWORD not in text and KEY not in text and "abcdef123456" not in text
    (cell,) = out["cells"]
    # a link without credentials keeps its spelling (no re-encoded query)
    assert cell["outputs"][0]["text"] == ["url http://***@llm.internal:8000/v1\n", f"see {LINK}\n"]
    data = cell["outputs"][1]["data"]
    assert data["image/png"] == png  # base64 is never edited
    assert data["text/html"] == f'<img src="{uri}"> Bearer ***'
    assert data["application/json"] == {"token": "***", "n": 3}
    assert out["metadata"]["papermill"]["parameters"] == {"api_key": "***", "x": 1}
    assert nb.cells[0].source.startswith('api_key = "qz-')  # a copy: the input is unchanged


def test_a_value_remembered_or_exported_after_a_save_is_masked_in_the_next_save(monkeypatch):
    """papermill saves a notebook at every cell and each save is redacted from a memo of the
    fields already redacted: a credential the process learns between two saves (remembered, or
    in the environment) is masked in the next save's old outputs too, never served unmasked."""
    from ragbench import secrets

    remembered, exported = "zq-later-remembered-7c1", "zq-later-exported-4b2e"
    cell = nbformat.v4.new_code_cell(
        "print(x)",
        outputs=[
            nbformat.v4.new_output("stream", text=f"{remembered} {exported}\n"),
            nbformat.v4.new_output("display_data", data={"text/html": f"<b>{remembered}</b>"}),
        ],
    )
    nb = nbformat.v4.new_notebook(cells=[cell])
    first = json.dumps(redact_notebook(nb))
    assert remembered in first and exported in first  # nothing says they are credentials yet
    monkeypatch.setattr(secrets, "_remembered", set(secrets._remembered))  # restored after
    secrets.remember(remembered)
    second = json.dumps(redact_notebook(nb))
    assert remembered not in second and exported in second
    monkeypatch.setenv("LATER_API_KEY", exported)
    third = json.dumps(redact_notebook(nb))
    assert remembered not in third and exported not in third
