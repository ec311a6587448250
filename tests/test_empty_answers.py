"""A run whose answers are mostly empty says so (issue 45: 62 of 72 long-context answers were
empty behind a server's wrong chat template, and the summary showed only a low score):
``analysis.summary.empty_answer_notes``, in the summary's notes and under ``ragbench run``'s
table, once."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from openai_server import send_json, serving, user_text
from typer.testing import CliRunner

from ragbench.analysis.summary import empty_answer_notes
from ragbench.cli import app

serve = pytest.fixture(serving, name="serve")
NOTE = "{} of {} answers empty for {}: check the server's chat template and stop strings"


def rows(label: str, strategy: str, answers: list, error: str | None = None) -> list[dict]:
    return [
        {"label": label, "strategy": strategy, "prediction": a, "error": error} for a in answers
    ]


def test_a_variant_with_more_than_a_tenth_empty_answers_is_named():
    table = pd.DataFrame(
        rows("long_context", "long_context", ["", " ", "\n", None] * 15 + ["", ""] + ["42"] * 10)
        + rows("rag k=4", "rag", [""] * 7 + ["42"] * 65)  # 7 of 72: under a tenth
        + rows("rag k=8", "rag", [""] * 8 + ["42"] * 64)  # 8 of 72: over
        + rows("long_context", "long_context", [""] * 20, error="HTTP 500")  # failed: no answer
        + rows("retrieve_only", "retrieve_only", [""] * 30)  # generates nothing
    )
    assert empty_answer_notes(table) == [
        NOTE.format(62, 72, "long_context"),
        NOTE.format(8, 72, "rag k=8"),
    ]
    assert empty_answer_notes(table[table["label"] == "rag k=4"]) == []
    assert empty_answer_notes(table.drop(columns="prediction")) == []


def test_ragbench_run_says_it_under_its_summary_once(serve, tmp_path):
    def answers(h, body, n):  # the long prompts hit the template's trouble: nothing comes back
        text = "" if len(user_text(body)) > 500 else "I do not know."
        msg = {"message": {"role": "assistant", "content": text}, "finish_reason": "stop"}
        send_json(h, 200, {"model": body["model"], "choices": [msg]})

    srv = serve(answers)
    params = {"context_lengths": [300], "depth_percents": [10, 50, 90], "tokenizer": "whitespace"}
    model = {"base_url": srv.url, "stream": False, "tokenizer": "whitespace"}
    cfg = {
        "name": "empty",
        "dataset": {"name": "niah", "params": params},
        "model": {"backend": "openai", "name": "m", "cache": False, "params": model},
        "strategies": ["closed_book", "long_context"],
        "metrics": ["contains", "string_match_all"],  # two tables: the note is said once
        "output_dir": str(tmp_path / "runs"),
    }
    path = Path(tmp_path / "run.yaml")
    path.write_text(json.dumps(cfg))
    result = CliRunner().invoke(app, ["run", str(path), "--quiet"])
    assert result.exit_code == 0, result.output
    assert result.stdout.count(f"note: {NOTE.format(3, 3, 'long_context')}") == 1, result.stdout
    assert "for closed_book" not in result.stdout  # it answered
