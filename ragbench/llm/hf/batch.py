"""transformers backend: one padded batch after its prefill (``Batch``) and what a decode path
returns for it (``Decoded``).

The contract between ``Decoder`` (``hf/decode.py``: the prefill, the plain loop) and the decode
paths it hands a batch to (``hf/static.py``, ``hf/fused.py``), kept apart so that the paths need
not import the decoder that imports them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from ragbench.llm.cpu_linear import PackedLinears
from ragbench.types import GenerationRequest

if TYPE_CHECKING:
    import torch
    from transformers import Cache, PreTrainedModel


@dataclass
class Batch:
    """What a decode path continues from: the rows, the prefill's cache and its last logits."""

    requests: list[GenerationRequest]
    gens: list[
        torch.Generator | None
    ]  # per row: its seeded torch.Generator (temperature > 0), else None
    logits: torch.Tensor | None  # (rows, vocab): the prefill's last position; each row's first
    # token (None: the calibration's probe, which only steps)
    cache: Cache  # the prefill's cache (a DynamicCache, or a KV-cache variant's)
    mask: (
        torch.Tensor
    )  # (rows, positions in the cache): 1 where a row has a token (left padding: 0)
    positions: (
        torch.Tensor
    )  # (rows, width): the suffix's position ids (they continue after a prefix)
    extra: dict[str, object]  # forward keywords of every pass (``shared_prefix``)
    t_first: float  # the prefill's end: the first token's time
    record: int = 0  # keep the logits of each row's first ``record`` tokens


@dataclass
class Decoded:
    """A batch decoded: each row's tokens and how it ended."""

    generated: list[list[int]]  # per row: its tokens, the stopping one included
    done: dict[int, dict[str, Any]]  # row -> {"text", "finish_reason", "t": when it stopped}
    now: float  # the decode's end (the batch's device time ends here)
    meta: dict[str, object] | None = None  # ``meta["decode"]`` of the path that ran (None: plain)
    probes: list[list[torch.Tensor]] = field(
        default_factory=list
    )  # per row: recorded logits (host)


class Engine(Protocol):
    """A decode path's step over one batch (``Decoder.drive`` runs it): ``step(tokens)`` returns
    the next logits (rows, vocab), ``keep(rows)`` drops the other rows."""

    def step(self, tokens: torch.Tensor) -> torch.Tensor: ...

    def keep(self, rows: list[int]) -> None: ...


class Stepper(Protocol):
    """``hf/decode.py``'s ``Decoder`` as the decode paths use it (a Protocol: the decoder
    imports them)."""

    @property
    def model(self) -> PreTrainedModel: ...

    @property
    def device(self) -> torch.device: ...

    @property
    def pad_id(self) -> int: ...

    @property
    def cache_kw(self) -> str: ...

    @property
    def packed(self) -> PackedLinears | None: ...

    @property
    def groups(self) -> dict: ...

    def now(self) -> float: ...

    def pick(
        self,
        logits: torch.Tensor,
        requests: Sequence[GenerationRequest],
        gens: Sequence[torch.Generator | None],
    ) -> torch.Tensor: ...

    def finished(
        self, request: GenerationRequest, tokens: list[int], last: int
    ) -> tuple[str, str]: ...

    def drive(self, batch: Batch, engine: Engine) -> Decoded: ...
