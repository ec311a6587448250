#!/usr/bin/env bash
# ragbench's LLM paths on a GPU: Llama-3.1-8B and Qwen2.5-7B shapes with random weights in bf16
# (no model files, no network), one JSON. Needs torch + transformers (+ PyYAML, which
# transformers installs); see benchmarks/gpu_check.py. About 3-6 minutes on one H200.
#   bash benchmarks/gpu_check.sh --out "$OUT/gpu.json"          # CUDA, full sizes
#   bash benchmarks/gpu_check.sh --out /tmp/gpu.json --device cpu --quick   # tiny, ~1 minute
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
[ -x .venv/bin/python ] && [ -z "${PYTHON:-}" ] && PY=.venv/bin/python
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv || true
"$PY" -c 'import torch, transformers; print("torch", torch.__version__, "cuda", torch.version.cuda, "transformers", transformers.__version__)'
# a hard stop under 8 minutes; the JSON is rewritten after each model, so a timeout keeps the first
exec timeout --signal=INT 470 "$PY" benchmarks/gpu_check.py "$@"
