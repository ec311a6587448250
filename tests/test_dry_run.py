"""``ragbench run --dry-run``: the tokens it predicts are the tokens a real run logs."""

from __future__ import annotations

import re

import pytest
from test_runner import niah_config

from ragbench.experiment.dry_run import dry_run
from ragbench.experiment.preflight import OverWindowError
from ragbench.experiment.runner import run


def logged(df):
    ok = df[df["error"].isna()]
    return ok.groupby("label", sort=False)["prompt_tokens"].mean().round(1).to_dict()


def test_dry_run_predicts_the_prompt_tokens_and_dollars_of_the_run(tmp_path):
    cfg = niah_config(tmp_path, strategies=["closed_book", "long_context", "rag"])
    cfg["model"]["params"] = {"context_window": 1000}  # the 1500-token haystacks overflow
    table = dry_run(cfg, progress=False)
    assert not (tmp_path / "results").exists()  # nothing written
    over = {k: v for k, v in table.set_index("label")["over_window"].items() if v}
    assert over == {"long_context": 2}
    # the run counts them the same way and stops before it loads the model (was: 2 error rows)
    with pytest.raises(OverWindowError, match="2 of 4 examples are over the window") as info:
        run(cfg, progress=False)
    assert info.value.count == over["long_context"]
    # cut instead, every prompt fits: the tokens predicted are the tokens logged
    cfg["strategies"][1] = {"name": "long_context", "params": {"overflow": "truncate_middle"}}
    table = dry_run(cfg, progress=False)
    df = run(cfg, progress=False)
    predicted = table.set_index("label")
    assert df["error"].isna().all() and not predicted["over_window"].any()
    assert predicted["prompt_tokens"].to_dict() == logged(df)
    assert df[df.strategy == "long_context"]["truncated_tokens"].gt(0).sum() == 2
    # api sheet: dollars from tokens, with max_new_tokens as the completion bound
    assert (df["completion_tokens"] <= cfg["model"].get("max_new_tokens", 32)).all()
    assert (predicted["dollars_per_query_max"] >= df.groupby("label")["dollars"].mean()).all()
    # self_route's note only where it runs (was: in every dry run)
    assert not any("self_route" in n for n in table.attrs["notes"])
    cfg["strategies"].append("self_route")
    assert any("self_route" in n for n in dry_run(cfg, progress=False).attrs["notes"])


def test_dry_run_cli_prints_the_table_and_loads_no_model(tmp_path, monkeypatch):
    import typer
    import yaml
    from typer.testing import CliRunner

    import ragbench.experiment.runner as runner
    from ragbench.cli.run import register

    monkeypatch.setattr(runner, "load_model", lambda m: pytest.fail("loaded the model"))
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(niah_config(tmp_path, strategies=["long_context"])))
    app = typer.Typer()
    register(app)
    app.command()(lambda: None)
    result = CliRunner().invoke(app, ["run", str(path), "--dry-run", "--quiet"])
    assert result.exit_code == 0, result.output
    assert "long_context" in result.output and "total: at most $" in result.output
    # dollars read as money with their unit, never in scientific notation (was 1.7475e-05)
    assert "($ / 1k queries)" in result.output and "dollars_total_max ($)" in result.output
    assert not re.search(r"\de-\d", result.output), result.output
    assert not (tmp_path / "results").exists()


@pytest.mark.slow
def test_dry_run_counts_like_the_embedded_model(tmp_path):
    cfg = niah_config(tmp_path, strategies=["closed_book", "long_context", "rag"])
    cfg["dataset"]["params"].update(context_lengths=[300], depth_percents=[50])
    cfg["dataset"]["params"].pop("tokenizer")
    cfg["model"] = {
        "backend": "hf",
        "name": "smollm2-135m-instruct",
        "max_new_tokens": 8,
        "cache": False,
    }
    cfg["retrieval"] = {"embedder": "hash", "chunk_size": 64, "chunk_overlap": 8}
    table = dry_run(cfg, progress=False)
    df = run(cfg, progress=False)
    assert table.set_index("label")["prompt_tokens"].to_dict() == logged(df)


@pytest.mark.slow  # reads the embedded model's tokenizer
def test_dry_run_window_follows_rope_scaling_like_the_model():
    from ragbench.experiment.dry_run import HFPromptCounter

    plain = HFPromptCounter("smollm2-135m-instruct")
    scaled = HFPromptCounter("smollm2-135m-instruct", rope_scaling="yarn", rope_factor=2.0)
    assert scaled.context_window == 2 * plain.context_window == 16384
    given = HFPromptCounter("smollm2-135m-instruct", context_window=4096, rope_factor=2.0)
    assert given.context_window == 4096  # an explicit window wins, as in HFModel


def test_a_device_hour_sheet_is_priced_from_a_cached_calibration_or_not_at_all(
    tmp_path, monkeypatch
):
    import ragbench.experiment.dry_run as dry
    from ragbench.cost.money import dollars
    from ragbench.cost.prices import modelled_seconds_for, price_sheet
    from ragbench.llm.cost_model import Rates

    cfg = niah_config(tmp_path, strategies=["closed_book"], price_sheet="example-cpu-hour")
    unpriced = dry_run(cfg, progress=False)
    assert unpriced["dollars_per_query_max"].isna().all()  # never a pretend $0
    assert any("no calibration" in n for n in unpriced.attrs["notes"])
    rates = Rates(a=0.01, b=0.002, c=1e-7, d0=0.02, d1=1e-6)
    monkeypatch.setattr(dry, "cached_calibration", lambda cfg: rates)
    priced = dry_run(cfg, progress=False)
    row = priced.iloc[0]
    seconds = modelled_seconds_for(rates, row["prompt_tokens"], 0, row["completion_tokens_max"])
    expected = dollars(price_sheet("example-cpu-hour"), seconds=seconds)
    assert row["dollars_per_query_max"] == pytest.approx(expected, rel=0.05)  # mean of 4 prompts
    assert any("cached calibration" in n for n in priced.attrs["notes"])


def test_the_cached_calibration_a_dry_run_prices_with_is_of_the_dtype_that_runs(
    tmp_path, monkeypatch
):
    """``model.params.dtype``: bf16 decode costs about half the fp32 one on a CPU, so a dry run
    of a bf16 config is priced from a bf16 calibration, never an fp32 one (and back)."""
    import json

    import ragbench.experiment.dry_run as dry
    from ragbench.assets import smollm2_gguf
    from ragbench.experiment.config.run import parse_config
    from ragbench.llm import calibration
    from ragbench.llm.cost_model import Rates
    from ragbench.llm.gguf import file_sha256

    monkeypatch.setenv("RAGBENCH_CACHE", str(tmp_path / "cache"))
    folder = tmp_path / "cache" / "calibration"
    folder.mkdir(parents=True)
    weights = "gguf-sha256:" + file_sha256(smollm2_gguf())
    for dtype, d0 in (("float32", 0.04), ("bfloat16", 0.02)):
        key = {
            "version": calibration.CALIBRATION_VERSION,
            "weights": weights,
            "dtype": dtype,
            "hardware": calibration.cpu_name(),
        }
        rates = Rates(a=0.01, b=0.002, c=1e-7, d0=d0, d1=1e-6, meta={"key": key})
        (folder / f"{dtype}.json").write_text(json.dumps(rates.to_dict()))
    base = niah_config(tmp_path, strategies=["closed_book"], price_sheet="example-cpu-hour")
    base["model"] = {"backend": "hf", "name": "smollm2-135m-instruct", "cache": False}
    for params, d0 in (({}, 0.04), ({"dtype": "float32"}, 0.04), ({"dtype": "bfloat16"}, 0.02)):
        cfg = parse_config({**base, "model": {**base["model"], "params": params}})
        found = dry.cached_calibration(cfg)
        assert found is not None and found.d0 == d0, params
    cfg = parse_config({**base, "model": {**base["model"], "params": {"dtype": "float16"}}})
    assert dry.cached_calibration(cfg) is None  # never measured in fp16 here


def _dry_run_cli(path):
    import typer
    from typer.testing import CliRunner

    from ragbench.cli.run import register

    app = typer.Typer()
    register(app)
    app.command()(lambda: None)
    return CliRunner().invoke(app, ["run", str(path), "--dry-run", "--quiet"])


@pytest.mark.parametrize(
    ("where", "key"), [("dataset", "dataset.params.tokenizer"), ("model", "model.name")]
)
def test_a_hub_tokenizer_not_cached_offline_is_one_line_at_once(tmp_path, monkeypatch, where, key):
    import yaml

    from ragbench import tokenizers

    calls = []

    def not_cached(source, **kwargs):  # as transformers, offline, for a repo it has not cached
        calls.append(kwargs)
        raise OSError("We couldn't connect to 'https://huggingface.co' to load the files")

    monkeypatch.setattr(tokenizers, "_load_hf", not_cached)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    tokenizers.get_tokenizer.cache_clear()
    cfg = niah_config(tmp_path, strategies=["long_context"])
    if where == "dataset":
        cfg["dataset"]["params"]["tokenizer"] = "qwen2.5-7b-instruct"
    else:
        cfg["model"] = {"backend": "hf", "name": "qwen2.5-7b-instruct"}
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    named = ("tokenizer: qwen2.5-7b-instruct", "name: qwen2.5-7b-instruct")
    line = next(
        i for i, text in enumerate(path.read_text().splitlines(), 1) if text.strip() in named
    )
    result = _dry_run_cli(path)
    tokenizers.get_tokenizer.cache_clear()
    assert result.exit_code == 2, result.output
    assert result.output.startswith(
        f"error: {path}:{line}: {key}: tokenizer 'qwen2.5-7b-instruct' (Qwen/Qwen2.5-7B-Instruct "
        "on the Hugging Face Hub) is not in the local cache and HF_HUB_OFFLINE is set: unset it"
    ), result.output
    assert "hf download Qwen/Qwen2.5-7B-Instruct" in result.output
    assert result.output.count("\n") == 1 and "Traceback" not in result.output
    assert calls == [{"local_files_only": True}]  # the cache only: no download tried, no wait
    assert not (tmp_path / "results").exists()


@pytest.mark.parametrize(
    ("change", "key", "message"),
    [
        (
            {"strategies": [{"name": "long_context", "params": {"kv": "snapkv"}}]},
            "strategies.0.params.kv",
            "the fake backend cannot run kv 'snapkv': it supports ['plain']; the variants",
        ),
        (
            {"metrics": ["contains", "longbench"]},
            "metrics.1",
            "longbench cannot score 4 of the 4 examples of dataset 'niah' (the first: ",
        ),
    ],
)
@pytest.mark.parametrize("dry", [True, False])
def test_a_config_every_record_would_fail_is_refused_before_the_run(
    tmp_path, change, key, message, dry
):
    import typer
    import yaml
    from typer.testing import CliRunner

    from ragbench.cli.run import register

    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(niah_config(tmp_path, **change), sort_keys=False))
    marker = "kv: snapkv" if "kv" in key else "- longbench"  # the line named
    line = next(i for i, t in enumerate(path.read_text().splitlines(), 1) if marker in t)
    app = typer.Typer()
    register(app)
    app.command()(lambda: None)
    args = ["run", str(path), "--quiet", *(["--dry-run"] if dry else [])]
    result = CliRunner().invoke(app, args)
    # was: the dry run priced it; the run made a folder, then every record failed (exit 1)
    assert result.exit_code == 2, result.output
    assert result.output.startswith(f"error: {path}:{line}: {key}: "), result.output
    assert message in result.output and result.output.count("\n") == 1
    assert not (tmp_path / "results").exists()


def longbench_config(tmp_path, strategies) -> dict:
    """The LongBench fixture (one of its three examples, gov_report, asks nothing) imported as
    ``ragbench data import longbench`` writes it, run by ``strategies`` under the fake model."""
    from pathlib import Path

    from ragbench.datasets import formats

    data = tmp_path / "lb.jsonl"
    fixture = Path(__file__).parent / "fixtures" / "longbench.jsonl"
    formats.write_examples(data, formats.load("longbench", fixture))
    dataset = {"name": "file", "params": {"path": str(data)}}
    return niah_config(tmp_path, dataset=dataset, strategies=strategies, metrics=["longbench"])


@pytest.mark.parametrize("dry", [True, False])
def test_a_retrieving_strategy_over_examples_that_ask_nothing_is_refused_before_the_run(
    tmp_path, dry
):
    import yaml
    from typer.testing import CliRunner

    from ragbench.cli import app

    rag = {"name": "rag", "params": {"top_k": 1}}
    path = tmp_path / "c.yaml"
    cfg = longbench_config(tmp_path, ["closed_book", "long_context", rag])
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    line = next(i for i, t in enumerate(path.read_text().splitlines(), 1) if "name: rag" in t)
    args = ["run", str(path), "--quiet", *(["--dry-run"] if dry else [])]
    result = CliRunner().invoke(app, args)
    # was: each of them failed 'empty query' at every rerun; the dry run called it over_window
    assert result.exit_code == 2, result.output
    assert result.output.startswith(
        f"error: {path}:{line}: strategies.2: rag retrieves with "
        "each example's question, but 1 of the 3 examples of "
        "dataset 'file' have an empty question (the first: "
        "'lb-0003'; subsets: gov_report): drop those examples"
    )
    assert "closed_book or long_context" in result.output and result.output.count("\n") == 1
    assert not (tmp_path / "results").exists()


def test_examples_that_ask_nothing_still_run_without_retrieval(tmp_path):
    table = dry_run(longbench_config(tmp_path, ["closed_book", "long_context"]), progress=False)
    assert list(table["records"]) == [3, 3] and not table["over_window"].any()


def test_a_dry_run_counts_only_prompts_over_the_window_as_over_window(tmp_path, monkeypatch):
    """A record that would fail for another reason is a note, not an ``over_window`` count."""
    from ragbench.experiment import dry_run as module

    monkeypatch.setattr(module, "check_queries", lambda *_: None, raising=False)  # let it fail
    rag = {"name": "rag", "params": {"top_k": 1}}
    table = dry_run(longbench_config(tmp_path, [rag]), progress=False)
    assert list(table["over_window"]) == [0]  # was 1: the empty query counted as too long
    assert any(
        n.startswith("failed: 1 of 3 records would fail, not for the window (the first: rag ")
        and "on 'lb-0003': ValueError: empty query" in n
        for n in table.attrs["notes"]
    ), table.attrs["notes"]
