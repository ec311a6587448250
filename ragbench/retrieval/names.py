"""The names a retrieval setting can take: retrievers, embedders (and the runtimes they run on)
and splitters.

Plain registries of ``"module:attr"`` strings: importing this module (the config validates names
against it) loads no numpy model code, faiss, torch or llama-index.
"""

from __future__ import annotations

from pathlib import Path

from ragbench.registry import Registry

# each class declares whether it reads the run's embedder (``Retriever.embeds``; bm25 does not,
# so a run loads none for it: ``build.needs_embedder``)
RETRIEVERS = Registry(
    "retriever",
    {
        "dense": "ragbench.retrieval.retrievers:DenseRetriever",  # embeddings in FAISS
        "bm25": "ragbench.retrieval.retrievers:BM25Retriever",  # Okapi BM25 (bm25s)
        "hybrid": "ragbench.retrieval.retrievers:HybridRetriever",  # dense + BM25, RRF
        "rerank": "ragbench.retrieval.retrievers:RerankRetriever",  # cross-encoder over a base
    },
)

_MINILM = (
    "ragbench.retrieval.embedders.base:SentenceTransformerEmbedder"  # no model: the embedded one
)


def _model_name(name: str) -> bool:
    """Embedder names beyond the entries: any case of an entry, a model folder or an HF id."""
    return name.lower() in EMBEDDERS or "/" in name or Path(name).expanduser().is_dir()


EMBEDDERS = Registry(
    "embedder",
    {
        "minilm": _MINILM,
        "all-minilm-l6-v2": _MINILM,
        "sentence-transformers/all-minilm-l6-v2": _MINILM,
        "minilm-bf16": "ragbench.retrieval.embedders.base:Bf16Embedder",
        "minilm-onnx": "ragbench.retrieval.embedders.onnx:OnnxEmbedder",
        "minilm-onnx-int8": "ragbench.retrieval.embedders.onnx:OnnxInt8Embedder",
        "hash": "ragbench.retrieval.embedders.base:HashEmbedder",  # no weights: tests, quick looks
        # an OpenAI-compatible /v1/embeddings server: retrieval.embedder_params.openai
        "openai": "ragbench.retrieval.embedders.http:OpenAIEmbedder",
    },
    other="<model folder or Hugging Face id>",
    accepts=_model_name,
    descriptions={  # the aliases and variants say what they are (the list is alphabetical)
        "minilm": "the embedded all-MiniLM-L6-v2 (sentence-transformers): batched, float32, "
        "L2-normalised, cached on disk",
        "all-minilm-l6-v2": "minilm by its model's name",
        "sentence-transformers/all-minilm-l6-v2": "minilm by its Hugging Face id (the embedded "
        "copy; no download)",
        "minilm-bf16": "minilm in bf16 mixed precision (autocast; fast on CPUs with AMX/"
        "avx512_bf16, GPUs)",
        "minilm-onnx": "minilm on ONNX Runtime (exported once, cached), float32",
        "minilm-onnx-int8": "minilm on ONNX Runtime with dynamic int8 weights",
    },
)

# what runs a sentence-transformers embedder (``embedder_params.<name>.backend``)
EMBEDDER_BACKENDS = Registry(
    "embedder backend",
    {
        "torch": _MINILM,
        # exported once and cached; ``quantize`` for dynamic int8
        "onnx": "ragbench.retrieval.embedders.onnx:OnnxEmbedder",
    },
)

# llama-index-core node parsers
SPLITTERS = Registry(
    "splitter",
    {
        "sentence": "llama_index.core.node_parser:SentenceSplitter",
        "token": "llama_index.core.node_parser:TokenTextSplitter",
    },
    descriptions={
        "sentence": "packs whole sentences (NLTK punkt), then phrases, words (llama-index)",
        "token": "packs words up to the token budget, ignores sentence ends (llama-index)",
    },
)
