"""Kamradt NIAH: placement, lengths, evidence spans, determinism and bad input."""

from __future__ import annotations

import time

import pytest

from ragbench.datasets.haystack import (
    NOISE_SENTENCE,
    HaystackTooShortError,
    is_sentence_end,
    load_haystack,
)
from ragbench.datasets.niah import (
    KAMRADT_ANSWER,
    KAMRADT_NEEDLE,
    build,
    count_niah,
    depth_grid,
    place_needle,
)
from ragbench.io import write_jsonl
from ragbench.tokenizers import get_tokenizer

WS = "whitespace"


def _sentence_folder(path, n_sentences=400):
    """A haystack whose sentences are all exactly 5 whitespace tokens long."""
    path.mkdir()
    text = " ".join(f"This is sentence number {i}." for i in range(n_sentences))
    (path / "a.txt").write_text(text[: len(text) // 2])
    (path / "b.md").write_text(text[len(text) // 2 :])
    (path / "ignored.csv").write_text("not, a, haystack")
    return path


def _check_placement(example, tok_name):
    """Every promise of a NIAH example, checked against its own text."""
    tok = get_tokenizer(tok_name)
    m = example.meta
    doc = example.documents[0]
    text = doc.text
    needle = m["needle"].strip()
    # length: within the buffer of the request, and the recorded count is true
    assert m["context_tokens"] == tok.count(text)
    buffer = m["final_context_length_buffer"]
    assert m["context_length"] - buffer <= m["context_tokens"] <= m["context_length"]
    # the needle exactly once; evidence slices to it exactly
    assert text.count(needle) == 1
    [[doc_id, start, end]] = m["evidence"]
    assert doc_id == doc.id and text[start:end] == needle
    assert (start, end) == (m["needle_start"], m["needle_end"])
    # depth: the needle sits at the last sentence end at or before the target token
    pos = start - 1 if m["needle"][:1].isspace() else start
    hay = text[:pos] + text[pos + len(m["needle"]) :]
    offsets = tok.offsets(hay)
    target = m["depth_tokens_target"]
    if m["depth_percent"] == 100:
        assert pos == len(hay)
    else:
        assert pos == 0 or is_sentence_end(hay, pos)
        between = [e for _, e in offsets[:target] if e > pos]
        assert not any(is_sentence_end(hay, e) for e in between), "a later sentence end was skipped"
    assert m["depth_tokens"] <= target + 1


def test_depth_grid_matches_reference_spacing():
    assert depth_grid(5) == [0, 25, 50, 75, 100]
    assert depth_grid(4) == [0, 33, 67, 100]  # np.round(np.linspace(0, 100, 4))
    sig = depth_grid(5, "sigmoid")
    assert sig[0] == 0 and sig[-1] == 100 and sig[2] == 50.0
    assert sig[1] == pytest.approx(100 / (1 + 2.718281828459045**-2.5), abs=1e-3)
    with pytest.raises(ValueError, match="did you mean 'linear'"):
        depth_grid(3, "lineer")


@pytest.mark.parametrize("depth", [0, 10, 33, 50, 77, 100])
def test_placement_on_sentence_haystack_is_exact(tmp_path, depth):
    hay = load_haystack(_sentence_folder(tmp_path / "hay"))
    tok = get_tokenizer(WS)
    p = place_needle(hay, tok, "The secret word is tangerine.", 700, depth, 200)
    assert p.context_tokens == 500  # whitespace counts are exact: no retokenisation drift
    assert p.text[p.needle_start : p.needle_end] == "The secret word is tangerine."
    # each sentence is 5 tokens: the needle lands at the last sentence start <= the target
    assert p.depth_tokens % 5 == 0 or depth == 100
    assert 0 <= p.depth_tokens_target - p.depth_tokens < 5


def test_essay_grid_properties_and_ids():
    examples = build(context_lengths=[600, 1500], depth_percents=[0, 25, 50, 90, 100], tokenizer=WS)
    assert [e.id for e in examples[:3]] == ["niah-L600-D0", "niah-L600-D25", "niah-L600-D50"]
    assert len(examples) == count_niah(context_lengths=[600, 1500], depth_percents=[0] * 5)
    for e in examples:
        _check_placement(e, WS)
        assert e.answers == (KAMRADT_ANSWER,)
        assert e.meta["task"] == "niah" and e.meta["needle"] == KAMRADT_NEEDLE
        assert abs(e.meta["depth_percent_actual"] - e.meta["depth_percent"]) < 10


def test_same_params_same_bytes_and_seed_changes_haystack(tmp_path):
    params = dict(context_lengths=[800], depth_intervals=3, tokenizer=WS)
    a = write_jsonl(tmp_path / "a.jsonl", build(**params)).read_bytes()
    b = write_jsonl(tmp_path / "b.jsonl", build(**params)).read_bytes()
    assert a == b
    c = write_jsonl(tmp_path / "c.jsonl", build(**params, seed=3)).read_bytes()
    assert c != a
    assert c == write_jsonl(tmp_path / "d.jsonl", build(**params, seed=3)).read_bytes()


def test_noise_haystack_fills_any_length():
    [e] = build(context_lengths=[6000], depth_percents=[40], haystack="noise", tokenizer=WS)
    _check_placement(e, WS)
    assert NOISE_SENTENCE in e.documents[0].text


def test_custom_needle_gets_spaces_and_answer_defaults(tmp_path):
    hay = _sentence_folder(tmp_path / "hay")
    needle, question = "The vault code is 4711.", "What is the vault code?"
    [e] = build(
        context_lengths=[500],
        depth_percents=[50],
        needle=needle,
        question=question,
        haystack=str(hay),
        tokenizer=WS,
    )
    text = e.documents[0].text
    s = e.meta["needle_start"]
    assert text[s - 1] == " " and text[e.meta["needle_end"]] == " "
    assert e.answers == (needle,) and e.question == question


def test_length_the_haystack_cannot_fill_is_an_error(tmp_path):
    hay = _sentence_folder(tmp_path / "hay", n_sentences=50)  # 250 tokens
    with pytest.raises(HaystackTooShortError, match=r"has only 250 tokens .*needed"):
        build(context_lengths=[1000], depth_percents=[50], haystack=str(hay), tokenizer=WS)


def test_bad_inputs_name_the_problem(tmp_path):
    with pytest.raises(ValueError, match="no room"):
        build(context_lengths=[210], depth_percents=[50], tokenizer=WS)
    with pytest.raises(ValueError, match=r"within \[0, 100\]"):
        build(context_lengths=[600], depth_percents=[120], tokenizer=WS)
    hay = _sentence_folder(tmp_path / "hay")
    with pytest.raises(ValueError, match="already contains the needle"):
        build(
            context_lengths=[600],
            depth_percents=[50],
            needle="This is sentence number 7.",
            haystack=str(hay),
            tokenizer=WS,
        )
    with pytest.raises(FileNotFoundError, match="neither a folder nor one of essays, noise"):
        build(context_lengths=[600], haystack=str(tmp_path / "missing"), tokenizer=WS)
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="holds no .txt/.md files"):
        build(context_lengths=[600], haystack=str(tmp_path / "empty"), tokenizer=WS)


@pytest.mark.slow
def test_real_tokenizer_placement():
    """SmolLM2's tokenizer (from the GGUF: ~3-10 s to load on 2 cores, hence slow)."""
    t0 = time.perf_counter()
    get_tokenizer("smollm2-135m-instruct")
    print(f"smollm2 tokenizer load: {time.perf_counter() - t0:.1f}s")
    examples = build(context_lengths=[1024, 3000], depth_percents=[0, 35, 100])
    for e in examples:
        _check_placement(e, "smollm2-135m-instruct")
        assert e.meta["tokenizer"] == "smollm2-135m-instruct"


def test_your_corpus_is_a_haystack_and_nonliteral_needles_share_no_word(tmp_path):
    from ragbench.datasets.corpus.file import write_documents
    from ragbench.datasets.niah import NONLITERAL, iter_niah, shared_content_words
    from ragbench.types import Document

    docs = [
        Document(f"doc{i}.md", " ".join(f"Harbour note {i}.{j} is filed." for j in range(80)))
        for i in range(3)
    ]
    corpus = write_documents(tmp_path / "corpus.jsonl", docs)
    [ex] = iter_niah(
        [300],
        [50],
        haystack=str(corpus),
        tokenizer="whitespace",
        final_context_length_buffer=20,
        needle_mode="nonliteral",
    )
    text = ex.documents[0].text
    assert "Harbour note 0.0 is filed." in text and NONLITERAL[0].strip() in text
    assert ex.question == NONLITERAL[1] and ex.answers == ("Yuki",)
    assert ex.meta["needle_mode"] == "nonliteral" and not shared_content_words(
        text[ex.meta["needle_start"] : ex.meta["needle_end"]], ex.question
    )
    with pytest.raises(ValueError, match=r"shares \['magic', 'number'\]"):
        list(
            iter_niah(
                [300],
                [50],
                haystack=str(corpus),
                tokenizer="whitespace",
                needle="The magic number is 7.",
                question="What is the magic number?",
                needle_mode="nonliteral",
            )
        )
    with pytest.raises(ValueError, match="did you mean 'literal'"):
        list(iter_niah([300], [50], haystack=str(corpus), needle_mode="literl"))


@pytest.mark.parametrize(
    ("needle", "question", "shared"),
    [
        ("Maria paints every morning.", "Who painted the mural?", {"painted"}),
        ("Tom sings in the choir.", "Which singer lives nearby?", {"singer"}),
        ("Ann cooked dinner for six.", "Who was cooking?", {"cooking"}),
        ("The baker opened early.", "Who bakes bread?", {"bakes"}),
        ("Rivers flow to the sea.", "Which river?", {"river"}),
        ("The magic number is 7.", "What is the magic number?", {"magic", "number"}),
    ],
)
def test_nonliteral_guard_compares_stems(needle, question, shared):
    from ragbench.datasets.niah import iter_niah, shared_content_words

    assert shared_content_words(needle, question) == shared
    with pytest.raises(ValueError, match="needle_mode='nonliteral': the question shares"):
        next(iter_niah([300], [50], needle=needle, question=question, needle_mode="nonliteral"))


@pytest.mark.parametrize(
    ("needle", "question"),
    [
        (
            "Actually, Yuki lives next to the Semper Opera House.",
            "Which character has been to Dresden?",
        ),
        ("The pain in his knee faded.", "Who mixed the paint?"),
        ("She parked the car.", "Who dealt the card?"),
        ("Kiki plays the violin at the concert hall.", "Who is a musician?"),
    ],
)
def test_nonliteral_guard_passes_unrelated_words(needle, question):
    from ragbench.datasets.niah import shared_content_words

    assert shared_content_words(needle, question) == set()


def test_bad_parameters_name_their_key_and_valid_range():
    from ragbench.datasets._validate import DatasetParamError
    from ragbench.datasets.niah import iter_niah

    cases = [
        ({"context_lengths": "abc"}, "context_lengths", 'got "abc"'),
        (
            {"context_lengths": [-5]},
            "context_lengths",
            "-5 is out of range; valid: integers >= 201",
        ),
        (
            {"context_lengths": 300, "final_context_length_buffer": -1},
            "final_context_length_buffer",
            "-1 is out of range",
        ),
        (
            {"depth_percents": [10, 150]},
            "depth_percents",
            "150 is out of range; valid: numbers within [0, 100]",
        ),
        (
            {"depth_percents": ["x"]},
            "depth_percents",
            'expected a list of numbers within [0, 100], got ["x"]',
        ),
        (
            {"needle_mode": "fuzzy"},
            "needle_mode",
            '"fuzzy" is not valid; valid: literal, nonliteral',
        ),
    ]
    for params, key, message in cases:
        with pytest.raises(DatasetParamError) as err:
            list(iter_niah(tokenizer="whitespace", **params))
        assert err.value.key == key and message in str(err.value), str(err.value)
        assert str(err.value).startswith(f"dataset parameter {key!r}: ")
