"""Long-context KV-cache techniques (``ragbench.llm.kv.variants``): measured bytes against the
formula, offloading, attention sinks (StreamingLLM), quantized caches, and how the variants are
validated, recorded and refused. A tiny random Llama built from a config (no download) for the
logic; the embedded SmolLM2 (``slow``) for the real model."""

from __future__ import annotations

import json

import pytest

from ragbench import cost
from ragbench.llm.cache import request_key
from ragbench.llm.fake import FakeLLM
from ragbench.llm.kv import sinks as kv_sinks
from ragbench.llm.kv import variants as kv_cache
from ragbench.strategies import get_strategy
from ragbench.strategies.base import Resources
from ragbench.strategies.params import LongContextParams
from ragbench.types import Completion, Document, Example, GenerationRequest

# tiny model of tests/test_hf.py: 2 layers, 2 KV heads, head dim 16, float32 on CPU
LAYERS, KV_HEADS, HEAD_DIM, F32 = 2, 2, 16, 4


def _formula(positions: int) -> int:
    return cost.kv_cache_bytes(LAYERS, KV_HEADS, HEAD_DIM, positions, 1, F32)


# ------------------------------------------------------------------------ pure: choices, records


def test_kv_choices_are_validated_with_the_valid_choices_named():
    with pytest.raises(ValueError, match="plain"):
        kv_cache.kv_from_spec("paged")
    with pytest.raises(ValueError, match=r"supports bits \[2, 4\]"):
        kv_cache.Quantized(bits=8, backend="quanto")
    with pytest.raises(ValueError, match="hqq"):
        kv_cache.Quantized(bits=4, backend="bnb")
    with pytest.raises(ValueError, match=r"kv quantized needs bits: kv: \{name: quantized, bits"):
        kv_cache.kv_from_spec("quantized")  # bits has no default
    with pytest.raises(ValueError, match="window_tokens >= 1"):
        kv_cache.Sinks(sink_tokens=4, window_tokens=0)
    with pytest.raises(ValueError, match="kv plain has no parameter 'bits'; it takes none"):
        kv_cache.kv_from_spec({"name": "plain", "bits": 4})
    with pytest.raises(TypeError, match="KV-cache variant"):
        GenerationRequest("p", kv="quantized")  # a variant object, not its name
    with pytest.raises(ValueError, match="long_context: kv quantized needs.*bits"):
        LongContextParams(kv={"name": "quantized"})


def test_long_context_params_fill_the_variant_defaults_and_label_them():
    q = LongContextParams(kv={"name": "quantized", "bits": 4})
    # the default filled in: the record names the backend that ran
    assert q.to_dict()["kv"] == {"name": "quantized", "bits": 4, "backend": "hqq"}
    assert q.label() == "long_context kv=quantized-hqq-int4"
    s = LongContextParams(kv="sinks")
    assert (s.kv.sink_tokens, s.kv.window_tokens) == (4, 1024)
    assert LongContextParams.from_dict(s.to_dict()) == s
    assert LongContextParams().label() == "long_context"
    assert LongContextParams().to_dict()["kv"] == {"name": "plain"}
    grid = LongContextParams.grid({"kv": {"name": "quantized", "bits": [8, 4]}})
    want = ["long_context kv=quantized-hqq-int8", "long_context kv=quantized-hqq-int4"]
    assert [p.label() for p in grid] == want
    listed = LongContextParams.grid({"kv": [{"name": "quantized", "bits": 8}, "sinks"]})
    assert [p.label() for p in listed] == [want[0], "long_context kv=sinks-4+1024"]


def test_plain_requests_keep_their_cache_keys_and_variants_change_them():
    ident = FakeLLM().identity()
    plain = GenerationRequest("p")
    assert "kv" not in plain.to_dict()  # left out at its default: plain keys never move
    assert GenerationRequest.from_json(plain.to_json()) == plain
    assert GenerationRequest("p", kv=kv_cache.Plain()) == plain  # one spelling of plain
    quant = GenerationRequest("p", kv=kv_cache.Quantized(bits=4))
    assert request_key(ident, quant) != request_key(ident, plain)
    assert json.loads(quant.to_json())["kv"] == {"name": "quantized", "bits": 4, "backend": "hqq"}
    with pytest.raises(ValueError, match="kv_from_spec"):
        GenerationRequest.from_json(quant.to_json())  # the core type knows no variant


def _example() -> Example:
    doc = Document("d", "One of the special magic numbers for quiet-lake is: 4817263.")
    return Example("e1", "What is the special magic number for quiet-lake?", ("4817263",), (doc,))


def test_long_context_sends_the_variant_with_the_request_and_records_it():
    seen: list[GenerationRequest] = []

    def answer(request):
        seen.append(request)
        return "4817263"

    llm = FakeLLM(answer_fn=answer, simulate_kv_cache=True)
    params = LongContextParams(kv={"name": "sinks", "sink_tokens": 2, "window_tokens": 16})
    record = get_strategy("long_context").run(_example(), Resources(llm=llm), params)
    assert seen[0].kv == kv_cache.Sinks(sink_tokens=2, window_tokens=16) == params.kv
    stored = record.to_dict()["params"]["kv"]
    assert stored == {"name": "sinks", "sink_tokens": 2, "window_tokens": 16}
    assert record.scores["string_match_all"] == 1.0


def test_backends_without_kv_variants_refuse_them_by_name():
    request = GenerationRequest("p", kv=kv_cache.Offloaded())
    with pytest.raises(ValueError, match=r"fake backend cannot run kv 'offloaded'.*'hf'"):
        FakeLLM().generate([request])
    [c] = FakeLLM(simulate_kv_cache=True).generate([request])  # tests only, and flagged
    assert c.meta["simulated_kv_cache"] == "offloaded" and c.kv_bytes_measured is None
    from ragbench.llm.openai.compat import OpenAICompatLLM

    server = OpenAICompatLLM(model="m", base_url="http://127.0.0.1:9/v1")
    with pytest.raises(ValueError, match="OpenAI-compatible backend cannot run"):
        server._generate([request])  # refused before anything is sent


def test_missing_quantization_backend_is_named(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "hqq" else real(name, *a)
    )
    with pytest.raises(ImportError, match=r"'hqq' package: pip install 'ragbench\[kvquant\]'"):
        kv_cache.check_backend_installed("hqq")


def test_cost_carries_measured_bytes_beside_the_formula():
    from ragbench.models import get_preset

    p = get_preset("smollm2-135m-instruct")
    c = Completion("x", prompt_tokens=1000, completion_tokens=5, kv_bytes_measured=123)
    f = cost.Cost.of(c, p, kv_dtype="float32")
    assert f.kv_bytes_measured == 123
    assert f.kv_bytes_prefill == cost.kv_cache_bytes(30, 3, 64, 1000, 1, 4)
    assert f.kv_cache_bytes == cost.kv_cache_bytes(30, 3, 64, 1004, 1, 4)  # at the last step
    assert (f + cost.Cost.of(Completion("y", 10, 1), p)).kv_bytes_measured == 123
    assert cost.Cost.of(Completion("y", 10, 1), p).kv_bytes_measured is None  # not measured


def test_tensor_bytes_counts_each_tensor_once_in_its_dtype():
    torch = pytest.importorskip("torch")
    a = torch.zeros(3, 4, dtype=torch.float16)
    b = torch.zeros(5, dtype=torch.uint8)
    assert kv_cache.tensor_bytes([a, (b, {"s": a})]) == 3 * 4 * 2 + 5


# ------------------------------------------------------------------------ the tiny model

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from ragbench.llm.hf.model import HFModel  # noqa: E402


def _doc(n: int = 150, seed: int = 1) -> str:
    from test_hf import _text

    return _text(n, seed)


def _ask(model, doc, tails=(" w1 w2", " w3"), kv=None):
    reqs = [GenerationRequest(doc + t, prefix=doc, max_new_tokens=6, kv=kv) for t in tails]
    return model.generate(reqs)


def test_plain_cache_measured_bytes_equal_the_formula_exactly(tiny):
    # a prefix shared by two questions of different lengths (shared-prefix attention, padding)
    for c in _ask(tiny, _doc(), tails=(" w1 w2 w3 w4", " w5")):
        assert c.kv_bytes_measured == _formula(c.prompt_tokens)
        assert c.meta["kv_cache"] == {"kind": "plain", "label": "plain"}
    # and with the prefix copied per row instead
    copying = object.__new__(HFModel)
    copying.__dict__.update(tiny.__dict__, shared_prefix_attention=False, _prefix_kv={})
    for c in _ask(copying, _doc(120, 2), tails=(" w1 w2 w3", " w5")):
        assert c.kv_bytes_measured == _formula(c.prompt_tokens)


def test_offloaded_cache_on_cpu_is_a_recorded_no_op_with_the_plain_answers(tiny):
    plain = _ask(tiny, _doc())
    off = _ask(tiny, _doc(), kv=kv_cache.Offloaded())
    assert [c.text for c in off] == [c.text for c in plain]
    assert [c.kv_bytes_measured for c in off] == [c.kv_bytes_measured for c in plain]
    assert off[0].meta["kv_cache"]["offloaded"] is False
    assert "no-op on cpu" in off[0].meta["kv_cache"]["note"]
    assert off[0].cached_prompt_tokens == 0  # a variant runs alone, without prefix reuse


@pytest.mark.skipif(not torch.cuda.is_available(), reason="offloading needs a CUDA device")
def test_offloaded_cache_on_cuda_gives_the_plain_answers(tmp_path):
    from test_hf import _save_tiny

    _save_tiny(tmp_path / "m", chat=True)
    gpu = HFModel(str(tmp_path / "m"), device="cuda", dtype="float32", cache_dir=tmp_path)
    plain, off = _ask(gpu, _doc()), _ask(gpu, _doc(), kv=kv_cache.Offloaded())
    assert [c.text for c in off] == [c.text for c in plain]
    assert off[0].meta["kv_cache"]["offloaded"] is True


def test_sink_layer_keeps_the_first_and_the_last_positions():
    layer = kv_sinks.sink_layer_class()(2, 3)
    k = torch.arange(10.0).view(1, 1, 10, 1)
    full_k, _ = layer.update(k, k)
    assert full_k.flatten().tolist() == list(range(10))  # this pass sees everything
    assert layer.keys.flatten().tolist() == [0, 1, 7, 8, 9]
    assert layer.get_seq_length() == 10 and layer.get_mask_sizes(1) == (6, 5)
    layer.update(torch.tensor([[[[10.0]]]]), torch.tensor([[[[10.0]]]]))
    assert layer.keys.flatten().tolist() == [0, 1, 8, 9, 10]


def test_sinks_with_room_for_the_whole_prompt_give_the_plain_answers(tiny):
    # chunked prefill (chunks of 60) with nothing evicted must equal full causal attention:
    # this checks the mask offsets of the chunks against the kept positions
    plain = _ask(tiny, _doc())
    sinks = _ask(tiny, _doc(), kv=kv_cache.Sinks(sink_tokens=120, window_tokens=60))
    assert [c.text for c in sinks] == [c.text for c in plain]


def test_sinks_cut_the_cache_to_sinks_plus_window(tiny):
    plain = _ask(tiny, _doc())
    sinks = _ask(tiny, _doc(), kv=kv_cache.Sinks(sink_tokens=4, window_tokens=32))
    for p, s in zip(plain, sinks, strict=True):
        assert s.kv_bytes_measured == _formula(4 + 32) < p.kv_bytes_measured // 4
        assert s.meta["kv_cache"]["label"] == "sinks-4+32"


def _quantized_bytes(positions: int, bits: int, group: int) -> int:
    """Packed codes + one scale and one zero point (float32) per group of values."""
    values = 2 * LAYERS * KV_HEADS * HEAD_DIM * positions
    return values * bits // 8 + (values // group) * 2 * F32


@pytest.mark.parametrize("bits", [8, 4])
def test_hqq_quantized_cache_shrinks_by_its_bits_plus_the_quantizer_metadata(tiny, bits):
    pytest.importorskip("hqq")
    plain = _ask(tiny, _doc())
    quant = _ask(tiny, _doc(), kv=kv_cache.Quantized(bits=bits, backend="hqq"))
    for p, q in zip(plain, quant, strict=True):
        assert q.meta["kv_cache"]["q_group_size"] == 16  # gcd(64, head dim 16)
        assert q.kv_bytes_measured == _quantized_bytes(q.prompt_tokens, bits, 16)
        assert q.kv_bytes_measured < p.kv_bytes_measured * (bits + 8) / 32 + 1
        assert q.text  # it answers


def test_quanto_quantized_cache_runs_and_shrinks(tiny):
    pytest.importorskip("optimum.quanto")
    plain = _ask(tiny, _doc())
    quant = _ask(tiny, _doc(), kv=kv_cache.Quantized(bits=4, backend="quanto"))
    assert quant[0].meta["kv_cache"]["label"] == "quantized-quanto-int4"
    assert quant[0].kv_bytes_measured < plain[0].kv_bytes_measured / 3


def test_variants_and_plain_requests_in_one_call_are_charged_their_own_time(tiny):
    doc = _doc()
    reqs = [
        GenerationRequest(doc + " w1", prefix=doc, max_new_tokens=4),
        GenerationRequest(doc + " w1", prefix=doc, max_new_tokens=4, kv=kv_cache.Offloaded()),
    ]
    plain, off = tiny.generate(reqs)
    assert plain.text == off.text
    assert off.resource_seconds == pytest.approx(off.prefill_seconds + off.decode_seconds, 1e-3)
    assert "call" in plain.meta and "call" not in off.meta


# ------------------------------------------------------------------------ the embedded model


@pytest.mark.slow
def test_smollm2_kv_variants_measured_against_the_formula():
    from ragbench.models import get_preset

    model = HFModel("smollm2-135m-instruct", device="cpu")
    # calibrated to 1,232 tokens (the suite's longest SmolLM2 request, test_hf's 1k needle: one
    # calibration file serves every such test of a session), not the default 2,048
    model.cost_rates(longest=1232)
    p = get_preset("smollm2-135m-instruct")
    doc = " ".join(["The special magic number is 7463343."] + ["Grass is green."] * 60)
    q = "\n\nWhat is the special magic number mentioned in the text?"

    def run(new_tokens=4, kv=None):
        request = GenerationRequest(doc + q, prefix=doc, max_new_tokens=new_tokens, kv=kv)
        [c] = model.generate([request])
        return c

    plain = run(32)  # SmolLM2 restates the question first
    formula = cost.kv_cache_bytes(p.layers, p.kv_heads, p.head_dim, plain.prompt_tokens, 1, 4)
    assert plain.kv_bytes_measured == formula and "7463343" in plain.text
    sinks = run(kv=kv_cache.Sinks(sink_tokens=4, window_tokens=64))
    assert sinks.kv_bytes_measured == cost.kv_cache_bytes(
        p.layers, p.kv_heads, p.head_dim, 68, 1, 4
    )
    pytest.importorskip("hqq")
    int4 = run(kv=kv_cache.Quantized(bits=4, backend="hqq"))
    assert int4.kv_bytes_measured < formula / 4  # 4-bit codes + float32 scales, zeros per 64


# ------------------------------------------------------------------------ RoPE scaling


def test_rope_parameters_name_the_valid_choices():
    from transformers import LlamaConfig

    from ragbench.llm.hf.load import rope_parameters

    config = LlamaConfig(max_position_embeddings=8192)
    yarn = rope_parameters(config, "yarn", 2)
    assert yarn["rope_type"] == "yarn" and yarn["factor"] == 2.0
    assert yarn["original_max_position_embeddings"] == 8192 and "rope_theta" in yarn
    with pytest.raises(ValueError, match="dynamic"):
        rope_parameters(config, "ntk", 2)
    with pytest.raises(ValueError, match="> 1"):
        rope_parameters(config, "yarn", 0.5)
    with pytest.raises(ValueError, match="yarn-x2"):
        LongContextParams(rope_scaling="yarn")
    assert LongContextParams(rope_scaling="yarn-x2").label() == "long_context rope=yarn-x2"


@pytest.mark.parametrize("scaling", ["yarn", "dynamic"])
def test_rope_scaled_model_runs_past_its_trained_window(tmp_path, scaling):
    from test_hf import _save_tiny

    _save_tiny(tmp_path / "m", chat=True)  # trained window: 256 positions
    model = HFModel(
        str(tmp_path / "m"),
        device="cpu",
        cache_dir=tmp_path,
        rope_scaling=scaling,
        rope_factor=2,
    )
    assert model.context_window == 512
    assert model.model.config.rope_parameters["rope_type"] == scaling
    assert model.identity()["rope_scaling"] == f"{scaling}-x2"
    [c] = _ask(model, _doc(380), tails=(" w1",))
    assert c.prompt_tokens > 256 and c.completion_tokens >= 1
    # the record names the scaling, checked against the loaded model
    ex = Example("e", "w1", ("w2",), (Document("d", _doc(30)),))
    res = Resources(llm=model, max_new_tokens=4)
    record = get_strategy("long_context").run(
        ex, res, LongContextParams(rope_scaling=f"{scaling}-x2")
    )
    assert record.params.rope_scaling == f"{scaling}-x2" and record.error is None
    with pytest.raises(ValueError, match="load-time option"):
        get_strategy("long_context").run(ex, res, LongContextParams())


def test_rope_scaling_and_factor_go_together(tmp_path):
    with pytest.raises(ValueError, match="together"):
        HFModel(str(tmp_path), rope_scaling="yarn")


def test_the_fake_runs_kv_variants_alone_like_the_transformers_backend():
    # a variant reused the plain run's document prefix on the fake only, so notebook 06 on the
    # fake drew every variant six times cheaper than plain long context
    fake = FakeLLM(simulate_kv_cache=True, prefix_cache_size=1)
    doc = "word " * 200
    plain = GenerationRequest(doc + "Q1?", prefix=doc)
    variant = GenerationRequest(doc + "Q2?", prefix=doc, kv=kv_cache.Quantized(bits=4))
    assert [c.cached_prompt_tokens for c in fake.generate([plain, variant])] == [0, 0]
    again = fake.generate([GenerationRequest(doc + "Q3?", prefix=doc)])
    assert again[0].cached_prompt_tokens == 200  # plain requests still share the prefix
