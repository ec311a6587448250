"""`ragbench compare DOCS --questions FILE`: a folder of real PDF, HTML and text files to the
verdict, the YAML it used (which `ragbench run` resumes with nothing pending) and an HTML report
that opens with the verdict; a user's pipeline (`--pipeline module:attr`, `--pipeline-url`) runs
beside the built-in strategies, in the verdict and the report, and a bad one stops the command
before anything is read or loaded."""

from __future__ import annotations

import html as html_lib
import json
import re
import shlex
import socket
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import nbformat
import pandas as pd
import papermill as pm
import pytest
from openai_server import ok, serving
from papermill.exceptions import PapermillExecutionError
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
    r"^verdict: (Use (closed_book|long_context|rag|self_route|pipeline)\b|Not decided yet|"
    r"No variant|Every variant)",
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
    write_pdf(
        folder / "tides.pdf",
        (
            "The harbour master is Ben Marsh.\nThe spring tide reaches 4.2 metres.",
            "The lighthouse keeper is Ada Quill.",
        ),
    )
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


# the user's pipeline: answers from its own lookup, with the sentence it read as its context
PIPELINE = """
ANSWERS = {
    "tide": ("4.2 metres", "The spring tide reaches 4.2 metres."),
    "keeper": ("Ada Quill", "The lighthouse keeper is Ada Quill."),
    "tower": ("31 metres", "the white tower is 31 metres tall."),
    "ferry": ("06:40", "The first ferry leaves at 06:40 from pier 3."),
}


def answer(question, example_id):
    text, context = ANSWERS[example_id]
    return {"answer": text, "contexts": [context]}


def engine():  # a factory whose engine cannot be built
    raise RuntimeError("the index is not built\\nrun build_index() first")
"""


def pipeline_module(folder: Path, monkeypatch, name: str = "handbook_rag") -> str:
    """``name``.py in ``folder`` (the working directory: where the command imports it from)."""
    (folder / f"{name}.py").write_text(PIPELINE, encoding="utf-8")
    monkeypatch.delitem(sys.modules, name, raising=False)
    return f"{name}:answer"


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
    assert str(run_dir.resolve()) not in page  # the run folder reads $RUN_DIR, as in `render`
    header_end = page.index("</section>", page.index("ragbench-provenance"))
    assert run_dir.name in page[:header_end]
    first_h2 = re.search(r"<h2[^>]*>(.*?)</h2>", page[header_end:], re.S)
    assert first_h2 and "Verdict" in first_h2.group(1)
    text = " ".join(html_lib.unescape(re.sub(r"<[^>]+>", " ", page[header_end:])).split())
    sentence = " ".join(
        VERDICT.search(printed)
        .string[VERDICT.search(printed).start() :]
        .split("\n", 1)[0]
        .removeprefix("verdict: ")
        .split()
    )
    at = text.find(sentence[:80])
    assert at != -1, (sentence, text[:2000])
    assert at < text.index("1. The corpus")


def test_compare_fake_end_to_end(tmp_path, monkeypatch):
    """The four strategies and a user's function pipeline beside them, to the report."""
    monkeypatch.chdir(tmp_path)
    docs = make_docs(tmp_path / "handbook", long_words=9000)
    (tmp_path / "q.csv").write_text(QUESTIONS, encoding="utf-8")
    target = pipeline_module(tmp_path, monkeypatch)
    result = compare(
        [
            str(docs),
            "--questions",
            "q.csv",
            "--backend",
            "fake",
            "--embedder",
            "hash",
            "--yes",
            "--quiet",
            "--output-dir",
            "out",
            "--pipeline",
            target,
        ]
    )
    out = result.output
    assert result.exit_code == 0, out
    assert out.index(f"pipeline: pipeline {target} v=") < out.index("corpus: 4 documents")
    assert "corpus: 4 documents from 4 files" in out
    # the estimate comes before anything is generated, with tokens and dollars per strategy
    estimate = out.index("estimate (dry run")
    assert estimate < out.index("run folder:")
    assert "total: at most $" in out
    for label in (
        "closed_book",
        "long_context truncate_middle",
        "rag k=3",
        "self_route k=3",
        f"pipeline {target}",
    ):
        assert label in out[estimate:]
    assert VERDICT.search(out), out
    # the pipeline is in the summary, and its rows kept what it read, found in the documents
    assert re.search(rf"^ *pipeline {target} v=\S+ +100\.0%", out[out.index("verdict:") :], re.M), (
        out
    )
    df = pd.read_parquet(config_of(out).parent / "results.parquet")
    pipe = df[df["strategy"] == "pipeline"]
    assert len(pipe) == 4 and pipe["error"].isna().all() and pipe["gold_hit"].all()
    assert (pipe["hit@1"] == 1.0).all() and (pipe["prompt_tokens"] > 0).all()
    assert pipe["dollars"].notna().all() and pipe["usage_estimated"].all()
    # the corpus is over the fake model's window: the conditions say what share was cut
    assert re.search(r"long context cut \d+% of it to fit the window", out)
    yaml_path = config_of(out)
    assert (
        yaml_path.name == "compare.yaml"
        and yaml_path.parent == Path(tmp_path / "out").resolve() / yaml_path.parent.name
    )
    assert f"report: {yaml_path.parent / 'report.html'}" in out
    assert f"`ragbench compare` ran in {tmp_path}\n" in yaml_path.read_text()
    check_rerun_resumes(yaml_path)
    check_report(yaml_path.parent, out)
    page = (yaml_path.parent / "report.html").read_text(encoding="utf-8")
    assert f"pipeline {target} v=" in html_lib.unescape(page)  # the report shows it too


serve = pytest.fixture(serving, name="serve")


def test_the_fake_backend_spends_nothing_and_never_asks(tmp_path, monkeypatch):
    """Priced per token, the fake backend still sends nothing: no question, even with no
    terminal and no --yes (it used to print "Aborted." and exit 1)."""
    monkeypatch.chdir(tmp_path)
    docs = make_docs(tmp_path / "docs")
    (tmp_path / "q.csv").write_text(QUESTIONS, encoding="utf-8")
    args = [
        str(docs),
        "--questions",
        "q.csv",
        "--backend",
        "fake",
        "--embedder",
        "hash",
        "--quiet",
        "--no-report",
        "--output-dir",
        "out",
    ]
    result = compare(args)  # no input: a question would abort
    assert result.exit_code == 0, result.output
    assert "run it?" not in result.output and "total: at most $" in result.output


def test_paid_api_asks_before_spending(tmp_path, monkeypatch, serve):
    """A server priced per token is a paid API. "n" stops after the estimate with nothing
    generated; "y" (or --yes) runs; an hourly sheet never asks."""
    srv = serve(ok())
    monkeypatch.chdir(tmp_path)
    docs = make_docs(tmp_path / "docs")
    (tmp_path / "q.csv").write_text(QUESTIONS, encoding="utf-8")
    args = [
        str(docs),
        "--questions",
        "q.csv",
        "--backend",
        "openai",
        "--model",
        "m",
        "--base-url",
        srv.url,
        "--tokenizer",
        "whitespace",
        "--embedder",
        "hash",
        "--quiet",
        "--no-report",
        "--output-dir",
        "out",
    ]
    example = [*args, "--price-sheet", "example-hosted-api"]  # model m has no sheet of its own
    declined = compare(example, input="n\n")
    assert declined.exit_code == 1, declined.output
    assert "total: at most $" in declined.output
    assert "paid API (example-hosted-api): run it?" in declined.output
    run_dir = config_of(declined.output).parent
    assert not (run_dir / "records.jsonl").exists() and srv.requests == []  # nothing spent
    accepted = compare(example, input="y\n")
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


def test_a_bad_backend_or_questions_file_fails_before_the_documents_are_read(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    docs = make_docs(tmp_path / "docs")
    result = compare([str(docs), "--backend", "hff", "--output-dir", "out"])
    assert result.exit_code == 2 and "did you mean 'hf'" in result.output
    assert "corpus:" not in result.output and not (tmp_path / "out").exists()
    result = compare(
        [str(docs), "--backend", "fake", "--output-dir", "out", "--questions", "no-such.csv"]
    )
    assert result.exit_code == 2 and "no-such.csv: no such questions file" in result.output
    assert "corpus:" not in result.output and not (tmp_path / "out").exists()


def test_config_is_notebook_05s_and_options_reach_the_strategies_that_take_them(tmp_path):
    spec = steps.CompareSpec(
        docs=("d",),
        backend="fake",
        overflow="truncate_head",
        top_k=5,
        pipeline="json:dumps",
        pipeline_url="http://rag:8080/answer",
    )
    entries = steps.strategy_entries(spec)
    assert entries == [
        "closed_book",
        {"name": "long_context", "params": {"overflow": "truncate_head"}},
        {"name": "rag", "params": {"top_k": 5}},
        {"name": "self_route", "params": {"top_k": 5, "overflow": "truncate_head"}},
        {"name": "pipeline", "params": {"target": "json:dumps"}},
        {"name": "pipeline", "params": {"url": "http://rag:8080/answer"}},
    ]
    # notebook 05 builds its strategies from its parameters with the same function
    params = steps.notebook_parameters(spec, tmp_path / "q.csv")
    assert entries == steps.strategy_list(
        params["strategies"],
        params["top_k"],
        params["overflow"],
        params["pipeline"],
        params["pipeline_url"],
    )
    nb = nbformat.read(steps.notebook_path(), as_version=4)
    assert "compare.strategy_list(strategies, top_k, overflow, pipeline, pipeline_url)" in "".join(
        c.source for c in nb.cells
    )
    assert set(params) <= set(pm.inspect_notebook(str(steps.notebook_path())))
    assert steps.report_blocker(spec) is None  # other strategies, overflow and pipelines: shown
    assert steps.report_blocker(steps.CompareSpec(docs=("a", "b"))) is not None
    assert steps.report_blocker(steps.CompareSpec(docs=("a",))) is None


@pytest.mark.parametrize(
    ("target", "message"),
    [
        ("no_such_rag_module:answer", "cannot import 'no_such_rag_module'"),
        ("handbook_rag:anwser", "has no attribute 'anwser'"),
        ("handbook_rag.answer", "target must be 'module:attribute'"),
        # a factory that raises: one line naming it and the error's last line, exit 2
        (
            "handbook_rag:engine",
            "target 'handbook_rag:engine': its factory engine() raised "
            "RuntimeError: run build_index() first",
        ),
    ],
)
def test_a_bad_pipeline_target_stops_before_anything_is_read(
    tmp_path, monkeypatch, target, message
):
    monkeypatch.chdir(tmp_path)
    pipeline_module(tmp_path, monkeypatch)
    docs = make_docs(tmp_path / "docs")
    result = compare([str(docs), "--backend", "fake", "--output-dir", "out", "--pipeline", target])
    assert result.exit_code == 2, result.output
    error = result.output.splitlines()[-1]  # after the `pipeline:` line of a target that imports
    assert error.startswith("error: pipeline: ") and message in error, result.output
    assert "Traceback" not in result.output and len(result.output.splitlines()) <= 2
    assert "corpus:" not in result.output and not (tmp_path / "out").exists()


class Service(BaseHTTPRequestHandler):
    """The user's pipeline as an HTTP service: POST {question, id, corpus} -> answer JSON."""

    seen: list = []

    def do_POST(self):  # noqa: N802 (http.server's name)
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        Service.seen.append(body)
        data = json.dumps(
            {
                "answer": "Ada Quill",
                "usage": {"prompt_tokens": 40, "completion_tokens": 2},
                "version": "svc-1",
            }
        ).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):  # noqa: N802 (the preflight: any answer but 401/403/404)
        self.send_response(405)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


def test_a_pipeline_service_beside_the_strategies(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    docs = make_docs(tmp_path / "docs")
    (tmp_path / "q.csv").write_text(QUESTIONS, encoding="utf-8")
    server = ThreadingHTTPServer(("127.0.0.1", 0), Service)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    Service.seen = []
    url = f"http://127.0.0.1:{server.server_address[1]}/answer"
    try:
        result = compare(
            [
                str(docs),
                "--questions",
                "q.csv",
                "--backend",
                "fake",
                "--embedder",
                "hash",
                "--yes",
                "--quiet",
                "--no-report",
                "--output-dir",
                "out",
                "--strategy",
                "long_context",
                "--pipeline-url",
                url,
            ]
        )
    finally:
        server.shutdown()
        server.server_close()
    out = result.output
    assert result.exit_code == 0, out
    assert VERDICT.search(out), out
    assert re.search(rf"^ *pipeline {re.escape(url)} +25\.0%", out, re.M), out  # 1 of 4 right
    assert sorted(b["id"] for b in Service.seen) == ["ferry", "keeper", "tide", "tower"]
    df = pd.read_parquet(config_of(out).parent / "results.parquet")
    pipe = df[df["strategy"] == "pipeline"]
    assert (pipe["prompt_tokens"] == 40).all() and not pipe["usage_estimated"].any()
    assert (pipe["pipeline_version"] == "svc-1").all() and pipe["dollars"].gt(0).all()
    assert set(df["example_id"]) == set(pipe["example_id"])  # the same questions as long context


def test_a_dead_pipeline_endpoint_stops_before_anything_is_read(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    docs = make_docs(tmp_path / "docs")
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}/answer"
    result = compare([str(docs), "--backend", "fake", "--output-dir", "out", "--pipeline-url", url])
    assert result.exit_code == 2, result.output
    assert "pipeline endpoint check failed" in result.output and str(port) in result.output
    assert "corpus:" not in result.output and not (tmp_path / "out").exists()


def test_verdict_first_moves_the_verdict_section_under_the_title():
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_markdown_cell("# Title"),
        nbformat.v4.new_code_cell("x = 1"),
        nbformat.v4.new_markdown_cell("## 1. Data"),
        nbformat.v4.new_code_cell("run()"),
        nbformat.v4.new_markdown_cell("## Verdict\n\nwhy"),
        nbformat.v4.new_code_cell("verdict(df)"),
        nbformat.v4.new_markdown_cell("### Verdict detail"),
        nbformat.v4.new_code_cell("v.detail"),
        nbformat.v4.new_markdown_cell("## 2."),
    ]
    shown = [c.source for c in steps.verdict_first(nbformat.from_dict(nb)).cells]
    moved = ["# Title", "## Verdict\n\nwhy", "verdict(df)", "### Verdict detail", "v.detail"]
    assert shown == [*moved, "x = 1", "## 1. Data", "run()", "## 2."]
    # a model too weak to tell: the verdict's line is the page's first, above the title
    weak = "Every variant answered at most 15.4% of the questions: try a stronger model."
    first = [c.source for c in steps.verdict_first(nbformat.from_dict(nb), weak).cells]
    assert first == [f"**{weak}**", *shown]
    bare = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("# Title")])
    assert [c.source for c in steps.verdict_first(bare, weak).cells] == [f"**{weak}**", "# Title"]


def test_a_weak_models_verdict_is_the_reports_first_line(tmp_path, monkeypatch):
    """The fake reads no answer to these questions from any variant: 0 of 12 each, every upper
    bound under 30%. The verdict leads with it, and report.html says it before its title."""
    monkeypatch.chdir(tmp_path)
    docs = make_docs(tmp_path / "handbook")
    rows = QUESTIONS.strip().splitlines()
    copies = [
        f"{row.split(',')[0]}{i},{row.split(',', 1)[1]}" for i in range(3) for row in rows[1:]
    ]
    (tmp_path / "q.csv").write_text("\n".join([rows[0], *copies]) + "\n", encoding="utf-8")
    options = ["--backend", "fake", "--embedder", "hash", "--yes", "--quiet", "--output-dir", "out"]
    result = compare([str(docs), "--questions", "q.csv", *options])
    out = result.output
    assert result.exit_code == 0, out
    weak = "Every variant answered at most 0% of the questions (the highest upper 95% bound, "
    assert f"verdict: {weak}" in out and "try a stronger model." in out, out
    page = (config_of(out).parent / "report.html").read_text(encoding="utf-8")
    header_end = page.index("</section>", page.index("ragbench-provenance"))
    text = " ".join(html_lib.unescape(re.sub(r"<[^>]+>", " ", page[header_end:])).split())
    assert text.startswith(weak), text[:300]
    assert text.index("Your documents: RAG or long context?") < text.index("Verdict")


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


def test_docs_pipeline_commands_are_this_commands_options():
    """docs/pipeline.md's `ragbench compare ... --pipeline` lines parse
    (tests/test_pipeline_models.py runs its engine and service snippets on the embedded model)."""
    page = Path(__file__).resolve().parents[1] / "docs" / "pipeline.md"
    text = page.read_text(encoding="utf-8")
    blocks = re.findall(r"```bash\n(.*?)```", text, re.DOTALL)
    lines = [line for b in blocks for line in b.splitlines() if line.startswith("ragbench compare")]
    assert len(lines) == 2 and "--pipeline " in lines[0] and "--pipeline-url " in lines[1]
    for line in lines:
        result = compare([*shlex.split(line)[2:], "--help"])  # options are parsed before --help
        assert result.exit_code == 0, result.output
    assert compare(["docs", "--pipline", "a:b", "--help"]).exit_code == 2  # what a typo does


BAD_QUESTIONS = {  # name: (file text, what the error line says)
    "bad-json.jsonl": ('{"question": "a?"}\n{"question": \n', "bad-json.jsonl:2: invalid JSON"),
    "not-an-object.jsonl": ('["a?"]\n', "not-an-object.jsonl:1: expected a JSON object"),
    "empty.jsonl": ("", "no questions"),
    "empty.csv": ("id,question,answers\n", "no questions"),
    "no-question-column.csv": ("id,answers\nq,1\n", "question"),
    "empty-question.csv": ("question,answers\n  ,x\n", "empty-question.csv:2"),
    "empty-question.jsonl": ('{"question": " "}\n', "empty-question.jsonl:1"),
    "duplicate-id.csv": ("id,question\na,x?\na,y?\n", "duplicate-id.csv:3"),
    "unknown-field.jsonl": ('{"question": "x?", "anwsers": ["1"]}\n', "unknown-field.jsonl:1"),
    "answers-number.jsonl": ('{"question": "x?", "answers": 4}\n', "answers-number.jsonl:1"),
    "id-number.jsonl": ('{"question": "x?", "id": 4}\n', "id-number.jsonl:1"),
    "task-type.jsonl": ('{"question": "x?", "task_type": "nope"}\n', "task-type.jsonl:1"),
    "questions.txt": ("x?\n", "questions file extension"),
    "not-utf8.csv": (b"question\nCaf\xe9?\n", "not-utf8.csv:2: not valid UTF-8"),
    "no-answers.csv": (
        "question\nx?\ny?\n",
        "no-answers.csv: field 'answers': none of its 2 questions has a gold answer",
    ),
}


@pytest.mark.parametrize("name", list(BAD_QUESTIONS))
def test_a_bad_questions_file_fails_before_the_documents_are_read(tmp_path, monkeypatch, name):
    monkeypatch.chdir(tmp_path)
    docs = make_docs(tmp_path / "docs")
    text, needle = BAD_QUESTIONS[name]
    path = tmp_path / name
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    result = compare(
        [
            str(docs),
            "--questions",
            str(path),
            "--backend",
            "fake",
            "--embedder",
            "hash",
            "--quiet",
            "--no-report",
            "--output-dir",
            "out",
        ]
    )
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], lines
    assert not (tmp_path / "out").exists()  # no corpus, no compare.yaml


def test_no_variant_meeting_the_constraints_still_writes_the_report(tmp_path, monkeypatch):
    """The verdict names no variant: the report is written all the same, opening with that
    verdict, its detail section showing each variant against the constraints."""
    monkeypatch.chdir(tmp_path)
    docs = make_docs(tmp_path / "handbook")
    (tmp_path / "q.csv").write_text(QUESTIONS, encoding="utf-8")
    result = compare(
        [
            str(docs),
            "--questions",
            "q.csv",
            "--backend",
            "fake",
            "--embedder",
            "hash",
            "--max-latency-s",
            "1e-9",
            "--quiet",
            "--output-dir",
            "out",
        ]
    )
    out = result.output
    assert result.exit_code == 0, out
    assert "verdict: No variant meets the constraints" in out
    run_dir = config_of(out).parent
    assert f"report: {run_dir / 'report.html'}" in out
    check_report(run_dir, out)
    page = (run_dir / "report.html").read_text(encoding="utf-8")
    assert "no variant meets the constraints, so none was compared" in page


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("--min-accuracy", "60", "--min-accuracy must be from 0 to 1 (0: any); got 60"),
        ("--min-accuracy", "-0.5", "--min-accuracy must be from 0 to 1 (0: any); got -0.5"),
        (
            "--max-dollars-per-1k",
            "-1",
            "--max-dollars-per-1k must be 0 or more (0: no limit); got -1",
        ),
        ("--max-latency-s", "nan", "--max-latency-s must be 0 or more (0: no limit); got nan"),
        ("--max-latency-s", "inf", "--max-latency-s must be 0 or more (0: no limit); got inf"),
    ],
)
def test_a_constraint_out_of_range_is_one_line_before_anything_is_read(
    tmp_path, monkeypatch, option, value, message
):
    monkeypatch.chdir(tmp_path)
    docs = make_docs(tmp_path / "docs")
    result = compare(
        [str(docs), "--backend", "fake", "--embedder", "hash", option, value, "--output-dir", "out"]
    )
    assert result.exit_code == 2, result.output
    assert result.output.strip().splitlines() == [f"error: {message}"]
    assert not (tmp_path / "out").exists()


def test_a_failed_report_says_which_cell_and_the_error():
    """papermill's error text starts with a blank line: the line printed names the cell of
    report.ipynb and the error's last line, never an empty message."""
    exc = PapermillExecutionError(
        13,
        12,
        "report.formatted(verdict.detail)",
        "AttributeError",
        "'NoneType' object has no attribute 'columns'",
        ["Traceback ...", "AttributeError: ..."],
    )
    assert str(exc).splitlines()[0] == ""
    line = steps.report_failure(exc, Path("/runs/r1"))
    assert line == (
        "/runs/r1/report.ipynb: cell 13 (In [12]): AttributeError: 'NoneType' "
        "object has no attribute 'columns'"
    )
    assert steps.report_failure(ValueError("\nfirst\nlast\n"), Path("r")) == "ValueError: last"
    assert steps.report_failure(RuntimeError(), Path("r")) == "RuntimeError"


def test_chunk_overlap_default_fits_any_chunk_size_and_reaches_config_and_notebook(tmp_path):
    assert [steps.chunk_overlap_for(n) for n in (128, 64, 32, 16, 8, 1)] == [16, 16, 8, 4, 2, 0]
    assert steps.chunk_overlap_for(16, 0) == 0 and steps.chunk_overlap_for(128, 32) == 32
    for size in (16, 4, 1):  # 16 tokens of overlap failed every chunk size of 16 or fewer
        spec = steps.CompareSpec(
            docs=("d",), backend="fake", chunk_size=size, output_dir=str(tmp_path)
        )
        assert steps.precheck(spec).retrieval.chunk_overlap == steps.chunk_overlap_for(size)
        assert steps.build_config(spec, tmp_path / "c.jsonl", tmp_path / "q.csv")["retrieval"][
            "chunk_overlap"
        ] == steps.chunk_overlap_for(size)
    spec = steps.CompareSpec(docs=("d",), backend="fake", chunk_size=16, chunk_overlap=16)
    with pytest.raises(
        ValueError,
        match=r"^--chunk-overlap must be less than --chunk-size \(16\); "
        "got 16$",
    ):  # a set one is checked, named by the options
        steps.precheck(spec)
    params = steps.notebook_parameters(spec, tmp_path / "q.csv")
    assert params["chunk_overlap"] == 16  # the notebook gets the option as given
    assert "chunk_overlap" in pm.inspect_notebook(str(steps.notebook_path()))
    nb = nbformat.read(steps.notebook_path(), as_version=4)
    assert "compare.chunk_overlap_for(chunk_size, chunk_overlap)" in "".join(
        c.source for c in nb.cells
    )


def test_a_paid_api_is_priced_by_its_models_own_sheet_or_refused(tmp_path, monkeypatch, serve):
    """--backend openai --model gpt-4.1 without --price-sheet was priced at example-hosted-api
    (~13x cheaper than the shipped openai-gpt-4.1 sheet), in the estimate it asked to spend on."""
    srv = serve(ok())
    monkeypatch.chdir(tmp_path)
    docs = make_docs(tmp_path / "docs")
    (tmp_path / "q.csv").write_text(QUESTIONS, encoding="utf-8")
    args = [
        str(docs),
        "--questions",
        "q.csv",
        "--backend",
        "openai",
        "--base-url",
        srv.url,
        "--tokenizer",
        "whitespace",
        "--embedder",
        "hash",
        "--quiet",
        "--no-report",
        "--output-dir",
        "out",
    ]
    own = compare([*args, "--model", "gpt-4.1"], input="n\n")
    assert own.exit_code == 1, own.output  # declined
    assert "price sheet: openai-gpt-4.1 (the shipped sheet of model gpt-4.1" in own.output
    assert "gpt-4.1 is a paid API (openai-gpt-4.1): run it?" in own.output
    assert "price_sheet: openai-gpt-4.1" in config_of(own.output).read_text()
    unknown = compare([*args, "--model", "m"])
    assert unknown.exit_code == 2, unknown.output
    (line,) = unknown.output.strip().splitlines()
    assert "no shipped price sheet is for model 'm'" in line
    assert "--price-sheet" in line and "ragbench prices list" in line
    assert srv.requests == []  # nothing sent, nothing read
    # local and fake backends keep the example sheet
    assert steps.price_sheet_for("fake", "gpt-4.1", None) == ("example-hosted-api", None)
    assert steps.price_sheet_for("openai", "m", "example-cpu-hour")[0] == "example-cpu-hour"


def test_max_dollars_caps_the_compare_run(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    docs = make_docs(tmp_path / "docs")
    (tmp_path / "q.csv").write_text(QUESTIONS, encoding="utf-8")
    args = [
        str(docs),
        "--questions",
        "q.csv",
        "--backend",
        "fake",
        "--embedder",
        "hash",
        "--quiet",
        "--output-dir",
        "out",
    ]
    zero = compare([*args, "--max-dollars", "0"])
    assert zero.exit_code == 2 and "greater than 0" in zero.output, zero.output
    tiny = compare([*args, "--max-dollars", "0.000001"])
    assert tiny.exit_code == 3, tiny.output
    assert "warning: estimated at most $" in tiny.output  # the estimate is over it
    assert "stopped: budget: spent $0.000000 of max_dollars $0.000001" in tiny.output
    assert "report: not written: the run stopped at --max-dollars" in tiny.output
    run_dir = config_of(tiny.output).parent
    assert "max_dollars: 1.0e-06" in (run_dir / "compare.yaml").read_text()
    assert not (run_dir / "report.html").exists()
    done = compare([*args, "--max-dollars", "100", "--no-report"])  # resumes in the same folder
    assert done.exit_code == 0, done.output
    assert config_of(done.output).parent == run_dir and VERDICT.search(done.output)


# a pipeline that, while ``block`` exists, says it started and then waits: a compare run to stop
SLOW_PIPELINE = """
import time
from pathlib import Path


def answer(question, example_id):
    if Path("block").exists():
        Path("started").touch()
        time.sleep(100)  # under the pipeline's 120 s timeout: the signal ends it, not the clock
    return {"answer": "Ada Quill"}
"""


def test_sigterm_stops_compare_as_it_stops_run_and_check_says_how_to_resume(tmp_path):
    """Issue 45: SIGTERM ended `ragbench compare` where it stood: its manifest said running, a
    lock owner stayed, nothing said it was interrupted, and `ragbench check` then said "no
    results.parquet". Now it stops as `ragbench run` does (exit 143, manifest interrupted, no
    owner or temporary file); check says so and how to resume; the same command resumes."""
    import os
    import signal
    import subprocess
    import time

    docs = make_docs(tmp_path / "docs")
    (tmp_path / "q.csv").write_text(QUESTIONS, encoding="utf-8")
    (tmp_path / "slow_pipe.py").write_text(SLOW_PIPELINE, encoding="utf-8")
    (tmp_path / "block").touch()
    root = str(Path(__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])}
    options = "--backend fake --embedder hash --no-report --quiet --output-dir out"
    cmd = [sys.executable, "-m", "ragbench.cli", "compare", str(docs), "--questions", "q.csv"]
    cmd += [*options.split(), "--pipeline", "slow_pipe:answer"]
    proc = subprocess.Popen(
        cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    deadline = time.monotonic() + 180
    while not (tmp_path / "started").exists():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the pipeline was never called"
        time.sleep(0.1)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 143, (out, err)
    assert "interrupted: " in err and "rerun to resume" in err  # the runner's line
    assert err.rstrip().endswith(
        "interrupted by SIGTERM: the records written are kept; run the same command again to resume"
    ), err
    (manifest,) = (tmp_path / "out").glob("*/manifest.json")
    run_dir = manifest.parent
    assert json.loads(manifest.read_text())["status"] == "interrupted"
    assert not (run_dir / ".lock.owner").exists()
    assert [p.name for p in (tmp_path / "out").rglob("*.tmp")] == []

    check = CliRunner().invoke(app, ["check", str(run_dir), "-r", "closed_book: contains >= 0"])
    assert check.exit_code == 1, check.output
    assert "no results.parquet" not in check.output
    assert "FAILED run: its manifest says interrupted at " in check.output
    assert "run the command that started it again to resume" in check.output

    (tmp_path / "block").unlink()  # the same command again: it resumes and finishes
    again = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr
    assert f"run folder: {run_dir}" in again.stdout
    manifest = json.loads(manifest.read_text())
    assert manifest["status"] == "finished" and len(manifest["sessions"]) == 2
