#!/usr/bin/env bash
# The newest-transformers job (.ci/run runs it after the main suite): the smoke subset of the suite
# on the newest transformers release the registry serves, so a breaking release shows up in our CI
# rather than at a user's. The main suite stays on the pinned version (.ci/constraints.txt).
#   scripts/newest-transformers.sh [VERSION]    -> .venv-newest (ESREASON_NEWEST_VENV overrides)
# VERSION defaults to the newest on the index (`pip index versions transformers`). The environment
# is scripts/compat-env.sh's: the CI constraints minus the transformers pin (torch 2.13.0 from local
# disk, never a CUDA build), pip's cache reused. Exit status:
#   0  the release passes the smoke subset, or pyproject.toml's range already excludes it (known);
#   1  the release breaks esreason and pyproject.toml still admits it: the message names it and the
#      upper bound to add.
set -euo pipefail
cd "$(dirname "$0")/.."
start=$SECONDS
venv="${ESREASON_NEWEST_VENV:-.venv-newest}"
# The smoke subset: the sampler (pinned outputs, clean output, equality with generate), one ES run,
# one GRPO run, one evaluation.
SMOKE=(
  tests/test_decode_pinned.py
  tests/test_clean_output.py
  "tests/test_sampling.py::test_greedy_equals_hf_generate_with_left_padding"
  "tests/test_es_train.py::test_run_directory_contract"
  "tests/test_grpo_run.py::test_run_logs_kl_entropy_clip_and_heldout_per_update"
  "tests/test_eval_command.py::test_eval_command_writes_results"
)
version="${1:-}"
if [ -z "$version" ]; then
  version="$(python3 -m pip index versions transformers 2>/dev/null | sed -n 's/^transformers (\(.*\))$/\1/p')"
  [ -n "$version" ] || { echo "newest-transformers: cannot read the newest transformers from the index" >&2; exit 1; }
fi
# Does pyproject.toml's transformers range admit it?
read -r admitted range < <(python3 - "$version" <<'PY'
import re, sys, tomllib
from packaging.specifiers import SpecifierSet
deps = tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]
spec = next(re.sub(r"^transformers\s*", "", d) for d in deps if re.match(r"transformers\b", d))
print("yes" if SpecifierSet(spec).contains(sys.argv[1], prereleases=True) else "no", spec)
PY
)
echo "newest-transformers: transformers $version (pyproject.toml: transformers$range)"
if [ "$admitted" = no ]; then
  echo "newest-transformers: transformers $version is excluded by pyproject.toml (transformers$range), known incompatible; not tested"
  exit 0
fi
ESREASON_COMPAT_VENV="$venv" scripts/compat-env.sh "$version"
if "$venv/bin/python" -m pytest -q -p no:cacheprovider "${SMOKE[@]}"; then
  echo "newest-transformers: transformers $version passes the smoke subset ($((SECONDS - start)) s)"
else
  echo "newest-transformers: FAILED: transformers $version, the newest release, breaks esreason (smoke subset above)." \
       "Fix it, or add the upper bound 'transformers$range,<$version' to pyproject.toml and docs/install.md." >&2
  exit 1
fi
