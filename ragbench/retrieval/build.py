"""From settings to objects: retrievers by name and options, and ``build_index``, the one
function that chunks documents and builds a retriever over them (the runner and
``ragbench index build`` both call it).

A retriever's options are its class's parameters (``RETRIEVERS``), less what the builder supplies
itself (the chunks, or the retrievers a hybrid or rerank wraps):

- ``dense``: ``embedder`` (an Embedder or a name for ``get_embedder``, default: its default),
  ``factory`` (FAISS factory string), ``index`` (a loaded FaissIndex);
- ``bm25``: ``method``, ``k1``, ``b``, ``stemmer``;
- ``hybrid``: dense + BM25 fused by RRF: their options, plus ``weights`` (dense, bm25),
  ``rrf_k``, ``candidates``;
- ``rerank``: ``cross_encoder`` (required), ``rerank_candidates`` (the reranker's
  ``candidates``), ``batch_size``, ``device``, and ``base`` (a retriever name, default "hybrid")
  with the base's options.

Dense and BM25 options are accepted by every name (a sweep can pass one option set to all
retrievers; e.g. ``bm25`` ignores ``embedder``); any other unknown option is an error, raised
before anything is chunked or embedded. Importing this module is light: the retriever classes
load when options are listed or a retriever is built.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import Any

from ragbench.registry import UnknownNameError, did_you_mean
from ragbench.retrieval.chunking import check_chunking, chunk_documents
from ragbench.retrieval.embedders.base import get_embedder
from ragbench.retrieval.names import EMBEDDERS, RETRIEVERS
from ragbench.retrieval.retrievers import Retriever
from ragbench.tokenizers import check_tokenizer
from ragbench.types import Chunk, Document

BASE = "hybrid"  # what rerank reranks unless `base` names another retriever
_RENAMED = {"candidates": "rerank_candidates"}  # rerank's own option, apart from hybrid's


class UnknownOptionError(UnknownNameError, TypeError):
    """An option a retriever does not take: a ValueError for settings, and a TypeError for
    ``build_retriever`` callers, as an unexpected keyword argument is."""


def _params(name: str, *supplied: str) -> list[str]:
    """The parameters of retriever class ``name``, less the ones the builder supplies."""
    cls = RETRIEVERS.get(name)
    return [p for p in inspect.signature(cls).parameters if p not in supplied]


def retriever_options(name: str) -> list[str]:
    """Every option ``build_retriever(name, chunks, **options)`` takes, sorted."""
    RETRIEVERS.check(name)
    options = {*_params("dense", "chunks"), *_params("bm25", "chunks")}
    if name in ("hybrid", "rerank"):
        options.update(_params("hybrid", "retrievers"))
    if name == "rerank":
        options.update(["base", *(_RENAMED.get(p, p) for p in _params("rerank", "base"))])
    return sorted(options)


def needs_embedder(name: str, options: dict[str, Any] | None = None) -> bool:
    """Whether retriever ``name`` reads an embedder, as its class declares (``Retriever.embeds``);
    a retriever that wraps another (rerank) as its ``base`` option does (default ``hybrid``).
    One that does not (bm25) gets no embedder loaded, and its parameters name none."""
    embeds = getattr(RETRIEVERS.get(name), "embeds", True)
    if embeds is None:
        return needs_embedder((options or {}).get("base", BASE), options)
    return bool(embeds)


def _check_options(name: str, options: dict[str, object], valid: Sequence[str]) -> None:
    for key in sorted(options):
        if key not in valid:
            raise UnknownOptionError(
                f"retriever {name!r}: unexpected option {key!r}; {did_you_mean(key, valid)}"
            )


def _check_required(name: str, options: dict[str, object]) -> None:
    if name == "rerank" and "cross_encoder" not in options:
        raise ValueError("the rerank retriever needs cross_encoder=<local model folder or HF id>")


def check_retriever_params(retriever: str, params: dict[str, object]) -> None:
    """Raise, naming the valid choices, when ``retriever`` is not in ``RETRIEVERS`` or a key of
    ``params`` is not one of its options. ``embedder`` is not among them: it is a setting of its
    own (``build_index(embedder=...)``). Keys are checked one by one, so a subset of a
    retriever's options passes (``build_index`` reports a missing ``cross_encoder``)."""
    valid = [o for o in retriever_options(retriever) if o != "embedder"]
    if "embedder" in params:
        raise UnknownOptionError(
            f"retriever {retriever!r}: the embedder is a setting of its own (retrieval.embedder),"
            f" not a retriever parameter; parameters: {', '.join(valid)}"
        )
    _check_options(retriever, params, valid)


def build_retriever(name: str, chunks: Sequence[Chunk], **options: Any) -> Retriever:
    """Retriever ``name`` over ``chunks`` with ``options`` (see the module docstring)."""
    _check_options(name, options, retriever_options(name))
    _check_required(name, options)
    kw = dict(options)
    cls = RETRIEVERS.get(name)
    if name == "rerank":
        params = {_RENAMED.get(p, p): p for p in _params(name, "base")}  # option -> parameter
        own = {params[option]: kw.pop(option) for option in list(kw) if option in params}
        return cls(build_retriever(kw.pop("base", BASE), chunks, **kw), **own)
    dense_kw = {p: kw.pop(p) for p in _params("dense", "chunks") if p in kw}
    bm25_kw = {p: kw.pop(p) for p in _params("bm25", "chunks") if p in kw}
    if name == "bm25":
        return cls(chunks, **bm25_kw)
    if dense_kw.get("embedder") is None:
        dense_kw["embedder"] = get_embedder()  # the embedded default
    dense = RETRIEVERS.get("dense")(chunks, **dense_kw)
    if name == "dense":
        return dense
    return cls([dense, RETRIEVERS.get("bm25")(dense.chunks, **bm25_kw)], **kw)


def build_index(
    documents: Sequence[Document],
    *,
    retriever: str,
    embedder: object,
    splitter: str,
    chunk_size: int,
    chunk_overlap: int,
    tokenizer: str,
    retriever_params: dict[str, object] | None = None,
) -> tuple[list[Chunk], Retriever]:
    """Chunk ``documents`` and build ``retriever`` over the chunks: ``(chunks, retriever)``.

    ``embedder``: an ``EMBEDDERS`` name (or model folder) or an Embedder (pass one instance to
    load a model once for many indexes); dense, hybrid and rerank embed with it, bm25 ignores
    it (None: nothing to embed with, for a retriever that ``needs_embedder`` says needs none). ``splitter``, ``chunk_size`` and ``chunk_overlap`` (tokens of ``tokenizer``) go to
    ``chunk_documents``; ``retriever_params`` are the retriever's other options. Every name and
    setting is checked before anything is chunked or embedded.
    """
    params = dict(retriever_params or {})
    check_retriever_params(retriever, params)
    _check_required(retriever, params)
    check_chunking(splitter, chunk_size, chunk_overlap)
    check_tokenizer(tokenizer)
    if isinstance(embedder, str):
        EMBEDDERS.check(embedder)
    chunks = chunk_documents(documents, splitter, chunk_size, chunk_overlap, tokenizer)
    return chunks, build_retriever(retriever, chunks, embedder=embedder, **params)
