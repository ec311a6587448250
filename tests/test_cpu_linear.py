"""Packed linear weights for CPU decode steps (``ragbench/llm/cpu_linear.py``)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from test_hf import _fresh, _text

from ragbench.llm import cpu_linear
from ragbench.llm.cpu_linear import PackedLinears
from ragbench.types import GenerationRequest

pytestmark = pytest.mark.skipif(not cpu_linear.available(), reason="no oneDNN in this torch")


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.a = torch.nn.Linear(48, 96, bias=True)
        self.b = torch.nn.Linear(96, 40, bias=False)
        for p in self.parameters():
            p.data = torch.randn(p.shape, generator=g)

    def forward(self, x):
        return self.b(torch.relu(self.a(x)))


@pytest.fixture(params=[1, 2], ids=["1-thread", "2-threads"])
def threads(request):
    before = torch.get_num_threads()
    torch.set_num_threads(request.param)
    yield request.param
    torch.set_num_threads(before)


@pytest.mark.parametrize("shape", [(1, 48), (5, 48), (2, 7, 48), (300, 48)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_packed_forward_equals_f_linear_and_packs_only_decode_sized_inputs(shape, dtype, threads):
    if not cpu_linear.available(dtype):
        pytest.skip(f"oneDNN does not run {dtype} here")
    net = Net().to(dtype)
    x = torch.randn(shape, generator=torch.Generator().manual_seed(1)).to(dtype)
    ref = net(x)
    packed = PackedLinears(net)
    with packed.active():
        got = net(x)
    rows = x.numel() // x.shape[-1]
    if dtype == torch.float32:
        torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-4)
    else:  # bf16 rounds each layer's output: compare at its precision
        torch.testing.assert_close(got.float(), ref.float(), rtol=2e-2, atol=0.5)
    low = cpu_linear.min_rows(dtype)
    # bf16: one row pays too; fp32 from one row where torch runs threads (MKL's gemv does not)
    assert low == (3 if dtype == torch.float32 and threads == 1 else 1)
    assert (packed.packed_calls > 0) == (low <= rows <= cpu_linear.MAX_ROWS)
    assert "forward" not in vars(net.a) and "forward" not in vars(net.b)  # restored


def test_a_weight_changed_in_place_is_packed_again():
    net = Net()
    x = torch.randn(6, 48)
    packed = PackedLinears(net)
    with packed.active():
        before = net(x)
        with torch.no_grad():
            net.b.weight.mul_(2.0)
        after = net(x)
    torch.testing.assert_close(after, 2 * before, rtol=1e-5, atol=1e-4)


def test_auto_packs_only_fp32_and_bf16_cpu_models_within_the_limit(monkeypatch):
    net = Net()
    assert PackedLinears.auto(net, "cpu", torch.float32, None) is not None
    assert PackedLinears.auto(net, "cpu", torch.float32, False) is None
    bf16 = PackedLinears.auto(Net().to(torch.bfloat16), "cpu", torch.bfloat16, None)
    assert (bf16 is not None) == cpu_linear.available(torch.bfloat16)
    assert PackedLinears.auto(Net().half(), "cpu", torch.float16, True) is None  # not packed
    assert PackedLinears.auto(net, "cuda", torch.float32, True) is None
    monkeypatch.setattr(cpu_linear, "AUTO_LIMIT_BYTES", 1000)
    assert PackedLinears.auto(net, "cpu", torch.float32, None) is None  # too big for auto
    assert PackedLinears.auto(net, "cpu", torch.float32, True) is not None  # asked for


def test_subclasses_of_linear_keep_their_own_forward():
    class Scaled(torch.nn.Linear):
        def forward(self, x):
            return 3 * super().forward(x)

    net = torch.nn.Sequential(Scaled(8, 8), torch.nn.Linear(8, 8))
    assert cpu_linear.linears(net) == [net[1]]


def test_batched_decode_on_packed_weights_gives_the_unpacked_answers(tiny):
    doc = _text(50, 3)
    reqs = [
        GenerationRequest(f"{doc} {_text(5, s)}", prefix=doc, max_new_tokens=10) for s in range(6)
    ]
    assert tiny.decoder.packed is not None  # auto: fp32 on the CPU
    packed = _fresh(tiny, batch_size=8)
    plain = _fresh(tiny, batch_size=8, decoder=dataclasses.replace(tiny.decoder, packed=None))
    before = tiny.decoder.packed.packed_calls
    got, ref = packed.generate(reqs), plain.generate(reqs)
    assert tiny.decoder.packed.packed_calls > before  # the 6-row decode steps ran packed
    assert [c.text for c in got] == [c.text for c in ref]
    assert all(c.completion_tokens > 1 for c in got)


def _tiny_llama(dtype=torch.float32):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    return LlamaForCausalLM(config).to(dtype).eval()


def test_transposed_weights_keep_their_values_and_siblings_share_one_storage():
    model = _tiny_llama()
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    x = torch.randint(0, 64, (2, 7))
    with torch.no_grad():
        ref = model(x).logits
    groups = cpu_linear.transpose_weights(model, torch.device("cpu"), torch.float32)
    for name, p in model.named_parameters():
        assert torch.equal(p, before[name]), name  # the same values, in another layout
    for module in cpu_linear.linears(model):
        assert module.weight.stride(0) == 1  # stored in x out: an output's weights are a column
    assert len(groups) == 2 * 2  # q/k/v and gate/up of each layer
    layer = model.model.layers[0]
    qkv = cpu_linear.group_of(groups, layer.self_attn, cpu_linear.GROUPS[0])
    assert qkv.sizes == (32, 16, 16)
    storage = qkv.weight.untyped_storage().data_ptr()
    for name in ("q_proj", "k_proj", "v_proj"):  # views of the one storage: no copy kept
        assert getattr(layer.self_attn, name).weight.untyped_storage().data_ptr() == storage
    h = torch.randn(1, 32)
    apart = torch.cat(
        [layer.self_attn.q_proj(h), layer.self_attn.k_proj(h), layer.self_attn.v_proj(h)], -1
    )
    assert torch.equal(torch.nn.functional.linear(h, qkv.weight), apart)  # bit for bit
    with torch.no_grad():
        torch.testing.assert_close(model(x).logits, ref, rtol=1e-5, atol=1e-5)
    # the embedding is tied to the output layer: it reads the transposed storage too
    assert model.model.embed_tokens.weight.data_ptr() == model.lm_head.weight.data_ptr()


def test_weights_are_transposed_only_in_fp32_on_the_cpu():
    for dtype, device in ((torch.bfloat16, "cpu"), (torch.float32, "cuda")):
        model = _tiny_llama(dtype)
        assert cpu_linear.transpose_weights(model, torch.device(device), dtype) == {}
        assert all(m.weight.is_contiguous() for m in cpu_linear.linears(model))
