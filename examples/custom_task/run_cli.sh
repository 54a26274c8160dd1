#!/usr/bin/env bash
# The custom task through the command line: data, ES, GRPO, evaluation, the comparison and its report.
#   examples/custom_task/run_cli.sh [OUT]        (OUT defaults to runs/custom-cli)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
out="${1:-runs/custom-cli}"
python "$here/make_data.py"
esreason tasks --tasks-dir "$here" | grep -A1 carry-add
esreason train es --config "$here/es.yaml" --tasks-dir "$here" --output "$out/es" --no-progress
esreason train grpo --config "$here/grpo.yaml" --tasks-dir "$here" --output "$out/grpo" --no-progress
esreason eval --tasks-dir "$here" --model "$out/es/checkpoints/step_10" --tasks carry-add \
    --samples 8 --k 1,8 --limit 64 --max-new-tokens 64 --output "$out/eval-es" --no-progress
esreason experiment run "$here/experiment.yaml" --output "$out/experiment" --no-progress
esreason report "$out/experiment"
