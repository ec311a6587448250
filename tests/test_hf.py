"""transformers backend: tiny random model built from a config (no download) for the logic;
the embedded SmolLM2 (``slow``) for a real needle and the converted-weight cache."""

from __future__ import annotations

import random
import re

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from ragbench.llm.base import ContextOverflowError  # noqa: E402
from ragbench.llm.gguf import convert_gguf, file_sha256  # noqa: E402
from ragbench.llm.hf import (  # noqa: E402
    HFModel,
    common_prefix_len,
    pick_device,
    pick_dtype,
    plan_groups,
    resolve_model,
)
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
    batched = _fresh(tiny, batch_size=8).generate(reqs)
    single = [_fresh(tiny, batch_size=1).generate([r])[0] for r in reqs]
    assert [c.text for c in batched] == [c.text for c in single]
    assert len({c.prompt_tokens for c in batched}) == 4  # really different lengths
    assert all(c.meta["batch_size"] == 4 for c in batched)


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


def test_common_prefix_found_without_declaration(tiny):
    doc = _text(30, 3)
    reqs = [GenerationRequest(f"{doc} {_text(3, s)}", max_new_tokens=6) for s in (1, 2)]
    got = _fresh(tiny, min_shared_prefix=16).generate(reqs)
    ref = _fresh(tiny, min_shared_prefix=10**9).generate(reqs)
    assert [c.text for c in got] == [c.text for c in ref]
    assert got[1].cached_prompt_tokens >= 30 and ref[1].cached_prompt_tokens == 0


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
    reqs = [GenerationRequest(_text(n, n), max_new_tokens=8) for n in (5, 30)]
    got = gpu.generate(reqs)
    assert [c.text for c in got] == [c.text for c in cpu.generate(reqs)]
    assert all(c.meta["device"] == "cuda" and c.peak_memory_bytes > 0 for c in got)


# -- the embedded SmolLM2 ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def smollm2():
    return HFModel("smollm2-135m-instruct", device="cpu")


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
def test_converted_weight_cache_is_used_on_the_second_load(tmp_path, monkeypatch):
    """The second load reads the saved safetensors folder and never dequantises the GGUF again
    (checked by what transformers is asked to load, not by timing; the speed-up is measured
    in benchmarks/llm.py)."""
    from ragbench.assets import smollm2_gguf

    folder = convert_gguf(smollm2_gguf(), tmp_path)
    calls = []
    original = transformers.AutoModelForCausalLM.from_pretrained.__func__

    def spy(cls, source, *args, **kwargs):
        calls.append((str(source), kwargs.get("gguf_file")))
        return original(cls, source, *args, **kwargs)

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", classmethod(spy))
    model = HFModel(str(smollm2_gguf()), device="cpu", cache_dir=tmp_path)
    assert calls == [(str(folder), None)]
    assert convert_gguf(smollm2_gguf(), tmp_path) == folder
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
    [c] = model.generate([GenerationRequest(prompt, max_new_tokens=12, stop=("\n",))])
    assert "7463343" in c.text, c.text
    assert c.prompt_tokens == model.count_tokens(prompt) + 1  # + <bos>, no chat template
