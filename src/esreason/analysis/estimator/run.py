"""Running the local perturbation diagnostic (paper appendix "ES–ZO Estimator Equivalence", Protocol).

:func:`run_diagnostic` loads the model (or takes one), builds the fixed inputs once, evaluates
every requested objective at the centre, then perturbs the weights once per
(sigma, direction, sign) with :class:`esreason.backends.hf.HFPolicy` (directions from
:mod:`esreason.es.noise`, exact restore) and evaluates every objective there. Statistics
are computed later from the returned :class:`~esreason.analysis.estimator.DiagnosticResult`.

Seeds (see :mod:`esreason.analysis.estimator.diagnostic` for the coupling design):

- direction d: ES seed ``direction_seed + d``, evaluated at +sigma and -sigma;
- ``common`` regenerated rollouts: the sampler call seed ``seed`` everywhere;
- ``independent``: ``SeedSequence([seed, 1, bits(sigma), d, sign])`` at theta +- sigma*eps_d
  (the same sigma gives the same draws whatever the rest of the grid), and
  ``SeedSequence([seed, 2, d])`` for the centre evaluation paired with direction d;
- fixed rollouts: sampled once at the centre with ``SeedSequence([seed, 3])``.
"""

from __future__ import annotations

import hashlib
import sys
import time
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import torch

from esreason.analysis.estimator.diagnostic import DiagnosticResult, EstimatorSettings
from esreason.analysis.estimator.stats import Observations
from esreason.errors import UserError


def weights_digest(model: torch.nn.Module) -> str:
    """SHA-256 over every parameter's name, dtype, shape and raw bytes (bit-exact identity of the weights)."""
    h = hashlib.sha256()
    for name, p in model.named_parameters():
        t = p.detach().contiguous().cpu()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}".encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


def call_seed(*parts: int) -> int:
    """A 63-bit sampler seed derived from integer parts (distinct parts -> independent streams)."""
    state = np.random.SeedSequence([int(x) % 2**63 for x in parts]).generate_state(1, dtype=np.uint64)[0]
    return int(state) >> 1


def _progress(enabled: bool) -> Callable[[str], None]:
    t0 = time.perf_counter()

    def say(message: str) -> None:
        if enabled:
            print(f"[estimator {time.perf_counter() - t0:7.1f}s] {message}", file=sys.stderr, flush=True)
    return say


def supervised_batch(settings: EstimatorSettings, task: Any, problems: list[Any], tokenizer: Any) -> list[Any]:
    """The fixed batch: SST-2 (verbalised) or the task's prompts with their gold completions + EOS.

    Gold completion: the problem's ``meta['target_text']`` (the synthetic tasks' chain of
    thought and boxed answer), else ``\\boxed{gold}`` for math/choice tasks.
    """
    from esreason.analysis.estimator.objectives import SupervisedExample
    from esreason.tasks import problem_prompt

    if settings.supervised == "sst2":
        from esreason.analysis.estimator.sst2 import sst2_examples

        return sst2_examples(tokenizer, settings.sst2_split, settings.sst2_path, settings.ce_examples)
    if len(problems) < settings.ce_examples:
        raise UserError(f"--ce-examples {settings.ce_examples}: task {task.name!r} split {settings.split!r} has "
                        f"only {len(problems)} problems")
    out = []
    eos = tokenizer.eos_token_id
    for prob in problems[:settings.ce_examples]:
        target = prob.meta.get("target_text")
        if target is None:
            if task.verifier not in ("math", "choice"):
                raise UserError(f"task {task.name!r} has no gold completion text for the supervised control; "
                                "use --supervised sst2")
            target = f"\\boxed{{{prob.gold}}}"
        prompt = tokenizer(problem_prompt(tokenizer, prob), add_special_tokens=False)["input_ids"]
        completion = tokenizer(target, add_special_tokens=False)["input_ids"] + ([eos] if eos is not None else [])
        out.append(SupervisedExample(prompt_ids=tuple(prompt), candidates=(tuple(completion),)))
    return out


@dataclass
class _Context:
    """The fixed inputs of one run (built once at the centre)."""

    settings: EstimatorSettings
    model: Any
    sampler: Any
    scorer: Any
    reward_rows: list[str]   # [S_r * P_r] prompts, row = s * P_r + p
    reward_golds: list[Any]
    fixed: Any               # FixedRollouts or None
    examples: list[Any]      # supervised batch (empty when 'ce' is not requested)
    pad_id: int

    def params(self, seed: int) -> Any:
        from esreason.backends.base import SamplingParams

        s = self.settings
        return SamplingParams(max_new_tokens=s.max_new_tokens, temperature=s.temperature, top_p=s.top_p, seed=seed)


def _evaluate_here(ctx: _Context, reward_seeds: dict[str, int], *, deterministic: bool = True
                   ) -> dict[str, tuple[np.ndarray, list[str] | None]]:
    """Every requested objective at the model's current weights.

    reward_seeds: coupling -> sampler call seed for the regenerated rollouts to draw here.
    deterministic: also evaluate the fixed-rollout and fixed-batch objectives.
    Returns {'reward|<coupling>' | objective name: (values float64 [rows], texts or None)}.
    """
    from esreason.analysis.estimator import objectives as obj

    s, sb = ctx.settings, ctx.settings.score_batch_size
    out: dict[str, tuple[np.ndarray, list[str] | None]] = {}
    for coupling, seed in reward_seeds.items():
        out[f"reward|{coupling}"] = obj.rollout_rewards(ctx.sampler, ctx.reward_rows, ctx.reward_golds, ctx.scorer,
                                                        ctx.params(seed))
    if deterministic and ctx.fixed is not None:
        values = obj.fixed_rollout_objectives(ctx.model, ctx.fixed, batch_size=sb, pad_id=ctx.pad_id)
        out.update({name: (values[name], None) for name in s.objectives if name in obj.FIXED_OBJECTIVES})
    if deterministic and ctx.examples:
        out["ce"] = (obj.supervised_ce(ctx.model, ctx.examples, batch_size=sb, pad_id=ctx.pad_id), None)
    return out


def _build_context(settings: EstimatorSettings, model: Any, tokenizer: Any, facts: dict[str, Any]) -> _Context:
    """Load the task, render prompts, sample the fixed rollouts at the centre, tokenise the fixed batch."""
    from esreason import tasks
    from esreason.analysis.estimator import objectives as obj
    from esreason.backends.sampling import Sampler
    from esreason.tasks import problem_prompt

    task = tasks.get(settings.task)
    scorer = task.scorer(settings.format_reward)
    wants = set(settings.objectives)
    n_reward = settings.reward_prompts if "reward" in wants else 0
    n_fixed = settings.rollout_prompts if wants & set(obj.FIXED_OBJECTIVES) else 0
    n_ce = settings.ce_examples if ("ce" in wants and settings.supervised == "task") else 0
    problems = task.load(settings.split, settings.data_path, max(n_reward, n_fixed, n_ce, 1))
    if len(problems) < max(n_reward, n_fixed):
        raise UserError(f"task {settings.task!r} split {settings.split!r} has {len(problems)} problems; "
                        f"the grid needs {max(n_reward, n_fixed)} (--reward-prompts / --rollout-prompts)")
    prompts = [problem_prompt(tokenizer, p) for p in problems]
    golds = [p.gold for p in problems]
    pad_id = int(tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0)
    sampler = Sampler(model, tokenizer, batch_size=settings.batch_size)
    ctx = _Context(settings, model, sampler, scorer,
                   reward_rows=[prompts[p] for _ in range(settings.reward_seeds) for p in range(n_reward)],
                   reward_golds=[golds[p] for _ in range(settings.reward_seeds) for p in range(n_reward)],
                   fixed=None, examples=[], pad_id=pad_id)
    if n_fixed:
        ctx.fixed = obj.build_fixed_rollouts(model, sampler, prompts[:n_fixed], golds[:n_fixed], scorer,
                                             settings.rollout_seeds, ctx.params(call_seed(settings.seed, 3)),
                                             epsilon=settings.grpo_epsilon, batch_size=settings.score_batch_size,
                                             pad_id=pad_id)
        groups = np.abs(ctx.fixed.advantages.reshape(-1, settings.rollout_seeds)).sum(axis=1)
        facts.update(fixed_rollout_mean_reward=float(ctx.fixed.rewards.mean()),
                     fixed_rollout_mean_tokens=float(np.mean([len(c) for _, c in ctx.fixed.pairs])),
                     grpo_groups_with_signal=int((groups > 0).sum()))
    if "ce" in wants:
        ctx.examples = supervised_batch(settings, task, problems, tokenizer)
    return ctx


def run_diagnostic(settings: EstimatorSettings, *, model: Any = None, tokenizer: Any = None,
                   progress: bool = True) -> DiagnosticResult:
    """Run the diagnostic; ``model``/``tokenizer`` override loading ``settings.model``.

    Raises RuntimeError if the centre weights are not bit-identical afterwards.
    """
    from esreason.backends.hf import HFPolicy, load_model

    settings.validate()
    say = _progress(progress)
    if model is None:
        device = settings.device or ("cuda" if torch.cuda.is_available() else "cpu")
        model, tokenizer = load_model(settings.model, settings.dtype, device)
    result = DiagnosticResult(settings, {})
    facts, D = result.facts, settings.directions
    couplings = settings.couplings if "reward" in settings.objectives else ()
    digest_before = weights_digest(model)
    policy = HFPolicy(model, tokenizer, restore="exact", direction_cache_mb=0)
    if settings.temperature == 0 and couplings:
        result.notes.append("temperature 0 (greedy): generation seeds have no effect, common and independent "
                            "coupling are the same evaluation")

    # ---- the centre (X0): shared by every sigma; `common` also by every direction
    say(f"centre evaluations ({settings.model}, {settings.task}, {policy.params.num_parameters:,} parameters)")
    t0 = time.perf_counter()
    ctx = _build_context(settings, model, tokenizer, facts)
    centre = _evaluate_here(ctx, {"common": settings.seed} if "common" in couplings else {})
    centre_ind = [_evaluate_here(ctx, {"independent": call_seed(settings.seed, 2, d)}, deterministic=False)
                  for d in range(D)] if "independent" in couplings else []
    if "ce" in centre:
        facts.update(ce_examples=len(ctx.examples), ce_mean_at_centre=float(centre["ce"][0].mean()))
    if couplings:
        facts["reward_mean_at_centre"] = {
            "common": float(centre["reward|common"][0].mean()) if "common" in couplings else None,
            "independent": float(np.mean([c["reward|independent"][0] for c in centre_ind])) if centre_ind else None}
    seconds_centre = time.perf_counter() - t0

    def centre_of(key: str, d: int) -> tuple[np.ndarray, list[str] | None]:
        return centre_ind[d][key] if key == "reward|independent" else centre[key]

    # ---- perturbed points: one perturbation per (sigma, direction, sign), every objective evaluated there
    values: dict[tuple[str, str, int, int], np.ndarray] = {}  # (key, sigma label, d, sign) -> [rows]
    same: dict[tuple[str, str], list[float]] = {}  # (coupling, sigma label) -> share identical to centre
    total, done, t1 = len(settings.sigmas) * D * 2, 0, time.perf_counter()
    for lab, sigma in settings.sigmas:
        sigma_key = int(np.float64(sigma).view(np.int64))  # independent seeds depend on sigma, not its grid slot
        for d in range(D):
            for sign in (1, -1):
                seeds = {c: settings.seed if c == "common" else call_seed(settings.seed, 1, sigma_key, d, sign)
                         for c in couplings}
                policy.perturb(settings.direction_seed + d, sign * sigma)
                try:
                    here = _evaluate_here(ctx, seeds)
                finally:
                    policy.restore()
                for key, (vals, texts) in here.items():
                    values[(key, lab, d, sign)] = vals
                    if texts is not None:
                        ref = centre_of(key, d)[1] or []
                        same.setdefault((key.split("|")[1], lab), []).append(
                            float(np.mean([a == b for a, b in zip(texts, ref)])))
                done += 1
                eta = (time.perf_counter() - t1) / done * (total - done)
                say(f"sigma={lab} direction {d + 1}/{D} {'+' if sign > 0 else '-'}  [{done}/{total}, ETA {eta:.0f}s]")

    # ---- observation arrays [D, P, S]
    for lab, _ in settings.sigmas:
        for key in centre.keys() | ({"reward|independent"} if centre_ind else set()):
            plus = np.stack([values[(key, lab, d, 1)] for d in range(D)])  # [D, rows]
            minus = np.stack([values[(key, lab, d, -1)] for d in range(D)])
            zero = np.stack([centre_of(key, d)[0] for d in range(D)])
            objective, _, coupling = key.partition("|")
            if objective == "reward":
                shape, order = (D, settings.reward_seeds, settings.reward_prompts), (0, 2, 1)  # rows seed-major
            elif objective == "ce":
                shape, order, coupling = (D, len(ctx.examples), 1), (0, 1, 2), "fixed batch"
            else:
                shape, order, coupling = (D, settings.rollout_prompts, settings.rollout_seeds), (0, 1, 2), \
                    "fixed rollout"
            result.observations[(objective, coupling, lab)] = Observations(
                *(a.reshape(shape).transpose(order) for a in (plus, zero, minus)))
        for (coupling, slab), shares in same.items():
            if slab == lab:
                result.identical[(coupling, lab)] = float(np.mean(shares))

    digest_after = weights_digest(model)
    facts.update(parameters=policy.params.num_parameters,
                 dtype=str(next(model.parameters()).dtype).replace("torch.", ""),
                 device=str(next(model.parameters()).device),
                 centre_sha256_before=digest_before, centre_sha256_after=digest_after,
                 centre_bit_identical=digest_before == digest_after, seconds_centre=round(seconds_centre, 2),
                 seconds_perturbed=round(time.perf_counter() - t1, 2), perturbed_points=total)
    if digest_before != digest_after:
        raise RuntimeError("the centre weights changed during the diagnostic (exact restore failed)")
    if facts["dtype"] != "float32":
        result.notes.append(f"weights are {facts['dtype']}: a perturbation below half an ulp of a weight rounds "
                            "back to the centre, so small sigmas move fewer coordinates than requested")
    return result


__all__ = ["call_seed", "run_diagnostic", "supervised_batch", "weights_digest"]
