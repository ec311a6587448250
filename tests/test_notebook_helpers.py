"""Notebook set-up helpers: the model section from the backend's capabilities, and the RoPE runs
past the trained window."""

from __future__ import annotations

import pytest

from ragbench.strategies.params import LongContextParams
from ragbench.workspace.notebook import model_block, rope_runs


def test_rope_runs_open_the_window_then_scale_on_transformers_only():
    hf, _ = model_block("hf", "smollm2-135m-instruct")
    (plain, plain_strategy), (scaled, named) = rope_runs(hf, [8192, 16384], "dynamic", 2.0)
    assert plain["params"] == {"context_window": 16384 + 512} and plain_strategy == "long_context"
    assert scaled["params"] == {"rope_scaling": "dynamic", "rope_factor": 2.0}
    # the record names what the model was loaded with (check_rope compares the two)
    assert LongContextParams(**named["params"]).label() == "long_context rope=dynamic-x2"
    assert hf["params"] == {}  # the notebook's own model section is left alone
    fake, _ = model_block("fake", "fake")
    [(only, _)] = rope_runs(fake, [600])
    assert only["params"]["context_window"] == 1112 and "rope_scaling" not in only["params"]


def test_model_block_reads_the_backends_capabilities_not_their_names():
    from ragbench.llm import backend_capabilities

    fake, counter = model_block("fake", "fake")
    assert fake["preset"] == "smollm2-135m-instruct" and counter == "whitespace"
    assert fake["params"] == {"simulate_kv_cache": True}
    server, counter = model_block("openai", "served", base_url="http://h:8000/v1")
    assert server["preset"] is None and counter == "served"
    assert server["params"] == {"base_url": "http://h:8000/v1"}
    assert (
        backend_capabilities("hf").rescales_rope and not backend_capabilities("fake").rescales_rope
    )
    with pytest.raises(ValueError, match="unknown LLM backend 'hff'; did you mean 'hf'"):
        model_block("hff", "x")
