"""The documentation's examples are real: the files of docs/your-documents.md and
docs/datasets.md extracted and parsed as written; docs/pipeline.md's llama-index pipeline
(``handbook_rag.py``) runs as written, offline, through its command; the README's "Your
documents" section opens with that one command."""

from __future__ import annotations

import logging
import re
import shlex
import sys
from pathlib import Path

import pytest

from ragbench.datasets import build_dataset
from ragbench.datasets.corpus.file import read_documents
from ragbench.datasets.formats import read_examples
from ragbench.experiment.config.run import load_config

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
YOUR_DOCUMENTS = ROOT / "docs" / "your-documents.md"
EXAMPLE_PAGES = (YOUR_DOCUMENTS, ROOT / "docs" / "datasets.md")
PIPELINE = ROOT / "docs" / "pipeline.md"
_EXAMPLE = re.compile(r"<!-- docs-example: (\S+) -->\n```\w*\n(.*?)```", re.DOTALL)
_PIPELINE = re.compile(r"<!-- docs-pipeline: handbook_rag.py -->\n```\w*\n(.*?)```", re.DOTALL)


def docs_examples() -> dict[str, str]:
    """Every ``<!-- docs-example: NAME -->`` file of the pages that show them, by name."""
    found = [m for page in EXAMPLE_PAGES for m in _EXAMPLE.findall(page.read_text("utf-8"))]
    assert len({name for name, _ in found}) == len(found), "an example name shown twice"
    return dict(found)


@pytest.fixture()
def workdir(tmp_path, monkeypatch):
    """The documentation's files written side by side, as a user would, and the folder made
    current."""
    examples = docs_examples()
    assert set(examples) == {
        "corpus.jsonl",
        "questions.csv",
        "questions.jsonl",
        "my-docs.yaml",
        "example.jsonl",
    }
    for name, text in examples.items():
        (tmp_path / name).write_text(text, encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _bash_blocks(text: str) -> list[list[str]]:
    return [b.strip().splitlines() for b in re.findall(r"```bash\n(.*?)```", text, re.DOTALL)]


def test_your_documents_is_one_command_then_four_or_fewer():
    # the one command (`ragbench compare`), then the same work step by step
    blocks = _bash_blocks(YOUR_DOCUMENTS.read_text(encoding="utf-8"))
    assert blocks[0][0].startswith("ragbench compare")
    commands = next(b for b in blocks if b[0].startswith("ragbench data docs"))
    assert len(commands) <= 4
    assert commands[0].startswith("ragbench data docs") and commands[-1].startswith("ragbench run")
    # the README's section shows the same one command first
    readme = README.read_text(encoding="utf-8")
    section = readme.split("\n## Your documents\n", 1)[1].split("\n## ", 1)[0]
    assert _bash_blocks(section)[0] == blocks[0]


REFUNDS_MD = (
    "# Refunds\n\nRefunds are paid within 14 days of the return.\n"
    "Write to help@example.com for anything else.\n"
)


def test_docs_corpus_line_is_what_ingest_writes(workdir):
    from ragbench.datasets.corpus.docs import ingest

    folder = workdir / "handbook"
    folder.mkdir()
    (folder / "refunds.md").write_text(REFUNDS_MD, encoding="utf-8")
    [doc] = ingest([folder]).documents
    assert doc.to_json() + "\n" == docs_examples()["corpus.jsonl"]


def test_docs_questions_and_config_parse_over_the_docs_corpus(workdir, caplog):
    [doc] = read_documents("corpus.jsonl")
    with caplog.at_level(logging.WARNING):
        from_csv = build_dataset("corpus", corpus="corpus.jsonl", questions="questions.csv")
        from_jsonl = build_dataset("corpus", corpus="corpus.jsonl", questions="questions.jsonl")
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]  # every quote found
    assert [e.id for e in from_csv] == ["refund-days", "support"]
    assert from_csv[0].answers == ("14 days", "fourteen days")
    for a, b in zip(from_csv, from_jsonl, strict=True):
        assert (a.id, a.question, a.answers, a.meta["evidence"]) == (
            b.id,
            b.question,
            b.answers,
            b.meta["evidence"],
        )
    [[doc_id, start, end]] = from_csv[1].meta["evidence"]
    assert (doc_id, doc.text[start:end]) == ("refunds.md", "Write to help@example.com")
    assert from_jsonl[1].meta["topic"] == "contact"

    cfg = load_config(workdir / "my-docs.yaml")
    assert cfg.dataset.name == "corpus"
    examples = build_dataset(cfg.dataset.name, **dict(cfg.dataset.params))
    assert examples == from_csv
    assert [s.name for s in cfg.strategies] == ["closed_book", "long_context", "rag"]


def test_docs_jsonl_example_is_valid_ragbench_jsonl(workdir):
    [example] = read_examples("example.jsonl")
    [(doc_id, start, end)] = example.evidence
    doc = next(d for d in example.documents if d.id == doc_id)
    assert doc.text[start:end] == example.answers[0]


@pytest.mark.slow  # the snippet loads MiniLM
def test_docs_llamaindex_pipeline_runs_as_written(workdir, monkeypatch, request):
    """``handbook_rag.py`` copied from docs/pipeline.md, run by the page's command (on the fake
    backend), with no llama-index LLM set anywhere else: it must bring its own (offline), or
    llama-index falls back to OpenAI."""
    from llama_index.core import Settings
    from typer.testing import CliRunner

    import ragbench.strategies.pipeline.strategy as pipeline_strategy
    from ragbench.cli import app

    text = PIPELINE.read_text(encoding="utf-8")
    [snippet] = _PIPELINE.findall(text)
    (workdir / "handbook_rag.py").write_text(snippet, encoding="utf-8")
    (workdir / "handbook").mkdir()
    (workdir / "handbook" / "refunds.md").write_text(REFUNDS_MD, encoding="utf-8")
    monkeypatch.delitem(sys.modules, "handbook_rag", raising=False)
    request.addfinalizer(lambda: sys.modules.pop("handbook_rag", None))  # no other test finds it
    monkeypatch.setattr(pipeline_strategy, "_opened", {})  # no engine another test built
    monkeypatch.setattr(Settings, "_llm", None)  # no LLM another test set
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    command = next(line for line in text.splitlines() if "--pipeline handbook_rag:" in line)
    args = shlex.split(command)[2:] + ["--backend", "fake", "--quiet", "--no-report"]
    result = CliRunner().invoke(app, ["compare", *args, "--output-dir", "out"])
    assert result.exit_code == 0, result.output
    run_dir = Path(re.search(r"^run folder: (\S+)", result.output, re.M).group(1))
    import pandas as pd

    pipe = pd.read_parquet(run_dir / "results.parquet").query("strategy == 'pipeline'")
    assert len(pipe) == 2 and pipe["error"].isna().all(), pipe["error"].tolist()
    assert (pipe["pipeline_kind"] == "query_engine").all()
    # its contexts are the corpus's documents: ranked against the questions' evidence
    assert pipe["contexts"].map(lambda cs: {c["doc_id"] for c in cs} == {"refunds.md"}).all()
    assert (pipe["hit@1"] == 1.0).all()
