"""Do in-place weight writes reach the model as the engine serves it? (the vLLM start self-check)

ES perturbs and restores a vLLM engine's weights in place (:mod:`esreason.backends.vllm_worker`).
With CUDA graphs on (vLLM's default, ``enforce_eager: false``) the captured graphs read the
weights' storage, so in-place writes should stay visible, but one vLLM issue lists eager
mode as required for in-place edits, and nothing in the paper's setting has tested it. The
check settles it on the user's hardware at engine start, in a few greedy decodes:

1. greedy tokens and their log-probabilities at the centre;
2. the same under a large perturbation: they must differ (else the served model does not
   see the writes);
3. the same after the exact restore: they must equal step 1 (else a write or the restore
   is lost).

:class:`~esreason.backends.vllm.VLLMEngine` runs it when CUDA graphs are on and restarts the
engine with ``enforce_eager=True`` and a one-line warning when it fails. No vLLM import here.
"""

from __future__ import annotations

import math
from typing import Callable, Sequence

#: A greedy decode of the probe prompts: per prompt, (token ids, log-probability of each token).
Probe = Sequence[tuple[Sequence[int], Sequence[float]]]

PROBE_SIGMA = 0.05  # large on purpose: the check is about visibility, not ES's step size
LOGPROB_TOL = 1e-3  # "unchanged" allows kernel noise; "differs" needs more than it


def _max_logprob_gap(a: Probe, b: Probe) -> float:
    gap = 0.0
    for (ids_a, lp_a), (ids_b, lp_b) in zip(a, b):
        if list(ids_a) != list(ids_b):
            return math.inf
        gap = max([gap, *(abs(x - y) for x, y in zip(lp_a, lp_b))])
    return gap


def inplace_update_check(decode: Callable[[], Probe], perturb: Callable[[], None],
                         restore: Callable[[], None]) -> str | None:
    """None when perturb/restore are visible to ``decode`` and exact; else a one-line reason."""
    centre = decode()
    perturb()
    try:
        moved = decode()
    finally:
        restore()
    back = decode()
    if _max_logprob_gap(centre, back) > LOGPROB_TOL:
        return "greedy output after perturb + restore differs from the centre's"
    if _max_logprob_gap(centre, moved) <= LOGPROB_TOL:
        return "greedy output under a perturbation equals the centre's (in-place writes not seen)"
    return None


__all__ = ["LOGPROB_TOL", "PROBE_SIGMA", "Probe", "inplace_update_check"]
