"""SnapKV compression of the prompt's KV cache (``ragbench.llm.kv.snapkv``): validation and
labels, the scores against eager attention weights, the compressed decode against an
independent masked reference, measured bytes, and the embedded SmolLM2 (``slow``)."""

from __future__ import annotations

import pytest

from ragbench import cost
from ragbench.llm.kv import snapkv as kv_compress
from ragbench.llm.kv import variants as kv_cache
from ragbench.strategies.params import LongContextParams
from ragbench.types import GenerationRequest

# tiny model of tests/test_hf.py: 2 layers, 4 query heads over 2 KV heads, head dim 16, float32
LAYERS, KV_HEADS, HEAD_DIM, F32 = 2, 2, 16, 4


def _formula(positions: int) -> int:
    return cost.kv_cache_bytes(LAYERS, KV_HEADS, HEAD_DIM, positions, 1, F32)


# ------------------------------------------------------------------------ pure


@pytest.mark.parametrize("ratio", [0, -0.5, 1.5, True, "0.5", None])
def test_bad_ratios_are_refused_with_the_valid_range(ratio):
    with pytest.raises(ValueError, match=r"kv snapkv needs ratio in \(0, 1\]"):
        kv_cache.SnapKV(ratio=ratio, window=32)
    with pytest.raises(ValueError, match=r"long_context: .*ratio in \(0, 1\]"):
        LongContextParams(kv={"name": "snapkv", "ratio": ratio if ratio is not None else 2})


def test_snapkv_choices_are_validated_and_kept_apart():
    with pytest.raises(ValueError, match="kv snapkv needs window >= 1"):
        kv_cache.SnapKV(ratio=0.5, window=0)
    with pytest.raises(ValueError, match="kv sinks has no parameter 'ratio'"):
        kv_cache.kv_from_spec({"name": "sinks", "sink_tokens": 4, "ratio": 0.5})
    with pytest.raises(ValueError, match="snapkv"):
        kv_cache.kv_from_spec("snap")  # the valid choices are named


def test_long_context_params_fill_snapkv_defaults_label_and_send_them():
    p = LongContextParams(kv="snapkv")
    assert (p.kv.ratio, p.kv.window) == (0.5, 32)
    assert p.label() == "long_context kv=snapkv-0.5-w32"
    assert LongContextParams.from_dict(p.to_dict()) == p
    # the record's params name what ran
    assert p.to_dict()["kv"] == {"name": "snapkv", "ratio": 0.5, "window": 32}
    kv = LongContextParams(kv={"name": "snapkv", "ratio": 0.25, "window": 16}).kv
    assert kv == kv_cache.SnapKV(ratio=0.25, window=16) and kv.label() == "snapkv-0.25-w16"
    request = GenerationRequest("p", kv=kv)
    assert request.to_dict()["kv"] == {"name": "snapkv", "ratio": 0.25, "window": 16}
    assert "kv" not in GenerationRequest("p").to_dict()  # plain cache keys unchanged


def test_kept_positions_are_the_ratio_of_the_prefix_plus_the_window():
    assert kv_compress.kept(1032, 0.5, 32) == 500 + 32
    assert kv_compress.kept(1032, 1.0, 32) == 1032
    assert kv_compress.kept(100, 0.3, 32) == 21 + 32  # ceil(20.4)
    assert kv_compress.kept(20, 0.5, 32) == 20  # within the window: everything


def test_other_backends_refuse_snapkv_by_name():
    from ragbench.llm.fake import FakeLLM
    from ragbench.llm.openai.compat import OpenAICompatLLM

    request = GenerationRequest("p", kv=kv_cache.SnapKV(ratio=0.5, window=32))
    server = OpenAICompatLLM(model="m", base_url="http://127.0.0.1:9/v1")
    with pytest.raises(ValueError, match=r"OpenAI-compatible backend cannot run kv 'snapkv'"):
        server._generate([request])
    with pytest.raises(ValueError, match=r"fake backend cannot run kv 'snapkv'.*'hf'"):
        FakeLLM().generate([request])


# ------------------------------------------------------------------------ the tiny model

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from test_kv_techniques import _doc  # noqa: E402 (the tiny model: conftest)

from ragbench.llm.hf.model import HFModel  # noqa: E402


def _ask(model, doc, tails=(" w1 w2", " w3"), new_tokens=6, kv=None):
    reqs = [GenerationRequest(doc + t, prefix=doc, max_new_tokens=new_tokens, kv=kv) for t in tails]
    return model.generate(reqs)


def test_scores_are_the_window_rows_of_the_eager_attention_weights(tiny):
    """Recomputed window queries (q_proj + RoPE) against the cached keys give the attention
    weights eager attention returns, summed over the window and averaged over each group."""
    from transformers import AutoModelForCausalLM, DynamicCache

    eager = AutoModelForCausalLM.from_pretrained(
        tiny.model.name_or_path, attn_implementation="eager", dtype=torch.float32
    )
    ids = torch.tensor([tiny.encode(_doc(60))])
    seen = {}
    attn = eager.model.layers[1].self_attn
    handle = attn.register_forward_hook(lambda m, a, kw, out: seen.update(kw), with_kwargs=True)
    cache = DynamicCache(config=eager.config)
    w, n = 8, ids.shape[1]
    with torch.inference_mode():
        out = eager(input_ids=ids, cache=cache, use_cache=True, output_attentions=True)
        hidden, rope = seen["hidden_states"], seen["position_embeddings"]
        queries = kv_compress.window_queries(attn, hidden, rope, w)
    handle.remove()
    got = kv_compress.scores(queries, cache.layers[1].keys, attn.scaling, kernel=1)
    weights = out.attentions[1][0, :, -w:, : n - w].sum(-2)  # (heads, positions)
    want = weights.view(KV_HEADS, 2, n - w).mean(1)
    torch.testing.assert_close(got[0], want, rtol=1e-4, atol=1e-5)
    pooled = kv_compress.scores(queries, cache.layers[1].keys, attn.scaling)
    assert pooled.shape == got.shape  # the pool keeps one score per position


def test_ratio_one_gives_the_plain_answers_and_bytes(tiny):
    plain = _ask(tiny, _doc())
    full = _ask(tiny, _doc(), kv=kv_cache.SnapKV(ratio=1.0, window=32))
    assert [c.text for c in full] == [c.text for c in plain]
    assert [c.kv_bytes_measured for c in full] == [c.kv_bytes_measured for c in plain]
    assert full[0].meta["kv_cache"]["kept_positions"] == full[0].prompt_tokens


def test_half_ratio_keeps_half_the_prefix_plus_the_window(tiny):
    plain = _ask(tiny, _doc())
    half = _ask(tiny, _doc(), kv=kv_cache.SnapKV(ratio=0.5, window=32))
    for p, h in zip(plain, half, strict=True):
        n = h.prompt_tokens
        assert h.kv_bytes_measured == _formula(kv_compress.kept(n, 0.5, 32))
        half_plus_window = p.kv_bytes_measured * (0.5 + 16 / n)  # (n - 32) / 2 + 32 positions
        assert h.kv_bytes_measured == pytest.approx(half_plus_window, abs=_formula(1))  # ceil
        meta = h.meta["kv_cache"]
        assert meta["label"] == "snapkv-0.5-w32" and meta["prompt_positions"] == n
        assert meta["kept_positions"] == kv_compress.kept(n, 0.5, 32)
        assert h.cached_prompt_tokens == 0 and h.completion_tokens >= 1  # per question


def test_compressed_decode_equals_masking_the_dropped_positions(tiny, monkeypatch):
    """Force the same dropped positions in every head: decoding on the compressed cache must
    give the tokens of a plain cache whose attention mask hides those positions, with new
    tokens at their true positions (the full prompt length onwards)."""
    from transformers import DynamicCache

    doc, tail = _doc(), " w1 w2"
    [request] = [GenerationRequest(doc + tail, prefix=doc, max_new_tokens=8)]
    ids = tiny.encode(*tiny.render(request))
    n, w, dropped = len(ids), 16, list(range(30, 90))

    def fixed(queries, keys, scaling, kernel=kv_compress.POOL_KERNEL):
        score = torch.ones(keys.shape[0], keys.shape[1], keys.shape[2] - queries.shape[2])
        score[..., dropped] = 0
        return score

    monkeypatch.setattr(kv_compress, "scores", fixed)
    ratio = (n - w - len(dropped)) / (n - w)
    [snap] = tiny.generate(
        [GenerationRequest(doc + tail, prefix=doc, max_new_tokens=8, kv=kv_cache.SnapKV(ratio, w))]
    )
    assert snap.meta["kv_cache"]["kept_positions"] == n - len(dropped)
    model, out = tiny.model, []
    with torch.inference_mode():
        cache = DynamicCache(config=model.config)
        logits = model(input_ids=torch.tensor([ids]), cache=cache, use_cache=True).logits
        for t in range(snap.completion_tokens):
            out.append(int(logits[0, -1].argmax()))
            mask = torch.ones(1, n + t + 1, dtype=torch.long)
            mask[0, dropped] = 0
            logits = model(
                input_ids=torch.tensor([[out[-1]]]),
                attention_mask=mask,
                position_ids=torch.tensor([[n + t]]),
                cache=cache,
                use_cache=True,
            ).logits
    reference = tiny.tokenizer.decode(out, skip_special_tokens=True)
    assert snap.text.strip() == reference.strip()[: len(snap.text.strip())]
    assert snap.text.strip()


# ------------------------------------------------------------------------ the embedded model


@pytest.mark.slow
def test_smollm2_snapkv_halves_the_prefix_and_keeps_the_essay_needle():
    """A 1k-token needle in Paul Graham essays at 50% depth: ratio 1 is the plain run, ratio 0.5
    measures ``kept`` positions of KV and still answers. (Measured, not asserted: on a synthetic
    "Grass is green." x 60 haystack a 7-digit number lost its digits after the first at 0.5;
    the question's window scores the number's start, and each later digit is read by the
    decode steps' own queries.)"""
    from ragbench.datasets.niah import build
    from ragbench.models import get_preset
    from ragbench.strategies import get_strategy
    from ragbench.strategies.base import Resources

    model = HFModel("smollm2-135m-instruct", device="cpu")
    # calibrated to 1,232 tokens (the suite's longest SmolLM2 request, test_hf's 1k needle: one
    # calibration file serves every such test of a session), not the default 2,048
    model.cost_rates(longest=1232)
    p = get_preset("smollm2-135m-instruct")
    [example] = build(context_lengths=[1024], depth_percents=[50], tokenizer=model.name)
    res = Resources(llm=model, max_new_tokens=32)

    def run(**kv):
        return get_strategy("long_context").run(example, res, LongContextParams(**kv))

    plain = run()
    full = run(kv={"name": "snapkv", "ratio": 1.0})
    half = run(kv={"name": "snapkv", "ratio": 0.5})
    assert full.prediction == plain.prediction and plain.scores["string_match_all"] == 1.0
    assert full.cost.kv_bytes_measured == plain.cost.kv_bytes_measured
    n = half.cost.prompt_tokens
    kept = kv_compress.kept(n, 0.5, 32)
    assert half.cost.kv_bytes_measured == cost.kv_cache_bytes(
        p.layers, p.kv_heads, p.head_dim, kept, 1, 4
    )
    assert half.cost.kv_bytes_measured < 0.55 * plain.cost.kv_bytes_measured
    assert half.params.label() == "long_context kv=snapkv-0.5-w32"
    assert half.scores["string_match_all"] == 1.0
