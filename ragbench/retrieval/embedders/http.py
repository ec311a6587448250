"""Embeddings from an OpenAI-compatible ``/v1/embeddings`` server (``embedder: openai``)."""

from __future__ import annotations

import os

import numpy as np

from ragbench.llm.openai.compat import OpenAICompatLLM
from ragbench.retrieval.embedders.base import Embedder, default_cache_dir


class OpenAIEmbedder(Embedder):
    """Embeddings from an OpenAI-compatible ``/v1/embeddings`` server (vLLM ``--task embed``,
    text-embeddings-inference, a hosted API): for corpora too large to embed on this machine.

    The HTTP client, credentials (never stored: see ``ragbench.secrets``), headers and retry
    policy are the OpenAI-compatible LLM backend's. Vectors go through the same on-disk cache as
    local models, keyed by the model and the endpoint (no credentials), so a rerun sends nothing.
    ``batch_size`` texts per request; ``dim`` is learned from the first reply."""

    def __init__(
        self,
        model: str,
        base_url: str | None = None,
        api_key: str | None = None,
        headers: dict[str, str] | None = None,
        batch_size: int = 64,
        timeout: float = 60.0,
        max_retries: int = 4,
        query_prefix: str = "",
        document_prefix: str = "",
        cache_dir: str | os.PathLike | None = "default",
        sleep=None,
    ) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        cache_dir = default_cache_dir() if cache_dir == "default" else cache_dir
        super().__init__(query_prefix, document_prefix, cache_dir)
        extra = {"sleep": sleep} if sleep is not None else {}
        self.client = OpenAICompatLLM(
            model=model,
            base_url=base_url,
            api_key=api_key,
            headers=headers,
            timeout=timeout,
            max_retries=max_retries,
            **extra,
        )
        self.model, self.batch_size, self._dim = model, batch_size, 0
        self.requests = 0

    @property
    def dim(self) -> int:
        if not self._dim:  # what the cache holds, else one short text to the server
            cached = self.cache.dim() if self.cache is not None else None
            self._dim = cached or self._embed(["dimension"], "", "document").shape[1]
        return self._dim

    @property
    def model_identity(self) -> str:
        return f"openai-embeddings:{self.model}@{self.client.base_url}"

    def _encode(self, texts: list[str]) -> np.ndarray:
        rows = []
        for start in range(0, len(texts), self.batch_size):
            batch = texts[start : start + self.batch_size]
            reply = self.client.post_json("embeddings", {"model": self.model, "input": batch})
            self.requests += 1
            data = sorted(reply.get("data", []), key=lambda d: d.get("index", 0))
            if len(data) != len(batch):
                raise ValueError(
                    f"{self.client.base_url}/embeddings returned {len(data)} vectors for "
                    f"{len(batch)} texts"
                )
            rows += [d["embedding"] for d in data]
        vectors = np.asarray(rows, dtype=np.float32)
        self._dim = self._dim or vectors.shape[1]
        return vectors
