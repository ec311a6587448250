"""JupyterLab as a user meets it: ``make lab`` started (as root here, as in CI and most
containers), notebook 08 opened and run in headless Chromium, and its per-question view seen
with its rows. JupyterLab 4 renders only the cells in view, so the test scrolls to the view."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from browser import chromium_page
from playwright.sync_api import TimeoutError as PlaywrightTimeout

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = Path("/usr/bin/chromium")

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not CHROMIUM.exists(), reason="needs /usr/bin/chromium"),
    pytest.mark.skipif(shutil.which("make") is None, reason="needs make"),
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_for(url: str, proc: subprocess.Popen, seconds: float = 120) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise AssertionError(f"make lab exited {proc.returncode}: {proc.stdout.read()}")
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except OSError:
            time.sleep(0.5)
    raise AssertionError(f"JupyterLab did not answer {url} within {seconds} s")


@pytest.fixture
def lab(tmp_path):
    """``make lab`` serving a folder that holds a copy of notebook 08 (its runs go there)."""
    (tmp_path / "notebooks").mkdir()
    shutil.copy(ROOT / "notebooks" / "08_explore_runs.ipynb", tmp_path / "notebooks")
    port = _free_port()
    venv = Path(sys.prefix)
    args = (
        f"--port={port} --no-browser --ServerApp.ip=127.0.0.1 --IdentityProvider.token= "
        "--ServerApp.password= --ServerApp.disable_check_xsrf=True"
    )
    proc = subprocess.Popen(
        # the repo's Makefile run in the served folder (make lab serves "."), the environment as
        # built (-o: make does not re-run setup)
        [
            "make",
            "-f",
            str(ROOT / "Makefile"),
            "lab",
            f"VENV={venv}",
            "-o",
            str(venv / ".ragbench-setup"),
            f"LAB_ARGS={args}",
        ],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"},
    )
    try:
        _wait_for(f"http://127.0.0.1:{port}/api", proc)
        yield f"http://127.0.0.1:{port}"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)


def test_make_lab_runs_the_explore_notebook_and_shows_its_rows(lab):
    url = f"{lab}/lab/tree/notebooks/08_explore_runs.ipynb"
    with chromium_page(url, window=(1400, 1000)) as page:
        page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=120000)
        page.wait_for_selector(
            ".jp-Notebook-ExecutionIndicator[data-status='idle']", timeout=120000
        )
        for _ in range(3):  # a Run All sent while the kernel still connects can be lost: again
            page.click(".jp-Notebook .jp-Cell >> nth=1")  # focus the notebook
            # the menu bar's Run menu, then its item (exact labels: "runs" is in the notebook)
            menu = page.locator(".lm-MenuBar-itemLabel", has_text=re.compile(r"^Run$"))
            menu.click(timeout=60000)
            item = page.locator(".lm-Menu-itemLabel", has_text=re.compile(r"^Run All Cells$"))
            item.click(timeout=60000)
            try:  # a cell that ran (or runs) shows its count: [1], [*]
                ran = page.locator(".jp-InputPrompt", has_text=re.compile(r"\[(\d+|\*)\]"))
                ran.first.wait_for(timeout=60000)
                break
            except PlaywrightTimeout:
                continue
        view = ".rbv[data-loaded='1']"
        panel = page.locator(".jp-WindowedPanel-outer").first
        deadline = time.monotonic() + 600
        while not page.locator(view).count() and time.monotonic() < deadline:
            # cells render only in view: sweep down the notebook (again, while cells still run)
            panel.evaluate("el => el.scrollTo(0, 0)")
            for _ in range(40):
                if page.locator(view).count():
                    break
                panel.evaluate("el => el.scrollBy(0, el.clientHeight / 2)")
                time.sleep(0.25)
        page.wait_for_selector(view, state="attached", timeout=10000)
        rows = page.locator(".rbv-table tbody tr:not(:has(> td[colspan]))")
        assert rows.count() == 10  # 2 lengths x 5 depths: one row per question
        assert "What is the best thing to do in San Francisco?" in rows.first.inner_text()
        # the run comparison printed below it: the settings that differ between the two runs
        page.locator(".jp-WindowedPanel-outer").first.evaluate("el => el.scrollTo(0, 1e9)")
        page.wait_for_selector("text=retrieval.chunk_size: 64 -> 32", timeout=120000)
