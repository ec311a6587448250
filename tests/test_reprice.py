"""`ragbench reprice`: a fake run repriced with other sheets, checked against hand computation."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from ragbench.cli import app
from ragbench.cost import prices
from ragbench.cost.reprice import reprice_records_text, reprice_run, reprice_table
from ragbench.experiment.runner import run
from ragbench.io import sha256_file


def fake_config(tmp_path):
    return {
        "name": "t-reprice",
        "dataset": {
            "name": "niah",
            "params": {
                "context_lengths": [400, 1500],
                "depth_percents": [50],
                "needle": "\nThe special magic number is 7463343.\n",
                "question": "What is the special magic number mentioned in the text?",
                "answer": "7463343",
                "tokenizer": "whitespace",
                "final_context_length_buffer": 50,
            },
        },
        "model": {"backend": "fake", "name": "fake", "cache": False},
        "retrieval": {
            "embedder": "hash",
            "chunk_size": 64,
            "chunk_overlap": 8,
            "tokenizer": "whitespace",
        },
        "strategies": ["closed_book", "long_context", "rag", "self_route"],
        "metrics": ["contains"],
        "price_sheet": "example-hosted-api",
        "output_dir": str(tmp_path / "results"),
    }


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    df = run(fake_config(tmp_path_factory.mktemp("reprice")), progress=False)
    assert df["error"].isna().all()
    return df.attrs["run_dir"]


def originals(run_dir):
    return {n: sha256_file(Path(run_dir) / n) for n in ("results.parquet", "records.jsonl")}


def test_reprice_run_matches_hand_computation_and_keeps_the_original(run_dir, tmp_path):
    before = originals(run_dir)
    old = pd.read_parquet(f"{run_dir}/results.parquet")
    result = reprice_run(run_dir, "anthropic-claude-haiku-4-5")
    assert originals(run_dir) == before  # the run's own files: byte for byte
    new = pd.read_parquet(result.table_path)
    assert result.table_path.name == "results.anthropic-claude-haiku-4-5.parquet"
    # Haiku 4.5: $1 in, $5 out per million; no prompt here reaches the 4096-token cache minimum
    expected = (new.prompt_tokens * 1.0 + new.completion_tokens * 5.0) / 1e6
    assert (new.dollars - expected).abs().max() < 1e-15
    assert (new.price_sheet == "anthropic-claude-haiku-4-5").all()
    # everything else as the run measured it (MFU, seconds, scores, predictions)
    # no one-time cost: amortised = own; the sheet's content hash is the new sheet's
    priced = ["dollars", "price_sheet", "price_sheet_sha256", "amortised_dollars"]
    sha = prices.price_sheet("anthropic-claude-haiku-4-5").short_sha256()
    assert (new.price_sheet_sha256 == sha).all()
    assert new.amortised_dollars.equals(new.dollars)
    pd.testing.assert_frame_equal(old.drop(columns=priced), new.drop(columns=priced))
    # the records copy carries the same dollars, line for line
    lines = [json.loads(x) for x in result.records_path.read_text().splitlines()]
    by_key = {(r["record"]["example_id"], r["record"]["strategy"]): r for r in lines}
    for row in new.itertuples():
        cost = by_key[(row.example_id, row.strategy)]["record"]["cost"]
        assert cost["dollars"] == pytest.approx(row.dollars, rel=1e-12)
        assert cost["price_sheet"] == "anthropic-claude-haiku-4-5"
    # provenance: which sheet (date, source) priced which table
    info = json.loads(result.info_path.read_text())
    assert (
        info["price_sheet"]["date"] == "2025-11-01" and "https://" in info["price_sheet"]["source"]
    )
    assert info["from"]["sha256"] == before["results.parquet"]
    # the before/after means per strategy variant
    s = result.summary.set_index("label")
    lc = old[old.strategy == "long_context"]
    assert s.loc["long_context", "dollars_per_query_before"] == pytest.approx(lc.dollars.mean())
    assert s.loc["long_context", "dollars_per_query_after"] == pytest.approx(
        ((lc.prompt_tokens + 5 * lc.completion_tokens) / 1e6).mean()
    )


def test_reprice_with_an_hourly_sheet_uses_device_seconds(run_dir, tmp_path):
    out = tmp_path / "elsewhere" / "h100.parquet"
    result = reprice_run(run_dir, "example-h100-hour", out=out)
    new = pd.read_parquet(out)
    assert (new.dollars - 2.5 * new.resource_seconds / 3600).abs().max() < 1e-15
    assert result.records_path == out.parent / "records.example-h100-hour.jsonl"
    assert result.info_path == out.with_suffix(".json")


def table(**cols):
    base = {
        "example_id": ["a", "b", "c"],
        "strategy": ["long_context", "self_route", "rag"],
        "error": [None, None, "boom"],
    }
    return pd.DataFrame({**base, **cols})


SONNET = "anthropic-claude-sonnet-4-5"


def test_reprice_table_tiers_cache_columns_and_failed_rows():
    sheet = prices.price_sheet(SONNET)
    df = table(
        cost_prompt_tokens=[250_000, 3000, math.nan],  # prefixed: a parameter shares the name
        cached_prompt_tokens=[200_000, 0, math.nan],
        cache_write_tokens=[0, 2000, math.nan],
        completion_tokens=[100, 10, math.nan],
        llm_calls=[1, 2, math.nan],
        dollars=[1.0, 1.0, math.nan],
        price_sheet=["old", "old", None],
    )
    out, approximate = reprice_table(df, sheet)
    # above 200k: every token at the tier (6 in, 0.6 cached read, 22.5 out)
    assert out.dollars[0] == pytest.approx((50_000 * 6 + 200_000 * 0.6 + 100 * 22.5) / 1e6)
    # 1000 plain + 2000 written at the 5-minute write premium 3.75 + 10 out at 15
    assert out.dollars[1] == pytest.approx((1000 * 3 + 2000 * 3.75 + 10 * 15) / 1e6)
    assert math.isnan(out.dollars[2]) and out.price_sheet.tolist()[:2] == [SONNET, SONNET]
    assert pd.isna(out.price_sheet[2])  # a failed row stays unpriced
    assert approximate == 1  # the two-call row with a cache write, judged on summed tokens
    assert df.dollars.tolist()[:2] == [1.0, 1.0]  # the input table is not modified


def test_reprice_table_reads_resource_seconds_and_names_missing_columns():
    gpu = prices.price_sheet("example-h100-hour")
    df = table(resource_seconds=[36.0, 72.0, 1.0])
    out, _ = reprice_table(df, gpu)
    assert out.dollars.tolist() == pytest.approx([0.025, 0.05, 2.5 / 3600])
    with pytest.raises(ValueError, match=r"\['resource_seconds'\]"):
        reprice_table(table(prompt_tokens=[1, 2, 3]), gpu)
    with pytest.raises(ValueError, match="cached_prompt_tokens"):
        reprice_table(table(prompt_tokens=[1, 2, 3]), prices.price_sheet(SONNET))
    failed = pd.DataFrame({"example_id": ["a", "b"], "error": ["RuntimeError: x"] * 2})
    with pytest.raises(ValueError, match=r"every record of the table failed \(2\), so none has"):
        reprice_table(failed, prices.price_sheet(SONNET))  # not "needs the columns [...]"


def test_reprice_records_text_drops_a_torn_line_and_keeps_unreadable_ones():
    sheet = prices.price_sheet("example-hosted-api")
    cost = {"prompt_tokens": 1000, "cached_prompt_tokens": 400, "completion_tokens": 100}
    good = json.dumps({"key": "k", "record": {"cost": {**cost, "dollars": 9.0}}}) + "\n"
    failed = json.dumps({"key": "f", "record": {"cost": None, "error": "x"}}) + "\n"
    text = good + "not json\n" + failed + '{"key": "torn'
    lines = reprice_records_text(text, sheet).splitlines()
    assert len(lines) == 3 and lines[1] == "not json"
    priced = json.loads(lines[0])["record"]["cost"]
    assert priced["dollars"] == pytest.approx(180e-6)  # 600 x 0.15 + 400 x 0.075 + 100 x 0.6
    assert priced["price_sheet"] == "example-hosted-api"
    assert json.loads(lines[2])["record"]["cost"] is None


def test_cli_reprice_prints_before_after_and_exit_codes(run_dir, tmp_path):
    cli = CliRunner()
    ok = cli.invoke(app, ["reprice", run_dir, "--price-sheet", "openai-gpt-5-mini"])
    assert ok.exit_code == 0, ok.output
    assert "before ($ / 1k queries)" in ok.output and "long_context" in ok.output
    assert "$/query" not in ok.output  # one unit for dollars everywhere: $ per 1k queries
    # the printed value is the variant's mean $ per query x 1,000, in fixed notation
    after = pd.read_parquet(Path(run_dir) / "results.openai-gpt-5-mini.parquet")
    lc = after[after["strategy"] == "long_context"]["dollars"].mean()
    [line] = [ln for ln in ok.output.splitlines() if ln.startswith("long_context ")]
    assert f"${lc * 1000:,.4f}" in line.split() and "e-0" not in line
    assert "results.openai-gpt-5-mini.parquet" in ok.output
    bad = cli.invoke(app, ["reprice", run_dir, "--price-sheet", "openai-gpt5-mini"])
    assert bad.exit_code == 2 and "did you mean 'openai-gpt-5-mini'" in bad.output
    missing = cli.invoke(app, ["reprice", str(tmp_path / "nope"), "--price-sheet", SONNET])
    assert missing.exit_code == 2 and "no such run folder" in missing.output
    (tmp_path / "empty").mkdir()
    empty = cli.invoke(app, ["reprice", str(tmp_path / "empty"), "--price-sheet", SONNET])
    assert empty.exit_code == 2 and "no results.parquet" in empty.output
    before = originals(run_dir)
    clobber = cli.invoke(
        app, ["reprice", run_dir, "--price-sheet", SONNET, "--out", f"{run_dir}/results.parquet"]
    )
    assert clobber.exit_code == 2 and "would overwrite" in clobber.output
    assert originals(run_dir) == before


def test_cli_prices_list_and_show():
    cli = CliRunner()
    listed = cli.invoke(app, ["prices", "list"])
    assert listed.exit_code == 0 and "anthropic-claude-sonnet-4-5" in listed.output
    shown = cli.invoke(app, ["prices", "show", "google-gemini-2.5-pro"])
    assert shown.exit_code == 0 and "above_prompt_tokens: 200000" in shown.output
    missing = cli.invoke(app, ["prices", "import-genai", "gpt-4o"])
    if missing.exit_code != 0:  # genai-prices not installed: one clear line, exit 2
        assert missing.exit_code == 2 and "pip install genai-prices" in missing.output


def test_a_row_a_record_line_and_a_resumed_record_are_repriced_by_one_function():
    """``ragbench reprice`` (its table and its records.jsonl) and a resumed run whose sheet
    changed (``reprice_stale``) price a record alike: ``repriced_cost``, cache writes from the
    record's meta (a table row: its column)."""
    from ragbench.cost.accounting import Cost
    from ragbench.cost.reprice import reprice_stale, repriced_cost
    from ragbench.io import dumps_canonical
    from ragbench.types import Record

    sheet = prices.price_sheet(SONNET)  # writes to the cache cost more than plain prompt tokens
    cost = Cost(prompt_tokens=3000, cached_prompt_tokens=1000, completion_tokens=10, dollars=1.0)
    meta = {"cache_write_tokens": 2000}
    record = Record("e", "closed_book", {}, "x", cost=cost, meta=meta)
    line = dumps_canonical({"key": "k", "record": record.to_dict(), "schema_version": 2})
    from_line = json.loads(reprice_records_text(line + "\n", sheet))["record"]["cost"]
    from_resume = reprice_stale({"k": record}, sheet).repriced["k"].cost
    from_table, _ = reprice_table(pd.DataFrame([{**cost.to_dict(), **meta}]), sheet)
    assert from_line == from_resume.to_dict() == repriced_cost(cost, sheet, meta).to_dict()
    assert from_table["dollars"][0] == pytest.approx(from_resume.dollars)
    assert from_resume.dollars > repriced_cost(cost, sheet).dollars  # the writes were priced
