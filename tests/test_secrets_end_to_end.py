"""A planted secret reaches no file: run against a loopback server with credentials in the URL
userinfo, the query string, ``params.api_key``, a header and the environment, execute and render
a notebook against it, then grep every file the run and the render wrote."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from openai_server import ok, serving, status, user_text
from test_runner import niah_config

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
            [sys.executable, "-m", "ragbench.cli", *args], stdout=f, stderr=subprocess.STDOUT,
            env=env, cwd=ROOT, timeout=600,
        ).returncode  # fmt: skip


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
            [sys.executable, "-c", code, str(executed), json.dumps(params)], stdout=f,
            stderr=subprocess.STDOUT, env=env, cwd=ROOT, timeout=600,
        )  # fmt: skip
    assert done.returncode == 0, log.read_text()[-3000:]
    assert srv.requests and srv.requests[0][1]["Authorization"] == f"Bearer {SECRET}-env-key"
    html = tmp_path / "reports" / "quickstart.html"
    assert ragbench("render", str(executed), "--out", str(html), env=env, log=log) == 0
    assert html.exists() and html.stat().st_size > 10_000
    assert leaks(tmp_path) == []
