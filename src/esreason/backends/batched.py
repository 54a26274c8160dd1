"""Population-batched evaluation (``backend.type: batched``): many ES members in one forward.

Paper appendix "Implementation Procedure", step 3 evaluates every member on the shared
mini-batch; the reference (:class:`esreason.es_loop.evaluate.SequentialEvaluator`) does it one
member at a time, which on a small model is dominated by per-call overhead. Here a group
of ``backend.population_batch`` members (0 = all) decodes together: member weights are
stacked ([P, *shape], :class:`esreason.backends.popmodel.PopulationModel`) and every
linear layer is one ``baddbmm`` over members, with a KV cache per (member, prompt) row.

Identical to the sequential reference, by construction
-------------------------------------------------------
The decode loop mirrors :class:`esreason.backends.sampling.Sampler` row for row: same
tokenisation, length-sorted chunks of ``generation.batch_size`` prompts with the same left
padding and position ids, the same stop rules and context budget, and for temperature > 0
the same uniforms (member i, chunk c draws from ``chunk_generator(seed_i, c)`` one uniform
per chunk row and step while member i still runs). Member weights are bit-identical to
``HFPolicy.perturb(seed, sign * sigma)``.

The one numerical subtlety is the GEMM row count. On CPU (MKL, fp32) a row's result does
not depend on how many rows the GEMM has *as long as it has at least 4*; 1 row (gemv) and
2-3 rows use other kernels with other summation orders (measured: ``EXACT_ROWS_BELOW``).
The sequential sampler drops finished rows (compaction), so a member may run its last
steps with 1-3 rows. The decoder therefore simulates, per member, the row count the
sequential sampler would have, and keeps members whose count is below 4 in separate
*blocks* whose GEMMs have exactly that many rows per member; everyone else shares the main
block (rows per member >= 4, padded). With this, logits are bit-identical to sequential
decoding on CPU (tests/test_batched.py checks texts, rewards and a 2-step ES checkpoint).
On other devices (CUDA) GEMM results may depend on the batch shape in other ways: there
rewards are equal unless a greedy argmax or a sampling boundary sits within rounding
error (not measured on a GPU; docs/internals.md, "Batched evaluation").

Member weights come from the policy itself (perturb, copy out, restore; see
``PopulationModel.stack_members``), so every perturbation mode of the policy (dense or
low-rank directions, ``es.restore`` exact or subtract, fp32 masters) is reproduced, and the
policy's direction cache is filled for the update as in sequential evaluation.

Not supported (UserError naming the key): non-float32 weights (``dtype``; the bf16 HF
forward uses other kernels), models other than the Llama/Qwen2 layout (``model``, see
:func:`esreason.backends.popmodel.check_supported`), per-member differences in
max_new_tokens/temperature/top_p. Entropy (``compute_entropy``) is not computed.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Sequence

import numpy as np
import torch

from esreason.backends.base import Generation, PopulationResult, SamplingParams
from esreason.backends.popdecode import DecodeStats, ChunkDecoder
from esreason.backends.popmodel import PopulationModel, check_supported
from esreason.backends.sampling import Sampler, check_params
from esreason.embedded import safe_decode
from esreason.errors import UserError
from esreason.es.population import Population
from esreason.verifiers.base import Verdict
from esreason.verifiers.batch import score_texts

def check_batched_config(cfg: Any) -> None:
    """Reject settings the batched backend cannot reproduce exactly (UserError naming the key)."""
    if cfg.dtype != "float32":
        raise UserError(f"config key 'dtype': backend.type 'batched' needs float32 weights (got {cfg.dtype!r}); "
                        "use backend.type: hf for bfloat16/float16")


# --------------------------------------------------------------------------- evaluator


class BatchedEvaluator:
    """:class:`~esreason.backends.base.PopulationEvaluator` that decodes member groups together.

    policy: the trainer's :class:`~esreason.backends.hf.HFPolicy`; its model's current weights are
        the centre (read at every call, so the trainer's in-place updates are seen).
    sampler: the run's :class:`Sampler`; its tokenizer, ``batch_size`` (prompt chunking), EOS/pad
        ids, context limit and compaction setting define the decoding this evaluator reproduces.
    population_batch: members per batched forward (0 = the whole population).
    """

    def __init__(self, policy: Any, sampler: Sampler, *, population_batch: int = 0) -> None:
        if not isinstance(sampler, Sampler):
            raise UserError(f"backend.type 'batched' needs the transformers Sampler, got {type(sampler).__name__}")
        if not isinstance(population_batch, int) or population_batch < 0:
            raise UserError(f"config key 'backend.population_batch': must be an integer >= 0 (got {population_batch!r})")
        model = policy.model
        check_supported(model)
        dtype = next(model.parameters()).dtype
        if dtype != torch.float32:
            raise UserError(f"config key 'dtype': backend.type 'batched' needs float32 weights (got {dtype})")
        self.policy = policy
        self.sampler = sampler
        self.population_batch = population_batch
        self.pm = PopulationModel(model)
        self.stats = DecodeStats()

    # PopulationEvaluator -----------------------------------------------------------
    def evaluate(self, population: Population, sigma: float, prompts: Sequence[str], golds: Sequence[Any],
                 scorer: Callable[[str, Any], Verdict], params: Sequence[SamplingParams]) -> PopulationResult:
        n, b = len(population), len(prompts)
        t0 = time.perf_counter()
        sigmas = [sign * sigma for sign in population.signs]
        gens = self.generate_population(population.seeds, sigmas, prompts, params)
        t_gen = time.perf_counter() - t0 - self.stats.seconds.get("stack", 0.0)
        rewards = np.zeros((n, b), dtype=np.float64)
        correct = np.zeros((n, b), dtype=bool)
        formatted = np.zeros((n, b), dtype=bool)
        t0 = time.perf_counter()
        for i, gen in enumerate(gens):  # one scoring call per member (reward functions take lists)
            for j, v in enumerate(score_texts(scorer, gen.texts, golds)):
                rewards[i, j], correct[i, j], formatted[i, j] = v.reward, v.correct, v.formatted
        t_rew = time.perf_counter() - t0
        timings = {"generate": t_gen, "reward": t_rew, "stack": self.stats.seconds.get("stack", 0.0)}
        lengths = np.array([[len(ids) for ids in g.token_ids] for g in gens], dtype=np.int64).reshape(n, b)
        return PopulationResult(rewards, correct, formatted, sum(g.num_tokens for g in gens), timings, lengths)

    def after_update(self, seeds: Sequence[int], weights: Sequence[float], alpha: float, step: int) -> None:
        return None  # the centre is the policy's model, updated in place by the trainer

    def close(self) -> None:
        return None

    # Generation ----------------------------------------------------------------------
    def generate_population(self, seeds: Sequence[int], sigmas: Sequence[float], prompts: Sequence[str],
                            params: Sequence[SamplingParams]) -> list[Generation]:
        """Responses of member i = (seeds[i], sigmas[i]) to every prompt, as ``Sampler.generate`` would
        give with ``HFPolicy.perturb(seeds[i], sigmas[i])`` and ``params[i]``."""
        n = len(seeds)
        if len(sigmas) != n or len(params) != n:
            raise ValueError(f"{n} seeds, {len(sigmas)} sigmas and {len(params)} params must match")
        if isinstance(prompts, str):
            raise UserError("prompts must be a sequence of strings, got a single string")
        self._check_params(params)
        self.stats = DecodeStats(seconds={"stack": 0.0})
        s = self.sampler
        ids = s.tokenizer(list(prompts), add_special_tokens=False)["input_ids"] if len(prompts) else []
        rows = [list(map(int, r)) for r in ids]
        for i, r in enumerate(rows):
            if not r:
                raise UserError(f"prompt {i} is empty after tokenisation")
            if min(r) < 0 or max(r) >= s.vocab_size:
                raise UserError(f"prompt {i} has token ids outside [0, {s.vocab_size})")
        max_new = params[0].max_new_tokens if params else 0
        budgets = [self._budget(len(r), max_new) for r in rows]
        run = [j for j in range(len(rows)) if budgets[j] > 0]
        if s.sort_by_length:
            run.sort(key=lambda j: -len(rows[j]))  # stable, as Sampler
        tokens: list[list[list[int]]] = [[[] for _ in rows] for _ in range(n)]
        group = self.population_batch or n
        model = self.pm.model
        was_training = model.training
        model.eval()
        try:
            for g0 in range(0, n, group):
                members = list(range(g0, min(n, g0 + group)))
                t0 = time.perf_counter()
                weights = self.pm.stack_members(self.policy, [seeds[i] for i in members],
                                                [sigmas[i] for i in members])
                self.stats.seconds["stack"] += time.perf_counter() - t0
                for c, start in enumerate(range(0, len(run), s.batch_size)):
                    idx = run[start:start + s.batch_size]
                    dec = ChunkDecoder(self.pm, weights, [rows[j] for j in idx], [budgets[j] for j in idx],
                                        [params[i] for i in members], c, stop_ids=s.eos_ids, pad_id=s.pad_id,
                                        max_positions=s.max_positions, compact=s.compact, stats=self.stats)
                    with torch.inference_mode():
                        out, _ = dec.run()
                    for gi, i in enumerate(members):
                        for jj, j in enumerate(idx):
                            tokens[i][j] = out[gi][jj]
                del weights
        finally:
            model.train(was_training)
        return [Generation(texts=[safe_decode(s.tokenizer, t, skip_special_tokens=True) for t in member],
                           token_ids=member) for member in tokens]

    # Internals ---------------------------------------------------------------------
    def _budget(self, prompt_len: int, max_new_tokens: int) -> int:
        """New tokens allowed for a prompt (the Sampler's rule: cut at the context limit)."""
        limit = self.sampler.max_positions
        return max_new_tokens if limit is None else max(0, min(max_new_tokens, limit - prompt_len))

    @staticmethod
    def _check_params(params: Sequence[SamplingParams]) -> None:
        for p in params:
            check_params(p)
        if params:
            first = params[0]
            for i, p in enumerate(params):
                if (p.max_new_tokens, p.temperature, p.top_p) != (first.max_new_tokens, first.temperature,
                                                                   first.top_p):
                    raise UserError(f"backend.type 'batched': member {i} has sampling params "
                                    f"(max_new_tokens, temperature, top_p) different from member 0; "
                                    "only the seed may differ per member")
