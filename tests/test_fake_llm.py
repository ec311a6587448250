"""FakeLLM: answers needle prompts like a perfect reader, deterministic accounting, registry."""

from __future__ import annotations

import inspect
import json
import subprocess
import sys
from pathlib import Path

import pytest

from ragbench.llm import BACKENDS, ContextOverflowError, load_llm
from ragbench.llm.fake import UNANSWERABLE, FakeLLM, answer_from_prompt, split_question
from ragbench.registry import UnknownNameError
from ragbench.types import GenerationRequest

FIXTURES = Path(__file__).parent / "fixtures"
HAY = "The grass is green. The sky is blue. " * 20


def prompt(context: str, question: str) -> str:
    # the strategies' long-context layout: document first, question last
    return (
        f"{context}\n\nAnswer the question based on the text above.\nQuestion: {question}\nAnswer:"
    )


def test_ruler_fixture_is_answered_from_its_prompt():
    row = json.loads((FIXTURES / "ruler.jsonl").read_text().splitlines()[0])
    assert answer_from_prompt(row["input"]) == row["outputs"][0]


def test_keyed_needles_pick_the_key_the_question_names():
    ctx = (
        f"{HAY}One of the special magic numbers for quiet-lake is: 111. {HAY}"
        f"One of the special magic numbers for lake is: 222. "
        f"One of the special magic numbers for quiet-lake is: 333. {HAY}"
    )
    assert (
        answer_from_prompt(prompt(ctx, "What are the special magic numbers for quiet-lake?"))
        == "111, 333"
    )
    assert answer_from_prompt(prompt(ctx, "What is the special magic number for lake?")) == "222"
    assert (
        answer_from_prompt(prompt(ctx, "What is the special magic number for red-fox?"))
        == UNANSWERABLE
    )


def test_keyless_and_definitional_needles():
    ctx = f"{HAY}The special magic number is 7463343. {HAY}"
    assert answer_from_prompt(prompt(ctx, "What is the special magic number?")) == "7463343"
    kamradt = f"{HAY}\nThe best thing to do in San Francisco is eat a sandwich and sit in Dolores Park on a sunny day.\n{HAY}"
    q = "What is the best thing to do in San Francisco?"
    assert (
        answer_from_prompt(prompt(kamradt, q))
        == "eat a sandwich and sit in Dolores Park on a sunny day"
    )
    # the needle removed (e.g. a retriever missed its chunk): no answer
    assert answer_from_prompt(prompt(HAY, q)) == UNANSWERABLE
    # the question itself does not count as context
    assert (
        answer_from_prompt(prompt(HAY, "What is the special magic number for x is: 5?"))
        == UNANSWERABLE
    )


def test_split_question_without_label_uses_last_line():
    assert split_question("ctx line\nWhat is it?") == ("ctx line", "What is it?")
    assert split_question("Question: a?\nAnswer:") == ("", "a?")


def test_accounting_is_deterministic_and_prefix_reuse_is_reported():
    llm = FakeLLM(prefill_tokens_per_second=100.0, decode_tokens_per_second=10.0)
    doc = f"{HAY}One of the special magic numbers for k1 is: 42. "
    reqs = [
        GenerationRequest(prompt=doc + "Question: special magic number for k1?", prefix=doc),
        GenerationRequest(prompt=doc + "Question: special magic number for k2?", prefix=doc),
        GenerationRequest(prompt="Question: special magic number for k1?"),
    ]
    out = llm.generate(reqs)
    assert [c.text for c in out] == ["42", UNANSWERABLE, UNANSWERABLE]
    n_doc = len(doc.split())
    assert out[0].prompt_tokens == n_doc + 6
    assert out[0].cached_prompt_tokens == 0  # first sight of the prefix
    assert out[1].cached_prompt_tokens == n_doc  # reused within the batch
    assert out[0].prefill_seconds == pytest.approx(out[0].prompt_tokens / 100.0)
    assert out[1].prefill_seconds == pytest.approx(6 / 100.0)  # only the uncached tokens
    assert out[0].completion_tokens == 1 and out[0].decode_seconds == pytest.approx(0.1)
    assert all(c.meta["simulated_timing"] for c in out)
    # a new batch starts cold, and reruns are identical
    again = llm.generate(reqs)
    assert again == out and llm.calls == 2


def test_max_new_tokens_stop_and_answer_fn():
    llm = FakeLLM(answer_fn=lambda r: "one two three four. five")
    c = llm.generate([GenerationRequest(prompt="q", max_new_tokens=2)])[0]
    assert (c.text, c.completion_tokens, c.finish_reason) == ("one two", 2, "length")
    c = llm.generate([GenerationRequest(prompt="q", stop=(".",))])[0]
    assert (c.text, c.finish_reason) == ("one two three four", "stop")
    assert "test_fake_llm" in llm.identity()["answer_fn"]


def test_context_window_is_enforced():
    llm = FakeLLM(context_window=10)
    with pytest.raises(ContextOverflowError, match="10-token context window"):
        llm.generate([GenerationRequest(prompt="a " * 8, max_new_tokens=4)])
    assert llm.generate([GenerationRequest(prompt="a " * 6, max_new_tokens=4)])[0].text


def test_registry_load_and_did_you_mean(tmp_path):
    assert BACKENDS.names() == ["fake", "hf", "openai"]
    llm = load_llm("fake", context_window=123)
    assert isinstance(llm, FakeLLM) and llm.context_window == 123
    cached = load_llm("fake", cache=tmp_path / "c.sqlite")
    assert cached.generate([GenerationRequest(prompt="x")])[0].text == UNANSWERABLE
    with pytest.raises(UnknownNameError, match="did you mean 'openai'"):
        load_llm("opena")


def test_every_backend_takes_the_model_name_as_model():
    """The runner builds any backend as load_llm(backend, model=name, **params)."""
    for backend in BACKENDS.names():
        params = list(inspect.signature(BACKENDS.get(backend)).parameters)
        assert params[0] == "model", (backend, params)
    llm = load_llm("fake", model="my-fake", context_window=64)
    assert llm.name == "my-fake" and llm.identity()["model"] == "my-fake"
    assert llm.generate([GenerationRequest(prompt="x")])[0].model == "my-fake"
    assert FakeLLM().name == "fake"
    with pytest.raises(TypeError, match="model must be a name"):
        FakeLLM(4096)  # context_window is keyword-only


def test_importing_ragbench_llm_stays_light():
    code = (
        "import sys, ragbench.llm, ragbench.llm.fake, ragbench.llm.cache;"
        "print(sorted(m for m in ('torch','transformers','httpx','tenacity') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
