"""Kernels ragbench starts keep no IPython history: the code they run (the injected parameters, a
URL with a password, a ``?token=``) never reaches ``$IPYTHONDIR/profile_default/history.sqlite``:
not from ``execute_notebook`` (``make demo``), not from a sweep, not from ``make lab``'s server."""

from __future__ import annotations

import json
import os
import sqlite3
import sys
from collections.abc import Iterator
from pathlib import Path

import nbformat
import pytest
import yaml

from ragbench.workspace.kernels import (
    HISTORY_OFF,
    PROJECT_KERNEL,
    execute_notebook,
    history_off_arguments,
    is_ipython_kernel,
    kernel_cli_args,
)
from ragbench.workspace.sweep.run import execute_sweep

PASSWORD, TOKEN = "s3cr3t-planted", "tok-planted"
URL = f"http://user:{PASSWORD}@127.0.0.1:9/v1?token={TOKEN}"
MASKED = "http://***@127.0.0.1:9/v1?token=***"
SECRETS = (PASSWORD, TOKEN)
PROBE = "print('history:', get_ipython().history_manager.enabled)\nprint('url:', base_url)"
SWEEP_PROBE = Path(__file__).parent / "fixtures" / "notebooks" / "sweep_probe.ipynb"


@pytest.fixture
def ipythondir(tmp_path, monkeypatch) -> Path:
    """IPython's own folder for the kernels this test starts (they inherit the environment)."""
    path = tmp_path / "ipython"
    monkeypatch.setenv("IPYTHONDIR", str(path))
    return path


def tiny_notebook(folder: Path, kernel: str) -> Path:
    path = folder / "tiny.ipynb"
    parameters = nbformat.v4.new_code_cell('base_url = ""', metadata={"tags": ["parameters"]})
    nb = nbformat.v4.new_notebook(cells=[parameters, nbformat.v4.new_code_cell(PROBE)])
    nb.metadata["kernelspec"] = {"name": kernel, "display_name": kernel, "language": "python"}
    nbformat.write(nb, path)
    return path


def _rows(db: Path) -> Iterator[tuple[str, str]]:
    con = sqlite3.connect(db)
    try:
        tables = [r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")]
        for table in tables:
            for row in con.execute(f'SELECT * FROM "{table}"'):
                yield table, " ".join(map(str, row))
    finally:
        con.close()


def leaks(folder: Path) -> list[str]:
    """Where under ``folder`` a secret is written: any file's bytes, and every row of every
    table of the SQLite files (history.sqlite)."""
    files = [p for p in folder.rglob("*") if p.is_file()]
    found = [f"{p}: {s}" for p in files for s in SECRETS if s.encode() in p.read_bytes()]
    for db in (p for p in files if p.suffix == ".sqlite"):
        found += [f"{db} table {t}: {s}" for t, text in _rows(db) for s in SECRETS if s in text]
    return found


def _printed(path: Path) -> str:
    nb = nbformat.read(path, as_version=4)
    return "".join(o.get("text", "") for c in nb.cells for o in c.get("outputs", []))


def test_a_plain_papermill_kernel_writes_the_secret_to_its_history(ipythondir, tmp_path):
    # guards the tests below: without ragbench's flags the secret does reach history.sqlite
    import papermill

    out = tmp_path / "plain"
    out.mkdir()
    papermill.execute_notebook(
        str(tiny_notebook(tmp_path, PROJECT_KERNEL)),
        str(out / "plain.ipynb"),
        parameters={"base_url": URL},
        progress_bar=False,
    )
    assert "history: True" in _printed(out / "plain.ipynb")
    assert any("history.sqlite table history" in leak for leak in leaks(ipythondir))
    assert URL in (out / "plain.ipynb").read_text()  # and the papermill CLI's notebook holds it


@pytest.mark.parametrize("kernel", [PROJECT_KERNEL, "python3"])
def test_execute_notebook_keeps_no_history(ipythondir, tmp_path, kernel):
    out = tmp_path / "out"
    execute_notebook(
        tiny_notebook(tmp_path, kernel),
        out / "tiny.ipynb",
        parameters={"base_url": URL},
        progress_bar=False,
    )
    printed = _printed(out / "tiny.ipynb")
    assert "history: False" in printed and f"url: {MASKED}" in printed  # the secret went in
    assert leaks(ipythondir) == [] and leaks(out) == []


def test_a_sweep_keeps_no_history(ipythondir, tmp_path):
    """Two points in two spawned workers, on the project's kernel (nbclient keeps history in
    memory only for kernels named python3)."""
    spec = tmp_path / "sweep.yaml"
    spec.write_text(
        yaml.safe_dump(
            {
                "notebook": str(SWEEP_PROBE),
                "output_dir": str(tmp_path / "out"),
                "kernel": PROJECT_KERNEL,
                "parameters": {"base_url": URL, "api_key": "none"},
                "grid": {"x": [1, 2]},
            }
        ),
        encoding="utf-8",
    )
    outcome = execute_sweep(spec, workers=2)
    assert [p.status for p in outcome.points] == ["done", "done"]
    assert all(f"connecting to {MASKED}" in _printed(Path(p.notebook)) for p in outcome.points)
    assert ipythondir.exists()  # the kernels did start there
    assert leaks(ipythondir) == [] and leaks(tmp_path / "out") == []


def test_history_flags_go_to_ipython_kernels_only(tmp_path, monkeypatch):
    assert is_ipython_kernel([sys.executable, "-m", "ipykernel_launcher", "-f", "{cf}"])
    assert is_ipython_kernel(["python", "-m", "ipykernel", "-f", "{cf}"])
    assert not is_ipython_kernel(["R", "--slave", "-e", "IRkernel::main()", "--args", "{cf}"])
    spec = tmp_path / "kernels" / "not-ipython"
    spec.mkdir(parents=True)
    argv = ["R", "--slave", "-e", "IRkernel::main()", "--args", "{connection_file}"]
    (spec / "kernel.json").write_text(json.dumps({"argv": argv, "display_name": "R"}))
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path))
    assert history_off_arguments("not-ipython", ["--x"]) == ["--x"]
    assert history_off_arguments(PROJECT_KERNEL, ["--x"]) == ["--x", *HISTORY_OFF]
    assert history_off_arguments(PROJECT_KERNEL, list(HISTORY_OFF)) == list(HISTORY_OFF)


@pytest.mark.slow  # starts a jupyter server and a kernel
def test_jupyter_server_kernels_keep_no_history_with_the_lab_flags(tmp_path):
    """`make lab` passes kernel_cli_args() to JupyterLab's server: its kernels run with history
    off, even for code sent with ``store_history`` (as a notebook's cells are)."""
    import asyncio
    import socket
    import subprocess
    import time
    import urllib.request
    import uuid

    from tornado.websocket import websocket_connect

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    base, token = f"127.0.0.1:{port}", uuid.uuid4().hex
    ipythondir = tmp_path / "ipython"
    env = {
        **os.environ,
        "JUPYTER_RUNTIME_DIR": str(tmp_path / "runtime"),
        "IPYTHONDIR": str(ipythondir),
    }
    log = (tmp_path / "server.log").open("w")
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "jupyter_server",
            "--no-browser",
            "--allow-root",
            f"--port={port}",
            f"--IdentityProvider.token={token}",
            f"--ServerApp.root_dir={tmp_path}",
            *kernel_cli_args(),
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
    )
    auth = {"Authorization": f"token {token}"}

    def api(method: str, path: str, body: bytes | None = None) -> bytes:
        request = urllib.request.Request(f"http://{base}/api{path}", body, auth, method=method)
        return urllib.request.urlopen(request).read()

    async def run(kernel: str, code: str) -> str:
        ws = await websocket_connect(f"ws://{base}/api/kernels/{kernel}/channels?token={token}")
        header = {
            "msg_id": uuid.uuid4().hex,
            "session": uuid.uuid4().hex,
            "username": "t",
            "msg_type": "execute_request",
            "version": "5.3",
            "date": "",
        }
        content = {
            "code": code,
            "silent": False,
            "store_history": True,
            "user_expressions": {},
            "allow_stdin": False,
        }
        message = {"header": header, "parent_header": {}, "metadata": {}, "channel": "shell"}
        await ws.write_message(json.dumps({**message, "content": content}))
        while True:
            reply = await asyncio.wait_for(ws.read_message(), 60)
            if isinstance(reply, str) and json.loads(reply).get("msg_type") == "stream":
                return json.loads(reply)["content"]["text"]

    try:
        for _ in range(120):  # the server is up when its API answers
            try:
                api("GET", "")
                break
            except OSError:
                time.sleep(0.5)
        for name in (PROJECT_KERNEL, "python3"):
            kernel = json.loads(api("POST", "/kernels", json.dumps({"name": name}).encode()))["id"]
            printed = asyncio.run(run(kernel, f"base_url = {URL!r}\n{PROBE}"))
            assert "history: False" in printed and PASSWORD in printed, name
            api("DELETE", f"/kernels/{kernel}")  # a kernel writes its history when it ends
    finally:
        server.terminate()
        server.wait(30)
        log.close()
    assert ipythondir.exists()
    assert leaks(ipythondir) == []
