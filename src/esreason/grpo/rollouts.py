"""GRPO rollouts on esreason's KV-cache sampler (TRL's ``rollout_func``) instead of ``model.generate``.

Why. On the CPU, TRL's transformers path (``unwrapped_model.generate``) spent most of a demo GRPO
update in generation: per-step overhead of ``generate`` and a cache that grows by ``torch.cat``.
:class:`esreason.backends.sampling.Sampler` is the engine that already samples the held-out
evaluations and every ES member (preallocated contiguous KV cache, batch compaction, one-token
CPU attention); see ``benchmarks/grpo_rollouts.py`` for the two side by side.

What TRL gets is what its own path produces:

- ``prompt_ids``: TRL's tokenisation of the prompts (``GRPOTrainer._tokenize_prompts``: its chat
  template and special-token handling; trl is pinned to 1.16.0, :func:`esreason.grpo.trainer.check_trl_version`);
- ``completion_ids``: one completion per prompt entry (TRL's sampler already repeats each prompt G
  times), ending with the EOS id where the response stopped at one, as ``generate`` keeps it (TRL
  masks what follows the first EOS; a response cut at ``max_completion_length`` has no EOS);
- ``logprobs``: None, as TRL's ``generate`` path returns (its importance-sampling correction is for
  vLLM rollouts only).

Sampling is the paper's: softmax(logits / temperature) restricted to the top-p nucleus (TRL's
settings here are top_k 0, min_p None, repetition penalty 1.0, :func:`esreason.grpo.trainer.build_trl_args`).
The random stream is the sampler's own, seeded per rollout batch by (train.seed, the trainer's
global step, the process index) via :func:`rollout_seed`; TRL's path draws from torch's global
generator instead. So a run is reproducible and resumes exactly (the seed is a function of the
step), but its samples differ from a ``rollouts: generate`` run with the same seed.

Used where :func:`uses_sampler` says so: ``grpo.rollouts: auto`` on ``device: cpu`` without vLLM
(DDP processes included), or ``rollouts: sampler``; never with vLLM rollouts, FSDP or DeepSpeed
(those need TRL's own parameter gathering around ``generate``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

_DOMAIN = 0x6A0_7011  # separates rollout seeds from every other seed derived from train.seed


def rollout_seed(train_seed: int, global_step: int, process_index: int) -> int:
    """63-bit sampling seed of the rollout batch generated at ``global_step`` by process ``process_index``."""
    state = np.random.SeedSequence([train_seed, _DOMAIN, global_step, process_index]).generate_state(
        1, dtype=np.uint64)[0]
    return int(state) >> 1


def uses_sampler(rollouts: str, *, use_vllm: bool, device: str) -> bool:
    """Whether ``grpo.rollouts`` resolves to the sampler: 'sampler', or 'auto' on the CPU without vLLM."""
    if use_vllm:
        return False
    return rollouts == "sampler" or (rollouts == "auto" and device == "cpu")


class SamplerRollouts:
    """TRL ``rollout_func``: ``__call__(prompts, trainer) -> {prompt_ids, completion_ids, logprobs}``.

    train_seed: train.seed (the rollout seeds derive from it).
    batch_size: sampler rows per forward (the whole rollout batch of one process fits one call
        at the demo's sizes; larger batches are decoded in chunks of this many rows).
    """

    def __init__(self, train_seed: int, batch_size: int) -> None:
        self.train_seed = train_seed
        self.batch_size = batch_size
        self._sampler: Any = None

    def _sampler_for(self, model: Any, tokenizer: Any, device: Any) -> Any:
        from esreason.backends.sampling import Sampler

        if self._sampler is None or self._sampler.model is not model:
            self._sampler = Sampler(model, tokenizer, batch_size=self.batch_size, device=device)
        return self._sampler

    def __call__(self, prompts: list[Any], trainer: Any) -> dict[str, Any]:
        import torch

        from esreason.backends.base import SamplingParams

        prompt_ids, _, _ = trainer._tokenize_prompts(prompts)  # TRL's own tokenisation (trl pinned)
        args = trainer.args
        model = trainer.accelerator.unwrap_model(trainer.model_wrapped)  # DDP: the module itself
        sampler = self._sampler_for(model, trainer.processing_class, trainer.accelerator.device)
        seed = rollout_seed(self.train_seed, int(trainer.state.global_step), int(trainer.accelerator.process_index))
        params = SamplingParams(max_new_tokens=int(args.max_completion_length), temperature=float(args.temperature),
                                top_p=float(args.top_p), seed=seed)
        with torch.no_grad():
            gen = sampler.generate_ids(prompt_ids, params)  # eval mode inside, training mode restored
        assert gen.stop_ids is not None
        completion_ids = [list(toks) + ([stop] if stop is not None else [])
                          for toks, stop in zip(gen.token_ids, gen.stop_ids)]
        return {"prompt_ids": [list(p) for p in prompt_ids], "completion_ids": completion_ids, "logprobs": None}
