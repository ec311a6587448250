"""Text embedders: separate query and document embedding, float32, L2-normalised.

``Embedder`` is a template method: the public ``embed_queries`` / ``embed_documents`` validate the
batch, apply the query or document prefix, serve cached vectors (``EmbeddingCache``) and
normalise; a backend implements ``_encode(texts)`` and ``model_identity``.

- ``SentenceTransformerEmbedder``: any sentence-transformers model; the embedded
  all-MiniLM-L6-v2 by default (offline). Loaded lazily, on the first text that misses the cache.
  Batches are formed by token length (``length_batches``), not by sentence-transformers'
  character-length proxy: on the 128-token essay chunks that pads 12% fewer tokens, for the
  same vectors (within float32 noise) and the same top-k lists.
  ``precision``: "fp32" (the default and the reference), "bf16" (autocast: fp32 weights, matmuls
  in bfloat16; ``minilm-bf16``) or "bf16-full" (weights cast to bfloat16). bf16 is faster only
  where the hardware computes it natively (CPUs with AMX or avx512_bf16, recent GPUs); elsewhere
  a warning suggests ``minilm-onnx-int8``.
- ``OnnxEmbedder`` (``embedders_onnx``): the same models on ONNX Runtime, fp32 or dynamic int8
  (``minilm-onnx``, ``minilm-onnx-int8``, or ``backend="onnx"``).
- ``HashEmbedder``: deterministic feature hashing of word uni- and bigrams, no weights; for tests
  and for trying the pipeline without a model.
- ``OpenAIEmbedder`` (``embedders_http``): an OpenAI-compatible ``/v1/embeddings`` server
  (config: ``embedder: openai`` with ``retrieval.embedder_params.openai: {model, base_url}``).

``identity()`` names the model and the prefixes: a FAISS index built from one embedder refuses
queries from another.
"""

from __future__ import annotations

import hashlib
import os
import re
from abc import ABC, abstractmethod
from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path

import numpy as np

from ragbench.assets import cache_dir as ragbench_cache_dir
from ragbench.assets import minilm_dir
from ragbench.devices import pick_device
from ragbench.llm.hf.load import PICKLE_OPTION, refuse_pickle_weights
from ragbench.retrieval.embedders.cache import EmbeddingCache
from ragbench.retrieval.embedders.precision import (
    PRECISIONS,
    check_precision,
    warn_if_bf16_emulated,
)
from ragbench.retrieval.names import EMBEDDER_BACKENDS, EMBEDDERS


class Embedder(ABC):
    """Base class; subclasses call ``super().__init__`` and implement the abstract members."""

    backend: str | None = None  # an ``EMBEDDER_BACKENDS`` name, for models that run on either
    precisions: tuple[str, ...] = ()  # the ``PRECISIONS`` it takes (none: no precision option)

    def __init__(
        self,
        query_prefix: str = "",
        document_prefix: str = "",
        cache_dir: str | os.PathLike | None = None,
    ) -> None:
        self.query_prefix = query_prefix
        self.document_prefix = document_prefix
        self.cache_dir = Path(cache_dir) if cache_dir is not None else None
        # built on first use: model_identity may hash model files
        self._cache: EmbeddingCache | None = None

    @property
    @abstractmethod
    def dim(self) -> int: ...

    @property
    @abstractmethod
    def model_identity(self) -> str:
        """What determines the vector of a given input string (model + weights fingerprint)."""

    @abstractmethod
    def _encode(self, texts: list[str]) -> np.ndarray:
        """Embed already-prefixed texts; returns (len(texts), dim)."""

    def identity(self) -> str:
        """Model identity plus prefixes: the key for index compatibility checks."""
        return f"{self.model_identity}|query_prefix={self.query_prefix!r}|document_prefix={self.document_prefix!r}"

    def embed_queries(self, texts: Sequence[str]) -> np.ndarray:
        return self._embed(texts, self.query_prefix, "query")

    def embed_documents(self, texts: Sequence[str]) -> np.ndarray:
        return self._embed(texts, self.document_prefix, "document")

    @property
    def cache(self):
        """The ``EmbeddingCache`` in use, or None when caching is off."""
        if self._cache is None and self.cache_dir is not None:
            self._cache = EmbeddingCache(self.cache_dir, self.model_identity)
        return self._cache

    def _embed(self, texts: Sequence[str], prefix: str, kind: str) -> np.ndarray:
        texts = check_texts(texts, kind)
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        inputs = [prefix + t for t in texts]
        cache = self.cache
        if cache is None:
            return l2_normalise(self._encode(inputs))
        return cache.get_or_compute(inputs, lambda missing: l2_normalise(self._encode(missing)))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.identity()})"


def check_texts(texts: Sequence[str], kind: str) -> list[str]:
    """A batch of non-blank strings (embedders and retrievers take batches, never one string)."""
    if isinstance(texts, str):
        raise TypeError(f"pass a list of {kind} strings, not a single string: [{texts[:40]!r}]")
    texts = list(texts)
    for i, text in enumerate(texts):
        if not isinstance(text, str):
            raise TypeError(f"{kind} at position {i} is {type(text).__name__}, expected str")
        if not text.strip():
            raise ValueError(f"empty {kind} at position {i}")
    return texts


def l2_normalise(vectors: np.ndarray) -> np.ndarray:
    """float32 rows of unit length (an all-zero row stays zero)."""
    vectors = np.asarray(vectors, dtype=np.float32)
    if vectors.ndim != 2:
        raise ValueError(f"expected a 2-d array of vectors, got shape {vectors.shape}")
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    return np.divide(vectors, norms, out=np.zeros_like(vectors), where=norms > 0)


def default_cache_dir() -> Path:
    return ragbench_cache_dir() / "embeddings"


class SentenceTransformerEmbedder(Embedder):
    """A sentence-transformers model, batched, float32, L2-normalised, with an on-disk cache.

    ``model``: None for the embedded all-MiniLM-L6-v2, a local folder, or a Hugging Face id (used
    only when named; offline runs need it in the local HF cache). ``cache_dir``: None for
    ``<ragbench cache>/embeddings``; ``cache=False`` turns caching off. ``precision``: one of
    ``PRECISIONS``; anything but "fp32" is part of ``model_identity``, so cached vectors and
    indexes of different precisions never mix. Vectors come out float32 whatever the precision.
    A model folder with weights only in pickle-based ``.bin`` files (any of its module folders)
    is refused, as the LLM's are (``llm.hf.load.refuse_pickle_weights``), unless
    ``allow_pickle_weights``.
    """

    backend = "torch"
    precisions = tuple(PRECISIONS)

    def __init__(
        self,
        model: str | os.PathLike | None = None,
        device: str = "auto",
        batch_size: int = 64,
        query_prefix: str = "",
        document_prefix: str = "",
        cache_dir: str | os.PathLike | None = None,
        show_progress: bool = False,
        cache: bool = True,
        precision: str = "fp32",
        allow_pickle_weights: bool = False,  # load pickle-based .bin weights (they can run code)
    ) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.precision = check_precision(precision)
        if cache and cache_dir is None:
            cache_dir = default_cache_dir()
        super().__init__(query_prefix, document_prefix, cache_dir if cache else None)
        if model is None:
            self.source, self.label = str(minilm_dir()), "all-MiniLM-L6-v2"
        else:
            path = Path(model).expanduser()
            is_dir = path.is_dir()
            self.source = str(path.resolve()) if is_dir else str(model)
            self.label = path.name if is_dir else str(model)
            if is_dir and not allow_pickle_weights:  # before anything loads, as the LLM's
                refuse_pickle_weights(
                    self.source,
                    "embedder",
                    f"retrieval.embedder_params: {{{model}: {{{PICKLE_OPTION}}}}}",
                    recursive=True,
                )
        self.device = pick_device(device)
        self.batch_size = batch_size
        self.show_progress = show_progress
        self._model: object = None  # the SentenceTransformer, loaded on first use
        self.encode_calls = 0  # how many times the model was asked to embed (cache misses)
        self.padded_tokens = 0  # token slots fed to the model, padding included

    @property
    def model(self):
        """The loaded ``SentenceTransformer`` (loaded on first access; weights in bfloat16 for
        ``precision="bf16-full"``)."""
        if self._model is None:
            from sentence_transformers import SentenceTransformer

            model = SentenceTransformer(self.source, device=self.device)
            if self.precision != "fp32":
                warn_if_bf16_emulated(self.device)
            if self.precision == "bf16-full":
                import torch

                model = model.to(torch.bfloat16)
            self._model = model
        return self._model

    @property
    def dim(self) -> int:
        model = self.model
        get = getattr(model, "get_embedding_dimension", None) or (
            model.get_sentence_embedding_dimension
        )
        return int(get())

    @property
    def model_identity(self) -> str:
        if Path(self.source).is_dir():
            name = (
                f"sentence-transformers:{self.label}@sha256:{folder_fingerprint(self.source)[:16]}"
            )
        else:
            name = f"sentence-transformers:{self.label}"  # a hub id: identified by name only
        # fp32 adds nothing: identities (and caches) from before precisions existed stay valid
        return name if self.precision == "fp32" else f"{name}|precision={self.precision}"

    def _encode(self, texts: list[str]) -> np.ndarray:
        self.encode_calls += 1
        model = self.model
        if self.precision == "fp32":
            return self._st_encode(model, texts, normalize=True)
        # bf16: normalised by ``Embedder._embed`` in float32, not by sentence-transformers in bf16
        if self.precision == "bf16-full":
            return self._st_encode(model, texts, normalize=False)
        import torch

        with torch.autocast(torch.device(self.device).type, dtype=torch.bfloat16):
            return self._st_encode(model, texts, normalize=False)

    def _st_encode(self, model, texts: list[str], normalize: bool) -> np.ndarray:
        # sentence-transformers sorts a call's texts by characters, a rough proxy for tokens;
        # one encode call per batch of similar token length pads less (a batch pads to its
        # longest text). The texts are tokenized twice (lengths here, ids inside encode): the
        # first pass is ~1% of the forward (0.19 s of ~14 s on the 1,476 essay chunks).
        lengths = token_lengths(model, texts)
        batches = length_batches(lengths, self.batch_size)
        parts = []
        for rows in _progress(batches, self.show_progress):
            vectors = model.encode(
                [texts[i] for i in rows],
                batch_size=len(rows),
                normalize_embeddings=normalize,
                convert_to_numpy=True,
                show_progress_bar=False,
            )
            parts.append(np.asarray(vectors, dtype=np.float32))
            self.padded_tokens += len(rows) * max(lengths[i] for i in rows)
        out = np.empty((len(texts), parts[0].shape[1]), dtype=np.float32)
        out[np.concatenate(batches)] = np.concatenate(parts)  # back to input order
        return out


def token_lengths(model, texts: list[str]) -> list[int]:
    """Tokens per text as ``model`` will see them (special tokens in, truncated at its
    ``max_seq_length``); characters where the model has no text tokenizer."""
    tokenizer = getattr(model, "tokenizer", None)
    if not callable(tokenizer):
        return [len(t) for t in texts]
    max_length = getattr(model, "max_seq_length", None)
    ids = tokenizer(
        texts,
        truncation=max_length is not None,
        max_length=max_length,
        return_attention_mask=False,
        return_token_type_ids=False,
    )["input_ids"]
    return [len(row) for row in ids]


def length_batches(lengths: Sequence[int], batch_size: int) -> list[list[int]]:
    """Positions ``0..len(lengths)-1`` in batches of ``batch_size``, longest first, ties by
    position: consecutive lengths together, so each batch pads little (deterministic)."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    return [order[start : start + batch_size] for start in range(0, len(order), batch_size)]


def _progress(batches: list[list[int]], show: bool):
    if not show:
        return batches
    from tqdm.auto import tqdm  # a sentence-transformers dependency

    return tqdm(batches, desc="Batches")


class Bf16Embedder(SentenceTransformerEmbedder):
    """The same in bf16 mixed precision (``precision="bf16"`` by default: ``minilm-bf16``)."""

    def __init__(self, model: str | os.PathLike | None = None, *args, precision="bf16", **kw):
        # *args name the parameters before precision (a ninth would be a TypeError anyway)
        super().__init__(model, *args, precision=precision, **kw)  # type: ignore[misc]


def folder_fingerprint(folder: str | os.PathLike) -> str:
    """sha256 over the relative paths and contents of a model folder's files (dotfiles skipped).

    Memoised on (path, size, mtime) of every file, so it hashes the weights once per process.
    """
    root = Path(folder)
    files = sorted(p for p in root.rglob("*") if p.is_file() and not p.name.startswith("."))
    stats = tuple((str(p.relative_to(root)), p.stat().st_size, p.stat().st_mtime_ns) for p in files)
    return _fingerprint(str(root), stats)


@lru_cache(maxsize=32)
def _fingerprint(root: str, stats: tuple[tuple[str, int, int], ...]) -> str:
    digest = hashlib.sha256()
    for rel, _size, _mtime in stats:
        digest.update(rel.encode() + b"\0")
        with open(Path(root) / rel, "rb") as f:
            while block := f.read(1 << 20):
                digest.update(block)
        digest.update(b"\0")
    return digest.hexdigest()


class HashEmbedder(Embedder):
    """Deterministic bag of hashed word uni- and bigrams (signed feature hashing), no weights.

    Hand-written on purpose: a test and demo fake with no dependency and no model files. Texts
    sharing words get similar vectors, which is enough for retrieval to work in tests. Hashes are
    keyed blake2b (``seed``), stable across processes (unlike ``hash()``). No cache by default.
    """

    _word = re.compile(r"\w+")

    def __init__(
        self,
        dim: int = 256,
        seed: int = 0,
        query_prefix: str = "",
        document_prefix: str = "",
        cache_dir: str | os.PathLike | None = None,
    ) -> None:
        if dim < 1:
            raise ValueError(f"dim must be >= 1, got {dim}")
        super().__init__(query_prefix, document_prefix, cache_dir)
        self._dim, self.seed = dim, seed
        self.encode_calls = 0

    @property
    def dim(self) -> int:
        return self._dim

    @property
    def model_identity(self) -> str:
        return f"hash:v1:dim={self._dim}:seed={self.seed}"

    def _encode(self, texts: list[str]) -> np.ndarray:
        self.encode_calls += 1
        out = np.zeros((len(texts), self._dim), dtype=np.float32)
        for row, text in enumerate(texts):
            words = self._word.findall(text.lower())
            features = [(w, 1.0) for w in words]
            features += [(f"{a} {b}", 0.5) for a, b in zip(words, words[1:], strict=False)]
            for feature, weight in features:
                index, sign = _hash_feature(feature, self.seed, self._dim)
                out[row, index] += sign * weight
        # sublinear term frequency, as in TF-IDF practice: repeated words do not dominate
        return np.sign(out) * np.log1p(np.abs(out))


@lru_cache(maxsize=1 << 16)
def _hash_feature(feature: str, seed: int, dim: int) -> tuple[int, float]:
    key = seed.to_bytes(8, "little", signed=True)
    h = int.from_bytes(hashlib.blake2b(feature.encode(), digest_size=8, key=key).digest(), "little")
    return h % dim, 1.0 if (h >> 63) & 1 else -1.0


def get_embedder(name: str = "minilm", backend: str | None = None, **kwargs) -> Embedder:
    """An embedder by ``EMBEDDERS`` name ("minilm" / "all-minilm-l6-v2": the embedded default;
    "minilm-bf16": the same in bf16 mixed precision; "minilm-onnx" / "minilm-onnx-int8": the same
    on ONNX Runtime; "hash"), in any case, or a model folder / Hugging Face id; ``kwargs`` go to
    its class (``precision`` to a PyTorch sentence-transformers one). ``backend="onnx"`` (with
    ``quantize``: None or "int8") runs a sentence-transformers model on ONNX Runtime."""
    key = name.lower()
    if backend is None and "quantize" in kwargs:
        backend = "onnx"  # quantization only exists on the ONNX backend
    if key in EMBEDDERS:
        cls, model = EMBEDDERS.get(key), None
    else:
        cls, model = SentenceTransformerEmbedder, EMBEDDERS.check(name)
    if backend is not None:
        runtime = EMBEDDER_BACKENDS.get(backend)  # did-you-mean over the backends
        if cls.backend is None:
            raise ValueError(f"embedder {name!r} has no backend option (backend={backend!r})")
        if cls.backend != backend:
            if issubclass(cls, Bf16Embedder):
                raise ValueError(f"embedder {name!r} runs on PyTorch in bf16, not backend='onnx'")
            if backend == "torch":
                raise ValueError(f"embedder {name!r} runs on ONNX Runtime, not backend='torch'")
            return runtime(model, **kwargs)
    return cls(**kwargs) if model is None else cls(model, **kwargs)
