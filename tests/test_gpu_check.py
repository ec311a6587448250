"""benchmarks/gpu_check.py end to end on the CPU with its tiny configs (``--device cpu --quick``),
so the GPU check a later session runs on an H200 does not rot: the JSON has every section, the
numbers are sane, and in float32 ragbench's prefix reuse and runner batching give exactly the
token ids of one plain ``generate`` per question."""

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
    monkeypatch.setattr(
        sys, "argv", ["gpu_check.py", "--device", "cpu", "--quick", "--out", str(out)]
    )
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    runpy.run_path(str(ROOT / "benchmarks" / "gpu_check.py"), run_name="__main__")
    data = json.loads(out.read_text())
    from ragbench.llm.kv import variants as kv_cache

    assert data["device"] == "cpu" and data["quick"] and data["dtype"] == "torch.float32"
    assert set(data["models"]) == {"llama-3.1-8b-instruct", "qwen2.5-7b-instruct"}
    for name, m in data["models"].items():
        assert "error" not in m, (name, m)
        assert m["arch"]["config"] in ("LlamaConfig", "Qwen2Config")
        assert m["matmul_peak"]["peak_flops"] > 0
        assert [r["tokens"] for r in m["prefill"]] == data["sizes"]["prefill"]
        for row in m["prefill"]:
            assert row["tokens_per_second"] > 0 and 0 < row["mfu"] < 1.5
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
        # the logits part: in float32 on the CPU every exact path picks the reference's top-1
        logits = m["logits"]
        assert logits["reference_min_top1_margin"] > 0
        paths = logits["paths"]
        expected = {"plain", "batched", "prefix_reuse_copied", "prefix_reuse_shared", "fast",
                    "fast_batched", "fast_prefix_shared"}  # fmt: skip
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
