"""``ragbench export``: the per-sample rows carry what each answer read (question, retrieved
chunks and their scores, gold chunks, the long-context cut, the route), lists as JSON text in
CSV; the lm-eval samples' ``arg_0`` is the prompt the answering call was really sent (recorded
from the fake backend during the run, compared with what the export rebuilds), and says why not
where it cannot be rebuilt (a pipeline's own prompts, a folder whose dataset moved)."""

from __future__ import annotations

import csv
import hashlib
import json
import shutil
from pathlib import Path

import pytest
from test_runner import niah_config

import ragbench
from ragbench.experiment.resources import load_examples
from ragbench.llm.fake import FakeLLM
from ragbench.workspace.export import export_run

QUESTION = "What is the special magic number mentioned in the text?"
PIPE = "def answer(question):\n    return '7463343'\n"


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """One run (every kind of record), the prompts the fake backend was sent, its exports."""
    tmp_path = tmp_path_factory.mktemp("export")
    (tmp_path / "exportpipe.py").write_text(PIPE)
    cfg = niah_config(
        tmp_path,
        strategies=[
            "closed_book",
            {"name": "long_context", "params": {"overflow": "truncate_middle"}},
            {"name": "rag", "params": {"top_k": [1, 3]}},
            {
                "name": "self_route",  # budget 8: no chunk fits, every question is routed
                "params": {"top_k": 1, "budget": [8, 200], "overflow": "truncate_middle"},
            },
            {"name": "pipeline", "params": {"target": "exportpipe:answer"}},
        ],
    )
    cfg["model"]["params"] = {"context_window": 1000}  # the 1500-token haystacks are cut
    # every prompt reaches the backend (a completion another test cached would not be "sent")
    cfg["model"]["cache"] = False
    sent: list[str] = []
    generate = FakeLLM._generate

    def spy(self, requests):
        sent.extend(r.prompt for r in requests)
        return generate(self, requests)

    with pytest.MonkeyPatch.context() as mp:
        mp.syspath_prepend(str(tmp_path))
        mp.setattr(FakeLLM, "_generate", spy)
        df = ragbench.run(cfg, progress=False)
        run_dir = Path(df.attrs["run_dir"])
        [jsonl] = export_run(run_dir, "jsonl")
        [csv_path] = export_run(run_dir, "csv")
        files = export_run(run_dir, "lm-eval", tmp_path / "lm")
    longest = max(len(e.context) for e in load_examples(cfg))
    return {
        "df": df,
        "run_dir": run_dir,
        "sent": sent,
        "jsonl": jsonl,
        "csv": csv_path,
        "lm": files,
        "haystack": longest,
    }


def _samples(files: list[Path]) -> dict[str, list[dict]]:
    """task -> its sample lines."""
    out = {}
    for path in files[1:]:
        task = path.name.removeprefix("samples_t-niah_").rsplit("_", 1)[0]
        out[task] = [json.loads(line) for line in path.read_text().splitlines()]
    return out


def test_rows_carry_what_each_answer_read(exported):
    rows = [json.loads(line) for line in exported["jsonl"].read_text().splitlines()]
    df = exported["df"]
    assert len(rows) == len(df) == 4 * 7
    assert {r["question"] for r in rows} == {QUESTION}
    by = {(r["example_id"], r["variant"]): r for r in rows}
    rag = by[("niah-L1500-D10", "rag k=1 embedder=hash chunk=64 overlap=8")]
    assert len(rag["retrieved"]) == 1 and rag["retrieved"][0].startswith("niah-L1500-D10/")
    assert len(rag["retrieved_scores"]) == 1 and isinstance(rag["retrieved_scores"][0], float)
    assert rag["gold_chunks"] and rag["gold_hit"] in (True, False)
    assert rag["gold_hit"] == (rag["retrieved"][0] in rag["gold_chunks"])
    assert rag["kept_tokens"] is None and rag["route"] is None
    cut = by[("niah-L1500-D10", "long_context truncate_middle")]
    # the 1500-token haystack in a 1000-token window: tokens dropped, counted as integers
    assert cut["truncated_tokens"] > 400 and isinstance(cut["kept_tokens"], int)
    assert cut["kept_tokens"] + cut["truncated_tokens"] > 1400
    assert cut["retrieved"] is None and cut["dropped_documents"] == []
    assert cut["cut_documents"] == ["niah-L1500-D10/haystack"]
    short = by[("niah-L400-D10", "long_context truncate_middle")]
    assert short["truncated_tokens"] == 0 and short["evidence_truncated"] is False
    routes = {r["route"] for r in rows if r["strategy"] == "self_route"}
    assert routes == {"rag", "long_context"}
    routed = [r for r in rows if r["route"] == "long_context"]
    assert all(r["kept_tokens"] and r["truncated_tokens"] is not None for r in routed)
    closed = by[("niah-L400-D10", "closed_book")]
    assert all(closed[c] is None for c in ("retrieved", "kept_tokens", "gold_hit", "route"))


def test_csv_cells_hold_lists_as_json(exported):
    rows = list(csv.DictReader(exported["csv"].open()))
    header = list(rows[0])
    assert header[:8] == [
        "example_id",
        "variant",
        "strategy",
        "params",
        "question",
        "prediction",
        "answers",
        "error",
    ]
    for column in (
        "retrieved",
        "retrieved_scores",
        "gold_chunks",
        "gold_hit",
        "kept_tokens",
        "truncated_tokens",
        "evidence_truncated",
        "dropped_documents",
        "route",
    ):
        assert column in header, column
    rag = next(r for r in rows if r["variant"].startswith("rag k=3"))
    assert len(json.loads(rag["retrieved"])) == 3
    assert json.loads(rag["retrieved_scores"]) == sorted(json.loads(rag["retrieved_scores"]))[::-1]
    assert json.loads(rag["answers"]) == ["7463343"]


def test_lm_eval_arg_0_is_the_prompt_sent(exported):
    samples = _samples(exported["lm"])
    sent = set(exported["sent"])
    checked = 0
    for task, lines in samples.items():
        if task.startswith("pipeline"):
            continue  # its own prompts: test_lm_eval_says_why_a_prompt_is_not_there
        for sample in lines:
            prompt = sample["arguments"]["gen_args_0"]["arg_0"]
            assert sample["ragbench"]["arg_0"] == "prompt", sample["ragbench"]
            assert prompt in sent, (task, prompt[:200])
            assert prompt.endswith(f"Question: {QUESTION}\nAnswer:")
            assert sample["prompt_hash"] == hashlib.sha256(prompt.encode()).hexdigest()
            checked += 1
    assert checked == 4 * 6
    # the rebuilt cut matches the run's: a 1000-token window holds less than the haystack
    long = [s["arguments"]["gen_args_0"]["arg_0"] for s in samples["long_context_truncate_middle"]]
    assert len(set(long)) == 4 and max(map(len, long)) < exported["haystack"]
    # Self-Route routed to long context: the long-context prompt answered, its RAG call before
    routes = [s for k, v in samples.items() if k.startswith("self_route") for s in v]
    routed = [s for s in routes if s["ragbench"]["route"] == "long_context"]
    assert 0 < len(routed) < len(routes)
    for s in routed:
        [first] = s["ragbench"]["earlier_prompts"]
        assert first in sent and "unanswerable" in first
        assert s["arguments"]["gen_args_0"]["arg_0"] in long  # the same fitted context
    assert all("earlier_prompts" not in s["ragbench"] for s in routes if s not in routed)


def test_lm_eval_says_why_a_prompt_is_not_there(exported, tmp_path):
    [pipeline] = [v for k, v in _samples(exported["lm"]).items() if k.startswith("pipeline")]
    for sample in pipeline:
        assert sample["arguments"]["gen_args_0"]["arg_0"] == QUESTION
        assert sample["ragbench"]["arg_0"] == "question"
        assert "builds its own prompts" in sample["ragbench"]["prompt_unavailable"]
    # a copied folder whose dataset cannot be built here: every sample says so
    moved = shutil.copytree(exported["run_dir"], tmp_path / "moved")
    manifest = json.loads((moved / "manifest.json").read_text())
    manifest["config"]["dataset"]["params"]["haystack"] = str(tmp_path / "gone")
    (moved / "manifest.json").write_text(json.dumps(manifest))
    files = export_run(moved, "lm-eval", tmp_path / "lm")
    for task, lines in _samples(files).items():
        for sample in lines:
            assert sample["ragbench"]["arg_0"] == "question", task
            assert "dataset cannot be rebuilt here" in sample["ragbench"]["prompt_unavailable"]
    # the rows still carry their questions: questions.parquet travels with the folder
    rows = [json.loads(line) for line in export_run(moved, "jsonl")[0].read_text().splitlines()]
    assert {r["question"] for r in rows} == {QUESTION}


def test_a_run_once_tracked_to_a_file_uri_still_exports_its_prompts(exported, tmp_path):
    """A ``file:`` MLflow URI is refused in configs now; an older run's manifest may hold one,
    and where a run was reported changes no prompt: its export rebuilds them all the same."""
    old = shutil.copytree(exported["run_dir"], tmp_path / "old")
    manifest = json.loads((old / "manifest.json").read_text())
    manifest["config"]["tracking"] = {"mlflow": {"tracking_uri": "file:/somewhere/mlruns"}}
    (old / "manifest.json").write_text(json.dumps(manifest))
    samples = _samples(export_run(old, "lm-eval", tmp_path / "lm"))
    kinds = {k: {s["ragbench"]["arg_0"] for s in v} for k, v in samples.items()}
    assert all(kind == {"prompt"} for k, kind in kinds.items() if not k.startswith("pipeline"))
