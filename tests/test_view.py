"""The per-question view (``ragbench view``, ``report.explore``) on real fake-backend runs, driven
in headless Chromium: its rows, search, the outcome filters (whose counts must equal the paired
table's a_only / b_only), an expanded row's chunks, a folder moved elsewhere, a folder written
before chunk texts were kept, and two views on one page."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from browser import chromium_page

import ragbench
from ragbench import report
from ragbench.experiment.evidence import CHUNKS, QUESTIONS, read_chunks
from ragbench.report.explore import explore, view_html, view_payload, write_view

CHROMIUM = Path("/usr/bin/chromium")
needs_chromium = pytest.mark.skipif(not CHROMIUM.exists(), reason="needs /usr/bin/chromium")

CONFIG = {
    "name": "viewtest",
    "seed": 0,
    "dataset": {
        "name": "niah",
        "params": {
            "context_lengths": [500, 2000],
            "depth_percents": [10, 50, 90],
            "needle": "\nThe special magic number is 7463343.\n",
            "question": "What is the special magic number mentioned in the text?",
            "answer": "7463343",
            "tokenizer": "whitespace",
        },
    },
    "model": {"backend": "fake", "name": "fake", "preset": "smollm2-135m-instruct", "cache": False},
    "retrieval": {
        "embedder": "hash",
        "retriever": "dense",
        "chunk_size": 64,
        "chunk_overlap": 8,
        "tokenizer": "whitespace",
    },
    "strategies": ["closed_book", "long_context", {"name": "rag", "params": {"top_k": [1, 4]}}],
    "metrics": ["string_match_all", "contains"],
    "price_sheet": "example-hosted-api",
}
RAG1 = "rag k=1 embedder=hash chunk=64 overlap=8"
RAG4 = "rag k=4 embedder=hash chunk=64 overlap=8"
# a question's row (an expanded row's detail and "no matching records" are one cell spanning all)
ROWS = ".rbv-table tbody tr:not(:has(> td[colspan]))"


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("runs")
    df = ragbench.run({**CONFIG, "output_dir": str(out)}, progress=False)
    return Path(df.attrs["run_dir"])


def test_the_run_folder_keeps_questions_and_each_chunk_once(run_dir):
    questions = pd.read_parquet(run_dir / QUESTIONS)
    assert len(questions) == 6
    assert set(questions["question"]) == {CONFIG["dataset"]["params"]["question"]}
    lines = (run_dir / CHUNKS).read_text(encoding="utf-8").splitlines()
    refs = [json.loads(line)["ref"] for line in lines]
    assert len(refs) == len(set(refs))  # each chunk once
    chunks = read_chunks(run_dir)
    df = ragbench.load(run_dir)
    rag = df[df["label"] == RAG4]
    for ids, refs_, scores in zip(
        rag["retrieved"], rag["retrieved_refs"], rag["retrieved_scores"], strict=True
    ):
        assert len(ids) == len(refs_) == len(scores) == 4
        assert list(scores) == sorted(scores, reverse=True)  # rank order
        for cid, ref in zip(ids, refs_, strict=True):
            assert chunks[ref]["doc_id"] == cid.rsplit("#", 1)[0]
    # the needle's chunk is the gold one, and its stored text holds the needle
    gold_texts = [chunks[r[0]]["text"] for r in rag["gold_refs"]]
    assert all("7463343" in t for t in gold_texts)
    assert "chunk_texts" not in df.columns  # the texts never reach the table


def test_load_of_two_runs_names_each_label_by_its_run(run_dir, tmp_path):
    other = tmp_path / "copy-of-run"
    shutil.copytree(run_dir, other)
    both = ragbench.load([run_dir, other])
    assert len(both) == 2 * len(ragbench.load(run_dir))
    assert set(both["run"]) == {run_dir.name, "copy-of-run"}
    assert f"copy-of-run: {RAG1}" in set(both["label"])
    assert not both.duplicated(["example_id", "label"]).any()


def test_payload_pairs_each_question_with_every_variant(run_dir):
    payload = view_payload(ragbench.load(run_dir))
    assert [v["label"] for v in payload["variants"]] == [
        "closed_book",
        "long_context",
        RAG1,
        RAG4,
    ]
    assert len(payload["questions"]) == 6
    q = payload["questions"][0]
    assert q["q"].startswith("What is the special magic number")
    assert q["a"] == ["7463343"]
    rag = q["c"][3]["ev"]["r"]
    assert len(rag) == 4 and all(ref in payload["chunks"] for ref, *_ in rag)
    assert q["c"][1]["ev"]["lc"]["kept_tokens"] > 0  # long context's kept tokens


@needs_chromium
def test_the_page_filters_searches_and_expands_in_chromium(run_dir, tmp_path):
    page_path = tmp_path / "view.html"
    done = subprocess.run(
        [sys.executable, "-m", "ragbench.cli", "view", str(run_dir), "--out", str(page_path)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    html = page_path.read_text(encoding="utf-8")
    assert "http://" not in html.replace("http://www.w3.org", "")  # nothing to fetch
    paired = report.compare(ragbench.load(run_dir), labels=[RAG4, RAG1])
    row = paired.iloc[0]
    a_only, b_only = int(row["a_only"]), int(row["b_only"])
    assert a_only > 0  # k=4 finds needles that k=1 misses: the filter has rows to show
    with chromium_page(page_path.as_uri()) as page:
        page.wait_for_selector(".rbv[data-loaded='1']", state="attached", timeout=20000)
        assert page.locator(ROWS).count() == 6
        page.select_option("select[data-filter='A']", label=RAG4)
        page.select_option("select[data-filter='B']", label=RAG1)
        options = page.locator("select[data-filter='outcome'] option").all_inner_texts()
        assert f"A right, B wrong ({a_only})" in options
        assert f"B right, A wrong ({b_only})" in options
        page.select_option("select[data-filter='outcome']", "a_only")
        assert page.locator(ROWS).count() == a_only
        # expand: RAG k=4's chunks with their text, the gold one marked
        page.click(".rbv-table tbody tr:first-child td:nth-child(2)")
        detail = page.locator(".rbv-detail").inner_text()
        assert "7463343" in detail and "gold" in detail and "score" in detail
        assert "retrieved (rank order)" in detail
        page.select_option("select[data-filter='outcome']", "all")
        page.fill("input[data-filter='search']", "niah-L500-D10")  # a question's id
        assert page.locator(ROWS).count() == 1
        page.fill("input[data-filter='search']", "no such text anywhere")
        assert page.locator(".rbv-table tbody tr td.dt-empty").count() == 1
        page.fill("input[data-filter='search']", "unanswerable")  # closed book's answers
        assert page.locator(ROWS).count() == 6
        page.check("input[data-filter='regex']")
        page.fill("input[data-filter='search']", "^What is the special magic number")
        assert page.locator(ROWS).count() == 6
        assert page.errors == []


@needs_chromium
def test_a_folder_moved_elsewhere_views_and_an_old_folder_says_what_it_lacks(run_dir, tmp_path):
    moved = tmp_path / "elsewhere" / "run"
    shutil.copytree(run_dir, moved)
    payload = view_payload(ragbench.load(moved))
    assert payload["missing"] == [] and len(payload["chunks"]) > 0
    (moved / CHUNKS).unlink()
    (moved / QUESTIONS).unlink()
    old = view_payload(ragbench.load(moved))
    assert old["missing"] == [f"run: question texts ({QUESTIONS}), chunk texts ({CHUNKS})"]
    assert old["chunks"] == {}
    page = write_view(moved, tmp_path / "old.html")
    with chromium_page(page.as_uri()) as browser:
        browser.wait_for_selector(".rbv[data-loaded='1']", state="attached", timeout=20000)
        assert "Not in the run folder" in browser.locator(".rbv-missing").inner_text()
        browser.click(".rbv-table tbody tr:first-child td:nth-child(2)")
        assert "text not stored in this run folder" in browser.locator(".rbv-detail").inner_text()
        assert browser.errors == []


@needs_chromium
def test_two_views_on_one_page_keep_their_own_filters(run_dir, tmp_path):
    first = explore(run_dir)._repr_html_()
    second = explore(run_dir)._repr_html_()
    page = tmp_path / "two.html"
    page.write_text(f"<html><body>{first}<hr>{second}</body></html>", encoding="utf-8")
    with chromium_page(page.as_uri()) as browser:
        browser.wait_for_function(
            "document.querySelectorAll(\".rbv[data-loaded='1']\").length === 2", timeout=20000
        )
        views = browser.locator(".rbv")
        views.nth(0).locator("select[data-filter='A']").select_option(label=RAG4)
        views.nth(0).locator("select[data-filter='B']").select_option(label=RAG1)
        views.nth(0).locator("select[data-filter='outcome']").select_option("a_only")
        assert views.nth(0).locator(ROWS).count() < 6
        assert views.nth(1).locator(ROWS).count() == 6  # the other view is untouched
        assert browser.errors == []


def test_view_of_a_path_that_is_not_a_run_folder_is_one_line(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "ragbench.cli", "view", str(tmp_path)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 2
    assert done.stderr.strip().startswith("error: ") and "no results.parquet" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


def test_text_that_closes_a_script_stays_data(run_dir):
    df = ragbench.load(run_dir)
    df.loc[df.index[0], "prediction"] = "</script><script>alert(1)</script>"
    page = view_html(df)
    assert "</script><script>alert(1)" not in page


@needs_chromium
def test_a_rendered_notebook_keeps_both_its_views_working(run_dir, tmp_path):
    import nbformat

    from ragbench.workspace.kernels import execute_notebook
    from ragbench.workspace.render import render_notebook

    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {
        "name": "ragbench",
        "display_name": "ragbench",
        "language": "python",
    }
    nb.cells = [
        nbformat.v4.new_code_cell(f"import ragbench\nruns = [{str(run_dir)!r}]"),
        nbformat.v4.new_code_cell("ragbench.explore(runs[0])"),
        nbformat.v4.new_code_cell("ragbench.explore(ragbench.load(runs[0]), metric='contains')"),
    ]
    source = tmp_path / "explore.ipynb"
    nbformat.write(nb, source)
    executed = execute_notebook(source, tmp_path / "executed.ipynb", cwd=str(tmp_path))
    assert executed is not None
    page = render_notebook(tmp_path / "executed.ipynb", tmp_path / "executed.html")
    with chromium_page(page.as_uri()) as browser:
        browser.wait_for_function(
            "document.querySelectorAll(\".rbv[data-loaded='1']\").length === 2", timeout=30000
        )
        views = browser.locator(".rbv")
        assert views.nth(0).locator(ROWS).count() == 6
        assert views.nth(1).locator(ROWS).count() == 6
        views.nth(1).locator("tbody tr").first.locator("td").nth(1).click()
        assert "retrieved (rank order)" in views.nth(1).locator(".rbv-detail").inner_text()
        assert browser.errors == []


@needs_chromium
def test_diff_html_starts_on_the_first_pair_and_counts_its_flips(run_dir, tmp_path):
    other = ragbench.run(
        {
            **CONFIG,
            "retrieval": {**CONFIG["retrieval"], "chunk_size": 32},
            "output_dir": str(tmp_path / "runs"),
        },
        progress=False,
    )
    run_b = Path(other.attrs["run_dir"])
    page_path = tmp_path / "diff.html"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "ragbench.cli",
            "diff",
            str(run_dir),
            str(run_b),
            "--json",
            "--html",
            str(page_path),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    pairs = json.loads(done.stdout)["pairs"]  # stdout stays JSON with --html
    first = pairs[0]
    with chromium_page(page_path.as_uri()) as page:
        page.wait_for_selector(".rbv[data-loaded='1']", state="attached", timeout=20000)
        a = page.locator("select[data-filter='A'] option:checked").inner_text()
        b = page.locator("select[data-filter='B'] option:checked").inner_text()
        assert a == f"{run_dir.name}: {first['a_label']}"
        assert b == f"{run_b.name}: {first['b_label']}"
        options = page.locator("select[data-filter='outcome'] option").all_inner_texts()
        assert f"A right, B wrong ({len(first['a_only'])})" in options
        assert f"B right, A wrong ({len(first['b_only'])})" in options
        for pair in pairs:  # every pair's flips, as the page counts them
            page.select_option(
                "select[data-filter='A']", label=f"{run_dir.name}: {pair['a_label']}"
            )
            page.select_option("select[data-filter='B']", label=f"{run_b.name}: {pair['b_label']}")
            page.select_option("select[data-filter='outcome']", "b_only")
            shown = page.locator(ROWS).all()
            ids = sorted(row.locator("td").first.inner_text() for row in shown)
            assert ids == sorted(pair["b_only"]), pair
        assert page.errors == []
