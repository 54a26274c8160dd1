"""What an ``esreason analyze`` command prints: its Markdown tables (or, with ``--json``, only
the JSON payload) on stdout, and the payload's notes and the written paths on stderr.

Shared by the weight, estimator and coverage commands, so none of them imports another's
command module.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from esreason.analysis.tables import render_markdown


def print_result(args: argparse.Namespace, tables: list, payload: dict[str, Any], written: list[Path]) -> None:
    """Print ``tables`` (or ``payload`` as JSON when ``args.json``), then notes and ``written`` on stderr."""
    if args.json:
        print(json.dumps(payload, indent=2, default=str))
    else:
        print(render_markdown(tables))
    for note in payload_notes(payload):
        print(f"note: {note}", file=sys.stderr)
    if written:
        print("wrote: " + ", ".join(str(p) for p in written), file=sys.stderr)


def payload_notes(payload: Any) -> list[str]:
    """Every 'notes' list in a payload (nested reference/checkpoint entries included), deduplicated."""
    out: list[str] = []
    stack = [payload]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            for k, v in node.items():
                if k == "notes" and isinstance(v, list):
                    out += [n for n in v if isinstance(n, str) and n not in out]
                elif isinstance(v, (dict, list)):
                    stack.append(v)
        elif isinstance(node, list):
            stack.extend(x for x in node if isinstance(x, (dict, list)))
    return out


__all__ = ["payload_notes", "print_result"]
