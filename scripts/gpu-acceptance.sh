#!/usr/bin/env bash
# GPU acceptance (benchmarks/gpu_acceptance.py): a preflight, then the real commands -- `esreason train es`
# (3 updates + --resume-from step_2, same final hash), `esreason train grpo` through TRL (2 updates,
# rollout/train timed, beside the plan's terms for the GPU found), `esreason eval` (Pass@K), an ES stage
# as `experiment run` trains it (GPU 0 released after it) -- and the HF sampler against transformers'
# generate (token ids on padded prompts, tokens/s), on one CUDA device, from source, in one JSON, inside
# one time budget counted from this script's start.
#
# On the lent offline GPU machine (one H200: torch 2.11, transformers 5.17, Python 3.12; no TRL, datasets
# or math-verify): first, HERE, once, `scripts/gpu-wheels.sh` (fetches the missing wheels into
# .whl/acceptance, an ignored folder; prints their total size and the tree's against the 64 MiB that
# travel with the tree). Then one device call, carrying that folder (docs/internals.md, "GPU acceptance"):
#   run(command="bash scripts/gpu-acceptance.sh", carry=[".whl/acceptance"], timeout_s=420)
# This script installs the wheels with `pip install --no-index --no-deps --target` into a scratch
# directory, puts it and src/ on PYTHONPATH (nothing of esreason is installed) and sets
# HF_HUB_OFFLINE=1. The JSON goes to stdout and, section by section, to $OUT/gpu_acceptance.json
# (or --json PATH); exit 1 naming each failed, not started or skipped section, the JSON kept.
#
# Budget: on CUDA everything ends within 390 s of this script's start (--budget-s), 30 s inside the
# call's timeout_s: a section starts only when its estimate fits the time left (else it is reported
# "not started" with its estimate), and every child process gets the time left when it starts.
#
#   scripts/gpu-acceptance.sh                        # CUDA, Qwen2.5-1.5B shapes
#   scripts/gpu-acceptance.sh --tiny --device cpu    # the CPU twin (tests/test_gpu_acceptance.py)
#   scripts/gpu-acceptance.sh --sections es_resume --budget-s 240   # a second call: what did not start
set -euo pipefail
export ESREASON_ACCEPTANCE_T0="${ESREASON_ACCEPTANCE_T0:-$(date +%s.%N)}"  # the budget counts from here
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
