"""What an evaluation engine returns for rows, and the HF twin's way of producing it.

Shared by the call path (:mod:`esreason.backends.vllm_eval`) and the streamed path
(:mod:`esreason.backends.eval_stream`): the output record, the sampler's stop-token convention, and
one row at a time on our sampler with the row's own seed (batch-invariant by construction).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from esreason.backends.base import SamplingParams


@dataclass(frozen=True)
class RequestOutput:
    """What an engine returns for its block of rows (token ids without the stop token)."""

    token_ids: list[list[int]]
    entropy_sum: list[float] | None


def strip_stop(ids: Sequence[int], finish_reason: str | None, eos: set[int]) -> list[int]:
    """vLLM keeps the EOS id in ``token_ids``; the sampler's convention drops it."""
    out = list(ids)
    if finish_reason == "stop" and out and out[-1] in eos:
        out.pop()
    return out


def sampler_generate_requests(sampler: Any, prompt_ids: Sequence[Sequence[int]], seeds: Sequence[int],
                              params: SamplingParams) -> RequestOutput:
    """Row i sampled by the HF sampler alone with seed ``seeds[i]`` (entropy from the sampler itself)."""
    ids: list[list[int]] = []
    ents: list[float] = []
    for row, seed in zip(prompt_ids, seeds):
        gen = sampler.generate_ids([row], SamplingParams(
            max_new_tokens=params.max_new_tokens, temperature=params.temperature, top_p=params.top_p,
            seed=int(seed), compute_entropy=params.compute_entropy))
        ids.append(gen.token_ids[0])
        if gen.entropy_sum is not None:
            ents.append(gen.entropy_sum[0])
    return RequestOutput(ids, ents if params.compute_entropy else None)
