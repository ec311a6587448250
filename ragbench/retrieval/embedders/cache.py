"""On-disk embedding cache: reruns and sweeps never embed the same text twice.

Layout, one folder per model identity (``root/<sha256(identity)[:16]>/``):

- ``<shard>.npy``  float32 vectors, one row per text (plain ``np.save``, never pickle);
- ``<shard>.json`` the shard's index: model identity, dim, the sha256 of each embedded input string
  (prefix included) in row order, and the sha256 of the ``.npy`` bytes.

A shard is written as two atomic renames, vectors first, index last, so readers see a shard only
when it is complete; concurrent processes write distinct shard names (uuid4), and two processes
embedding the same text merely store it twice. A shard is served only if its index names this
exact model identity and its ``.npy`` bytes hash to the recorded digest with the recorded shape;
vectors are looked up by the hash of the exact input string, so a vector is never served for
another model or another text. Bad shards are skipped with a warning, and recomputed.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from ragbench.io import atomic_write_bytes, atomic_write_text, sha256_bytes

log = logging.getLogger(__name__)
FORMAT = 1


def text_key(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


class EmbeddingCache:
    def __init__(self, root: str | Path, model_identity: str) -> None:
        if not model_identity:
            raise ValueError("an embedding cache needs a non-empty model identity")
        self.model_identity = model_identity
        self.dir = Path(root) / hashlib.sha256(model_identity.encode()).hexdigest()[:16]
        self._vectors: dict[str, np.ndarray] = {}  # text key -> vector (a row view of a shard)
        self._seen: set[str] = set()  # shard index files already read (good or bad)
        self.hits = 0
        self.misses = 0

    def get_or_compute(
        self, inputs: Sequence[str], compute: Callable[[list[str]], np.ndarray]
    ) -> np.ndarray:
        """Vectors for ``inputs`` (exact model input strings), computing and storing the misses.

        ``compute`` receives each missing string once, in first-seen order.
        """
        keys = [text_key(s) for s in inputs]
        self.refresh()
        missing: dict[str, str] = {}
        for key, text in zip(keys, inputs, strict=True):
            if key not in self._vectors and key not in missing:
                missing[key] = text
        self.misses += len(missing)
        self.hits += len(keys) - len(missing)
        if missing:
            fresh = np.asarray(compute(list(missing.values())), dtype=np.float32)
            if fresh.ndim != 2 or fresh.shape[0] != len(missing):
                raise ValueError(f"embedder returned shape {fresh.shape} for {len(missing)} texts")
            self._write_shard(list(missing), fresh)
            for key, row in zip(missing, fresh, strict=True):
                self._vectors[key] = row
        out = [self._vectors[k] for k in keys]
        dims = {v.shape[0] for v in out}
        if len(dims) > 1:
            raise ValueError(f"cache {self.dir} holds vectors of several dims {sorted(dims)}")
        return np.stack(out).astype(np.float32, copy=False)

    def refresh(self) -> None:
        """Read shards written since the last call (by this or another process)."""
        if not self.dir.is_dir():
            return
        for index_path in sorted(self.dir.glob("*.json")):
            if index_path.name in self._seen:
                continue
            self._seen.add(index_path.name)
            loaded = self._read_shard(index_path)
            if loaded is not None:
                keys, vectors = loaded
                for key, row in zip(keys, vectors, strict=True):
                    self._vectors.setdefault(key, row)

    def dim(self) -> int | None:
        """The dimension of the vectors stored so far (None: none yet)."""
        self.refresh()
        return next((v.shape[0] for v in self._vectors.values()), None)

    def __len__(self) -> int:
        self.refresh()
        return len(self._vectors)

    def _read_shard(self, index_path: Path) -> tuple[list[str], np.ndarray] | None:
        try:
            index = json.loads(index_path.read_text(encoding="utf-8"))
            if index.get("model") != self.model_identity:
                raise ValueError(f"written for model {index.get('model')!r}")
            data = index_path.with_suffix(".npy").read_bytes()
            if sha256_bytes(data) != index["npy_sha256"]:
                raise ValueError("vector file does not match its recorded sha256")
            vectors = np.load(io.BytesIO(data), allow_pickle=False)
            keys = list(index["keys"])
            if vectors.dtype != np.float32 or vectors.shape != (len(keys), int(index["dim"])):
                raise ValueError(f"vectors {vectors.dtype}{vectors.shape} do not match the index")
        except (OSError, ValueError, KeyError, TypeError) as exc:
            log.warning("ignoring embedding cache shard %s: %s", index_path, exc)
            return None
        vectors.setflags(write=False)
        return keys, vectors

    def _write_shard(self, keys: list[str], vectors: np.ndarray) -> None:
        name = uuid.uuid4().hex
        buffer = io.BytesIO()
        np.save(buffer, np.ascontiguousarray(vectors, dtype=np.float32), allow_pickle=False)
        data = buffer.getvalue()
        atomic_write_bytes(self.dir / f"{name}.npy", data)
        index = {
            "format": FORMAT,
            "model": self.model_identity,
            "dim": int(vectors.shape[1]),
            "keys": keys,
            "npy_sha256": sha256_bytes(data),
        }
        atomic_write_text(self.dir / f"{name}.json", json.dumps(index))
        self._seen.add(f"{name}.json")
