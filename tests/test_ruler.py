"""RULER-style tasks: sizing, each key once, evidence spans, determinism, bad input."""

from __future__ import annotations

import re
from collections import Counter

import pytest

from ragbench.datasets import RULER_TASKS
from ragbench.datasets.haystack import HaystackTooShortError, fit
from ragbench.datasets.ruler.tasks import TASKS, build
from ragbench.io import write_jsonl
from ragbench.tokenizers import get_tokenizer

WS = "whitespace"
NEEDLE_RE = re.compile(r"One of the special magic (\w+) for (\S+) is: (\S+)\.")
UUID_RE = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}")


def _spans(example):
    doc = example.documents[0]
    assert all(d == doc.id for d, _, _ in example.meta["evidence"])
    return [doc.text[s:e] for _, s, e in example.meta["evidence"]]


def _check_size(example, tok_name=WS, slack=40):
    m = example.meta
    budget = m["context_length"] - m["final_context_length_buffer"]
    assert m["context_tokens"] == get_tokenizer(tok_name).count(example.documents[0].text)
    assert budget - slack <= m["context_tokens"] <= budget, (m["context_tokens"], budget)


def test_task_list_matches_registry():
    assert tuple(RULER_TASKS) == TASKS


@pytest.mark.parametrize("haystack", ["essays", "noise", "needles"])
def test_niah_single(haystack):
    examples = build(
        "niah_single", context_lengths=[1200], num_examples=2, tokenizer=WS, haystack=haystack
    )
    assert [e.id for e in examples] == [
        "ruler-niah_single-L1200-0000",
        "ruler-niah_single-L1200-0001",
    ]
    for e in examples:
        _check_size(e)
        text = e.documents[0].text
        [needle] = _spans(e)
        kind, key, value = NEEDLE_RE.fullmatch(needle).groups()
        assert kind == "numbers" and re.fullmatch(r"\d{7}", value) and e.answers == (value,)
        assert text.count(key) == 1 and text.count(value) == 1
        assert (
            e.question
            == f"What is the special magic number for {key} mentioned in the provided text?"
        )
        assert e.meta["instruction"].startswith("A special magic number is hidden")
        assert e.meta["task"] == "ruler/niah_single" and e.meta["haystack"] == haystack
    assert examples[0].answers != examples[1].answers


def test_value_and_key_types():
    [w] = build(
        "niah_single",
        context_lengths=[600],
        num_examples=1,
        tokenizer=WS,
        haystack="noise",
        value_type="words",
    )
    assert re.fullmatch(r"[a-z]+-[a-z]+", w.answers[0])
    [u] = build(
        "niah_single",
        context_lengths=[600],
        num_examples=1,
        tokenizer=WS,
        haystack="needles",
        key_type="uuids",
        value_type="uuids",
    )
    assert UUID_RE.fullmatch(u.answers[0]) and UUID_RE.search(u.question)
    _, key, _ = NEEDLE_RE.fullmatch(_spans(u)[0]).groups()
    assert u.documents[0].text.count(key) == 1  # the filler needles use other keys
    with pytest.raises(ValueError, match="did you mean 'numbers'"):
        build(
            "niah_single", context_lengths=[600], num_examples=1, tokenizer=WS, value_type="number"
        )


@pytest.mark.parametrize("haystack", ["essays", "needles"])
def test_multikey_each_key_once_only_gold_is_evidence(haystack):
    [e] = build(
        "niah_multikey", context_lengths=[1500], num_examples=1, tokenizer=WS, haystack=haystack
    )
    _check_size(e)
    text = e.documents[0].text
    keys = [k for _, k, _ in NEEDLE_RE.findall(text)]
    assert len(keys) == len(set(keys))  # every key (gold, distractors, fillers) exactly once
    assert all(text.count(k) == 1 for k in keys)
    [gold] = _spans(e)
    assert e.meta["keys"][0] in gold and e.answers[0] in gold
    assert len(e.meta["distractor_keys"]) == 3
    assert all(k in keys and k not in gold for k in e.meta["distractor_keys"])


def test_multivalue_all_values_required():
    [e] = build("niah_multivalue", context_lengths=[1500], num_examples=1, tokenizer=WS)
    _check_size(e)
    spans = _spans(e)
    assert len(spans) == len(e.answers) == 4 and len(set(e.answers)) == 4
    key = e.meta["keys"][0]
    assert e.documents[0].text.count(key) == 4  # one key, one needle per value
    assert sorted(NEEDLE_RE.fullmatch(s).group(3) for s in spans) == sorted(e.answers)
    assert e.question.startswith("What are all the special magic")


def test_multiquery_asks_every_key():
    [e] = build("niah_multiquery", context_lengths=[1500], num_examples=1, tokenizer=WS)
    keys = e.meta["keys"]
    assert len(keys) == 4 and ", and " in e.question and all(k in e.question for k in keys)
    text = e.documents[0].text
    assert all(text.count(k) == 1 for k in keys)
    found = {NEEDLE_RE.fullmatch(s).group(2): NEEDLE_RE.fullmatch(s).group(3) for s in _spans(e)}
    assert [found[k] for k in keys] == list(e.answers)


def test_variable_tracking_chain():
    [e] = build(
        "variable_tracking",
        context_lengths=[1000],
        num_examples=1,
        tokenizer=WS,
        num_chains=2,
        num_hops=3,
    )
    _check_size(e)
    spans = _spans(e)
    names = list(e.answers)
    assert len(names) == 4 and len(spans) == 4
    value = re.search(r"value (\d{5})", e.question).group(1)
    assert spans[0] == f"VAR {names[0]} = {value}"
    assert spans[1:] == [f"VAR {names[j + 1]} = VAR {names[j]}" for j in range(3)]
    text = e.documents[0].text
    assert len(re.findall(r"^VAR ", text, flags=re.M)) == 8  # the second chain is a distractor
    assert all(text.count(f"VAR {n} =") == 1 for n in names)
    positions = [text.index(s) for s in spans]
    assert positions == sorted(positions)


def test_common_words_counts():
    [e] = build(
        "common_words", context_lengths=[1500], num_examples=1, tokenizer=WS, freq_cw=12, freq_ucw=2
    )
    _check_size(e)
    items = re.findall(r"(\d+)\. ([a-z]+)", e.documents[0].text)
    assert [int(i) for i, _ in items] == list(range(1, len(items) + 1))
    counts = Counter(w for _, w in items)
    assert len(e.answers) == 10
    assert all(counts[w] == 12 for w in e.answers)
    assert all(c == 2 for w, c in counts.items() if w not in e.answers)
    spans = _spans(e)
    assert len(spans) == 120 and set(spans) == set(e.answers)


def test_deterministic_bytes_and_seed(tmp_path):
    for task in TASKS:
        params = dict(context_lengths=[700], num_examples=2, tokenizer=WS, haystack="noise")
        if task == "common_words":
            params |= {"freq_cw": 8}
        if not task.startswith("niah_"):  # only the NIAH tasks take a haystack
            del params["haystack"]
        a = write_jsonl(tmp_path / "a.jsonl", build(task, **params)).read_bytes()
        b = write_jsonl(tmp_path / "b.jsonl", build(task, **params)).read_bytes()
        c = write_jsonl(tmp_path / "c.jsonl", build(task, **params, seed=7)).read_bytes()
        assert a == b and a != c, task


def test_fit_bisects_and_reports_short_haystacks():
    tok = get_tokenizer(WS)
    n, text, _ = fit(lambda n: ("x " * n, None), tok, budget=37, guess=5)
    assert n == 37 and tok.count(text) == 37

    def finite(n):
        if n > 20:
            raise HaystackTooShortError("only 20 units")
        return "x " * n, None

    with pytest.raises(HaystackTooShortError, match="only 20 units"):
        fit(finite, tok, budget=37, guess=5)
    with pytest.raises(ValueError, match="only 9 units available"):
        fit(lambda n: ("x " * n, None), tok, budget=37, guess=5, limit=9)


def test_fit_interpolates_a_handful_of_probes_to_the_largest_n_that_fits():
    """Token counts grow almost linearly in n: extrapolation brackets the budget, interpolation
    (bisecting every other probe) closes it in a few tokenisations, not a bisection's ~15."""
    tok = get_tokenizer(WS)
    probes = []

    def build(n):  # 6 to 8 tokens per unit after a 50-token head
        probes.append(n)
        return "x " * (50 + sum(6 + i % 3 for i in range(n))), None

    n, text, _ = fit(build, tok, budget=10_000, guess=100)
    assert tok.count(text) <= 10_000 < tok.count(build(n + 1)[0])
    assert len(probes) - 1 <= 8, probes  # the check above built one more


def test_bad_inputs():
    with pytest.raises(ValueError, match="did you mean 'niah_single'"):
        build("niah_singel", context_lengths=[700], tokenizer=WS)
    with pytest.raises(ValueError, match=r"common words x 30 \(lower freq_cw\)"):
        build("common_words", context_lengths=[700], num_examples=1, tokenizer=WS, freq_cw=30)
    with pytest.raises(ValueError, match="use a longer context length"):
        build("niah_multivalue", context_lengths=[230], num_examples=1, tokenizer=WS)
    with pytest.raises(ValueError, match="did you mean 'noise'"):
        build("niah_single", context_lengths=[700], num_examples=1, tokenizer=WS, haystack="nose")


@pytest.mark.slow
def test_real_tokenizer_sizes():
    """The SmolLM2 tokenizer (slow to load from the GGUF); sizes hold with real BPE counts."""
    tok = "smollm2-135m-instruct"
    for task in ("niah_single", "variable_tracking"):
        [e] = build(task, context_lengths=[1500], num_examples=1, tokenizer=tok)
        _check_size(e, tok, slack=60)
        assert all(a in " ".join(_spans(e)) for a in e.answers)


def test_your_corpus_as_the_ruler_haystack(tmp_path):
    from ragbench.datasets.corpus.file import write_documents
    from ragbench.types import Document

    filler = " ".join(f"The ferry schedule note {j} is posted." for j in range(400))
    corpus = write_documents(tmp_path / "corpus.jsonl", [Document("a.md", filler)])
    [e] = build(
        "niah_single", context_lengths=[1200], num_examples=1, tokenizer=WS, haystack=str(corpus)
    )
    _check_size(e)
    text = e.documents[0].text
    assert "ferry schedule note" in text and NEEDLE_RE.fullmatch(_spans(e)[0])
    with pytest.raises(ValueError, match="corpus.jsonl"):
        build("niah_single", context_lengths=[1200], num_examples=1, tokenizer=WS, haystack="essay")


def test_bad_parameters_name_their_key_and_valid_range():
    from ragbench.datasets._validate import DatasetParamError

    cases = [
        ("niah_single", {"context_lengths": [100]}, "context_lengths", "100 is out of range"),
        ("niah_multikey", {"num_keys": 0}, "num_keys", "0 is out of range; valid: an integer >= 1"),
        ("variable_tracking", {"num_hops": "4"}, "num_hops", 'expected an integer >= 1, got "4"'),
        ("niah_single", {"key_type": "word"}, "key_type", "did you mean 'words'?"),
    ]
    for task, params, key, message in cases:
        with pytest.raises(DatasetParamError) as err:
            build(task, tokenizer="whitespace", **params)
        assert err.value.key == key and message in str(err.value), str(err.value)
