"""The README's "Bring your own documents" examples are real: extracted and parsed as written;
its llama-index pipeline (``handbook_rag.py``) runs as written, offline, through its command."""

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

README = Path(__file__).resolve().parents[1] / "README.md"
_EXAMPLE = re.compile(r"<!-- readme-example: (\S+) -->\n```\w*\n(.*?)```", re.DOTALL)
_PIPELINE = re.compile(r"<!-- readme-pipeline: handbook_rag.py -->\n```\w*\n(.*?)```", re.DOTALL)


def readme_examples() -> dict[str, str]:
    return dict(_EXAMPLE.findall(README.read_text(encoding="utf-8")))


@pytest.fixture()
def workdir(tmp_path, monkeypatch):
    """The README's files written side by side, as a user would, and the folder made current."""
    examples = readme_examples()
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


def test_section_is_four_commands_or_fewer():
    text = README.read_text(encoding="utf-8")
    section = text.split("## Bring your own documents", 1)[1].split("\n## ", 1)[0]
    blocks = [b.strip().splitlines() for b in re.findall(r"```bash\n(.*?)```", section, re.DOTALL)]
    # the one command (`ragbench compare`), then the same work step by step
    assert blocks[0][0].startswith("ragbench compare")
    commands = next(b for b in blocks if b[0].startswith("ragbench data docs"))
    assert len(commands) <= 4
    assert commands[0].startswith("ragbench data docs") and commands[-1].startswith("ragbench run")


REFUNDS_MD = (
    "# Refunds\n\nRefunds are paid within 14 days of the return.\n"
    "Write to help@example.com for anything else.\n"
)


def test_readme_corpus_line_is_what_ingest_writes(workdir):
    from ragbench.datasets.corpus.docs import ingest

    folder = workdir / "handbook"
    folder.mkdir()
    (folder / "refunds.md").write_text(REFUNDS_MD, encoding="utf-8")
    [doc] = ingest([folder]).documents
    assert doc.to_json() + "\n" == readme_examples()["corpus.jsonl"]


def test_readme_questions_and_config_parse_over_the_readme_corpus(workdir, caplog):
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


def test_readme_jsonl_example_is_valid_ragbench_jsonl(workdir):
    [example] = read_examples("example.jsonl")
    [(doc_id, start, end)] = example.evidence
    doc = next(d for d in example.documents if d.id == doc_id)
    assert doc.text[start:end] == example.answers[0]


@pytest.mark.slow  # the snippet loads MiniLM
def test_readme_llamaindex_pipeline_runs_as_written(workdir, monkeypatch, request):
    """``handbook_rag.py`` copied from the README, run by the README's command (on the fake
    backend), with no llama-index LLM set anywhere else: it must bring its own (offline), or
    llama-index falls back to OpenAI."""
    from llama_index.core import Settings
    from typer.testing import CliRunner

    import ragbench.strategies.pipeline.strategy as pipeline_strategy
    from ragbench.cli import app

    text = README.read_text(encoding="utf-8")
    [snippet] = _PIPELINE.findall(text)
    (workdir / "handbook_rag.py").write_text(snippet, encoding="utf-8")
    (workdir / "handbook").mkdir()
    (workdir / "handbook" / "refunds.md").write_text(REFUNDS_MD, encoding="utf-8")
    monkeypatch.delitem(sys.modules, "handbook_rag", raising=False)
    request.addfinalizer(lambda: sys.modules.pop("handbook_rag", None))  # no other test finds it
    monkeypatch.setattr(pipeline_strategy, "_opened", {})  # no engine another test built
    monkeypatch.setattr(Settings, "_llm", None)  # no LLM another test set
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    section = text.split("## Your own pipeline beside long context", 1)[1]
    command = next(line for line in section.splitlines() if "--pipeline handbook_rag:" in line)
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
