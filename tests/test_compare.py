"""`ragbench compare DOCS --questions FILE`: a folder of real PDF, HTML and text files to the
verdict, the YAML it used (which `ragbench run` resumes with nothing pending) and an HTML report
that opens with the verdict."""

from __future__ import annotations

import html as html_lib
import json
import re
from pathlib import Path

import nbformat
import pytest
from typer.testing import CliRunner

from ragbench.cli import app
from ragbench.workspace import compare as steps

QUESTIONS = """id,question,answers,evidence
tide,How high does the spring tide reach?,4.2 metres,The spring tide reaches 4.2 metres
keeper,Who is the lighthouse keeper?,Ada Quill,The lighthouse keeper is Ada Quill
tower,How tall is the white tower?,31 metres,31 metres tall
ferry,When does the first ferry leave?,06:40,The first ferry leaves at 06:40
"""
VERDICT = re.compile(
    r"^verdict: (Use (closed_book|long_context|rag|self_route)\b|Too few questions|No variant)",
    re.M,
)


def write_pdf(path: Path, pages: tuple[str, ...]) -> Path:
    from fpdf import FPDF

    pdf = FPDF()
    pdf.set_title("Tide Report")
    pdf.set_font("Helvetica", size=12)
    for page in pages:
        pdf.add_page()
        pdf.multi_cell(0, 8, page)
    pdf.output(str(path))
    return path


def make_docs(folder: Path, long_words: int = 0) -> Path:
    """A folder of a real PDF (fpdf2), an HTML page and text files; ``long_words`` adds a text
    file of that many words (longer than the fake model's 8,192-token window: cut)."""
    folder.mkdir(parents=True)
    write_pdf(folder / "tides.pdf", ("The harbour master is Ben Marsh.\nThe spring tide "
              "reaches 4.2 metres.", "The lighthouse keeper is Ada Quill."))  # fmt: skip
    (folder / "lighthouse.html").write_text(
        "<html><head><title>The Lighthouse</title></head><body><h1>History</h1><p>Built in "
        "1871, the white tower is 31 metres tall.</p></body></html>",
        encoding="utf-8",
    )
    (folder / "ferries.txt").write_text("The first ferry leaves at 06:40 from pier 3.\n")
    if long_words:
        words = " ".join(f"w{i % 997}" for i in range(long_words))
        (folder / "logbook.txt").write_text(f"Harbour logbook.\n\n{words}\n", encoding="utf-8")
    return folder


def compare(args: list[str], input: str | None = None):
    return CliRunner().invoke(app, ["compare", *args], input=input)


def config_of(output: str) -> Path:
    match = re.search(r"^config: (\S+)", output, re.M)
    assert match, output
    return Path(match.group(1))


def check_rerun_resumes(yaml_path: Path) -> None:
    """`ragbench run <the YAML compare wrote>` lands in the same run folder, nothing pending."""
    run_dir = yaml_path.parent
    before = json.loads((run_dir / "manifest.json").read_text())
    result = CliRunner().invoke(app, ["run", str(yaml_path), "--quiet"])
    assert result.exit_code == 0, result.output
    assert f"run folder: {run_dir}" in result.output
    sessions = json.loads((run_dir / "manifest.json").read_text())["sessions"]
    assert len(sessions) == len(before["sessions"]) + 1
    assert sessions[-1]["pending"] == 0


def check_report(run_dir: Path, printed: str) -> None:
    """report.html: after the provenance header (naming this run), the first section is the
    verdict the command printed."""
    page = (run_dir / "report.html").read_text(encoding="utf-8")
    header_end = page.index("</section>", page.index("ragbench-provenance"))
    assert run_dir.name in page[:header_end]
    first_h2 = re.search(r"<h2[^>]*>(.*?)</h2>", page[header_end:], re.S)
    assert first_h2 and "Verdict" in first_h2.group(1)
    text = " ".join(html_lib.unescape(re.sub(r"<[^>]+>", " ", page[header_end:])).split())
    sentence = " ".join(VERDICT.search(printed).string[VERDICT.search(printed).start() :]
                        .split("\n", 1)[0].removeprefix("verdict: ").split())  # fmt: skip
    at = text.find(sentence[:80])
    assert at != -1, (sentence, text[:2000])
    assert at < text.index("1. The corpus")


def test_compare_fake_end_to_end(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    docs = make_docs(tmp_path / "handbook", long_words=9000)
    (tmp_path / "q.csv").write_text(QUESTIONS, encoding="utf-8")
    result = compare([str(docs), "--questions", "q.csv", "--backend", "fake", "--embedder",
                      "hash", "--yes", "--quiet", "--output-dir", "out"])  # fmt: skip
    out = result.output
    assert result.exit_code == 0, out
    assert "corpus: 4 documents from 4 files" in out
    # the estimate comes before anything is generated, with tokens and dollars per strategy
    estimate = out.index("estimate (dry run")
    assert estimate < out.index("run folder:")
    assert "total: at most $" in out
    for label in ("closed_book", "long_context truncate_middle", "rag k=3", "self_route k=3"):
        assert label in out[estimate:]
    assert VERDICT.search(out), out
    # the corpus is over the fake model's window: the conditions say what share was cut
    assert re.search(r"long context cut \d+% of it to fit the window", out)
    yaml_path = config_of(out)
    assert (
        yaml_path.name == "compare.yaml"
        and yaml_path.parent == Path(tmp_path / "out").resolve() / yaml_path.parent.name
    )
    assert f"report: {yaml_path.parent / 'report.html'}" in out
    check_rerun_resumes(yaml_path)
    check_report(yaml_path.parent, out)


def test_paid_api_asks_before_spending(tmp_path, monkeypatch):
    """The fake backend runs no local weights: priced per token, it is a paid API. "n" stops
    after the estimate with nothing generated; "y" (or --yes) runs; an hourly sheet never asks."""
    monkeypatch.chdir(tmp_path)
    docs = make_docs(tmp_path / "docs")
    (tmp_path / "q.csv").write_text(QUESTIONS, encoding="utf-8")
    args = [str(docs), "--questions", "q.csv", "--backend", "fake", "--embedder", "hash",
            "--quiet", "--no-report", "--output-dir", "out"]  # fmt: skip
    declined = compare(args, input="n\n")
    assert declined.exit_code == 1, declined.output
    assert "total: at most $" in declined.output
    assert "paid API (example-hosted-api): run it?" in declined.output
    run_dir = config_of(declined.output).parent
    assert not (run_dir / "records.jsonl").exists()  # nothing spent
    accepted = compare(args, input="y\n")
    assert accepted.exit_code == 0, accepted.output
    assert VERDICT.search(accepted.output)
    assert (run_dir / "records.jsonl").exists()
    hourly = compare([*args, "--price-sheet", "example-cpu-hour"])  # no input: must not ask
    assert hourly.exit_code == 0, hourly.output
    assert "run it?" not in hourly.output


def test_bad_folder_is_one_line_and_exit_2(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = compare([str(tmp_path / "no-such-folder"), "--backend", "fake"])
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert lines == [f"error: {tmp_path / 'no-such-folder'}: no such file or folder"]


def test_bad_option_fails_before_anything_is_spent(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    docs = make_docs(tmp_path / "docs")
    result = compare([str(docs), "--backend", "fake", "--overflow", "truncate_midle"])
    assert result.exit_code == 2
    assert "truncate_middle" in result.output  # did you mean
    assert not list((tmp_path / "data" / "results").glob("your-documents-*"))


def test_config_is_notebook_05s_and_options_reach_the_strategies_that_take_them(tmp_path):
    spec = steps.CompareSpec(docs=("d",), backend="fake", overflow="truncate_head", top_k=5)
    entries = steps.strategy_entries(spec)
    assert entries == [
        "closed_book",
        {"name": "long_context", "params": {"overflow": "truncate_head"}},
        {"name": "rag", "params": {"top_k": 5}},
        {"name": "self_route", "params": {"top_k": 5, "overflow": "truncate_head"}},
    ]
    assert steps.report_blocker(spec) and "truncate_middle" in steps.report_blocker(spec)
    assert steps.report_blocker(steps.CompareSpec(docs=("a", "b"))) is not None
    assert steps.report_blocker(steps.CompareSpec(docs=("a",))) is None


def test_verdict_first_moves_the_verdict_section_under_the_title():
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell("# Title"), nbformat.v4.new_code_cell("x = 1"),
                nbformat.v4.new_markdown_cell("## 1. Data"), nbformat.v4.new_code_cell("run()"),
                nbformat.v4.new_markdown_cell("## Verdict\n\nwhy"),
                nbformat.v4.new_code_cell("verdict(df)"), nbformat.v4.new_markdown_cell("## 2.")]  # fmt: skip
    sources = [c.source for c in steps.verdict_first(nb).cells]
    assert sources == ["# Title", "## Verdict\n\nwhy", "verdict(df)", "x = 1", "## 1. Data",
                       "run()", "## 2."]  # fmt: skip


@pytest.mark.slow
def test_compare_embedded_model_end_to_end(tmp_path, monkeypatch):
    """The defaults: SmolLM2-135M (transformers) and MiniLM, offline. Local weights: no
    confirmation is asked (no --yes, no input)."""
    monkeypatch.chdir(tmp_path)
    docs = make_docs(tmp_path / "handbook")
    (tmp_path / "q.csv").write_text(QUESTIONS, encoding="utf-8")
    result = compare(
        [str(docs), "--questions", "q.csv", "--quiet", "--output-dir", "out", "--threads", "1"]
    )
    out = result.output
    assert result.exit_code == 0, out
    assert "run it?" not in out
    assert VERDICT.search(out), out
    assert "long context read all of it" in out
    yaml_path = config_of(out)
    check_rerun_resumes(yaml_path)
    check_report(yaml_path.parent, out)
