"""A sentence-transformers model run through ONNX Runtime, in fp32 or dynamic int8.

``OnnxEmbedder`` is a ``SentenceTransformerEmbedder`` whose transformer forward runs in an ONNX
Runtime session; tokenisation, length-sorted batching, pooling and normalisation stay
sentence-transformers' own, so the vectors match the PyTorch reference (cosine ~1.0 for fp32,
~0.99 for int8 on MiniLM). Names: ``minilm-onnx`` (fp32) and ``minilm-onnx-int8``; any local
model folder with ``backend="onnx"`` (config: ``retrieval.embedder_params.<name>: {backend:
onnx, quantize: int8}``).

The ONNX file is exported once, offline, from the local weights (``torch.onnx.export``, the
TorchScript exporter) and, for int8, quantized with ONNX Runtime's own dynamic quantizer
(``onnxruntime.quantization.quantize_dynamic``: the quantizer optimum's ``ORTQuantizer`` and
sentence-transformers' ``export_dynamic_quantized_onnx_model`` call). sentence-transformers'
``backend="onnx"`` needs optimum-onnx, whose only release (0.1.0) requires transformers < 4.58,
which sentence-transformers 6 (transformers >= 5) cannot install beside; hence this route.

Exports are cached under ``<ragbench cache>/onnx/<label>-<key>/``, the key hashing the source
model's identity (its weights' fingerprint), the backend, the export recipe and the quantization
settings; a folder is written in a temporary sibling and renamed into place under a file lock,
so readers never see half a model and concurrent processes export once.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import tempfile
import warnings
from functools import lru_cache
from pathlib import Path
from typing import Any

from ragbench.assets import cache_dir
from ragbench.registry import unknown
from ragbench.retrieval.embedders.base import SentenceTransformerEmbedder
from ragbench.retrieval.embedders.precision import check_precision

# the export recipe; bump it when the exported graph changes, so old exports are not reused
RECIPE = "torchscript-opset17-eager-v1"
# dynamic int8 (weights quantized offline, activations per batch at run time), per channel
# (per-tensor int8 drops MiniLM's cosine to the torch vectors to ~0.95); "int8" is optimum's
# avx512_vnni setting (full-range int8 weights), "int8-avx2" its avx2 one (reduce_range: 7-bit
# weights, which avoids the u8s8 saturation of CPUs without VNNI)
QUANTIZATIONS: dict[str | None, dict[str, Any] | None] = {
    None: None,
    "int8": {"weight_type": "QInt8", "per_channel": True, "reduce_range": False},
    "int8-avx2": {"weight_type": "QInt8", "per_channel": True, "reduce_range": True},
}
_INPUTS = ("input_ids", "attention_mask", "token_type_ids")
_INSTALL = "pip install 'onnxruntime>=1.20' 'onnx>=1.17' (or: pip install -e '.[dev]')"
exports = 0  # ONNX exports done by this process (tests check that a cached export is reused)


def check_quantize(quantize: str | None) -> str | None:
    """``quantize`` as a key of ``QUANTIZATIONS`` ("none" -> None), else an error naming them."""
    if quantize is None or str(quantize).lower() in ("none", "fp32"):
        return None
    if quantize not in QUANTIZATIONS:
        raise unknown("ONNX quantization", str(quantize), ["none", *filter(None, QUANTIZATIONS)])
    return quantize


def require_onnxruntime() -> None:
    missing = [m for m in ("onnxruntime", "onnx") if importlib.util.find_spec(m) is None]
    if missing:
        raise ImportError(f"the ONNX embedder needs {' and '.join(missing)}: {_INSTALL}")


def onnx_cache_dir() -> Path:
    return cache_dir() / "onnx"


class OnnxEmbedder(SentenceTransformerEmbedder):
    """A sentence-transformers model (default: the embedded all-MiniLM-L6-v2) on ONNX Runtime.

    ``quantize``: None (fp32 ONNX) or a key of ``QUANTIZATIONS``. ``threads``: ONNX Runtime's
    intra-op threads (None: its default, one per physical core). ``export_dir``: where exports
    are cached (None: ``<ragbench cache>/onnx``). The other arguments are
    ``SentenceTransformerEmbedder``'s; it runs on the CPU, and its ``precision`` is "fp32"
    (bf16 is the PyTorch backend's: ``minilm-bf16``; ONNX gets faster through ``quantize``).
    """

    backend = "onnx"
    precisions = ("fp32",)

    def __init__(
        self,
        model: str | os.PathLike | None = None,
        quantize: str | None = None,
        batch_size: int = 64,
        query_prefix: str = "",
        document_prefix: str = "",
        cache_dir: str | os.PathLike | None = None,
        export_dir: str | os.PathLike | None = None,
        threads: int | None = None,
        show_progress: bool = False,
        cache: bool = True,
        device: str = "cpu",
        precision: str = "fp32",
        allow_pickle_weights: bool = False,  # the weights it exports from: pickle .bin allowed
    ) -> None:
        if device != "cpu":
            raise ValueError(f"the ONNX embedder runs on the CPU; got device={device!r}")
        if check_precision(precision) != "fp32":
            choices = ", ".join(str(q or "none") for q in QUANTIZATIONS)
            raise ValueError(
                f"the ONNX embedder takes quantize ({choices}), not precision={precision!r}: "
                "bf16 runs on the PyTorch backend (embedder minilm-bf16)"
            )
        if threads is not None and threads < 1:
            raise ValueError(f"threads must be >= 1, got {threads}")
        self.quantize = check_quantize(quantize)
        require_onnxruntime()
        super().__init__(
            model,
            "cpu",
            batch_size,
            query_prefix,
            document_prefix,
            cache_dir,
            show_progress,
            cache,
            allow_pickle_weights=allow_pickle_weights,
        )
        self.export_dir = Path(export_dir) if export_dir is not None else None
        self.threads = threads
        self.exported = False  # whether this instance exported (False: the cached file served)

    @property
    def model_identity(self) -> str:
        q = self.quantize or "none"
        # the settings too: editing what "int8" means re-exports, and must not reuse old vectors
        settings = json.dumps(QUANTIZATIONS[self.quantize], sort_keys=True, separators=(",", ":"))
        return f"{super().model_identity}|backend=onnx:{RECIPE}|quantize={q}:{settings}"

    def export_key(self) -> str:
        settings = {
            "model": super().model_identity,
            "backend": "onnx",
            "recipe": RECIPE,
            "quantize": self.quantize,
            "quantization": QUANTIZATIONS[self.quantize],
        }
        return hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:16]

    def onnx_path(self, st_model=None) -> Path:
        """The exported (and quantized) ``model.onnx``, exported first if not cached yet.
        ``st_model``: the loaded torch ``SentenceTransformer`` to export from (else loaded)."""
        from filelock import FileLock

        root = self.export_dir or onnx_cache_dir()
        label = "".join(c if c.isalnum() or c in "-_." else "_" for c in self.label)
        folder = root / f"{label}-{self.export_key()}"
        path = folder / "model.onnx"
        if path.is_file():
            return path
        root.mkdir(parents=True, exist_ok=True)
        with FileLock(str(folder) + ".lock"):
            if path.is_file():  # another process exported while this one waited
                return path
            if st_model is None:
                from sentence_transformers import SentenceTransformer

                st_model = SentenceTransformer(self.source, device="cpu")
            tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}-", dir=root))
            try:
                self._export(st_model, tmp)
                tmp.chmod(0o755)  # mkdtemp makes it private
                os.replace(tmp, folder)
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
        return path

    def _export(self, st_model, out: Path) -> None:
        global exports
        fp32 = out / ("model_fp32.onnx" if self.quantize else "model.onnx")
        names = export_onnx(st_model, fp32)
        if self.quantize:
            from onnxruntime.quantization import QuantType, quantize_dynamic

            q = dict(QUANTIZATIONS[self.quantize] or {})
            weight_type = getattr(QuantType, q.pop("weight_type"))
            quantize_dynamic(fp32, out / "model.onnx", weight_type=weight_type, **q)
            fp32.unlink()
        meta: dict[str, Any] = {
            "identity": self.model_identity,
            "source_identity": super().model_identity,
        }
        meta |= {"recipe": RECIPE, "quantization": QUANTIZATIONS[self.quantize], "inputs": names}
        (out / "ragbench-export.json").write_text(json.dumps(meta, indent=2) + "\n")
        exports += 1
        self.exported = True

    @property
    def model(self):
        """The ``SentenceTransformer`` with its transformer forward on ONNX Runtime (loaded, and
        exported if needed, on first access)."""
        if self._model is None:
            from sentence_transformers import SentenceTransformer

            st_model = SentenceTransformer(self.source, device="cpu")
            transformer: Any = st_model[0]  # its Transformer module (checked below)
            if not hasattr(transformer, "auto_model"):
                raise ValueError(f"{self.label}: the ONNX backend needs a Transformer first module")
            path = self.onnx_path(st_model)
            transformer.model = OrtForward(path, transformer.auto_model.config, self.threads)
            self._model = st_model
        return self._model


class OnnxInt8Embedder(OnnxEmbedder):
    """The same on ONNX Runtime with dynamic int8 weights (quantize="int8" by default)."""

    def __init__(self, model: str | os.PathLike | None = None, quantize: str | None = "int8", **kw):
        super().__init__(model, quantize, **kw)


def export_onnx(st_model, path: Path) -> list[str]:
    """Export the transformer of a loaded sentence-transformers model to ``path`` (token
    embeddings out, batch and sequence axes dynamic); returns the input names."""
    import torch

    transformer = st_model[0]
    hf_model = transformer.auto_model
    encoded = transformer.tokenizer(["a short text", "a longer text that pads the other one"])
    names = [n for n in _INPUTS if n in encoded]
    # eager attention: the traced graph then always applies the padding mask (sdpa may skip
    # the mask when the example batch has no padding, and the trace would keep that shortcut)
    previous = hf_model.config._attn_implementation
    hf_model.set_attn_implementation("eager")

    class Forward(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = hf_model

        def forward(self, *args):
            return self.inner(**dict(zip(names, args, strict=True))).last_hidden_state

    padded = transformer.tokenizer(
        ["a short text", "a longer text that pads the other one"], padding=True, return_tensors="pt"
    )
    axes = {n: {0: "batch", 1: "sequence"} for n in [*names, "last_hidden_state"]}
    try:
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # tracer warnings about Python-side shape checks
            torch.onnx.export(
                Forward().eval(),
                tuple(padded[n] for n in names),
                str(path),
                input_names=names,
                output_names=["last_hidden_state"],
                dynamic_axes=axes,
                opset_version=17,
                dynamo=False,
            )
    finally:
        hf_model.set_attn_implementation(previous)
    return names


def OrtForward(path: Path, config, threads: int | None):  # noqa: N802 (builds a Module)
    """The ONNX Runtime stand-in for a Hugging Face model (a torch Module, defined on first
    use so that importing this module loads no torch)."""
    return _ort_forward_class()(path, config, threads)


@lru_cache(maxsize=1)
def _ort_forward_class():
    import torch

    class _OrtForward(torch.nn.Module):
        """Stands in for the Hugging Face model inside sentence-transformers' Transformer
        module: takes the tokenizer's tensors, returns ``{"last_hidden_state": ...}``."""

        def __init__(self, path: Path, config, threads: int | None) -> None:
            import onnxruntime as ort

            super().__init__()
            options = ort.SessionOptions()
            options.intra_op_num_threads = threads or 0
            # no busy-waiting between ops: on a shared or loaded CPU spinning threads steal
            # the cores the other thread needs (measured faster on this 2-core machine)
            options.add_session_config_entry("session.intra_op.allow_spinning", "0")
            self.session = ort.InferenceSession(
                str(path), options, providers=["CPUExecutionProvider"]
            )
            self.input_names = [i.name for i in self.session.get_inputs()]
            self.config = config
            self.path = Path(path)

        def forward(self, input_ids, attention_mask=None, token_type_ids=None, **_):
            given = {"input_ids": input_ids, "attention_mask": attention_mask}
            given["token_type_ids"] = token_type_ids
            feeds = {}
            for name in self.input_names:
                value = given.get(name)
                if value is None:
                    value = torch.zeros_like(input_ids) if name == "token_type_ids" else None
                if value is None:
                    raise ValueError(f"the ONNX model needs input {name!r}")
                feeds[name] = value.detach().cpu().numpy().astype("int64", copy=False)
            (hidden,) = self.session.run(["last_hidden_state"], feeds)
            return {"last_hidden_state": torch.from_numpy(hidden)}

    return _OrtForward
