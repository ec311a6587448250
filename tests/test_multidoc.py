"""Lost-in-the-middle multi-document QA: gold position, single evidence, determinism."""

from __future__ import annotations

import pytest

from ragbench.datasets.multidoc import build, count_multidoc, resolve_position
from ragbench.io import write_jsonl
from ragbench.tokenizers import get_tokenizer

WS = "whitespace"


def _folder(path, n_files=4, sentences=60):
    path.mkdir()
    for f in range(n_files):
        text = " ".join(
            f"File {f} has sentence {i} about topic {f * 100 + i}." for i in range(sentences)
        )
        (path / f"f{f}.txt").write_text(text)
    return path


def test_resolve_position():
    assert [resolve_position(p, 10) for p in ("start", "middle", "end", 3, "7")] == [0, 4, 9, 3, 7]
    assert resolve_position("middle", 20) == 9  # Liu et al. place it at 0, 4, 9, 14, 19
    with pytest.raises(ValueError, match="did you mean 'middle'"):
        resolve_position("midle", 10)
    with pytest.raises(ValueError, match=r"outside 0\.\.9"):
        resolve_position(10, 10)


def test_gold_moves_everything_else_stays(tmp_path):
    hay = _folder(tmp_path / "hay")
    examples = build(
        num_docs=6,
        gold_position=["start", 2, "end"],
        num_examples=3,
        words_per_doc=40,
        haystack=str(hay),
        tokenizer=WS,
    )
    assert len(examples) == count_multidoc(gold_position=[0, 2, 5], num_examples=3) == 9
    assert examples[1].id == "multidoc-N6-P2-0000"
    tok = get_tokenizer(WS)
    for group in (examples[0:3], examples[3:6], examples[6:9]):
        assert len({e.question for e in group}) == 1
        assert len({frozenset(d.id for d in e.documents) for e in group}) == 1
        for e, pos in zip(group, [0, 2, 5], strict=True):
            m = e.meta
            assert len(e.documents) == 6 and m["gold_position"] == pos
            assert e.documents[pos].id == m["gold_doc_id"]
            [[doc_id, s, end]] = m["evidence"]
            gold = e.documents[pos]
            assert doc_id == gold.id and gold.text[s:end] == m["fact"]
            (answer,) = e.answers
            assert answer in m["fact"]
            holders = [d.id for d in e.documents if answer in d.text]
            assert holders == [gold.id]  # the answer is in one document only
            key = e.question.split(" ")[-3] if "vault" in e.question else None
            if key:
                assert sum(key in d.text for d in e.documents) == 1
            assert m["context_tokens"] == tok.count(e.context)
            assert m["task"] == "multidoc"
    assert len({e.question for e in examples}) == 3


def test_deterministic_and_seeded(tmp_path):
    hay = str(_folder(tmp_path / "hay"))
    params = dict(num_docs=5, num_examples=2, words_per_doc=40, haystack=hay, tokenizer=WS)
    a = write_jsonl(tmp_path / "a.jsonl", build(**params)).read_bytes()
    assert a == write_jsonl(tmp_path / "b.jsonl", build(**params)).read_bytes()
    assert a != write_jsonl(tmp_path / "c.jsonl", build(**params, seed=1)).read_bytes()


def test_essay_passages():
    examples = build(num_docs=20, gold_position="middle", num_examples=2, tokenizer=WS)
    for e in examples:
        assert e.meta["gold_position"] == 9
        assert all(d.title and len(d.text.split()) >= 50 for d in e.documents)
        [[doc_id, s, end]] = e.meta["evidence"]
        assert {d.id: d for d in e.documents}[doc_id].text[s:end] == e.meta["fact"]


def test_too_few_passages_is_an_error(tmp_path):
    hay = str(_folder(tmp_path / "hay", n_files=1, sentences=20))
    with pytest.raises(ValueError, match=r"yields \d+ passages .* 30 documents are needed"):
        build(num_docs=30, num_examples=1, words_per_doc=40, haystack=hay, tokenizer=WS)
    with pytest.raises(ValueError, match="'num_docs': 0 is out of range; valid: an integer >= 1"):
        build(num_docs=0, tokenizer=WS)
