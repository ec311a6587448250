"""End-to-end runs with the FakeLLM and HashEmbedder: scores, cost fields, resume, bad input."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pandas as pd
import pytest

from ragbench.cost import prices
from ragbench.experiment.config.text import ConfigError
from ragbench.experiment.resources import DatasetError
from ragbench.experiment.results import RECORDS, read_records
from ragbench.experiment.runner import run
from ragbench.llm.fake import FakeLLM
from ragbench.types import Document, Example

STRATEGIES = [
    "closed_book",
    "long_context",
    {"name": "rag", "params": {"top_k": [1, 4]}},
    "self_route",
]


def niah_config(tmp_path, **over):
    cfg = {
        "name": "t-niah",
        "dataset": {
            "name": "niah",
            "params": {
                "context_lengths": [400, 1500],
                "depth_percents": [10, 90],
                "needle": "\nThe special magic number is 7463343.\n",
                "question": "What is the special magic number mentioned in the text?",
                "answer": "7463343",
                "tokenizer": "whitespace",
                "final_context_length_buffer": 50,
            },
        },
        "model": {
            "backend": "fake",
            "name": "fake",
            "preset": "smollm2-135m-instruct",
            "cache": False,
        },
        "retrieval": {
            "embedder": "hash",
            "chunk_size": 64,
            "chunk_overlap": 8,
            "tokenizer": "whitespace",
        },
        "strategies": STRATEGIES,
        "metrics": ["string_match_all", "contains"],
        "price_sheet": "example-hosted-api",
        "output_dir": str(tmp_path / "results"),
    }
    cfg.update(over)
    return cfg


def multidoc_file(tmp_path) -> Path:
    from ragbench.datasets.formats import write_examples

    keys = ["quiet-lake", "red-fox", "old-mill", "blue-sky"]
    examples = []
    for q, key in enumerate(keys):
        docs, evidence = [], []
        for i, k in enumerate(keys):
            filler = " ".join(f"d{i}w{j}" for j in range(150))
            fact = f"One of the special magic numbers for {k} is: {1000 + i}."
            text = f"{filler} {fact} {filler}"
            docs.append(Document(id=f"q{q}/doc{i}", text=text, title=f"Doc {i}"))
            if k == key:
                s = text.index(fact)
                evidence.append([f"q{q}/doc{i}", s, s + len(fact)])
        question = f"What is the special magic number for {key}?"
        meta = {"task": "niah_multikey", "evidence": evidence}
        examples.append(Example(f"md-{q}", question, (str(1000 + q),), tuple(docs), meta))
    return write_examples(tmp_path / "multidoc.jsonl", examples)


def test_end_to_end_niah_all_strategies(tmp_path):
    df = run(niah_config(tmp_path), progress=False)
    assert (
        len(df) == 4 * 5
    )  # 4 examples x (closed_book, long_context, rag k=1, rag k=4, self_route)
    assert df["error"].isna().all()
    by = df.groupby("strategy")["string_match_all"].mean()
    assert by["closed_book"] == 0.0 and by["long_context"] == 1.0 and by["self_route"] == 1.0
    rag = df[df.strategy == "rag"]
    # the fake reader answers iff the needle's chunk was retrieved
    assert (rag["string_match_all"] == rag["gold_hit"].astype(float)).all()
    assert rag[rag.top_k == 4]["gold_hit"].mean() >= rag[rag.top_k == 1]["gold_hit"].mean()
    # cost fields: recompute dollars from the token columns with the shipped sheet
    sheet = prices.price_sheet("example-hosted-api")
    p = sheet.prices
    expected = (
        (df.prompt_tokens - df.cached_prompt_tokens) * p["input_per_million"]
        + df.cached_prompt_tokens * p["cached_input_per_million"]
        + df.completion_tokens * p["output_per_million"]
    ) / 1e6
    assert (df.dollars - expected).abs().max() < 1e-12
    assert (df.flops > 0).all() and (df.kv_cache_bytes > 0).all()
    lc = df[df.strategy == "long_context"].set_index("example_id")
    cb = df[df.strategy == "closed_book"].set_index("example_id")
    assert (lc.dollars > cb.dollars).all() and (lc.flops > 10 * cb.flops).all()
    routed = df[(df.strategy == "self_route") & (df.route == "long_context")]
    assert (routed.llm_calls == 2).all()
    # the run folder: parquet equal to the returned table, manifest with provenance
    out = Path(df.attrs["run_dir"])
    assert out.name.startswith("t-niah-")
    back = pd.read_parquet(out / "results.parquet")
    assert back["prediction"].tolist() == df["prediction"].tolist()
    manifest = json.loads((out / "manifest.json").read_text())
    for key in (
        "config",
        "config_hash",
        "dataset",
        "model",
        "versions",
        "git_commit",
        "hardware",
        "started_at",
        "finished_at",
    ):
        assert key in manifest
    assert manifest["dataset"]["n"] == 4 and len(manifest["dataset"]["fingerprint"]) >= 16
    assert manifest["model"]["backend"] == "fake" and manifest["records"] == 20


def test_end_to_end_multidoc_file_dataset(tmp_path):
    path = multidoc_file(tmp_path)
    cfg = niah_config(
        tmp_path, name="t-md", dataset={"name": "file", "params": {"path": str(path)}}
    )
    cfg["strategies"] = ["long_context", {"name": "rag", "params": {"top_k": 2}}, "self_route"]
    df = run(cfg, progress=False)
    assert len(df) == 12 and df["error"].isna().all()
    assert (df[df.strategy == "long_context"]["string_match_all"] == 1.0).all()
    rag = df[df.strategy == "rag"]
    assert (rag["string_match_all"] == rag["gold_hit"].astype(float)).all()
    assert (df[df.strategy == "self_route"]["string_match_all"] == 1.0).all()


def test_deterministic_rerun(tmp_path):
    a = run(niah_config(tmp_path, output_dir=str(tmp_path / "a")), progress=False)
    b = run(niah_config(tmp_path, output_dir=str(tmp_path / "b")), progress=False)
    cols = ["example_id", "strategy", "params", "prediction", "string_match_all", "contains"]
    pd.testing.assert_frame_equal(a[cols], b[cols])
    # same folder again: everything resumed, nothing regenerated
    llm = FakeLLM()
    c = run(niah_config(tmp_path, output_dir=str(tmp_path / "a")), progress=False, llm=llm)
    assert llm.calls == 0
    pd.testing.assert_frame_equal(a[cols], c[cols])


class CountingLLM(FakeLLM):
    """Counts the requests it generates (0: everything came from the run folder)."""

    requests = 0

    def _generate(self, requests):
        self.requests += len(requests)
        return super()._generate(requests)


def start_slow_run(cfg: dict, path: Path, seconds_per_call: float) -> subprocess.Popen:
    """``run(cfg)`` in a child process whose fake model takes a while per generate call."""
    path.write_text(json.dumps(cfg))
    script = textwrap.dedent(
        f"""
        import json, time
        from ragbench.llm.fake import FakeLLM
        from ragbench.experiment.runner import run

        class Slow(FakeLLM):
            def _generate(self, requests):
                time.sleep({seconds_per_call})
                return super()._generate(requests)

        run(json.load(open({str(path)!r})), progress=False, llm=Slow())
        """
    )
    return subprocess.Popen([sys.executable, "-c", script], env={**os.environ})


def test_kill_and_resume(tmp_path):
    cfg = niah_config(tmp_path)
    proc = start_slow_run(cfg, tmp_path / "cfg.json", seconds_per_call=0.2)
    out = Path(cfg["output_dir"])
    deadline = time.time() + 120
    records = None
    while time.time() < deadline:
        found = list(out.glob(f"*/{RECORDS}"))
        if found and len(found[0].read_bytes().splitlines()) >= 4:
            records = found[0]
            break
        assert proc.poll() is None, "the run finished before it could be killed"
        time.sleep(0.05)
    assert records is not None
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    before = read_records(records)
    assert 4 <= len(before) < 20
    with records.open("ab") as f:  # a torn write, as if killed mid-line
        f.write(b'{"key": "[\\"niah-L')

    llm = CountingLLM()
    df = run(cfg, progress=False, llm=llm)
    lines = records.read_bytes().splitlines()
    keys = [json.loads(line)["key"] for line in lines]
    assert len(keys) == len(set(keys)) == 20 == len(df)  # no lost, no duplicated records
    redone = df[
        ~(df.example_id + df.strategy + df.params).isin(
            [
                r.example_id
                + r.strategy
                + json.dumps(r.params.to_dict(), sort_keys=True, separators=(",", ":"))
                for r in before.values()
            ]
        )
    ]
    assert len(redone) == 20 - len(before)
    routed = ((redone.strategy == "self_route") & (redone.route == "long_context")).sum()
    assert llm.requests == len(redone) + routed  # only the missing records were generated
    assert llm.calls < llm.requests  # in batches (model.batch_size records per round)
    assert df["error"].isna().all()
    by = df.groupby("strategy")["string_match_all"].mean()
    assert by["long_context"] == 1.0


def test_bad_input_messages(tmp_path):
    with pytest.raises(ConfigError, match="unknown strategy 'rga'; did you mean 'rag'"):
        run(niah_config(tmp_path, strategies=["rga"]), progress=False)
    bad = niah_config(tmp_path)
    bad["retrieval"]["chunk_sise"] = 10
    with pytest.raises(
        ConfigError,
        match="retrieval.chunk_sise: unknown key 'chunk_sise'; did you mean 'chunk_size'",
    ):
        run(bad, progress=False)


def test_dataset_without_answers(tmp_path):
    from ragbench.datasets.formats import write_examples

    ex = Example("e1", "q?", (), (Document("d", "some text"),))
    path = write_examples(tmp_path / "noans.jsonl", [ex])
    cfg = niah_config(tmp_path, dataset={"name": "file", "params": {"path": str(path)}})
    with pytest.raises(DatasetError, match=r"its only example has no gold answer"):
        run(cfg, progress=False)


def test_context_over_window_stops_the_run_before_the_model_loads(tmp_path, monkeypatch):
    # was: the model loaded, then one ContextOverflowError row per over-window example; now the
    # run stops before any model loads, naming the count, the longest prompt and the window
    import ragbench.experiment.runner as runner
    from ragbench.experiment.preflight import OverWindowError

    monkeypatch.setattr(runner, "load_model", lambda m: pytest.fail("the model was loaded"))
    cfg = niah_config(tmp_path, strategies=["closed_book", "long_context"])
    cfg["model"]["params"] = {"context_window": 1000}
    with pytest.raises(OverWindowError, match=r"2 of 4 examples are over the window") as info:
        run(cfg, progress=False)
    message = str(info.value)
    assert "longest prompt is 1,476 tokens" in message and "1,000-token context window" in message
    assert "error | truncate_head | truncate_middle | truncate_tail" in message
    assert "--set strategies[1].params.overflow=truncate_middle" in message
    assert (info.value.count, info.value.longest, info.value.window) == (2, 1476, 1000)
    assert all("L1500" in i for i in info.value.example_ids)
    assert not (tmp_path / "results").exists()  # nothing written
    # the model a caller holds counts the prompts itself
    with pytest.raises(OverWindowError):
        run(cfg, progress=False, llm=FakeLLM("fake", context_window=1000))


def test_truncated_context_says_what_it_kept(tmp_path):
    # truncate_tail keeps the start: the needle at 10% depth survives the cut, the one at 90% not
    lc = {"name": "long_context", "params": {"overflow": "truncate_tail"}}
    cfg = niah_config(tmp_path, strategies=["closed_book", lc])
    cfg["model"]["params"] = {"context_window": 1000}
    df = run(cfg, progress=False).set_index("example_id")
    df = df[df.strategy == "long_context"]
    assert df["error"].isna().all()
    cut = df[df["truncated_tokens"] > 0]
    assert sorted(cut.index) == ["niah-L1500-D10", "niah-L1500-D90"]
    assert cut["dropped_documents"].map(list).tolist() == [[], []]  # one document, cut
    assert cut["cut_documents"].map(list).tolist() == [[f"{i}/haystack"] for i in cut.index]
    assert cut["evidence_truncated"].to_dict() == {"niah-L1500-D10": False, "niah-L1500-D90": True}
    whole = df.drop(cut.index)
    assert (whole["evidence_truncated"] == False).all()  # noqa: E712 (a bool column)
    assert whole["cut_documents"].map(len).eq(0).all()
    assert df.loc["niah-L1500-D10", "string_match_all"] == 1.0
    assert df.loc["niah-L1500-D90", "string_match_all"] == 0.0


def test_cli_run(tmp_path):
    import typer
    import yaml
    from typer.testing import CliRunner

    from ragbench.cli.run import register

    app = typer.Typer()
    register(app)

    @app.command()
    def _other() -> None:  # a second command keeps typer in multi-command mode
        pass

    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(niah_config(tmp_path, strategies=["long_context"])))
    result = CliRunner().invoke(app, ["run", str(path), "--quiet"])
    assert result.exit_code == 0, result.output
    assert "run folder:" in result.output and "long_context" in result.output
    path.write_text(path.read_text().replace("metrics:", "metrix:"))
    result = CliRunner().invoke(app, ["run", str(path), "--quiet"])
    assert result.exit_code == 2 and "did you mean 'metrics'" in result.output
    # a bad retrieval section fails before any model loads (was: exit 0, every RAG row an error)
    cfg = niah_config(tmp_path, strategies=["rag"])
    cfg["retrieval"]["retriever"] = "dnese"
    cfg["model"] = {"backend": "hf", "name": "smollm2-135m-instruct"}  # would take seconds to load
    path.write_text(yaml.safe_dump(cfg))
    result = CliRunner().invoke(app, ["run", str(path), "--quiet"])
    assert result.exit_code == 2 and "did you mean 'dense'" in result.output
    assert "c.yaml:" in result.output and "retrieval.retriever" in result.output


@pytest.mark.slow
def test_embedded_defaults_tiny_niah(tmp_path):
    """SmolLM2 + MiniLM (offline): long context finds the needle at 1k tokens, RAG at 7k."""
    from ragbench.experiment.config.run import load_config
    from ragbench.experiment.resources import load_model

    base = load_config(Path(__file__).parent.parent / "configs" / "quick-cpu.yaml").model_dump()
    base["output_dir"] = str(tmp_path)
    base["model"]["cache"] = False  # exercise the model, not the completion cache

    def one(length: int, strategy: dict) -> pd.DataFrame:
        cfg = json.loads(json.dumps(base))
        cfg["name"] = f"slow-{length}"
        cfg["dataset"]["params"].update(context_lengths=[length], depth_percents=[50])
        cfg["strategies"] = [strategy]
        return run(cfg, progress=False, llm=llm)

    llm = load_model(load_config(base).model)
    lc = one(1000, {"name": "long_context"})
    rag = one(7000, {"name": "rag", "params": {"top_k": 4}})
    assert lc["error"].isna().all() and rag["error"].isna().all(), (lc.error, rag.error)
    assert lc["string_match_all"].tolist() == [1.0], lc["prediction"].tolist()
    assert rag["gold_hit"].tolist() == [True]
    assert rag["string_match_all"].tolist() == [1.0], rag["prediction"].tolist()
    assert 800 <= lc["prompt_tokens"].iloc[0] <= 1100 and rag["prompt_tokens"].iloc[0] < 1000
    assert rag["dollars"].iloc[0] > 0 and lc["flops"].iloc[0] > 0
    assert lc["kv_bytes_per_value"].tolist() == [4]  # SmolLM2 runs in float32 on CPU


def test_unreadable_middle_record_is_skipped_not_truncated(tmp_path):
    from ragbench.experiment.results import append_record, read_records
    from ragbench.strategies import RagParams
    from ragbench.types import Record

    path = tmp_path / "records.jsonl"
    with path.open("ab") as f:
        for i in range(4):
            append_record(f, f"k{i}", Record(f"e{i}", "rag", RagParams(), "x"))
    lines = path.read_bytes().splitlines(keepends=True)
    lines[1] = b'{"key": "k1", "record": {"unknown_field": 1}, "schema_version": 2}\n'
    path.write_bytes(b"".join(lines) + b'{"key": "k9", "rec')  # plus a torn tail
    done = read_records(path)
    assert sorted(done) == ["k0", "k2", "k3"]
    assert path.read_bytes() == b"".join(lines)  # only the torn tail was cut


def test_error_rows_are_retried_on_resume(tmp_path):
    class Flaky(FakeLLM):
        armed = True  # the first run times out on one request (its batch, then alone)

        def _generate(self, requests):
            if Flaky.armed and any(r.id.startswith(bad) for r in requests):
                raise TimeoutError("transient")
            return super()._generate(requests)

    cfg = niah_config(tmp_path, strategies=["closed_book"])
    first_id = run(cfg, progress=False, llm=FakeLLM())["example_id"].iloc[1]
    bad = f"{first_id}:"
    cfg["output_dir"] = str(tmp_path / "flaky")
    first = run(cfg, progress=False, llm=Flaky())
    assert first["error"].notna().sum() == 1  # only that request's record, not its batch
    assert first.loc[first["error"].notna(), "example_id"].tolist() == [first_id]
    Flaky.armed = False
    second = run(cfg, progress=False, llm=Flaky())
    assert second["error"].isna().all() and len(second) == len(first)


def test_flatten_never_lets_one_section_overwrite_another():
    # regression: params, scores and cost shared an empty prefix, so a score named "top_k"
    # silently replaced the parameter
    from ragbench.cost.accounting import Cost
    from ragbench.experiment.results import flatten
    from ragbench.strategies import RagParams
    from ragbench.types import Record

    record = Record(
        "e",
        "rag",
        RagParams(top_k=3),
        "x",
        ("x",),
        scores={"top_k": 0.5, "string_match_all": 1.0},
        cost=Cost(prompt_tokens=7),
        meta={"prompt_tokens": "meta"},
    )
    row = flatten(record, {"top_k": "fact", "depth_percent": 50})
    assert row["param_top_k"] == 3 and row["score_top_k"] == 0.5 and row["ex_top_k"] == "fact"
    assert row["cost_prompt_tokens"] == 7 and row["meta_prompt_tokens"] == "meta"
    assert "top_k" not in row and row["string_match_all"] == 1.0 and row["depth_percent"] == 50
    assert row["label"] == "rag k=3"


def test_column_order_survives_a_resume(tmp_path):
    # regression: reloaded records have sorted keys, fresh ones insertion order, and error
    # rows have no scores: the table's columns came out in a different order after a resume
    class FailFirst(FakeLLM):
        armed = True

        def _generate(self, requests):
            if FailFirst.armed:
                raise TimeoutError("transient")
            return super()._generate(requests)

    cfg = niah_config(tmp_path, strategies=["closed_book", {"name": "rag", "params": {"top_k": 2}}])
    fresh = run(dict(cfg, output_dir=str(tmp_path / "fresh")), progress=False)
    cfg["output_dir"] = str(tmp_path / "resumed")
    first = run(cfg, progress=False, llm=FailFirst())  # every row an error row
    assert first["error"].notna().all()
    FailFirst.armed = False
    resumed = run(cfg, progress=False, llm=FailFirst())
    assert list(resumed.columns) == list(fresh.columns)
    assert list(fresh.columns[:4]) == ["example_id", "strategy", "label", "params"]
    # params in field order, then scores in the config's metric order, then the cost
    cols = list(fresh.columns)
    assert cols.index("retriever") < cols.index("top_k") < cols.index("string_match_all")
    assert cols.index("string_match_all") < cols.index("contains") < cols.index("prompt_tokens")
    on_disk = pd.read_parquet(Path(resumed.attrs["run_dir"]) / "results.parquet")
    assert list(on_disk.columns) == list(fresh.columns)


def test_one_writer_per_run_folder(tmp_path):
    # two `ragbench run` on one folder used to both do all the work (every key twice)
    import typer
    from typer.testing import CliRunner

    from ragbench.cli.run import register

    cfg = niah_config(tmp_path)
    # 0.5 s per call keeps it running while the second one starts
    proc = start_slow_run(cfg, tmp_path / "cfg.json", seconds_per_call=0.5)
    try:
        deadline = time.time() + 120
        while not list(Path(cfg["output_dir"]).glob(f"*/{RECORDS}")):
            assert time.time() < deadline and proc.poll() is None, "the first run never started"
            time.sleep(0.05)
        app = typer.Typer()
        register(app)
        app.command()(lambda: None)  # a second command keeps typer in multi-command mode
        second = CliRunner().invoke(app, ["run", str(tmp_path / "cfg.json"), "--quiet"])
        assert second.exit_code == 2, second.output
        assert f"PID {proc.pid}" in second.output and "--wait" in second.output

        waiter = CountingLLM()
        df = run(cfg, progress=False, llm=waiter, wait=True)  # blocks until the first is done
        assert proc.wait(timeout=120) == 0
    finally:
        proc.kill()
    assert waiter.requests == 0 and len(df) == 20 and df["error"].isna().all()
    records = next(Path(cfg["output_dir"]).glob(f"*/{RECORDS}"))
    keys = [json.loads(line)["key"] for line in records.read_bytes().splitlines()]
    assert len(keys) == len(set(keys)) == 20


def test_resume_recomputes_scores_and_keeps_the_run_history(tmp_path, monkeypatch):
    import ragbench.experiment.runner as runner

    cfg = niah_config(tmp_path, strategies=["closed_book", "long_context"])
    first = run(cfg, progress=False, llm=FakeLLM())
    out = Path(first.attrs["run_dir"])
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["status"] == "finished" and len(manifest["sessions"]) == 1
    sheet = manifest["price_sheet"]
    assert sheet["name"] == "example-hosted-api" and sheet["date"] and sheet["source"]
    # a line edited by hand: a wrong answer claims full marks
    lines = (out / RECORDS).read_bytes().splitlines(keepends=True)
    row = json.loads(lines[0])
    row["record"]["prediction"] = "no idea"
    row["record"]["scores"] = {"string_match_all": 1.0, "contains": 1.0}
    lines[0] = (json.dumps(row) + "\n").encode()
    (out / RECORDS).write_bytes(b"".join(lines))

    # nothing is pending: the model must not even be loaded
    def no_load(m):
        raise AssertionError("the model was loaded for a run with nothing to do")

    monkeypatch.setattr(runner, "load_model", no_load)
    again = run(cfg, progress=False)
    edited = again[again["prediction"] == "no idea"]
    assert len(edited) == 1 and edited["string_match_all"].iloc[0] == 0.0
    assert edited["contains"].iloc[0] == 0.0
    resumed = json.loads((out / "manifest.json").read_text())
    assert resumed["started_at"] == manifest["started_at"]  # the first start, not this one
    assert [s["started_at"] for s in resumed["sessions"][:1]] == [manifest["started_at"]]
    assert len(resumed["sessions"]) == 2 and resumed["sessions"][1]["pending"] == 0
    assert resumed["model"] == manifest["model"] and resumed["resumed_records"] == len(first)


def test_a_run_whose_records_all_failed_says_why(tmp_path):
    import typer
    import yaml
    from typer.testing import CliRunner

    from ragbench.cli.run import register

    # every prompt is over the window, even cut to nothing (the question alone does not fit):
    # under a truncating policy that is found per record (under "error" the run stops first)
    lc = {"name": "long_context", "params": {"overflow": "truncate_tail"}}
    cfg = niah_config(tmp_path, strategies=[lc])
    cfg["model"]["params"] = {"context_window": 10}
    cfg["model"]["max_new_tokens"] = 4  # 32 answer tokens in a 10-token window: refused at load
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(cfg))
    app = typer.Typer()
    register(app)
    app.command()(lambda: None)
    result = CliRunner().invoke(app, ["run", str(path), "--quiet"])
    assert result.exit_code == 1, result.output
    assert "all 4 records failed" in result.output
    assert "4 x ContextOverflowError: prompt of 26 tokens" in result.output
    assert "Traceback" not in result.output
    # issue 45: one line, in every command's form, naming the most common error; the manifest
    # says failed (it said finished)
    (line,) = [x for x in result.stderr.splitlines() if "records failed" in x]
    assert line.startswith("error: all 4 records failed; most frequent: 4 x ContextOverflowError")
    assert result.stderr.count("ContextOverflowError") == 1, result.stderr
    (manifest,) = Path(cfg["output_dir"]).glob("*/manifest.json")
    assert json.loads(manifest.read_text())["status"] == "failed"


def test_credentials_change_neither_the_run_folder_nor_reach_the_manifest(tmp_path):
    from ragbench.experiment.config.run import config_hash, load_config

    def with_secret(secret: str, backend: str = "fake") -> dict:
        cfg = niah_config(tmp_path, strategies=["closed_book"])
        cfg["model"] |= {"backend": backend, "name": "m"}
        cfg["model"]["params"] = {"api_key": secret, "base_url": f"http://bob:{secret}@h/v1"}
        return cfg

    assert config_hash(load_config(with_secret("hunter2-aaaa", "openai"))) == config_hash(
        load_config(with_secret("hunter2-bbbb", "openai"))
    )
    # the fake backend takes no api_key: the config is refused, the secret nowhere in the error
    with pytest.raises(ConfigError, match="takes no parameter") as refused:
        run(with_secret("hunter2-cccc"), progress=False)
    assert "hunter2" not in str(refused.value)
    for path in Path(tmp_path / "results").rglob("*"):
        if path.is_file():
            assert b"hunter2-cccc" not in path.read_bytes(), path


def test_the_manifest_records_each_metric_version(tmp_path):
    from ragbench.metrics.answer import get_metric

    df = run(niah_config(tmp_path, strategies=["closed_book"]), progress=False)
    manifest = json.loads((Path(df.attrs["run_dir"]) / "manifest.json").read_text())
    expected = {m: get_metric(m).version for m in ("string_match_all", "contains")}
    assert manifest["metric_versions"] == expected and expected["string_match_all"] >= 2


def test_a_damaged_manifest_is_kept_aside_and_said_not_silently_replaced(tmp_path, caplog):
    cfg = niah_config(tmp_path, strategies=["closed_book"])
    run_dir = Path(run(cfg, progress=False).attrs["run_dir"])
    (run_dir / "manifest.json").write_text('{"name": "t-niah", "sessions": [')  # torn by hand
    with caplog.at_level("WARNING", logger="ragbench.experiment.manifest"):
        run(cfg, progress=False)
    kept = list(run_dir.glob("manifest.json.damaged-*"))
    assert len(kept) == 1 and kept[0].read_text().endswith('"sessions": [')
    assert any(
        "unreadable" in r.getMessage() and kept[0].name in r.getMessage() for r in caplog.records
    )
    assert json.loads((run_dir / "manifest.json").read_text())["name"] == "t-niah"


def test_rows_scored_by_two_versions_of_a_metric_are_not_compared(tmp_path):
    import pandas as pd

    from ragbench import report

    df = run(niah_config(tmp_path, strategies=["closed_book", "long_context"]), progress=False)
    versions = json.loads(df["metric_versions"].iloc[0])
    assert versions["string_match_all"] >= 2 and df["metric_versions"].nunique() == 1
    assert len(report.summary(df)) == 2  # one run: one version
    older = df.assign(metric_versions=json.dumps({**versions, "string_match_all": 1}))
    both = pd.concat([older.assign(label="old " + older["label"]), df])
    with pytest.raises(ValueError, match=r"'string_match_all' versions \[1, 2\]"):
        report.summary(both)
    assert len(report.summary(both, metric="contains")) == 4  # contains: one version throughout


def test_a_table_whose_every_record_failed_says_why_instead_of_a_missing_column(tmp_path):
    from ragbench import report

    def down(request):
        raise RuntimeError("HTTP 503 from the server")

    df = run(
        niah_config(tmp_path, strategies=["closed_book"]),
        progress=False,
        llm=FakeLLM(answer_fn=down),
    )
    assert df["error"].notna().all()
    manifest = json.loads((Path(df.attrs["run_dir"]) / "manifest.json").read_text())
    assert manifest["status"] == "failed"  # not "finished": nothing it was asked succeeded
    for view in (report.summary, report.verdict, report.compare):
        with pytest.raises(ValueError, match=r"all 4 records failed.*4 x .*HTTP 503"):
            view(df)
