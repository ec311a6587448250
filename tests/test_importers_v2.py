"""Importers for LongBench v2, FlashRAG's format and local Hugging Face datasets.

Fixtures are small files in each format, written here from the format's documentation: LongBench
v2's ``data.json`` fields (THUDM/LongBench ``pred.py``), FlashRAG's split and corpus JSONL
(RUC-NLPIR/FlashRAG README and ``docs/building-index.md``), and the files ``save_to_disk``
writes (``state.json`` + arrow IPC stream files; ``dataset_dict.json`` + one folder per split),
written with pyarrow. Each dataset also runs end to end on the fake model with closed book, long
context and RAG on the same examples; one slow test does it on the embedded SmolLM2."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import typer
from typer.testing import CliRunner

from ragbench.analysis.longbench_v2 import longbench_v2_table
from ragbench.datasets import build_dataset, dataset_names
from ragbench.datasets import longbench_v2 as lb2
from ragbench.datasets.flashrag import split_contents
from ragbench.datasets.hf_local import column_paths, read_table
from ragbench.io import InputFileError
from ragbench.llm.fake import FakeLLM
from ragbench.metrics.answer import get_metric
from ragbench.metrics.longbench_v2 import METRIC as LB2_METRIC
from ragbench.metrics.longbench_v2 import extract_answer, longbench_v2_accuracy
from ragbench.tokenizers import WhitespaceTokenizer

FILLER = " ".join(f"w{i}" for i in range(60))  # words between the facts: RAG must retrieve


# ----------------------------------------------------------------- the official extraction


# THUDM/LongBench, pred.py (LongBench v2), ``extract_answer``, copied verbatim as the oracle
def official_extract_answer(response):
    response = response.replace("*", "")
    match = re.search(r"The correct answer is \(([A-D])\)", response)
    if match:
        return match.group(1)
    match = re.search(r"The correct answer is ([A-D])", response)
    if match:
        return match.group(1)
    return None


REPLIES = [
    "The correct answer is (A)",
    "The correct answer is (B).",
    "The correct answer is C",
    "The correct answer is D, because the text says so.",
    "**The correct answer is (C)**",
    "The correct answer is **(D)**",
    "The *correct* answer is (A)",
    "the correct answer is (A)",
    "The correct answer is (E)",
    "The correct answer is (a)",
    "The correct answer is: (B)",
    "The correct answer is  (B)",
    "The correct answer is A or B",
    "The correct answer is (B) not (C)",
    "I think The correct answer is Because... The correct answer is (C)",
    "The correct answer is Both",
    "The correct answer is (insert answer here)",
    "(B)",
    "B",
    "",
    "Answer: The correct answer is (D)",
    "Let’s think step by step: ...\nThe correct answer is (A)",
    "The correct answer is\n(A)",
    "The correct answer is (AB)",
    "The correct answer is Dog",
    "The correct answer is (B",
]


def test_extraction_equals_the_official_function():
    assert len(REPLIES) >= 20
    got = [extract_answer(r) for r in REPLIES]
    assert got == [official_extract_answer(r) for r in REPLIES]
    # a few by hand: what the official regexes do with Markdown and near misses
    assert got[:5] == ["A", "B", "C", "D", "C"] and got[7:10] == [None, None, None]
    assert got[15] == "B"  # "The correct answer is Both": the bare-letter regex takes the B
    metric = get_metric("longbench_v2_accuracy")
    assert metric("**The correct answer is (C)**", ["C"]) == 1.0
    assert metric("The correct answer is (C)", ["B"]) == 0.0
    assert longbench_v2_accuracy("no letter", ["A"]) == 0.0


# ----------------------------------------------------------------- LongBench v2


def retrieved_context(chunks: list[str]) -> str:
    """``$DOC$`` of the RAG template, as ``pred.py`` joins retrieved chunks (in corpus order)."""
    return "\n\n".join(f"Retrieved chunk {i + 1}: {text}" for i, text in enumerate(chunks))


def lb2_row(i: int, gold: str = "B", **over) -> dict:
    key = f"vault-{i}"
    values = {"A": "1111", "B": "2222", "C": "3333", "D": "4444"}
    row = {
        "_id": f"lb{i}",
        "domain": "Single-Document QA",
        "sub_domain": "Financial",
        "difficulty": "easy" if i % 2 == 0 else "hard",
        "length": ("short", "medium", "long")[i % 3],
        "question": f"What is the code of {key}?",
        **{f"choice_{c}": v for c, v in values.items()},
        "answer": gold,
        "context": f"  {FILLER} The code of {key} is {values[gold]}. {FILLER}\n",
    }
    return row | over


def write_lb2(path: Path, rows: list[dict], as_json: bool | None = None) -> Path:
    if as_json if as_json is not None else path.suffix == ".json":
        path.write_text(json.dumps(rows, indent=2), encoding="utf-8")
    else:
        path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def test_longbench_v2_import_hand_checked(tmp_path):
    rows = [lb2_row(0, "B"), lb2_row(1, "D")]
    for path in (write_lb2(tmp_path / "data.json", rows), write_lb2(tmp_path / "d.jsonl", rows)):
        first, second = lb2.load_longbench_v2(path)
        assert first.id == "lb0" and first.answers == ("B",) and second.answers == ("D",)
        assert first.question == (
            "What is the correct answer to this question: What is the code of vault-0?\n"
            "Choices:\n(A) 1111\n(B) 2222\n(C) 3333\n(D) 4444\n\n"
            'Format your response as follows: "The correct answer is (insert answer here)".'
        )
        [doc] = first.documents
        assert doc.id == "lb0/context" and doc.text == rows[0]["context"].strip()
        assert first.meta["difficulty"] == "easy" and second.meta["length"] == "medium"
        assert first.meta["choices"]["B"] == "2222" and first.meta["metric"] == LB2_METRIC
    # the 0-shot template, filled as pred.py fills it (a chain of str.replace)
    prompt = lb2.render("0shot", first)
    official = (
        lb2.TEMPLATES["0shot"]
        .replace("$DOC$", rows[0]["context"].strip())
        .replace("$Q$", rows[0]["question"].strip())
        .replace("$C_A$", "1111")
        .replace("$C_B$", "2222")
        .replace("$C_C$", "3333")
        .replace("$C_D$", "4444")
    )
    assert prompt == official and prompt.endswith(first.question)
    assert prompt.startswith("Please read the following text and answer the question below.")


def test_longbench_v2_chain_of_thought_is_two_prompts_and_templates_must_match(tmp_path):
    [ex] = lb2.load_longbench_v2(write_lb2(tmp_path / "d.jsonl", [lb2_row(0)]))
    step1 = lb2.render("0shot_cot", ex)
    assert step1.endswith("(D) 4444\n\nLet’s think step by step:") and FILLER in step1
    step2 = lb2.render("0shot_cot_ans", ex, cot="The text says 2222.")
    assert "The text is too long and omitted here." in step2 and FILLER not in step2
    assert "Let’s think step by step: The text says 2222.\n\nBased on the above" in step2
    assert "$" not in step2
    with pytest.raises(ValueError, match="chain-of-thought answer step: pass cot="):
        lb2.render("0shot_cot_ans", ex)
    with pytest.raises(ValueError, match="no \\$COT\\$ placeholder"):
        lb2.render("0shot", ex, cot="x")
    with pytest.raises(ValueError, match="unknown LongBench v2 template '0-shot'.*0shot"):
        lb2.render("0-shot", ex)
    with pytest.raises(ValueError, match=r"\$DOCUMENT\$ does not match.*valid: \$DOC\$"):
        lb2.render("<text>$DOCUMENT$</text> $Q$ $C_A$ $C_B$ $C_C$ $C_D$", ex)
    with pytest.raises(ValueError, match=r"lacks \$C_D\$"):
        lb2.render("$DOC$ $Q$ $C_A$ $C_B$ $C_C$", ex)
    rag = lb2.render("0shot_rag", ex, context=retrieved_context(["one", "two"]))
    assert "<text>\nRetrieved chunk 1: one\n\nRetrieved chunk 2: two\n</text>" in rag
    assert lb2.render("0shot_no_context", ex).startswith("What is the correct answer")


def test_longbench_v2_middle_truncation_keeps_head_and_tail():
    tok = WhitespaceTokenizer()
    prompt = " ".join(f"t{i}" for i in range(10))
    assert lb2.truncate_middle(prompt, 10, tok) == prompt  # fits: unchanged
    assert lb2.truncate_middle(prompt, 4, tok) == "t0 t1 t8 t9"
    # pred.py's input_ids[:max_len//2] + input_ids[-max_len//2:]: an odd budget favours the tail
    assert lb2.truncate_middle(prompt, 5, tok) == "t0 t1 t7 t8 t9"
    ids = list(range(10))
    assert ids[: 5 // 2] + ids[-5 // 2 :] == [0, 1, 7, 8, 9]  # the official slicing, checked
    with pytest.raises(ValueError, match="at least 2 tokens"):
        lb2.truncate_middle(prompt, 1, tok)


@pytest.mark.parametrize(
    "over, line, field, message",
    [
        ({"answer": "E"}, 2, "answer", "unknown answer 'E'.*valid: A, B, C, D"),
        ({"difficulty": "medium"}, 2, "difficulty", "valid: easy, hard"),
        ({"length": "tiny"}, 2, "length", "valid: long, medium, short"),
        ({"choice_C": " "}, 2, "choice_C", "empty choice"),
        ({"context": 5}, 2, "context", "expected a string, got an integer"),
        (
            {"question": "What is the correct answer to this question: x?\nChoices:\n(A) 1"},
            2,
            "question",
            "already a rendered prompt",
        ),
    ],
)
def test_longbench_v2_bad_rows_name_file_line_and_field(tmp_path, over, line, field, message):
    path = write_lb2(tmp_path / "bad.jsonl", [lb2_row(0), lb2_row(1, **over)])
    with pytest.raises(InputFileError, match=message) as err:
        lb2.load_longbench_v2(path)
    assert (err.value.line, err.value.field) == (line, field)


def test_longbench_v2_json_list_errors_point_at_their_line(tmp_path):
    rows = [lb2_row(0), {k: v for k, v in lb2_row(1).items() if k != "choice_D"}]
    path = write_lb2(tmp_path / "data.json", rows)
    with pytest.raises(InputFileError, match="missing required field") as err:
        lb2.load_longbench_v2(path)
    assert err.value.field == "[1].choice_D"
    assert path.read_text().splitlines()[err.value.line - 1].strip() == "{"  # row 1 opens here
    path = write_lb2(tmp_path / "dup.json", [lb2_row(0), lb2_row(0)])
    with pytest.raises(InputFileError, match="duplicate _id 'lb0' \\(first at \\[0\\]\\)"):
        lb2.load_longbench_v2(path)
    for empty in (write_lb2(tmp_path / "e.json", []), write_lb2(tmp_path / "e.jsonl", [])):
        with pytest.raises(InputFileError, match="no examples \\(an empty LongBench v2 file\\)"):
            lb2.load_longbench_v2(empty)


def test_longbench_v2_breakdown_table_hand_checked():
    facts = [
        ("easy", "short", 1.0, "The correct answer is (A)"),
        ("easy", "medium", 0.0, "no idea"),
        ("hard", "long", 1.0, "The correct answer is (B)"),
        ("hard", "short", 1.0, "The correct answer is (C)"),
        ("hard", "medium", None, ""),  # a generation error: left out, as pred.py does
        ("easy", "long", 0.0, "The correct answer is (C)"),
    ]
    df = pd.DataFrame(
        [
            {
                "example_id": f"e{i}",
                "strategy": "long_context",
                "label": "long_context",
                "params": "{}",
                "prediction": p,
                "error": None if s is not None else "boom",
                "longbench_v2_accuracy": s,
                "difficulty": d,
                "length": n,
            }
            for i, (d, n, s, p) in enumerate(facts)
        ]
    )
    [row] = longbench_v2_table(df).to_dict("records")
    # scored: 1, 0, 1, 1, 0 -> overall 3/5; easy 1/3; hard 2/2; short 2/2; medium 0/1; long 1/2
    assert row == {
        "label": "long_context",
        "Overall": 60.0,
        "Easy": 33.3,
        "Hard": 100.0,
        "Short": 100.0,
        "Medium": 0.0,
        "Long": 50.0,
        "n": 5,
    }
    [comp] = longbench_v2_table(df, compensated=True).to_dict("records")
    # "no idea" has no letter: 0.25 (result.py's compensated); a wrong letter stays 0
    assert comp["Overall"] == 65.0 and comp["Easy"] == 41.7 and comp["Medium"] == 25.0
    only_easy = longbench_v2_table(df[df.difficulty == "easy"])
    assert math.isnan(only_easy["Hard"][0]) and only_easy["n"][0] == 3
    with pytest.raises(ValueError, match="no 'difficulty' column"):
        longbench_v2_table(df.drop(columns=["difficulty"]))


# ----------------------------------------------------------------- FlashRAG

CORPUS = [
    {"id": "0", "contents": f'"Harbour"\nThe code of harbour is 7741. {FILLER}'},
    {"id": "1", "contents": f'"Mill"\nThe code of mill is 3092. {FILLER}'},
    {"id": "2", "title": "Lake", "text": f"The code of lake is 5518. {FILLER}"},
    {"id": "3", "contents": f"no title line, the code of nothing. {FILLER}"},
]
SPLIT = [
    {
        "id": "test_0",
        "question": "What is the code of harbour?",
        "golden_answers": ["7741"],
        "metadata": {"type": "lookup"},
    },
    {
        "id": "test_1",
        "question": "What is the code of mill?",
        "golden_answers": ["3092", "3,092"],
        "metadata": {},
    },
    {"id": "test_2", "question": "What is the code of lake?", "golden_answers": ["5518"]},
]


def jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def flashrag_files(tmp_path: Path) -> tuple[Path, Path]:
    return jsonl(tmp_path / "test.jsonl", SPLIT), jsonl(tmp_path / "wiki.jsonl", CORPUS)


def test_flashrag_questions_share_one_corpus(tmp_path):
    split, corpus = flashrag_files(tmp_path)
    examples = build_dataset("flashrag", path=str(split), corpus=str(corpus))
    assert [e.id for e in examples] == ["test_0", "test_1", "test_2"]
    assert examples[1].answers == ("3092", "3,092")
    assert all(e.documents is examples[0].documents for e in examples)  # one tuple, shared
    docs = examples[0].documents
    assert [(d.id, d.title) for d in docs] == [
        ("0", "Harbour"),
        ("1", "Mill"),
        ("2", "Lake"),
        ("3", ""),
    ]
    assert docs[0].text.startswith("The code of harbour is 7741.")
    assert examples[0].meta["metadata"] == {"type": "lookup"}
    assert examples[0].meta["corpus_fingerprint"] == examples[2].meta["corpus_fingerprint"]
    assert split_contents('"A "quoted" title"\nbody\nmore') == ('A "quoted" title', "body\nmore")


def test_flashrag_bad_input_names_file_line_and_field(tmp_path):
    split, corpus = flashrag_files(tmp_path)
    bad = jsonl(tmp_path / "bad.jsonl", [SPLIT[0], {"id": "x", "question": "q?"}])
    with pytest.raises(InputFileError, match="bad.jsonl:2: field 'golden_answers': missing"):
        build_dataset("flashrag", path=str(bad), corpus=str(corpus))
    bad = jsonl(tmp_path / "dup.jsonl", [SPLIT[0], SPLIT[0]])
    with pytest.raises(InputFileError, match="dup.jsonl:2: field 'id': duplicate id 'test_0'"):
        build_dataset("flashrag", path=str(bad), corpus=str(corpus))
    bad_corpus = jsonl(tmp_path / "c.jsonl", [CORPUS[0], {"id": "9", "body": "x"}])
    with pytest.raises(InputFileError, match="c.jsonl:2: field 'contents': missing"):
        build_dataset("flashrag", path=str(split), corpus=str(bad_corpus))
    empty = jsonl(tmp_path / "empty.jsonl", [])
    with pytest.raises(InputFileError, match="no documents \\(an empty FlashRAG corpus file\\)"):
        build_dataset("flashrag", path=str(split), corpus=str(empty))
    with pytest.raises(InputFileError, match="no questions \\(an empty FlashRAG split file\\)"):
        build_dataset("flashrag", path=str(empty), corpus=str(corpus))


def cli_app() -> typer.Typer:
    from ragbench.cli.data import register  # the CLI package imports every command group

    app = typer.Typer()
    app.callback()(lambda: None)
    register(app)
    return app


def test_data_import_flashrag_writes_a_shared_corpus(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    split, corpus = flashrag_files(tmp_path)
    args = ["data", "import", "flashrag", str(split), "--corpus", str(corpus)]
    result = CliRunner().invoke(cli_app(), args)
    assert result.exit_code == 0, result.output
    assert "wrote 4 documents" in result.output and "3 questions" in result.output
    assert "retrieve_only" not in result.output  # gold answers: every strategy applies
    base = tmp_path / "data/generated/flashrag-test"
    examples = build_dataset(
        "corpus", corpus=f"{base}.corpus.jsonl", questions=f"{base}.questions.jsonl"
    )
    direct = build_dataset("flashrag", path=str(split), corpus=str(corpus))
    assert [(e.id, e.answers) for e in examples] == [(e.id, e.answers) for e in direct]
    assert examples[0].documents == direct[0].documents
    bad = CliRunner().invoke(
        cli_app(), ["data", "import", "flashrag", str(split), "--context", "c"]
    )
    assert bad.exit_code != 0 and "--context does not apply to flashrag" in bad.output
    missing = CliRunner().invoke(cli_app(), ["data", "import", "flashrag", str(split)])
    assert missing.exit_code == 2 and "'corpus' (--corpus)" in missing.output  # the option's name


# ----------------------------------------------------------------- local Hugging Face datasets

SQUAD_ROWS = [
    {
        "id": "s0",
        "title": "Harbour",
        "context": f"The code of harbour is 7741. {FILLER}",
        "question": "What is the code of harbour?",
        "answers": {"text": ["7741"], "answer_start": [23]},
        "level": "easy",
    },
    {
        "id": "s1",
        "title": "Mill",
        "context": f"The code of mill is 3092. {FILLER}",
        "question": "What is the code of mill?",
        "answers": {"text": ["3092", "3,092"], "answer_start": [20, 20]},
        "level": "hard",
    },
]


def save_to_disk(folder: Path, rows: list[dict], shards: int = 1) -> Path:
    """The files ``Dataset.save_to_disk`` writes: arrow IPC stream shards, state.json and
    dataset_info.json (not read)."""
    folder.mkdir(parents=True)
    table = pa.Table.from_pylist(rows)
    names = [f"data-{i:05d}-of-{shards:05d}.arrow" for i in range(shards)]
    per = -(-len(rows) // shards)
    for i, name in enumerate(names):
        with pa.ipc.new_stream(str(folder / name), table.schema) as writer:
            writer.write_table(table.slice(i * per, per))
    state = {
        "_data_files": [{"filename": n} for n in names],
        "_fingerprint": "f",
        "_format_columns": None,
        "_format_kwargs": {},
        "_format_type": None,
        "_output_all_columns": False,
        "_split": None,
    }
    (folder / "state.json").write_text(json.dumps(state), encoding="utf-8")
    (folder / "dataset_info.json").write_text(json.dumps({"features": {}}), encoding="utf-8")
    return folder


def test_hf_save_to_disk_folder_with_dotted_columns(tmp_path):
    folder = save_to_disk(tmp_path / "squad", SQUAD_ROWS, shards=2)
    table, _ = read_table(folder)
    assert table.num_rows == 2
    assert {"answers.text", "answers.answer_start"} <= set(column_paths(table.schema))
    examples = build_dataset(
        "hf",
        path=str(folder),
        question="question",
        answers="answers.text",
        context="context",
        title_column="title",
    )
    assert [e.id for e in examples] == ["s0", "s1"]  # the id column, used when present
    assert examples[1].answers == ("3092", "3,092")
    [doc] = examples[0].documents
    assert (doc.id, doc.title) == ("s0/context", "Harbour") and doc.text.startswith("The code")
    assert examples[0].meta["level"] == "easy" and examples[0].meta["row"] == 0


def test_hf_dataset_dict_split_and_parquet(tmp_path):
    root = tmp_path / "dd"
    save_to_disk(root / "train", SQUAD_ROWS[:1])
    save_to_disk(root / "validation", SQUAD_ROWS[1:])
    (root / "dataset_dict.json").write_text(json.dumps({"splits": ["train", "validation"]}))
    mapping = {"question": "question", "answers": "answers.text", "context": "context"}
    with pytest.raises(InputFileError, match="splits train, validation: choose one"):
        build_dataset("hf", path=str(root), **mapping)
    [ex] = build_dataset("hf", path=str(root), split="validation", **mapping)
    assert ex.id == "s1" and ex.meta["split"] == "validation"
    with pytest.raises(ValueError, match="unknown split 'dev'"):
        build_dataset("hf", path=str(root), split="dev", **mapping)
    parquet = tmp_path / "squad.parquet"
    pq.write_table(pa.Table.from_pylist(SQUAD_ROWS), parquet)
    assert [e.answers for e in build_dataset("hf", path=str(parquet), **mapping)] == [
        ("7741",),
        ("3092", "3,092"),
    ]
    table = pa.Table.from_pylist(SQUAD_ROWS)
    with pa.ipc.new_file(str(tmp_path / "file.arrow"), table.schema) as writer:  # file format
        writer.write_table(table)
    with pa.ipc.new_stream(str(tmp_path / "stream.arrow"), table.schema) as writer:
        writer.write_table(table)
    for name in ("file.arrow", "stream.arrow"):
        examples = build_dataset("hf", path=str(tmp_path / name), **mapping)
        assert [e.id for e in examples] == ["s0", "s1"]
    (tmp_path / "junk.arrow").write_bytes(b"not arrow at all")
    with pytest.raises(InputFileError, match="junk.arrow: not an arrow IPC file"):
        build_dataset("hf", path=str(tmp_path / "junk.arrow"), **mapping)


def test_hf_errors_name_the_row_and_the_column(tmp_path):
    parquet = tmp_path / "d.parquet"
    pq.write_table(pa.Table.from_pylist(SQUAD_ROWS), parquet)
    base = {"path": str(parquet), "answers": "answers.text", "context": "context"}
    with pytest.raises(InputFileError, match="no column 'querstion'.*did you mean 'question'"):
        build_dataset("hf", question="querstion", **base)
    with pytest.raises(InputFileError, match="answers.txt.*valid: .*answers.text"):
        build_dataset("hf", question="question", **{**base, "answers": "answers.txt"})
    rows = [SQUAD_ROWS[0], {**SQUAD_ROWS[1], "question": None}]
    pq.write_table(pa.Table.from_pylist(rows), parquet)
    with pytest.raises(InputFileError) as err:
        build_dataset("hf", question="question", **base)
    assert str(err.value) == (
        f"{parquet}: field 'question': row 1: expected a question (a non-empty string), got null"
    )
    rows = [SQUAD_ROWS[0], {**SQUAD_ROWS[1], "id": "s0"}]
    pq.write_table(pa.Table.from_pylist(rows), parquet)
    with pytest.raises(InputFileError, match="row 1: duplicate id 's0' \\(first in row 0\\)"):
        build_dataset("hf", question="question", **base)
    pq.write_table(pa.Table.from_pylist(SQUAD_ROWS).slice(0, 0), parquet)
    with pytest.raises(InputFileError, match="no rows"):
        build_dataset("hf", question="question", **base)
    with pytest.raises(ValueError, match="map either context .* or corpus"):
        build_dataset("hf", path=str(parquet), question="question", answers="answers.text")


def test_hf_questions_over_a_shared_corpus(tmp_path):
    questions = tmp_path / "q.parquet"
    pq.write_table(
        pa.Table.from_pylist(
            [{k: r[k] for k in ("id", "question", "answers")} for r in SQUAD_ROWS]
        ),
        questions,
    )
    corpus = tmp_path / "corpus.parquet"
    pq.write_table(
        pa.Table.from_pylist([{"doc": r["title"], "body": r["context"]} for r in SQUAD_ROWS]),
        corpus,
    )
    examples = build_dataset(
        "hf",
        path=str(questions),
        question="question",
        answers="answers.text",
        corpus=str(corpus),
        corpus_id="doc",
        corpus_text="body",
    )
    assert examples[0].documents is examples[1].documents
    assert [d.id for d in examples[0].documents] == ["Harbour", "Mill"]
    assert examples[0].meta["corpus_fingerprint"] and examples[0].meta["task"] == "corpus"
    with pytest.raises(InputFileError, match="no column 'text' \\(mapped to corpus_text\\)"):
        build_dataset(
            "hf",
            path=str(questions),
            question="question",
            answers="answers.text",
            corpus=str(corpus),
            corpus_id="doc",
        )


# ----------------------------------------------------------------- end to end


def reader(request) -> str:
    """Reads like a perfect model: finds "The code of KEY is VALUE." for the asked KEY; with
    choices it answers in LongBench v2's format."""
    prompt = request.prompt
    asked = re.findall(r"What is the code of ([\w-]+)\?", prompt)
    fact = re.search(rf"The code of {re.escape(asked[-1])} is (\d+)\.", prompt) if asked else None
    if fact is None:
        return "unanswerable"
    letter = re.search(rf"\(([A-D])\) {fact.group(1)}\n", prompt)
    return f"The correct answer is ({letter.group(1)})" if letter else fact.group(1)


def run_config(tmp_path: Path, dataset: dict, metric: str, llm=None) -> pd.DataFrame:
    from ragbench.experiment.runner import run

    cfg = {
        "name": "importers-v2",
        "dataset": dataset,
        "model": {"backend": "fake", "name": "fake", "cache": False},
        "retrieval": {
            "retriever": "bm25",
            "embedder": "hash",
            "chunk_size": 16,
            "chunk_overlap": 2,
            "tokenizer": "whitespace",
        },
        "strategies": ["closed_book", "long_context", {"name": "rag", "params": {"top_k": 2}}],
        "metrics": [metric],
        "output_dir": str(tmp_path / "results"),
    }
    if llm == "embedded":
        cfg["model"] = {
            "backend": "hf",
            "name": "smollm2-135m-instruct",
            "max_new_tokens": 12,
            "cache": False,
            "threads": 1,
        }
        return run(cfg, progress=False)
    return run(cfg, progress=False, llm=FakeLLM(answer_fn=reader))


def by_strategy(df: pd.DataFrame, metric: str) -> dict[str, list[float]]:
    df = df.sort_values("example_id")
    return {s: list(g[metric]) for s, g in df.groupby("strategy")}


def test_each_new_dataset_runs_end_to_end_on_the_fake_model(tmp_path):
    rows = [lb2_row(i, "BCD"[i]) for i in range(3)]
    lb_path = write_lb2(tmp_path / "data.json", rows)
    df = run_config(
        tmp_path / "lb",
        {"name": "longbench-v2", "params": {"path": str(lb_path)}},
        "longbench_v2_accuracy",
    )
    assert by_strategy(df, "longbench_v2_accuracy") == {
        "closed_book": [0.0] * 3,
        "long_context": [1.0] * 3,
        "rag": [1.0] * 3,
    }
    table = longbench_v2_table(df).set_index("label")
    assert table.loc["long_context", "Overall"] == 100.0 and table.loc["closed_book", "Easy"] == 0
    [rag] = [label for label in table.index if label.startswith("rag")]
    assert table.loc[rag, "Overall"] == 100.0 and table.loc[rag, "n"] == 3

    split, corpus = flashrag_files(tmp_path)
    df = run_config(
        tmp_path / "fr",
        {"name": "flashrag", "params": {"path": str(split), "corpus": str(corpus)}},
        "exact_match",
    )
    assert by_strategy(df, "exact_match") == {
        "closed_book": [0.0] * 3,
        "long_context": [1.0] * 3,
        "rag": [1.0] * 3,
    }

    folder = save_to_disk(tmp_path / "squad", SQUAD_ROWS)
    params = {
        "path": str(folder),
        "question": "question",
        "answers": "answers.text",
        "context": "context",
    }
    df = run_config(tmp_path / "hf", {"name": "hf", "params": params}, "exact_match")
    assert by_strategy(df, "exact_match") == {
        "closed_book": [0.0] * 2,
        "long_context": [1.0] * 2,
        "rag": [1.0] * 2,
    }


def test_importer_names_are_the_same_in_list_data_and_configs(tmp_path, monkeypatch):
    from ragbench.experiment.config.run import load_config

    assert {"longbench-v2", "flashrag", "hf"} <= set(dataset_names())
    lb_path = write_lb2(tmp_path / "d.jsonl", [lb2_row(0)])
    cfg = load_config(
        {
            "name": "x",
            "dataset": {"name": "longbench-v2", "params": {"path": str(lb_path)}},
            "model": {"backend": "fake", "name": "fake"},
            "strategies": ["closed_book"],
            "output_dir": str(tmp_path),
        }
    )
    assert cfg.dataset.name == "longbench-v2"
    with pytest.raises(Exception, match="unknown parameter 'file'"):
        load_config(
            {
                "name": "x",
                "dataset": {"name": "flashrag", "params": {"file": "x"}},
                "model": {"backend": "fake", "name": "fake"},
                "strategies": ["closed_book"],
                "output_dir": str(tmp_path),
            }
        )
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(cli_app(), ["data", "import", "longbench-v2", str(lb_path)])
    assert result.exit_code == 0, result.output
    [line] = (tmp_path / "data/generated/longbench-v2-d.jsonl").read_text().splitlines()
    assert json.loads(line)["answers"] == ["B"]
    params = ["--question", "question", "--answers", "answers.text", "--context", "context"]
    folder = save_to_disk(tmp_path / "sq", SQUAD_ROWS)
    result = CliRunner().invoke(cli_app(), ["data", "import", "hf", str(folder), *params])
    assert result.exit_code == 0, result.output and "wrote 2 examples" in result.output
    result = CliRunner().invoke(cli_app(), ["data", "import", "hf", str(folder), "--context", "c"])
    assert result.exit_code != 0 and "map either context" not in result.output


@pytest.mark.slow
def test_flashrag_runs_on_the_embedded_model(tmp_path):
    """SmolLM2-135M reads the three questions with closed book, long context and RAG."""
    split, corpus = flashrag_files(tmp_path)
    dataset = {"name": "flashrag", "params": {"path": str(split), "corpus": str(corpus)}}
    df = run_config(tmp_path, dataset, "contains", llm="embedded")
    assert len(df) == 9 and df["error"].isna().all()
    assert set(df["strategy"]) == {"closed_book", "long_context", "rag"}
    assert (df[df.strategy == "closed_book"]["contains"] == 0.0).all()  # the codes are made up
    assert df[df.strategy != "closed_book"]["prompt_tokens"].min() > 30


def test_an_imported_longbench_v2_file_runs_as_the_dataset_line_import_prints(tmp_path):
    """``data import`` writes ragbench's JSONL: it prints the ``dataset:`` line that runs it,
    and dataset ``longbench-v2`` (which reads LongBench v2's own file) given it says so."""
    import yaml

    from ragbench.experiment.config.sections import DatasetConfig

    data = write_lb2(tmp_path / "data.json", [lb2_row(0), lb2_row(1)])
    out = tmp_path / "lb2.jsonl"
    result = CliRunner().invoke(
        cli_app(), ["data", "import", "longbench-v2", str(data), "--out", str(out)]
    )
    assert result.exit_code == 0, result.output
    line = f"dataset: {{name: file, params: {{path: {out}}}}}"
    assert line in result.output.splitlines()
    dataset = DatasetConfig.model_validate(yaml.safe_load(line)["dataset"])
    examples = build_dataset(dataset.name, **dataset.params)
    assert [e.id for e in examples] == ["lb0", "lb1"] and examples == lb2.load_longbench_v2(data)
    # was: "lb2.jsonl:1: field '_id': missing required field"
    with pytest.raises(InputFileError) as err:
        build_dataset("longbench-v2", path=str(out))
    assert str(err.value) == (
        f"{out}:1: this is a file `ragbench data import` wrote (ragbench's JSONL), not LongBench "
        "v2's data.json: run it as `dataset: {name: file, params: {path: <this file>}}`"
    )
