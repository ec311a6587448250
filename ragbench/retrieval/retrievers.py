"""Retrievers over a list of chunks: dense (FAISS), BM25 (bm25s), hybrid (RRF) and reranking.

``Retriever`` is a template method (as in llama-index-core): the public ``retrieve(queries, k)``
validates the batch (a string instead of a list, an empty query and ``k < 1`` are errors; ``k``
larger than the corpus is clamped), times the call and counts queries, then calls the subclass's
``_retrieve(queries, k)``. Every retriever returns, per query, ``min(k, len(chunks))``
``ScoredChunk``s best first, higher score = better. ``to_run`` exports results to the BEIR/TREC
shape ``{qid: {chunk_id: score}}`` that ``ragbench.retrieval.metrics`` (and ranx) evaluate.

Ties are broken by corpus position (the order of ``chunks``) wherever this module sorts, so
results are deterministic. Retrievers by name and options: ``ragbench.retrieval.build``.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np

from ragbench.devices import pick_device
from ragbench.llm.hf.load import PICKLE_OPTION, refuse_pickle_weights
from ragbench.registry import unknown
from ragbench.retrieval.embedders.base import check_texts, get_embedder
from ragbench.retrieval.faiss_index import FaissIndex, IndexCompatibilityError
from ragbench.types import Chunk, ScoredChunk

BM25_METHODS = ("lucene", "robertson", "atire", "bm25l", "bm25+")


class Retriever(ABC):
    """Base class: subclasses call ``super().__init__(chunks)`` and implement ``_retrieve``.

    ``embeds`` declares whether the retriever reads the run's embedder (``retrieval.embedder``):
    True (dense, hybrid), False (none: the run loads no embedder for it and its parameters name
    none, ``build.needs_embedder``), None (as the retriever it wraps: rerank's ``base``)."""

    name = "retriever"
    embeds: ClassVar[bool | None] = True

    def __init__(self, chunks: Sequence[Chunk]) -> None:
        self.chunks = check_chunks(chunks)
        self.position = {c.id: i for i, c in enumerate(self.chunks)}
        self.seconds = 0.0  # total time spent in retrieve()
        self.num_queries = 0  # total queries answered

    def retrieve(self, queries: Sequence[str], k: int) -> list[list[ScoredChunk]]:
        """Top-``k`` chunks for each query, best first (``k`` is clamped to the corpus size)."""
        queries = check_queries(queries)
        if isinstance(k, bool) or not isinstance(k, int | np.integer) or k < 1:
            raise ValueError(f"k must be an integer >= 1, got {k!r}")
        if not queries:
            return []
        k = min(int(k), len(self.chunks))
        start = time.perf_counter()
        results = self._retrieve(queries, k)
        self.seconds += time.perf_counter() - start
        self.num_queries += len(queries)
        return results

    @abstractmethod
    def _retrieve(self, queries: list[str], k: int) -> list[list[ScoredChunk]]:
        """``queries`` are validated and non-empty; ``1 <= k <= len(self.chunks)``."""

    def _top(self, scores: np.ndarray, k: int) -> list[ScoredChunk]:
        """The ``k`` best of one score per chunk, ties by corpus position (stable sort)."""
        order = np.argsort(-scores, kind="stable")[:k]
        return [ScoredChunk(self.chunks[i], float(scores[i])) for i in order]

    def __repr__(self) -> str:
        return f"{type(self).__name__}({len(self.chunks)} chunks)"


def check_chunks(chunks: Sequence[Chunk]) -> list[Chunk]:
    chunks = list(chunks)
    if not chunks:
        raise ValueError("cannot build a retriever over an empty corpus: no chunks given")
    seen: set[str] = set()
    for i, chunk in enumerate(chunks):
        if not isinstance(chunk, Chunk):
            raise TypeError(f"chunk at position {i} is {type(chunk).__name__}, expected Chunk")
        if chunk.id in seen:
            raise ValueError(f"duplicate chunk id {chunk.id!r} at position {i}")
        seen.add(chunk.id)
    return chunks


def check_queries(queries: Sequence[str]) -> list[str]:
    return check_texts(queries, "query")


class DenseRetriever(Retriever):
    """Embed chunks with ``embedder.embed_documents`` into a FAISS index; queries with
    ``embed_queries``. Scores are inner products of L2-normalised vectors (cosine).

    Pass a loaded ``index`` (``FaissIndex.load``) to skip embedding the chunks; it must hold one
    vector per chunk, in chunk order, built with this embedder.
    """

    name = "dense"

    def __init__(self, chunks: Sequence[Chunk], embedder: Any, factory: str = "Flat", index=None):
        super().__init__(chunks)
        if isinstance(embedder, str):
            embedder = get_embedder(embedder)
        self.embedder = embedder
        if index is None:
            vectors = embedder.embed_documents([c.text for c in self.chunks])
            index = FaissIndex(embedder.dim, factory, "ip", embedder_identity=embedder.identity())
            index.add(vectors)
        elif index.embedder_identity != embedder.identity() or index.dim != embedder.dim:
            raise IndexCompatibilityError(
                f"index was built with embedder {index.embedder_identity!r} (dim {index.dim}), "
                f"not {embedder.identity()!r} (dim {embedder.dim}); rebuild the index"
            )
        elif index.ntotal != len(self.chunks):
            raise IndexCompatibilityError(
                f"index holds {index.ntotal} vectors but {len(self.chunks)} chunks were given"
            )
        self.index = index

    def _retrieve(self, queries: list[str], k: int) -> list[list[ScoredChunk]]:
        scores, ids = self.index.search(self.embedder.embed_queries(queries), k)
        return [
            [
                ScoredChunk(self.chunks[i], float(s))
                for s, i in zip(row_s, row_i, strict=True)
                if i >= 0
            ]
            for row_s, row_i in zip(scores, ids, strict=True)
        ]


class BM25Retriever(Retriever):
    """Okapi BM25 with ``bm25s`` (``method``: "lucene", "robertson", "atire", "bm25l", "bm25+").

    Text is tokenized by ``bm25s.tokenize``: lowercase, words of 2+ characters, English stopwords
    removed, optionally stemmed (``stemmer="english"``, needs PyStemmer). Query words not in the
    corpus are ignored; a query with none left scores every chunk 0.
    """

    name = "bm25"
    embeds = False  # words only: no embedder is loaded for it

    def __init__(
        self,
        chunks: Sequence[Chunk],
        method: str = "lucene",
        k1: float = 1.5,
        b: float = 0.75,
        stemmer: str | None = None,
    ) -> None:
        if method not in BM25_METHODS:
            raise unknown("BM25 method", method, BM25_METHODS)
        super().__init__(chunks)
        import bm25s

        self._stemmer = _load_stemmer(stemmer)
        self.method, self.k1, self.b = method, k1, b
        corpus_tokens = self._tokenize([c.text for c in self.chunks], return_ids=True)
        self.bm25 = bm25s.BM25(method=method, k1=k1, b=b)
        self.bm25.index(corpus_tokens, show_progress=False)

    def _tokenize(self, texts: list[str], return_ids: bool):
        import bm25s

        return bm25s.tokenize(
            texts,
            stopwords="en",
            stemmer=self._stemmer,
            return_ids=return_ids,
            show_progress=False,
        )

    def _retrieve(self, queries: list[str], k: int) -> list[list[ScoredChunk]]:
        results = []
        for tokens in self._tokenize(queries, return_ids=False):
            if tokens:
                scores = np.asarray(self.bm25.get_scores(tokens), dtype=np.float64)
            else:  # only stopwords / one-letter words: nothing to match
                scores = np.zeros(len(self.chunks))
            results.append(self._top(scores, k))
        return results


def _load_stemmer(stemmer: str | None):
    if stemmer is None:
        return None
    try:
        import Stemmer
    except ImportError:
        raise ImportError(
            f"stemmer={stemmer!r} needs PyStemmer: pip install PyStemmer (or use stemmer=None)"
        ) from None
    try:
        return Stemmer.Stemmer(stemmer).stemWords
    except KeyError:
        raise unknown("stemmer", stemmer, Stemmer.algorithms()) from None


class HybridRetriever(Retriever):
    """Reciprocal rank fusion (Cormack et al. 2009) of several retrievers over the same chunks.

    Each retriever returns its top ``max(candidates, k)``; a chunk scores
    ``sum_i weights[i] / (rrf_k + rank_i)`` (rank from 1) over the retrievers that found it.
    Ties are broken by corpus position.
    """

    name = "hybrid"

    def __init__(
        self,
        retrievers: Sequence[Retriever],
        weights: Sequence[float] | None = None,
        rrf_k: float = 60,
        candidates: int = 50,
    ) -> None:
        retrievers = list(retrievers)
        if not retrievers:
            raise ValueError("HybridRetriever needs at least one retriever")
        super().__init__(retrievers[0].chunks)
        ids = [c.id for c in self.chunks]
        for r in retrievers[1:]:
            if [c.id for c in r.chunks] != ids:
                raise ValueError(f"{r!r} is built over different chunks than {retrievers[0]!r}")
        weights = [1.0] * len(retrievers) if weights is None else [float(w) for w in weights]
        if len(weights) != len(retrievers) or any(w < 0 for w in weights):
            raise ValueError(
                f"weights must be {len(retrievers)} non-negative numbers, got {weights}"
            )
        if rrf_k < 0 or candidates < 1:
            raise ValueError(f"need rrf_k >= 0 and candidates >= 1, got {rrf_k}, {candidates}")
        self.retrievers, self.weights = retrievers, weights
        self.rrf_k, self.candidates = rrf_k, candidates

    def _retrieve(self, queries: list[str], k: int) -> list[list[ScoredChunk]]:
        depth = max(self.candidates, k)
        per_retriever = [r.retrieve(queries, depth) for r in self.retrievers]
        results = []
        for qi in range(len(queries)):
            fused = np.zeros(len(self.chunks))
            for weight, ranked in zip(self.weights, per_retriever, strict=True):
                for rank, hit in enumerate(ranked[qi], start=1):
                    fused[self.position[hit.chunk.id]] += weight / (self.rrf_k + rank)
            results.append(self._top(fused, k))
        return results


class RerankRetriever(Retriever):
    """Rerank the top ``candidates`` of ``base`` with a sentence-transformers ``CrossEncoder``.

    ``cross_encoder``: a local model folder or Hugging Face id (loaded lazily), or an already
    built object with ``predict(pairs, batch_size=...)``. Scores are the cross-encoder's. A
    folder with weights only in pickle-based ``.bin`` files is refused, as the LLM's are, unless
    ``allow_pickle_weights``.
    """

    name = "rerank"
    embeds = None  # as its base retriever

    def __init__(
        self,
        base: Retriever,
        cross_encoder: object,
        candidates: int = 20,
        batch_size: int = 32,
        device: str = "auto",
        allow_pickle_weights: bool = False,  # a folder with pickle-based .bin weights only
    ) -> None:
        super().__init__(base.chunks)
        if candidates < 1 or batch_size < 1:
            raise ValueError(
                f"need candidates >= 1 and batch_size >= 1, got {candidates}, {batch_size}"
            )
        self.base, self.candidates, self.batch_size = base, candidates, batch_size
        self.device = device
        self._model = cross_encoder if not isinstance(cross_encoder, str) else None
        self.source = (
            cross_encoder if isinstance(cross_encoder, str) else type(cross_encoder).__name__
        )
        if isinstance(cross_encoder, str) and not allow_pickle_weights:  # before it loads
            refuse_pickle_weights(
                cross_encoder,
                "cross-encoder",
                f"retrieval.retriever_params.{PICKLE_OPTION}",
                recursive=True,
            )

    @property
    def model(self):
        if self._model is None:
            from sentence_transformers import CrossEncoder

            self._model = CrossEncoder(self.source, device=pick_device(self.device))
        return self._model

    def _retrieve(self, queries: list[str], k: int) -> list[list[ScoredChunk]]:
        pools = self.base.retrieve(queries, max(self.candidates, k))
        pairs = [
            (q, hit.chunk.text) for q, pool in zip(queries, pools, strict=True) for hit in pool
        ]
        scores = np.asarray(self.model.predict(pairs, batch_size=self.batch_size), dtype=np.float64)
        if scores.ndim == 2 and scores.shape[1] == 1:
            scores = scores[:, 0]
        if scores.shape != (len(pairs),):
            raise ValueError(
                f"cross-encoder {self.source!r} returned scores of shape {scores.shape}; "
                "reranking needs one relevance score per (query, chunk) pair"
            )
        results, offset = [], 0
        for pool in pools:
            s = scores[offset : offset + len(pool)]
            offset += len(pool)
            order = sorted(range(len(pool)), key=lambda i: (-s[i], self.position[pool[i].chunk.id]))
            results.append([ScoredChunk(pool[i].chunk, float(s[i])) for i in order[:k]])
        return results


RUN_LEVELS = ("chunk", "document")


def to_run(
    qids: Sequence[str], results: Sequence[Sequence[ScoredChunk]], level: str = "chunk"
) -> dict[str, dict[str, float]]:
    """BEIR/TREC run, inserted in rank order: ``{qid: {chunk_id: score}}`` (``level="chunk"``,
    for qrels over chunks, e.g. gold chunks from evidence spans) or ``{qid: {doc_id: score}}``
    (``level="document"``, for document qrels such as BEIR's): each document scores its best
    chunk's score (max), at the rank of that chunk. Chunk ids never match document qrels, so
    scoring a chunk run against them would be a silent 0."""
    if level not in RUN_LEVELS:
        raise unknown("run level", level, RUN_LEVELS)
    qids = list(qids)
    if len(qids) != len(results):
        raise ValueError(f"{len(qids)} query ids for {len(results)} result lists")
    if len(set(qids)) != len(qids):
        raise ValueError("query ids must be unique")
    if level == "document":
        return {qid: documents_by_max(hits) for qid, hits in zip(qids, results, strict=True)}
    return {
        qid: {h.chunk.id: h.score for h in hits} for qid, hits in zip(qids, results, strict=True)
    }


def documents_by_max(hits: Sequence[ScoredChunk]) -> dict[str, float]:
    """``{doc_id: best chunk score}`` in order of each document's best chunk (hits are best
    first, so the first chunk seen of a document is its best)."""
    out: dict[str, float] = {}
    for h in sorted(hits, key=lambda h: -h.score):  # stable: ties keep the retriever's order
        if h.chunk.doc_id not in out:
            out[h.chunk.doc_id] = h.score
    return out
