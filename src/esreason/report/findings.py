"""The paper's RQ1 claims, checked on an experiment (verdicts for ``esreason demo`` and the report).

Each :class:`Finding` restates one claim of section "RQ1: Does ES Exhibit the Same
Post-Training Characteristics as GRPO?" (and Table ``tab:rq2-heldout-change``), gives
the numbers it rests on and a ``verdict`` (:mod:`esreason.report.verdicts`): "holds" only
when the 95 % paired-bootstrap interval of the difference excludes 0 in the claimed
direction; otherwise "direction agrees, not significant", "inconclusive", or
"contradicted" (the interval excludes 0 the other way); "not tested" when a method or
number is missing. Claims without an interval (the Pareto front, the entropy curves) at
best "agree". Averages are over all tasks of the Pass@K table, as in the paper's Average
column.

Every finding says what variance its interval covers (``variance``: "3 training seeds × 256
problems per task" when the experiment has several training seeds and the intervals come from
the two-level bootstrap of :mod:`esreason.report.hierarchical`; "1 training seed: evaluation
noise only" otherwise). With several seeds a claim about two methods also carries its value
and verdict on each seed alone (``per_seed``) and the probability of improvement
``P(A > B)`` on a random problem and seeds (``probability``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

from esreason.report.curves import Curves
from esreason.report.load import Experiment, evaluated
from esreason.report.pareto import ParetoPanel
from esreason.report.seeds import per_seed_differences, variance_source
from esreason.report.stats import improvement_probability, paired_difference
from esreason.report.tables import AVERAGE_GROUP, BelowBase, Table, table_tasks
from esreason.report.verdicts import CONTRADICTED, HOLDS, NOT_TESTED, combine, interval_verdict, point_verdict


@dataclass
class Finding:
    """One claim with its verdict (one of :data:`esreason.report.verdicts.VERDICTS`)."""

    id: str
    claim: str
    paper: str
    verdict: str
    evidence: str
    values: dict[str, Any] = field(default_factory=dict)
    variance: str = "no interval"
    """What the interval behind the verdict covers ("3 training seeds × 256 problems per task",
    "1 training seed: evaluation noise only", or "no interval")."""
    per_seed: list[dict[str, Any]] = field(default_factory=list)
    """Per training seed: ``{"seed", "diff" (Cell dict), "verdict"}`` (several seeds only)."""
    probability: dict[str, Any] | None = None
    """``P(A > B)`` on a random problem and seeds with its interval (Cell dict), or None."""

    @property
    def holds(self) -> bool | None:
        """True only for the verdict "holds"; None when not tested."""
        return None if self.verdict == NOT_TESTED else self.verdict == HOLDS

    def as_dict(self) -> dict[str, Any]:
        return {"id": self.id, "claim": self.claim, "paper": self.paper, "verdict": self.verdict,
                "holds": self.holds, "evidence": self.evidence, "values": self.values, "variance": self.variance,
                "per_seed": self.per_seed, "probability": self.probability}

    @property
    def seeds_line(self) -> str:
        """The per-seed values and verdicts in one line ("" without seeds)."""
        return "; ".join(f"seed {p['seed']}: {_pp(p['diff']['value'])} ({p['verdict']})"
                         for p in self.per_seed if p["diff"] and p["diff"]["value"] is not None)


def _pp(x: float) -> str:
    return f"{100 * x:+.1f} pp"


def _greater(exp: Experiment, a: str | None, b: str | None, tasks: Sequence[str], metric: str, fid: str,
             claim: str, paper: str) -> Finding:
    """Claim: average ``metric`` of a > that of b (paired difference over problems)."""
    if a is None or b is None:
        return Finding(fid, claim, paper, NOT_TESTED, "a method is missing from the experiment")
    d = paired_difference(exp, a, b, tasks, metric)
    if d is None:
        return Finding(fid, claim, paper, NOT_TESTED, f"{metric} missing for {exp.label(a)} or {exp.label(b)}")
    ci = " (no interval)" if d.low is None or d.high is None else f" [95% CI {_pp(d.low)}, {_pp(d.high)}]"
    seeds = [{"seed": s, "diff": None, "verdict": NOT_TESTED} if c is None else
             {"seed": s, "diff": c.as_dict(), "verdict": interval_verdict(c.value, c.low, c.high)}
             for s, c in per_seed_differences(exp, a, b, tasks, metric)]
    prob = improvement_probability(exp, a, b, tasks, metric) if exp.n_seeds > 1 else None
    return Finding(fid, claim, paper, interval_verdict(d.value, d.low, d.high),
                   f"{exp.label(a)} - {exp.label(b)} average {metric}: {_pp(d.value)}{ci}",  # type: ignore[arg-type]
                   {"diff": d.as_dict()}, variance=variance_source(exp, [a, b], tasks, metric),
                   per_seed=seeds, probability=None if prob is None else prob.as_dict())


def average_findings(exp: Experiment, ks: Sequence[int]) -> list[Finding]:
    """Claims about the Average column of the Pass@K table (paper section RQ1 "Test Results")."""
    tasks, _ = table_tasks(exp, evaluated(exp))
    base, grpo, es = exp.by_role("base"), exp.by_role("grpo"), exp.by_role("es")
    paper = "RQ1 Test Results; Tables tab:rq1-instruct-final, tab:rq1-deepseek-math"
    out = [_greater(exp, es, base, tasks, "pass@1", "es_improves_pass1",
                    "ES improves average Pass@1 over the base model", paper)]
    out += [_greater(exp, es, base, tasks, f"pass@{k}", f"es_improves_pass{k}",
                     f"ES improves average Pass@{k} over the base model", paper) for k in ks]
    out.append(_greater(exp, grpo, es, tasks, "pass@1", "grpo_beats_es_pass1",
                        "GRPO achieves a larger average Pass@1 than ES", paper))
    out += [_greater(exp, es, grpo, tasks, f"pass@{k}", f"es_beats_grpo_pass{k}",
                     f"ES attains a higher average Pass@{k} than GRPO", paper) for k in ks]
    return out


def below_base_finding(exp: Experiment, below: BelowBase | None) -> Finding:
    """GRPO falls below base at every large K on most tasks (the paper: 15 of 18).

    Holds when most tasks are *significantly* below base (paired 95 % interval entirely
    below 0) at every large K; contradicted when most are significantly above base at
    every large K; otherwise the point estimates decide between "agrees" and "inconclusive".
    """
    claim = "GRPO falls below the base model at every large K on most tasks"
    paper = "RQ1 Test Results ('15 of 18 comparisons')"
    grpo = exp.by_role("grpo")
    if below is None or grpo is None:
        return Finding("grpo_below_base", claim, paper, NOT_TESTED, "no base or GRPO method")
    row = next((c for c in below.counts if c["method"] == grpo and c["scope"] == "all"), None)
    if row is None or not row["tasks"]:
        return Finding("grpo_below_base", claim, paper, NOT_TESTED, "no complete comparison")
    n, total = row["tasks_below_all_k"], row["tasks"]
    per_task: dict[str, list[str]] = {}
    for c in below.comparisons:
        if c.method == grpo:  # each comparison's own verdict on "GRPO < base"
            per_task.setdefault(c.task, []).append(interval_verdict(c.diff.value, c.diff.low, c.diff.high, -1))
    complete = [vs for vs in per_task.values() if len(vs) == len(below.ks)]
    sig_below = sum(all(v == HOLDS for v in vs) for vs in complete)
    sig_above = sum(all(v == CONTRADICTED for v in vs) for vs in complete)
    if sig_below > total / 2:
        verdict = HOLDS
    elif sig_above > total / 2:
        verdict = CONTRADICTED
    else:
        verdict = point_verdict(n > total / 2)
    return Finding("grpo_below_base", claim, paper, verdict,
                   variance=variance_source(exp, [grpo, exp.by_role("base")], list(per_task)),
                   evidence=f"{n} of {total} tasks below base at K in {below.ks} ({sig_below} significantly, "
                   f"{sig_above} significantly above); {row['below']} of {row['comparisons']} "
                   f"(task, K) comparisons below, {row['significant']} significant",
                   values=dict(row, tasks_significantly_below_all_k=sig_below,
                               tasks_significantly_above_all_k=sig_above))


def heldout_change_finding(exp: Experiment, change: Table | None, k: int) -> Finding:
    """Held-out Pass@K change is positive under ES and negative under GRPO (Table tab:rq2-heldout-change)."""
    claim = f"Held-out Pass@{k} change vs base is positive under ES and negative under GRPO"
    paper = "RQ2; Table tab:rq2-heldout-change"
    es, grpo = exp.by_role("es"), exp.by_role("grpo")
    if change is None or es is None or grpo is None:
        return Finding("heldout_change", claim, paper, NOT_TESTED, "no held-out change table, ES or GRPO")
    ce, cg = change.get(es, "pass", f"pass@{k}"), change.get(grpo, "pass", f"pass@{k}")
    if ce is None or cg is None or ce.value is None or cg.value is None:
        return Finding("heldout_change", claim, paper, NOT_TESTED, f"pass@{k} change missing")
    parts = [interval_verdict(ce.value, ce.low, ce.high, 1), interval_verdict(cg.value, cg.low, cg.high, -1)]

    def _ci(c: Any) -> str:
        return " (no interval)" if c.low is None or c.high is None else f" [{_pp(c.low)}, {_pp(c.high)}]"

    held = [t for t in exp.held_out if t not in exp.in_domain]
    return Finding("heldout_change", claim, paper, combine(parts),
                   variance=variance_source(exp, [es, grpo, exp.by_role("base")], held),
                   evidence=f"ES {_pp(ce.value)}{_ci(ce)} ({parts[0]}), GRPO {_pp(cg.value)}{_ci(cg)} ({parts[1]})",
                   values={"es": ce.as_dict(), "grpo": cg.as_dict(), "parts": parts})


def pareto_finding(exp: Experiment, panels: Sequence[ParetoPanel]) -> Finding:
    """The compositions add non-dominated points to the Average Pareto front (Figure fig:rq1-deepseek-math-pareto)."""
    claim = "The sequential compositions add non-dominated points to the Pass@1-Pass@K front (Average)"
    paper = "RQ1 Pareto Trade-offs; Figure fig:rq1-deepseek-math-pareto"
    avg = next((p for p in panels if p.key == AVERAGE_GROUP), None)
    comps = [m for m in (exp.by_role("es_grpo"), exp.by_role("grpo_es")) if m is not None]
    if avg is None or not comps or not any(m in avg.points for m in comps):
        return Finding("pareto_added", claim, paper, NOT_TESTED, "no Average panel or no composition")
    added = [m for m in comps if m in avg.added]  # on the front at a point Base/GRPO/ES do not occupy
    return Finding("pareto_added", claim, paper, point_verdict(bool(added)),
                   f"no interval (front of point estimates); on the full front: "
                   f"{', '.join(exp.label(m) for m in avg.full_front)}; added by compositions: "
                   f"{', '.join(exp.label(m) for m in added) or 'none'}", values={"added": added})


def entropy_finding(exp: Experiment, curves: Curves | None) -> Finding:
    """Held-out entropy falls more under GRPO than under ES (Figure fig:rq1-overview (a-b))."""
    claim = "Held-out token entropy falls more under GRPO than under ES during training"
    paper = "RQ1 Training Dynamics; Figure fig:rq1-overview (a-b)"
    es, grpo = exp.by_role("es"), exp.by_role("grpo")
    lines = {s.method: s for s in (curves.panels.get("heldout/entropy", []) if curves else [])}
    if es not in lines or grpo not in lines:
        return Finding("entropy", claim, paper, NOT_TESTED, "held-out entropy not logged for ES and GRPO")
    change = {m: lines[m].ys[-1] - lines[m].ys[0] for m in (es, grpo)}  # type: ignore[index]
    return Finding("entropy", claim, paper, point_verdict(change[grpo] < change[es]),  # type: ignore[index]
                   f"no interval; first-to-last change: GRPO {change[grpo]:+.4f}, ES {change[es]:+.4f} nats/token",  # type: ignore
                   values={"grpo": change[grpo], "es": change[es]})  # type: ignore[index]


def all_findings(exp: Experiment, below: BelowBase | None, change: Table | None, panels: Sequence[ParetoPanel],
                 curves: Curves | None) -> list[Finding]:
    ks = [k for k in exp.ks if k > 1]
    out = average_findings(exp, ks)
    out.append(below_base_finding(exp, below))
    if ks:
        out.append(heldout_change_finding(exp, change, max(ks)))
    out.append(pareto_finding(exp, panels))
    out.append(entropy_finding(exp, curves))
    return out
