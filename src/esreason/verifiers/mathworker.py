"""The math-verify worker process (started by :mod:`esreason.verifiers.mathpool`).

Reads one JSON request per line, ``{"gold": str, "pred": str}``, from the request
pipe and writes one JSON reply per line, ``{"status": "equal" | "different" |
"timeout" | "error", "detail": str}``. It runs math-verify in its own main thread,
so math-verify's ``signal.alarm`` limits work here; the parent adds a hard deadline
on top. It exits when the request pipe closes (the parent is gone).

Both answers are wrapped as ``\\boxed{...}`` and parsed with
``LatexExtractionConfig(boxed_match_priority=0)`` (the last box wins), falling back
to plain-expression extraction, then compared with ``verify(gold, pred)`` — gold
first, as math-verify's comparison is not symmetric.
"""

from __future__ import annotations

import json
import os
from typing import Any

PARSE_TIMEOUT_S = 3
VERIFY_TIMEOUT_S = 3


def _limit_memory(memory_bytes: int) -> None:
    try:
        import resource
    except ImportError:  # not POSIX: the parent's deadline still applies
        return
    if memory_bytes > 0:
        resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))


def _compare(mv: Any, config: list, gold: str, pred: str) -> dict[str, str]:
    from math_verify.errors import TimeoutException

    try:
        g = mv.parse(f"\\boxed{{{gold}}}", extraction_config=config, parsing_timeout=PARSE_TIMEOUT_S,
                     raise_on_error=True)
        p = mv.parse(f"\\boxed{{{pred}}}", extraction_config=config, parsing_timeout=PARSE_TIMEOUT_S,
                     raise_on_error=True)
        if not g:
            return {"status": "error", "detail": "math-verify could not parse the gold answer"}
        if not p:
            return {"status": "different", "detail": "math-verify could not parse the answer"}
        same = mv.verify(g, p, timeout_seconds=VERIFY_TIMEOUT_S, raise_on_error=True)
        return {"status": "equal" if same else "different", "detail": ""}
    except TimeoutException:
        return {"status": "timeout", "detail": "math-verify internal timeout"}
    except Exception as exc:  # sympy raises anything (incl. RecursionError, MemoryError) on hostile input
        return {"status": "error", "detail": f"{type(exc).__name__}: {str(exc)[:200]}"}


def main(req_fd: int, rep_fd: int, memory_bytes: int) -> None:
    _limit_memory(memory_bytes)
    import math_verify as mv
    from math_verify import ExprExtractionConfig, LatexExtractionConfig

    config = [LatexExtractionConfig(boxed_match_priority=0), ExprExtractionConfig()]
    requests = os.fdopen(req_fd, "rb")
    replies = os.fdopen(rep_fd, "wb", buffering=0)

    def reply(obj: dict) -> None:
        replies.write((json.dumps(obj) + "\n").encode())

    reply({"ready": True})
    for line in requests:
        try:
            req = json.loads(line)
            out = _compare(mv, config, str(req["gold"]), str(req["pred"]))
        except MemoryError:
            out = {"status": "error", "detail": "MemoryError"}
        except (ValueError, KeyError, TypeError) as exc:
            out = {"status": "error", "detail": f"bad request: {exc}"}
        reply(out)
