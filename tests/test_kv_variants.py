"""KV-cache variants as classes (``ragbench.llm.kv.variants``): each request and parameter point
carries one variant, yet writes the legacy flat form (``kv_cache``, ``kv_bits``, ...) byte for
byte, so completion-cache keys and config hashes of existing runs are unchanged; and a new
variant is one class plus one registry line."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import ClassVar  # module level: dataclass reads the toy's string annotations here

import pytest

from ragbench.llm.fake import FakeLLM
from ragbench.llm.kv import variants as kv_cache
from ragbench.strategies import get_strategy
from ragbench.strategies.base import Resources
from ragbench.strategies.params import LongContextParams
from ragbench.types import Document, Example, GenerationRequest


def _example() -> Example:
    doc = Document("d", "One of the special magic numbers for quiet-lake is: 4817263.")
    return Example("e1", "What is the special magic number for quiet-lake?", ("4817263",), (doc,))


# every variant's legacy flat form, written out literally: the completion-cache keys and the
# config hashes / work keys of existing runs hash exactly these dicts
LEGACY = [
    (kv_cache.Plain(), {}, {}),
    (kv_cache.Offloaded(), {"kv_cache": "offloaded"}, {"kv_cache": "offloaded"}),
    (
        kv_cache.Sinks(),
        {"kv_cache": "sinks"},
        {"kv_cache": "sinks", "sink_tokens": 4, "window_tokens": 1024},
    ),
    (
        kv_cache.Sinks(sink_tokens=2, window_tokens=16),
        {"kv_cache": "sinks", "sink_tokens": 2, "window_tokens": 16},
        {"kv_cache": "sinks", "sink_tokens": 2, "window_tokens": 16},
    ),
    (
        kv_cache.Quantized(bits=4),
        {"kv_cache": "quantized", "kv_bits": 4},
        {"kv_cache": "quantized", "kv_bits": 4, "kv_backend": "hqq"},
    ),
    (
        kv_cache.Quantized(bits=4, backend="quanto"),
        {"kv_cache": "quantized", "kv_bits": 4, "kv_backend": "quanto"},
        {"kv_cache": "quantized", "kv_bits": 4, "kv_backend": "quanto"},
    ),
    (
        kv_cache.SnapKV(),
        {"kv_cache": "snapkv"},
        {"kv_cache": "snapkv", "kv_ratio": 0.5, "kv_window": 32},
    ),
    (
        kv_cache.SnapKV(ratio=1, window=16),
        {"kv_cache": "snapkv", "kv_ratio": 1, "kv_window": 16},
        {"kv_cache": "snapkv", "kv_ratio": 1, "kv_window": 16},
    ),
]


@pytest.mark.parametrize(("kv", "yaml", "flat"), LEGACY, ids=lambda v: str(v)[:40])
def test_to_dict_is_byte_identical_to_the_legacy_flat_form(kv, yaml, flat):
    """``flat``: the request's non-default legacy fields, as the 7-field request wrote them; a
    plain request has no KV key at all. The params' dict has all 7 keys with the defaults of the
    variant filled in (and no ``preload`` unless set)."""
    request = GenerationRequest("p", max_new_tokens=8, prefix="", id="r", kv=kv)
    want = {
        "prompt": "p",
        "max_new_tokens": 8,
        "temperature": 0.0,
        "stop": [],
        "prefix": "",
        "system": "",
        "id": "r",
        **flat,
    }
    assert json.dumps(request.to_dict()) == json.dumps(want)  # key order too
    assert request.to_json() == json.dumps(want, sort_keys=True, separators=(",", ":"))
    assert kv_cache.request_from_dict(request.to_dict()) == request
    params = LongContextParams.from_dict(yaml)
    legacy = {
        "overflow": "error",
        "kv_cache": "plain",
        "kv_bits": None,
        "kv_backend": None,
        "sink_tokens": None,
        "window_tokens": None,
        "kv_ratio": None,
        "kv_window": None,
        "rope_scaling": None,
    }
    assert json.dumps(params.to_dict()) == json.dumps(legacy | flat)
    assert params.kv == kv and params.label() == " ".join(
        ["long_context", *([f"kv={kv.label()}"] if flat else [])]
    )
    assert LongContextParams.from_dict(params.to_dict()) == params


def test_a_new_variant_is_one_class_and_one_registry_line(monkeypatch):
    @dataclass(frozen=True)
    class Halved(kv_cache.KVVariant):
        """A toy: keeps every other position (never built here)."""

        stride: int = 2

        name: ClassVar[str] = "halved"
        flat: ClassVar[dict[str, str]] = {"stride": "kv_stride"}

        def __post_init__(self) -> None:
            if self.stride < 2:
                raise ValueError(f"kv_cache=halved needs kv_stride >= 2, got {self.stride!r}")

        def label(self) -> str:
            return f"halved-{self.stride}"

    monkeypatch.setitem(kv_cache.KV_CACHES._entries, "halved", Halved)  # undone after the test
    assert "halved" in list(kv_cache.KV_CACHES)
    # the strategy parameters (flat YAML keys) validate, label and record it
    params = LongContextParams(kv_cache="halved")
    assert params.kv == Halved() and params.label() == "long_context kv=halved-2"
    assert params.to_dict()["kv_cache"] == "halved"
    with pytest.raises(ValueError, match="long_context: kv_bits and kv_backend apply"):
        LongContextParams(kv_cache="halved", kv_bits=4)
    # a request carries it; its flat form names its own parameters
    request = GenerationRequest("p", kv=Halved(stride=4))
    assert request.to_dict()["kv_cache"] == "halved" and request.to_dict()["kv_stride"] == 4
    assert kv_cache.kv_from_fields("halved", kv_stride=4) == Halved(stride=4)
    with pytest.raises(ValueError, match="kv_stride >= 2"):
        kv_cache.kv_from_fields("halved", kv_stride=1)
    with pytest.raises(ValueError, match="kv_stride apply to kv_cache=halved only"):
        kv_cache.kv_from_fields("sinks", kv_stride=4)
    # the long-context strategy sends it; backends without variants refuse it by name
    seen: list[GenerationRequest] = []
    llm = FakeLLM(answer_fn=lambda r: seen.append(r) or "4817263", simulate_kv_cache=True)
    record = get_strategy("long_context").run(_example(), Resources(llm=llm), params)
    assert seen[0].kv == Halved() and record.to_dict()["params"]["kv_cache"] == "halved"
    with pytest.raises(ValueError, match="fake backend cannot run kv_cache='halved'"):
        FakeLLM().generate([request])
