#!/usr/bin/env bash
# Opt-in compatibility environment: the CI constraints with another transformers release
# (default 5.20.2, inside vLLM 0.33's range >=5.16.1,<5.21), torch 2.13.0 from local disk.
#   scripts/compat-env.sh [TRANSFORMERS_VERSION]      -> .venv-compat (ESREASON_COMPAT_VENV overrides)
#   .venv-compat/bin/python -m pytest -x -q           # the suite on that transformers
set -euo pipefail
cd "$(dirname "$0")/.."
version="${1:-5.20.2}"
venv="${ESREASON_COMPAT_VENV:-.venv-compat}"
constraints="$(mktemp)"
trap 'rm -f "$constraints"' EXIT
grep -v '^transformers==' .ci/constraints.txt > "$constraints"
echo "transformers==$version" >> "$constraints"
python3 -m venv "$venv"
"$venv/bin/pip" install -q -e '.[dev]' -c "$constraints"
"$venv/bin/python" - "$version" <<'PY'
import sys, torch, transformers
assert torch.__version__.startswith("2.13.0"), torch.__version__
assert transformers.__version__ == sys.argv[1], transformers.__version__
print(f"torch {torch.__version__}, transformers {transformers.__version__}")
PY
