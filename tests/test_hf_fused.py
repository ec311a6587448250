"""The CPU decode path (``hf/fused.py``), the default on the CPU: its steps give the plain loop's
logits bit for bit in float32 (one row, padded batches, a shared or a copied prefix, rows that
finish early, sampling), in bf16 too where both run on the packed weights; what cannot take it
runs the plain loop and says why; the calibration times its decode steps on it and names it."""

from __future__ import annotations

import dataclasses

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from test_hf import WORDS, _save_tiny, _text  # noqa: E402

from ragbench.llm import calibration, cpu_linear  # noqa: E402
from ragbench.llm.hf.decode import Decoder, choose_path  # noqa: E402
from ragbench.llm.hf.fused import FusedDecode, model_reason  # noqa: E402
from ragbench.llm.hf.model import HFModel  # noqa: E402
from ragbench.llm.hf.static import FastDecode  # noqa: E402
from ragbench.llm.kv import variants as kv_cache  # noqa: E402
from ragbench.types import GenerationRequest  # noqa: E402


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny-fused")
    _save_tiny(path, chat=True)
    return path


@pytest.fixture(scope="module")
def pair(folder):
    """The same tiny model loaded twice: the plain loop and the default (fused) path."""
    cache = folder.parent / "cache-fused"
    eager = HFModel(str(folder), device="cpu", decode="eager", cache_dir=cache)
    fused = HFModel(str(folder), device="cpu", cache_dir=cache)
    return eager, fused


def _requests() -> list[GenerationRequest]:
    """Prompts of different lengths (left padding), different max_new_tokens (rows finish at
    different steps), stop strings, and three questions on one declared document."""
    doc = " ".join(WORDS[:70])
    out = [
        GenerationRequest(_text(3 + 7 * i, i), max_new_tokens=4 + 5 * i, stop=("w7",) * (i % 2))
        for i in range(4)
    ]
    out += [
        GenerationRequest(f"{doc} {_text(2 + s, s)}", prefix=doc, max_new_tokens=6 + 4 * s)
        for s in range(3)
    ]
    return out


def _decode(model: HFModel, requests, record: int, shared: bool = True):
    """Rows of ``Decoder.decode`` on the requests' prompts (their document as the prefix when
    they have one), with the logits of the first ``record`` tokens."""
    ids = [model.encode(*model.render(r)) for r in requests]
    plen = 0
    prefix = None
    with torch.inference_mode():
        if requests[0].prefix:
            text, special = model.render(requests[0])
            plen = model._declared_prefix(requests[0], text, special, ids[0])
            prefix, _ = model.decoder.prefill(ids[0][:plen])
        return model.decoder.decode(
            requests, [i[plen:] for i in ids], prefix, plen, shared, 0, record_logits=record
        )


def _bitwise(a: list[dict], b: list[dict]) -> None:
    for x, y in zip(a, b, strict=True):
        assert (x["text"], x["finish_reason"], x["completion_tokens"]) == (
            y["text"],
            y["finish_reason"],
            y["completion_tokens"],
        )
        assert len(x["_logits"]) == len(y["_logits"]) > 0
        for p, q in zip(x["_logits"], y["_logits"], strict=True):
            assert torch.equal(p, q)  # bit for bit, not merely close


@pytest.fixture(params=[1, 2], ids=["1-thread", "2-threads"])
def threads(request):
    """torch on 1 and 2 threads: fp32's one-row calls take the packed weights on 2 or more
    (``cpu_linear.min_rows``), the transposed gemv on one."""
    before = torch.get_num_threads()
    torch.set_num_threads(request.param)
    yield request.param
    torch.set_num_threads(before)


@pytest.mark.parametrize(
    ("rows", "shared"),
    [(slice(0, 1), True), (slice(0, 4), True), (slice(4, 7), True), (slice(4, 7), False)],
    ids=["one-row", "padded-batch", "shared-prefix", "copied-prefix"],
)
def test_fused_steps_give_the_plain_loops_logits_bit_for_bit(pair, rows, shared, threads):
    eager, fused = pair
    requests = _requests()[rows]
    record = max(r.max_new_tokens for r in requests)  # every step of every row
    plain, got = _decode(eager, requests, record, shared), _decode(fused, requests, record, shared)
    _bitwise(plain, got)
    assert {r["meta"]["decode"]["path"] for r in got} == {"fused"}
    assert {r["meta"]["decode"]["path"] for r in plain} == {"eager"}
    # rows finished at different steps: the batch shrank on the fused path as on the plain one
    assert len({r["completion_tokens"] for r in got}) > 1 or len(requests) == 1


def test_fused_is_the_default_on_the_cpu_and_answers_as_generate(pair):
    eager, fused = pair
    assert isinstance(fused.decoder.fast, FusedDecode) and fused.decoder.fast.on
    layers = fused.model.config.num_hidden_layers
    assert len(fused.decoder.groups) == 2 * layers  # q/k/v and gate/up side by side (fp32 CPU)
    requests = _requests()
    plain, got = eager.generate(requests), fused.generate(requests)
    assert [(c.text, c.completion_tokens) for c in got] == [
        (c.text, c.completion_tokens) for c in plain
    ]
    assert {c.meta["decode"]["path"] for c in got} == {"fused"}
    assert got[-1].cached_prompt_tokens > 0  # the document's prefix KV was reused
    # transformers' own generate, one prompt: the same tokens
    text, special = fused.render(requests[3])
    ids = torch.tensor([fused.encode(text, special)])
    ref = fused.model.generate(
        ids, attention_mask=torch.ones_like(ids), max_new_tokens=19, do_sample=False, pad_token_id=0
    )
    new = [t for t in ref[0, ids.shape[1] :].tolist() if t != 1]
    [alone] = fused.generate([dataclasses.replace(requests[3], max_new_tokens=19, stop=())])
    assert alone.text == fused.tokenizer.decode(new, skip_special_tokens=True)


def test_sampling_runs_fused_with_the_same_seeded_samples(pair):
    eager, fused = pair
    hot = [GenerationRequest(_text(9, s), max_new_tokens=8, temperature=0.8) for s in range(3)]
    plain, got = eager.generate(hot), fused.generate(hot)
    assert [c.text for c in got] == [c.text for c in plain]
    assert {c.meta["decode"]["path"] for c in got} == {"fused"}


def test_what_cannot_take_the_fused_path_runs_the_plain_loop_and_says_why(pair):
    eager, fused = pair
    prompt = " ".join(WORDS[:20])
    sinks = kv_cache.Sinks(sink_tokens=2, window_tokens=8)
    [row] = fused.generate([GenerationRequest(prompt, max_new_tokens=4, kv=sinks)])
    assert row.meta["decode"]["path"] == "eager" and row.meta["decode"]["reason"].startswith(
        "kv sinks"
    )
    [plain] = eager.generate([GenerationRequest(prompt, max_new_tokens=4, kv=sinks)])
    assert plain.text == row.text
    model, cpu = fused.model, torch.device("cpu")
    assert model_reason(model, cpu) == ""
    assert "CPU path" in model_reason(model, torch.device("cuda"))
    model.config._attn_implementation = "flash_attention_2"
    try:
        assert "attention 'flash_attention_2'" in model_reason(model, cpu)
    finally:
        model.config._attn_implementation = "sdpa"
    model.config.model_type = "gemma3_text"
    try:
        assert "architecture 'gemma3_text'" in model_reason(model, cpu)
        # auto then takes FastDecode's choice (the plain loop); fused, asked for, says why not
        assert isinstance(choose_path(model, cpu, "auto", True), FastDecode)
        off = choose_path(model, cpu, "fused", True)
        assert not off.on and off.step_timer is None and "gemma3_text" in off.why_not([], None)
    finally:
        model.config.model_type = "llama"
    assert isinstance(choose_path(model, torch.device("cuda"), "auto", True), FastDecode)
    with pytest.raises(ValueError, match="unknown decode 'fast'.*fused"):
        choose_path(model, cpu, "fast", True)


def test_calibration_names_the_fused_path_and_times_its_decode_steps(pair, monkeypatch):
    eager, fused = pair
    assert calibration.decode_path(fused.decoder) == "fused"
    assert calibration.decode_path(eager.decoder) == "eager"
    key = calibration.calibration_key(fused.decoder, "w")
    assert key["decode_path"] == "fused" and key["dtype"] == "float32"
    timed: list[tuple] = []
    real = fused.decoder.fast.time_step

    def spy(dec, cache, mask, positions, extra, tokens):
        timed.append((tuple(mask.shape), "shared_prefix" in extra))
        return real(dec, cache, mask, positions, extra, tokens)

    monkeypatch.setattr(fused.decoder.fast, "time_step", spy)
    gen = torch.Generator().manual_seed(0)
    with torch.inference_mode():
        seconds = calibration._forward(fused.decoder, gen, {}, (1, 40, 1, False))
        shared = calibration._forward(fused.decoder, gen, {}, (1, 40, 4, True))
        prefill = calibration._forward(fused.decoder, gen, {}, (16, 0, 1, False))
    assert seconds > 0 and shared > 0 and prefill > 0
    assert timed == [((1, 40), False), ((4, 1), True)]  # decode probes only, on the fused step


@pytest.mark.skipif(not cpu_linear.available(torch.bfloat16), reason="no oneDNN bf16 here")
def test_bf16_packs_every_decode_call_and_fused_matches_the_plain_loop(folder):
    cache = folder.parent / "cache-fused-bf16"
    eager = HFModel(str(folder), device="cpu", dtype="bfloat16", decode="eager", cache_dir=cache)
    fused = HFModel(str(folder), device="cpu", dtype="bfloat16", cache_dir=cache)
    assert fused.decoder.packed is not None and fused.identity()["dtype"] == "bfloat16"
    requests = _requests()[:4]
    before = fused.decoder.packed.packed_calls
    _bitwise(_decode(eager, requests, 6), _decode(fused, requests, 6))
    assert fused.decoder.packed.packed_calls > before
    key = calibration.calibration_key(fused.decoder, "w")
    assert key["dtype"] == "bfloat16" and key["packed_linear"] and key["decode_path"] == "fused"


def test_decoder_for_model_takes_the_decode_modes(pair):
    _, fused = pair
    dec = Decoder.for_model(fused.model, fused.tokenizer, decode="eager")
    assert isinstance(dec.fast, FastDecode) and not dec.fast.static
    dec = Decoder.for_model(fused.model, fused.tokenizer, decode="fused")
    assert isinstance(dec.fast, FusedDecode) and dec.fast.on


@pytest.mark.slow
def test_smollm2_fused_answers_are_the_plain_loops():
    """The embedded model, a few prompts: the default path's tokens are the plain loop's."""
    eager = HFModel("smollm2-135m-instruct", device="cpu", decode="eager")
    fused = HFModel("smollm2-135m-instruct", device="cpu")
    prompts = [
        "What is the capital of France?",
        "Name three prime numbers.",
        "Write one sentence about the sea.",
    ]
    requests = [GenerationRequest(p, max_new_tokens=24) for p in prompts]
    # each path calibrated to these short requests, not to the 2,048 tokens a bare first call
    # probes to: the check is the tokens, and the eager path's calibration is this test's alone
    longest = max(eager.prompt_tokens(r) for r in requests) + 24
    eager.cost_rates(longest), fused.cost_rates(longest)
    _bitwise(_decode(eager, requests[:1], 24), _decode(fused, requests[:1], 24))
    plain, got = eager.generate(requests), fused.generate(requests)
    assert [c.text for c in got] == [c.text for c in plain]
    assert all(c.completion_tokens > 3 for c in got)
