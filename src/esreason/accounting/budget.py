"""What a training run consumes: rollouts (sampled responses), generated tokens and FLOPs.

Written into every run's ``manifest.json`` (key ``budget``: ``planned`` when the run starts,
``consumed`` when it ends), into ``experiment.json`` per method, and into the report.

What is counted:

- **rollouts**: the sampled responses an update scores and learns from. ES: N members x the
  update's prompts (D = B; the last batch of an epoch may be smaller, ES keeps the tail); GRPO:
  B prompts x G responses. Planned: T x N x B (ES) or T x B x G (GRPO), the paper's accounting.
- **tokens**: the generated tokens of those rollouts (prompt tokens excluded), summed from the
  ``tokens`` of every metrics row. GRPO's include the end-of-sequence token TRL keeps in a
  finished completion; ES's sampler does not return it (at most one token per response).
- **not counted**: the held-out evaluation during training (``eval.every``) and ES's coverage probe
  (``coverage.every``, its own ``coverage/tokens``): diagnostics no update learns from. They are
  reported beside (``diagnostic_tokens``).
- **FLOPs, the paper's formula** (:mod:`esreason.accounting.flops`): planned with the shared L
  (``generation.max_new_tokens``), FLOPs_ES = 2 T N D P L and FLOPs_GRPO = 8 T B G P L; consumed with
  the measured tokens in place of T x rollouts x L: 2 P x tokens (ES) and 8 P x tokens (GRPO).
- **FLOPs as spent** (``compute``, ``flops_spent``): 2 P per forward-equivalent per generated token, with
  the forward-equivalents the run's code path spends (:func:`passes_spent`): ES 1 (the sampling forward);
  GRPO the sampling forward, the loss forward and its backward (2), and, by config, the checkpoint
  recompute, the old-policy forward (several optimizer steps per update) and the reference forward
  (beta != 0) (:func:`esreason.grpo.plan.passes_per_token`). Planned at the shared L, consumed at the
  measured tokens. Prompt tokens, padding and the optimizer's O(P) work per step are left out of both
  counts, as the paper's L leaves them out.

Matching (an experiment's ``match``): ``flops`` gives every method T updates (the paper's FLOPs equal
when N = 4 G at equal B); ``rollouts`` keeps ES at T updates and gives each GRPO method
T x (N x B_ES) / (B x G) updates, so both sample the same number of responses (its B and G, the
group the objective is defined on, stay as configured: :func:`rollout_matched_updates`); ``compute``
keeps ES at T and gives each GRPO method the updates whose planned FLOPs as spent equal ES's at the
shared L (:func:`compute_matched_updates`).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Iterable

from esreason.config import ConfigError
from esreason.accounting.flops import passes_spent

MATCHES = ("flops", "rollouts", "compute")
#: The quantity each ``match`` makes equal across the trained methods (planned, at the shared L).
MATCHED = {"flops": "the paper's FLOP formula (ES 2 T N D P L, GRPO 8 T B G P L)",
           "rollouts": "sampled responses (rollouts)",
           "compute": "FLOPs as spent (the forward-equivalents each method's code path runs per generated token)"}
#: What the counts mean, stored beside them (the module docstring has the details).
COUNTED = ("rollouts: sampled responses the updates learn from (ES: N members x the update's prompts; GRPO: "
           "B x G); tokens: their generated tokens; not counted: held-out evaluation and the coverage probe "
           "(diagnostic_tokens); flops: the paper's estimate, planned at the shared L, consumed at the measured "
           "tokens; flops_spent: 2 P x the forward-equivalents the run spends per generated token (compute."
           "passes_per_token) x the tokens, planned at the shared L, consumed at the measured tokens")
#: Forward + backward passes per generated token the paper's formulas charge, in units of 2 P FLOPs (paper
#: appendix): ES one forward; GRPO a policy forward, a reference forward and a backward (2 forwards' worth),
#: whatever the config. What a run spends: :func:`passes_spent`.
PASSES = {"es": 1.0, "grpo": 4.0}


def method_of(cfg: Any) -> str:
    """'grpo' for a GRPO run config, 'es' for an ES one."""
    return "grpo" if hasattr(cfg, "grpo") else "es"


def rollouts_per_update(cfg: Any) -> int:
    """N x B (ES) or B x G (GRPO): the responses one full update samples."""
    samples = cfg.grpo.num_generations if method_of(cfg) == "grpo" else cfg.es.population_size
    return samples * cfg.train.batch_size


def compute_record(cfg: Any) -> dict[str, Any]:
    """What a run of ``cfg`` spends per generated token: its forward-equivalents by part, their total, the
    paper formula's count beside it, and the optimizer steps per update (GRPO; ES's update is one)."""
    parts = passes_spent(cfg)
    method = method_of(cfg)
    steps = 1
    if method == "grpo":
        from esreason.grpo.config import mini_batch_prompts

        steps = cfg.train.batch_size // mini_batch_prompts(cfg)
    return {"passes_per_token": parts, "forward_equivalents_per_token": sum(parts.values()),
            "paper_forward_equivalents_per_token": PASSES[method], "optimizer_steps_per_update": steps}


def compute_matched_updates(es_cfg: Any, grpo_cfg: Any, updates: int, key: str = "match") -> int:
    """GRPO updates whose planned FLOPs as spent equal ES's over ``updates`` updates at a shared L:
    T x (N x B_ES x E_ES) / (B x G x E), E the forward-equivalents per generated token (:func:`passes_spent`).

    ConfigError (naming ``key``) when that is not a whole number of updates."""
    es = rollouts_per_update(es_cfg) * sum(passes_spent(es_cfg).values())
    per = rollouts_per_update(grpo_cfg) * sum(passes_spent(grpo_cfg).values())
    if (updates * es) % per:
        raise ConfigError(f"config key '{key}': compute cannot be matched: ES spends {updates} x "
                          f"{rollouts_per_update(es_cfg)} responses x {sum(passes_spent(es_cfg).values())} "
                          f"forward-equivalents = {updates * es} per L tokens, not a multiple of GRPO's "
                          f"{rollouts_per_update(grpo_cfg)} x {sum(passes_spent(grpo_cfg).values())} = {per} per "
                          f"update (loss forward + backward 3, sampling 1, and by config recompute, old policy, "
                          f"reference); change updates, train.batch_size or es.population_size")
    return updates * es // per


def rollout_matched_updates(es_cfg: Any, grpo_cfg: Any, updates: int, key: str = "match") -> int:
    """GRPO updates whose rollouts equal ES's over ``updates`` updates: T x (N x B_ES) / (B x G).

    ConfigError (naming ``key``) when that is not a whole number of updates."""
    es_total = updates * rollouts_per_update(es_cfg)
    per = rollouts_per_update(grpo_cfg)
    if es_total % per:
        raise ConfigError(f"config key '{key}': rollouts cannot be matched: ES samples {updates} x "
                          f"{rollouts_per_update(es_cfg)} = {es_total} responses, not a multiple of GRPO's "
                          f"{grpo_cfg.train.batch_size} x {grpo_cfg.grpo.num_generations} = {per} per update "
                          f"(change updates, train.batch_size, es.population_size or grpo.num_generations)")
    return es_total // per


def planned(cfg: Any, *, updates: int | None = None, params: int | None = None,
            length: int | None = None) -> dict[str, Any]:
    """The budget a run config plans: updates, rollouts, the token cap and the paper's FLOP estimate.

    updates: T (default: the config's ``train.max_steps``, else its epochs; :func:`flops.estimate_config`);
    params: P (default: counted from the model); length: the shared L (default generation.max_new_tokens)."""
    from dataclasses import replace

    from esreason.accounting.flops import estimate_config

    if updates is not None:
        cfg = replace(cfg, train=replace(cfg.train, max_steps=updates))
    est = estimate_config(cfg, method_of(cfg), length=length, params=params)
    per = est.prompts * est.samples
    compute = compute_record(cfg)
    return {"method": est.method, "updates": est.updates, "prompts_per_update": est.prompts,
            "samples_per_prompt": est.samples, "rollouts_per_update": per, "rollouts": est.updates * per,
            "max_tokens": est.updates * per * est.length, "length": est.length, "params": est.params,
            "flops": est.flops, "compute": compute,
            "flops_spent": 2.0 * est.params * compute["forward_equivalents_per_token"] * est.updates * per * est.length}


def _recorded_passes(metrics_file: Path) -> float | None:
    """The forward-equivalents per generated token the run beside ``metrics_file`` recorded in its manifest
    (``budget.planned.compute``); None for a run written before they were recorded."""
    import json

    try:
        manifest = json.loads((Path(metrics_file).parent / "manifest.json").read_text())
        return float(manifest["budget"]["planned"]["compute"]["forward_equivalents_per_token"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def consumed(metrics_files: Iterable[str | Path], method: str, params: int | None = None,
             passes: float | None = None) -> dict[str, Any]:
    """Rollouts and generated tokens summed over the update rows of ``metrics_files`` (one per stage run
    with the same ``method``), and the FLOPs at the measured tokens when ``params`` is given: the paper's
    (``flops_at_measured_length``) and as spent (``flops_spent``: ``passes`` forward-equivalents per token,
    default the one each run's manifest records). A row without ``rollouts`` (a run from before they were
    logged) leaves ``rollouts`` None."""
    from esreason.io import read_metrics

    updates = rollouts = tokens = diagnostic = 0
    spent: float | None = 0.0
    complete = True
    for path in metrics_files:
        run_tokens = 0
        for row in read_metrics(Path(path)):
            if "tokens" not in row:  # update 0's held-out row: no training
                continue
            updates += 1
            run_tokens += int(round(row["tokens"]))
            diagnostic += int(round(row.get("coverage/tokens", 0)))
            if "rollouts" in row:
                rollouts += int(round(row["rollouts"]))
            else:
                complete = False
        tokens += run_tokens
        run_passes = passes if passes is not None else _recorded_passes(Path(path))
        spent = None if spent is None or run_passes is None else spent + run_passes * run_tokens
    out: dict[str, Any] = {"updates": updates, "rollouts": rollouts if complete else None, "tokens": tokens,
                           "mean_length": tokens / rollouts if complete and rollouts else None,
                           "diagnostic_tokens": diagnostic}
    if params is not None:
        out["flops_at_measured_length"] = 2.0 * PASSES[method] * params * tokens
        out["flops_spent"] = None if spent is None else 2.0 * params * spent
    return out


def combine(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """One composition's budget from its stages' (planned or consumed) budgets: counts summed."""
    out: dict[str, Any] = {"stages": parts}
    for key in ("updates", "rollouts", "tokens", "max_tokens", "flops", "flops_at_measured_length", "flops_spent",
                "diagnostic_tokens"):
        values = [p.get(key) for p in parts]
        if any(key in p for p in parts):
            out[key] = None if any(v is None for v in values) else sum(values)
    return out


def unique_parameters(model: Any) -> int:
    """P of a loaded model: its parameters, tied weights counted once."""
    seen, total = set(), 0
    for p in model.parameters():
        if id(p) not in seen:
            seen.add(id(p))
            total += p.numel()
    return total


def record_in_manifest(run_dir: str | Path, cfg: Any, model: Any = None, *, updates: int | None = None,
                       finished: bool = False) -> None:
    """Write ``budget`` into ``run_dir/manifest.json``: ``planned`` (always) and, once training has
    ``finished``, ``consumed`` from the run's metrics.jsonl. P from ``model`` (loaded), else counted;
    updates: T when the caller has planned it (GRPO's batch plan), else from the config."""
    from esreason.io.atomic import atomic_write_json
    from esreason.io.manifest import MANIFEST_FILE
    from esreason.io.verify import DamagedFile, read_json_object

    path = Path(run_dir) / MANIFEST_FILE
    try:
        manifest = read_json_object(path)
    except DamagedFile:
        return  # rebuilt on the next resume, which records the budget again
    params = unique_parameters(model) if model is not None else None
    plan = planned(cfg, updates=updates, params=params)
    budget: dict[str, Any] = {"planned": plan, "counted": COUNTED}
    if finished:
        budget["consumed"] = consumed([Path(run_dir) / "metrics.jsonl"], plan["method"], plan["params"],
                                      plan["compute"]["forward_equivalents_per_token"])
    manifest["budget"] = budget
    atomic_write_json(path, manifest)


def experiment_budget(stages: dict[str, list[tuple[str, Any, int]]], length: int, params: int,
                      match: str) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """The planned budget of every trained method of an experiment at one shared L (the paper's matching).

    stages: method -> its training stages (kind, run config, updates). Returns (the experiment's summary:
    match, shared L, P, whether FLOPs and rollouts are equal across the trained methods; per method its
    planned budget, a composition's summed over its stages)."""
    per: dict[str, dict[str, Any]] = {}
    for name, parts in stages.items():
        plans = [planned(cfg, updates=n, params=params, length=length) for _, cfg, n in parts]
        per[name] = plans[0] if len(plans) == 1 else combine(plans)
    summary = {"match": match, "matched": MATCHED.get(match, match), "length": length, "params": params,
               "counted": COUNTED,
               "flops_equal": matched([p["flops"] for p in per.values()]),
               "flops_spent_equal": matched([p.get("flops_spent") for p in per.values()]),
               "rollouts_equal": matched([p["rollouts"] for p in per.values()])}
    return summary, per


def matched(values: list[float | None], rel_tol: float = 1e-9) -> bool | None:
    """Whether every value equals the first (None: fewer than two values or one missing)."""
    if len(values) < 2 or any(v is None for v in values):
        return None
    return all(math.isclose(v, values[0], rel_tol=rel_tol) for v in values[1:])  # type: ignore[arg-type]


__all__ = ["COUNTED", "MATCHED", "MATCHES", "PASSES", "combine", "compute_matched_updates", "compute_record",
           "consumed", "experiment_budget", "matched", "method_of", "passes_spent", "planned", "record_in_manifest",
           "rollout_matched_updates", "rollouts_per_update", "unique_parameters"]
