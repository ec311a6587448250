"""benchmarks/gpu_check.py end to end on the CPU with its tiny configs (``--device cpu --quick``),
so the GPU check a later session runs on an H200 does not rot: the JSON has every section, the
numbers are sane, and in float32 ragbench's prefix reuse and runner batching give exactly the
token ids of one plain ``generate`` per question. The ``tests`` and ``e2e`` parts too (the e2e
part's ``ragbench run`` on a tiny random-weight model), and the one-line skip of a part whose
packages are missing."""

import json
import runpy
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers")
ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_gpu_check_runs_on_cpu_quick(tmp_path, monkeypatch):
    out = tmp_path / "gpu.json"
    parts = "greedy32,prefill,reuse,runner,kv,cost,decode,logits"  # tests, e2e: their own tests
    argv = ["gpu_check.py", "--device", "cpu", "--quick", "--out", str(out), "--parts", parts]
    monkeypatch.setattr(sys, "argv", argv)
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    runpy.run_path(str(ROOT / "benchmarks" / "gpu_check.py"), run_name="__main__")
    data = json.loads(out.read_text())
    from ragbench.llm.kv import variants as kv_cache

    assert data["device"] == "cpu" and data["quick"] and data["dtype"] == "torch.float32"
    assert data["skipped"] == {} and data["packages"]["cost"] == {}  # torch + transformers only
    assert set(data["packages_optional"]["kv"]) == {"hqq", "optimum.quanto"}  # recorded only
    assert set(data["models"]) == {"llama-3.1-8b-instruct", "qwen2.5-7b-instruct"}
    # greedy32: in float32 every exact path gives generate's tokens (the KV variants included)
    greedy = data["greedy32"]
    assert greedy["dtype"] == "torch.float32" and greedy["arch"]["config"] == "LlamaConfig"
    assert greedy["exact_paths_equal"] is True, greedy
    ran = {k for k, v in greedy["paths"].items() if "error" not in v}
    assert {"plain", "batched", "prefix_reuse_shared", "fast_batched", "fast_prefix_shared"} <= ran
    assert any(k.startswith("kv_sinks") for k in ran) and any(
        k.startswith("kv_snapkv") for k in ran
    )
    assert greedy["paths"]["fast_batched"]["decode_path"] == "static"
    for name, m in data["models"].items():
        assert "error" not in m, (name, m)
        assert m["arch"]["config"] in ("LlamaConfig", "Qwen2Config")
        assert m["matmul_peak"]["peak_flops"] > 0
        assert [r["tokens"] for r in m["prefill"]] == data["sizes"]["prefill"]
        for row in m["prefill"]:
            # > 0 only: on a shared CPU the matmul peak and the prefill are timed at different
            # loads (MFU 3.7-7.2 seen at load 9-11 on 2 cores); on a GPU the JSON shows it
            assert row["tokens_per_second"] > 0 and row["mfu"] > 0
        reuse = m["prefix_reuse"]
        for key in ("same_tokens_as_plain_generate", "same_tokens_as_prompt_cache_reuse"):
            assert reuse[key] == {"all": True, "rows_identical": 4, "token_agreement": 1.0}
        assert reuse["speedup_vs_plain_generate"] > 0
        assert reuse["speedup_vs_prompt_cache_reuse"] > 0
        # a row holds the one document KV plus its own question and answer positions
        assert reuse["kv_bytes_formula_document"] < reuse["kv_bytes_measured_row"]
        assert reuse["kv_bytes_measured_row"] < 2 * reuse["kv_bytes_formula_document"]
        assert m["runner_batching"]["same_tokens"]["all"]
        kv = m["kv_variants"]
        # every variant the module names is there (new ones included), run or with its error
        assert {label.split("-")[0] for label in kv} == set(kv_cache.KV_CACHES)
        # each ran, unless a package it needs is missing (snapkv once lacked its kv_ratio)
        failed = {k: v["error"] for k, v in kv.items() if "error" in v}
        missing = ("ImportError", "ModuleNotFoundError")
        assert all(e.startswith(missing) for e in failed.values()), failed
        assert kv["plain"]["kv_ratio_to_formula"] == 1.0
        assert kv["plain"]["same_tokens_as_plain"] is True
        sinks = next(v for k, v in kv.items() if k.startswith("sinks"))
        assert sinks["kv_ratio_to_formula"] < 0.5  # window of a quarter + 4 sinks: evicted
        # the decode part: the floor, ms per step per batch on both paths, runner batching
        dec = m["decode"]
        assert dec["floor_ms"] > 0 and dec["copy_bandwidth_bytes_per_second"] > 0
        assert dec["cuda_graphs"] is False  # capture is CUDA only
        for path, kind in (("plain", "eager"), ("fast", "static")):
            assert set(dec[path]) == {str(b) for b in data["sizes"]["decode"]["batches"]}
            for row in dec[path].values():
                assert row["ms"] > 0 and row["x_floor"] > 0 and row["path"] == kind, row
        assert dec["fast"]["1"]["graph"] == "off"
        assert dec["fast_batch8_over_batch1"] > 0
        assert dec["runner_batching_fast"]["same_tokens"]["all"]
        assert dec["runner_batching_fast"]["prompts"] == data["sizes"]["decode"]["runner"][0]
        long = dec["long_prompt"]
        assert long["prompt_tokens"] == data["sizes"]["decode"]["long"]
        assert long["plain"]["path"] == "eager" and long["fast"]["path"] == "static"
        assert long["plain"]["ms"] > 0 and long["fast"]["ms"] > 0
        # the targets: each figure beside its bound; capture is not measured off CUDA, so auto
        # is never ready from a CPU run
        t = dec["targets"]
        assert t["fast_batch1_ms"]["value"] == dec["fast"]["1"]["ms"]
        assert t["long_prompt_fast_ms"]["max"] == long["plain"]["ms"]
        for name in (
            "fast_batch1_ms",
            "fast_batch8_over_batch1",
            "runner_batching_fast_speedup",
            "long_prompt_fast_ms",
        ):
            assert isinstance(t[name]["met"], bool), (name, t)
        assert t["captured_every_batch"] == {"value": 0, "of": 3, "met": None}
        assert t["auto_ready"] is False
        # the logits part: in float32 on the CPU every exact path picks the reference's top-1
        logits = m["logits"]
        assert logits["reference_min_top1_margin"] > 0
        paths = logits["paths"]
        expected = {
            "plain",
            "batched",
            "prefix_reuse_copied",
            "prefix_reuse_shared",
            "fast",
            "fast_batched",
            "fast_prefix_shared",
        }
        assert expected <= set(paths)
        assert {k.split("-")[0] for k in paths if k.startswith("kv_")} == {
            f"kv_{name}" for name in kv_cache.KV_CACHES if name != "plain"
        }
        for name, p in paths.items():
            if "error" in p:  # only a missing package (quantized backends)
                assert p["error"].startswith(missing) and name.startswith("kv_quantized"), p
                continue
            for key in ("top1_agreement", "max_abs_diff", "first_token", "first_decode_step"):
                assert key in p, (name, p)
            if p["exact"]:
                assert p["top1_agreement"] == 1.0, (name, p)
                assert p["max_abs_diff"] < 1e-3, (name, p)
                assert p["same_first_token_as_reference"], (name, p)
        for name in ("fast", "fast_batched", "fast_prefix_shared"):
            assert paths[name]["decode_path"] == "static" and paths[name]["graph"] == "off"
        assert paths["plain"]["decode_path"] == "eager"
        assert "float32" not in logits  # the float32 check is for reduced precision only
        assert all(p.get("first_token_flips", []) == [] for p in paths.values())


def _gpu_check(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    import gpu_check

    return gpu_check


def test_probe_finds_modules_with_versions(monkeypatch):
    gpu_check = _gpu_check(monkeypatch)
    got = gpu_check.probe(("pytest", "no_such_module_ragbench", "no_such_pkg_rb.sub"))
    assert got["pytest"] == pytest.__version__
    assert got["no_such_module_ragbench"] is None and got["no_such_pkg_rb.sub"] is None


def test_part_with_missing_packages_is_skipped_in_one_line(tmp_path, monkeypatch, capsys):
    gpu_check = _gpu_check(monkeypatch)
    monkeypatch.setitem(gpu_check.PART_PACKAGES, "e2e", ("json", "no_such_module_ragbench"))
    out = tmp_path / "gpu.json"
    gpu_check.main(["--out", str(out), "--device", "cpu", "--quick", "--parts", "e2e"])
    data = json.loads(out.read_text())
    assert data["skipped"] == {"e2e": "missing no_such_module_ragbench"}
    assert data["packages"]["e2e"]["no_such_module_ragbench"] is None
    assert data["packages"]["e2e"]["json"] == "found"  # the standard library: no distribution
    assert "e2e" not in data and data["models"] == {}  # no model part asked for: none built
    lines = [line for line in capsys.readouterr().out.splitlines() if "e2e" in line]
    assert lines == ["e2e: skipped, missing no_such_module_ragbench (see gpu_check.sh --wheels)"]


@pytest.mark.slow
def test_tests_part_runs_the_gpu_marked_files(monkeypatch):
    """Without CUDA the gpu-marked tests are skipped, but the files collect (their imports work)."""
    gpu_check = _gpu_check(monkeypatch)
    got = gpu_check.run_tests("cpu")
    assert got["returncode"] == 0, got["tail"]
    assert [Path(f).name for f in got["files"]] == ["test_hf.py", "test_hf_static.py"]
    assert got["counts"].get("skipped", 0) >= 1 and got["ok"] is False  # none passed here


@pytest.mark.slow
def test_e2e_part_runs_ragbench_on_a_tiny_model(monkeypatch):
    """The e2e part as the GPU session runs it, on the CPU with a tiny shape: a random-weight
    Llama saved with the embedded SmolLM2 tokenizer, a real `ragbench run` (closed book, long
    context, BM25 RAG, the example-h100-hour sheet), records on the device asked for."""
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    import gpu_check_e2e

    got = gpu_check_e2e.run_e2e("cpu", shape="tiny")
    assert got["ok"], got
    assert got["records"] == 6 and got["strategies"] == ["closed_book", "long_context", "rag"]
    assert got["devices"] == ["cpu"] and got["manifest_calibration_device"] == "cpu"
    assert got["records_carry_device"]  # each record says the device its answer ran on
    assert got["status"] == "finished" and got["error_count"] == 0
    assert got["sample_cost"]["price_sheet"] == "example-h100-hour"
    assert got["model"]["vocab_size"] == got["model"]["tokenizer_vocab"]  # tiny: the tokenizer's
    assert not Path(got["workdir"]).exists()  # the model folder is removed
