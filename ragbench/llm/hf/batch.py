"""transformers backend: one padded batch after its prefill (``Batch``) and what a decode path
returns for it (``Decoded``).

The contract between ``Decoder`` (``hf/decode.py``: the prefill, the plain loop) and the decode
paths it hands a batch to (``hf/static.py``, ``hf/fused.py``), kept apart so that the paths need
not import the decoder that imports them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ragbench.types import GenerationRequest


@dataclass
class Batch:
    """What a decode path continues from: the rows, the prefill's cache and its last logits."""

    requests: list[GenerationRequest]
    gens: list[Any]  # per row: its seeded torch.Generator (temperature > 0), else None
    logits: Any  # (rows, vocab): the prefill's last position; each row's first token
    cache: Any  # the prefill's cache (a DynamicCache, or a KV-cache variant's)
    mask: Any  # (rows, positions in the cache): 1 where a row has a token (left padding: 0)
    positions: Any  # (rows, width): the suffix's position ids (they continue after a prefix)
    extra: dict[str, Any]  # forward keywords of every pass (``shared_prefix``)
    t_first: float  # the prefill's end: the first token's time
    record: int = 0  # keep the logits of each row's first ``record`` tokens


@dataclass
class Decoded:
    """A batch decoded: each row's tokens and how it ended."""

    generated: list[list[int]]  # per row: its tokens, the stopping one included
    done: dict[int, dict[str, Any]]  # row -> {"text", "finish_reason", "t": when it stopped}
    now: float  # the decode's end (the batch's device time ends here)
    meta: dict[str, Any] | None = None  # ``meta["decode"]`` of the path that ran (None: plain)
    probes: list[list[Any]] = field(default_factory=list)  # per row: recorded logits (host)
