"""RULER's qa_1 (SQuAD) and qa_2 (HotpotQA) on tiny files in the official formats, the HotpotQA
reader, and configs over fwe and qa_1 run end to end (fake model; the embedded one when slow)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ragbench.analysis.ruler import ruler_table
from ragbench.datasets import build_dataset
from ragbench.datasets._validate import DatasetParamError
from ragbench.datasets.hotpotqa import load_hotpotqa
from ragbench.experiment.runner import run
from ragbench.io import InputFileError
from ragbench.tokenizers import get_tokenizer

WS = "whitespace"


def _paragraph(a: int, p: int) -> tuple[str, str, str]:
    """(context, question, answer): ~40 whitespace tokens with one fact."""
    filler = " ".join(f"w{a}{p}x{j}" for j in range(30))
    fact = f"The capital of Zorland{a}{p} is Town{a}{p}."
    return (
        f"Paragraph {a}-{p} begins. {filler}. {fact} It ends.",
        f"What is the capital of Zorland{a}{p}?",
        f"Town{a}{p}",
    )


def squad_file(tmp_path: Path, impossible: bool = False) -> Path:
    """SQuAD v1.1 JSON (v2.0 with one unanswerable question when ``impossible``): 3 articles x 3
    paragraphs, one question each."""
    data = []
    for a in range(3):
        paragraphs = []
        for p in range(3):
            context, question, answer = _paragraph(a, p)
            qa = {
                "id": f"q{a}{p}",
                "question": question,
                "answers": [{"text": answer, "answer_start": context.index(answer)}],
            }
            if impossible:
                qa["is_impossible"] = (a, p) == (0, 1)
                if qa["is_impossible"]:
                    qa["answers"] = []
            paragraphs.append({"context": context, "qas": [qa]})
        data.append({"title": f"Article_{a}", "paragraphs": paragraphs})
    path = tmp_path / "squad.json"
    path.write_text(json.dumps({"version": "v2.0" if impossible else "1.1", "data": data}))
    return path


def hotpot_file(tmp_path: Path) -> Path:
    """HotpotQA JSON (distractor setting shape): 3 questions, 4 context paragraphs each (two
    gold), sentences with their own leading spaces; question 2 has a supporting fact pointing
    at a sentence its paragraph does not have (as a few official ones do)."""
    rows = []
    for q in range(3):
        context = []
        for p in range(4):
            sents = [f"Title{q}{p} is a place number {q}{p}."] + [
                f" Sentence {s} of {q}{p} says "
                + " ".join(f"h{q}{p}s{s}w{j}" for j in range(8))
                + "."
                for s in range(1, 4)
            ]
            context.append([f"Title{q}{p}", sents])
        context[1][1][2] = f" The founder of Title{q}1 was Person{q}."
        context[3][1][1] = f" Person{q} was born in Year{q}."
        facts = [[f"Title{q}1", 2], [f"Title{q}3", 1]] + ([[f"Title{q}3", 9]] if q == 2 else [])
        rows.append(
            {
                "_id": f"hp{q}",
                "question": f"When was the founder of Title{q}1 born?",
                "answer": f"Year{q}",
                "supporting_facts": facts,
                "context": context,
                "type": "bridge",
                "level": "hard",
            }
        )
    path = tmp_path / "hotpot.json"
    path.write_text(json.dumps(rows, indent=1))
    return path


def _doc_tokens(example) -> int:
    return max(get_tokenizer(WS).count(f"{d.title}\n{d.text}") for d in example.documents)


def test_qa_1_squad_gold_among_distractors_fills_the_length(tmp_path):
    path = squad_file(tmp_path)
    examples = build_dataset(
        "ruler/qa_1", path=str(path), context_lengths=[400], num_examples=4, tokenizer=WS
    )
    assert [e.id for e in examples] == [f"ruler-qa_1-L400-000{i}" for i in range(4)]
    for i, e in enumerate(examples):
        a, p = divmod(i, 3)
        context, question, answer = _paragraph(a, p)
        assert e.question == question and e.answers == (answer,)
        assert e.meta["task"] == "ruler/qa_1" and e.meta["question_id"] == f"q{a}{p}"
        texts = [d.text for d in e.documents]
        assert context in texts  # the gold paragraph, once
        # RULER's more_context: the article's other paragraphs are the first distractors
        assert all(_paragraph(a, other)[0] in texts for other in range(3))
        assert [d.title for d in e.documents] == [
            f"Document {k}:" for k in range(1, len(texts) + 1)
        ]
        assert e.context.startswith("Document 1:\n") and "\n\nDocument 2:\n" in e.context
        budget = 400 - 200
        assert e.meta["context_tokens"] == get_tokenizer(WS).count(e.context) <= budget
        assert budget - e.meta["context_tokens"] < _doc_tokens(e)  # no room for another
        [(doc_id, s, end)] = e.meta["evidence"]
        gold = next(d for d in e.documents if d.id == doc_id)
        assert gold.text == context and gold.text[s:end] == answer
        assert e.meta["gold_doc_ids"] == [doc_id]
        assert e.meta["ruler_metric"] == "string_match_part" and e.meta["tokens_to_generate"] == 32
    assert len({tuple(d.text for d in e.documents) for e in examples}) == 4


def test_qa_same_questions_at_every_length_and_deterministic(tmp_path):
    path = str(squad_file(tmp_path))
    params = dict(path=path, context_lengths=[300, 500], num_examples=2, tokenizer=WS)
    examples = build_dataset("ruler/qa_1", **params)
    assert build_dataset("ruler/qa_1", **params) == examples
    short, long = examples[0], examples[2]
    assert short.id.endswith("L300-0000") and long.id.endswith("L500-0000")
    assert short.question == long.question and len(long.documents) > len(short.documents)
    other = build_dataset("ruler/qa_1", **{**params, "seed": 1})
    assert [d.id for d in other[2].documents] != [d.id for d in long.documents]


def test_squad_v2_unanswerable_question_is_not_asked_but_its_paragraph_stays(tmp_path):
    path = squad_file(tmp_path, impossible=True)
    examples = build_dataset(
        "ruler/qa_1", path=str(path), context_lengths=[500], num_examples=8, tokenizer=WS
    )
    assert "q01" not in [e.meta["question_id"] for e in examples]
    first = examples[0]  # q00: its article's paragraph 0-1 is a distractor all the same
    assert _paragraph(0, 1)[0] in [d.text for d in first.documents]
    with pytest.raises(DatasetParamError, match="9 questions asked, but .* has 8"):
        build_dataset("ruler/qa_1", path=str(path), num_examples=9, tokenizer=WS)


def test_qa_2_hotpotqa_brings_its_context_paragraphs_and_supporting_sentences(tmp_path):
    path = hotpot_file(tmp_path)
    examples = build_dataset(
        "ruler/qa_2", path=str(path), context_lengths=[500], num_examples=3, tokenizer=WS
    )
    for q, e in enumerate(examples):
        assert e.answers == (f"Year{q}",) and e.meta["source"] == "hotpotqa"
        texts = [d.text for d in e.documents]
        own = [t for t in texts if t.startswith(f"Title{q}")]
        assert len(own) == 4  # RULER keeps all the question's context paragraphs
        assert all(t.split("\n", 1)[0] == f"Title{q}{p}" for p, t in enumerate(sorted(own)))
        assert len(texts) > 4 and e.meta["context_tokens"] <= 300
        assert 300 - e.meta["context_tokens"] < _doc_tokens(e)
        quoted = sorted(
            next(d for d in e.documents if d.id == doc_id).text[s:end]
            for doc_id, s, end in e.meta["evidence"]
        )
        assert quoted == [
            f" Person{q} was born in Year{q}.",
            f" The founder of Title{q}1 was Person{q}.",
        ]
        assert len(e.meta["gold_doc_ids"]) == 2


def test_hotpotqa_reader(tmp_path):
    path = hotpot_file(tmp_path)
    examples = load_hotpotqa(path)
    assert [e.id for e in examples] == ["hp0", "hp1", "hp2"]
    e = examples[2]
    assert [d.id for d in e.documents] == [f"Title2{p}" for p in range(4)]
    assert e.documents[0].text.startswith("Title20 is a place number 20. Sentence 1 of 20")
    assert e.meta["missing_supporting_facts"] == 1 and len(e.meta["evidence"]) == 2
    doc_id, s, end = e.meta["evidence"][0]
    assert (
        doc_id == "Title21" and e.documents[1].text[s:end] == " The founder of Title21 was Person2."
    )
    rows = json.loads(path.read_text())
    rows[1]["context"][0] = ["Title10", ["a."], "extra"]
    path.write_text(json.dumps(rows, indent=1))
    with pytest.raises(InputFileError, match=r"hotpot.json:\d+: field '\[1\]\.context\[0\]'"):
        load_hotpotqa(path)
    (tmp_path / "empty.json").write_text("[]")
    with pytest.raises(InputFileError, match="no questions"):
        load_hotpotqa(tmp_path / "empty.json")
    (tmp_path / "squad.json").write_text('{"version": "1.1", "data": []}')
    with pytest.raises(InputFileError, match="a SQuAD file .* build ruler/qa_1 from it"):
        load_hotpotqa(tmp_path / "squad.json")


def test_qa_errors_name_the_parameter_and_the_file(tmp_path):
    with pytest.raises(DatasetParamError, match="'path'.*SQuAD.*nothing is downloaded"):
        build_dataset("ruler/qa_1", tokenizer=WS)
    with pytest.raises(DatasetParamError, match="'path'.*HotpotQA"):
        build_dataset("ruler/qa_2", tokenizer=WS)
    path = str(squad_file(tmp_path))
    with pytest.raises(ValueError, match="9 paragraphs cannot fill context length 2000"):
        build_dataset("ruler/qa_1", path=path, context_lengths=[2000], tokenizer=WS, num_examples=1)
    with pytest.raises(ValueError, match="did you mean 'hotpotqa'"):
        build_dataset("ruler/qa", path=path, format="hotpot", tokenizer=WS)


def _config(tmp_path, dataset: dict, name: str) -> dict:
    return {
        "name": name,
        "dataset": dataset,
        "model": {
            "backend": "fake",
            "name": "fake",
            "preset": "smollm2-135m-instruct",
            "cache": False,
        },
        "retrieval": {"embedder": "hash", "chunk_size": 32, "chunk_overlap": 4, "tokenizer": WS},
        "strategies": ["closed_book", "long_context", {"name": "rag", "params": {"top_k": 2}}],
        "metrics": ["string_match_all", "string_match_part"],
        "output_dir": str(tmp_path / "results"),
    }


def test_configs_over_fwe_and_qa_1_run_end_to_end_on_the_fake_model(tmp_path):
    common = {"num_examples": 2, "tokenizer": WS}
    fwe = _config(
        tmp_path, {"name": "ruler/fwe", "params": {"context_lengths": [700], **common}}, "fwe"
    )
    qa = _config(
        tmp_path,
        {
            "name": "ruler/qa_1",
            "params": {"path": str(squad_file(tmp_path)), "context_lengths": [400], **common},
        },
        "qa",
    )
    for cfg, task in ((fwe, "fwe"), (qa, "qa_1")):
        df = run(cfg, progress=False)
        assert df["error"].isna().all(), df["error"].tolist()
        assert sorted(df["strategy"].unique()) == ["closed_book", "long_context", "rag"]
        ids = {s: sorted(g["example_id"]) for s, g in df.groupby("strategy")}
        assert ids["closed_book"] == ids["long_context"] == ids["rag"]  # the same examples
        assert len(ids["rag"]) == 2 and all(i.startswith(f"ruler-{task}-L") for i in ids["rag"])
        lc = df[df.strategy == "long_context"]
        assert (lc["prompt_tokens"] > df[df.strategy == "closed_book"]["prompt_tokens"].max()).all()
        table = ruler_table(df)
        assert {t for _, t in table.index} == {task} and "avg" in table.columns
        if task == "qa_1":
            assert set(df["ruler_metric"]) == {"string_match_part"}
            assert df[df.strategy == "rag"]["gold_hit"].notna().all()


@pytest.mark.slow
def test_a_preset_on_the_embedded_model(tmp_path):
    """SmolLM2 (offline) on RULER's niah_single_2 at 1k tokens, long context and RAG."""
    from ragbench.experiment.config.run import load_config

    base = load_config(Path(__file__).parent.parent / "configs" / "quick-cpu.yaml").model_dump()
    base |= {
        "name": "ruler-slow",
        "output_dir": str(tmp_path),
        "dataset": {
            "name": "ruler/niah_single_2",
            "params": {"context_lengths": [1024], "num_examples": 1},
        },
    }
    base["strategies"] = ["long_context", {"name": "rag", "params": {"top_k": 3}}]
    base["metrics"] = ["string_match_all", "string_match_part"]
    base["model"]["cache"] = False
    df = run(base, progress=False)
    assert df["error"].isna().all(), df["error"].tolist()
    assert len(df) == 2 and df["example_id"].nunique() == 1
    lc = df[df.strategy == "long_context"].iloc[0]
    assert 700 <= lc["prompt_tokens"] <= 1100, lc["prompt_tokens"]
    assert lc["string_match_all"] == 1.0, lc["prediction"]  # SmolLM2 finds it at 1k (greedy)
    table = ruler_table(df)
    assert list(table.columns) == [1024, "avg"] and len(table) == 2
    assert table.loc[(lc["label"], "niah_single_2"), 1024] == 100 * lc["string_match_all"]
