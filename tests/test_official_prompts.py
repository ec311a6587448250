"""A benchmark run with its own prompts: LongBench v2's official templates end to end.

Every request the strategies send for a LongBench v2 example is checked against the template
filled as ``pred.py`` fills it (``datasets.longbench_v2.render``, itself checked against the
template files' text in test_importers_v2.py): long context ``0shot``, RAG ``0shot_rag`` over
"Retrieved chunk N:" blocks, closed book ``0shot_no_context``, and chain of thought as
``pred.py``'s two calls (1,024 reasoning tokens, then ``0shot_cot_ans`` with that reply). The
whole reply is scored by the official extraction. Examples without a format keep ragbench's.
"""

from __future__ import annotations

import re

import pytest
from test_importers_v2 import FILLER, lb2_row, retrieved_context, write_lb2

from ragbench.datasets import longbench_v2 as lb2
from ragbench.experiment.runner import run
from ragbench.llm.fake import FakeLLM
from ragbench.strategies.params import (
    ClosedBookParams,
    LongContextParams,
    RagParams,
    SelfRouteParams,
)
from ragbench.strategies.prompt_format import FORMATS, FULL, prompt_format

REASONING = "Step one: the text names vault-{i}.\n\nStep two: its code is {code}."


class Recorder:
    """A fake model that keeps every request and answers like a careful reader: it reasons when
    asked to think step by step, and answers in the official format otherwise."""

    def __init__(self):
        self.requests = []
        self.__qualname__ = "Recorder"  # the fake model's identity names its answer function

    def __call__(self, request) -> str:
        self.requests.append(request)
        prompt = request.prompt
        i = re.search(r"code of vault-(\d+)\?", prompt).group(1)
        fact = re.search(rf"The code of vault-{i} is (\d+)\.", prompt)
        if prompt.endswith("Let’s think step by step:"):
            code = fact.group(1) if fact else "unknown"
            return REASONING.format(i=i, code=code)
        fact = fact or re.search(r"its code is (\d+)\.", prompt)
        letter = re.search(rf"\(([A-D])\) {fact.group(1)}\n", prompt) if fact else None
        return f"The correct answer is ({letter.group(1)})\nThat is all." if letter else "?"

    def sent(self, rid: str):
        return [r for r in self.requests if r.id == rid]


def lb2_config(tmp_path, strategies, rows=None) -> dict:
    path = write_lb2(tmp_path / "data.json", rows or [lb2_row(0, "B"), lb2_row(1, "C")])
    return {
        "name": "lb2-official",
        "dataset": {"name": "longbench-v2", "params": {"path": str(path)}},
        "model": {"backend": "fake", "name": "fake", "cache": False, "max_new_tokens": 128},
        "retrieval": {
            "retriever": "bm25",
            "embedder": "hash",
            "chunk_size": 16,
            "chunk_overlap": 2,
            "tokenizer": "whitespace",
        },
        "strategies": strategies,
        "metrics": ["longbench_v2_accuracy"],
        "output_dir": str(tmp_path / "results"),
    }


def run_lb2(tmp_path, strategies, rows=None, window=8192, **fake):
    cfg = lb2_config(tmp_path, strategies, rows)
    cfg["model"]["params"] = dict(fake)  # the config says what the fake given runs (kv too)
    recorder = Recorder()
    llm = FakeLLM(answer_fn=recorder, context_window=window, **fake)
    df = run(cfg, progress=False, llm=llm)
    return df, recorder, lb2.load_longbench_v2(cfg["dataset"]["params"]["path"]), llm


def test_long_context_rag_and_closed_book_send_the_official_prompts(tmp_path):
    rag = {"name": "rag", "params": {"top_k": 2, "order": "document"}}
    df, rec, examples, _ = run_lb2(tmp_path, ["closed_book", "long_context", rag])
    for ex in examples:
        [lc] = rec.sent(f"{ex.id}:long_context")
        assert lc.prompt == lb2.render("0shot", ex)
        # the document's KV prefix: everything before the question block
        assert lc.prefix == lc.prompt.removesuffix(ex.question)
        assert lc.prefix.endswith(f"{ex.context}\n</text>\n\n")
        assert lc.stop == () and lc.max_new_tokens == 128
        [cb] = rec.sent(f"{ex.id}:closed_book")
        assert cb.prompt == lb2.render("0shot_no_context", ex) and FILLER not in cb.prompt
        [rg] = rec.sent(f"{ex.id}:rag")
        context = rg.prompt.split("<text>\n", 1)[1].split("\n</text>", 1)[0]
        chunks = re.split(r"\n\nRetrieved chunk \d+: ", context.removeprefix("Retrieved chunk 1: "))
        assert len(chunks) == 2 and all(c in ex.context for c in chunks)  # document order
        assert ex.context.index(chunks[0]) < ex.context.index(chunks[1])
        assert rg.prompt == lb2.render("0shot_rag", ex, context=retrieved_context(chunks))
    # the whole reply is the prediction; the official extraction scores it
    lc = df[df.strategy == "long_context"].sort_values("example_id")
    assert list(lc["prediction"]) == [
        "The correct answer is (B)\nThat is all.",
        "The correct answer is (C)\nThat is all.",
    ]
    assert list(lc["longbench_v2_accuracy"]) == [1.0, 1.0]
    assert (df[df.strategy == "closed_book"]["longbench_v2_accuracy"] == 0.0).all()


def test_chain_of_thought_is_pred_py_two_calls(tmp_path):
    strategies = [
        {"name": "closed_book", "params": {"cot": True}},
        {"name": "long_context", "params": {"cot": [False, True]}},
        {"name": "rag", "params": {"top_k": 2, "cot": True}},
    ]
    df, rec, examples, llm = run_lb2(tmp_path, strategies)
    ex = examples[1]
    first, second = (
        rec.sent(f"{ex.id}:long_context")[1],
        rec.sent(f"{ex.id}:long_context:answer")[0],
    )
    assert first.prompt == lb2.render("0shot_cot", ex)
    assert first.max_new_tokens == lb2.COT_TOKENS == 1024 and first.stop == ()
    reasoning = REASONING.format(i=1, code="3333")
    assert second.prompt == lb2.render("0shot_cot_ans", ex, cot=reasoning)
    assert second.max_new_tokens == 128 and "omitted here" in second.prompt
    # pred.py with --rag and --cot: the rag template, then the same answer step
    [rag1], [rag2] = rec.sent(f"{ex.id}:rag"), rec.sent(f"{ex.id}:rag:answer")
    assert rag1.prompt.startswith("Please read the following retrieved text chunks")
    assert rag1.max_new_tokens == 1024  # its template asks for the answer: the reply goes back
    assert rag2.prompt == lb2.render(
        "0shot_cot_ans", ex, cot="The correct answer is (C)\nThat is all."
    )
    [cb1], [cb2] = rec.sent(f"{ex.id}:closed_book"), rec.sent(f"{ex.id}:closed_book:answer")
    assert cb1.prompt == lb2.render("0shot_no_context", ex) and cb1.max_new_tokens == 1024
    assert cb2.prompt == lb2.render("0shot_cot_ans", ex, cot="?")  # it knew no answer

    by_label = {label: g.sort_values("example_id") for label, g in df.groupby("label")}
    assert set(by_label) == {
        "closed_book cot",
        "long_context",
        "long_context cot",
        "rag k=2 retriever=bm25 chunk=16 overlap=2 cot",  # bm25 names no embedder
    }
    cot = by_label["long_context cot"]
    assert list(cot["longbench_v2_accuracy"]) == [1.0, 1.0]
    # a record's tokens are both calls'; the reasoning is kept beside the answer
    calls = [first, second]
    assert cot.iloc[1]["prompt_tokens"] == sum(llm.prompt_tokens(r) for r in calls)
    plain = by_label["long_context"].iloc[1]
    assert cot.iloc[1]["prompt_tokens"] > plain["prompt_tokens"]
    assert cot.iloc[1]["completion_tokens"] > plain["completion_tokens"]
    assert list(by_label["closed_book cot"]["longbench_v2_accuracy"]) == [0.0, 0.0]


def test_cot_record_keeps_its_reasoning(tmp_path):
    from ragbench.experiment.results import read_records

    run_lb2(tmp_path, [{"name": "long_context", "params": {"cot": True}}], rows=[lb2_row(0)])
    [record] = read_records(next((tmp_path / "results").rglob("records.jsonl"))).values()
    assert record.meta["cot_reasoning"] == REASONING.format(i=0, code="2222")
    assert record.prediction == "The correct answer is (B)\nThat is all."
    assert record.params.cot is True and record.params.label() == "long_context cot"


def test_truncate_middle_keeps_the_instruction_and_the_question(tmp_path):
    long_row = lb2_row(0, "B") | {
        "context": " ".join([FILLER] * 20) + " The code of vault-0 is 2222."
    }
    lc = {"name": "long_context", "params": {"overflow": "truncate_middle"}}
    df, rec, [ex], llm = run_lb2(tmp_path, [lc], rows=[long_row], window=600)
    [sent] = rec.sent("lb0:long_context")
    assert sent.prompt.startswith("Please read the following text and answer the question below.")
    assert sent.prompt.endswith(ex.question) and "\n</text>\n\n" in sent.prompt
    assert (
        llm.prompt_tokens(sent)
        <= 600 - 128
        < llm.prompt_tokens(sent.__class__(prompt=lb2.render("0shot", ex)))
    )
    assert df.iloc[0]["truncated_tokens"] > 0 and df.iloc[0]["longbench_v2_accuracy"] == 1.0


def test_self_route_offers_unanswerable_before_the_answer_format(tmp_path):
    sr = {"name": "self_route", "params": {"top_k": 1}}
    _, rec, [ex], _ = run_lb2(tmp_path, [sr], rows=[lb2_row(0)])
    [first] = rec.sent("lb0:self_route:rag")
    assert first.prompt.endswith(
        'If the text above does not contain the answer, reply exactly "unanswerable".\n'
        + lb2.FORMAT_LINE
    )
    frame = prompt_format(ex).frame(ex, FULL)
    assert frame.head.startswith("Please read the following text")


def test_cot_needs_a_format_with_a_protocol(tmp_path):
    from test_runner import niah_config

    cfg = niah_config(tmp_path)
    cfg["strategies"] = [{"name": "long_context", "params": {"cot": True}}]
    with pytest.raises(
        ValueError, match="long_context cot: example .*formats with one: longbench_v2"
    ):
        run(cfg, progress=False)  # before any model loads
    with pytest.raises(ValueError, match="self_route: cot is not supported"):
        SelfRouteParams(cot=True)
    with pytest.raises(ValueError, match="cot must be true or false"):
        ClosedBookParams(cot=1)


def test_the_dry_run_counts_the_answer_step_with_the_longest_reasoning(tmp_path):
    from ragbench.experiment.dry_run import dry_run

    cfg = lb2_config(tmp_path, [{"name": "long_context", "params": {"cot": True}}], [lb2_row(0)])
    table = dry_run(cfg, progress=False).set_index("label")
    [ex] = lb2.load_longbench_v2(cfg["dataset"]["params"]["path"])
    longest = " ".join(["x"] * lb2.COT_TOKENS)  # the reasoning call may fill its budget
    count = FakeLLM().count_tokens
    calls = [lb2.render("0shot_cot", ex), lb2.render("0shot_cot_ans", ex, cot=longest)]
    assert table.loc["long_context cot", "prompt_tokens"] == sum(count(c) for c in calls)
    assert table.loc["long_context cot", "completion_tokens_max"] == lb2.COT_TOKENS + 128
    # a real run (short reasoning) stays under the dry run's bound
    df, *_ = run_lb2(tmp_path, [{"name": "long_context", "params": {"cot": True}}], [lb2_row(0)])
    assert 0 < df.iloc[0]["prompt_tokens"] < table.loc["long_context cot", "prompt_tokens"]


def test_cot_over_the_window_names_the_reasoning_budget(tmp_path):
    from ragbench.experiment.preflight import OverWindowError

    lc = {"name": "long_context", "params": {"cot": True}}
    with pytest.raises(OverWindowError, match="leaves 76 after the 1024 answer tokens \\(a cot"):
        run_lb2(tmp_path, [lc], [lb2_row(0)], window=1100)
    with pytest.raises(ValueError, match="preload and cot cannot be combined"):
        LongContextParams(preload=True, cot=True)


def test_the_answer_step_keeps_the_points_kv_cache(tmp_path):
    lc = {"name": "long_context", "params": {"cot": True, "kv": {"name": "quantized", "bits": 4}}}
    _, rec, _, _ = run_lb2(tmp_path, [lc], [lb2_row(0)], simulate_kv_cache=True)
    first, second = rec.sent("lb0:long_context")[0], rec.sent("lb0:long_context:answer")[0]
    assert first.kv is not None and second.kv == first.kv


def test_files_imported_before_formats_and_records_of_the_old_prompts():
    from ragbench.experiment.results import work_key
    from ragbench.io import dumps_canonical
    from ragbench.types import Example

    old = Example("lb0", "q", ("B",), (), {"source": "longbench_v2", "choices": {}})
    assert prompt_format(old).name == "longbench_v2"
    assert prompt_format(Example("n", "q", ("a",), (), {})).name == "ragbench"
    # ragbench's keys: the schema version, example, strategy, params; another format's are not
    # taken for them
    assert work_key("e", "rag", {"k": 1}) == dumps_canonical([2, "e", "rag", {"k": 1}])
    assert work_key("e", "rag", {"k": 1}, "longbench_v2") != work_key("e", "rag", {"k": 1})


def test_a_longbench_reply_declines_only_without_a_letter():
    fmt = FORMATS["longbench_v2"]
    ex = None  # the decision reads the reply alone
    assert fmt.declined(ex, "unanswerable")
    assert fmt.declined(ex, "The text does not say: unanswerable.")
    assert not fmt.declined(ex, "The correct answer is (B), not unanswerable.")
    assert not fmt.declined(ex, "The correct answer is (C)")


def test_cot_is_stored_always_and_labelled_when_set():
    """Every parameter is stored, at its default too (schema 2: ``ragbench.schema``)."""
    for params in (ClosedBookParams(), LongContextParams(), RagParams()):
        assert params.to_dict()["cot"] is False and "cot" not in params.label()
    assert LongContextParams(cot=True).to_dict()["cot"] is True
    assert RagParams(cot=True).label() == "rag k=5 cot"
    assert ClosedBookParams().to_dict() == {"cot": False}


@pytest.mark.slow
def test_longbench_v2_official_prompts_on_the_embedded_model(tmp_path):
    """SmolLM2-135M answers with the official prompts, chain of thought included."""
    from ragbench.analysis.longbench_v2 import longbench_v2_table

    path = write_lb2(tmp_path / "data.json", [lb2_row(0, "B"), lb2_row(1, "C")])
    cfg = {
        "name": "lb2-smollm2",
        "dataset": {"name": "longbench-v2", "params": {"path": str(path)}},
        "model": {
            "backend": "hf",
            "name": "smollm2-135m-instruct",
            "max_new_tokens": 16,
            "cache": False,
            "threads": 1,
        },
        "retrieval": {"retriever": "bm25", "chunk_size": 32, "chunk_overlap": 4},
        "strategies": [
            "closed_book",
            {"name": "long_context", "params": {"cot": [False, True]}},
            {"name": "rag", "params": {"top_k": 2, "order": "document"}},
        ],
        "metrics": ["longbench_v2_accuracy"],
        "output_dir": str(tmp_path / "results"),
    }
    df = run(cfg, progress=False)
    assert len(df) == 8 and df["error"].isna().all()
    tokens = df.groupby("strategy")["prompt_tokens"].mean()
    assert tokens["long_context"] > tokens["rag"] > tokens["closed_book"]
    cot, plain = (
        df[df.label == label].sort_values("example_id")
        for label in ("long_context cot", "long_context")
    )
    # both calls are the record's: the reasoning call reads the document, the answer step not
    assert (cot["prompt_tokens"].values > plain["prompt_tokens"].values).all()
    assert (cot["completion_tokens"].values > plain["completion_tokens"].values).all()
    assert set(df["longbench_v2_accuracy"]) <= {0.0, 1.0}
    table = longbench_v2_table(df).set_index("label")
    assert list(table["n"]) == [2, 2, 2, 2]
