"""A planted secret reaches no file: run against a loopback server with credentials in the URL
userinfo, the query string, ``params.api_key``, a header and the environment, execute and render
a notebook against it, then grep every file the run and the render wrote. Issue 34 adds
``ragbench compare``'s compare.yaml (and its resume), code cells rendered with code, a
non-string ``api_key`` and the error lines on stderr."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import nbformat
import pytest
import yaml
from openai_server import ok, serving, status, user_text
from test_compare import QUESTIONS, make_docs
from test_runner import niah_config

from ragbench import secrets

serve = pytest.fixture(serving, name="serve")
SECRET = "PLANTED-s3cr3t-7f3a9c"  # each credential is SECRET plus its own suffix
ROOT = Path(__file__).parents[1]


def echoing_refusal(h, body, n):
    """Some servers quote the credentials they refused: the long haystacks get a 401 whose
    message repeats the Authorization and X-Trace headers it received."""
    if "1500" not in user_text(body) and len(user_text(body)) < 4000:
        return ok()(h, body, n)
    quoted = f"bad credentials {h.headers.get('Authorization')} {h.headers.get('X-Trace')}"
    return status(401, quoted)(h, body, n)


def env_with_secret(tmp_path: Path) -> dict[str, str]:
    return {
        **os.environ,
        "MY_SERVICE_TOKEN": f"{SECRET}-env",
        "RAGBENCH_CACHE": str(tmp_path / "cache"),
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
    }


def ragbench(*args: str, env: dict[str, str], log: Path) -> int:
    """The CLI as a user runs it, its whole output kept in ``log`` (a file we grep too)."""
    with log.open("ab") as f:
        return subprocess.run(
            [sys.executable, "-m", "ragbench.cli", *args],
            stdout=f,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=ROOT,
            timeout=600,
        ).returncode


def leaks(folder: Path) -> list[str]:
    return [
        f"{p}: {p.read_bytes().count(SECRET.encode())}"
        for p in sorted(folder.rglob("*"))
        if p.is_file() and SECRET.encode() in p.read_bytes()
    ]


def test_a_planted_secret_reaches_no_file_of_a_run(serve, tmp_path):
    srv = serve(echoing_refusal)
    host = srv.url.removeprefix("http://")
    cfg = niah_config(tmp_path, strategies=["closed_book", "long_context"])
    cfg["model"] = {
        "backend": "openai",
        "name": "m",
        "cache": True,
        "params": {
            "base_url": f"http://bob:{SECRET}-url@{host}?token={SECRET}-query&api-version=1",
            "api_key": f"{SECRET}-param",
            "headers": {"X-Trace": f"{SECRET}-header"},
            "max_retries": 0,
            "tokenizer": "whitespace",
        },
    }
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(cfg))
    env = env_with_secret(tmp_path)
    log = tmp_path / "cli.log"
    assert ragbench("run", str(path), env=env, log=log) == 0, log.read_text()
    # resume: errors retried; logged to a real MLflow store (tmp_path/mlruns: grepped below)
    mlruns = str(tmp_path / "mlruns")
    assert ragbench("run", str(path), "--mlflow-uri", mlruns, env=env, log=log) == 0
    assert (tmp_path / "mlruns" / "mlflow.db").exists()
    # and exported for other tools (tmp_path/results/<run>/export: grepped below)
    run_dir = next((tmp_path / "results").iterdir())
    for fmt in ("jsonl", "csv", "lm-eval"):
        assert ragbench("export", str(run_dir), "--format", fmt, env=env, log=log) == 0
    # the requests did carry the credentials: the key as Bearer, the header, the query token
    sent = srv.requests[0]
    assert sent[1]["Authorization"] == f"Bearer {SECRET}-param"
    assert sent[1]["X-Trace"] == f"{SECRET}-header" and f"token={SECRET}-query" in sent[0]
    text = log.read_text()
    assert "records failed" in text and "401" in text  # the refusals were reported, masked
    assert (tmp_path / "cache" / "completions.sqlite").exists()
    run_dir = next((tmp_path / "results").iterdir())
    assert {"records.jsonl", "results.parquet", "manifest.json"} <= {
        p.name for p in run_dir.iterdir()
    }
    # only the config the user wrote holds them
    assert [p for p in leaks(tmp_path) if not p.startswith(f"{path}:")] == []


@pytest.mark.slow  # papermill executes the quickstart against the server, then renders it
def test_a_planted_secret_reaches_no_notebook_or_html(serve, tmp_path):
    srv = serve(ok())
    host = srv.url.removeprefix("http://")
    env = env_with_secret(tmp_path) | {"OPENAI_API_KEY": f"{SECRET}-env-key"}
    params = {
        "backend": "openai",
        "model": "m",
        "base_url": f"http://bob:{SECRET}-url@{host}?api_key={SECRET}-query",
        "embedder": "hash",
        "tokenizer": "whitespace",
        "context_lengths": [300],
        "depth_percents": [50],
        "output_dir": str(tmp_path / "runs"),
    }
    executed = tmp_path / "reports" / "quickstart.ipynb"
    code = (
        "import sys, json; from ragbench.workspace.kernels import execute_notebook as run; "
        "run('notebooks/00_quickstart.ipynb', sys.argv[1], parameters=json.loads(sys.argv[2]),"
        " cwd='.')"
    )
    log = tmp_path / "papermill.log"
    with log.open("wb") as f:
        done = subprocess.run(
            [sys.executable, "-c", code, str(executed), json.dumps(params)],
            stdout=f,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=ROOT,
            timeout=600,
        )
    assert done.returncode == 0, log.read_text()[-3000:]
    assert srv.requests and srv.requests[0][1]["Authorization"] == f"Bearer {SECRET}-env-key"
    html = tmp_path / "reports" / "quickstart.html"
    assert ragbench("render", str(executed), "--out", str(html), env=env, log=log) == 0
    assert html.exists() and html.stat().st_size > 10_000
    assert leaks(tmp_path) == []


# --------------------------------------------------------------------------- issue 34


class PipelineService(BaseHTTPRequestHandler):
    """A pipeline service that records the Authorization and query each POST carried."""

    seen: list = []

    def do_POST(self):  # noqa: N802 (http.server's name)
        self.rfile.read(int(self.headers["Content-Length"]))
        PipelineService.seen.append((self.path, self.headers.get("Authorization")))
        data = json.dumps({"answer": "Ada Quill", "version": "svc-1"}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):  # noqa: N802 (the preflight)
        self.send_response(405)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture
def pipeline_service():
    server = ThreadingHTTPServer(("127.0.0.1", 0), PipelineService)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    PipelineService.seen = []
    yield f"127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_compare_yaml_holds_no_credential_and_a_resume_takes_them_from_the_environment(
    serve, pipeline_service, tmp_path
):
    """`ragbench compare --base-url http://user:PASS@host?token=T --pipeline-url ...`: the
    compare.yaml it writes has both URLs masked (same run folder: the hash is redacted); a resume
    with work pending refuses, one line, until the environment gives the full URLs, then sends
    them."""
    srv = serve(ok())
    host = srv.url.removeprefix("http://")
    base_url = f"http://bob:{SECRET}-url@{host}?token={SECRET}-query"
    pipe_url = f"http://u:{SECRET}-pipe@{pipeline_service}/answer?token={SECRET}-ptok"
    docs = make_docs(tmp_path / "docs")
    (tmp_path / "q.csv").write_text(QUESTIONS, encoding="utf-8")
    env = env_with_secret(tmp_path)
    log = tmp_path / "compare.log"
    code = ragbench(
        "compare",
        str(docs),
        "--questions",
        str(tmp_path / "q.csv"),
        "--backend",
        "openai",
        "--model",
        "m",
        "--price-sheet",
        "example-hosted-api",
        "--base-url",
        base_url,
        "--pipeline-url",
        pipe_url,
        "--tokenizer",
        "whitespace",
        "--embedder",
        "hash",
        "--strategy",
        "long_context",
        "--yes",
        "--quiet",
        "--no-report",
        "--output-dir",
        str(tmp_path / "out"),
        env=env,
        log=log,
    )
    assert code == 0, log.read_text()
    assert srv.requests and PipelineService.seen  # both were called, with their credentials
    assert f"token={SECRET}-query" in srv.requests[-1][0]
    assert PipelineService.seen[0] == (
        f"/answer?token={SECRET}-ptok",
        "Basic " + base64.b64encode(f"u:{SECRET}-pipe".encode()).decode(),
    )
    yaml_path = next((tmp_path / "out").glob("*/compare.yaml"))
    text = yaml_path.read_text()
    assert (
        f"http://***@{host}?token=***" in text
        and f"http://***@{pipeline_service}/answer?token=***" in text
    )
    assert "OPENAI_BASE_URL" in text and "RAGBENCH_PIPELINE_URL" in text  # how to resume
    assert leaks(tmp_path) == []
    # a resume with work to do: records gone, so every one is pending (and no cached answer)
    (yaml_path.parent / "records.jsonl").write_text("")
    (tmp_path / "cache" / "completions.sqlite").unlink()
    err = tmp_path / "resume.err"
    with err.open("wb") as f:
        done = subprocess.run(
            [sys.executable, "-m", "ragbench.cli", "run", str(yaml_path), "--quiet"],
            stdout=subprocess.DEVNULL,
            stderr=f,
            env=env,
            cwd=ROOT,
            timeout=600,
        )
    lines = err.read_text().strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, lines
    assert (
        lines[0].startswith("error: model.params.base_url: http://***@")
        and "OPENAI_BASE_URL" in lines[0]
    )
    before = len(srv.requests), len(PipelineService.seen)
    env |= {"OPENAI_BASE_URL": base_url, "RAGBENCH_PIPELINE_URL": pipe_url}
    assert ragbench("run", str(yaml_path), "--quiet", env=env, log=log) == 0, log.read_text()
    assert f"run folder: {yaml_path.parent}" in log.read_text()  # the same run, resumed
    assert len(srv.requests) > before[0] and len(PipelineService.seen) > before[1]
    assert f"token={SECRET}-query" in srv.requests[-1][0]
    assert PipelineService.seen[-1] == PipelineService.seen[0]
    assert leaks(tmp_path) == []


def test_rendered_code_cells_show_no_credential(tmp_path):
    """`ragbench render` with code: credentials typed into code cells are masked before the
    highlighter splits each assignment into <span>s (plain words included)."""
    source = (
        f'api_key = "{SECRET}plain"\n'
        f'client = OpenAI(api_key="{SECRET}-ctor")\n'
        f'headers = {{"X-Api-Key": "{SECRET}-hdr"}}\n'
        f'os.environ["HF_TOKEN"] = "{SECRET}-env"\n'
        "print('done')"
    )
    cell = nbformat.v4.new_code_cell(source)
    cell.execution_count = 1
    cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text="done\n")]
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell("# keys"), cell]
    notebook = tmp_path / "nb" / "keys.ipynb"
    notebook.parent.mkdir()
    nbformat.write(nb, str(notebook))
    log = tmp_path / "render.log"
    html = tmp_path / "page" / "keys.html"
    assert (
        ragbench(
            "render", str(notebook), "--out", str(html), env=env_with_secret(tmp_path), log=log
        )
        == 0
    ), log.read_text()
    page = html.read_text()
    assert "OpenAI" in page and "X-Api-Key" in page and page.count("***") >= 4
    assert [p for p in leaks(tmp_path) if not p.startswith(f"{notebook}:")] == []


def test_rendered_outputs_show_no_credential_the_code_printed_or_raised(tmp_path):
    """Issue 45: `ragbench render` masked a key in the code cell but not where the cell printed
    it, displayed it (text/plain, text/html with a <script>, text/markdown) or raised with it
    (ename, evalue, a traceback IPython coloured with ANSI codes); with code or without."""
    key, url = f"{SECRET}-key", f"http://bob:{SECRET}-url@127.0.0.1:9/v1"
    cell = nbformat.v4.new_code_cell(
        f'api_key = "{key}"\nbase_url = "{url}"\nprint(api_key, base_url)', execution_count=1
    )
    shown = f"{key} {url} {SECRET}-url"
    cell.outputs = [
        nbformat.v4.new_output("stream", name="stdout", text=shown + "\n"),
        nbformat.v4.new_output(
            "display_data",
            data={
                "text/plain": shown,
                "text/markdown": f"**{key}** at {url}",
                "text/html": f"<p>{shown}</p><script>if (1 < 2 && '{key}') {{}}</script>",
            },
        ),
        nbformat.v4.new_output(
            "error",
            ename="AuthenticationError",
            evalue=shown,
            traceback=[f'OpenAI(api_key\x1b[38;5;241m=\x1b[39m\x1b[38;5;124m"{key}"\x1b[39m)'],
        ),
    ]
    nb = nbformat.v4.new_notebook()
    nb.cells = [cell]
    notebook = tmp_path / "nb" / "printed.ipynb"
    notebook.parent.mkdir()
    nbformat.write(nb, str(notebook))
    log = tmp_path / "render.log"
    for flags in ([], ["--no-code"]):
        html = tmp_path / "page" / f"printed{len(flags)}.html"
        args = ["render", str(notebook), "--out", str(html), *flags]
        assert ragbench(*args, env=env_with_secret(tmp_path), log=log) == 0, log.read_text()
        page = html.read_text()
        assert "http://***@127.0.0.1:9/v1" in page and "if (1 < 2 && '***')" in page
    assert [p for p in leaks(tmp_path) if not p.startswith(f"{notebook}:")] == []


@pytest.mark.parametrize(
    "value", [{"k": f"{SECRET}-dict"}, 31415926535, [f"{SECRET}-list"]], ids=["dict", "int", "list"]
)
def test_a_non_string_api_key_is_refused_naming_the_key_not_the_value(tmp_path, value):
    cfg = niah_config(tmp_path, strategies=["closed_book"])
    cfg["model"] = {
        "backend": "openai",
        "name": "m",
        "params": {"base_url": "http://127.0.0.1:9/v1", "api_key": value},
    }
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(cfg))
    out = cli_stderr(["run", str(path)], tmp_path)
    assert out.returncode == 2 and len(out.lines) == 1, out.lines
    assert f"{path}:" in out.lines[0] and "params.api_key" in out.lines[0]
    assert "must be a string" in out.lines[0] and SECRET not in out.lines[0]
    assert "31415926535" not in out.lines[0] and not (tmp_path / "results").exists()
    # the manifest writer masks a credential-named field whatever its value's type
    clean = json.dumps(secrets.redact({"params": {"api_key": value, "eos_token_id": 2}}))
    assert SECRET not in clean and "31415926535" not in clean and '"eos_token_id": 2' in clean


@pytest.mark.parametrize(
    "args",
    [
        ["--set", f"model.params.api_key=[{SECRET}-set"],
        [
            "--set",
            "model.backend=openai",
            "--set",
            "model.name=m",
            "--set",
            f"model.params.base_url=http//user:{SECRET}-pw@127.0.0.1:9/v1",
        ],
    ],
    ids=["malformed --set api_key", "base_url without its colon"],
)
def test_error_lines_on_stderr_quote_no_credential(tmp_path, args):
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(niah_config(tmp_path, strategies=["closed_book"])))
    out = cli_stderr(["run", str(path), *args], tmp_path)
    assert out.returncode == 2 and out.lines and out.lines[0].startswith("error: "), out.lines
    assert SECRET not in "\n".join(out.lines) and "***" in out.lines[0]


@dataclass
class Finished:
    returncode: int
    lines: list[str]


def cli_stderr(args: list[str], tmp_path: Path) -> Finished:
    """The CLI's exit code and its stderr lines (stdout dropped)."""
    done = subprocess.run(
        [sys.executable, "-m", "ragbench.cli", *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=env_with_secret(tmp_path),
        cwd=ROOT,
        timeout=600,
        text=True,
    )
    return Finished(done.returncode, done.stderr.strip().splitlines())
