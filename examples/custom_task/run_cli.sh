#!/usr/bin/env bash
# The custom task through the command line: the task listing, ES (the run train.py makes through the
# Python API), the GRPO comparator, and a Pass@K evaluation of the ES checkpoint (the commands of
# docs/custom-tasks.md, section 3).
#   examples/custom_task/run_cli.sh [OUT]        (OUT defaults to runs/custom-cli)
# The three-method comparison with its report: esreason experiment run examples/custom_task/experiment.yaml
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
out="${1:-runs/custom-cli}"
esreason tasks --tasks-dir "$here" | grep -A1 carry-add
esreason train es --config "$here/es.yaml" --tasks-dir "$here" --output "$out/es" --no-progress
esreason train grpo --config "$here/grpo.yaml" --tasks-dir "$here" --output "$out/grpo" --no-progress
esreason eval --tasks-dir "$here" --model "$out/es/checkpoints/step_10" --tasks carry-add \
    --samples 8 --k 1,8 --limit 64 --max-new-tokens 64 --output "$out/eval-es" --no-progress
