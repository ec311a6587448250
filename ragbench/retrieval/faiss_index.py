"""A FAISS vector index with external int64 ids, a checked save/load, and GPU when available.

``FaissIndex(dim, factory, metric)`` accepts any FAISS factory string: "Flat" (exact),
"HNSW32", "IVF64,Flat", "IVF256,PQ16" ... With L2-normalised vectors and ``metric="ip"`` the
scores are cosine similarities (higher is better); with ``metric="l2"`` they are squared
distances (lower is better). Results are always sorted best first.

- ``search(queries, k)``: ``k`` larger than the number of vectors is clamped to ``ntotal`` (the
  result arrays then have ``ntotal`` columns). Approximate indexes (IVF with a small ``nprobe``)
  may find fewer than ``k`` neighbours: missing slots have id -1 and score -inf (ip) / +inf (l2).
- ``train(vectors)`` for indexes that need it (IVF, PQ); ``add`` trains on its own vectors when
  ``train`` was not called.
- ``save(dir)`` writes ``index.faiss``, ``ids.npy`` and ``index.json`` (dim, factory, metric,
  embedder identity, ntotal, sha256 of both files); ``load`` verifies all of it and refuses an
  index built with another embedder or dimension, or a corrupted file.
- A FAISS GPU build (``faiss.get_num_gpus() > 0``) moves the index to all GPUs unless
  ``gpu=False``; index types FAISS cannot run on GPU (HNSW) stay on the CPU. Saved files are
  always CPU indexes. (This path is not exercised by the CPU test suite.)
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from ragbench.io import (
    InputFileError,
    atomic_write_bytes,
    atomic_write_text,
    read_text,
    sha256_file,
)
from ragbench.registry import unknown

METRICS = {"ip": "METRIC_INNER_PRODUCT", "l2": "METRIC_L2"}
INDEX_FILE, IDS_FILE, SIDECAR = "index.faiss", "ids.npy", "index.json"
FORMAT = 1


class IndexCompatibilityError(ValueError):
    """A saved index does not match the embedder or dimension it is loaded for."""


class CorruptIndexError(ValueError):
    """A saved index file is damaged or does not match its sidecar."""


class FaissIndex:
    def __init__(
        self,
        dim: int,
        factory: str = "Flat",
        metric: str = "ip",
        embedder_identity: str = "",
        gpu: bool | None = None,
    ) -> None:
        import faiss

        if dim < 1:
            raise ValueError(f"dim must be >= 1, got {dim}")
        if metric not in METRICS:
            raise unknown("metric", metric, METRICS)
        self.dim, self.factory, self.metric = int(dim), factory, metric
        self.embedder_identity = embedder_identity
        try:
            index = faiss.index_factory(self.dim, factory, getattr(faiss, METRICS[metric]))
        except RuntimeError as exc:
            raise ValueError(
                f"invalid FAISS factory string {factory!r} (e.g. 'Flat', 'HNSW32', "
                f"'IVF64,Flat'): {str(exc).strip().splitlines()[-1]}"
            ) from None
        self._ids = np.zeros(0, dtype=np.int64)  # row in the FAISS index -> external id
        self.index = _to_gpu(index) if gpu or (gpu is None and _num_gpus() > 0) else index

    @property
    def ntotal(self) -> int:
        return int(self.index.ntotal)

    @property
    def is_trained(self) -> bool:
        return bool(self.index.is_trained)

    def __len__(self) -> int:
        return self.ntotal

    def __repr__(self) -> str:
        return f"FaissIndex(dim={self.dim}, factory={self.factory!r}, metric={self.metric!r}, ntotal={self.ntotal})"

    def train(self, vectors: np.ndarray) -> None:
        """Train the coarse quantiser / codebooks (IVF, PQ); a no-op for Flat and HNSW."""
        if self.is_trained:
            return
        vectors = self._check(vectors, "training vectors")
        try:
            self.index.train(vectors)
        except RuntimeError as exc:
            raise ValueError(
                f"cannot train {self.factory!r} on {len(vectors)} vectors: "
                f"{str(exc).strip().splitlines()[-1]}"
            ) from None

    def add(self, vectors: np.ndarray, ids: np.ndarray | None = None) -> None:
        """Add vectors with int64 ``ids`` (default: ntotal, ntotal+1, ...); ids must be unique."""
        vectors = self._check(vectors, "vectors")
        if ids is None:
            ids = np.arange(self.ntotal, self.ntotal + len(vectors), dtype=np.int64)
        else:
            ids = np.asarray(ids)
            if ids.shape != (len(vectors),) or not np.issubdtype(ids.dtype, np.integer):
                raise ValueError(f"ids must be {len(vectors)} integers, got {ids.dtype}{ids.shape}")
            ids = ids.astype(np.int64)
        all_ids = np.concatenate([self._ids, ids])
        if len(np.unique(all_ids)) != len(all_ids) or (ids < 0).any():
            raise ValueError("ids must be unique non-negative integers (-1 marks a missing hit)")
        if not self.is_trained:
            self.train(vectors)
        self.index.add(vectors)
        self._ids = all_ids

    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Top-``k`` (scores float32 (n, k'), ids int64 (n, k')), k' = min(k, ntotal)."""
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        if self.ntotal == 0:
            raise ValueError("the index is empty: add() vectors before search()")
        queries = self._check(queries, "queries", allow_empty=True)
        k = min(int(k), self.ntotal)
        scores, rows = self.index.search(queries, k)
        found = rows >= 0
        ids = np.where(found, self._ids[np.clip(rows, 0, None)], -1).astype(np.int64)
        worst = -np.inf if self.metric == "ip" else np.inf
        return np.where(found, scores, worst).astype(np.float32), ids

    def set_params(self, **params: float) -> None:
        """Search-time parameters by FAISS name, e.g. ``nprobe=16`` (IVF), ``efSearch=128`` (HNSW)."""
        import faiss

        space = faiss.GpuParameterSpace() if _is_gpu(self.index) else faiss.ParameterSpace()
        for name, value in params.items():
            try:
                space.set_index_parameter(self.index, name, value)
            except RuntimeError as exc:
                raise ValueError(
                    f"{self.factory!r} has no search parameter {name!r}: {exc}"
                ) from None

    # ------------------------------------------------------------------ persistence
    def save(self, directory: str | os.PathLike) -> Path:
        """Write the index, its ids and a JSON sidecar into ``directory`` (atomic per file)."""
        import faiss

        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        index = faiss.index_gpu_to_cpu(self.index) if _is_gpu(self.index) else self.index
        atomic_write_bytes(directory / INDEX_FILE, faiss.serialize_index(index).tobytes())
        atomic_write_bytes(directory / IDS_FILE, _npy_bytes(self._ids))
        sidecar = {
            "format": FORMAT,
            "dim": self.dim,
            "factory": self.factory,
            "metric": self.metric,
            "embedder": self.embedder_identity,
            "ntotal": self.ntotal,
            "index_sha256": sha256_file(directory / INDEX_FILE),
            "ids_sha256": sha256_file(directory / IDS_FILE),
        }
        atomic_write_text(directory / SIDECAR, json.dumps(sidecar, indent=2, sort_keys=True) + "\n")
        return directory

    @classmethod
    def load(
        cls,
        directory: str | os.PathLike,
        expect_dim: int | None = None,
        expect_embedder: str | None = None,
        gpu: bool | None = None,
    ) -> FaissIndex:
        """Load a saved index, verifying checksums, dimension and (if given) embedder identity."""
        import faiss

        directory = Path(directory)
        meta = read_sidecar(directory)
        if expect_dim is not None and meta["dim"] != expect_dim:
            raise IndexCompatibilityError(
                f"{directory}: index has dim {meta['dim']}, but the embedder gives {expect_dim}; "
                "rebuild the index with this embedder"
            )
        if expect_embedder is not None and meta["embedder"] != expect_embedder:
            raise IndexCompatibilityError(
                f"{directory}: index was built with embedder {meta['embedder']!r}, "
                f"not {expect_embedder!r}; rebuild the index with this embedder"
            )
        for name, key in ((INDEX_FILE, "index_sha256"), (IDS_FILE, "ids_sha256")):
            path = directory / name
            if not path.exists():
                raise CorruptIndexError(f"{path}: missing (listed in {directory / SIDECAR})")
            if sha256_file(path) != meta[key]:
                raise CorruptIndexError(f"{path}: sha256 does not match {SIDECAR}; file corrupted")
        try:
            index = faiss.deserialize_index(np.fromfile(directory / INDEX_FILE, dtype=np.uint8))
            ids = np.load(directory / IDS_FILE, allow_pickle=False)
        except (RuntimeError, ValueError) as exc:
            raise CorruptIndexError(f"{directory}: cannot read the index: {exc}") from None
        if index.d != meta["dim"] or index.ntotal != meta["ntotal"] or len(ids) != index.ntotal:
            raise CorruptIndexError(
                f"{directory}: index holds {index.ntotal} vectors of dim {index.d} and "
                f"{len(ids)} ids; {SIDECAR} says {meta['ntotal']} of dim {meta['dim']}"
            )
        self = cls.__new__(cls)
        self.dim, self.factory, self.metric = meta["dim"], meta["factory"], meta["metric"]
        self.embedder_identity = meta["embedder"]
        self._ids = ids.astype(np.int64)
        self.index = _to_gpu(index) if gpu or (gpu is None and _num_gpus() > 0) else index
        return self

    # ------------------------------------------------------------------ helpers
    def _check(self, x: np.ndarray, what: str, allow_empty: bool = False) -> np.ndarray:
        x = np.asarray(x)
        if x.ndim != 2 or x.shape[1] != self.dim:
            raise ValueError(f"{what} must have shape (n, {self.dim}), got {x.shape}")
        if not allow_empty and len(x) == 0:
            raise ValueError(f"no {what} given (empty array)")
        if not np.issubdtype(x.dtype, np.floating):
            raise ValueError(f"{what} must be floats, got {x.dtype}")
        x = np.ascontiguousarray(x, dtype=np.float32)
        if not np.isfinite(x).all():
            raise ValueError(f"{what} contain NaN or inf")
        return x


def read_sidecar(directory: Path) -> dict:
    path = directory / SIDECAR
    if not path.exists():
        raise FileNotFoundError(f"{path}: no saved index here (expected {SIDECAR})")
    try:
        meta = json.loads(read_text(path))  # bytes that are not UTF-8: InputFileError too
    except json.JSONDecodeError as exc:
        msg = f"invalid JSON ({exc.msg} at column {exc.colno})"
        raise InputFileError(path, exc.lineno, msg) from None
    if not isinstance(meta, dict):
        raise InputFileError(path, None, f"expected a JSON object, got {type(meta).__name__}")
    required = ("dim", "factory", "metric", "embedder", "ntotal", "index_sha256", "ids_sha256")
    for key in required:
        if key not in meta:
            raise InputFileError(path, None, "missing", field=key)
    return meta


def _npy_bytes(array: np.ndarray) -> bytes:
    import io

    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=False)
    return buffer.getvalue()


def _num_gpus() -> int:
    import faiss

    return faiss.get_num_gpus() if hasattr(faiss, "get_num_gpus") else 0


def _is_gpu(index) -> bool:
    return "Gpu" in type(index).__name__


def _to_gpu(index):
    import faiss

    try:
        return faiss.index_cpu_to_all_gpus(index)
    except (RuntimeError, AttributeError):  # no GPU build, or a type without a GPU version
        return index
