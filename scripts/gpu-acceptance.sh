#!/usr/bin/env bash
# GPU acceptance (issue 35, item 2; benchmarks/gpu_acceptance.py): the real commands -- `esreason
# train es` (3 updates + --resume-from step_2, same final hash), `esreason train grpo` through TRL
# (2 updates, rollout/train timed, next to the plan's terms), `esreason eval` (Pass@K) -- and the HF
# sampler against transformers' generate, on one CUDA device, from source, in one JSON.
#
# On the lent offline GPU machine (torch 2.11, transformers 5.17, Python 3.12; no TRL, datasets or
# math-verify): first, HERE, once, `scripts/gpu-wheels.sh` (fetches the missing wheels into
# .whl/acceptance, an ignored folder; prints their total size, 14.8 MiB, under the 64 MiB that
# travel with the tree). Then one device call, carrying that folder:
#   run(command="bash scripts/gpu-acceptance.sh", carry=[".whl/acceptance"], timeout_s=450)
# This script installs the wheels with `pip install --no-index --no-deps --target` into a scratch
# directory, puts it and src/ on PYTHONPATH (nothing of esreason is installed) and sets
# HF_HUB_OFFLINE=1. The JSON goes to stdout and, section by section, to $OUT/gpu_acceptance.json
# (or --json PATH); exit 1 naming each failed section, the JSON of the sections done kept.
#
# Device-time budget: 8 minutes per call, start included, so that a 15-minute booking has room for a
# second try. Estimated from the H100 figures of 2026-11-28 (docs/scale.md, "GPU acceptance", shows
# the arithmetic): machine start and transfer ~90 s, wheels ~10 s, then the driver: setup ~15 s,
# es_resume ~135 s (three 9.3 GB checkpoints: bf16 weights + fp32 masters), grpo ~85 s (its
# end-of-run TRL checkpoint ~40 s), grpo_plan ~3 s, eval ~20 s, sampler_vs_generate ~35 s,
# es_resume_embedded ~25 s: ~320 s, ~420 s in all. The driver starts no section after 330 s
# (--deadline-s) and stops any child there, so the call ends inside its limit with the JSON of
# what was done. The CPU twin: ~150 s wall on the 2 shared development cores (load ~7), 34 s CPU.
#
#   scripts/gpu-acceptance.sh                        # CUDA, Qwen2.5-1.5B shapes
#   scripts/gpu-acceptance.sh --tiny --device cpu    # the CPU twin (tests/test_gpu_acceptance.py)
#   scripts/gpu-acceptance.sh --sections grpo,grpo_plan
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
py="${PYTHON:-python3}"
wheels="${ESREASON_WHEELS:-$root/.whl/acceptance}"
site=""
if compgen -G "$wheels/*.whl" >/dev/null; then
  site="${ESREASON_WHEEL_SITE:-/tmp/esreason-acceptance-site}"
  if ! "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" \
      "$wheels"/*.whl; then
    echo "gpu-acceptance: installing the wheels of $wheels into $site failed" >&2
    exit 1
  fi
fi
export PYTHONPATH="$root/src${site:+:$site}${PYTHONPATH:+:$PYTHONPATH}"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export PYTHONUNBUFFERED=1
exec "$py" "$root/benchmarks/gpu_acceptance.py" "$@"
