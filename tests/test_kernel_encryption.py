"""Notebooks run by ragbench (make demo, sweeps) talk to their kernel over CurveZMQ-encrypted
sockets, so ipykernel has no "running over TCP without encryption" warning to print."""

from __future__ import annotations

import nbformat
import pytest

from ragbench.sweep import execute_notebook, kernel_config

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
