"""Sampled evaluation (paper, appendix "Evaluation Metrics" / "Evaluation Configuration").

- :func:`pass_at_k`, :func:`maj_at_k`: the per-problem estimators.
- :func:`evaluate_problems`: in-process evaluation for trainers (no files).
- :func:`evaluate`: the harness behind ``esreason eval`` (files, resume, summaries).

Heavy imports (torch, transformers) happen only when the harness runs.
"""

from __future__ import annotations

from typing import Any

from esreason.eval.metrics import pass_at_k, pooled_entropy
from esreason.eval.voting import maj_at_k

__all__ = ["Protocol", "Summary", "evaluate", "evaluate_problems", "maj_at_k", "pass_at_k", "pooled_entropy"]


def __getattr__(name: str) -> Any:
    if name in ("evaluate", "Summary"):
        from esreason.eval import harness

        return getattr(harness, name)
    if name == "evaluate_problems":
        from esreason.eval.library import evaluate_problems

        return evaluate_problems
    if name == "Protocol":
        from esreason.eval.records import Protocol

        return Protocol
    raise AttributeError(f"module 'esreason.eval' has no attribute {name!r}")
