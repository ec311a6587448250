#!/usr/bin/env bash
# ragbench on a lent GPU, one command, one JSON (rewritten after each part; a hard stop under 8
# minutes keeps what was written). Parts (--parts, in this order; default all):
#   tests    pytest -m gpu (the suite's CUDA tests)            needs: pytest
#   e2e      one real `ragbench run` on CUDA: random-weight Llama-3.1-8B shape + the embedded
#            SmolLM2 tokenizer; NIAH 4k/16k; closed book, long context, BM25 RAG;
#            example-h100-hour; must finish on the device (benchmarks/gpu_check_e2e.py)
#                                                               needs: pydantic typer pyyaml pandas
#            pyarrow numpy scipy bm25s llama-index-core nltk sqlalchemy tenacity httpx filelock
#            psutil tqdm
#   greedy32 greedy token equality in float32, Llama-3.2-1B shape: every path vs generate
#                                                               needs: nothing beyond torch + transformers
#   prefill reuse runner kv cost decode logits: Llama-3.1-8B and Qwen2.5-7B shapes, random
#            weights in bf16, token ids (benchmarks/gpu_check.py); cost = calibrated vs measured
#                                                               needs: nothing beyond torch + transformers
# A part whose packages are missing is skipped with one line; the JSON's "packages" lists what
# each part found (with versions) and "skipped" why. Everything needs torch + transformers.
# The lent machine's image lacks pydantic, bm25s and llama-index-core (and some of theirs):
# `python benchmarks/gpu_carry.py` here puts their wheels in gpu_carry/wheels (git-ignored, ~22
# MiB), with the tokenizer and haystack the e2e part reads; carry `gpu_carry` and this script
# installs the wheels (--wheels DIR, default gpu_carry/wheels when present) into /tmp/ragbench-site
# (--no-index --no-deps --target: nothing of the machine's own is touched).
#   bash benchmarks/gpu_check.sh --out "$OUT/gpu.json"                      # CUDA, everything
#   bash benchmarks/gpu_check.sh --out "$OUT/gpu.json" --parts tests,e2e,greedy32,decode,logits,cost \
#        --models llama-3.1-8b-instruct                                 # issue 36's run
#   bash benchmarks/gpu_check.sh --out /tmp/gpu.json --device cpu --quick  # tiny, ~2 minutes
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
[ -x .venv/bin/python ] && [ -z "${PYTHON:-}" ] && PY=.venv/bin/python
WHEELS=""
[ -d gpu_carry/wheels ] && WHEELS=gpu_carry/wheels
ARGS=()
while [ $# -gt 0 ]; do
  case "$1" in
    --wheels) WHEELS="$2"; shift 2 ;;
    --wheels=*) WHEELS="${1#--wheels=}"; shift ;;
    --no-wheels) WHEELS=""; shift ;;
    *) ARGS+=("$1"); shift ;;
  esac
done
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
if [ -n "$WHEELS" ] && ls "$WHEELS"/*.whl >/dev/null 2>&1; then
  SITE="${RAGBENCH_SITE:-/tmp/ragbench-site}"
  if "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --disable-pip-version-check --target "$SITE" "$WHEELS"/*.whl >/tmp/ragbench-wheels.log 2>&1; then
    export PYTHONPATH="$PYTHONPATH:$SITE"  # holds only what the image lacks (gpu_carry.py)
    echo "wheels: installed $(ls "$WHEELS"/*.whl | wc -l) from $WHEELS into $SITE"
  else
    echo "wheels: install from $WHEELS failed (tail: $(tail -1 /tmp/ragbench-wheels.log)); parts needing them skip"
  fi
fi
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv || true
"$PY" -c 'import sys, torch, transformers; print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda, "transformers", transformers.__version__)'
# a hard stop under 8 minutes (GPU_CHECK_LIMIT seconds); the JSON is rewritten after each part,
# so a stop keeps what ran
exec timeout --signal=INT "${GPU_CHECK_LIMIT:-470}" "$PY" benchmarks/gpu_check.py "${ARGS[@]}"
