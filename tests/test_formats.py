"""Dataset file formats: importers read their fixtures, round-trip, and reject bad input clearly."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from ragbench.datasets import beir, formats
from ragbench.datasets.corpus.file import corpus_fingerprint, read_documents, write_documents
from ragbench.io import InputFileError, sha256_file
from ragbench.registry import UnknownNameError
from ragbench.types import Document, Example

FIX = Path(__file__).parent / "fixtures"
BAD = FIX / "malformed"

CASES = [
    ("longbench", FIX / "longbench.jsonl", 3),
    ("ruler", FIX / "ruler.jsonl", 2),
    ("squad", FIX / "squad_v1.json", 4),
    ("squad", FIX / "squad_v2.json", 2),
    ("beir", FIX / "beir", 3),
]


def _span_text(example: Example, span) -> str:
    doc_id, start, end = span
    doc = next(d for d in example.documents if d.id == doc_id)
    return doc.text[start:end]


@pytest.mark.parametrize(("fmt", "path", "n"), CASES)
def test_import_round_trips_through_ragbench_jsonl(tmp_path, fmt, path, n):
    examples = formats.load(fmt, path)
    assert len(examples) == n
    out = formats.write_examples(tmp_path / "out.jsonl", examples)
    again = formats.read_examples(out)
    assert again == examples
    assert formats.load("jsonl", out) == examples
    # the fingerprint is the sha256 of exactly the bytes written, and changes with the data
    assert formats.fingerprint(again) == sha256_file(out)
    assert formats.fingerprint(examples[1:]) != formats.fingerprint(examples)
    # canonical: writing what was read gives byte-identical files
    formats.write_examples(tmp_path / "again.jsonl", again)
    assert (tmp_path / "again.jsonl").read_bytes() == out.read_bytes()
    for e in examples:  # evidence spans are inside their documents
        for span in e.evidence:
            assert _span_text(e, span)


def test_longbench_values():
    first, second, third = formats.load("longbench", FIX / "longbench.jsonl")
    assert first.id == "lb-0001" and first.question == "Who founded the Lakeside Observatory?"
    assert first.answers == ("Margaret Hale",)
    assert len(first.documents) == 1 and first.documents[0].text.startswith("Passage 1:\nThe Lake")
    assert first.meta["dataset"] == "hotpotqa" and first.meta["length"] == 25
    assert first.meta["language"] == "en" and first.meta["all_classes"] is None
    assert second.meta["all_classes"][-1] == "Numeric"
    assert "café" in third.documents[0].text  # UTF-8 preserved
    assert "all_classes" in third.meta and third.meta["all_classes"] is None  # optional field


def test_ruler_splits_question_from_context_and_finds_evidence():
    niah, vt = formats.load("ruler", FIX / "ruler.jsonl")
    assert niah.id == "0"
    assert (
        niah.question
        == "What is the special magic number for quiet-lake mentioned in the provided text?"
    )
    assert niah.documents[0].text.endswith("The sun is yellow. Here we go.")
    assert niah.question not in niah.documents[0].text
    assert [_span_text(niah, s) for s in niah.evidence] == ["4817263"]
    assert niah.meta["answer_prefix"].startswith(" The special magic number")
    assert niah.meta["length"] == 62 and niah.meta["length_w_model_temp"] == 70
    assert vt.question.startswith("Question: Find all variables")
    assert vt.answers == ("QXKZB", "HLMPA", "RTYUI")
    found = [_span_text(vt, s) for s in vt.evidence]
    assert sorted(set(found)) == ["HLMPA", "QXKZB", "RTYUI"]
    assert found.count("QXKZB") == 2  # every occurrence, in text order
    assert [s[1] for s in vt.evidence] == sorted(s[1] for s in vt.evidence)


def test_squad_v1_offsets_become_evidence_spans():
    examples = {e.id: e for e in formats.load("squad", FIX / "squad_v1.json")}
    q1, q2, q3 = examples["sq1-q1"], examples["sq1-q2"], examples["sq1-q3"]
    assert q1.answers == ("Margaret Hale",)  # duplicate annotations merged
    assert q1.evidence == [("0-0", 48, 61)]
    assert q2.answers == ("1891", "in 1891")
    assert [_span_text(q2, s) for s in q2.evidence] == ["1891", "in 1891"]
    assert q3.documents[0].id == "0-1" and q3.documents[0].title == "Lakeside_Observatory"
    assert q1.documents == q2.documents  # one paragraph, shared
    assert examples["sq1-q4"].documents[0].title == "Harbour_Bridge"
    assert all(e.meta["unanswerable"] is False for e in examples.values())


def test_squad_v2_keeps_unanswerable_questions():
    answerable, impossible = formats.load("squad", FIX / "squad_v2.json")
    assert answerable.answers == ("1932",) and answerable.meta["unanswerable"] is False
    # the no-answer gold: declining is the correct answer (metrics.score); every question of
    # the file is offered the decline option, so it cannot give the gold away
    assert impossible.answers == ("unanswerable",) and impossible.meta["unanswerable"] is True
    assert answerable.meta["allow_decline"] is True and impossible.meta["allow_decline"] is True
    assert impossible.evidence == []
    assert impossible.meta["plausible_answers"] == ["1932"]
    assert impossible.meta["version"] == "v2.0"


def test_beir_examples_reference_the_corpus():
    examples = formats.load("beir", FIX / "beir")
    assert [e.id for e in examples] == ["q1", "q2", "q3"]  # q4 has no judgement
    q2 = examples[1]
    assert q2.question == "length of the harbour bridge" and q2.answers == ()
    # the whole corpus, one tuple shared by every query (retrieval over only the judged
    # documents would be trivial); score-0 judgements are in the qrels, not the evidence
    assert [d.id for d in q2.documents] == ["d1", "d2", "d3", "d4"]
    assert all(e.documents is q2.documents for e in examples)
    assert q2.meta["qrels"] == {"d3": 2, "d4": 0}
    assert q2.meta["split"] == "test"
    assert q2.meta["corpus_fingerprint"] == corpus_fingerprint(q2.documents)
    assert Path(q2.meta["corpus_path"]) == FIX / "beir" / "corpus.jsonl"
    assert examples[0].documents[0].meta == {"url": "https://example.org/hale"}
    assert [_span_text(q2, s) for s in q2.evidence] == [q2.documents[2].text]
    assert q2.evidence == [("d3", 0, len(q2.documents[2].text))]
    dev = formats.load("beir", FIX / "beir", split="dev")
    assert [(e.id, e.meta["qrels"]) for e in dev] == [("q2", {"d4": 1})]


def test_load_beir_returns_the_corpus_once():
    data = beir.load_beir(FIX / "beir")
    assert list(data.corpus) == ["d1", "d2", "d3", "d4"]
    assert data.corpus["d2"] == Document(
        "d2", "A refractor uses lenses; a reflector uses mirrors.", "Telescopes"
    )
    assert data.queries["q4"] == "a query without judgements"
    assert data.qrels == {"q1": {"d1": 1}, "q2": {"d3": 2, "d4": 0}, "q3": {"d2": 1}}


def test_unknown_format_and_split_name_the_valid_ones():
    with pytest.raises(
        UnknownNameError, match=r"did you mean 'squad'\?.*valid: beir, flashrag, hf, jsonl"
    ):
        formats.load("sqaud", FIX / "squad_v1.json")
    with pytest.raises(UnknownNameError, match=r"unknown BEIR split 'tset'.*valid: dev, test"):
        formats.load("beir", FIX / "beir", split="tset")
    assert set(formats.IMPORTERS) == {"jsonl", "longbench", "ruler", "squad", "beir"} | {
        "longbench-v2",
        "flashrag",
        "hf",  # also datasets, under the same names
    }


# --------------------------------------------------------------------------- malformed input


def _error(fmt: str, path: Path) -> InputFileError:
    with pytest.raises(InputFileError) as info:
        formats.load(fmt, path)
    return info.value


@pytest.mark.parametrize(
    ("fmt", "name", "line", "field", "words"),
    [
        ("longbench", "longbench_bad_json.jsonl", 2, None, "invalid JSON"),
        ("longbench", "longbench_missing_field.jsonl", 2, "context", "missing required field"),
        ("longbench", "longbench_bad_answers.jsonl", 3, "answers[1]", "expected a string"),
        ("ruler", "ruler_bad_outputs.jsonl", 1, "outputs", "expected a list of strings"),
        (
            "squad",
            "squad_bad_answer_start.json",
            34,
            "data[0].paragraphs[1].qas[0].answers[0].answer_start",
            "does not point at the answer text 'a reflector'",
        ),
    ],
)
def test_malformed_fixture_names_file_line_and_field(fmt, name, line, field, words):
    err = _error(fmt, BAD / name)
    assert (err.path, err.line, err.field) == (str(BAD / name), line, field)
    assert str(err).startswith(f"{BAD / name}:{line}:")
    if field:
        assert f"field {field!r}" in str(err)
    assert words in str(err)


def _write_lines(path: Path, rows) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


GOOD = {"id": "e1", "question": "q?", "answers": ["a"], "documents": [{"id": "d", "text": "abc"}]}


@pytest.mark.parametrize(
    ("change", "field", "words"),
    [
        ({"answers": "a"}, "answers", "expected a list of strings, got a string"),
        ({"answers": [["a"]]}, "answers[0]", "got a list"),
        ({"id": 3}, "id", "expected a string, got an integer"),
        ({"documents": [{"id": "d"}]}, "documents[0].text", "missing required field"),
        (
            {"documents": [{"id": "d", "text": "x", "url": "u"}]},
            "documents[0].url",
            "unknown field",
        ),
        ({"colour": "red"}, "colour", "unknown field; valid: answers, documents, id, meta"),
        ({"meta": {"evidence": [["zz", 0, 1]]}}, "meta.evidence[0]", "unknown document id 'zz'"),
        ({"meta": {"evidence": [["d", 2, 9]]}}, "meta.evidence[0]", "outside document 'd'"),
        ({"documents": [{"id": "d", "text": "x"}] * 2}, "documents[1].id", "duplicate document"),
    ],
)
def test_bad_ragbench_jsonl_rows(tmp_path, change, field, words):
    path = _write_lines(tmp_path / "ex.jsonl", [GOOD, {**GOOD, "id": "e2", **change}])
    err = _error("jsonl", path)
    assert (err.line, err.field) == (2, field)
    assert str(err).startswith(f"{path}:2: field {field!r}:") and words in str(err)


def test_duplicate_example_ids_are_refused(tmp_path):
    path = _write_lines(tmp_path / "ex.jsonl", [GOOD, GOOD])
    err = _error("jsonl", path)
    assert (err.line, err.field) == (2, "id") and "first on line 1" in str(err)
    ex = formats.read_examples(_write_lines(tmp_path / "one.jsonl", [GOOD]))
    with pytest.raises(ValueError, match="duplicate example id 'e1'"):
        formats.write_examples(tmp_path / "dup.jsonl", ex * 2)
    assert not (tmp_path / "dup.jsonl").exists()


def test_ruler_input_without_a_question_line(tmp_path):
    row = {"index": 5, "input": "only one line", "outputs": ["x"], "length": 3}
    err = _error("ruler", _write_lines(tmp_path / "r.jsonl", [row]))
    assert (err.line, err.field) == (1, "input") and "question on its own last line" in str(err)


def _squad(tmp_path: Path, qa: dict) -> Path:
    data = {
        "version": "v2.0",
        "data": [{"title": "T", "paragraphs": [{"context": "abc def", "qas": [qa]}]}],
    }
    path = tmp_path / "squad.json"
    path.write_text(json.dumps(data, indent=2), encoding="utf-8")
    return path


@pytest.mark.parametrize(
    ("qa", "field", "words"),
    [
        (
            {"id": "q", "question": "?", "answers": [{"text": "def", "answer_start": -1}]},
            "answer_start",
            "does not point",
        ),
        (
            {"id": "q", "question": "?", "answers": [{"text": "def", "answer_start": "4"}]},
            "answer_start",
            "an integer",
        ),
        (
            {"id": "q", "question": "?", "answers": [{"answer_start": 4}]},
            "text",
            "missing required",
        ),
        ({"id": "q", "question": "?", "answers": []}, "answers", "empty for an answerable"),
        (
            {"id": "q", "answers": [{"text": "def", "answer_start": 4}]},
            "question",
            "missing required",
        ),
        (
            {
                "id": "q",
                "question": "?",
                "answers": [{"text": "def", "answer_start": 4}],
                "is_impossible": True,
            },
            "answers",
            "must be empty",
        ),
    ],
)
def test_bad_squad_question(tmp_path, qa, field, words):
    path = _squad(tmp_path, qa)
    err = _error("squad", path)
    assert err.field.startswith("data[0].paragraphs[0].qas[0]") and err.field.endswith(field)
    assert words in str(err)
    # the line holds that field in the pretty-printed file (or opens its object if missing)
    line = path.read_text().splitlines()[err.line - 1]
    assert line.strip() == "{" if "missing" in words else f'"{field}"' in line


def test_squad_invalid_json_names_the_line(tmp_path):
    path = tmp_path / "s.json"
    path.write_text('{\n  "data": [\n    {"title": "x",}\n  ]\n}\n', encoding="utf-8")
    err = _error("squad", path)
    assert err.line == 3 and "invalid JSON" in str(err)


def _beir_copy(tmp_path: Path, qrels: str) -> Path:
    root = tmp_path / "beir"
    shutil.copytree(FIX / "beir", root)
    (root / "qrels" / "test.tsv").write_text(
        "query-id\tcorpus-id\tscore\n" + qrels, encoding="utf-8"
    )
    return root


@pytest.mark.parametrize(
    ("qrels", "line", "field", "words"),
    [
        ("q1\td1\t1\nq2\td3\n", 3, "columns", "expected 3 tab-separated columns"),
        ("q1\td1\t1\tx\n", 2, "columns", "got 4"),
        ("q1\td1\thigh\n", 2, "score", "expected an integer, got 'high'"),
        ("q1\td1\t1.5\n", 2, "score", "expected an integer"),
        ("q1\td1\t1\nq9\td1\t1\n", 3, "query-id", "unknown query id 'q9'"),
        ("q1\td9\t1\n", 2, "corpus-id", "unknown document id 'd9'"),
        ("q1\td1\t1\nq1\td1\t0\n", 3, "corpus-id", "duplicate judgement"),
    ],
)
def test_bad_beir_qrels(tmp_path, qrels, line, field, words):
    root = _beir_copy(tmp_path, qrels)
    err = _error("beir", root)
    assert (err.path, err.line, err.field) == (str(root / "qrels" / "test.tsv"), line, field)
    assert words in str(err)


def test_bad_beir_corpus_and_missing_files(tmp_path):
    root = _beir_copy(tmp_path, "q1\td1\t1\n")
    with (root / "corpus.jsonl").open("a") as f:
        f.write('{"_id": "d5", "text": 5}\n')
    err = _error("beir", root)
    assert (err.path, err.line, err.field) == (str(root / "corpus.jsonl"), 5, "text")
    (root / "queries.jsonl").unlink()
    assert "queries.jsonl: missing" in str(_error("beir", root))
    assert "expected a BEIR folder" in str(_error("beir", root / "corpus.jsonl"))


def test_fingerprint_of_examples_sharing_one_corpus_equals_the_written_bytes(tmp_path):
    # the shared-corpus dataset gives every question the same documents tuple; the fingerprint
    # serialises it once but must still be the sha256 of exactly what write_examples writes
    docs = (Document("a", "alpha \u00e9", "A", {"page_starts": [0]}), Document("b", "beta"))
    examples = [
        Example("q1", "One?", ("x",), docs, {"evidence": [["a", 0, 5]], "task_type": "qa"}),
        Example("q2", "Two?", (), docs),
        Example("q3", "Three?", ("y", "z"), (Document("c", "gamma"),), {"k": [1, {"n": None}]}),
        Example("q4", "Four?", ("w",), ()),
    ]
    path = formats.write_examples(tmp_path / "shared.jsonl", examples)
    assert path.read_text(encoding="utf-8") == "".join(e.to_json() + "\n" for e in examples)
    assert formats.fingerprint(examples) == sha256_file(path)
    assert formats.fingerprint(examples[:1]) != formats.fingerprint(examples)


def test_bytes_that_are_not_utf8_name_the_file_line_and_column(tmp_path):
    from ragbench.io import read_text

    good = tmp_path / "good.jsonl"
    formats.write_examples(good, [Example("a", "q?", ("x",), (Document("d", "text"),))])
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(good.read_bytes() + good.read_bytes().replace(b"text", b"t\xe9xt"))
    with pytest.raises(InputFileError) as err:
        formats.read_examples(bad)
    column = bad.read_bytes().split(b"\n")[1].index(b"\xe9") + 1
    assert str(err.value) == (
        f"{bad}:2: not valid UTF-8 (byte 0xe9 at column {column}); save the file as UTF-8"
    )
    assert err.value.line == 2
    with pytest.raises(
        InputFileError, match=rf"bad.jsonl:2: not valid UTF-8 \(byte 0xe9 at column {column}\)"
    ):
        read_text(bad)
    assert read_text(good) == good.read_text(encoding="utf-8")


def test_a_corpus_file_given_as_a_dataset_says_so_and_the_reverse(tmp_path):
    corpus = write_documents(tmp_path / "corpus.jsonl", [Document("a.md", "Refunds in 14 days.")])
    with pytest.raises(
        InputFileError, match=r"corpus.jsonl:1: field 'text': this is a corpus file"
    ):
        formats.read_examples(corpus)
    dataset = formats.write_examples(tmp_path / "d.jsonl", [Example("q1", "When?", ("14",), ())])
    with pytest.raises(
        InputFileError, match=r"d.jsonl:1: field 'question': this is a ragbench data"
    ):
        read_documents(dataset)
