"""Importers end to end: SQuAD 2.0 unanswerable questions scored by declining, BEIR over the
whole corpus scored by a retrieval-only strategy against its qrels, LongBench's per-subset
metric recorded at import, and inputs that do not fit (a RULER chat template, an empty file)
refused with the file and line. Fixtures are small files the tests write."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from ragbench.cli.data import register
from ragbench.datasets import build_dataset, formats
from ragbench.datasets.corpus.file import read_documents, write_documents
from ragbench.datasets.questions import read_questions
from ragbench.io import InputFileError
from ragbench.llm.fake import FakeLLM
from ragbench.metrics.answer import score
from ragbench.metrics.normalize import NO_ANSWER
from ragbench.retrieval import metrics as rm
from ragbench.retrieval.retrievers import documents_by_max, to_run
from ragbench.strategies import Resources, get_strategy, run_batch
from ragbench.strategies.prompts import DECLINE, DECLINE_INSTRUCTION, is_declined, question_part
from ragbench.strategies.retrieve_only import RetrieveOnlyParams, judgements, metric_names
from ragbench.types import Chunk, Document, Example, ScoredChunk

FIX = Path(__file__).parent / "fixtures"
CONTEXT = "The Nile is the longest river in Africa. The Hoover Dam was finished in 1936."


def squad_v2(tmp_path: Path, unanswerable_only: bool = False) -> Path:
    qas = [
        {
            "id": "q-ans",
            "question": "Which river is the longest in Africa?",
            "answers": [{"text": "The Nile", "answer_start": 0}],
            "is_impossible": False,
        },
        {
            "id": "q-none",
            "question": "Who designed the Nile's first dam?",
            "answers": [],
            "is_impossible": True,
        },
    ]
    if unanswerable_only:
        qas = qas[1:]
    data = {
        "version": "v2.0",
        "data": [{"title": "Rivers", "paragraphs": [{"context": CONTEXT, "qas": qas}]}],
    }
    path = tmp_path / "squad2.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


# --------------------------------------------------------------------------- SQuAD 2.0


def test_no_answer_gold_is_the_decline_word_and_declining_scores_one():
    """Scored as the official SQuAD v2.0 script: exactly the decline word is the empty answer; a
    hedge that merely contains it is an answer (tests/test_squad_v2.py has the oracle)."""
    assert NO_ANSWER == DECLINE  # the gold is what the prompt asks a declining model to say
    meta = {"source": "squad", "squad_v2": True, "unanswerable": True}
    names = ["exact_match", "f1", "contains", "string_match_all"]
    for declined in ("unanswerable", "Unanswerable.", ""):
        assert is_declined(declined) or declined == ""
        assert score(declined, (NO_ANSWER,), names, meta) == dict.fromkeys(names, 1.0)
    # answering a question that has no answer is wrong on every metric, a hedge included
    for answer in ("Isambard Brunel", "Unanswerable: the text does not say"):
        assert score(answer, (NO_ANSWER,), names, meta) == dict.fromkeys(names, 0.0)
    # an answerable question: declining it is wrong
    has = {**meta, "unanswerable": False}
    assert score("unanswerable", ("The Nile",), ["exact_match"], has) == {"exact_match": 0.0}


def test_squad_v2_keeps_unanswerable_with_the_decline_option_or_drops_them(tmp_path):
    path = squad_v2(tmp_path)
    answerable, impossible = formats.load("squad", path)
    assert impossible.answers == (NO_ANSWER,) and impossible.meta["unanswerable"] is True
    # both are offered the decline option: offering it to one kind only would leak the gold
    for e in (answerable, impossible):
        assert e.meta["allow_decline"] is True
        assert question_part(e).count(DECLINE_INSTRUCTION.strip()) == 1
    [kept] = formats.load("squad", path, unanswerable="drop")
    assert kept.id == "q-ans" and "allow_decline" not in kept.meta
    assert DECLINE_INSTRUCTION.strip() not in question_part(kept)
    with pytest.raises(ValueError, match="unknown unanswerable policy 'skip'.*valid: drop, keep"):
        formats.load("squad", path, unanswerable="skip")
    only = squad_v2(tmp_path, unanswerable_only=True)
    with pytest.raises(InputFileError, match="squad2.json: all 1 questions are unanswerable"):
        formats.load("squad", only, unanswerable="drop")


def test_squad_v2_run_scores_declining_right_and_answering_wrong(tmp_path):
    from ragbench.experiment.runner import run

    seen: list[str] = []

    def reader(request) -> str:  # answers the river question, declines or guesses the other
        seen.append(request.prompt)
        if "Question: Which river" in request.prompt:
            return "The Nile"
        return "unanswerable" if "does not contain the answer" in request.prompt else "Brunel"

    cfg = {
        "name": "squad2",
        "dataset": {"name": "file", "params": {"path": str(squad_v2(tmp_path)), "format": "squad"}},
        "model": {"backend": "fake", "name": "fake", "cache": False},
        "strategies": ["long_context", "closed_book"],
        "metrics": ["exact_match", "f1"],
        "output_dir": str(tmp_path / "results"),
    }
    df = run(cfg, progress=False, llm=FakeLLM(answer_fn=reader))
    got = {(r["example_id"], r["strategy"]): r["exact_match"] for r in df.to_dict("records")}
    # long context offers the decline option (the "text above" may not hold the answer) and
    # the model declines: correct. Closed book has no text to decline about and guesses: wrong.
    assert got == {
        ("q-ans", "long_context"): 1.0,
        ("q-none", "long_context"): 1.0,
        ("q-ans", "closed_book"): 1.0,
        ("q-none", "closed_book"): 0.0,
    }
    assert sum(DECLINE_INSTRUCTION in p for p in seen) == 2  # both long-context prompts
    assert all(not r.get("unscored") for r in df.to_dict("records"))


# --------------------------------------------------------------------------- BEIR + retrieval


def test_document_run_aggregates_chunk_scores_by_max():
    def hit(chunk_id: str, doc_id: str, s: float) -> ScoredChunk:
        return ScoredChunk(Chunk(chunk_id, doc_id, "x", 0, 1), s)

    hits = [hit("d2#1", "d2", 0.9), hit("d1#0", "d1", 0.8), hit("d2#0", "d2", 0.7)]
    assert documents_by_max(hits) == {"d2": 0.9, "d1": 0.8}
    assert list(to_run(["q"], [hits], level="document")["q"]) == ["d2", "d1"]
    chunk_run = to_run(["q"], [hits])
    assert list(chunk_run["q"]) == ["d2#1", "d1#0", "d2#0"]
    qrels = {"q": {"d1": 1}}
    # chunk ids never equal document ids: refused instead of a silent 0
    with pytest.raises(ValueError, match="ranks chunk ids .* qrels judge document ids"):
        rm.evaluate(chunk_run, qrels, ["recall@2"])
    assert rm.evaluate(to_run(["q"], [hits], level="document"), qrels, ["mrr@2"]) == {"mrr@2": 0.5}
    # a genuinely bad document run is still a 0, not an error
    assert rm.evaluate({"q": {"d9": 1.0}}, qrels, ["recall@1"]) == {"recall@1": 0.0}
    with pytest.raises(ValueError, match="unknown run level 'doc'"):
        to_run(["q"], [hits], level="doc")


def _bm25_resources() -> Resources:
    from ragbench.retrieval import build_index

    def index(example: Example, settings):
        return build_index(
            example.documents,
            retriever="bm25",
            embedder="hash",
            splitter="sentence",
            chunk_size=16,
            chunk_overlap=2,
            tokenizer="whitespace",
        )

    return Resources(llm=None, index=index)


def test_retrieve_only_over_the_whole_beir_corpus():
    examples = formats.load("beir", FIX / "beir")
    params = RetrieveOnlyParams(retriever="bm25", top_k=3)
    assert get_strategy("retrieve_only").generates is False
    records = run_batch([(e, params) for e in examples], _bm25_resources())
    by_id = {r.example_id: r for r in records}
    assert set(by_id) == {"q1", "q2", "q3"} and not any(isinstance(r, Exception) for r in records)
    for r in records:
        assert set(r.scores) == set(metric_names(3))
        assert r.prediction == "" and r.cost.llm_calls == 0 and r.cost.retrieval_seconds > 0
        assert r.meta["retrieved_docs"][0] in r.meta["relevant_docs"]  # document ids, not chunks
        assert len(r.meta["retrieved_docs"]) == 3  # ranked over all 4 documents
    # each query's one relevant document ranks first over the whole corpus
    assert all(r.scores["mrr@1"] == 1.0 and r.scores["recall@3"] == 1.0 for r in records)
    # q2: d3 graded 2, d4 judged 0 (not relevant): nDCG@1 is 1 when d3 leads
    assert by_id["q2"].scores["ndcg@1"] == 1.0 and by_id["q2"].meta["relevant_docs"] == ["d3"]


def test_retrieve_only_judgements_from_qrels_or_evidence():
    doc = Document("d1", "text")
    assert judgements(Example("a", "q", (), (doc,), {"qrels": {"d1": 2, "d2": 0}})) == {
        "d1": 2,
        "d2": 0,
    }
    assert judgements(Example("b", "q", ("x",), (doc,), {"evidence": [["d1", 0, 4]]})) == {"d1": 1}
    with pytest.raises(ValueError, match="example 'c': retrieve_only needs relevance judgements"):
        judgements(Example("c", "q", ("x",), (doc,), {}))
    assert metric_names(10) == [f"{m}@{k}" for m in ("recall", "ndcg", "mrr") for k in (1, 5, 10)]
    assert metric_names(3)[:2] == ["recall@1", "recall@3"]
    with pytest.raises(ValueError, match="top_k must be an integer >= 1, got 0"):
        RetrieveOnlyParams(top_k=0)


def test_retrieve_only_in_a_run(tmp_path):
    """The runner builds the index and tabulates retrieval scores; no answer is generated."""
    from ragbench.experiment.runner import run

    cfg = {
        "name": "ro",
        "dataset": {
            "name": "file",
            "params": {"path": str(FIX / "squad_v1.json"), "format": "squad"},
        },
        "model": {"backend": "fake", "name": "fake", "cache": False},
        "retrieval": {
            "retriever": "bm25",
            "embedder": "hash",
            "chunk_size": 16,
            "chunk_overlap": 2,
            "tokenizer": "whitespace",
        },
        "strategies": [{"name": "retrieve_only", "params": {"top_k": 1}}],
        "metrics": ["exact_match"],
        "output_dir": str(tmp_path / "results"),
    }
    calls: list[str] = []
    df = run(cfg, progress=False, llm=FakeLLM(answer_fn=lambda r: calls.append(r.prompt) or ""))
    assert calls == [] and len(df) == 4
    assert set(df["recall@1"]) <= {0.0, 1.0} and df["recall@1"].notna().all()
    assert df["exact_match"].isna().all() and (df["llm_calls"] == 0).all()


def test_import_beir_writes_a_shared_corpus_that_runs(tmp_path, monkeypatch):
    app = typer.Typer()
    app.callback()(lambda: None)
    register(app)
    monkeypatch.chdir(tmp_path)
    shutil.copytree(FIX / "beir", tmp_path / "scifact")
    result = CliRunner().invoke(app, ["data", "import", "beir", "scifact"])
    assert result.exit_code == 0, result.output
    corpus = tmp_path / "data/generated/beir-scifact.corpus.jsonl"
    questions = tmp_path / "data/generated/beir-scifact.questions.jsonl"
    assert "wrote 4 documents" in result.output and "3 questions" in result.output
    assert len(corpus.read_text().splitlines()) == 4  # stored once, not once per question
    examples = build_dataset("corpus", corpus=str(corpus), questions=str(questions))
    assert [e.id for e in examples] == ["q1", "q2", "q3"]
    assert examples[1].meta["qrels"] == {"d3": 2, "d4": 0} and len(examples[1].documents) == 4
    records = run_batch(
        [(e, RetrieveOnlyParams(retriever="bm25", top_k=3)) for e in examples], _bm25_resources()
    )
    assert [r.scores["recall@3"] for r in records] == [1.0, 1.0, 1.0]

    # the same through `ragbench run`: no gold answers, no model loaded, a resume keeps scores
    import ragbench.experiment.runner as runner

    monkeypatch.setattr(runner, "load_model", lambda cfg: pytest.fail("loaded a model"))
    cfg = {
        "name": "beir-only",
        "dataset": {
            "name": "corpus",
            "params": {"corpus": str(corpus), "questions": str(questions)},
        },
        "model": {"backend": "fake", "name": "fake", "cache": False},
        "retrieval": {"tokenizer": "whitespace", "embedder": "hash", "retriever": "bm25"},
        "strategies": [{"name": "retrieve_only", "params": {"top_k": 3}}],
        "metrics": [],
        "output_dir": str(tmp_path / "runs"),
    }
    first = runner.run(cfg, progress=False)
    assert first["error"].isna().all() and first["recall@3"].tolist() == [1.0, 1.0, 1.0]
    again = runner.run(cfg, progress=False)  # nothing pending: scores are not recomputed
    assert again["recall@3"].tolist() == [1.0, 1.0, 1.0]
    manifest = json.loads((Path(first.attrs["run_dir"]) / "manifest.json").read_text())
    assert manifest["model"] == {"retrieval_only": True}
    # `ragbench run` summarises the retrieval metrics it computed, not an unscored answer metric
    from ragbench.cli.run import shown_metrics
    from ragbench.experiment.config.run import load_config

    default = load_config({k: v for k, v in cfg.items() if k != "metrics"})  # string_match_all
    assert shown_metrics(default, first) == ["recall@3", "ndcg@3", "mrr@3"]


# --------------------------------------------------------------------------- LongBench


def _longbench(tmp_path: Path, *rows: dict) -> Path:
    path = tmp_path / "lb.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def _lb_row(i: int, **over) -> dict:
    row = {
        "input": "q?",
        "context": "c",
        "answers": ["a"],
        "length": 1,
        "dataset": "hotpotqa",
        "_id": f"lb{i}",
    }
    return row | over


def test_longbench_records_each_subsets_official_metric():
    by_id = {e.id: e for e in formats.load("longbench", FIX / "longbench.jsonl")}
    assert by_id["lb-0001"].meta["metric"] == "qa_f1_score"  # hotpotqa
    assert by_id["lb-0002"].meta["metric"] == "classification_score"  # trec, over all_classes
    assert by_id["lb-0003"].meta["metric"] == "rouge_score"  # gov_report
    trec = by_id["lb-0002"]
    assert score("Numeric", trec.answers, ["longbench"], trec.meta) == {"longbench": 1.0}


@pytest.mark.parametrize(
    ("bad", "field", "words"),
    [
        ({"dataset": "toy"}, "dataset", "unknown LongBench subset 'toy'"),
        ({"dataset": "trec"}, "all_classes", "trec is scored over its classes"),
        ({"dataset": "passage_retrieval_en", "answers": ["3"]}, "answers[0]", "'Paragraph N'"),
    ],
)
def test_longbench_rows_that_cannot_be_scored_name_the_line(tmp_path, bad, field, words):
    path = _longbench(tmp_path, _lb_row(1), _lb_row(2, **bad))
    with pytest.raises(InputFileError, match=rf"lb.jsonl:2: field '{re.escape(field)}'.*{words}"):
        formats.load("longbench", path)


# --------------------------------------------------------------------------- inputs that do not fit


@pytest.mark.parametrize(
    "last_line",
    ["Answer:", "<|im_start|>assistant", "[/INST]", "### Response:", "<start_of_turn>model"],
)
def test_ruler_input_with_an_unexpected_template_names_the_line(tmp_path, last_line):
    good = {
        "index": 0,
        "input": "Text. The special magic number is 7.\nWhat is the number?",
        "outputs": ["7"],
        "length": 9,
    }
    bad = dict(good, index=1, input=good["input"] + "\n" + last_line)
    path = tmp_path / "ruler.jsonl"
    path.write_text(json.dumps(good) + "\n" + json.dumps(bad) + "\n", encoding="utf-8")
    with pytest.raises(InputFileError, match=r"ruler.jsonl:2: field 'input':.*is not a question"):
        formats.load("ruler", path)
    assert formats.load("ruler", FIX / "ruler.jsonl")[0].question.startswith("What is")


@pytest.mark.parametrize("fmt", ["longbench", "ruler", "jsonl"])
def test_an_empty_file_is_an_error(tmp_path, fmt):
    path = tmp_path / "empty.jsonl"
    path.write_text("\n", encoding="utf-8")
    with pytest.raises(InputFileError, match=r"empty.jsonl: no examples"):
        formats.load(fmt, path)


def test_empty_squad_and_unjudged_beir_are_errors(tmp_path):
    squad = tmp_path / "s.json"
    squad.write_text(json.dumps({"version": "v2.0", "data": []}))
    with pytest.raises(InputFileError, match="s.json: no questions"):
        formats.load("squad", squad)
    root = tmp_path / "beir"
    shutil.copytree(FIX / "beir", root)
    (root / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\n")
    with pytest.raises(InputFileError, match=r"test.tsv: no judgements"):
        formats.load("beir", root)


def test_cli_empty_longbench_exits_2_with_one_line_and_writes_nothing(tmp_path, monkeypatch):
    app = typer.Typer()
    app.callback()(lambda: None)
    register(app)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "lb.jsonl").write_text("")
    result = CliRunner().invoke(app, ["data", "import", "longbench", "lb.jsonl"])
    assert result.exit_code == 2
    assert result.output.strip().count("\n") == 0 and "lb.jsonl: no examples" in result.output
    assert not (tmp_path / "data").exists()
    result = CliRunner().invoke(
        app, ["data", "import", "longbench", "lb.jsonl", "--unanswerable", "drop"]
    )
    assert result.exit_code == 2 and "--unanswerable applies to the squad format only" in (
        result.output
    )


# --------------------------------------------------------------------------- byte order marks

BOM = "\ufeff".encode()


def _with_bom(path: Path) -> Path:
    path.write_bytes(BOM + path.read_bytes())
    return path


def test_every_json_jsonl_and_tsv_reader_skips_a_byte_order_mark(tmp_path):
    """Windows editors open a UTF-8 file with a byte order mark: no reader takes it as content."""
    lb = _with_bom(_longbench(tmp_path, _lb_row(1)))
    assert [e.id for e in formats.load("longbench", lb)] == ["lb1"]
    squad = _with_bom(squad_v2(tmp_path))
    assert len(formats.load("squad", squad)) == 2
    root = tmp_path / "beir"
    shutil.copytree(FIX / "beir", root)
    for name in ("corpus.jsonl", "queries.jsonl"):
        _with_bom(root / name)
    qrels = root / "qrels" / "test.tsv"  # no header line: the BOM sits before a query id
    qrels.write_text("".join(qrels.read_text().splitlines(keepends=True)[1:]))
    _with_bom(qrels)
    assert {e.id for e in formats.load("beir", root)} == {"q1", "q2", "q3"}
    corpus = _with_bom(write_documents(tmp_path / "c.jsonl", [Document("d1", "Cats sleep.")]))
    assert [d.id for d in read_documents(corpus)] == ["d1"]
    questions = tmp_path / "q.jsonl"
    questions.write_bytes(BOM + b'{"question": "How long?", "answers": ["16 hours"]}\n')
    assert [q.question for q in read_questions(questions)] == ["How long?"]


def test_a_byte_order_mark_does_not_shift_the_column_of_an_error(tmp_path):
    path = tmp_path / "lb.jsonl"
    path.write_bytes(BOM + b'{"input": x}\n')
    with pytest.raises(InputFileError, match=r"lb.jsonl:1: invalid JSON \(.* at column 11\)"):
        formats.load("longbench", path)
    squad = tmp_path / "s.json"
    squad.write_bytes(BOM + b'{"data": x}\n')
    with pytest.raises(InputFileError, match=r"s.json:1: invalid JSON \(.* at column 10\)"):
        formats.load("squad", squad)


@pytest.mark.parametrize("fmt", ["longbench", "longbench-v2", "ruler", "squad", "jsonl"])
def test_a_folder_given_for_a_file_says_it_wants_a_file(tmp_path, fmt):
    folder = tmp_path / "data"
    folder.mkdir()
    with pytest.raises(InputFileError, match=r"data: is a folder; expected a file"):
        formats.load(fmt, folder)


@pytest.mark.parametrize(
    "text",
    [
        json.dumps([_lb_row(1)], indent=2),  # a JSON array, pretty-printed
        json.dumps(_lb_row(1), indent=2),  # one object, pretty-printed
        json.dumps([_lb_row(1), _lb_row(2)]),  # an array on one line
    ],
)
def test_a_json_document_given_for_json_lines_is_named_as_such(tmp_path, text):
    path = tmp_path / "lb.json"
    path.write_text(text + "\n", encoding="utf-8")
    with pytest.raises(
        InputFileError,
        match=r"lb.json:1: .*looks like a JSON document, not JSON "
        r"Lines: write one JSON object per line",
    ):
        formats.load("longbench", path)
    path.write_text(json.dumps(_lb_row(1)) + '\n{"input": "cut off\n', encoding="utf-8")
    with pytest.raises(InputFileError) as err:  # a torn later line is only invalid JSON
        formats.load("longbench", path)
    assert err.value.line == 2 and "JSON document" not in str(err.value)
