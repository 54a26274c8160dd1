#!/usr/bin/env bash
# The GPU check (benchmarks/gpu_check.py) from source on a bare, offline CUDA machine: needs only
# torch and transformers installed, never installs esreason. Prints one JSON object; exit 1 when
# a check fails. Arguments go to the script, e.g.:
#   scripts/gpu-check.sh                              # Qwen2.5-1.5B shapes, random bf16 weights, CUDA
#   scripts/gpu-check.sh --population 32 --prompts 64 --tokens 512
#   scripts/gpu-check.sh --tiny --device cpu          # the CPU twin (tests/test_gpu_check.py)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export PYTHONPATH="$root/src${PYTHONPATH:+:$PYTHONPATH}"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
exec "${PYTHON:-python3}" "$root/benchmarks/gpu_check.py" "$@"
