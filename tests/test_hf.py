"""transformers backend: tiny random model built from a config (no download) for the logic;
the embedded SmolLM2 (``slow``) for a real needle and the converted-weight cache."""

from __future__ import annotations

import random
import re
import time

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from ragbench.devices import pick_device  # noqa: E402
from ragbench.llm import shared_prefix  # noqa: E402
from ragbench.llm.base import ContextOverflowError  # noqa: E402
from ragbench.llm.gguf import convert_gguf, file_sha256  # noqa: E402
from ragbench.llm.hf.load import pick_dtype, resolve_model  # noqa: E402
from ragbench.llm.hf.model import HFModel  # noqa: E402
from ragbench.llm.hf.schedule import common_prefix_len, plan_batches, plan_groups  # noqa: E402
from ragbench.types import GenerationRequest  # noqa: E402

WORDS = [f"w{i}" for i in range(120)]
TEMPLATE = (
    "{% for m in messages %}<{{ m.role }}> {{ m.content }} </s> {% endfor %}"
    "{% if add_generation_prompt %}<assistant> {% endif %}"
)


def _save_tiny(folder, *, chat: bool) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    specials = ["<pad>", "</s>", "<unk>", "<system>", "<user>", "<assistant>"]
    vocab = {tok: i for i, tok in enumerate(specials + WORDS)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", eos_token="</s>", unk_token="<unk>"
    )
    if chat:
        fast.chat_template = TEMPLATE
    config = LlamaConfig(
        vocab_size=len(vocab),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        initializer_range=0.2,  # peaked logits: greedy choices are far from ties
        pad_token_id=0,
        eos_token_id=1,
        bos_token_id=None,
    )
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(folder)
    fast.save_pretrained(folder)


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny-chat")
    _save_tiny(folder, chat=True)
    return folder


@pytest.fixture(scope="module")
def tiny(tiny_dir):
    return HFModel(str(tiny_dir), device="cpu", cache_dir=tiny_dir.parent / "cache")


def _text(n: int, seed: int) -> str:
    rng = random.Random(seed)
    return " ".join(rng.choice(WORDS) for _ in range(n))


def _fresh(model: HFModel, **overrides) -> HFModel:
    """A second wrapper around the same weights with other scheduling options."""
    clone = object.__new__(HFModel)
    clone.__dict__.update(model.__dict__)
    clone._prefix_kv = type(model._prefix_kv)()
    clone.__dict__.update(overrides)
    return clone


# -- pure helpers ------------------------------------------------------------------------------


def test_plan_batches_buckets_by_length_within_the_padding_limit():
    # in length order; a row joins while padding stays <= 25% of the batch's positions
    assert plan_batches([50, 10, 12, 48, 11], 8, 0.25) == [[1, 4, 2], [3, 0]]
    assert plan_batches([50, 10, 12, 48, 11], 2, 0.25) == [[1, 4], [2], [3, 0]]
    assert plan_batches([50, 10, 12, 48, 11], 8, 1.0) == [[1, 4, 2, 3, 0]]  # plain chunking
    assert plan_batches([7, 7, 7], 8, 0.0) == [[0, 1, 2]]  # equal lengths never pad
    assert plan_batches([], 8, 0.25) == []


def test_plan_groups_declared_loose_and_alone():
    a = [1, 2, 3, 4, 5, 6]
    groups = plan_groups(
        [a + [7], a + [8], [9, 9, 9], [1, 2, 3, 4, 5, 6, 9, 9], [4, 4], [4, 4, 4]],
        [6, 6, 0, 0, 0, 0],
        min_shared=2,
    )
    assert (6, [0, 1]) in groups  # declared prefix
    assert (1, [4, 5]) in groups  # shares 2 tokens, but [4, 4] must keep one of its own
    assert (0, [2, 3]) in groups  # nothing shared with anyone (3 is not declared)
    assert common_prefix_len([1, 2, 3], [1, 2, 4]) == 2


def test_plan_groups_gives_each_prompt_its_deepest_shared_prefix_within_its_variant():
    pre = [1, 2, 3, 4]  # an instruction every prompt starts with
    a, b = pre + [10, 11, 12, 5], pre + [10, 11, 12, 6]  # two questions on one chunk
    c, d = pre + [20, 7], pre + [30, 8]  # two that share the instruction only
    # a and b share 7 tokens, whoever else is in the call: grouped at 7, not at the 4 all share
    # (one chain under its shortest prefix made a's reuse fall when c joined the call)
    assert plan_groups([a, b], [0, 0], min_shared=2) == [(7, [0, 1])]
    assert plan_groups([a, b, c, d], [0] * 4, min_shared=2) == [(7, [0, 1]), (4, [2, 3])]
    assert plan_groups([a, b, c], [0] * 3, min_shared=2) == [(7, [0, 1]), (0, [2])]
    # a variant's prompts share only with its own: the other variant's twin of a changes nothing
    grouped = plan_groups([a, b, a], [0] * 3, min_shared=2, variants=["rag", "rag", "sr"])
    assert grouped == [(7, [0, 1]), (0, [2])]
    assert plan_groups([a, a], [0, 0], 2, variants=["rag", "sr"]) == [(0, [0, 1])]
    # a declared prefix (a document) is shared across variants
    assert plan_groups([a, b], [6, 6], 2, variants=["lc", "sr"]) == [(6, [0, 1])]


def test_resolve_model_names_choices(tmp_path):
    with pytest.raises(ValueError, match="smollm2-135m-instruct"):
        resolve_model("smolm2")
    assert resolve_model("Qwen/Qwen2.5-7B-Instruct")[0] == "Qwen/Qwen2.5-7B-Instruct"
    with pytest.raises(FileNotFoundError):
        resolve_model(str(tmp_path / "missing.gguf"))
    with pytest.raises(ValueError, match="bfloat16"):
        pick_dtype("bf16", "cpu")
    with pytest.raises(ValueError, match="cuda"):
        pick_device("gpu")
    assert pick_dtype("auto", "cpu") == torch.float32


def test_file_sha256_is_memoised_by_size_and_mtime(tmp_path):
    f = tmp_path / "w.bin"
    f.write_bytes(b"abc")
    first = file_sha256(f, tmp_path)
    assert first == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    f.write_bytes(b"abcd")  # size changes: the memo must not answer
    assert file_sha256(f, tmp_path) != first


# -- tiny random model -------------------------------------------------------------------------


def test_greedy_matches_transformers_generate(tiny):
    prompt = _text(20, 1)
    [c] = tiny.generate([GenerationRequest(prompt, max_new_tokens=12)])
    text, _ = tiny.render(GenerationRequest(prompt))
    ids = torch.tensor([tiny.encode(text)])
    ref = tiny.model.generate(
        ids, attention_mask=torch.ones_like(ids), max_new_tokens=12, do_sample=False, pad_token_id=0
    )
    new = [t for t in ref[0, ids.shape[1] :].tolist() if t != 1]  # generate stops at eos
    assert c.text == tiny.tokenizer.decode(new, skip_special_tokens=True)
    assert c.completion_tokens == ref.shape[1] - ids.shape[1]


def test_left_padded_batch_equals_one_by_one(tiny):
    reqs = [GenerationRequest(_text(n, n), max_new_tokens=10) for n in (3, 17, 40, 8)]
    batched = _fresh(tiny, batch_size=8, max_padding=1.0).generate(reqs)  # one padded batch
    single = [_fresh(tiny, batch_size=1).generate([r])[0] for r in reqs]
    assert [c.text for c in batched] == [c.text for c in single]
    assert len({c.prompt_tokens for c in batched}) == 4  # really different lengths
    assert all(c.meta["batch_size"] == 4 for c in batched)
    # each row computed the padding up to the longest prompt, and the batch reports the total
    longest = max(c.prompt_tokens for c in batched)
    assert [c.padding_tokens for c in batched] == [longest - c.prompt_tokens for c in batched]
    assert batched[0].meta["batch"]["padding_tokens"] == sum(c.padding_tokens for c in batched)
    assert all(c.padding_tokens == 0 for c in single)


def test_prefix_reuse_same_answers_and_cached_counts(tiny):
    doc = _text(60, 7)
    questions = [_text(4, s) for s in (11, 12, 13)]
    reqs = [GenerationRequest(f"{doc} {q}", prefix=doc, max_new_tokens=8) for q in questions]
    plain = [GenerationRequest(r.prompt, max_new_tokens=8) for r in reqs]
    reuse = _fresh(tiny)
    got = reuse.generate(reqs)
    ref = _fresh(tiny, min_shared_prefix=10**9, batch_size=1).generate(plain)
    assert [c.text for c in got] == [c.text for c in ref]
    assert all(c.cached_prompt_tokens == 0 for c in ref)
    shared = (
        len(reuse.encode(reuse.render(reqs[0])[0])) - 4 - 2
    )  # minus question, "</s> <assistant>"
    assert [c.cached_prompt_tokens for c in got] == [0, shared, shared]
    assert got[0].meta["prefix_seconds"] > 0
    # a later call with the same document is served from the kept prefix cache
    again = reuse.generate(
        [GenerationRequest(f"{doc} {_text(3, 99)}", prefix=doc, max_new_tokens=8)]
    )
    assert again[0].cached_prompt_tokens == shared


@pytest.mark.parametrize("q_len", [1, 9])
@pytest.mark.parametrize("threads", [None, 3])
def test_shared_prefix_attention_equals_attention_over_the_whole_sequence(
    monkeypatch, q_len, threads
):
    """One read-only prefix for the batch + per-row masked suffix == full attention per row;
    ``threads=3``: the prefix cut in 3 runs of 12 keys for the threads, plus 1 left over."""
    from transformers.masking_utils import eager_mask, sdpa_mask

    monkeypatch.setattr(shared_prefix, "SCORE_BLOCK_ELEMENTS", 1000)  # forces query chunks
    if threads:
        monkeypatch.setattr(shared_prefix, "MIN_RUN_KEYS", 8)
        monkeypatch.setattr(torch, "get_num_threads", lambda: threads)
    gen = torch.Generator().manual_seed(0)
    batch, heads, kv_heads, dim, plen, slen = 3, 4, 2, 8, 37, 12
    pk, pv = (torch.randn(1, kv_heads, plen, dim, generator=gen) for _ in range(2))
    key, value = (torch.randn(batch, kv_heads, slen, dim, generator=gen) for _ in range(2))
    query = torch.randn(batch, heads, q_len, dim, generator=gen)
    pad = torch.ones(batch, slen, dtype=torch.bool)
    pad[1, :4] = False  # left padding of row 1
    pad[2, :1] = False
    args = dict(batch_size=batch, q_length=q_len, kv_length=slen, q_offset=slen - q_len)
    module = type("Layer", (), {"layer_idx": 0})()
    layer = type("CacheLayer", (), {"keys": pk, "values": pv})()
    prefix = shared_prefix.SharedPrefix(type("Cache", (), {"layers": [layer]})())
    got, _ = shared_prefix.shared_prefix_attention(
        module,
        query,
        key,
        value,
        eager_mask(**args, attention_mask=pad),
        0.3,
        shared_prefix=prefix,
    )
    full_k = torch.cat([pk.expand(batch, -1, -1, -1), key], 2).repeat_interleave(2, 1)
    full_v = torch.cat([pv.expand(batch, -1, -1, -1), value], 2).repeat_interleave(2, 1)
    suffix_mask = sdpa_mask(**args, attention_mask=pad, allow_is_causal_skip=False)
    full_mask = torch.cat([torch.ones(batch, 1, q_len, plen, dtype=torch.bool), suffix_mask], -1)
    ref = torch.nn.functional.scaled_dot_product_attention(
        query, full_k, full_v, attn_mask=full_mask, scale=0.3
    ).transpose(1, 2)
    torch.testing.assert_close(got, ref, atol=1e-5, rtol=1e-5)
    parts = shared_prefix.sequence_parts(torch.get_num_threads(), pk, batch * 2 * q_len)
    assert parts == (3 if threads else 1)  # 2 KV heads: no cut unless threads do not divide
    # no mask given: plain causal over the row's own keys
    nomask, _ = shared_prefix.shared_prefix_attention(
        module, query, key, value, None, 0.3, shared_prefix=prefix
    )
    ones = torch.ones_like(pad)
    causal = sdpa_mask(**args, attention_mask=ones, allow_is_causal_skip=False)
    ref = torch.nn.functional.scaled_dot_product_attention(
        query,
        full_k,
        full_v,
        attn_mask=torch.cat([full_mask[..., :plen], causal], -1),
        scale=0.3,
    ).transpose(1, 2)
    torch.testing.assert_close(nomask, ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("slots", [1, 13])
def test_without_a_prefix_it_is_grouped_attention_under_the_static_paths_mask(slots):
    """No shared prefix: grouped-query attention over the rows' own keys (the static decode
    path's step) equals SDPA over KV heads repeated for their query heads, under an additive 4D
    mask with left padding and unfilled slots (finfo.min, as ``hf/static.py`` writes it); a row
    whose every key is masked with -inf gets zeros, not NaN."""
    gen = torch.Generator().manual_seed(1)
    batch, heads, kv_heads, dim = 4, 6, 2, 8
    key, value = (torch.randn(batch, kv_heads, slots, dim, generator=gen) for _ in range(2))
    query = torch.randn(batch, heads, 1, dim, generator=gen)
    keep = torch.ones(batch, slots, dtype=torch.bool)
    if slots > 1:
        keep[1, :5] = False  # left padding
        keep[:, -3:] = False  # slots not filled yet
        keep[2, 7] = False
    neg = torch.finfo(torch.float32).min
    mask = torch.zeros(batch, 1, 1, slots).masked_fill_(~keep[:, None, None], neg)
    module = type("Layer", (), {"layer_idx": 0})()
    got, _ = shared_prefix.shared_prefix_attention(module, query, key, value, mask, 0.4)
    group = heads // kv_heads
    ref = torch.nn.functional.scaled_dot_product_attention(
        query,
        key.repeat_interleave(group, 1),
        value.repeat_interleave(group, 1),
        attn_mask=keep[:, None, None],
        scale=0.4,
    ).transpose(1, 2)
    torch.testing.assert_close(got, ref, atol=1e-5, rtol=1e-5)
    dead = mask.clone()
    dead[3] = float("-inf")
    got, _ = shared_prefix.shared_prefix_attention(module, query, key, value, dead, 0.4)
    assert torch.equal(got[3], torch.zeros_like(got[3]))
    torch.testing.assert_close(got[:3], ref[:3], atol=1e-5, rtol=1e-5)


def test_shared_prefix_attention_matches_copied_prefix_and_keeps_the_prefix(tiny):
    doc = _text(70, 21)
    questions = [_text(n, s) for n, s in ((3, 31), (9, 32), (5, 33), (1, 34))]
    reqs = [GenerationRequest(f"{doc} {q}", prefix=doc, max_new_tokens=10) for q in questions]
    shared = _fresh(tiny)
    assert shared.shared_prefix_attention  # a Llama config: plain full attention
    copied = _fresh(tiny, shared_prefix_attention=False)
    got, ref = shared.generate(reqs), copied.generate(reqs)
    assert [c.text for c in got] == [c.text for c in ref]
    assert [c.cached_prompt_tokens for c in got] == [c.cached_prompt_tokens for c in ref]
    assert tiny.model.config._attn_implementation == "sdpa"  # restored after the call
    [kept] = shared._prefix_kv.values()  # the stored prefix is read, never extended
    plen = got[1].cached_prompt_tokens
    assert kept.get_seq_length() == plen and kept.layers[0].keys.shape[0] == 1


def test_shared_prefix_attention_is_only_used_for_full_attention_models():
    from transformers import Gemma3TextConfig, LlamaConfig, MistralConfig

    def model(config, backend=True):
        return type("Model", (), {"config": config, "_supports_attention_backend": backend})()

    assert shared_prefix.supported(model(LlamaConfig()))
    assert not shared_prefix.supported(model(LlamaConfig(), backend=False))  # own attention code
    assert not shared_prefix.supported(model(Gemma3TextConfig()))  # sliding-window layers
    assert not shared_prefix.supported(model(MistralConfig(sliding_window=64)))
    from transformers import Gemma3Config

    assert not shared_prefix.supported(model(Gemma3Config()))  # composite: text + vision configs


def test_common_prefix_found_without_declaration(tiny):
    doc = _text(30, 3)
    reqs = [GenerationRequest(f"{doc} {_text(3, s)}", max_new_tokens=6) for s in (1, 2)]
    got = _fresh(tiny, min_shared_prefix=16).generate(reqs)
    ref = _fresh(tiny, min_shared_prefix=10**9).generate(reqs)
    assert [c.text for c in got] == [c.text for c in ref]
    assert got[1].cached_prompt_tokens >= 30 and ref[1].cached_prompt_tokens == 0


def test_a_common_preamble_does_not_push_a_kept_document_out(tiny):
    # plan-order rounds mix strategies: RAG prompts sharing an instruction preamble come between
    # the long-context rounds of one corpus; only declared prefixes are kept across calls
    doc, preamble = _text(60, 5), _text(30, 6)
    model = _fresh(tiny, min_shared_prefix=16)  # prefix_cache_size 1
    first = model.generate(
        [GenerationRequest(f"{doc} {_text(3, 1)}", prefix=doc, max_new_tokens=4)]
    )
    others = model.generate(
        [GenerationRequest(f"{preamble} {_text(5, s)}", max_new_tokens=4) for s in (2, 3)]
    )
    assert others[1].cached_prompt_tokens >= 30  # the preamble was shared within its call
    again = model.generate(
        [GenerationRequest(f"{doc} {_text(3, 4)}", prefix=doc, max_new_tokens=4)]
    )
    assert first[0].cached_prompt_tokens == 0 and again[0].cached_prompt_tokens > 60


def test_stop_strings_cut_the_text(tiny):
    req = GenerationRequest(_text(10, 5), max_new_tokens=12)
    [full] = tiny.generate([req])
    words = full.text.split()
    assert len(words) >= 4, full
    stop = words[3]
    k = words.index(stop)  # first occurrence
    [cut] = tiny.generate([GenerationRequest(req.prompt, max_new_tokens=12, stop=(stop,))])
    assert cut.text.rstrip() == " ".join(words[:k])
    assert cut.finish_reason == "stop" and cut.completion_tokens == k + 1


def test_accounting_fields(tiny):
    req = GenerationRequest(_text(25, 9), max_new_tokens=5, system="be brief")
    [c] = tiny.generate([req])
    assert (
        c.prompt_tokens
        == tiny.prompt_tokens(req)
        > tiny.count_tokens(req.system + " " + req.prompt)
    )
    assert 1 <= c.completion_tokens <= 5
    assert c.finish_reason in {"stop", "length"}
    assert c.prefill_seconds > 0 and c.decode_seconds >= 0
    assert c.peak_memory_bytes and c.peak_memory_bytes > 10 * 2**20
    assert c.model == tiny.name and c.cached_prompt_tokens == 0
    ident = tiny.identity()
    assert (
        re.fullmatch(r"files-sha256:[0-9a-f]{64}", ident["weights"]) and ident["dtype"] == "float32"
    )


def test_batch_rows_share_the_device_time_by_their_own_work(tiny):
    reqs = [GenerationRequest(_text(12, s), max_new_tokens=n) for s, n in ((3, 2), (4, 12))]
    short, long = _fresh(tiny, batch_size=8).generate(reqs)
    assert short.completion_tokens < long.completion_tokens
    assert short.meta["batch"] == long.meta["batch"] and short.meta["batch"]["rows"] == 2
    assert short.prefill_seconds == long.prefill_seconds  # one batched prefill, both waited for it
    # the shares add up to the batch's device time, split by each row's stand-alone estimate
    wall = short.meta["batch"]["seconds"]
    assert short.resource_seconds + long.resource_seconds == pytest.approx(wall, rel=1e-9)
    assert short.meta["call"]["device_seconds"] == pytest.approx(wall, abs=1e-6)
    ratio = [c.resource_seconds / c.meta["alone_seconds_estimate"] for c in (short, long)]
    assert ratio[0] == pytest.approx(ratio[1])  # both save by the same factor
    assert short.resource_seconds < long.resource_seconds
    # latency is what each waited: both queued alike (one batch), the short row stopped earlier
    assert short.queue_seconds == long.queue_seconds
    assert short.latency_seconds < long.latency_seconds


def test_length_buckets_keep_short_prompts_out_of_long_batches(tiny):
    short = [GenerationRequest(_text(4, s), max_new_tokens=3) for s in (1, 2, 3)]
    long = [GenerationRequest(_text(120, s), max_new_tokens=3) for s in (4, 5)]
    out = _fresh(tiny, batch_size=8).generate([short[0], long[0], short[1], long[1], short[2]])
    rows = [c.meta["batch"]["rows"] for c in out]
    assert rows == [3, 2, 3, 2, 3]
    assert {c.meta["batch"]["index"] for c in out} == {0, 1}
    # almost no padding: prompts of one bucket differ by a few template tokens at most
    assert all(c.meta["batch"]["padding_fraction"] <= 0.25 for c in out)
    # the bucket that ran second queued behind the first; the call's shares add to its time
    first = min(out, key=lambda c: c.queue_seconds)
    second = max(out, key=lambda c: c.queue_seconds)
    assert second.queue_seconds >= first.queue_seconds + first.meta["batch"]["seconds"] * 0.9
    device = out[0].meta["call"]["device_seconds"]
    assert sum(c.resource_seconds for c in out) == pytest.approx(device, abs=1e-6)


def test_sampling_is_seeded_and_independent_of_batching(tiny):
    req = GenerationRequest(_text(10, 4), max_new_tokens=10, temperature=1.5)
    a = tiny.generate([req])[0].text
    b = tiny.generate([GenerationRequest(_text(6, 8), max_new_tokens=4), req])[1].text
    greedy = tiny.generate([GenerationRequest(req.prompt, max_new_tokens=10)])[0].text
    assert a == b
    assert a != greedy


def test_context_overflow_counts_the_template(tiny):
    assert tiny.context_window == 256
    template = tiny.prompt_tokens(GenerationRequest("w1")) - 1
    fits = GenerationRequest(_text(256 - 10 - template, 2), max_new_tokens=10)
    assert tiny.prompt_tokens(fits) + 10 == 256
    tiny.generate([fits])
    over = GenerationRequest(_text(256 - 10 - template + 1, 2), max_new_tokens=10)
    with pytest.raises(ContextOverflowError, match="256-token context window"):
        tiny.generate([over])


def test_base_model_uses_plain_prompt(tmp_path):
    _save_tiny(tmp_path, chat=False)
    base = HFModel(str(tmp_path), device="cpu", cache_dir=tmp_path / "cache")
    assert base.instruct is False
    req = GenerationRequest("w1 w2 w3", system="w9")
    assert base.render(req) == ("w9\n\nw1 w2 w3", True)
    assert base.prompt_tokens(req) == 4


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_batch_and_accounting(tiny_dir):
    gpu = HFModel(str(tiny_dir), device="cuda", dtype="float32")
    cpu = HFModel(str(tiny_dir), device="cpu")
    doc = _text(80, 41)
    reqs = [GenerationRequest(_text(n, n), max_new_tokens=8) for n in (5, 30)] + [
        GenerationRequest(f"{doc} {_text(3, s)}", prefix=doc, max_new_tokens=8) for s in (1, 2)
    ]  # the last two share a prefix: shared-prefix attention on the GPU
    got = gpu.generate(reqs)
    assert got[3].cached_prompt_tokens > 80
    assert [c.text for c in got] == [c.text for c in cpu.generate(reqs)]
    assert all(c.meta["device"] == "cuda" and c.peak_memory_bytes > 0 for c in got)


# -- the embedded SmolLM2 ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def smollm2():
    model = HFModel("smollm2-135m-instruct", device="cpu")
    # calibrated to this module's longest request (the 1k needle: under 1,200 prompt tokens + 32
    # new), not to the 2,048 tokens a first call probes to (twice the probing time, for no
    # check); test_kv_*, test_pipeline_models and test_question_gen ask for the same length,
    # so a session's SmolLM2 tests share this one calibration
    model.cost_rates(longest=1232)
    return model


def _haystack(tokens: int, model: HFModel) -> str:
    from ragbench.assets import essays_dir

    text = "\n\n".join(
        p.read_text(encoding="utf-8") for p in sorted(essays_dir().glob("*.txt"))[:3]
    )
    ids = model.encode(text)[:tokens]
    return model.tokenizer.decode(ids)


@pytest.mark.slow
def test_smollm2_finds_needle_at_1k(smollm2):
    hay = _haystack(1000, smollm2)
    cut = hay.rfind(".", 0, len(hay) // 2) + 1
    needle = " The special magic number is 7463343."
    doc = hay[:cut] + needle + hay[cut:]
    q = "What is the special magic number mentioned in the text?"
    [c] = smollm2.generate([GenerationRequest(f"{doc}\n\n{q}", prefix=doc, max_new_tokens=32)])
    assert "7463343" in c.text, c.text
    assert 950 < c.prompt_tokens < 1200 and c.prefill_seconds > 0


@pytest.mark.slow
def test_stop_string_counts_only_after_the_answer_begins(smollm2):
    req = GenerationRequest("q", stop=("\n\n",), max_new_tokens=32)
    ids = smollm2.encode("\n\nParis\n\nThe capital")
    reason, text = smollm2.decoder.finished(req, ids, ids[-1])
    assert (reason, text) == ("stop", "\n\nParis")
    reason, text = smollm2.decoder.finished(req, ids[:1], ids[0])  # only the blank line so far
    assert reason == "" and text.strip() == ""


@pytest.mark.slow
def test_converted_weight_cache_is_used_on_the_second_load(monkeypatch):
    """The second load reads the saved safetensors folder and never dequantises the GGUF again
    (checked by what transformers is asked to load, not by timing; the speed-up is measured
    in benchmarks/llm.py). The test session's cache: its ``converted`` folder is the one every
    SmolLM2 load of the suite fills (the first on a fresh machine dequantises, ~18 s on 2 cores;
    a private folder here dequantised a second time)."""
    from ragbench.assets import cache_dir, smollm2_gguf

    folder = convert_gguf(smollm2_gguf())
    assert folder.parent == cache_dir() / "converted"
    calls = []
    original = transformers.AutoModelForCausalLM.from_pretrained.__func__

    def spy(cls, source, *args, **kwargs):
        calls.append((str(source), kwargs.get("gguf_file")))
        return original(cls, source, *args, **kwargs)

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", classmethod(spy))
    model = HFModel(str(smollm2_gguf()), device="cpu")
    assert calls == [(str(folder), None)]
    assert convert_gguf(smollm2_gguf()) == folder
    assert sorted(p.name for p in folder.glob("*.safetensors")) == ["model.safetensors"]
    assert model.identity()["weights"].startswith("gguf-sha256:")


@pytest.mark.slow
def test_gemma3_base_preset_answers_with_a_plain_prompt():
    model = HFModel("gemma3-270m", device="cpu")
    assert model.context_window == 32_768 and not model.instruct
    doc = "The special magic number is 7463343. " + "The grass is green. The sky is blue. " * 40
    prompt = (
        f"{doc}\nQuestion: What is the special magic number?\nAnswer: The special magic number is"
    )
    # calibrated to this prompt's length, not the default 2,048 tokens a first call would probe
    # to (two minutes of probes for a check of the answer and the prompt)
    model.cost_rates(longest=model.count_tokens(prompt) + 1 + 12)
    [c] = model.generate([GenerationRequest(prompt, max_new_tokens=12, stop=("\n",))])
    assert "7463343" in c.text, c.text
    assert c.prompt_tokens == model.count_tokens(prompt) + 1  # + <bos>, no chat template


def test_runner_counts_kv_bytes_in_the_model_dtype(tiny, tmp_path):
    """The runner passes the model's dtype (float32 on CPU) to the cost columns: 4 bytes/value."""
    from ragbench.experiment.runner import run

    cfg = {
        "name": "t-kv-dtype",
        "dataset": {
            "name": "niah",
            "params": {
                "context_lengths": [120],
                "depth_percents": [50],
                "tokenizer": "whitespace",
                "final_context_length_buffer": 20,
            },
        },
        "model": {"backend": "fake", "name": "fake", "preset": "smollm2-135m-instruct"},
        "strategies": ["closed_book"],
        "output_dir": str(tmp_path),
    }
    df = run(cfg, progress=False, llm=tiny)
    assert tiny.identity()["dtype"] == "float32" and df["error"].isna().all()
    assert (df.kv_bytes_per_value == 4).all()
    positions = df.prompt_tokens + (df.completion_tokens - 1).clip(lower=0)
    assert (df.kv_cache_bytes == 2 * 30 * 3 * 64 * positions * 4).all()


@pytest.mark.slow
def test_smollm2_short_request_in_a_padded_batch_pays_for_its_own_work(smollm2):
    q = "What is the special magic number mentioned in the text?"
    short = GenerationRequest(q, max_new_tokens=8)
    longs = [
        GenerationRequest(f"{_haystack(n, smollm2)}\n\n{q}", max_new_tokens=8) for n in (700, 760)
    ]
    [alone] = _fresh(smollm2).generate([short])
    # one padded batch on purpose (no buckets, and the two long prompts' common start is not
    # split off as a shared prefix): the short row computes ~700 padding positions
    padded = _fresh(smollm2, max_padding=1.0, min_shared_prefix=10**9)
    s, l1, l2 = padded.generate([short, *longs])
    assert s.meta["batch"]["rows"] == 3 and s.padding_tokens > 600
    wall = s.meta["batch"]["seconds"]
    assert s.resource_seconds + l1.resource_seconds + l2.resource_seconds == pytest.approx(wall)
    assert s.resource_seconds < 0.5 * min(l1.resource_seconds, l2.resource_seconds)
    assert s.resource_seconds < 0.6 * wall / 3  # the old even split charged it wall / 3
    # its own work, not its batch mates': every row pays its stand-alone estimate times the
    # same factor (the call's device time over the estimates), the padding waste included. How
    # close that lands to a measured run alone is timing, measured in benchmarks/cost.py.
    factors = [c.resource_seconds / c.meta["alone_seconds_estimate"] for c in (s, l1, l2)]
    assert max(factors) == pytest.approx(min(factors))
    assert s.meta["alone_seconds_estimate"] == pytest.approx(
        alone.meta["alone_seconds_estimate"], rel=0.05
    )  # the short request is estimated the same alone and in the batch


@pytest.mark.slow
def test_smollm2_closed_book_never_costs_more_than_rag_because_of_batching(smollm2):
    hay = _haystack(1000, smollm2)
    q = "What is the special magic number mentioned in the text?"
    cb = GenerationRequest(q, max_new_tokens=16)
    rag = GenerationRequest(f"{_haystack(900, smollm2)}\n\n{q}", max_new_tokens=16)
    lc = GenerationRequest(f"{hay}\n\n{q}", prefix=hay, max_new_tokens=16)
    out = _fresh(smollm2).generate([cb, rag, lc])  # one round, as the runner sends it
    c_cb, c_rag, c_lc = out
    assert c_cb.prompt_tokens < 100 < 800 < c_rag.prompt_tokens
    device = c_cb.meta["call"]["device_seconds"]
    assert sum(c.resource_seconds for c in out) == pytest.approx(device, abs=1e-6)
    factor = c_cb.meta["call"]["batching_factor"]
    for c in out:  # each saves (or pays) by the call's one factor: the order of work is kept
        assert c.resource_seconds / c.meta["alone_seconds_estimate"] == pytest.approx(factor, 1e-3)
    # 16 decode steps after 60 tokens are less work than a 900-token prefill (+ its decode)
    assert c_cb.meta["alone_seconds_estimate"] < c_rag.meta["alone_seconds_estimate"]
    assert c_cb.resource_seconds < c_rag.resource_seconds
    assert c_lc.cached_prompt_tokens == 0 and c_lc.meta["prefix_seconds"] > 0


# --------------------------------------------------------------------------- pickle weights


def _save_bin(model, folder) -> None:
    """``pytorch_model.bin`` as older transformers wrote it: transformers 5 ignores
    ``save_pretrained(safe_serialization=False)`` and writes safetensors, yet still loads .bin."""
    torch.save(model.state_dict(), folder / "pytorch_model.bin")


def _pickled_copy(src, dst):
    """``src`` with its weights in the pickle-based ``.bin`` format only."""
    import shutil

    from transformers import AutoModelForCausalLM

    shutil.copytree(src, dst)
    for file in dst.glob("*.safetensors"):
        file.unlink()
    _save_bin(AutoModelForCausalLM.from_pretrained(src), dst)
    return dst


def _logits(loaded, ids=(6, 7, 8, 9)):
    with torch.no_grad():
        return loaded.model(torch.tensor([list(ids)])).logits


def test_pickle_weights_are_refused_unless_the_config_allows_them(tiny_dir, tmp_path):
    from ragbench.llm.hf.load import load_model

    pickled = _pickled_copy(tiny_dir, tmp_path / "pickled")
    with pytest.raises(ValueError) as info:
        load_model(str(pickled), device="cpu")
    message = str(info.value)
    assert str(pickled) in message and "allow_pickle_weights: true" in message
    assert "\n" not in message
    allowed = load_model(str(pickled), device="cpu", allow_pickle_weights=True)
    safe = load_model(str(tiny_dir), device="cpu")  # safetensors: loaded as before
    assert torch.equal(_logits(allowed), _logits(safe))
    assert allowed.weights.startswith("files-sha256:") and safe.weights != allowed.weights


def test_safetensors_are_preferred_when_both_formats_are_present(tiny_dir, tmp_path):
    import shutil

    from transformers import AutoModelForCausalLM

    from ragbench.llm.hf.load import load_model

    both = tmp_path / "both"
    shutil.copytree(tiny_dir, both)
    other = AutoModelForCausalLM.from_pretrained(tiny_dir)
    with torch.no_grad():
        for p in other.parameters():
            p.add_(1.0)  # the .bin weights differ: which file was read shows in the logits
    _save_bin(other, both)
    safe = load_model(str(tiny_dir), device="cpu")
    for allow in (False, True):
        loaded = load_model(str(both), device="cpu", allow_pickle_weights=allow)
        assert torch.equal(_logits(loaded), _logits(safe))


def test_a_generate_call_calibrates_as_far_as_its_longest_request(tiny_dir, tmp_path, monkeypatch):
    """A model used outside a run (a notebook, the judge) calibrates to the call's longest
    request (at least ``CALL_MIN_LONGEST``: 64 here, the tiny model's window is 256), not a fixed
    2,048 tokens, and a later call that reaches further measures the longer probes; the
    calibration is nobody's latency."""
    from ragbench.llm.hf import model as hf_model

    monkeypatch.setattr(hf_model, "CALL_MIN_LONGEST", 64)
    model = HFModel(str(tiny_dir), device="cpu", cache_dir=tmp_path)
    prompt = _text(10, 1)
    assert model.count_tokens(prompt) + 4 < 64
    t0 = time.perf_counter()
    [short] = model.generate([GenerationRequest(prompt, max_new_tokens=4)])
    took = time.perf_counter() - t0
    assert model.cost_rates().meta["key"]["probed_tokens"] == 64
    assert short.latency_seconds < took / 2  # the first call's calibration is not in its wait
    long_prompt = _text(120, 2)
    need = model.count_tokens(long_prompt) + 8
    assert 64 < need < 256
    model.generate([GenerationRequest(long_prompt, max_new_tokens=8)])
    rates = model.cost_rates()
    assert rates.meta["key"]["probed_tokens"] >= need
    assert rates.meta["reused_from"]  # the 64-token calibration's probes were lent, not retimed
