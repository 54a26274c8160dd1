"""Write docs/api.md, the Python API reference, from the docstrings of esreason.api (what help() shows).

Run it after changing a parameter, a field or a docstring of ``ESConfig``, ``ESTrainer``,
``GRPOComparator`` or ``evaluate``; tests/test_api_doc.py fails while the file is stale.
``--check`` only compares and exits 1 when the file differs.

Usage: python scripts/api_doc.py [--check]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from esreason.api_docs import DOC_PATH, render, write

REPO = Path(__file__).resolve().parents[1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when docs/api.md is not current")
    args = parser.parse_args(argv)
    if args.check:
        path = REPO / DOC_PATH
        current = path.read_text(encoding="utf-8") if path.is_file() else ""
        if current != render():
            print(f"{DOC_PATH} is stale: run python scripts/api_doc.py", file=sys.stderr)
            return 1
        print(f"{DOC_PATH} is current")
        return 0
    print(f"wrote {write(REPO).relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
