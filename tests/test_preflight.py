"""The preflight: long-context prompts over the window stop a run before its model loads, counted
the way the dry run counts them (the tokenizer alone), in seconds."""

from __future__ import annotations

import time

import pytest
import yaml
from test_runner import niah_config

import ragbench.experiment.preflight as preflight
import ragbench.experiment.runner as runner
from ragbench.experiment.config.run import load_config
from ragbench.experiment.preflight import OverWindowError, check_window, over_window
from ragbench.experiment.resources import load_examples
from ragbench.llm.fake import FakeLLM
from ragbench.types import Document, Example


def no_load(monkeypatch) -> None:
    monkeypatch.setattr(runner, "load_model", lambda m: pytest.fail("the model was loaded"))


def cli(path, *args):
    import typer
    from typer.testing import CliRunner

    from ragbench.cli.run import register

    app = typer.Typer()
    register(app)
    app.command()(lambda: None)  # a second command keeps typer in multi-command mode
    return CliRunner().invoke(app, ["run", str(path), "--quiet", *args])


def test_cli_exits_2_in_seconds_naming_the_sizes_and_the_policies(tmp_path, monkeypatch):
    no_load(monkeypatch)
    cfg = niah_config(tmp_path, strategies=["closed_book", "long_context"])
    cfg["model"]["params"] = {"context_window": 1000}
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(cfg))
    start = time.perf_counter()
    result = cli(path)
    elapsed = time.perf_counter() - start
    assert result.exit_code == 2, result.output
    assert elapsed < 5, elapsed
    out = result.output
    assert out.startswith("error: 2 of 4 examples are over the window for long_context")
    assert "longest prompt is 1,476 tokens" in out and "1,000-token context window of fake" in out
    assert "(error | truncate_head | truncate_middle | truncate_tail)" in out
    assert "Traceback" not in out and not (tmp_path / "results").exists()
    # the suggested override runs
    monkeypatch.undo()
    result = cli(path, "--set", "strategies[1].params.overflow=truncate_middle")
    assert result.exit_code == 0, result.output


def test_only_whole_context_points_under_error_are_checked(tmp_path, monkeypatch):
    # closed book, RAG, Self-Route (its long-context call only follows a declined answer) and a
    # cutting long_context: nothing to check, and no counter is built for it
    monkeypatch.setattr(preflight, "prompt_counter", lambda cfg: pytest.fail("built a counter"))
    strategies = [
        "closed_book",
        "rag",
        "self_route",
        {"name": "long_context", "params": {"overflow": "truncate_middle"}},
    ]
    cfg = load_config(niah_config(tmp_path, strategies=strategies))
    cfg.model.params["context_window"] = 1000
    assert over_window(cfg, load_examples(cfg)) == []
    # a grid over the policy: only its error point is checked
    lc = {"name": "long_context", "params": {"overflow": ["error", "truncate_tail"]}}
    cfg = niah_config(tmp_path, strategies=[lc])
    cfg["model"]["params"] = {"context_window": 1000}
    monkeypatch.undo()
    cfg = load_config(cfg)
    over = over_window(cfg, load_examples(cfg))
    assert {o.label for o in over} == {"long_context"} and len(over) == 2
    with pytest.raises(OverWindowError) as info:
        check_window(cfg, load_examples(cfg))
    assert "--set" not in str(info.value)  # no one-line fix to suggest for a grid axis


def test_the_matched_prompt_budget_is_the_limit_it_names(tmp_path):
    cfg = load_config(niah_config(tmp_path, strategies=["long_context"], prompt_budget=600))
    with pytest.raises(OverWindowError, match="the run's prompt_budget allows 600") as info:
        check_window(cfg, load_examples(cfg))
    assert info.value.window == 600 + cfg.model.max_new_tokens and info.value.count == 2


class CountingLLM(FakeLLM):
    def __init__(self, **kw):
        super().__init__(**kw)
        self.long_counts = 0

    def count_tokens(self, text: str) -> int:
        self.long_counts += len(text) > 10_000
        return super().count_tokens(text)


def test_a_shared_corpus_is_counted_once_for_all_its_questions(tmp_path):
    docs = tuple(Document(f"d{i}", " ".join(f"w{i}x{j}" for j in range(2000))) for i in range(5))
    meta = {"corpus_fingerprint": "c"}
    examples = [Example(f"q{i}", f"Question {i}?", ("a",), docs, meta) for i in range(26)]
    cfg = load_config(niah_config(tmp_path, strategies=["long_context"]))
    llm = CountingLLM(context_window=8192)
    over = over_window(cfg, examples, llm=llm)
    assert len(over) == 26 and llm.long_counts == 1
    assert {o.prompt_tokens for o in over} == {over[0].prompt_tokens} and over[0].window == 8192


@pytest.mark.slow
def test_the_embedded_tokenizer_counts_without_the_weights(tmp_path, monkeypatch):
    """The hf backend: its tokenizer loads from the package offline; no weights are read."""
    import ragbench.llm.hf.model as hf

    no_load(monkeypatch)
    monkeypatch.setattr(hf.HFModel, "__init__", lambda *a, **k: pytest.fail("built the model"))
    cfg = niah_config(tmp_path, strategies=["long_context"])
    cfg["model"] = {
        "backend": "hf",
        "name": "smollm2-135m-instruct",
        "cache": False,
        "params": {"context_window": 1024},
    }
    start = time.perf_counter()
    with pytest.raises(OverWindowError, match="of 4 examples are over the window") as info:
        runner.run(cfg, progress=False)
    assert time.perf_counter() - start < 30
    assert info.value.window == 1024 and info.value.longest > 1024
