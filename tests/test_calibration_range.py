"""How far a run's calibration probes (``resources.longest_prompt``): as far as its strategies'
requests reach, not always to the longest haystack. Long context reads every document; RAG
reads its retrieval budget (top_k x chunk_size, twice over for the chunking tokenizer, or its
token budget); closed book reads the question; a strategy that declares no bound reads the
whole example. The fake model counts words, so every bound here is exact arithmetic."""

from __future__ import annotations

from dataclasses import replace

import pytest

from ragbench.experiment.config.run import load_config
from ragbench.experiment.resources import TEMPLATE_TOKENS, build_resources, longest_prompt
from ragbench.llm.fake import FakeLLM
from ragbench.strategies import STRATEGIES, PipelineParams, RagParams, get_strategy
from ragbench.strategies.rag import CHUNK_MARKUP_TOKENS, CHUNK_TOKEN_FACTOR
from ragbench.types import Document, Example

QUESTION = "What is the special magic number?"  # 6 words
NEW = 32  # max_new_tokens


def haystack(i: int, words: int) -> Example:
    return Example(f"e{i}", QUESTION, ("7",), (Document(f"d{i}", "word " * words),))


EXAMPLES = [haystack(0, 1000), haystack(1, 7000)]
WHOLE = 7000 + 6 + TEMPLATE_TOKENS + NEW  # the longest haystack, its question, template, answer
ASKED = 6 + TEMPLATE_TOKENS + NEW  # a prompt around no context


def chunks(top_k: int, chunk_size: int) -> int:
    return top_k * (CHUNK_TOKEN_FACTOR * chunk_size + CHUNK_MARKUP_TOKENS)


def config(*strategies, **retrieval):
    return load_config(
        {
            "name": "range",
            "dataset": {"name": "niah", "params": {"context_lengths": [1000]}},
            "model": {"backend": "fake", "name": "fake", "max_new_tokens": NEW},
            "retrieval": {"embedder": "hash", "chunk_size": 128, "chunk_overlap": 16, **retrieval},
            "strategies": list(strategies),
        }
    )


def reach(*strategies, **retrieval) -> int | None:
    return longest_prompt(FakeLLM(), EXAMPLES, config(*strategies, **retrieval).points, NEW)


RAG4 = {"name": "rag", "params": {"top_k": 4}}


def test_rag_is_calibrated_to_its_chunks_long_context_to_the_haystack():
    assert reach("long_context") == WHOLE  # as before: the example with the most text
    assert reach(RAG4) == chunks(4, 128) + ASKED  # 1,158 tokens, not 7,102
    assert reach(RAG4) < WHOLE / 5
    assert reach("closed_book") == ASKED
    assert reach("closed_book", RAG4) == reach(RAG4)
    # a run with long context beside them reads the haystack: the long-context bound
    assert reach("closed_book", RAG4, "long_context") == WHOLE
    # retrieve_only calls no model: it neither widens nor narrows the range
    assert reach(RAG4, "retrieve_only") == reach(RAG4)


def test_a_grid_is_calibrated_to_its_widest_point():
    # top_k crossed with the retrieval section's chunk sizes: the largest product
    widest = chunks(8, 256) + ASKED
    assert reach({"name": "rag", "params": {"top_k": [2, 8]}}, chunk_size=[64, 256]) == widest
    # a strategy's own chunk_size overrides the section's (and is a grid of its own)
    own = {"name": "rag", "params": {"top_k": 4, "chunk_size": [64, 400]}}
    assert reach(own) == chunks(4, 400) + ASKED
    # two rag entries: the wider one
    assert reach(RAG4, {"name": "rag", "params": {"top_k": 16}}) == chunks(16, 128) + ASKED
    # a token budget caps the chunks exactly (assembly counts the model's tokens) ...
    capped = {"name": "rag", "params": {"top_k": 8, "budget": 300}}
    assert reach(capped) == 300 + ASKED
    # ... and bounds alone a point with no top_k; the grid takes its largest budget
    assert reach({"name": "rag", "params": {"top_k": None, "budget": [300, 900]}}) == 900 + ASKED
    # no bound passes the whole example: RAG cannot read more than it
    assert reach({"name": "rag", "params": {"top_k": 64}}, chunk_size=512) == WHOLE


class MyRagParams(RagParams):
    strategy = "my_rag"  # a user's strategy, registered by the test below


def test_strategies_that_declare_no_bound_read_the_whole_example():
    # Self-Route falls back to long context
    assert reach({"name": "self_route", "params": {"top_k": 4}}) == WHOLE
    # a pipeline builds its own prompts
    points = (RagParams(top_k=4), PipelineParams(url="http://pipeline.invalid/answer"))
    assert longest_prompt(FakeLLM(), EXAMPLES, points, NEW) == WHOLE
    # a user's strategy declares none unless it says so, even with RAG's parameters
    STRATEGIES.register("my_rag", replace(get_strategy("rag"), name="my_rag", context_bound=None))
    try:
        points = (RagParams(top_k=4), MyRagParams(top_k=4))
        assert longest_prompt(FakeLLM(), EXAMPLES, points, NEW) == WHOLE
    finally:
        STRATEGIES.unregister("my_rag")
    assert longest_prompt(FakeLLM(), [], (RagParams(),), NEW) is None  # no examples
    assert longest_prompt(FakeLLM(), EXAMPLES, (), NEW) == WHOLE  # no point: the whole example


def test_the_longest_question_counts():
    long_question = replace(EXAMPLES[0], question=" ".join(["why"] * 50))
    examples = [long_question, EXAMPLES[1]]
    rag = config(RAG4).points
    assert longest_prompt(FakeLLM(), examples, rag, NEW) == chunks(4, 128) + 50 + ASKED - 6


def test_chain_of_thought_adds_its_reasoning_budget():
    from ragbench.datasets.longbench_v2 import COT_TOKENS, PROMPT_FORMAT

    lb2 = [replace(e, meta={"prompt_format": PROMPT_FORMAT}) for e in EXAMPLES]
    plain = longest_prompt(FakeLLM(), lb2, config(RAG4).points, NEW)
    cot = {"name": "rag", "params": {"top_k": 4, "cot": True}}
    assert longest_prompt(FakeLLM(), lb2, config(RAG4, cot).points, NEW) == plain + COT_TOKENS


class Probed(FakeLLM):
    """A fake model with a calibration: records how far it was asked to probe."""

    asked: list = []

    def cost_rates(self, longest: int | None = None):
        self.asked.append(longest)


@pytest.mark.parametrize(
    ("strategies", "expected"),
    [(["closed_book", RAG4], chunks(4, 128) + ASKED), (["long_context", RAG4], WHOLE)],
)
def test_the_run_asks_its_model_for_that_range(strategies, expected):
    llm = Probed()
    llm.asked = []
    build_resources(config(*strategies), llm, examples=EXAMPLES)
    assert llm.asked == [expected]


def test_the_calibration_says_which_strategies_reach_its_length():
    from ragbench.experiment.resources import prompt_reach

    both = prompt_reach(FakeLLM(), EXAMPLES, config("long_context", RAG4).points, NEW)
    assert both.tokens == WHOLE and both.strategies == ("long_context",) and both.whole
    assert "long_context, a whole example" in both.why() and f"{WHOLE:,} tokens" in both.why()
    rag = prompt_reach(FakeLLM(), EXAMPLES, config("closed_book", RAG4).points, NEW)
    assert rag.strategies == ("rag",) and "rag, their context bound" in rag.why()


def test_a_warmup_loads_at_once_and_calibrates_only_when_told(monkeypatch):
    """``ragbench compare`` loads the model while it reads the documents and makes its estimate;
    the calibration waits for the estimate (it would time the estimate's own embedding)."""
    import threading

    from ragbench.experiment import resources
    from ragbench.experiment.config.sections import ModelConfig

    loaded = threading.Event()
    llm = Probed()
    llm.asked = []

    def load(model):
        loaded.set()
        return llm

    monkeypatch.setattr(resources, "load_model", load)
    cfg = config("closed_book", RAG4)
    warmup = resources.Warmup(cfg.model)
    assert loaded.wait(10)  # loading began without being asked
    assert llm.asked == []  # nothing timed before the command says so
    warmup.calibrate(cfg)
    assert warmup.llm() is llm
    examples = resources.load_examples(cfg)
    assert llm.asked == [longest_prompt(FakeLLM(), examples, cfg.points, NEW)]
    # not told: loaded, not calibrated (the run calibrates as it always did)
    llm.asked = []
    assert resources.Warmup(cfg.model).llm() is llm and llm.asked == []
    # a load that fails is raised where the model is wanted
    monkeypatch.setattr(resources, "load_model", lambda m: (_ for _ in ()).throw(OSError("gone")))
    with pytest.raises(OSError, match="gone"):
        resources.Warmup(cfg.model).llm()
    assert not resources.Warmup.needed(cfg.model)  # the fake backend loads no weights
    assert resources.Warmup.needed(ModelConfig(backend="hf", name="smollm2-135m-instruct"))
