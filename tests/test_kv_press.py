"""The press base (``ragbench.llm.kv.press``): a new press is its ``kept`` and ``score`` only;
the base keeps each head's top-scored positions, counts the positions seen and, for a press
that compresses after the prefill, hooks the attention modules."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import pytest

from ragbench.llm.kv.press import Press, keep_top, press_cache, press_layer_class

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")


@dataclass(frozen=True)
class EveryOther(Press):
    """Keep the even positions, after every pass (a test press: its score, nothing else)."""

    name: ClassVar[str] = "every-other"
    every_pass: ClassVar[bool] = True

    def kept(self, positions):
        return (positions + 1) // 2

    def score(self, keys, values, seen):
        even = torch.arange(keys.shape[-2]) % 2 == 0
        return even.float().expand(*keys.shape[:-1])


@dataclass(frozen=True)
class LoudestKeys(Press):
    """Keep the ``ratio`` of the prompt's positions whose keys have the largest norm, once
    after the prefill (reads what the attention module saw, to check the hook passes it)."""

    ratio: float = 0.5

    name: ClassVar[str] = "loudest"

    def kept(self, positions):
        return max(1, int(positions * self.ratio))

    def score(self, keys, values, seen):
        assert seen is not None and seen.hidden.shape[1] == keys.shape[-2]
        return keys.norm(dim=-1)


def test_keep_top_keeps_each_heads_best_positions_in_order():
    k = torch.arange(12.0).view(1, 2, 6, 1)
    score = torch.tensor([[[0, 5, 1, 4, 2, 3], [9, 0, 0, 0, 0, 8]]])
    kept, _ = keep_top(k, k, score, 2)
    assert kept.flatten().tolist() == [1, 3, 6, 11]


def test_a_press_defined_by_its_score_alone_runs_through_the_base_layer():
    layer = press_layer_class()(EveryOther())
    k = torch.arange(10.0).view(1, 1, 10, 1)
    full, _ = layer.update(k, k)
    assert full.flatten().tolist() == list(range(10))  # this pass sees everything
    assert layer.keys.flatten().tolist() == [0, 2, 4, 6, 8]
    assert layer.get_seq_length() == 10 and layer.get_mask_sizes(1) == (6, 5)
    layer.update(torch.tensor([[[[10.0]]]]), torch.tensor([[[[10.0]]]]))
    assert layer.keys.flatten().tolist() == [0, 4, 8]  # 6 stored: every other again
    assert layer.get_seq_length() == 11
    with pytest.raises(NotImplementedError, match="kv every-other cache has dropped positions"):
        layer.crop(1)


def test_a_prefill_press_is_hooked_and_keeps_its_top_scores(tiny):
    from transformers import DynamicCache

    model = tiny.model
    ids = torch.tensor([tiny.encode("one two three four five six seven eight nine ten")])
    n, meta = ids.shape[1], {}
    with torch.inference_mode():
        plain = DynamicCache(config=model.config)
        model(input_ids=ids, cache=plain, use_cache=True)
        pressed = press_cache(LoudestKeys(), model, meta)
        model(input_ids=ids, cache=pressed, use_cache=True)
    keep = n // 2
    assert meta == {"prompt_positions": n, "kept_positions": keep}
    for full, layer in zip(plain.layers, pressed.layers, strict=True):
        index = full.keys.norm(dim=-1).topk(keep, dim=-1).indices.sort(dim=-1).values
        want = full.keys.gather(2, index[..., None].expand(-1, -1, -1, full.keys.shape[-1]))
        torch.testing.assert_close(layer.keys, want)
        assert layer.compressed and layer.get_seq_length() == n
