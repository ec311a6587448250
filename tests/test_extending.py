"""Extending ragbench through the files docs/layout.md names ("Extending ragbench"), and nothing
else: a toy strategy (its steps module with its parameter class, one ``Strategy(...)`` line), a
toy backend (an ``LLM`` subclass declaring its capabilities, one ``BACKENDS`` line), a toy
KV-cache variant (one class, one ``KV_CACHES`` line), a toy judge metric (one
``JudgeMetric`` class, one ``register_judge_metric`` line), a toy importer (one function, one
``IMPORTERS`` line) and a toy plot (one function, re-exported as ``report.<name>``), each run end
to end. The toy modules are
written to a temporary folder; registering them is the one line each entry there names."""

from __future__ import annotations

import sys
import textwrap
from dataclasses import dataclass
from typing import ClassVar  # module level: dataclass resolves the toy's annotations here

import pytest

from ragbench import analysis, report
from ragbench.experiment.runner import run
from ragbench.judge.metric import register_judge_metric, unregister_judge_metric
from ragbench.llm import BACKENDS, backend_capabilities
from ragbench.llm.fake import FakeLLM
from ragbench.llm.kv import variants as kv_cache
from ragbench.strategies import FULL_CONTEXT, STRATEGIES, Strategy, get_strategy
from ragbench.strategies.base import Resources
from ragbench.strategies.params import LongContextParams
from ragbench.types import Document, Example

TOY_STRATEGY = '''
"""First document only: the first `words` words of the first document, then the question."""

from dataclasses import dataclass
from typing import ClassVar

from ragbench.strategies.base import make_record
from ragbench.strategies.params import StrategyParams
from ragbench.strategies.prompts import CONTEXT_TEMPLATE, question_part


@dataclass(frozen=True)
class FirstDocParams(StrategyParams):
    strategy: ClassVar[str] = "first_doc"
    words: int = 200  # words of the first document placed before the question

    def validate(self):
        if self.words < 1:
            raise ValueError(f"first_doc: words must be >= 1, got {self.words}")


def first_doc_steps(example, res, params):
    context = " ".join(example.documents[0].text.split()[: params.words])
    prompt = CONTEXT_TEMPLATE.format(context=context) + question_part(example)
    completion = yield res.request(prompt, rid=f"{example.id}:first_doc")
    return make_record(example, params, completion, res, {})
'''

TOY_BACKEND = '''
"""An echo backend: answers with the last number in its prompt."""

import re

from ragbench.llm.base import LLM
from ragbench.types import Completion


class EchoLLM(LLM):
    """Answers with the last number its prompt holds; counts whitespace tokens."""

    capabilities = LLM.capabilities.replace(needs_preset=True, default_tokenizer="whitespace")

    def __init__(self, model="echo", context_window=4096):
        self.name, self.context_window = model, context_window

    def count_tokens(self, text):
        return len(text.split())

    def _generate(self, requests):
        out = []
        for r in requests:
            numbers = re.findall(r"\\b[0-9]{7}\\b", r.prompt)
            text = numbers[-1] if numbers else "unknown"
            out.append(Completion(text, self.prompt_tokens(r), 1, model=self.name))
        return out
'''

TOY_JUDGE_METRIC = '''
"""A judge metric: is the answer short (a judge LLM's verdict, one call per judge sample)?"""

from pathlib import Path

from ragbench.judge.metric import ANSWER, JudgeMetric


class JudgeShort(JudgeMetric):
    name = "judge_short"
    needs = (ANSWER,)  # a strategy that writes no answer is unscored, with a note
    prompt = str(Path(__file__).with_name("short-v1.yaml"))
    description = "judge LLM: the answer is short"

    def asks(self, sample, judge):
        return [{"question": sample.question, "prediction": sample.answer}]

    def score_samples(self, verdicts):
        return verdicts[0]
'''

TOY_JUDGE_PROMPT = """
name: short-v1
metric: judge_short
labels: {SHORT: 1, LONG: 0}
system: You judge the length of answers.
user: |-
  Question: {question}
  Candidate answer: {prediction}
  Is the answer at most three words? Reply "Verdict: SHORT" or "Verdict: LONG".
retry: |-
  (Attempt {attempt}: reply with one line.)
"""


def _write(tmp_path, name: str, source: str) -> None:
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(source))


@pytest.fixture
def toy_modules(tmp_path, monkeypatch):
    _write(tmp_path, "toy_first_doc", TOY_STRATEGY)
    _write(tmp_path, "toy_echo", TOY_BACKEND)
    _write(tmp_path, "toy_short", TOY_JUDGE_METRIC)
    (tmp_path / "short-v1.yaml").write_text(textwrap.dedent(TOY_JUDGE_PROMPT))
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    for name in ("toy_first_doc", "toy_echo", "toy_short"):
        sys.modules.pop(name, None)


def _config(tmp_path, backend: str, strategies: list) -> dict:
    return {
        "name": "toy",
        "dataset": {
            "name": "niah",
            "params": {
                "context_lengths": [300, 900],
                "depth_percents": [10, 90],
                "needle": "\nThe special magic number is 7463343.\n",
                "question": "What is the special magic number mentioned in the text?",
                "answer": "7463343",
                "tokenizer": "whitespace",
                "final_context_length_buffer": 50,
            },
        },
        "model": {
            "backend": backend,
            "name": backend,
            "preset": "smollm2-135m-instruct",
            "cache": False,
        },
        "retrieval": {"embedder": "hash", "tokenizer": "whitespace"},
        "strategies": strategies,
        "metrics": ["string_match_all"],
        "output_dir": str(tmp_path / "results"),
    }


def test_a_toy_strategy_runs_is_labelled_and_its_misses_are_attributed(toy_modules):
    import toy_first_doc

    # the one line in strategies/registry.py
    STRATEGIES.register(
        "first_doc",
        Strategy(
            "first_doc",
            toy_first_doc.first_doc_steps,
            toy_first_doc.FirstDocParams,
            context=FULL_CONTEXT,
        ),
    )
    try:
        strategies = ["closed_book", {"name": "first_doc", "params": {"words": [20, 400]}}]
        df = run(_config(toy_modules, "fake", strategies), progress=False)
        toy = df[df["strategy"] == "first_doc"]
        assert sorted(toy["label"].unique()) == ["first_doc words=20", "first_doc words=400"]
        assert toy["error"].isna().all() and (toy["prompt_tokens"] > 0).all()
        # its misses are explained by what it declared it reads, never "unattributed"
        causes = analysis.attribute(df)
        toy = causes[causes["strategy"] == "first_doc"]
        assert set(toy["source"]) == {FULL_CONTEXT}
        assert len(toy) and "unattributed" not in set(toy["outcome"])
        assert "first_doc words=20" in set(report.summary(df)["label"])
        with pytest.raises(ValueError, match="words must be >= 1"):
            get_strategy("first_doc").grid({"words": 0})
    finally:
        STRATEGIES.unregister("first_doc")
    assert "first_doc" not in STRATEGIES


def test_a_toy_backend_runs_from_a_config_and_is_read_by_its_capabilities(toy_modules):
    BACKENDS.register("echo", "toy_echo:EchoLLM")  # the one line in llm/__init__.py
    try:
        assert backend_capabilities("echo").default_tokenizer == "whitespace"
        df = run(_config(toy_modules, "echo", ["long_context"]), progress=False)
        assert df["error"].isna().all()
        # the echo answers with the needle's number: the long context holds it
        assert df["string_match_all"].mean() == 1.0
        assert (df["prompt_tokens"] > 250).all()  # the whole ~300- and ~900-token haystacks
    finally:
        BACKENDS.unregister("echo")


def test_a_toy_kv_variant_validates_labels_and_travels_with_the_request():
    # adding a variant: this one class (its parameters declared on it, and nowhere else) ...
    @dataclass(frozen=True)
    class KeepRecent(kv_cache.KVVariant):
        """Keep only the most recent positions (a toy: the fake backend simulates it)."""

        keep: int = 64  # most recent positions kept

        name: ClassVar[str] = "keep_recent"

        def __post_init__(self) -> None:
            if isinstance(self.keep, bool) or not isinstance(self.keep, int) or self.keep < 1:
                raise ValueError(f"kv keep_recent needs keep >= 1, got {self.keep!r}")

        def label(self) -> str:
            return f"keep-recent-{self.keep}"

    kv_cache.KV_CACHES.register("keep_recent", KeepRecent)  # ... + the one line in kv/variants.py
    try:
        # a config names it nested, as YAML `kv: {name: keep_recent, keep: 32}`; the class
        # validates it; records and work keys store its spec
        spec = {"name": "long_context", "params": {"kv": {"name": "keep_recent", "keep": 32}}}
        [params] = get_strategy("long_context").grid(spec["params"])
        assert params.kv == KeepRecent(keep=32)
        assert params.label() == "long_context kv=keep-recent-32"
        assert params.to_dict()["kv"] == {"name": "keep_recent", "keep": 32}
        assert LongContextParams(kv="keep_recent").kv == KeepRecent()  # its defaults
        with pytest.raises(ValueError, match="kv keep_recent needs keep >= 1"):
            LongContextParams(kv={"name": "keep_recent", "keep": 0})
        with pytest.raises(ValueError, match="kv keep_recent has no parameter 'kep'; did you"):
            LongContextParams(kv={"name": "keep_recent", "kep": 8})
        seen = []

        def answer(request):
            seen.append(request)
            return "4817263"

        doc = Document("d", "One of the special magic numbers for quiet-lake is: 4817263.")
        example = Example(
            "e", "What is the special magic number for quiet-lake?", ("4817263",), (doc,)
        )
        llm = FakeLLM(answer_fn=answer, simulate_kv_cache=True)
        record = get_strategy("long_context").run(example, Resources(llm=llm), params)
        assert seen[0].kv == KeepRecent(keep=32)
        assert seen[0].to_dict()["kv"] == {"name": "keep_recent", "keep": 32}
        assert record.scores["string_match_all"] == 1.0
        with pytest.raises(ValueError, match="keep_recent"):
            LongContextParams(kv="keep_recnt")  # did-you-mean names the new variant
    finally:
        kv_cache.KV_CACHES.unregister("keep_recent")


def test_a_toy_judge_metric_is_run_by_the_judge_pass(toy_modules):
    import toy_short

    register_judge_metric(toy_short.JudgeShort)  # the one line
    seen = []

    def judge_fn(request):
        seen.append(request.prompt)
        answer = request.prompt.split("Candidate answer: ", 1)[1].split("\n", 1)[0]
        return "Verdict: SHORT" if len(answer.split()) <= 3 else "Verdict: LONG"

    try:
        cfg = _config(toy_modules, "fake", ["closed_book", "long_context"])
        cfg["metrics"] = ["string_match_all", "judge_short"]
        cfg["judge"] = {"model": {"backend": "fake", "name": "judge-fake", "cache": False}}
        df = run(cfg, progress=False, judge_llm=FakeLLM("judge-fake", answer_fn=judge_fn))
        assert df["error"].isna().all()
        assert df["judge_short"].tolist() == [1.0] * len(df)  # the fake answers in one word
        assert (df["judge_short_prompt"] == "short-v1").all() and (df["judge_calls"] == 1).all()
        assert len(seen) == len(df) and all("Is the answer at most three words?" in p for p in seen)
        with pytest.raises(ValueError, match="did you mean 'judge_short'"):
            run({**cfg, "metrics": ["judge_shrt"]}, progress=False)
    finally:
        unregister_judge_metric("judge_short")


TOY_IMPORTER = '''
"""A toy file format: one question per line, ``question | answer | document text``."""

from ragbench.io import InputFileError
from ragbench.types import Document, Example


def load_pipes(path, **options):
    out = []
    with open(path, encoding="utf-8") as f:
        for line_no, line in enumerate(f, 1):
            parts = [p.strip() for p in line.split("|")]
            if len(parts) != 3:
                raise InputFileError(path, line_no, "line", "expected 'question | answer | text'")
            question, answer, text = parts
            doc = Document(f"doc{line_no}", text)
            out.append(Example(f"q{line_no}", question, (answer,), (doc,)))
    return out
'''

TOY_PLOT = '''
"""A plot of a summary table: each variant's share of the prompt tokens the run sent."""

from ragbench.report import readable


def plot_cost_share(table, ax=None):
    ax = readable.axes(ax)
    share = table["prompt_tokens"] / table["prompt_tokens"].sum()
    ax.barh(list(table["label"]), share)
    readable.percent_axis(ax.xaxis)
    ax.set_xlabel("share of the prompt tokens sent")
    ax.set_title("Where the prompt tokens go")
    return ax
'''


def test_a_toy_importer_feeds_a_run_and_reports_bad_lines(toy_modules):
    from ragbench.datasets.formats import IMPORTERS
    from ragbench.io import InputFileError

    _write(toy_modules, "toy_pipes", TOY_IMPORTER)
    data = toy_modules / "qa.txt"
    data.write_text(
        "What is the magic number? | 7463343 | The special magic number is 7463343.\n"
        "Who wrote it? | Ada | It was written by Ada in the spring.\n"
    )
    IMPORTERS.register("pipes", "toy_pipes:load_pipes")  # the one line in datasets/formats.py
    try:
        cfg = _config(toy_modules, "fake", ["closed_book", "long_context"])
        cfg["dataset"] = {"name": "file", "params": {"path": str(data), "format": "pipes"}}
        df = run(cfg, progress=False)
        assert df["error"].isna().all() and sorted(df["example_id"].unique()) == ["q1", "q2"]
        # long context reads the imported document; closed book does not
        lc = df[df["strategy"] == "long_context"].set_index("example_id")
        cb = df[df["strategy"] == "closed_book"].set_index("example_id")
        assert (lc["prompt_tokens"] > cb["prompt_tokens"]).all()
        (toy_modules / "bad.txt").write_text("only a question\n")
        cfg["dataset"]["params"]["path"] = str(toy_modules / "bad.txt")
        with pytest.raises(InputFileError, match=r"bad\.txt:1"):
            run(cfg, progress=False)
        with pytest.raises(ValueError, match="did you mean 'pipes'"):
            run(
                {
                    **cfg,
                    "dataset": {"name": "file", "params": {"path": str(data), "format": "pipe"}},
                },
                progress=False,
            )
    finally:
        IMPORTERS.unregister("pipes")
        sys.modules.pop("toy_pipes", None)


def test_a_toy_plot_reads_a_summary_table_and_passes_the_figure_checks(toy_modules, monkeypatch):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from ragbench.report.readable import figure_problems

    _write(toy_modules, "toy_plot", TOY_PLOT)
    import toy_plot

    monkeypatch.setattr(report, "plot_cost_share", toy_plot.plot_cost_share, raising=False)
    try:  # the one line in report/__init__.py: re-exported, notebooks call report.<name>
        df = run(_config(toy_modules, "fake", ["closed_book", "long_context"]), progress=False)
        ax = report.plot_cost_share(report.summary(df))
        widths = {bar.get_width() for bar in ax.patches}
        assert sum(widths) == pytest.approx(1.0) and max(widths) > 0.5  # long context dominates
        assert figure_problems(ax.figure) == []
        plt.close(ax.figure)
    finally:
        sys.modules.pop("toy_plot", None)
