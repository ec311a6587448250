"""Provenance of a run: what produced its numbers (versions, commit, hardware, model identity),
written into its manifest and, inside a notebook, into the executed notebook's outputs."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

PACKAGES = (
    "ragbench",
    "numpy",
    "pandas",
    "pydantic",
    "torch",
    "transformers",
    "sentence-transformers",
    "faiss-cpu",
    "llama-index-core",
    "bm25s",
    "gguf",
)
# the mime type of a run's output in an executed notebook, which `ragbench render` reads back
RUN_MIME = "application/vnd.ragbench.run+json"


def versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def git_commit() -> str | None:
    try:
        res = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
            cwd=Path(__file__).resolve().parent,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return res.stdout.strip() if res.returncode == 0 else None


def hardware() -> dict[str, object]:
    hw: dict[str, object] = {
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
    }
    try:
        import psutil

        hw["memory_bytes"] = psutil.virtual_memory().total
    except ImportError:
        pass
    torch = sys.modules.get("torch")  # only if a backend already loaded it
    if torch is not None and torch.cuda.is_available():
        hw["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    return hw


def dataset_name(manifest: dict[str, Any]) -> str:
    """How a page names a run's dataset: by the files it read (``file: niah-1k.jsonl (n=4)``,
    ``corpus: corpus.jsonl + questions.csv (n=20)``), else by its generator's name."""
    dataset = manifest.get("dataset") or {}
    params = ((manifest.get("config") or {}).get("dataset") or {}).get("params") or {}
    files = [Path(str(params[k])).name for k in ("path", "corpus", "questions") if params.get(k)]
    name = str(dataset.get("name", "?"))
    label = f"{name}: {' + '.join(files)}" if files else name
    return f"{label} (n={dataset.get('n')})"


def identity(llm: Any) -> dict[str, Any]:
    try:
        return dict(llm.identity())
    except Exception as exc:  # provenance must not kill a finished run
        return {"error": f"{type(exc).__name__}: {exc}"}


def record_in_notebook(run_dir: Path, manifest: dict[str, object]) -> None:
    """Inside a Jupyter kernel, add this run to the cell's outputs: a ``run folder: ...`` line
    plus the run folder and manifest under ragbench's own mime type, which ``ragbench render``
    reads for the provenance header. The executed notebook thereby names the runs it made, however
    many other runs share its output folder. Outside a kernel (scripts, CLI, tests): nothing."""
    ipython = sys.modules.get("IPython")  # a kernel has imported it; never import it here
    shell = ipython.get_ipython() if ipython is not None else None
    if getattr(shell, "kernel", None) is None:  # terminal IPython has no kernel: no notebook
        return
    from IPython.display import display

    payload = {"run_dir": str(run_dir.resolve()), "manifest": manifest}
    display({"text/plain": f"run folder: {run_dir}", RUN_MIME: payload}, raw=True)
