"""Notebooks run by ragbench (make demo, sweeps) talk to their kernel over CurveZMQ-encrypted
sockets, so ipykernel has no "running over TCP without encryption" warning to print."""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest

from ragbench.workspace.kernels import (
    execute_notebook,
    kernel_cli_args,
    kernel_config,
    lab_cli_args,
)

WARNING = "without encryption"
PROBE = (
    "from ipykernel.kernelapp import IPKernelApp\n"
    "print('encrypted:', IPKernelApp.instance().curve_secretkey is not None)"
)


@pytest.fixture
def probe(tmp_path):
    path = tmp_path / "probe.ipynb"
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(PROBE)])
    nb.metadata["kernelspec"] = {
        "name": "python3",
        "display_name": "Python 3",
        "language": "python",
    }
    nbformat.write(nb, path)
    return path


def _stdout(path) -> str:
    nb = nbformat.read(path, as_version=4)
    return "".join(o.get("text", "") for o in nb.cells[0].outputs)


def test_execute_notebook_starts_an_encrypted_kernel(probe, tmp_path, capfd):
    import papermill

    if not kernel_config():
        pytest.skip("this jupyter_client or pyzmq cannot provision CurveZMQ keys")
    papermill.execute_notebook(str(probe), str(tmp_path / "plain.ipynb"), progress_bar=False)
    plain_err = capfd.readouterr().err
    assert "encrypted: False" in _stdout(tmp_path / "plain.ipynb")  # papermill's default

    execute_notebook(probe, tmp_path / "ours.ipynb", progress_bar=False)
    ours_err = capfd.readouterr().err
    assert "encrypted: True" in _stdout(tmp_path / "ours.ipynb")
    assert WARNING not in ours_err
    if WARNING not in plain_err:
        pytest.skip("this ipykernel does not warn about unencrypted TCP (the keys are checked)")


@pytest.mark.slow  # starts a jupyter server and a kernel
def test_jupyter_server_kernels_are_encrypted_with_the_lab_flags(tmp_path):
    """`make lab` passes kernel_cli_args() to JupyterLab's server: its kernels run encrypted and the
    server still talks to them (an execute request over the kernel websocket gets its output)."""
    import asyncio
    import json
    import os
    import socket
    import subprocess
    import sys
    import time
    import urllib.request
    import uuid

    from tornado.websocket import websocket_connect

    if not kernel_config():
        pytest.skip("this jupyter_client or pyzmq cannot provision CurveZMQ keys")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    base, token = f"127.0.0.1:{port}", uuid.uuid4().hex
    env = {**os.environ, "JUPYTER_RUNTIME_DIR": str(tmp_path / "runtime")}
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
    try:
        for _ in range(120):  # the server is up when its API answers
            try:
                urllib.request.urlopen(urllib.request.Request(f"http://{base}/api", headers=auth))
                break
            except OSError:
                time.sleep(0.5)
        post = urllib.request.Request(
            f"http://{base}/api/kernels", data=b'{"name": "python3"}', headers=auth, method="POST"
        )
        kernel = json.load(urllib.request.urlopen(post))["id"]

        async def run(code: str) -> str:
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
                "store_history": False,
                "user_expressions": {},
                "allow_stdin": False,
            }
            message = {"header": header, "parent_header": {}, "metadata": {}, "channel": "shell"}
            await ws.write_message(json.dumps({**message, "content": content}))
            while True:
                reply = await asyncio.wait_for(ws.read_message(), 60)
                if isinstance(reply, str) and json.loads(reply).get("msg_type") == "stream":
                    return json.loads(reply)["content"]["text"]

        assert "encrypted: True" in asyncio.run(run(PROBE))
    finally:
        server.terminate()
        server.wait(30)
        log.close()
    assert WARNING not in (tmp_path / "server.log").read_text()


def test_make_lab_allows_root_only_as_root():
    """Jupyter refuses to start as root without ``--allow-root`` (CI, most containers run as
    root): ``make lab`` adds it there, and only there."""
    assert lab_cli_args(uid=0) == [*kernel_cli_args(), "--allow-root"]
    assert lab_cli_args(uid=1000) == kernel_cli_args()
    assert "--allow-root" not in kernel_cli_args()  # papermill's and the tests' servers: as given
    makefile = (Path(__file__).parents[1] / "Makefile").read_text(encoding="utf-8")
    recipe = makefile.split("\nlab:", 1)[1].split("\n\n", 1)[0]
    assert "import lab_cli_args" in recipe and "$(LAB_ARGS)" in recipe
