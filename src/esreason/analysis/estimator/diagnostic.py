"""The local perturbation diagnostic of the paper's appendix "ES–ZO Estimator Equivalence".

For an objective F with a stochastic evaluation F^(theta; xi), a direction eps and a
scale sigma, the diagnostic observes (paper Eq. app-evaluation-definition)

    X+ = F^(theta + sigma*eps; xi+),  X0 = F^(theta; xi0),  X- = F^(theta - sigma*eps; xi-)

and reports, pooling the scalar observations over prompts, generation seeds and
directions (paper §"Local Perturbation Diagnostic", Protocol):

    Corr(X+, X0),  kappa_base = Var(X+ - X0) / Var(X+),
    Corr(X+, X-),  kappa_pair = Var(X+ - X-) / Var(X+)        (Eq. app-raw-variance-ratios)

kappa < 1 means subtraction reduces the variance of the scalar objective values.
Sample variances use ddof = 1 (the ratios and correlations do not depend on it).

Objectives (``OBJECTIVES``; details in :mod:`esreason.analysis.estimator.objectives`):

- ``reward``: regenerated-rollout task reward, with seed couplings ``common`` (the same
  generation seed at the three points: common random numbers) and ``independent``;
- ``ce``: fixed-batch supervised cross-entropy (gold completions of the task, or SST-2
  with ``supervised="sst2"``); deterministic, so its coupling is "fixed batch";
- ``logprob``, ``seqloss``, ``grpo``: fixed rollouts (sampled once at the centre) rescored.

Perturbations use the training machinery: :class:`esreason.backends.hf.HFPolicy`
(directions from :mod:`esreason.es.noise`, exact restore), so the centre is bit-identical
afterwards; :func:`esreason.analysis.estimator.run.run_diagnostic` runs the diagnostic and
checks this with a SHA-256 of the weights. This module holds the settings and the result
type; the pooled statistics are in :mod:`esreason.analysis.estimator.stats` (no model code).

Our implementation choices where the paper is silent (docs/estimator.md):

- A "generation seed" is one row of a sampler call: the P prompts are repeated S times in
  one :class:`~esreason.backends.sampling.Sampler` call, and row (s, p) draws its own
  sampling uniforms. ``common`` uses the same call seed at the three points (so row (s, p)
  sees the same uniforms at theta+, theta, theta-); ``independent`` draws a fresh call seed
  for every evaluation. X0 does not depend on sigma, so the centre is sampled once and
  reused at every sigma (for ``common`` also across directions).
- The paper's supervised control has 128 pooled observations: our default fixed batch is
  32 examples x 4 directions = 128.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Sequence

from esreason.analysis.estimator.stats import DiagnosticStats, Observations
from esreason.errors import UserError

OBJECTIVES = ("reward", "ce", "logprob", "seqloss", "grpo")
COUPLINGS = ("common", "independent")
PAPER_SIGMAS = ("1e-4", "3e-4", "1e-3")
PAPER_TABLE_SIGMA = 1e-3


# --------------------------------------------------------------------------- settings


def parse_sigmas(text: str, flag: str = "--sigmas") -> list[tuple[str, float]]:
    """'1e-4,3e-4,1e-3' -> [(label as written, value)]; every sigma finite and > 0, no duplicates."""
    out: list[tuple[str, float]] = []
    for item in (s.strip() for s in str(text).split(",")):
        if not item:
            raise UserError(f"{flag}: empty entry in {text!r}")
        try:
            value = float(item)
        except ValueError:
            raise UserError(f"{flag}: {item!r} is not a number") from None
        if not math.isfinite(value) or value <= 0:
            raise UserError(f"{flag}: sigma must be a finite number > 0, got {item}")
        if any(v == value for _, v in out):
            raise UserError(f"{flag}: sigma {item} given twice")
        out.append((item, value))
    return out


def parse_choices(text: str, allowed: Sequence[str], flag: str) -> tuple[str, ...]:
    """Comma-separated names from ``allowed`` (order kept, no duplicates)."""
    names = [s.strip() for s in str(text).split(",") if s.strip()]
    if not names:
        raise UserError(f"{flag}: give at least one of {', '.join(allowed)}")
    for n in names:
        if n not in allowed:
            raise UserError(f"{flag}: unknown value {n!r}; allowed: {', '.join(allowed)}")
    if len(set(names)) != len(names):
        raise UserError(f"{flag}: a value is given twice in {text!r}")
    return tuple(names)


@dataclass(frozen=True)
class EstimatorSettings:
    """Everything that defines one diagnostic run (defaults: the paper's protocol where it has one).

    sigmas: (label, value) perturbation scales (paper: 1e-4, 3e-4, 1e-3).
    table_sigma: the scale of the objective table (a) (paper: 1e-3; must be in ``sigmas``).
    directions / direction_seed: directions eps_d are HFPolicy seeds direction_seed + d.
    reward_prompts x reward_seeds: regenerated-rollout observations per direction (paper 16 x 16).
    rollout_prompts x rollout_seeds: fixed-rollout observations per direction (paper 16 x 8);
        the rollout_seeds responses of a prompt are the GRPO group.
    ce_examples: fixed-batch size of the supervised control (32 x 4 directions = the paper's 128).
    supervised: 'task' (gold completions of ``task``) or 'sst2' (SST-2 with a verbaliser).
    temperature / top_p / max_new_tokens: sampling of rollouts (the paper does not state its
        diagnostic temperature; 1.0 is its GRPO rollout temperature).
    seed: base of every generation seed.
    """

    model: str = "demo"
    task: str = "demo-add"
    split: str = "test"
    data_path: str | None = None
    sigmas: tuple[tuple[str, float], ...] = tuple(parse_sigmas(",".join(PAPER_SIGMAS)))
    table_sigma: float = PAPER_TABLE_SIGMA
    objectives: tuple[str, ...] = OBJECTIVES
    couplings: tuple[str, ...] = COUPLINGS
    directions: int = 4
    direction_seed: int = 0
    reward_prompts: int = 16
    reward_seeds: int = 16
    rollout_prompts: int = 16
    rollout_seeds: int = 8
    ce_examples: int = 32
    supervised: str = "task"
    sst2_split: str = "validation"
    sst2_path: str | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 64
    format_reward: float = 0.1
    grpo_epsilon: float = 0.2
    seed: int = 0
    dtype: str = "float32"
    device: str | None = None
    batch_size: int = 256
    score_batch_size: int = 16

    def validate(self) -> None:
        """UserError naming the flag for every setting that cannot be honoured."""
        checks: list[tuple[bool, str]] = [
            (len(self.sigmas) > 0, "--sigmas: give at least one sigma"),
            (all(math.isfinite(v) and v > 0 for _, v in self.sigmas), "--sigmas: every sigma must be > 0"),
            (any(v == self.table_sigma for _, v in self.sigmas),
             f"--table-sigma {self.table_sigma:g} is not one of --sigmas "
             f"({', '.join(lab for lab, _ in self.sigmas)})"),
            (self.directions >= 1, f"--directions must be >= 1 (got {self.directions})"),
            (self.reward_prompts >= 1, f"--reward-prompts must be >= 1 (got {self.reward_prompts})"),
            (self.reward_seeds >= 1, f"--reward-seeds must be >= 1 (got {self.reward_seeds})"),
            (self.rollout_prompts >= 1, f"--rollout-prompts must be >= 1 (got {self.rollout_prompts})"),
            (self.rollout_seeds >= 2, f"--rollout-seeds must be >= 2: it is the GRPO group size "
                                      f"(got {self.rollout_seeds})"),
            (self.ce_examples >= 1, f"--ce-examples must be >= 1 (got {self.ce_examples})"),
            (self.supervised in ("task", "sst2"), f"--supervised must be 'task' or 'sst2' (got {self.supervised!r})"),
            (math.isfinite(self.temperature) and self.temperature >= 0,
             f"--temperature must be >= 0 (got {self.temperature})"),
            (0 < self.top_p <= 1, f"--top-p must be in (0, 1] (got {self.top_p})"),
            (self.max_new_tokens >= 1, f"--max-new-tokens must be >= 1 (got {self.max_new_tokens})"),
            (0 <= self.format_reward <= 1, f"--format-reward must be in [0, 1] (got {self.format_reward})"),
            (0 < self.grpo_epsilon < 1, f"--grpo-epsilon must be in (0, 1) (got {self.grpo_epsilon})"),
            (self.batch_size >= 1, f"--batch-size must be >= 1 (got {self.batch_size})"),
            (self.score_batch_size >= 1, f"--score-batch-size must be >= 1 (got {self.score_batch_size})"),
        ]
        for n in self.objectives:
            checks.append((n in OBJECTIVES, f"--objectives: unknown objective {n!r}; allowed: {', '.join(OBJECTIVES)}"))
        for c in self.couplings:
            checks.append((c in COUPLINGS, f"--couplings: unknown coupling {c!r}; allowed: {', '.join(COUPLINGS)}"))
        checks.append((len(self.objectives) > 0, "--objectives: give at least one objective"))
        checks.append(("reward" not in self.objectives or len(self.couplings) > 0,
                       "--couplings: give at least one coupling for the reward objective"))
        for ok, message in checks:
            if not ok:
                raise UserError(message)
        d = self.directions
        pooled = {"reward": d * self.reward_prompts * self.reward_seeds, "ce": d * self.ce_examples,
                  **{o: d * self.rollout_prompts * self.rollout_seeds for o in ("logprob", "seqloss", "grpo")}}
        for o in self.objectives:
            if pooled[o] < 2:
                raise UserError(f"objective {o!r} would pool {pooled[o]} observation(s); the statistics need >= 2 "
                                "(raise --directions or the prompt/seed/example counts)")

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["sigmas"] = [lab for lab, _ in self.sigmas]
        return d


# --------------------------------------------------------------------------- results


@dataclass
class DiagnosticResult:
    """Observations keyed by (objective, coupling, sigma label), plus run facts.

    identical: for regenerated rollouts, per (coupling, sigma label) the share of responses at
        theta +- sigma*eps whose text equals the centre response of the same row (only
        meaningful for ``common``: it measures how often common random numbers reproduce the
        centre trajectory).
    """

    settings: EstimatorSettings
    observations: dict[tuple[str, str, str], Observations]
    identical: dict[tuple[str, str], float] = field(default_factory=dict)
    facts: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def stats(self) -> dict[tuple[str, str, str], DiagnosticStats]:
        return {k: v.stats() for k, v in self.observations.items()}


__all__ = ["COUPLINGS", "DiagnosticResult", "EstimatorSettings", "OBJECTIVES", "PAPER_SIGMAS", "PAPER_TABLE_SIGMA",
           "parse_choices", "parse_sigmas"]
