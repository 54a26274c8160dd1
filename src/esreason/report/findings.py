"""The paper's RQ1 claims, checked on an experiment (verdicts for ``esreason demo`` and the report).

Each :class:`Finding` restates one claim of section "RQ1: Does ES Exhibit the Same
Post-Training Characteristics as GRPO?" (and Table ``tab:rq2-heldout-change``), gives the
numbers it rests on and a ``verdict`` (:mod:`esreason.report.verdicts`). The claims tested with
an interval form one family (:mod:`esreason.report.family`) and are decided after Holm's
correction at a family-wise error rate of 0.05: "holds" only when the corrected test rejects
"no difference" in the claimed direction (and its interval end is not within the bootstrap's
0.05 pp stability of 0: else "borderline"), "contradicted" when it rejects it the other way,
otherwise "not significant (point estimate in the claimed direction)" or "inconclusive"; "not
tested" when a method or number is missing. A claim over several Ks (Pass@16 and Pass@32) is
one claim with two views: it holds only if both views do. Claims without an interval (the
Pareto front; the entropy curves of one training seed) are descriptions outside the family.
Averages are over all tasks of the Pass@K table, as in the paper's Average column.

Every finding says what variance its interval covers (``variance``: "3 training seeds × 256
problems per task" for the seed-level t-interval of :mod:`esreason.report.components`; "1
training seed: evaluation noise only" for the problem bootstrap; "no interval"). With several
seeds a claim about two methods also carries its value and (uncorrected) verdict on each seed
alone (``per_seed``, a description) and the probability of improvement ``P(A > B)``
(``probability``, a description).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from esreason.report.components import Estimate
from esreason.report.curves import Curves
from esreason.report.family import ClaimTest, Decision, Part, decide
from esreason.report.load import Experiment, evaluated, read_metrics_rows
from esreason.report.pareto import ParetoPanel
from esreason.report.seeds import per_seed_differences, variance_source
from esreason.report.stats import improvement_probability, paired_difference
from esreason.report.tables import AVERAGE_GROUP, BelowBase, Table, table_tasks
from esreason.report.verdicts import HOLDS, NOT_TESTED, combine, interval_verdict, point_verdict


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
    """Per training seed: ``{"seed", "diff" (Cell dict), "verdict"}`` (several seeds only; uncorrected)."""
    probability: dict[str, Any] | None = None
    """``P(A > B)`` on a random problem and seeds with its interval (Cell dict), or None."""
    test: ClaimTest | None = field(default=None, repr=False)
    """The family member's test (None: a description, not in the family)."""
    decision: dict[str, Any] | None = None
    """p-value, Holm-adjusted p-value, rank and family size (family members only)."""

    @property
    def holds(self) -> bool | None:
        """True only for the verdict "holds"; None when not tested."""
        return None if self.verdict == NOT_TESTED else self.verdict == HOLDS

    @property
    def in_family(self) -> bool:
        return self.test is not None

    def as_dict(self) -> dict[str, Any]:
        return {"id": self.id, "claim": self.claim, "paper": self.paper, "verdict": self.verdict,
                "holds": self.holds, "evidence": self.evidence, "values": self.values, "variance": self.variance,
                "per_seed": self.per_seed, "probability": self.probability, "in_family": self.in_family,
                "test": self.decision}

    @property
    def seeds_line(self) -> str:
        """The per-seed values and (uncorrected) verdicts in one line ("" without seeds)."""
        return "; ".join(f"seed {p['seed']}: {_pp(p['diff']['value'])} ({p['verdict']})"
                         for p in self.per_seed if p["diff"] and p["diff"]["value"] is not None)


def _pp(x: float) -> str:
    return f"{100 * x:+.1f} pp"


def _ci(c: Any) -> str:
    return " (no interval)" if c.low is None or c.high is None else f" [95% CI {_pp(c.low)}, {_pp(c.high)}]"


def _views(exp: Experiment, a: str | None, b: str | None, tasks: Sequence[str], metrics: Sequence[str], fid: str,
           claim: str, paper: str) -> Finding:
    """Claim: average ``metric`` of a > that of b, for every metric in ``metrics`` (one claim, one
    view per metric; paired difference over problems, and over seeds with several)."""
    if a is None or b is None:
        return Finding(fid, claim, paper, NOT_TESTED, "a method is missing from the experiment")
    diffs = {m: paired_difference(exp, a, b, tasks, m) for m in metrics}
    missing = [m for m, d in diffs.items() if d is None]
    if missing:
        return Finding(fid, claim, paper, NOT_TESTED, f"{', '.join(missing)} missing for {exp.label(a)} or "
                       f"{exp.label(b)}")
    parts = [Part(d.estimate, 1) for d in diffs.values() if d is not None and d.estimate is not None
             and d.low is not None]
    test = ClaimTest([parts]) if len(parts) == len(diffs) else None
    view_words = " / ".join(metrics)
    evidence = f"{exp.label(a)} - {exp.label(b)} average " + "; ".join(
        f"{m}: {_pp(d.value)}{_ci(d)}" for m, d in diffs.items())  # type: ignore[union-attr]
    last = metrics[-1]
    seeds = [{"seed": s, "diff": None, "verdict": NOT_TESTED} if c is None else
             {"seed": s, "diff": c.as_dict(), "verdict": interval_verdict(c.value, c.low, c.high)}
             for s, c in per_seed_differences(exp, a, b, tasks, last)]
    prob = improvement_probability(exp, a, b, tasks, last) if exp.n_seeds > 1 else None
    values: dict[str, Any] = ({"diff": _cell_dict(diffs[last])} if len(metrics) == 1 else
                              {"views": {m: _cell_dict(d) for m, d in diffs.items()}, "per_seed_view": last})
    d0 = diffs[last]
    verdict = (combine([interval_verdict(d.value, d.low, d.high) for d in diffs.values()])  # type: ignore[union-attr]
               if test is None else "pending")
    out = Finding(fid, claim, paper, verdict, evidence + ("" if len(metrics) == 1 else
                                                          f" (one claim, {len(metrics)} views: {view_words})"),
                  values, variance=variance_source(exp, [a, b], tasks, last, d0.low is not None),  # type: ignore
                  per_seed=seeds, probability=None if prob is None else prob.as_dict(), test=test)
    return out


def _cell_dict(c: Any) -> dict[str, Any]:
    d = c.as_dict()
    if c.estimate is not None:
        d.update({k: v for k, v in c.estimate.as_dict().items() if k in ("method", "se", "df", "p", "covers")})
    return d


def average_findings(exp: Experiment, ks: Sequence[int]) -> list[Finding]:
    """Claims about the Average column of the Pass@K table (paper section RQ1 "Test Results"); the
    large Ks of a claim are its views (one claim)."""
    tasks, _ = table_tasks(exp, evaluated(exp))
    base, grpo, es = exp.by_role("base"), exp.by_role("grpo"), exp.by_role("es")
    paper = "RQ1 Test Results; Tables tab:rq1-instruct-final, tab:rq1-deepseek-math"
    large = [f"pass@{k}" for k in ks]
    kw = "/".join(f"Pass@{k}" for k in ks)
    out = [_views(exp, es, base, tasks, ["pass@1"], "es_improves_pass1",
                  "ES improves average Pass@1 over the base model", paper)]
    if large:
        out.append(_views(exp, es, base, tasks, large, "es_improves_passk",
                          f"ES improves average {kw} over the base model", paper))
    out.append(_views(exp, grpo, es, tasks, ["pass@1"], "grpo_beats_es_pass1",
                      "GRPO achieves a larger average Pass@1 than ES", paper))
    if large:
        out.append(_views(exp, es, grpo, tasks, large, "es_beats_grpo_passk",
                          f"ES attains a higher average {kw} than GRPO", paper))
    return out


def below_base_finding(exp: Experiment, below: BelowBase | None) -> Finding:
    """GRPO falls below base at every large K on most tasks (the paper: 15 of 18).

    One family member: k = floor(T/2) + 1 of the T tasks must be below base at every large K
    (:class:`esreason.report.family.ClaimTest` with T groups of K views). The per-(task, K)
    comparisons and their uncorrected "significant" counts are a description.
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
    per_task: dict[str, list[Any]] = {}
    for c in below.comparisons:
        if c.method == grpo:
            per_task.setdefault(c.task, []).append(c)
    complete = {t: cs for t, cs in per_task.items() if len(cs) == len(below.ks)}
    uncorrected = {t: [interval_verdict(c.diff.value, c.diff.low, c.diff.high, -1) for c in cs]
                   for t, cs in complete.items()}
    sig_below = sum(all(v == HOLDS for v in vs) for vs in uncorrected.values())
    sig_above = sum(all(v == "contradicted" for v in vs) for vs in uncorrected.values())
    need = total // 2 + 1
    groups = [[Part(c.diff.estimate, -1) for c in cs] for cs in complete.values()]
    ok = (len(groups) == total and all(pt.estimate is not None and pt.estimate.interval()[0] is not None
                                       for g in groups for pt in g))
    test = ClaimTest(groups, need) if ok else None
    verdict = "pending" if test is not None else point_verdict(n > total / 2)
    has_ci = any(c.diff.low is not None for cs in complete.values() for c in cs)
    return Finding("grpo_below_base", claim, paper, verdict,
                   variance=variance_source(exp, [grpo, exp.by_role("base")], list(per_task), "pass@1", has_ci),
                   evidence=f"{n} of {total} tasks below base at K in {below.ks} (claim: at least {need}); "
                   f"description, uncorrected: {sig_below} tasks significantly below at every K, {sig_above} "
                   f"significantly above; {row['below']} of {row['comparisons']} (task, K) comparisons below, "
                   f"{row['significant']} significant",
                   values=dict(row, tasks_needed=need, tasks_significantly_below_all_k_uncorrected=sig_below,
                               tasks_significantly_above_all_k_uncorrected=sig_above), test=test)


def heldout_change_finding(exp: Experiment, change: Table | None, k: int) -> Finding:
    """Held-out Pass@K change is positive under ES and negative under GRPO (Table tab:rq2-heldout-change):
    one claim of two parts (it holds only if both do; contradicted if either is)."""
    claim = f"Held-out Pass@{k} change vs base is positive under ES and negative under GRPO"
    paper = "RQ2; Table tab:rq2-heldout-change"
    es, grpo = exp.by_role("es"), exp.by_role("grpo")
    if change is None or es is None or grpo is None:
        return Finding("heldout_change", claim, paper, NOT_TESTED, "no held-out change table, ES or GRPO")
    ce, cg = change.get(es, "pass", f"pass@{k}"), change.get(grpo, "pass", f"pass@{k}")
    if ce is None or cg is None or ce.value is None or cg.value is None:
        return Finding("heldout_change", claim, paper, NOT_TESTED, f"pass@{k} change missing")
    parts = [interval_verdict(ce.value, ce.low, ce.high, 1), interval_verdict(cg.value, cg.low, cg.high, -1)]
    ok = all(c.estimate is not None and c.low is not None for c in (ce, cg))
    test = ClaimTest([[Part(ce.estimate, 1), Part(cg.estimate, -1)]]) if ok else None

    def _ci2(c: Any) -> str:
        return " (no interval)" if c.low is None or c.high is None else f" [{_pp(c.low)}, {_pp(c.high)}]"

    held = [t for t in exp.held_out if t not in exp.in_domain]
    return Finding("heldout_change", claim, paper, "pending" if test is not None else combine(parts),
                   variance=variance_source(exp, [es, grpo, exp.by_role("base")], held, "pass@1", ok),
                   evidence=f"ES {_pp(ce.value)}{_ci2(ce)}, GRPO {_pp(cg.value)}{_ci2(cg)} (uncorrected parts: "
                   f"{parts[0]}; {parts[1]})",
                   values={"es": _cell_dict(ce), "grpo": _cell_dict(cg), "parts_uncorrected": parts}, test=test)


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


def _seed_change(exp: Experiment, method: str, seed: str, key: str = "heldout/entropy") -> float | None:
    """First-to-last change of ``key`` over one training seed's concatenated stages (None: not logged)."""
    run = exp.methods[method].seeds.get(seed)
    if run is None:
        return None
    points = []
    for stage in run.training:
        if stage.metrics is None or not stage.metrics.is_file():
            return None
        for row in read_metrics_rows(stage.metrics):
            v = row.get(key)
            if isinstance(v, (int, float)) and not isinstance(v, bool) and np.isfinite(v):
                points.append((stage.offset + int(row["step"]), float(v)))
    if len(points) < 2:
        return None
    points.sort(key=lambda p: p[0])
    return points[-1][1] - points[0][1]


def welch_estimate(x: Sequence[float], y: Sequence[float], label: str) -> Estimate | None:
    """``mean(x) - mean(y)`` of independent samples with Welch's t (Welch–Satterthwaite df); None
    unless both have two values or more."""
    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    if x.size < 2 or y.size < 2:
        return None
    vx, vy = x.var(ddof=1) / x.size, y.var(ddof=1) / y.size
    se2 = vx + vy
    df = se2 ** 2 / (vx ** 2 / (x.size - 1) + vy ** 2 / (y.size - 1)) if se2 > 0 else float("inf")
    return Estimate(float(x.mean() - y.mean()), "t", label, se=float(np.sqrt(se2)), df=float(df))


def entropy_finding(exp: Experiment, curves: Curves | None) -> Finding:
    """Held-out entropy falls more under GRPO than under ES (Figure fig:rq1-overview (a-b)).

    With several training seeds: every seed's first-to-last change, and a Welch t-interval over the
    seeds of GRPO's mean change minus ES's (independent runs); a family member. With one seed: the
    point comparison of the two curves, a description."""
    claim = "Held-out token entropy falls more under GRPO than under ES during training"
    paper = "RQ1 Training Dynamics; Figure fig:rq1-overview (a-b)"
    es, grpo = exp.by_role("es"), exp.by_role("grpo")
    if es is not None and grpo is not None and len(exp.seed_keys(es)) > 1 and len(exp.seed_keys(grpo)) > 1:
        ch = {m: [_seed_change(exp, m, s) for s in exp.seed_keys(m)] for m in (es, grpo)}
        if all(v is not None for vs in ch.values() for v in vs):
            label = f"{len(ch[grpo])} + {len(ch[es])} training seeds (Welch t over seeds)"
            est = welch_estimate(ch[grpo], ch[es], label)  # type: ignore[arg-type]
            if est is not None:
                lo, hi = est.interval()
                return Finding(
                    "entropy", claim, paper, "pending",
                    f"GRPO - ES first-to-last change: {est.value:+.4f} nats/token [95% CI {lo:+.4f}, {hi:+.4f}] "
                    f"(GRPO mean {np.mean(ch[grpo]):+.4f}, ES mean {np.mean(ch[es]):+.4f}; every seed's curves)",
                    values={"grpo": ch[grpo], "es": ch[es], "diff": {**est.as_dict()}}, variance=label,
                    per_seed=[], test=ClaimTest([[Part(est, -1)]]))
    lines = {s.method: s for s in (curves.panels.get("heldout/entropy", []) if curves else [])}
    if es not in lines or grpo not in lines:
        return Finding("entropy", claim, paper, NOT_TESTED, "held-out entropy not logged for ES and GRPO")
    change = {m: lines[m].ys[-1] - lines[m].ys[0] for m in (es, grpo)}  # type: ignore[index]
    return Finding("entropy", claim, paper, point_verdict(change[grpo] < change[es]),  # type: ignore[index]
                   f"no interval (one training seed: a description); first-to-last change: GRPO "
                   f"{change[grpo]:+.4f}, ES {change[es]:+.4f} nats/token",  # type: ignore[index]
                   values={"grpo": change[grpo], "es": change[es]})  # type: ignore[index]


def apply_family(findings: Sequence[Finding]) -> list[Decision]:
    """Decide every family member (a finding with a test) by Holm over the family; the others keep
    their descriptive verdicts. Returns the decisions in family order."""
    members = [f for f in findings if f.test is not None]
    decisions = decide([f.test for f in members])  # type: ignore[misc]
    for f, d in zip(members, decisions):
        f.verdict, f.decision = d.verdict, d.as_dict()
    return decisions


def all_findings(exp: Experiment, below: BelowBase | None, change: Table | None, panels: Sequence[ParetoPanel],
                 curves: Curves | None, extra: Sequence[Finding] = ()) -> list[Finding]:
    """Every claim, the family decided by Holm (:func:`apply_family`); ``extra``: further claims (the GRPO
    variants', :mod:`esreason.report.variants`), family members where they carry a test."""
    ks = [k for k in exp.ks if k > 1]
    out = average_findings(exp, ks)
    out.append(below_base_finding(exp, below))
    if ks:
        out.append(heldout_change_finding(exp, change, max(ks)))
    out.append(pareto_finding(exp, panels))
    out.append(entropy_finding(exp, curves))
    out += list(extra)
    apply_family(out)
    return out
