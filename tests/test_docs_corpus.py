"""The shared-corpus dataset: questions files (CSV, JSONL), evidence spans, and full runs over a
corpus ingested from real files."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pandas as pd
import pytest
from test_docs import build_folder
from test_runner import niah_config

from ragbench.datasets import build_dataset
from ragbench.datasets.corpus import docs
from ragbench.datasets.corpus.file import read_documents, write_documents
from ragbench.datasets.questions import locate, read_questions
from ragbench.experiment.config.run import load_config
from ragbench.experiment.config.text import ConfigError
from ragbench.io import InputFileError, sha256_file
from ragbench.types import Document

DOCS = (
    Document("a.md", "The ferry leaves at 06:40.\nThe ferry  returns at 18:00.", "A"),
    Document("b.txt", "Harbour fees: the ferry leaves at 06:40 on Sundays too.", "B"),
)


@pytest.fixture()
def corpus(tmp_path) -> Path:
    return write_documents(tmp_path / "corpus.jsonl", DOCS)


def write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


# --------------------------------------------------------------------------- questions files


def test_csv_questions_answers_evidence_task_type_and_ids(tmp_path, corpus):
    q = write(
        tmp_path / "q.csv",
        "\ufeffquestion,answers,evidence,task_type,id\n"
        "When does the ferry leave?,06:40|6:40 am,ferry leaves at 06:40,,\n"
        "\n"
        '"When does it\nreturn?",18:00,The ferry returns at 18:00,qa,ret\n'
        "Who owns the harbour?,,,needle,\n",
    )
    examples = build_dataset("corpus", corpus=str(corpus), questions=str(q))
    first, second, third = examples
    assert [e.id for e in examples] == ["q1", "ret", "q3"]  # default ids by position
    assert first.answers == ("06:40", "6:40 am") and third.answers == ()
    assert second.question == "When does it\nreturn?"
    assert [e.meta["task_type"] for e in examples] == ["qa", "qa", "needle"]
    # every verbatim occurrence, in corpus order
    quote = "ferry leaves at 06:40"
    a, b = DOCS[0].text.index(quote), DOCS[1].text.index(quote)
    assert first.meta["evidence"] == [["a.md", a, a + 21], ["b.txt", b, b + 21]]
    # not verbatim (case, double space): found ignoring case and whitespace runs
    [[doc, s, e]] = second.meta["evidence"]
    assert (doc, DOCS[0].text[s:e]) == ("a.md", "The ferry  returns at 18:00")
    assert "evidence" not in third.meta
    assert second.meta["evidence_quotes"] == ["The ferry returns at 18:00"]


def test_jsonl_questions(tmp_path, corpus):
    q = write(
        tmp_path / "q.jsonl",
        '{"question": "When?", "answers": ["06:40"], "evidence": ["leaves at 06:40"]}\n'
        '{"id": "x", "question": "Fee?", "answers": "12 | EUR", "meta": {"topic": "fees"}}\n',
    )
    a, b = build_dataset("corpus", corpus=str(corpus), questions=str(q), task_type="needle")
    assert a.id == "q1" and len(a.meta["evidence"]) == 2
    assert b.answers == ("12 | EUR",)  # a JSONL string is one answer: no splitting
    assert b.meta["topic"] == "fees" and b.meta["task_type"] == "needle"


def test_examples_share_one_corpus_object_in_corpus_order(tmp_path, corpus):
    q = write(tmp_path / "q.csv", "question\nOne?\nTwo?\nThree?\n")
    examples = build_dataset("corpus", corpus=str(corpus), questions=str(q))
    assert all(e.documents is examples[0].documents for e in examples)  # one tuple, no copies
    assert [d.id for d in examples[0].documents] == ["a.md", "b.txt"]  # the corpus file's order
    assert {e.meta["corpus_fingerprint"] for e in examples} == {sha256_file(corpus)}


def test_a_default_id_never_takes_an_id_the_file_writes(tmp_path):
    q = write(tmp_path / "q.csv", "id,question\nq2,A?\n,B?\n,C?\nq2-2,D?\n")
    assert [x.id for x in read_questions(q)] == ["q2", "q2-3", "q3", "q2-2"]
    q = write(tmp_path / "q.jsonl", '{"question": "A?"}\n{"id": "q1", "question": "B?"}\n')
    assert [x.id for x in read_questions(q)] == ["q1-2", "q1"]


BAD_QUESTIONS = [
    (
        "q.csv",
        "question,answer\nQ?,A\n",
        1,
        "header",
        "unknown column 'answer'; did you mean 'answers'",
    ),
    ("q.csv", "answers\nA\n", 1, "header", "no 'question' column"),
    ("q.csv", "question,answers\nQ?,A\n  ,B\n", 3, "question", "empty question"),
    ("q.csv", "question,task_type\nQ?,summary\n", 2, "task_type", "unknown task type 'summary'"),
    ("q.csv", "question,id\nA?,x\nB?,x\n", 3, "id", "duplicate id 'x' (first on line 2)"),
    ("q.csv", "question,answers\nQ?,A,extra\n", 2, None, "expected 2 columns"),
    ("q.csv", 'question\n"unclosed\n', 2, None, "invalid CSV"),
    ("q.jsonl", '{"question": "Q?"}\n{"question": 3}\n', 2, "question", "expected a string"),
    (
        "q.jsonl",
        '{"question": "Q?", "answer": "A"}\n',
        1,
        "answer",
        "unknown field; valid: answers",
    ),
    ("q.jsonl", '{"question": "Q?", "answers": [1]}\n', 1, "answers[0]", "expected a string"),
    ("q.jsonl", '{"question": "Q?", "meta": {"evidence": 1}}\n', 1, "meta.evidence", "reserved"),
    ("q.jsonl", '{"question": "Q?", "id": 7}\n', 1, "id", "expected a string, got an integer"),
    ("q.jsonl", "{bad json\n", 1, None, "invalid JSON"),
]


@pytest.mark.parametrize(("name", "text", "line", "field", "message"), BAD_QUESTIONS)
def test_bad_questions_name_file_line_and_field(tmp_path, name, text, line, field, message):
    path = write(tmp_path / name, text)
    with pytest.raises(InputFileError) as err:
        read_questions(path)
    assert (err.value.path, err.value.line, err.value.field) == (str(path), line, field)
    assert message in str(err.value)
    if "task type" in message:
        assert "needle" in str(err.value) and "qa" in str(err.value)  # names the valid ones


def test_unusable_questions_files(tmp_path):
    with pytest.raises(ValueError, match=r"unknown questions file extension '\.txt'.*\.csv"):
        read_questions(write(tmp_path / "q.txt", "question\nQ?\n"))
    with pytest.raises(InputFileError, match="no questions"):
        read_questions(write(tmp_path / "q.csv", "question\n\n"))
    with pytest.raises(FileNotFoundError):
        read_questions(tmp_path / "missing.jsonl")


def test_missing_evidence_is_reported_with_file_and_line(tmp_path, corpus, caplog):
    q = write(tmp_path / "q.csv", "question,evidence\nOk?,ferry leaves\nBad?,the night boat\n")
    with caplog.at_level(logging.WARNING):
        ok, bad = build_dataset("corpus", corpus=str(corpus), questions=str(q))
    assert "evidence" not in bad.meta or bad.meta["evidence"] == []
    assert bad.meta["evidence_quotes"] == ["the night boat"]  # kept, so it can be fixed
    [record] = [r for r in caplog.records if "night boat" in r.getMessage()]
    assert f"{q}:3: field 'evidence': quote not found in the corpus" in record.getMessage()
    with pytest.raises(InputFileError, match=r"q\.csv:3: field 'evidence'"):
        build_dataset("corpus", corpus=str(corpus), questions=str(q), missing_evidence="error")
    with pytest.raises(ValueError, match="unknown missing_evidence policy 'ignore'"):
        build_dataset("corpus", corpus=str(corpus), questions=str(q), missing_evidence="ignore")


def test_locate_prefers_verbatim_then_ignores_case_and_spacing():
    assert locate("06:40", DOCS) == [["a.md", 20, 25], ["b.txt", 34, 39]]
    # a verbatim match exists (b.txt): the case-insensitive one in a.md is not added
    assert locate("the ferry leaves", DOCS) == [["b.txt", 14, 30]]
    assert locate("FERRY RETURNS", DOCS) == [["a.md", 31, 45]]
    assert locate("   ", DOCS) == []


def test_corpus_file_errors(tmp_path):
    bad = write(tmp_path / "c.jsonl", '{"id": "a", "text": "x"}\n{"id": "b", "body": "y"}\n')
    with pytest.raises(InputFileError, match=r"c\.jsonl:2: field 'body': unknown field"):
        read_documents(bad)
    dup = write(tmp_path / "d.jsonl", '{"id": "a", "text": "x"}\n{"id": "a", "text": "y"}\n')
    with pytest.raises(InputFileError, match="duplicate id 'a' \\(first on line 1\\)"):
        read_documents(dup)
    with pytest.raises(InputFileError, match="empty corpus"):
        read_documents(write(tmp_path / "e.jsonl", "\n"))
    with pytest.raises(ValueError, match="duplicate document id"):
        write_documents(tmp_path / "f.jsonl", [DOCS[0], DOCS[0]])


def test_config_names_the_corpus_dataset_and_its_parameters(tmp_path, corpus):
    cfg = niah_config(tmp_path)
    cfg["dataset"] = {"name": "corpus", "params": {"corpus": str(corpus), "question": "q.csv"}}
    with pytest.raises(ConfigError, match="unknown parameter 'question'; did you mean 'questions'"):
        load_config(cfg)


# --------------------------------------------------------------------------- end to end


QUESTIONS = [
    {
        "id": "keeper",
        "question": "What is the lighthouse keeper?",
        "answers": ["Ada Quill"],
        "evidence": "The lighthouse keeper is Ada Quill.",
    },
    {
        "id": "tower",
        "question": "What is the white tower?",
        "answers": ["31 metres"],
        "evidence": "the white  tower is 31 metres",  # whitespace differs: still located
    },
    {"id": "master", "question": "What is the harbour master?", "answers": ["Ben Marsh"]},
    {"id": "fee", "question": "What is the berth fee?", "answers": ["12 EUR"]},
]


def test_corpus_dataset_runs_end_to_end_for_every_strategy(tmp_path, monkeypatch):
    import ragbench.experiment.resources as resources
    from ragbench.experiment.runner import run

    folder = build_folder(tmp_path / "docs")
    result = docs.ingest([folder])
    corpus = write_documents(tmp_path / "corpus.jsonl", result.documents)
    questions = tmp_path / "questions.jsonl"
    questions.write_text("".join(json.dumps(q) + "\n" for q in QUESTIONS), encoding="utf-8")

    builds = []
    real_build = resources.build_index  # the run builds its indexes through resources
    monkeypatch.setattr(
        resources, "build_index", lambda *a, **k: builds.append(1) or real_build(*a, **k)
    )
    cfg = niah_config(tmp_path, name="t-corpus")
    cfg["dataset"] = {
        "name": "corpus",
        "params": {"corpus": str(corpus), "questions": str(questions)},
    }
    cfg["strategies"] = ["closed_book", "long_context", {"name": "rag", "params": {"top_k": 2}}]
    cfg["model"] |= {"batch_size": 16}  # one round: the fake reports a repeated prefix as cached
    df = run(cfg, progress=False)

    assert len(df) == 4 * 3 and df["error"].isna().all()
    by = df.set_index(["strategy", "example_id"])
    # closed book knows nothing; long context reads the whole corpus (PDF page 2, HTML, ...)
    assert (df[df.strategy == "closed_book"]["contains"] == 0.0).all()
    lc = by.loc["long_context"]
    assert lc["contains"].to_dict() == {"keeper": 1.0, "tower": 1.0, "master": 1.0, "fee": 0.0}
    # ("What is the berth fee?" is in a DOCX table: the fake reader only reads "X is Y")
    # one prefix for every question: each after the first finds it cached
    assert sorted(lc["cached_prompt_tokens"] > 0) == [False, True, True, True]
    assert (lc["prompt_tokens"] - lc["cached_prompt_tokens"]).min() < 30  # only the question
    rag = df[df.strategy == "rag"]
    assert (rag.loc[rag.example_id.isin(["keeper", "tower"]), "gold_hit"].notna()).all()
    # the fake reader answers iff the evidence chunk was retrieved
    located = rag[rag.example_id.isin(["keeper", "tower"])]
    assert (located["contains"] == located["gold_hit"].astype(float)).all()
    assert len(builds) == 1  # one index over the corpus for the whole run


def test_csv_line_numbers_count_crlf_and_quoted_newlines(tmp_path):
    text = 'question,answers\r\n"two\r\nlines",A\r\nOk?,B\r\n  ,C\r\n'
    path = tmp_path / "q.csv"
    path.write_bytes(text.encode("utf-8"))
    with pytest.raises(InputFileError) as err:
        read_questions(path)
    assert (err.value.line, err.value.field) == (5, "question")


def test_a_cut_corpus_is_one_prefix_unscored_questions_run_and_paths_follow_the_config(
    tmp_path, monkeypatch
):
    import yaml

    from ragbench.experiment.runner import run

    # a corpus four times the window: long context must cut it, the same way for every question
    filler = " ".join(f"w{i}" for i in range(600))
    docs_ = [
        Document(f"d{i}.txt", f"{filler} The code of gate {i} is {100 + i}.") for i in range(4)
    ]
    folder = tmp_path / "project"
    folder.mkdir()
    write_documents(folder / "corpus.jsonl", docs_)
    questions = [
        {"id": "g0", "question": "What is the code of gate 0?", "answers": ["100"]},
        {"id": "g3", "question": "What is the code of gate 3, the last one?", "answers": ["103"]},
        {"id": "open", "question": "Which gate would you open first?"},  # no gold answer
    ]
    write(folder / "q.jsonl", "".join(json.dumps(q) + "\n" for q in questions))
    cfg = niah_config(tmp_path, name="t-cut")
    cfg["dataset"] = {
        "name": "corpus",
        "params": {"corpus": "corpus.jsonl", "questions": "q.jsonl"},
    }
    cfg["model"] |= {"batch_size": 8, "params": {"context_window": 1200}}
    cfg["strategies"] = [{"name": "long_context", "params": {"overflow": "truncate_middle"}}]
    (folder / "run.yaml").write_text(yaml.safe_dump(cfg))
    monkeypatch.chdir(tmp_path)  # relative paths resolve against the config's folder
    df = run(folder / "run.yaml", progress=False).set_index("example_id")

    assert df["error"].isna().all()
    assert df["kept_tokens"].nunique() == 1 and (df["truncated_tokens"] > 0).all()
    assert sorted(df["cached_prompt_tokens"] > 0) == [False, True, True]  # one prefix for all
    assert df.loc["open", "unscored"] == True and pd.isna(df.loc["open", "contains"])  # noqa: E712
    assert df.loc[["g0", "g3"], "contains"].notna().all()


@pytest.mark.slow
def test_embedded_model_computes_the_corpus_prefix_once(tmp_path):
    # the done-when on the real transformers backend: one corpus, three questions; the
    # first computes the corpus, the others find it cached
    from ragbench.experiment.runner import run

    filler = " ".join(f"Dock note {i} concerns the old pier." for i in range(40))
    facts = ("The ferry leaves at 06:40.", "The harbour master is Ben Marsh.", "The fee is 12 EUR.")
    corpus = write_documents(
        tmp_path / "corpus.jsonl",
        [Document(f"{i}.md", f"{filler} {f}") for i, f in enumerate(facts)],
    )
    qs = [
        ("When does the ferry leave?", "06:40"),
        ("Who is the harbour master?", "Ben Marsh"),
        ("What is the fee?", "12 EUR"),
    ]
    questions = write(
        tmp_path / "q.jsonl",
        "".join(json.dumps({"question": q, "answers": [a]}) + "\n" for q, a in qs),
    )
    df = run(
        {
            "name": "hf-corpus",
            "dataset": {
                "name": "corpus",
                "params": {"corpus": str(corpus), "questions": str(questions)},
            },
            "model": {
                "backend": "hf",
                "name": "smollm2-135m-instruct",
                "max_new_tokens": 8,
                "cache": False,
            },
            "strategies": ["long_context"],
            "metrics": ["contains"],
            "output_dir": str(tmp_path / "runs"),
        },
        progress=False,
    )
    cached = sorted(df["cached_prompt_tokens"])
    assert cached[0] == 0 and cached[1] == cached[2] > 0.9 * df["prompt_tokens"].min()


def test_corpus_lines_are_written_slice_by_slice_with_the_same_bytes(monkeypatch, tmp_path):
    import random

    from ragbench.datasets.corpus import file as corpus_file

    rng = random.Random(0)
    chars = ["a", '"', "\\", "\n", "\t", "\x00", "\x1f", "é", "’", "😀", "\u2028", " "]
    sentinel = corpus_file._SENTINEL
    docs_ = [
        Document(
            f"d{i}",
            "".join(rng.choices(chars, k=rng.randint(1, 40))),
            title=rng.choice(["", 'T"x', sentinel]),
            meta=rng.choice([{}, {"text": sentinel, "page_starts": [0, 3]}]),
        )
        for i in range(300)
    ]
    for size in (1, 3, 7):
        monkeypatch.setattr(corpus_file, "_TEXT_SLICE", size)
        for d in docs_:
            assert b"".join(corpus_file.line_chunks(d)) == (d.to_json() + "\n").encode()
    path = write_documents(tmp_path / "c.jsonl", docs_)
    assert read_documents(path) == docs_
    assert sha256_file(path) == corpus_file.corpus_fingerprint(docs_)
