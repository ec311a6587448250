import dataclasses
import json
import subprocess
import sys

import pytest

from ragbench.cost.accounting import Cost
from ragbench.experiment.results import record_from_dict
from ragbench.strategies import RagParams
from ragbench.types import (
    Chunk,
    Completion,
    Document,
    Example,
    GenerationRequest,
    Record,
    ScoredChunk,
    join_documents,
)


def _example() -> Example:
    docs = (
        Document("d0", "Alpha text.", title="A", meta={"k": [1, 2]}),
        Document("d1", "Beta ünïcode."),
    )
    return Example(
        id="ex-1",
        question="What?",
        answers=("x", "y"),
        documents=docs,
        meta={"evidence": [["d1", 0, 4]], "depth": 50.0, "nested": {"a": None}},
    )


@pytest.mark.parametrize(
    "obj",
    [
        _example(),
        Chunk("d0#0", "d0", "Alpha", 0, 5, {"i": 0}),
        ScoredChunk(Chunk("d0#0", "d0", "Alpha", 0, 5), 0.25),
        GenerationRequest("doc\nq", max_new_tokens=8, stop=("\n",), prefix="doc\n", id="r"),
        Completion(
            "ans", 10, 2, cached_prompt_tokens=4, prefill_seconds=0.5, peak_memory_bytes=None
        ),
        Record("ex-1", "rag", RagParams(top_k=3), "x", ("x",), {"em": 1.0}, Cost(dollars=0.001)),
    ],
)
def test_json_round_trip_is_exact(obj):
    text = obj.to_json()
    if isinstance(obj, Record):  # typed params and cost come back where records are read
        back = record_from_dict(json.loads(text))
    else:
        back = type(obj).from_json(text)
    assert back == obj
    assert back.to_json() == text


def test_a_core_record_keeps_params_and_cost_as_json_objects():
    record = Record("ex-1", "rag", RagParams(top_k=3), "x", cost=Cost(dollars=0.001))
    plain = Record.from_json(record.to_json())
    assert plain.params == dataclasses.asdict(RagParams(top_k=3)) and plain.cost["dollars"] == 0.001
    assert record_from_dict(plain.to_dict()) == record


def test_frozen_and_evidence():
    ex = _example()
    with pytest.raises(AttributeError):
        ex.id = "other"  # type: ignore[misc]
    assert ex.evidence == [("d1", 0, 4)]
    assert ex.context == join_documents(ex.documents) == "A\nAlpha text.\n\nBeta ünïcode."


def test_unknown_field_is_rejected_with_valid_names():
    data = json.loads(_example().to_json())
    data["questoin"] = "typo"
    with pytest.raises(ValueError, match="questoin.*valid"):
        Example.from_dict(data)


def test_request_prefix_must_prefix_prompt():
    with pytest.raises(ValueError, match="prefix"):
        GenerationRequest("question only", prefix="document")
    with pytest.raises(ValueError, match="max_new_tokens"):
        GenerationRequest("q", max_new_tokens=0)


def test_import_ragbench_is_light():
    code = (
        "import sys, ragbench, ragbench.cli, ragbench.llm, ragbench.datasets, ragbench.retrieval;"
        "heavy=[m for m in ('torch','transformers','faiss','sentence_transformers','llama_index')"
        " if m in sys.modules]; print(','.join(heavy))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""
