"""Corpus preparation: cleaning, exact dedup and MinHash-LSH near-duplicate removal."""

from __future__ import annotations

import hashlib
import json
import logging
import random

import pytest

from ragbench.datasets import formats
from ragbench.datasets.corpus import cleaning
from ragbench.datasets.corpus import dedup as corpus
from ragbench.io import InputFileError
from ragbench.registry import UnknownNameError
from ragbench.types import Document, Example


def text_hash(text: str) -> str:
    """What near-duplicate detection compares: the hash of ``normalize_for_hash``."""
    return hashlib.sha256(cleaning.normalize_for_hash(text).encode("utf-8")).hexdigest()


VOCAB = [f"w{i}" for i in range(2000)]


def _words(seed: int, n: int = 200) -> list[str]:
    rng = random.Random(seed)
    return [rng.choice(VOCAB) for _ in range(n)]


def _long_text(seed: int) -> str:
    return " ".join(_words(seed))


def _one_word_changed(text: str, at: int = 100) -> str:
    words = text.split()
    words[at] = "CHANGED"
    return " ".join(words)


# --------------------------------------------------------------------------- cleaning


@pytest.mark.parametrize(
    ("raw", "clean"),
    [
        ("cafÃ©", "café"),  # mojibake (UTF-8 read as Latin-1)
        ("The â€œquotedâ€\x9d word", "The \u201cquoted\u201d word"),  # curly quotes kept
        ("bell\x07 null\x00 esc\x1b del\x7f", "bell null esc del"),
        (
            "Plain\x00text, unit\x1fseparated, c1\x9dcontrol",
            "Plain text, unit separated, c1 control",
        ),
        ("vertical\x0btab and form\x0cfeed", "vertical\ntab and form\nfeed"),  # line breaks
        ("zero\ufeffwidth", "zerowidth"),  # a BOM inside text separates nothing
        ("keep\ttabs\nand newlines", "keep\ttabs\nand newlines"),
        ("a  \u00a0 b\u3000c", "a b c"),  # Unicode spaces -> one space
        ("line one   \r\nline two\r\n\r\n\r\n\r\nend  ", "line one\nline two\n\nend"),
        ("\ufeffBOM first", "BOM first"),
        ("cafe\u0301", "caf\u00e9"),  # NFC
        ("5 &amp; 6", "5 &amp; 6"),  # no HTML unescaping: the text may be about HTML
    ],
)
def test_clean_text(raw, clean):
    assert cleaning.clean_text(raw) == clean


def test_normalized_hash_ignores_case_and_whitespace_only():
    assert text_hash("Hello   World\n") == text_hash("hello world")
    assert text_hash("cafÃ© noir") == text_hash("Café Noir")
    assert text_hash("hello world") != text_hash("hello word")


def test_shingles_are_word_5grams():
    assert corpus.shingles("a b c d e f") == {"a b c d e", "b c d e f"}
    assert corpus.shingles("Too Short!") == {"too short"}
    assert corpus.shingles("  ") == set()


# --------------------------------------------------------------------------- dedup


def _docs(texts: dict[str, str]) -> list[Document]:
    return [Document(id=k, text=v) for k, v in texts.items()]


def test_dedup_documents_exact_near_and_distinct():
    base = _long_text(1)
    docs = _docs(
        {
            "a": base,
            "b": _long_text(2),
            "a-exact": "  " + base.upper().replace(" ", "\n", 3) + "\n",  # same normalised text
            "a-near": _one_word_changed(base),
            "c": _long_text(3),
            "b-near": _one_word_changed(_long_text(2), at=10),
        }
    )
    kept, report = corpus.dedup_documents(docs)
    assert [d.id for d in kept] == ["a", "b", "c"]
    assert kept[0] is docs[0]  # text never edited
    dropped = {d["id"]: d for d in report["dropped"]}
    assert dropped["a-exact"] == {
        "id": "a-exact",
        "reason": "exact",
        "duplicate_of": "a",
        "jaccard": 1.0,
    }
    assert dropped["a-near"]["reason"] == "near" and dropped["a-near"]["duplicate_of"] == "a"
    assert dropped["b-near"]["duplicate_of"] == "b"
    assert 0.8 <= dropped["a-near"]["jaccard"] < 1.0
    assert (report["n_in"], report["n_kept"]) == (6, 3)
    assert (report["exact_duplicates"], report["near_duplicates"]) == (1, 2)
    assert report["params"] == {"threshold": 0.8, "num_perm": 128, "seed": 1, "shingle_words": 5}


def test_dedup_keeps_the_first_occurrence_and_is_deterministic():
    base = _long_text(7)
    near = _one_word_changed(base)
    kept, report = corpus.dedup_documents(_docs({"x": near, "y": base}))
    assert [d.id for d in kept] == ["x"] and report["dropped"][0]["duplicate_of"] == "x"
    docs = _docs({f"d{i}": _long_text(i % 5) for i in range(20)})
    first = corpus.dedup_documents(docs)
    assert first == corpus.dedup_documents(docs)
    assert [d.id for d in first[0]] == ["d0", "d1", "d2", "d3", "d4"]


def test_threshold_controls_near_duplicates():
    base = _long_text(11)
    words = base.split()
    half = " ".join(words[:100] + _words(99, 100))  # shares about a third of its shingles
    docs = _docs({"a": base, "half": half})
    assert len(corpus.dedup_documents(docs, threshold=0.8)[0]) == 2
    assert len(corpus.dedup_documents(docs, threshold=0.2, num_perm=256, seed=3)[0]) == 1
    with pytest.raises(ValueError, match="threshold"):
        corpus.dedup_documents(docs, threshold=0)
    with pytest.raises(ValueError, match="num_perm"):
        corpus.dedup_documents(docs, num_perm=1)


def test_short_and_empty_texts_only_dedup_exactly():
    docs = _docs({"a": "yes", "b": "Yes.", "c": "no", "d": "", "e": "  "})
    kept, report = corpus.dedup_documents(docs)
    assert [d.id for d in kept] == ["a", "c", "d"]
    assert {d["id"]: d["duplicate_of"] for d in report["dropped"]} == {"b": "a", "e": "d"}


# --------------------------------------------------------------------------- examples and files


def _example(eid: str, question: str, text: str, evidence=None) -> Example:
    meta = {"evidence": evidence} if evidence is not None else {}
    return Example(eid, question, ("ans",), (Document(f"{eid}/doc", text),), meta)


def test_clean_example_moves_evidence_spans():
    text = "Intro  text\x00 with cafÃ©.\r\n\r\n\r\nThe   magic number is 4817263.  Tail."
    start = text.index("4817263")
    ex = _example("e", "What  is it?\x07", text, [["e/doc", start, start + 7]])
    cleaned, skipped = corpus.clean_example(ex)
    doc = cleaned.documents[0]
    assert doc.text == "Intro text with café.\n\nThe magic number is 4817263. Tail."
    assert cleaned.question == "What is it?" and skipped == []
    ((_, s, e),) = cleaned.evidence
    assert doc.text[s:e] == "4817263"


def test_clean_example_leaves_a_document_whose_span_cannot_move():
    text = "abc\x00def ghi"
    ex = _example("e", "q", text, [["e/doc", 3, 4]])  # the span is only the control char
    cleaned, skipped = corpus.clean_example(ex)
    assert skipped == ["e/doc"] and cleaned.documents[0].text == text
    assert cleaned.evidence == [("e/doc", 3, 4)]


def test_dedup_examples_matches_question_and_context():
    ctx = _long_text(21)
    examples = [
        _example("q1", "Who?", ctx),
        _example("q2", "When?", ctx),  # same paragraph, another question: kept
        _example("q1-again", "  who? ", _one_word_changed(ctx)),  # near dup: dropped
        _example("other", "Who?", _long_text(22)),
    ]
    kept, report = corpus.dedup_examples(examples)
    assert [e.id for e in kept] == ["q1", "q2", "other"]
    assert report["dropped"][0]["id"] == "q1-again" and report["dropped"][0]["reason"] == "near"
    kept, _ = corpus.dedup_examples(examples, key="context")
    assert [e.id for e in kept] == ["q1", "other"]
    with pytest.raises(UnknownNameError, match="valid: context, question\\+context"):
        corpus.dedup_examples(examples, key="contxt")


def test_dedup_file_cleans_dedups_and_fingerprints(tmp_path):
    ctx = _long_text(31)
    examples = [
        _example("a", "Who?", "cafÃ© " + ctx, [["a/doc", 0, 5]]),
        _example("b", "Who?", "café " + _one_word_changed(ctx)),
        _example("c", "What?", _long_text(32)),
    ]
    src = formats.write_examples(tmp_path / "in.jsonl", examples)
    stats = corpus.dedup_file(src, tmp_path / "out.jsonl")
    out = formats.read_examples(tmp_path / "out.jsonl")
    assert [e.id for e in out] == ["a", "c"]
    assert out[0].documents[0].text.startswith("café w") and out[0].evidence == [("a/doc", 0, 4)]
    assert (
        stats["n_in"] == 3 and stats["n_kept"] == 2 and stats["examples_changed_by_cleaning"] == 1
    )
    assert stats["dropped"] == [
        {
            "id": "b",
            "reason": "near",
            "duplicate_of": "a",
            "jaccard": stats["dropped"][0]["jaccard"],
        }
    ]
    assert stats["fingerprint_in"] == formats.fingerprint(examples)
    assert stats["fingerprint_out"] == formats.fingerprint(out)
    raw = corpus.dedup_file(src, tmp_path / "raw.jsonl", clean=False)
    assert formats.read_examples(tmp_path / "raw.jsonl")[0] == examples[0]
    assert raw["examples_changed_by_cleaning"] == 0
    again = corpus.dedup_file(src, tmp_path / "out2.jsonl")
    assert (tmp_path / "out2.jsonl").read_bytes() == (tmp_path / "out.jsonl").read_bytes()
    assert again["fingerprint_out"] == stats["fingerprint_out"]


# --------------------------------------------------------------------------- repeated records


def _jsonl(path, rows: list[str]):
    path.write_text("".join(row + "\n" for row in rows), encoding="utf-8")
    return path


def test_dedup_file_drops_verbatim_repeats_and_counts_them(tmp_path):
    a, b, c = (_example(k, f"Question {k}?", _long_text(40 + i)) for i, k in enumerate("abc"))
    a_reordered = json.dumps(dict(reversed(json.loads(a.to_json()).items())))  # same content
    src = _jsonl(
        tmp_path / "in.jsonl", [a.to_json(), b.to_json(), a.to_json(), c.to_json(), a_reordered]
    )
    stats = corpus.dedup_file(src, tmp_path / "out.jsonl")
    assert [e.id for e in formats.read_examples(tmp_path / "out.jsonl")] == ["a", "b", "c"]
    assert stats["repeated_records"] == 2 and stats["repeated_lines"] == [3, 5]
    assert (stats["n_in"], stats["n_kept"]) == (5, 3)
    assert stats["exact_duplicates"] == stats["near_duplicates"] == 0
    assert stats["fingerprint_in"] == formats.fingerprint([a, b, c])


def test_read_examples_with_repeats_same_id_other_content_names_both_lines(tmp_path):
    a = _example("a", "Who?", _long_text(50))
    other = _example("a", "Who else?", _long_text(50))
    b = _example("b", "When?", _long_text(51))
    src = _jsonl(tmp_path / "clash.jsonl", [a.to_json(), b.to_json(), other.to_json()])
    with pytest.raises(InputFileError) as info:
        corpus.dedup_file(src, tmp_path / "out.jsonl")
    assert str(info.value).startswith(f"{src}:3: field 'id': id 'a' is also on line 1 with")
    assert (info.value.path, info.value.line) == (str(src), 3)
    assert not (tmp_path / "out.jsonl").exists()


def test_read_examples_with_repeats_keeps_strict_validation(tmp_path):
    src = _jsonl(
        tmp_path / "bad.jsonl", ['{"id": "a", "question": 1, "answers": [], "documents": []}']
    )
    with pytest.raises(InputFileError, match=r"bad.jsonl:1: field 'question': expected a string"):
        corpus.read_examples_with_repeats(src)


# --------------------------------------------------------------------------- heavy-drop warning


def test_heavy_near_duplicate_drop_warns_with_count_and_threshold(caplog):
    base = _long_text(60)
    docs = _docs({f"v{i}": _one_word_changed(base, at=10 * i) for i in range(5)})
    with caplog.at_level(logging.WARNING, logger="ragbench.datasets.corpus.dedup"):
        kept, report = corpus.dedup_documents(docs, threshold=0.8)
    assert len(kept) == 1 and report["near_duplicates"] == 4
    [warning] = report["warnings"]
    assert "dropped 4 of 5 documents (80%) at MinHash threshold 0.8" in warning
    assert "higher threshold (e.g. 0.9)" in warning
    assert [r.getMessage() for r in caplog.records] == [warning]


def test_no_warning_at_or_below_the_share(caplog):
    base = _long_text(61)
    texts = {f"d{i}": _long_text(70 + i) for i in range(4)} | {"near": _one_word_changed(base)}
    docs = _docs({"base": base} | texts)  # 1 near duplicate of 6 documents: 17%
    with caplog.at_level(logging.WARNING, logger="ragbench.datasets.corpus.dedup"):
        _, report = corpus.dedup_documents(docs)
    assert report["near_duplicates"] == 1 and report["warnings"] == [] and not caplog.records
    exact = _docs({"a": base, "b": base, "c": base, "d": _long_text(62)})  # exact drops: no warning
    assert corpus.dedup_documents(exact)[1]["warnings"] == []


def test_thresholds_datasketch_cannot_band_fail_clearly():
    with pytest.raises(ValueError, match="cannot use threshold 1.0 with num_perm 128.*<= 0.98"):
        corpus.dedup_documents(_docs({"a": "x y"}), threshold=1.0)


# --------------------------------------------------------------------------- big texts

TRICKY = [
    "",
    "  lead and trail  ",
    "a\u00a0b\u3000c\u2003d  e\t\tf",
    "x \x1c y\x1f\x85z\u2028w",
    "Stra\u00dfe \ufb01ne \u0130stanbul \u03a3\u03a3",
    "caf\u00c3\u00a9 \u00e2\u20ac\u0153open\u00e2\u20ac\u009d",
    "line \r\nline\r\rline\x0c\n\n\n\nend \t \nx",
]


def _reference_normalize(text: str) -> str:
    """The definition: what ``normalize_for_hash`` computes without holding every word."""
    return " ".join(cleaning.clean_text(text).casefold().split())


def test_normalize_for_hash_is_the_split_join_form_in_any_slices(monkeypatch):
    rng = random.Random(5)
    pieces = [" ", "  ", "\t", "\n", "\u00a0", "a", "B", "\u00df", "\u0130", "\u03a3", "x.y"]
    texts = TRICKY + ["".join(rng.choices(pieces, k=rng.randint(1, 50))) for _ in range(300)]
    for size in (1, 2, 3, 7, 1 << 20):  # slices cut after a non-space, never inside a run
        monkeypatch.setattr(cleaning, "_SLICE", size)
        for text in texts:
            assert cleaning.normalize_for_hash(text) == _reference_normalize(text), repr(text)


def test_clean_text_replaces_runs_but_not_lone_spaces():
    assert cleaning.clean_text("a b  c\u00a0d \u3000e") == "a b c d e"
    assert cleaning.clean_text("a \n b") == "a\n b"


def test_sketches_in_batches_equal_one_update_over_the_shingle_set(monkeypatch):
    from datasketch import MinHash

    text = cleaning.normalize_for_hash(" ".join(_words(3, 500) * 2))  # repeats: a set drops them
    whole = MinHash(num_perm=64, seed=1)
    whole.update_batch([g.encode() for g in sorted(corpus.shingles(text))])
    for batch in (1, 7, 4096):
        monkeypatch.setattr(corpus, "HASH_BATCH", batch)
        streamed = corpus._sketch(text, lambda: MinHash(num_perm=64, seed=1))
        assert (streamed.hashvalues == whole.hashvalues).all()
    assert corpus._sketch("", MinHash) is None
    short = corpus._sketch("too short", lambda: MinHash(num_perm=64, seed=1))
    one = MinHash(num_perm=64, seed=1)
    one.update(b"too short")
    assert (short.hashvalues == one.hashvalues).all()


def test_deduplicator_one_text_at_a_time_equals_find_duplicates():
    base = _long_text(1)
    texts = [base, _one_word_changed(base), base.upper(), "tiny", "TINY", _long_text(2), ""]
    groups = ["q", "q", "q", "q", "r", "q", "q"]
    for gs in (None, groups):
        dedup = corpus.Deduplicator()
        answers = [dedup.add(t, gs[i] if gs else "") for i, t in enumerate(texts)]
        expected = corpus.find_duplicates(texts, groups=gs)
        assert {i: a for i, a in enumerate(answers) if a is not None} == expected
        assert dedup.drops == expected and expected  # something was dropped


def test_dedup_of_a_big_text_holds_a_few_copies_of_it_not_its_shingles():
    import sys
    import tracemalloc

    rng = random.Random(0)
    vocab = ["".join(rng.choices("abcdefghij", k=rng.randint(2, 9))) for _ in range(3000)]
    vocab += ["caf\u00e9", "don\u2019t"]  # 2 bytes per character, like most real text
    text = "\n\n".join(" ".join(rng.choices(vocab, k=80)) for _ in range(2500))  # ~1.3M chars
    tracemalloc.start()
    try:
        corpus.Deduplicator().add(text)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    # the word list, shingle set and (shingles x num_perm) array it once built were ~100x
    assert peak < 8 * sys.getsizeof(text), peak / sys.getsizeof(text)
