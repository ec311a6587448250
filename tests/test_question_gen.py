"""`ragbench data questions`: generated question/answer pairs over a corpus, checked and costed.

The model is scripted with ``FakeLLM(answer_fn=...)``: each test decides what the "model" replies
per passage, so every check (format, span, duplicate, closed book) is exercised on purpose.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from ragbench.cli.data import register
from ragbench.datasets import build_dataset
from ragbench.datasets.corpus.file import write_documents
from ragbench.datasets.question_text import evidence_quote, find_span, parse_reply, passage_id
from ragbench.experiment.question_gen import generate as question_gen
from ragbench.experiment.question_gen import multihop
from ragbench.experiment.question_gen.generate import generate_questions, questions_file
from ragbench.llm.cache import CachedLLM
from ragbench.llm.fake import FakeLLM
from ragbench.retrieval.passages import sample_passages
from ragbench.types import Document, Example, GenerationRequest

# each sentence is its own passage at passage_tokens=16 (the sentence splitter packs sentences)
DOCS = (
    Document(
        "harbour.md",
        "The ferry leaves at 06:40 from pier 3 every single morning.\n\n"
        "The harbour master is Ben Marsh, who has worked there since 1990.\n\n"
        "Tickets for the ferry cost 12 euros for adults and children.",
        "Harbour",
    ),
    Document(
        "light.txt",
        "The lighthouse keeper is Ada Quill, the last keeper of the tower.\n\n"
        "The white tower is 31 metres tall and was built in 1871 by the board.",
    ),
)
# what a good model would ask about each passage: (a word that identifies it, question, answer)
GOOD = (
    ("ferry leaves", "When does the ferry leave?", "06:40"),
    ("master", "Who is the harbour master?", "Ben Marsh"),
    ("Tickets", "How much does a ferry ticket cost for adults?", "12 euros"),
    ("keeper", "Who is the lighthouse keeper?", "Ada Quill"),
    ("white tower", "In which year was the white tower built?", "1871"),
)
SMALL = {"passage_tokens": 16, "min_passage_words": 5}


def passage_of(request: GenerationRequest) -> str:
    return request.prompt.rsplit("Text: ", 1)[1]


def scripted(replies: dict[str, str], closed_book: dict[str, str] | None = None):
    """answer_fn: the reply for the first key found in the passage; closed-book prompts get
    ``closed_book[question]`` (default "unanswerable")."""

    def answer(request: GenerationRequest) -> str:
        if "Write one question" not in request.prompt:
            question = request.prompt.rsplit("Question: ", 1)[1].split("\n")[0]
            return (closed_book or {}).get(question, "unanswerable")
        passage = passage_of(request)
        for key, reply in replies.items():
            if key in passage:
                return reply
        return "I cannot help with that."

    return answer


def good_replies() -> dict[str, str]:
    return {key: f"Question: {q}\nAnswer: {a}" for key, q, a in GOOD}


def fake(replies=None, closed_book=None) -> FakeLLM:
    return FakeLLM(answer_fn=scripted(good_replies() if replies is None else replies, closed_book))


# --------------------------------------------------------------------------- parsing


@pytest.mark.parametrize(
    "reply",
    [
        "Question: Who is the keeper?\nAnswer: Ada Quill",
        "question: Who is the keeper?\n\nanswer: Ada Quill.",
        "**Question:** Who is the keeper?\n**Answer:** Ada Quill",
        '1. Q: Who is the keeper?\n2. A: "Ada Quill"',
        "Sure!\nQuestion: Who is the keeper? Answer: Ada Quill",
        "Question: Who is the keeper?\nAnswer: Ada Quill\nQuestion: Another?\nAnswer: no",
        "- Question: Who is the keeper?\n- Answer: *Ada Quill*",
    ],
)
def test_parse_reply_reads_the_format_in_its_common_variants(reply):
    assert parse_reply(reply) == ("Who is the keeper?", "Ada Quill")


@pytest.mark.parametrize(
    "reply",
    [
        "",
        "Who is the keeper? Ada Quill",  # no labels
        "Answer: Ada Quill\nQuestion: Who is the keeper?",  # answer first: no pair
        "Question: Who is the keeper?",  # no answer
        "Question: <the question>\nAnswer: <the answer>",  # the template echoed
        "Question: Who is the keeper?\nAnswer: .",  # an empty answer
        "The question: who? The answer: her",  # labels inside prose are not labels
    ],
)
def test_parse_reply_rejects_anything_else(reply):
    assert parse_reply(reply) is None


def test_find_span_verbatim_then_case_and_whitespace_never_inside_a_word():
    text = "Built in 1931, the  White Tower is 31 metres tall."
    assert find_span("31 metres", text) == (35, 44)  # not the "31" inside "1931"
    s, e = find_span("white tower", text)
    assert text[s:e] == "White Tower"
    s, e = find_span("the White Tower", text)
    assert text[s:e] == "the  White Tower"  # runs of whitespace may differ
    assert find_span("Tow", text) is None and find_span("32 metres", text) is None
    assert find_span("1931,", text) == (9, 14)  # punctuation ends need no word boundary


def test_evidence_quote_is_the_answers_sentence():
    text = "First line.\nThe keeper is Ada Quill. She lives there.\nLast"
    s = text.index("Ada")
    a, b = evidence_quote(text, s, s + 9)
    assert text[a:b] == "The keeper is Ada Quill."
    a, b = evidence_quote("x" * 400 + " Ada " + "y" * 400, 401, 404, max_chars=100)
    assert b - a <= 103


# --------------------------------------------------------------------------- the pipeline


def test_keeps_pairs_whose_answer_is_in_the_passage_and_records_spans():
    replies = good_replies()
    replies["master"] = "Question: Who is the harbour master?\nAnswer: John Smith"  # invented
    replies["Tickets"] = "Tickets cost 12 euros."  # not the format
    result = generate_questions(DOCS, fake(replies), 10, **SMALL)
    assert result.passages_tried == result.passages_available == 5
    assert dict(result.rejected) == {"answer_not_in_passage": 1, "format": 1}
    assert sorted(a for r in result.rows for a in r["answers"]) == ["06:40", "1871", "Ada Quill"]
    texts = {d.id: d.text for d in DOCS}
    for row in result.rows:
        doc, s, e = row["meta"]["answer_span"]
        assert texts[doc][s:e] == row["answers"][0]
        pdoc, ps, pe = row["meta"]["passage"]
        assert pdoc == doc and ps <= s < e <= pe
        (quote,) = row["evidence"]
        assert row["answers"][0] in quote and quote in texts[doc]
        assert row["task_type"] == "qa" and row["meta"]["model"] == "fake"
    assert [r["id"] for r in result.rows] == ["gen-1", "gen-2", "gen-3"]
    reasons = {r["reason"] for r in result.rejections}
    assert reasons == {"answer_not_in_passage", "format"}


def test_the_answer_is_stored_in_the_documents_spelling():
    replies = {"keeper": "Question: Who keeps the lighthouse?\nAnswer: ADA   quill."}
    [row] = generate_questions(DOCS, fake(replies), 5, **SMALL).rows
    assert row["answers"] == ["Ada Quill"]


def test_rejects_questions_that_give_the_answer_away_or_are_not_questions():
    replies = {
        "keeper": "Question: Is Ada Quill the lighthouse keeper?\nAnswer: Ada Quill",
        "white tower": "Question: The tower was built in which year\nAnswer: 1871",
        "master": "Question: Who is the master?\nAnswer: " + " ".join(["Ben Marsh"] * 7),
    }
    result = generate_questions(DOCS, fake(replies), 5, **SMALL)
    assert not result.rows
    assert result.rejected["answer_in_question"] == 1
    assert result.rejected["not_a_question"] == 1
    assert result.rejected["answer_too_long"] == 1


def test_near_duplicate_questions_are_dropped_the_first_kept():
    replies = {
        "ferry leaves": "Question: When does the ferry leave?\nAnswer: 06:40",
        "Tickets": "Question: When does the ferry leave port?\nAnswer: adults",
        "keeper": "Question: Who is the lighthouse keeper?\nAnswer: Ada Quill",
        "white tower": "Question: who is the Lighthouse keeper?\nAnswer: board",
    }
    result = generate_questions(DOCS, fake(replies), 10, **SMALL, batch_size=1)
    assert len(result.rows) == 2 and result.rejected == {"duplicate": 2, "format": 1}
    # of each pair, the one asked first (in the seeded passage order) is kept
    passages = sample_passages(DOCS, **SMALL)
    first = {}
    for p in passages:
        key = next((k for k in replies if k in p.text), None)
        if key in ("ferry leaves", "Tickets"):
            first.setdefault("ferry", replies[key])
        elif key in ("keeper", "white tower"):
            first.setdefault("keeper", replies[key])
    assert sorted(parse_reply(r)[0] for r in first.values()) == sorted(
        r["question"] for r in result.rows
    )
    # a higher threshold keeps the paraphrase (5 of 6 tokens shared: Jaccard 0.83)
    loose = generate_questions(DOCS, fake(replies), 10, **SMALL, dedup_threshold=0.9)
    assert len(loose.rows) == 3 and loose.rejected["duplicate"] == 1


def test_drop_closed_book_drops_what_the_model_knows_without_the_documents():
    closed = {"Who is the lighthouse keeper?": "Ada Quill", "When does the ferry leave?": "noon"}
    llm = fake(closed_book=closed)
    result = generate_questions(DOCS, llm, 10, **SMALL, drop_closed_book=True)
    kept = {r["question"] for r in result.rows}
    assert "Who is the lighthouse keeper?" not in kept
    assert "When does the ferry leave?" in kept  # answered wrong closed book: it separates
    assert result.rejected == {"closed_book": 1} and len(kept) == 4
    assert result.usage["closed_book"].calls == 5
    without = generate_questions(DOCS, fake(closed_book=closed), 10, **SMALL)
    assert len(without.rows) == 5 and "closed_book" not in without.usage


def test_closed_book_check_asks_exactly_what_the_closed_book_strategy_asks():
    """Same request -> same completion-cache key: the run's closed book answers come free."""
    from ragbench.strategies.base import Resources
    from ragbench.strategies.closed_book import closed_book_steps
    from ragbench.strategies.params import ClosedBookParams

    class Res:
        max_new_tokens = 32
        request, new_tokens = Resources.request, Resources.new_tokens

    example = Example("q", "Who is the keeper?", ("Ada",), DOCS, {"task_type": "qa"})
    strategy_request = next(closed_book_steps(example, Res(), ClosedBookParams()))
    ours = question_gen._closed_book_request("Who is the keeper?", 32)
    assert (ours.prompt, ours.stop, ours.max_new_tokens) == (
        strategy_request.prompt,
        strategy_request.stop,
        strategy_request.max_new_tokens,
    )


def test_stops_at_n_and_samples_passages_by_seed():
    a = generate_questions(DOCS, fake(), 2, **SMALL, batch_size=2)
    assert len(a.rows) == 2 and a.passages_tried == 2
    again = generate_questions(DOCS, fake(), 2, **SMALL, batch_size=2)
    assert again.rows == a.rows
    capped = generate_questions(DOCS, fake(replies={}), 3, **SMALL, max_passages=2)
    assert capped.passages_tried == 2 and not capped.rows  # the cap bounds the cost
    orders = {
        tuple(r["question"] for r in generate_questions(DOCS, fake(), 5, **SMALL, seed=s).rows)
        for s in range(4)
    }
    assert len(orders) > 1  # the seed chooses the passages' order


def test_rerun_is_identical_and_served_by_the_cache(tmp_path):
    corpus = write_documents(tmp_path / "corpus.jsonl", DOCS)
    llm = fake(closed_book={"Who is the lighthouse keeper?": "Ada Quill"})
    cached = CachedLLM(llm, tmp_path / "cache.sqlite")
    opts = {**SMALL, "drop_closed_book": True, "seed": 3}
    first = questions_file(corpus, tmp_path / "a.jsonl", 4, cached, **opts)
    calls = llm.calls
    second = questions_file(corpus, tmp_path / "b.jsonl", 4, cached, **opts)
    assert (tmp_path / "a.jsonl").read_bytes() == (tmp_path / "b.jsonl").read_bytes()
    assert llm.calls == calls  # nothing generated again
    assert second.usage["generate"].cache_hits == second.usage["generate"].calls > 0
    assert first.usage["generate"].cache_hits == 0
    # the cost reported is the original accounting, hits included: what the file cost to make
    assert second.usage["generate"].prompt_tokens == first.usage["generate"].prompt_tokens


def test_written_file_is_a_questions_file_for_the_corpus_dataset(tmp_path):
    corpus = write_documents(tmp_path / "corpus.jsonl", DOCS)
    out = tmp_path / "q.jsonl"
    result = questions_file(corpus, out, 5, fake(), **SMALL)
    examples = build_dataset(
        "corpus", corpus=str(corpus), questions=str(out), missing_evidence="error"
    )
    assert [e.id for e in examples] == [r["id"] for r in result.rows]
    texts = {d.id: d.text for d in DOCS}
    for e, row in zip(examples, result.rows, strict=True):
        doc, s, e_ = row["meta"]["answer_span"]
        # the quote is located again, and its span covers the recorded answer span
        assert any(d == doc and a <= s and e_ <= b for d, a, b in e.meta["evidence"])
        assert texts[doc][s:e_] in e.answers and e.meta["source"] == "generated"
    lines = out.read_text(encoding="utf-8").splitlines()
    assert all(json.loads(line)["id"] for line in lines)


def test_costs_tokens_seconds_and_dollars_with_a_price_sheet():
    result = generate_questions(
        DOCS, fake(), 2, **SMALL, batch_size=2, price_sheet="example-hosted-api"
    )
    usage = result.usage["generate"]
    assert usage.calls == 2 and usage.prompt_tokens > 0 and usage.completion_tokens > 0
    assert usage.seconds > 0 and usage.dollars and usage.dollars > 0
    # the instructions are one prefix: the second request of the batch reads them from cache
    assert 0 < usage.cached_prompt_tokens < usage.prompt_tokens
    assert re.search(
        r"LLM cost, generate: 2 calls \(0 from the cache\), .* device seconds, "
        r"\$0\.\d{6}",
        result.summary(),
    )
    assert generate_questions(DOCS, fake(), 2, **SMALL).usage["generate"].dollars is None


def test_seconds_are_each_completions_own_share_of_device_time():
    """A batch of 4 that took 8 s reports each row's 2 s share: 8 s in all, not 4 x 8 s."""
    from ragbench.types import Completion

    row = Completion("x", 10, 2, prefill_seconds=7.0, decode_seconds=1.0, meta={"gpu_seconds": 2})
    usage = question_gen.Usage()
    usage.add([row] * 4)
    assert usage.seconds == 8.0 and usage.calls == 4


def test_bad_inputs_are_clear_errors(tmp_path):
    with pytest.raises(ValueError, match="n must be >= 1"):
        generate_questions(DOCS, fake(), 0)
    with pytest.raises(ValueError, match="no passage of at least 50 words"):
        generate_questions(DOCS, fake(), 3, min_passage_words=50)
    with pytest.raises(ValueError, match="did you mean 'contains'"):
        generate_questions(DOCS, fake(), 3, closed_book_metric="contain")
    corpus = write_documents(tmp_path / "corpus.jsonl", DOCS)
    with pytest.raises(ValueError, match=r"no question survived the checks; .* 5 format"):
        questions_file(corpus, tmp_path / "q.jsonl", 3, fake(replies={}), **SMALL)
    assert not (tmp_path / "q.jsonl").exists()


# --------------------------------------------------------------------------- CLI


@pytest.fixture()
def cli(tmp_path, monkeypatch):
    app = typer.Typer()

    @app.callback()
    def main() -> None:
        pass

    register(app)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("RAGBENCH_CACHE", str(tmp_path / "cache"))
    return lambda *args: CliRunner().invoke(app, ["data", *args])


def test_cli_writes_the_file_and_prints_rejections_and_cost(cli, tmp_path, monkeypatch):
    corpus = write_documents(tmp_path / "corpus.jsonl", DOCS)
    loaded = {}

    def load_model(section, cache=None):  # the section the CLI built, scripted model instead
        loaded.update(section)
        return FakeLLM(answer_fn=scripted(good_replies()))

    monkeypatch.setattr(question_gen, "load_model", load_model)
    out = tmp_path / "q.jsonl"
    args = ["questions", str(corpus), "--n", "3", "--out", str(out), "--backend", "fake"]
    result = cli(*args, "--passage-tokens", "16", "--price-sheet", "example-hosted-api")
    assert result.exit_code == 0, result.output
    assert "kept 3 of 3 questions requested" in result.stdout
    assert "LLM cost, generate:" in result.stdout and "$" in result.stdout
    assert f"wrote 3 questions to {out}" in result.stdout
    assert loaded["backend"] == "fake" and loaded["max_new_tokens"] == 32
    assert len(out.read_text().splitlines()) == 3


def test_cli_nothing_kept_exits_2_saying_why(cli, tmp_path):
    corpus = write_documents(tmp_path / "corpus.jsonl", DOCS)
    # the fake backend's default reader answers "unanswerable": no pair in the format
    result = cli("questions", str(corpus), "--out", "q.jsonl", "--backend", "fake", "--n", "2")
    assert result.exit_code == 2
    assert "error: no question survived the checks" in result.stderr
    assert "format" in result.stderr and not Path("q.jsonl").exists()


def test_cli_unknown_backend_names_the_choices(cli, tmp_path):
    corpus = write_documents(tmp_path / "corpus.jsonl", DOCS)
    result = cli("questions", str(corpus), "--out", "q.jsonl", "--backend", "fak")
    assert result.exit_code == 2 and "fake" in result.stderr


# --------------------------------------------------------------------------- embedded model


@pytest.mark.slow
def test_embedded_model_pipeline_is_honest(tmp_path):
    """SmolLM2-135M may produce few or no valid pairs; whatever it keeps must hold up."""
    corpus = write_documents(tmp_path / "corpus.jsonl", DOCS)
    llm = question_gen.load_model({"backend": "hf", "name": "smollm2-135m-instruct"}, cache=False)
    # calibrated to 1,232 tokens (the suite's longest SmolLM2 request, test_hf's 1k needle: one
    # calibration file serves every such test of a session), not the default 2,048
    llm.cost_rates(longest=1232)
    result = question_gen.generate_questions(
        DOCS, llm, 3, **SMALL, max_passages=3, drop_closed_book=True, batch_size=3
    )
    assert result.passages_tried == 3
    assert result.usage["generate"].calls == 3 and result.usage["generate"].seconds > 0
    assert len(result.rows) + sum(result.rejected.values()) == 3
    assert set(result.rejected) <= set(question_gen.REASONS)
    texts = {d.id: d.text for d in DOCS}
    for row in result.rows:
        doc, s, e = row["meta"]["answer_span"]
        assert texts[doc][s:e] == row["answers"][0]
        assert row["question"].endswith("?")
    if result.rows:
        question_gen.write_questions(tmp_path / "q.jsonl", result.rows)
        examples = build_dataset(
            "corpus",
            corpus=str(corpus),
            questions=str(tmp_path / "q.jsonl"),
            missing_evidence="error",
        )
        assert len(examples) == len(result.rows)


# --------------------------------------------------------------------------- two passages (multi-hop)


# two documents, two sentences each (one passage each at passage_tokens=16): "Gull Point" links
# the keeper to the distance, "old ferry" links Ben Marsh to the year it was built
MULTI = (
    Document(
        "keepers.md",
        "Ada Quill keeps the white lighthouse on Gull Point.\n\n"
        "The harbour master Ben Marsh sails the old ferry every day.",
    ),
    Document(
        "places.txt",
        "Gull Point lies twelve miles north of the town of Dover.\n\n"
        "The old ferry was built in 1923 in the yard at Hull.",
    ),
)
KEEPER = "Ada Quill keeps the white lighthouse on Gull Point."  # keepers.md[0:51]
MASTER = "The harbour master Ben Marsh sails the old ferry every day."  # keepers.md[53:112]
DISTANCE = "Gull Point lies twelve miles north of the town of Dover."  # places.txt[0:56]
BUILT = "The old ferry was built in 1923 in the yard at Hull."  # places.txt[58:110]
DOVER_Q = "How far north of Dover is the lighthouse kept by Ada Quill?"
FERRY_Q = "In which year was the ferry that Ben Marsh sails built?"
BRIDGES = {
    "Gull Point": f"Question: {DOVER_Q}\nAnswer: twelve miles",
    "old ferry": f"Question: {FERRY_Q}\nAnswer: 1923",
}


def pair_fake(replies: dict[str, str], closed_book: dict[str, str] | None = None) -> FakeLLM:
    """The reply for the first key found in both texts of a pair request; closed-book prompts get
    ``closed_book[question]`` (default "unanswerable")."""

    def answer(request: GenerationRequest) -> str:
        if "needs both texts" not in request.prompt:
            question = request.prompt.rsplit("Question: ", 1)[1].split("\n")[0]
            return (closed_book or {}).get(question, "unanswerable")
        pair = request.prompt.rsplit("Text 1: ", 1)[1]
        return next((r for key, r in replies.items() if pair.count(key) == 2), "no idea")

    return FakeLLM("fake", answer_fn=answer)


def test_pairs_are_passages_of_two_documents_sharing_rare_words_by_seed():
    ids = {}
    for seed in range(4):
        passages = sample_passages(MULTI, seed=seed, **SMALL)
        pairs = list(multihop.pair_passages(passages))
        ids[seed] = [multihop.pair_id(p) for p in pairs]
        assert {frozenset((p.first.text, p.second.text)): p.shared for p in pairs} == {
            frozenset((KEEPER, DISTANCE)): ("gull", "point"),
            frozenset((MASTER, BUILT)): ("ferry", "old"),
        }
        # the first passage of a pair is the earlier one in the seeded order
        order = [passage_id(p) for p in passages]
        assert all(order.index(i.split("+")[0]) < order.index(i.split("+")[1]) for i in ids[seed])
        assert ids[seed] == [multihop.pair_id(p) for p in multihop.pair_passages(passages)]
    assert len({tuple(v) for v in ids.values()}) > 1  # the seed orders the pairs
    # one document: its passages pair with each other; nothing shared: no pair
    one = sample_passages((Document("one", f"{KEEPER}\n\n{DISTANCE}"),), **SMALL)
    [pair] = multihop.pair_passages(one)
    assert pair.shared == ("gull", "point") and pair.first.doc_id == pair.second.doc_id == "one"
    alone = sample_passages(
        (Document("a", MASTER), Document("b", "Tea is served at noon.")), **SMALL
    )
    assert list(multihop.pair_passages(alone)) == []


def test_a_two_passage_question_has_two_evidence_spans_in_two_documents(tmp_path):
    corpus = write_documents(tmp_path / "corpus.jsonl", MULTI)
    out = tmp_path / "q.jsonl"
    result = questions_file(corpus, out, 5, pair_fake(BRIDGES), **SMALL, hops=2)
    assert result.passages_tried == 2 and result.unit == "passage pairs"
    assert "from 2 passage pairs tried (4 passages available)" in result.summary()
    rows = {r["question"]: r for r in result.rows}
    assert set(rows) == {DOVER_Q, FERRY_Q}
    assert rows[DOVER_Q]["answers"] == ["twelve miles"] and rows[FERRY_Q]["answers"] == ["1923"]
    assert rows[DOVER_Q]["meta"]["answer_span"] == ["places.txt", 16, 28]
    assert rows[FERRY_Q]["meta"]["answer_span"] == ["places.txt", 85, 89]
    assert sorted(map(tuple, rows[DOVER_Q]["meta"]["evidence_spans"])) == [
        ("keepers.md", 0, 51),
        ("places.txt", 0, 56),
    ]
    assert rows[FERRY_Q]["meta"]["hops"] == 2 and rows[FERRY_Q]["meta"]["shared_words"]
    examples = {
        e.question: e
        for e in build_dataset(
            "corpus", corpus=str(corpus), questions=str(out), missing_evidence="error"
        )
    }
    texts = {d.id: d.text for d in MULTI}
    for question, sentences in ((DOVER_Q, {KEEPER, DISTANCE}), (FERRY_Q, {MASTER, BUILT})):
        spans = examples[question].evidence
        assert len(spans) == 2 and len({doc for doc, _, _ in spans}) == 2  # two places
        assert {texts[doc][s:e] for doc, s, e in spans} == sentences
        assert sorted(map(list, spans)) == sorted(rows[question]["meta"]["evidence_spans"])


def test_two_passage_checks_drop_single_hop_unsupported_and_closed_book_questions():
    replies = {
        "Gull Point": "Question: Who keeps the white lighthouse?\nAnswer: Ada Quill",
        "old ferry": f"Question: {FERRY_Q}\nAnswer: 1999",
    }
    result = generate_questions(MULTI, pair_fake(replies), 2, **SMALL, hops=2)
    assert not result.rows
    assert dict(result.rejected) == {"single_hop": 1, "answer_not_in_passage": 1}
    # the answer in both passages: it must need each one's partner ("Gull Point" is in both)
    where = {"Gull Point": "Question: Where is the white lighthouse?\nAnswer: Gull Point"}
    both = generate_questions(MULTI, pair_fake(where), 1, **SMALL, hops=2)
    assert dict(both.rejected) == {"single_hop": 1, "format": 1}  # the other pair: no reply
    closed = pair_fake(BRIDGES, closed_book={DOVER_Q: "It is twelve miles north."})
    kept = generate_questions(MULTI, closed, 2, **SMALL, hops=2, drop_closed_book=True)
    assert [r["question"] for r in kept.rows] == [FERRY_Q]
    assert dict(kept.rejected) == {"closed_book": 1} and kept.usage["closed_book"].calls == 2
    assert set(kept.rejected) <= set(question_gen.REASONS)
    with pytest.raises(ValueError, match="hops must be 1"):
        generate_questions(MULTI, pair_fake({}), 1, hops=3)
    lone = (Document("a", MASTER), Document("b", "Tea is served at noon in the hall."))
    with pytest.raises(ValueError, match="share a key word"):
        generate_questions(lone, pair_fake({}), 1, **SMALL, hops=2)


def test_two_passage_request_shows_the_format_and_shares_the_prefix():
    [pair, other] = multihop.pair_passages(sample_passages(MULTI, **SMALL))
    a, b = multihop.pair_request(pair), multihop.pair_request(other)
    assert a.prompt.startswith(a.prefix) and a.prefix == b.prefix and "Question: <" in a.prefix
    assert a.prompt.endswith(
        f"Text 2: {pair.second.text}\nBoth mention: {', '.join(pair.shared)}\n"
    )
    assert a.id == multihop.pair_id(pair)


def test_cli_multi_hop(cli, tmp_path, monkeypatch):
    corpus = write_documents(tmp_path / "corpus.jsonl", MULTI)
    monkeypatch.setattr(question_gen, "load_model", lambda section, cache=None: pair_fake(BRIDGES))
    out = tmp_path / "q.jsonl"
    result = cli(
        "questions",
        str(corpus),
        "--n",
        "2",
        "--out",
        str(out),
        "--backend",
        "fake",
        "--passage-tokens",
        "16",
        "--multi-hop",
    )
    assert result.exit_code == 0, result.output
    assert "kept 2 of 2 questions requested from 2 passage pairs tried" in result.stdout
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [len(r["evidence"]) for r in rows] == [2, 2] and all(
        r["meta"]["hops"] == 2 for r in rows
    )


def test_a_bad_model_section_is_one_line_naming_the_choices_not_a_pydantic_dump():
    with pytest.raises(ValueError) as err:
        question_gen.load_model({"backend": "fak", "name": "fake"})
    msg = str(err.value)
    assert (
        msg
        == "model: backend: unknown LLM backend 'fak'; did you mean 'fake'? valid: fake, hf, openai"
    )
