"""Batched verification of many responses, so that scoring never dominates an evaluation.

Two savings: identical (response, problem) pairs are scored once (a model at low
temperature often repeats itself; with 32 samples per problem this is common), and
verifiers whose cost is outside the interpreter — math-verify in its worker pool,
MBPP programs in the sandbox — are called from a thread pool, so those processes run
in parallel. Pure in-process verifiers (choice, HotpotQA, Countdown's AST walker, the
math fast path) are called inline: threads would only add overhead under the GIL.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Sequence

from esreason.verifiers.base import Verdict

MAX_WORKERS = 16


def default_workers(verifier: str) -> int:
    """Threads used to score responses of verifier ``verifier`` (registered with ``parallel=True``:
    its calls wait on other processes, worth a thread pool)."""
    from esreason import verifiers

    if not verifiers.is_parallel(verifier):
        return 1
    return max(1, min(MAX_WORKERS, os.cpu_count() or 1))


def score_batch(scorer: Callable[[str, Any], Verdict], texts: Sequence[str], golds: Sequence[Any],
                groups: Sequence[int], workers: int = 1) -> list[Verdict]:
    """Verdicts for ``texts[i]`` against ``golds[i]``, in order.

    groups: per item, the index of its problem; items with the same group and the same
        text are scored once and share the verdict (the gold of a problem is fixed).
    workers: threads; 1 scores inline.
    """
    if not (len(texts) == len(golds) == len(groups)):
        raise ValueError(f"{len(texts)} texts, {len(golds)} golds and {len(groups)} groups")
    first: dict[tuple[int, str], int] = {}
    unique: list[int] = []
    for i, (g, t) in enumerate(zip(groups, texts)):
        if (g, t) not in first:
            first[(g, t)] = len(unique)
            unique.append(i)
    if hasattr(scorer, "score_batch"):  # reward functions: one call over every unique response
        from esreason.verifiers.batch import score_texts

        verdicts = score_texts(scorer, [texts[i] for i in unique], [golds[i] for i in unique])
    elif workers > 1 and len(unique) > 1:
        with ThreadPoolExecutor(max_workers=min(workers, len(unique)), thread_name_prefix="esreason-verify") as ex:
            verdicts = list(ex.map(lambda i: scorer(texts[i], golds[i]), unique))
    else:
        verdicts = [scorer(texts[i], golds[i]) for i in unique]
    return [verdicts[first[(g, t)]] for g, t in zip(groups, texts)]
