#!/usr/bin/env bash
# Fetch, on a development machine with network, the wheels scripts/gpu-acceptance.sh installs on the
# lent offline GPU machine (Python 3.12, x86-64; torch 2.11, transformers 5.17, accelerate,
# pandas, pyarrow, fsspec, xxhash, huggingface-hub, sympy, ... already there; docs/internals.md, "GPU
# acceptance"). Run once per set of pins: it asks the package registry for each file.
#
# What the machine lacks and esreason's GPU commands import: TRL (esreason.grpo), datasets and
# its dill / multiprocess (TRL), math-verify and its latex2sympy2_extended / antlr4 runtime (the
# math verifiers), and transformers: 5.17 is below pyproject's range (>=5.19), so the CI pin
# travels. TRL, math-verify and transformers are .ci/constraints.txt's pins; the others are the
# versions this project's development environment runs. peft 0.21.2 travels too: the machine has a
# peft of unknown version, and TRL imports peft whenever one is installed, so a peft that does not
# import beside transformers 5.23 would stop the GRPO trainer's import; 0.21.2 imports with TRL 1.16
# and transformers 5.23 (checked here). pyarrow stays the machine's (datasets 5.2.0 wants >= 24; its
# wheel alone is over half of the 64 MiB): the acceptance's preflight records the version found and
# datasets' requirement, and a section that cannot import what it needs is skipped with the error.
#
# Usage: scripts/gpu-wheels.sh [DEST]      # DEST defaults to .whl/acceptance (ignored by git)
# Prints every wheel, their total size and the tree's, and fails when the two together would
# exceed the 64 MiB that travel with a device call.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dest="${1:-$root/.whl/acceptance}"
py="${PYTHON:-python3}"
limit=$((64 * 1024 * 1024))

pin() {  # the version .ci/constraints.txt pins for $1
  local v
  v="$(sed -n "s/^$1==\([^ #]*\).*/\1/p" "$root/.ci/constraints.txt")"
  [[ -n "$v" ]] || { echo "gpu-wheels: .ci/constraints.txt pins no $1" >&2; exit 1; }
  echo "$v"
}
wheels=(
  "trl==$(pin trl)" "math-verify==$(pin math-verify)" "transformers==$(pin transformers)"
  "datasets==5.2.0" "dill==0.4.1" "multiprocess==0.70.19"
  "latex2sympy2_extended==1.11.0" "antlr4-python3-runtime==4.13.2" "peft==0.21.2"
)

mkdir -p "$dest"
rm -f "$dest"/*.whl  # one version of each: two of a package stop the whole install there
"$py" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  --platform any -d "$dest" "${wheels[@]}"

count="$(ls "$dest"/*.whl | wc -l)"
if [[ "$count" -ne "${#wheels[@]}" ]]; then
  echo "gpu-wheels: expected ${#wheels[@]} wheels in $dest, found $count" >&2
  exit 1
fi
ls -l "$dest"/*.whl | awk '{printf "%10d  %s\n", $5, $NF}'
whl_bytes="$(cat "$dest"/*.whl | wc -c)"
# what else travels: tracked files and untracked ones git does not ignore (deleted ones skipped)
tree_bytes="$(cd "$root" && git ls-files -z --cached --others --exclude-standard \
  | xargs -0 -r stat -c %s 2>/dev/null | awk '{s += $1} END {print s + 0}')"
total=$((whl_bytes + tree_bytes))
awk -v w="$whl_bytes" -v t="$tree_bytes" -v s="$total" -v l="$limit" 'BEGIN {
  printf "wheels %.1f MiB + tree %.1f MiB = %.1f MiB of the %.0f MiB a device call carries\n",
         w / 2^20, t / 2^20, s / 2^20, l / 2^20 }'
if (( total > limit )); then
  echo "gpu-wheels: over the 64 MiB a device call carries" >&2
  exit 1
fi
