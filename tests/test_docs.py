"""`ragbench data docs`: real files written by real writers (fpdf2, python-docx) -> a corpus."""

from __future__ import annotations

import bisect
import json
import logging
import os
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from ragbench.cli.data import register
from ragbench.datasets.corpus import docs
from ragbench.datasets.corpus.cleaning import clean_text
from ragbench.datasets.corpus.file import corpus_fingerprint, read_documents
from ragbench.io import sha256_file
from ragbench.types import Document

PDF_PAGES = (
    "The harbour master is Ben Marsh.\nThe spring tide reaches 4.2 metres.",
    "Page two: the neap tide is 1.9 metres.\nThe lighthouse keeper is Ada Quill.",
)
HTML = """<!doctype html>
<html><head><title>The Lighthouse</title><style>p { color: red }</style>
<script>var secret = "not text";</script></head>
<body><h1>Lighthouse  history</h1>
<!-- a comment, not text -->
<p>Built in
   1871, the <b>white</b> tower is 31&nbsp;metres tall.</p>
<ul><li>First keeper: Tom Reed</li><li>Last keeper: Ada Quill</li></ul>
<table><tr><th>Year</th><th>Event</th></tr><tr><td>1990</td><td>Automated</td></tr></table>
</body></html>
"""
MARKDOWN = """---
title: Ferry notes
author: someone
---
# Ferries

The first ferry leaves at **06:40** from pier 3.
"""
TEXT = "Plain notes.\r\nThe island has 212 residents.\n"


def write_pdf(path: Path, pages=PDF_PAGES, title="Tide Report") -> Path:
    from fpdf import FPDF

    pdf = FPDF()
    pdf.set_title(title)
    pdf.set_font("Helvetica", size=12)
    for page in pages:
        pdf.add_page()
        pdf.multi_cell(0, 8, page)
    pdf.output(str(path))
    return path


def write_docx(path: Path) -> Path:
    import docx

    d = docx.Document()
    d.add_paragraph("Harbour rules", style="Title")
    d.add_paragraph("Boats must moor at the east quay after 22:00.")
    d.add_paragraph("")  # an empty paragraph leaves no trace in the text
    table = d.add_table(rows=2, cols=2)
    for (r, c), value in {(0, 0): "Berth", (0, 1): "Fee", (1, 0): "A1", (1, 1): "12 EUR"}.items():
        table.cell(r, c).text = value
    d.add_paragraph("Fees are paid at the office.")
    d.save(str(path))
    return path


def build_folder(root: Path) -> Path:
    """A folder like a user's: one file per format, a broken one, an image, a hidden file."""
    root.mkdir(parents=True, exist_ok=True)
    write_pdf(root / "guide.pdf")
    (root / "page.html").write_text(HTML, encoding="utf-8")
    (root / "notes.md").write_text(MARKDOWN, encoding="utf-8")
    write_docx(root / "rules.docx")
    (root / "sub").mkdir(exist_ok=True)
    (root / "sub" / "island.txt").write_bytes(TEXT.encode("utf-8"))
    (root / "broken.docx").write_bytes(b"this is not a zip archive")
    (root / "photo.png").write_bytes(b"\x89PNG\r\n\x1a\n")
    (root / ".hidden.md").write_text("hidden", encoding="utf-8")
    return root


@pytest.fixture()
def folder(tmp_path) -> Path:
    return build_folder(tmp_path / "docs")


def _by_id(result) -> dict:
    return {d.id: d for d in result.documents}


def test_one_document_per_readable_file_with_the_right_text(folder):
    result = docs.ingest([folder])
    got = _by_id(result)
    assert list(got) == ["guide.pdf", "notes.md", "page.html", "rules.docx", "sub/island.txt"]

    html = got["page.html"]
    assert html.title == "The Lighthouse"
    assert html.text == (
        "Lighthouse history\n\n"
        "Built in 1871, the white tower is 31 metres tall.\n\n"
        "First keeper: Tom Reed\nLast keeper: Ada Quill\n\n"
        "Year | Event\n1990 | Automated"
    )  # no script, style or comment; NBSP -> space by cleaning
    md = got["notes.md"]
    assert md.title == "Ferry notes"  # from the front matter, which is not in the text
    assert md.text == "# Ferries\n\nThe first ferry leaves at **06:40** from pier 3."
    word = got["rules.docx"]
    assert word.title == "Harbour rules"
    assert word.text == (
        "Harbour rules\n\nBoats must moor at the east quay after 22:00.\n\n"
        "Berth | Fee\nA1 | 12 EUR\n\nFees are paid at the office."
    )
    txt = got["sub/island.txt"]
    assert txt.text == "Plain notes.\nThe island has 212 residents." and txt.title == "island"

    pdf = got["guide.pdf"]
    assert pdf.title == "Tide Report"
    assert pdf.meta["pages"] == 2 and pdf.meta["format"] == "pdf"
    starts = pdf.meta["page_starts"]
    pages = [pdf.text[starts[0] : starts[1]].strip(), pdf.text[starts[1] :]]
    assert pages == list(PDF_PAGES)

    for d in result.documents:
        assert d.meta["source"] == d.id
        assert d.meta["sha256"] == sha256_file(folder / d.id)
        assert clean_text(d.text) == d.text  # already clean: offsets never move again

    # the broken file is reported with its reason; the image as unsupported; the hidden not at all
    assert [(s.path, s.unsupported) for s in result.skipped] == [
        ("photo.png", True),
        ("broken.docx", False),
    ]
    assert "zip" in result.skipped[1].reason
    assert result.files == 7
    assert result.fingerprint == corpus_fingerprint(result.documents)


def page_of(document: Document, offset: int) -> int | None:
    """1-based page holding character ``offset`` of a PDF document (its ``page_starts``); None
    for other formats."""
    starts = document.meta.get("page_starts")
    if not starts:
        return None
    if not 0 <= offset <= len(document.text):
        raise ValueError(f"offset {offset} is outside {document.id!r} ({len(document.text)})")
    return bisect.bisect_right(starts, offset)


def test_pdf_pages_map_offsets_back_to_page_numbers(folder):
    pdf = _by_id(docs.ingest([folder / "guide.pdf"]))["guide.pdf"]
    assert page_of(pdf, pdf.text.index("spring tide")) == 1
    assert page_of(pdf, pdf.text.index("neap tide")) == 2
    assert page_of(pdf, len(pdf.text)) == 2
    with pytest.raises(ValueError, match="outside"):
        page_of(pdf, len(pdf.text) + 1)
    md = docs.read_document(folder / "notes.md", "notes.md")
    assert page_of(md, 0) is None


def test_empty_pdf_pages_keep_their_page_numbers():
    text, starts = docs.assemble(["  first\u00a0page ", "", "third page\n\n\n"])
    assert text == "first page\n\nthird page"
    assert starts == [0, 12, 12]  # the empty page starts where the next text starts


def test_include_and_exclude_globs(folder):
    def ids(**kw):
        return sorted(d.id for d in docs.ingest([folder], **kw).documents)

    assert ids(include=["*.md", "*.txt"]) == ["notes.md", "sub/island.txt"]
    assert ids(include=["sub/**/*.txt"]) == ["sub/island.txt"]  # '**/' may match no folder
    assert ids(exclude=["sub"]) == ["guide.pdf", "notes.md", "page.html", "rules.docx"]
    assert ids(exclude=["*.pdf", "*.docx"]) == ["notes.md", "page.html", "sub/island.txt"]
    # excluded and not-included files are not reported: the user asked for that
    assert docs.ingest([folder], include=["*.md"]).skipped == []


def test_include_and_exclude_globs_ignore_case_as_file_types_do(tmp_path):
    (tmp_path / "Drafts").mkdir()
    for name in ("NOTES.MD", "guide.md", "Drafts/plan.md", "todo.TXT"):
        (tmp_path / name).write_text(f"Text of {name}.\n", encoding="utf-8")

    def ids(**kw):
        return sorted(d.id for d in docs.ingest([tmp_path], **kw).documents)

    assert ids(include=["*.md"]) == ["Drafts/plan.md", "NOTES.MD", "guide.md"]
    assert ids(include=["*.Txt"]) == ["todo.TXT"]
    assert ids(exclude=["drafts", "*.txt"]) == ["NOTES.MD", "guide.md"]


def test_several_paths_get_ids_relative_to_their_common_folder(tmp_path, folder):
    other = tmp_path / "more"
    other.mkdir()
    (other / "notes.md").write_text("# Other\n\nA different file with the same name.\n")
    result = docs.ingest([folder / "sub", other, folder / "notes.md"])
    assert [d.id for d in result.documents] == [
        "docs/notes.md",
        "docs/sub/island.txt",
        "more/notes.md",
    ]


def test_duplicates_are_dropped_and_reported(folder):
    (folder / "copy.md").write_text(MARKDOWN.replace("Ferry notes", "Copy"), encoding="utf-8")
    result = docs.ingest([folder], include=["*.md"])
    assert [d.id for d in result.documents] == ["copy.md"]  # id order: the first is kept
    assert result.dedup["dropped"][0] | {"jaccard": None} == {
        "id": "notes.md",
        "reason": "exact",
        "duplicate_of": "copy.md",
        "jaccard": None,
    }


def test_non_utf8_and_scanned_pdf_are_reported_not_guessed(tmp_path):
    (tmp_path / "latin.txt").write_bytes("café au lait".encode("latin-1"))
    write_pdf(tmp_path / "scan.pdf", pages=("",), title="")
    (tmp_path / "ok.txt").write_text("fine", encoding="utf-8")
    result = docs.ingest([tmp_path])
    reasons = {s.path: s.reason for s in result.skipped}
    assert reasons["latin.txt"].startswith("not UTF-8 text (byte 0xe9 at offset 3)")
    assert reasons["scan.pdf"] == "no text (a scanned PDF needs OCR first)"


def test_nothing_readable_is_one_error(tmp_path):
    (tmp_path / "a.pdf").write_bytes(b"%PDF-1.4 truncated")
    (tmp_path / "b.png").write_bytes(b"png")
    with pytest.raises(ValueError) as err:
        docs.ingest([tmp_path])
    msg = str(err.value)
    assert (
        "no readable documents" in msg and "1 unreadable (first: a.pdf: not a readable PDF" in msg
    )
    assert "1 of unsupported types; supported: .docx" in msg
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ValueError, match="no files found"):
        docs.ingest([empty])
    with pytest.raises(FileNotFoundError, match="no such file or folder"):
        docs.ingest([tmp_path / "missing"])


# --------------------------------------------------------------------------- CLI


@pytest.fixture()
def cli(tmp_path, monkeypatch):
    app = typer.Typer()

    @app.callback()
    def main() -> None:
        pass

    register(app)
    monkeypatch.chdir(tmp_path)
    return lambda *args: CliRunner().invoke(app, ["data", *args])


def test_cli_writes_a_fingerprinted_corpus_and_reports_skips(cli, folder, tmp_path):
    out = tmp_path / "corpus.jsonl"
    result = cli("docs", str(folder), "--out", str(out))
    assert result.exit_code == 0, result.output
    assert f"wrote 5 documents to {out} (7 files: 1 unreadable, 1 unsupported" in result.stdout
    fp = result.stdout.split("fingerprint ")[1].strip()
    assert fp == sha256_file(out)
    assert "skipped broken.docx: not a DOCX file (not a zip archive)" in result.stderr
    assert "ignored 1 files of unsupported types: .png (1)" in result.stderr
    docs_read = read_documents(out)
    assert [d.id for d in docs_read] == [json.loads(line)["id"] for line in out.open()]
    first = out.read_bytes()
    assert cli("docs", str(folder), "--out", str(out)).exit_code == 0
    assert out.read_bytes() == first  # deterministic: same folder, same bytes
    assert not list(tmp_path.glob(".corpus.jsonl.*"))  # atomic write leaves no temp file


def test_cli_output_inside_the_folder_is_not_read_back(cli, folder):
    out = folder / "corpus.jsonl"
    assert cli("docs", str(folder), "--out", str(out)).exit_code == 0
    result = cli("docs", str(folder), "--out", str(out))
    assert result.exit_code == 0 and "unsupported types: .png (1)" in result.stderr


def test_cli_nothing_readable_exits_2_with_one_line(cli, tmp_path):
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "x.docx").write_bytes(b"nope")
    result = cli("docs", str(bad), "--out", str(tmp_path / "c.jsonl"))
    assert result.exit_code == 2
    lines = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "no readable documents" in lines[0]
    assert not (tmp_path / "c.jsonl").exists()


# --------------------------------------------------------------------------- streaming, bad paths


def test_ingest_into_a_file_writes_the_bytes_write_documents_writes(folder, tmp_path):
    from ragbench.datasets.corpus.file import write_documents

    whole = docs.ingest([folder])
    expected = write_documents(tmp_path / "whole.jsonl", whole.documents).read_bytes()
    streamed = docs.ingest([folder], out=tmp_path / "out" / "streamed.jsonl")
    assert streamed.path.read_bytes() == expected
    assert streamed.fingerprint == whole.fingerprint == sha256_file(streamed.path)
    assert streamed.ids == [d.id for d in whole.documents] and streamed.documents == []
    assert streamed.dedup == whole.dedup and streamed.skipped == whole.skipped
    assert not list((tmp_path / "out").glob(".*"))  # no temporary file left


def test_ingest_into_a_file_writes_nothing_when_nothing_is_readable(tmp_path):
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "x.docx").write_bytes(b"nope")
    with pytest.raises(ValueError, match="no readable documents"):
        docs.ingest([bad], out=tmp_path / "c.jsonl")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad"]


def test_progress_bar_counts_bytes(folder, monkeypatch):
    import tqdm.auto

    seen: dict = {"updated": 0}

    class Recorder(tqdm.auto.tqdm):
        def __init__(self, *args, **kwargs):
            seen.update(kwargs)
            super().__init__(*args, **kwargs)

        def update(self, n=1):
            seen["updated"] += n
            return super().update(n)

    monkeypatch.setattr(tqdm.auto, "tqdm", Recorder)
    chosen, _ = docs.discover([folder])
    docs.ingest([folder], progress=False)
    assert seen["unit"] == "B" and seen["total"] == sum(p.stat().st_size for p, _ in chosen)
    assert seen["updated"] == seen["total"]


def _never_read(monkeypatch):
    def fail(path, doc_id):
        raise AssertionError(f"{doc_id} was read")

    monkeypatch.setattr(docs, "read_document", fail)


def _one_error_line(result) -> str:
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return lines[0]


def test_cli_refuses_a_symlink_loop_before_reading(cli, folder, tmp_path, monkeypatch):
    (folder / "sub" / "loop.md").symlink_to("loop.md")  # a link to itself
    _never_read(monkeypatch)
    out = tmp_path / "c.jsonl"
    line = _one_error_line(cli("docs", str(folder), "--out", str(out)))
    assert f"{folder / 'sub' / 'loop.md'}: symbolic link loop" in line
    assert not out.exists()
    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    a.symlink_to(b)
    b.symlink_to(a)
    assert f"{a}: symbolic link loop" in _one_error_line(cli("docs", str(a), "--out", str(out)))
    assert f"{a}: symbolic link loop" in _one_error_line(cli("docs", str(a)))  # default --out
    with pytest.raises(ValueError, match="symbolic link loop"):
        docs.discover([folder])
    assert docs.discover([folder], exclude=["loop.md"])[0]  # excluded: not looked at


def test_a_symlinked_file_argument_is_read_like_any_file(cli, tmp_path):
    """`ragbench data docs notes/link.md` failed with Python's own "'...' is not in the subpath
    of '...'": the id was taken relative to the link's target's folder."""
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "notes").mkdir()
    (tmp_path / "elsewhere" / "real.md").write_text("# Real\n\nThe ferry is blue.\n")
    link = tmp_path / "notes" / "link.md"
    link.symlink_to("../elsewhere/real.md")
    assert [doc_id for _, doc_id in docs.discover([link])[0]] == ["link.md"]
    out = tmp_path / "c.jsonl"
    result = cli("docs", str(link), "--out", str(out))
    assert result.exit_code == 0, result.output
    (doc,) = read_documents(out)
    assert (doc.id, doc.text) == ("link.md", "# Real\n\nThe ferry is blue.")
    from ragbench.workspace import compare  # `ragbench compare notes/link.md` ingests alike

    spec = compare.CompareSpec(docs=(str(link),), output_dir=str(tmp_path / "out"))
    ingested, corpus = compare.ingest(spec)
    assert [d.id for d in ingested.documents] == ["link.md"] and corpus.is_file()
    (tmp_path / "notes" / "a.md").write_text("# A\n\nThe boat is red.\n")
    chosen, _ = docs.discover([tmp_path / "notes" / "a.md", link])  # two files, one a link
    assert [doc_id for _, doc_id in chosen] == ["a.md", "link.md"]
    gone = tmp_path / "notes" / "gone.md"
    gone.symlink_to("missing.md")
    line = _one_error_line(cli("docs", str(gone), "--out", str(out)))
    assert line == f"error: {gone}: symbolic link to missing.md, which does not exist"


def test_a_symlink_skipped_in_a_folder_is_reported_as_a_symlink(cli, tmp_path):
    """A link inside a folder whose target cannot be read was counted among the unsupported
    types by its own name (".md (1)", .md being supported); a link to a folder was skipped
    without a word. Each is a skipped symbolic link, with why; a link to a document is read."""
    other = tmp_path / "elsewhere"
    (other / "deep").mkdir(parents=True)
    (other / "real.md").write_text("# Real\n\nThe ferry is blue.\n")
    (other / "table.xyz").write_text("not a document")
    (other / "deep" / "d.md").write_text("# Deep\n\nThe quay is long.\n")
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "a.md").write_text("# A\n\nThe boat is red.\n")
    (notes / "ok.md").symlink_to(other / "real.md")
    (notes / "odd.md").symlink_to(other / "table.xyz")
    (notes / "gone.md").symlink_to("missing.md")
    (notes / "deep").symlink_to(other / "deep", target_is_directory=True)
    out = tmp_path / "c.jsonl"
    result = cli("docs", str(notes), "--out", str(out))
    assert result.exit_code == 0, result.output
    assert [d.id for d in read_documents(out)] == ["a.md", "ok.md"]
    skipped = sorted(line for line in result.stderr.splitlines() if line.startswith("skipped "))
    assert skipped == [
        f"skipped deep: symbolic link to a folder ({other / 'deep'}): not followed; name the "
        "folder itself to read it",
        "skipped gone.md: symbolic link to missing.md, which does not exist",
        f"skipped odd.md: symbolic link to {other / 'table.xyz'}, a file of unsupported type "
        "'.xyz'",
    ], result.stderr
    assert "unsupported types" not in result.stderr  # no ".md (1)"
    assert "0 unreadable, 0 unsupported, 3 symbolic links skipped" in result.stdout
    _, links = docs.discover([notes])
    assert [(s.path, s.symlink, s.unsupported) for s in links] == [
        ("deep", True, False),
        ("gone.md", True, False),
        ("odd.md", True, False),
    ]


def test_cli_refuses_an_output_folder_before_reading(cli, folder, tmp_path, monkeypatch):
    _never_read(monkeypatch)
    target = tmp_path / "outdir"
    target.mkdir()
    line = _one_error_line(cli("docs", str(folder), "--out", str(target)))
    assert f"--out {target} is a folder" in line and ".tmp" not in line
    assert list(target.iterdir()) == []
    (tmp_path / "file").write_text("x")
    line = _one_error_line(cli("docs", str(folder), "--out", str(tmp_path / "file" / "c.jsonl")))
    assert f"{tmp_path / 'file'} is a file, not a folder" in line


def test_a_rerun_removes_the_temporary_files_of_a_killed_writer(cli, folder, tmp_path, caplog):
    import subprocess
    import sys

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()  # a PID that no longer runs
    out = tmp_path / "corpus.jsonl"
    stale = tmp_path / f".corpus.jsonl.{dead.pid}.abcd_123.tmp"
    live = tmp_path / f".corpus.jsonl.{os.getppid()}.abcd_123.tmp"  # a writer still running
    other = tmp_path / f".other.jsonl.{dead.pid}.abcd_123.tmp"  # another output's
    odd = tmp_path / f".corpus.jsonl.{dead.pid}.tmp"  # not the pattern
    for path in (stale, live, other, odd):
        path.write_text("half a corpus")
    result = cli("docs", str(folder), "--out", str(out))
    assert result.exit_code == 0, result.output
    assert not stale.exists() and live.exists() and other.exists() and odd.exists()
    assert f"removed {stale.name}, left by a writer that was stopped" in caplog.text


@pytest.mark.parametrize(
    ("front", "why"),
    [
        ("title: [unclosed", "is not valid YAML (line 3: expected ',' or ']'"),  # at the ---
        ('title: !!python/object/apply:os.system ["echo"]', "is not valid YAML (line 2: "),
        ("- a\n- b", "is a YAML list, not a mapping"),
    ],
)
def test_front_matter_gone_wrong_is_left_out_with_a_warning(tmp_path, caplog, front, why):
    path = tmp_path / "lockers.md"
    path.write_text(f"---\n{front}\n---\nBody text about lockers.\n", encoding="utf-8")
    with caplog.at_level(logging.WARNING):
        doc = docs.read_document(path, "lockers.md")
    assert (doc.text, doc.title) == ("Body text about lockers.", "lockers")  # the file name
    assert f"lockers.md: front matter {why}" in caplog.text
    path.write_text(f"---\n{front}\n---\n# Lockers\nBody.\n", encoding="utf-8")
    assert docs.read_document(path, "lockers.md").title == "Lockers"  # the heading after it


def test_a_thematic_break_and_a_setext_heading_stay_markdown(tmp_path, caplog):
    path = tmp_path / "notes.md"
    path.write_text("---\nOpening words\n---\nMore text.\n", encoding="utf-8")
    with caplog.at_level(logging.WARNING):
        doc = docs.read_document(path, "notes.md")
    assert doc.text == "---\nOpening words\n---\nMore text." and doc.title == "Opening words"
    assert caplog.text == ""


def test_sigterm_leaves_no_temporary_corpus(tmp_path):
    """Issue 45: SIGTERM during `ragbench data docs` left its hidden .tmp beside --out. Now it
    unwinds as `ragbench run` does: no temporary file, no corpus, one line, exit 143. A named
    pipe among the files holds the reader where the test can stop it."""
    import signal
    import subprocess
    import sys
    import time

    folder = tmp_path / "docs"
    folder.mkdir()
    (folder / "a.txt").write_text("The first ferry leaves at 06:40.\n")
    fifo = folder / "b.txt"
    os.mkfifo(fifo)
    out = tmp_path / "out" / "corpus.jsonl"
    root = str(Path(__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])}
    cmd = [sys.executable, "-m", "ragbench.cli", "data", "docs", str(folder), "--out", str(out)]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline, writer = time.monotonic() + 120, None
    try:
        while writer is None:  # opens once the command opens the pipe to read b.txt
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "b.txt was never opened"
            try:
                writer = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
            except OSError:  # ENXIO: no reader yet
                time.sleep(0.1)
        assert [p.name for p in out.parent.glob(".corpus.jsonl.*.tmp")]  # the corpus half-written
        proc.send_signal(signal.SIGTERM)  # while it waits for b.txt's text
        _, err = proc.communicate(timeout=60)
    finally:
        if writer is not None:
            os.close(writer)
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 143, err
    assert list(out.parent.iterdir()) == []  # neither the corpus nor its temporary file
    assert err.rstrip().splitlines()[-1] == (
        f"interrupted by SIGTERM: {out} not written (no temporary file left); run the same "
        "command again"
    )
