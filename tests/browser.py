"""Headless Chromium for the tests: a screenshot of a rendered page, and how its tables lie.

Only the tests look at pages in a browser (the slow ones run ``table_layout`` on every notebook's
page at 1,000 px), so these helpers live here, beside them, not in the library."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterator, Sequence
from html import unescape
from pathlib import Path
from typing import Any

CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",  # no calls home: the page must stand alone
    "--disable-component-update",
    "--disable-sync",
)


def _chromium(args: Sequence[str], chromium: str, timeout: float) -> str:
    """Headless Chromium with a throwaway profile; its stdout."""
    exe = shutil.which(chromium)
    if exe is None:
        raise FileNotFoundError(f"{chromium!r} not found; install Debian's chromium package")
    with tempfile.TemporaryDirectory(prefix="ragbench-chromium-") as profile:
        done = subprocess.run(
            [exe, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *args],
            check=True,
            capture_output=True,
            timeout=timeout,
            text=True,
        )
    return done.stdout


def screenshot_html(
    html: str | os.PathLike,
    png: str | os.PathLike,
    chromium: str = "chromium",
    window: tuple[int, int] = (1200, 1600),
    timeout: float = 120,
) -> Path:
    """A PNG of a rendered page as headless Chromium shows it (a preview, and the browser test)."""
    png = Path(png)
    _chromium(
        [
            f"--screenshot={png}",
            f"--window-size={window[0]},{window[1]}",
            Path(html).resolve().as_uri(),
        ],
        chromium,
        timeout,
    )
    return png


# appended to a copy of the page: once laid out, it writes what it measured into the DOM, which
# --dump-dom prints. A cell is bad when it reads inf, nan or <NA> (as a word) instead of a number
_LAYOUT_JS = r"""<script>window.addEventListener("load", () => {
  const bad = /(^|[^\w])[-+]?(inf|infinity|nan)([^\w]|$)|<NA>/i, root = document.documentElement;
  const tables = [...document.querySelectorAll("table")].map((t, i) => ({index: i,
    header: (t.tHead || t).textContent.replace(/\s+/g, " ").trim().slice(0, 120),
    width: t.scrollWidth, container: t.parentElement.clientWidth,
    right: Math.round(t.getBoundingClientRect().right),
    bad_cells: [...t.querySelectorAll("td")].map(c => c.textContent.trim()).filter(x => bad.test(x))}));
  const out = document.createElement("pre");
  out.id = "ragbench-table-layout";
  out.textContent = JSON.stringify({viewport: root.clientWidth, page: root.scrollWidth, tables});
  document.body.appendChild(out);
});</script>"""


def _with_layout_probe(html: str | os.PathLike, folder: str | os.PathLike) -> Path:
    """A copy of the page in ``folder`` that writes its tables' layout into its DOM once loaded."""
    page = Path(html).read_text(encoding="utf-8")
    probe = (
        page.replace("</body>", _LAYOUT_JS + "</body>") if "</body>" in page else page + _LAYOUT_JS
    )
    copy = Path(folder) / Path(html).name
    copy.write_text(probe, encoding="utf-8")
    return copy


def table_layout(
    html: str | os.PathLike,
    chromium: str = "chromium",
    window: tuple[int, int] = (1200, 1600),
    timeout: float = 120,
) -> dict[str, Any]:
    """How a rendered page's tables lie in headless Chromium at ``window``: ``viewport`` and
    ``page`` widths (a page wider than its viewport scrolls sideways) and per table its
    ``width`` (``scrollWidth``), its ``container``'s ``clientWidth`` (a wider table is clipped
    or scrolls), its ``right`` edge, the start of its ``header`` text and ``bad_cells``: cells
    that read ``inf``, ``nan`` or ``<NA>`` where a reader expects a number or a word."""
    with tempfile.TemporaryDirectory(prefix="ragbench-layout-") as folder:
        copy = _with_layout_probe(html, folder)
        dom = _chromium(
            [
                "--dump-dom",
                "--run-all-compositor-stages-before-draw",
                "--virtual-time-budget=10000",
                f"--window-size={window[0]},{window[1]}",
                copy.as_uri(),
            ],
            chromium,
            timeout,
        )
    found = re.search(r'<pre id="ragbench-table-layout">(.*?)</pre>', dom, re.S)
    if found is None:
        raise RuntimeError(f"{html}: the layout check did not run in {chromium}")
    return json.loads(unescape(found.group(1)))


@contextlib.contextmanager
def chromium_page(
    url: str, chromium: str = "/usr/bin/chromium", window: tuple[int, int] = (1400, 1000)
) -> Iterator[Any]:
    """A Playwright page on the system's Chromium (no browser download), opened at ``url``;
    console errors and uncaught exceptions are collected in ``page.errors``."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, args=list(CHROMIUM_FLAGS[1:]))
        try:
            page = browser.new_page(viewport={"width": window[0], "height": window[1]})
            page.errors = []
            page.on("pageerror", lambda exc: page.errors.append(str(exc)))
            page.on("console", lambda m: page.errors.append(m.text) if m.type == "error" else None)
            page.goto(url)
            yield page
        finally:
            browser.close()


@contextlib.contextmanager
def table_layouts(chromium: str = "/usr/bin/chromium") -> Iterator[Any]:
    """``table_layout`` for many pages from one browser: yields ``measure(html, window)``, which
    gives what ``table_layout(html, window=window)`` gives (the same probe, read once the page
    has loaded; scrollbars shown, as the command line's headless Chromium shows them: the same
    ``viewport`` width), without starting Chromium for each page (a second or two each)."""
    from playwright.sync_api import sync_playwright

    with (
        tempfile.TemporaryDirectory(prefix="ragbench-layout-") as folder,
        sync_playwright() as pw,
    ):
        browser = pw.chromium.launch(
            executable_path=chromium,
            args=list(CHROMIUM_FLAGS[1:]),
            ignore_default_args=["--hide-scrollbars"],
        )

        def measure(html: str | os.PathLike, window: tuple[int, int]) -> dict[str, Any]:
            page = browser.new_page(viewport={"width": window[0], "height": window[1]})
            try:
                page.goto(_with_layout_probe(html, folder).as_uri(), wait_until="load")
                page.wait_for_selector("#ragbench-table-layout", state="attached")
                return json.loads(page.inner_text("#ragbench-table-layout"))
            finally:
                page.close()

        try:
            yield measure
        finally:
            browser.close()
