"""Shared test setup: offline, quiet, deterministic; the `gpu` marker skips without CUDA."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# pytest-xdist workers share the machine's cores: each gets its share of intra-op threads (read
# by torch's and ONNX Runtime's OpenMP pools when they start, after this), else every worker
# starts one thread per core and their spinning threads contend (measured on 2 cores: the
# SnapKV end-to-end test took 41 s alone and 140 s beside a second 2-thread worker)
if os.environ.get("PYTEST_XDIST_WORKER_COUNT"):
    _share = max(1, (os.cpu_count() or 1) // int(os.environ["PYTEST_XDIST_WORKER_COUNT"]))
    os.environ.setdefault("OMP_NUM_THREADS", str(_share))
    os.environ.setdefault("MKL_NUM_THREADS", str(_share))


# Derived artefacts keyed by content hash (converted GGUF weights, tokenizers, assembled assets)
# are shared with the user's cache: rebuilding them each run costs a minute and proves nothing.
# Completions and embeddings get a fresh cache per test session, so every model answer a test
# checks is computed by the code under test, never served from an earlier run.
_SHARED = ("converted", "tokenizers", "assets")
_SESSION_VAR = "RAGBENCH_TEST_SESSION_CACHE"


def pytest_configure(config):
    import tempfile
    from pathlib import Path

    from ragbench.assets import cache_dir

    # pytest-xdist (`make test` runs two workers): the workers share the controller's session
    # cache, so a worker's run reads what the other computed (a calibration, a converted model)
    # as one serial session would, and only the controller removes the folder
    inherited = os.environ.get(_SESSION_VAR)
    if inherited and os.environ.get("PYTEST_XDIST_WORKER"):
        os.environ["RAGBENCH_CACHE"] = inherited
        return
    shared = cache_dir()  # honours a RAGBENCH_CACHE set by the user
    session = Path(tempfile.mkdtemp(prefix="ragbench-test-cache-"))
    for name in _SHARED:
        (shared / name).mkdir(parents=True, exist_ok=True)
        (session / name).symlink_to(shared / name, target_is_directory=True)
    os.environ["RAGBENCH_CACHE"] = str(session)
    os.environ[_SESSION_VAR] = str(session)  # inherited by the xdist workers started after this
    config._ragbench_cache = session


def pytest_unconfigure(config):
    import shutil

    session = getattr(config, "_ragbench_cache", None)
    if session is not None:
        shutil.rmtree(session, ignore_errors=True)  # removes the links, not their targets


def pytest_collection_modifyitems(config, items):
    gpu_items = [item for item in items if item.get_closest_marker("gpu") is not None]
    if not gpu_items:
        return
    try:
        import torch

        has_cuda = torch.cuda.is_available()
    except ImportError:
        has_cuda = False
    if has_cuda:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in gpu_items:
        item.add_marker(skip)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A tiny random-weight chat model on the CPU (``test_hf._save_tiny``), one per test module;
    ``test_hf`` defines its own from a folder it also reads."""
    from test_hf import _save_tiny

    from ragbench.llm.hf.model import HFModel

    folder = tmp_path_factory.mktemp("tiny")
    _save_tiny(folder, chat=True)
    return HFModel(str(folder), device="cpu", cache_dir=folder.parent / "cache-tiny")


@pytest.fixture(scope="module", autouse=True)
def _secrets_per_module():
    """What a test module's runs remember as secrets (``ragbench.secrets.remember``: masked in
    every later text of the process) is forgotten after the module: a key a test chose, say
    ``other``, would otherwise mask that word in a later module's exported prompts."""
    from ragbench import secrets

    with secrets._lock:
        before = set(secrets._remembered)
    yield
    with secrets._lock:
        secrets._remembered.clear()
        secrets._remembered.update(before)


@pytest.fixture
def ctrl_c():
    """Ctrl-C raises ``KeyboardInterrupt`` in this test, however the suite was started: a suite
    run as a background job (``make test &``, ``nohup``) inherits SIGINT ignored, and a test that
    interrupts itself would then wait in vain (it did in a ``nohup .ci/run &`` rehearsal)."""
    import signal

    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, before)
