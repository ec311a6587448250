"""KV-cache variants as classes (``ragbench.llm.kv.variants``): each request and parameter point
carries one variant, stored nested as its ``spec()`` (``{"name": ..., <parameter>: ...}``, every
parameter with the class's defaults filled in), written the same way in YAML (``kv: {name:
sinks, sink_tokens: 4}``); a new variant is one class plus one registry line."""

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


# every variant's stored form, written out literally: completion-cache keys, work keys and
# records store exactly these dicts (schema 2: ragbench.schema)
SPECS = [
    (kv_cache.Plain(), "plain", {"name": "plain"}),
    (kv_cache.Offloaded(), {"name": "offloaded"}, {"name": "offloaded"}),
    (kv_cache.Sinks(), "sinks", {"name": "sinks", "sink_tokens": 4, "window_tokens": 1024}),
    (
        kv_cache.Sinks(sink_tokens=2, window_tokens=16),
        {"name": "sinks", "sink_tokens": 2, "window_tokens": 16},
        {"name": "sinks", "sink_tokens": 2, "window_tokens": 16},
    ),
    (
        kv_cache.Quantized(bits=4),
        {"name": "quantized", "bits": 4},
        {"name": "quantized", "bits": 4, "backend": "hqq"},
    ),
    (
        kv_cache.Quantized(bits=4, backend="quanto"),
        {"name": "quantized", "bits": 4, "backend": "quanto"},
        {"name": "quantized", "bits": 4, "backend": "quanto"},
    ),
    (kv_cache.SnapKV(), {"name": "snapkv"}, {"name": "snapkv", "ratio": 0.5, "window": 32}),
    (
        kv_cache.SnapKV(ratio=1, window=16),
        {"name": "snapkv", "ratio": 1, "window": 16},
        {"name": "snapkv", "ratio": 1, "window": 16},
    ),
]


@pytest.mark.parametrize(("kv", "yaml", "spec"), SPECS, ids=lambda v: str(v)[:40])
def test_a_variant_is_stored_nested_as_its_spec(kv, yaml, spec):
    """A plain request has no KV key at all (its completion-cache key does not depend on the
    variants); any other names its variant's spec under ``kv``. The params store ``kv`` always."""
    request = GenerationRequest("p", max_new_tokens=8, prefix="", id="r", kv=kv)
    want = {
        "prompt": "p",
        "max_new_tokens": 8,
        "temperature": 0.0,
        "stop": [],
        "prefix": "",
        "system": "",
        "id": "r",
        **({"kv": spec} if kv.name != "plain" else {}),
    }
    assert json.dumps(request.to_dict()) == json.dumps(want)  # key order too
    assert kv.spec() == spec and kv_cache.kv_from_spec(spec) == kv == kv_cache.kv_from_spec(yaml)
    params = LongContextParams.from_dict({"kv": yaml})
    stored = {"overflow": "error", "kv": spec, "rope_scaling": None, "preload": False, "cot": False}
    assert json.dumps(params.to_dict()) == json.dumps(stored)
    assert params.kv == kv and params.label() == " ".join(
        ["long_context", *([f"kv={kv.label()}"] if kv.name != "plain" else [])]
    )
    assert LongContextParams.from_dict(params.to_dict()) == params


def test_kv_keys_are_checked_against_the_variant():
    with pytest.raises(
        ValueError, match=r"unknown long_context parameter 'kv_bits'; .*valid: .*kv"
    ):
        LongContextParams.from_dict({"kv_bits": 4})  # the variant's parameters nest under kv
    with pytest.raises(ValueError, match="kv sinks has no parameter 'bits'; valid: sink_tokens"):
        LongContextParams.from_dict({"kv": {"name": "sinks", "bits": 4}})


def test_a_new_variant_is_one_class_and_one_registry_line(monkeypatch):
    @dataclass(frozen=True)
    class Halved(kv_cache.KVVariant):
        """A toy: keeps every other position (never built here)."""

        stride: int = 2

        name: ClassVar[str] = "halved"

        def __post_init__(self) -> None:
            if self.stride < 2:
                raise ValueError(f"kv halved needs stride >= 2, got {self.stride!r}")

        def label(self) -> str:
            return f"halved-{self.stride}"

    monkeypatch.setitem(kv_cache.KV_CACHES._entries, "halved", Halved)  # undone after the test
    assert "halved" in list(kv_cache.KV_CACHES)
    # the strategy parameters (nested YAML: kv: {name: halved, stride: 4}) validate, label and
    # record it, with the parameters the class declares and nothing else
    params = LongContextParams(kv="halved")
    assert params.kv == Halved() and params.label() == "long_context kv=halved-2"
    assert params.to_dict()["kv"] == {"name": "halved", "stride": 2}
    assert LongContextParams.from_dict({"kv": {"name": "halved", "stride": 4}}).kv == Halved(4)
    with pytest.raises(ValueError, match="long_context: kv halved has no parameter 'bits'"):
        LongContextParams(kv={"name": "halved", "bits": 4})
    with pytest.raises(ValueError, match="long_context: kv halved needs stride >= 2"):
        LongContextParams(kv={"name": "halved", "stride": 1})
    # a request carries it, stored as its spec
    request = GenerationRequest("p", kv=Halved(stride=4))
    assert request.to_dict()["kv"] == {"name": "halved", "stride": 4}
    # the long-context strategy sends it; backends without variants refuse it by name
    seen: list[GenerationRequest] = []
    llm = FakeLLM(answer_fn=lambda r: seen.append(r) or "4817263", simulate_kv_cache=True)
    record = get_strategy("long_context").run(_example(), Resources(llm=llm), params)
    assert seen[0].kv == Halved() and record.to_dict()["params"]["kv"]["name"] == "halved"
    with pytest.raises(ValueError, match="fake backend cannot run kv 'halved'"):
        FakeLLM().generate([request])


def test_a_config_names_only_variants_its_backend_keeps(tmp_path):
    from test_runner import niah_config

    from ragbench.experiment.config.run import load_config
    from ragbench.experiment.config.text import ConfigError

    cfg = niah_config(
        tmp_path, strategies=[{"name": "long_context", "params": {"kv": ["plain", "sinks"]}}]
    )
    with pytest.raises(
        ConfigError, match=r"strategies.0.params.kv: the fake backend cannot run kv 'sinks'"
    ):
        load_config(cfg)
    cfg["model"]["params"] = {"simulate_kv_cache": True}  # the fake simulates them when asked
    assert len(load_config(cfg).points) == 2
    cfg["model"] = {"backend": "hf", "name": "smollm2-135m-instruct"}  # runs them
    assert len(load_config(cfg).points) == 2
    cfg["model"] = {"backend": "openai", "name": "m", "params": {"base_url": "http://h:1/v1"}}
    with pytest.raises(ConfigError, match=r"the openai backend cannot run kv 'sinks'"):
        load_config(cfg)
