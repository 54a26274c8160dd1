"""``report.md``: the protocol header, findings, tables with their interval tables, figures and notes."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from esreason.report import markdown
from esreason.report.budget import budget_md
from esreason.report.timing import timing_md
from esreason.report.compute import Parts
from esreason.report.findings import Finding
from esreason.report.load import Experiment
from esreason.report.pareto import ParetoPanel
from esreason.report.tables import BelowBase, Table


def below_rows(exp: Experiment, below: BelowBase) -> tuple[list[str], list[list[str]]]:
    header = ["Method", "Scope", "(task, K) below base", "of which significant", "tasks below at every K"]
    rows = [[c["label"], "held-out tasks" if c["scope"] == "held_out" else "all tasks",
             f"{c['below']} of {c['comparisons']}", str(c["significant"]), f"{c['tasks_below_all_k']} of {c['tasks']}"]
            for c in below.counts]
    return header, rows


def _below_detail(exp: Experiment, below: BelowBase) -> tuple[list[str], list[list[str]]]:
    header = ["Method", "Task", "K", "Pass@K", "Base", "Δ [95% CI]", "below", "significant", "test"]
    rows = []
    for c in below.comparisons:
        sig = "–" if c.significant is None else ("yes" if c.significant else "no")
        ci = "" if c.diff.low is None else " " + markdown.fmt_ci(c.diff, signed=True)
        rows.append([exp.label(c.method), c.task, str(c.k), f"{100 * c.value:.1f}", f"{100 * c.base:.1f}",
                     markdown.fmt(c.diff, signed=True) + ci, "yes" if c.below else "no", sig, c.test])
    return header, rows


def pareto_rows(exp: Experiment, panels: Sequence[ParetoPanel]) -> tuple[list[str], list[list[str]]]:
    header = ["Panel", "Reference front (Base/GRPO/ES)", "Full front", "Dominated", "Added by others"]

    def names(keys: Sequence[str]) -> str:
        return ", ".join(exp.label(k) for k in keys) or "none"

    rows = [[p.label, names(p.reference_front), names(p.full_front), names(list(p.dominated_by)), names(p.added)]
            for p in panels]
    return header, rows


def _protocol_lines(exp: Experiment) -> list[str]:
    p = exp.protocol
    level, resamples, _ = exp.bootstrap_settings()
    held = [t for t in exp.held_out if t not in exp.in_domain]
    return [f"- experiment: `{exp.name}` (`{exp.root}`); model: `{exp.model}`; trained on: `{exp.train_task}`",
            f"- in-domain tasks: {', '.join(exp.in_domain) or 'none'}; held-out tasks: {', '.join(held) or 'none'}",
            f"- protocol: {p.get('samples')} samples per problem at temperature {p.get('temperature')}, "
            f"max {p.get('max_new_tokens')} new tokens, greedy: {p.get('greedy')}, limit: {p.get('limit')}; "
            f"K in {exp.ks}",
            "- methods: " + ", ".join(f"{m.label} (`{m.key}`, {m.kind}"
                                       + (f", {m.checkpoint}" if m.checkpoint else "") + ")"
                                       for m in exp.methods.values()),
            estimand_line(exp, p), _intervals_line(exp, level, resamples), family_line(), stability_line(resamples)]


def estimand_line(exp: Experiment, protocol: dict) -> str:
    """Over what the claims generalise."""
    seeds = ("training seeds drawn from the seed population" if exp.n_seeds > 1 else
             "one training seed: the claims are about that seed's checkpoints, not about training runs in general")
    return (f"- estimand: the equal-weight average over these tasks (fixed: {', '.join(exp.tasks)}) of the "
            f"difference in expected score, with problems drawn from each task's population, {seeds}, and "
            f"samples drawn at temperature {protocol.get('temperature')}")


def family_line() -> str:
    """The family of claims, the error rate and the correction."""
    from esreason.report.family import CORRECTION

    return ("- family: the paper claims below that have an interval (marked 'family'); error rate controlled: "
            f"family-wise, by {CORRECTION}; a claim over several K is one claim with one view per K (it holds "
            "only if every view does). Per-seed columns, P(improvement), per-(task, K) counts and claims "
            "without an interval are descriptions, not tested")


def stability_line(resamples: int) -> str:
    """The bootstrap's stated endpoint stability."""
    from esreason.report.resample import GRID_ERROR_MEASURED, STABILITY, STABILITY_MEASURED

    mc = STABILITY_MEASURED["resampled"]
    return (f"- stability: one-seed percentile endpoints are read off the problem bootstrap's exact distribution "
            f"(computed by convolution, no resamples): they do not move between bootstrap seeds, and the grid "
            f"moves them by under {GRID_ERROR_MEASURED:.4f} pp; only an interval over a task with a missing value "
            f"resamples ({resamples:,} times; it moves by up to {max(mc.values()):.2f} pp, docs/report.md, "
            f"'Stable endpoints'); the t-intervals have no Monte Carlo error. A 'holds' whose interval end at its "
            f"Holm level is within {100 * STABILITY:.2f} pp of 0 is reported as 'borderline'")


def _intervals_line(exp: Experiment, level: float, resamples: int) -> str:
    if exp.n_seeds <= 1:
        return (f"- intervals: {int(level * 100)}% percentile bootstrap over problems ({resamples:,} resamples), "
                f"resampled within each task; differences vs base are paired by problem. One training seed: "
                f"the intervals cover evaluation noise only, not the variance between training runs")
    seeds = {m.label: ", ".join(m.seeds) for m in exp.methods.values() if m.seeds}
    return (f"- training seeds: {'; '.join(f'{k}: {v}' for k, v in seeds.items())} (methods evaluated once: "
            f"{', '.join(m.label for m in exp.methods.values() if not m.seeds) or 'none'}); a method's value is "
            f"the mean over its seeds\n- intervals: {int(level * 100)}% seed-level t-intervals: the between-seed "
            f"variance of each trained method (S - 1 df) plus the problem-level variance, without counting the "
            f"seed x problem and sampling noise twice (two-level variance components, Welch–Satterthwaite df "
            f"capped at the seeds' df; esreason.report.components; coverage 0.95-0.98 in simulation at this "
            f"shape, docs/report.md). Differences are paired by problem; seeds are paired only for nested runs "
            f"(a composition against its own first stage), never between independently trained methods. "
            f"Methods evaluated once (Base) contribute problem-level variance only")


def mdd_rows(exp: Experiment, parts: Parts) -> tuple[list[str], list[list[str]]]:
    """Per task: problems, base Pass@1, paired MDD per trained method and the unpaired MDD (pp)."""
    methods = list(dict.fromkeys(m for r in parts.mdd for m in r.paired))
    header = (["Task", "Problems", "Base Pass@1"] + [f"MDD {exp.label(m)} vs Base" for m in methods]
              + ["MDD paired (max)", "MDD unpaired"])

    def pp(x: float | None) -> str:
        return "–" if x is None else f"{100 * x:.1f}"

    rows = []
    for r in parts.mdd:
        held = " (held-out)" if r.task not in exp.in_domain else ""
        rows.append([r.task + held, str(r.n), pp(r.base)] + [pp(r.paired.get(m)) for m in methods]
                    + [pp(r.paired_max), pp(r.unpaired)])
    return header, rows


def change_rows(exp: Experiment, parts: Parts) -> tuple[list[str], list[list[str]]]:
    """Per trained method and task: Pass@1 minus Base (pp) with its paired 95% interval."""
    tasks = [r.task for r in parts.mdd]
    header = ["Method"] + [t + ("" if t in exp.in_domain else " (held-out)") for t in tasks]
    rows = []
    for m, cells in parts.changes.items():
        rows.append([exp.label(m)] + [markdown.fmt(cells.get(t), signed=True) + (
            " " + markdown.fmt_ci(cells.get(t), signed=True) if cells.get(t) is not None
            and cells[t].low is not None else "") for t in tasks])
    return header, rows


def _mdd_md(exp: Experiment, parts: Parts) -> list[str]:
    if not parts.mdd:
        return []
    change = ([] if not parts.changes else [
        "Pass@1 change vs Base on each task (percentage points, paired 95% bootstrap interval over problems"
        + (", and over training seeds" if exp.n_seeds > 1 else "") + "):",
        "", markdown.simple_markdown(*change_rows(exp, parts)), ""])
    return ["## Resolution: minimum detectable Pass@1 difference", "",
            "The smallest true difference in Pass@1 (percentage points) a two-sided test at alpha 0.05 detects "
            "with 80% power on each task, by the normal approximation 2.80 * sd / sqrt(n) "
            "(esreason.report.power). Paired: sd of that method's per-problem differences to Base (the "
            "resolution of this report's paired comparisons); unpaired: two independent models with Base's "
            "per-problem spread, sqrt(2) * sd(Base) (an upper bound for the paired design when per-problem "
            "values are positively correlated; known before training). An average over T tasks resolves "
            "roughly 1/sqrt(T) of the per-task value.", "",
            markdown.simple_markdown(*mdd_rows(exp, parts)), ""] + change


def _test_text(f: Finding) -> str:
    d = f.decision
    if not d:
        if f.verdict == "not tested":
            return "–"
        return "description (no interval)" if f.variance == "no interval" else "description (uncorrected, not in the family)"
    return f"family {d['rank']}/{d['family_size']}: p {d['p']:.2g}, Holm p {d['p_holm']:.2g}"


def _findings_md(findings: Sequence[Finding]) -> list[str]:
    seeded = any(f.per_seed for f in findings)
    header = ["Paper claim", "Here (after Holm)", "Evidence (95% CI, uncorrected)", "Test", "Interval covers"]
    header += ["Per seed (description, uncorrected)", "P(improvement) [95% CI] (description)"] if seeded else []
    rows = []
    for f in findings:
        row = [f.claim, f.verdict, f.evidence, _test_text(f), f.variance]
        if seeded:
            p = f.probability
            row += [f.seeds_line or "–", "–" if not p or p["value"] is None else f"{p['value']:.3f}" + (
                "" if p["ci_low"] is None else f" [{p['ci_low']:.3f}, {p['ci_high']:.3f}]")]
        rows.append(row + [f.paper])
    return [markdown.simple_markdown(header + ["Paper"], rows)]


def _table_section(table: Table | None, number: str, heading: str, explain: str, tex: str) -> list[str]:
    out = [f"## {number}. {heading}", "", explain, ""]
    if table is None:
        return out + ["_Not available (see Notes)._", ""]
    out += [markdown.table_markdown(table), "", table.caption, ""]
    if not table.signed:
        out += [markdown.MARK_LEGEND, ""]
    out += ["Intervals (95%, same layout):", "", markdown.ci_markdown(table), "", f"LaTeX: [`{tex}`]({tex})", ""]
    return out


# ---------------------------------------------------------------------- report


def render_markdown(exp: Experiment, parts: Parts, files: dict[str, Path], tex: dict[str, str],
                    notes: Sequence[str]) -> str:
    pk = parts.panels[0].k if parts.panels else max(exp.ks)
    lines = [f"# esreason report: {exp.name}", ""] + _protocol_lines(exp) + [""]
    lines += ["## Findings (paper RQ1 claims, checked here)", ""] + _findings_md(parts.findings) + [
        "", "'holds': after Holm's correction over the family (family-wise error 0.05) the test rejects 'no "
            "difference' in the claimed direction; 'borderline': it does, but the interval end at its Holm level "
            "is within the bootstrap's stability (0.05 pp) of 0; 'contradicted': it rejects it the other way; "
            "otherwise 'not significant (point estimate in the claimed direction)' — no support — or "
            "'inconclusive'. The evidence shows each view's uncorrected 95% interval; 'Test' gives the "
            "claim's p-value and its Holm-adjusted p-value (esreason.report.family). Claims without an "
            "interval are descriptions and at best 'not significant'. 'Interval covers': the variance the "
            "interval includes — several training seeds and problems (seed-level t-interval), or one "
            "training seed (evaluation noise only: another training seed may change the verdict). 'Per "
            "seed' (description): the difference and uncorrected verdict on each training seed alone "
            "(problem-only intervals; seeds of independent methods matched by their seed number, which "
            "carries no pairing). 'P(improvement)' (description): the probability that the first method of "
            "the claim scores higher than the second on a random problem and training seeds, ties counting "
            "1/2 (0.5: no difference; interval: the exact problem bootstrap with one seed a side, the crossed "
            "bootstrap with several).", ""]
    lines += _mdd_md(exp, parts)
    lines += _table_section(parts.pass_table, "1", "Pass@K",
                            "Paper Tables tab:rq1-instruct-final and tab:rq1-deepseek-math.", tex.get("pass_at_k", ""))
    lines += _table_section(parts.maj_table, "2", "Maj@K",
                            "Paper appendix 'Complete Majority-Vote Results' (plurality vote over the first K "
                            "samples).", tex.get("maj_at_k", ""))
    lines += ["## 3. Train → test pairs", "",
              "Paper Figure fig:rq1-overview (c-d): Pass@1/K of Base, GRPO and ES on chosen pairs; whiskers: "
              "95% intervals.", ""]
    lines += [markdown.image(files["bars"].name, "train-test pairs"), ""] if "bars" in files else ["_No figure._", ""]
    lines += ["## 4. Pass@K profiles", "", "Pass@K for every K from 1 to the samples per problem (the unbiased "
              "estimator on each problem's correct count; log2 axis), per task and on the Average; markers: the "
              "table's K with 95% intervals.", ""]
    lines += [markdown.image(files["profiles"].name, "Pass@K profiles"), ""] if "profiles" in files else []
    lines += ["## 5. Pareto fronts", "",
              f"Paper Figure fig:rq1-deepseek-math-pareto: Pass@1 (x) vs Pass@{pk} (y). Gray dashed: front of "
              f"Base/GRPO/ES; solid: front of all methods; faded: dominated. Dominance: a dominates b when it is "
              f">= on both axes and > on at least one (unrounded values); equal points do not dominate each other.",
              ""]
    if parts.panels:
        lines += [markdown.image(files["pareto"].name, "Pareto fronts"), ""] if "pareto" in files else []
        lines += [markdown.simple_markdown(*pareto_rows(exp, parts.panels)), "",
                  f"LaTeX: [`{tex['pareto_fronts']}`]({tex['pareto_fronts']})", ""]
    lines += ["## 6. Training curves", "",
              "Paper Figure fig:rq1-overview (a-b): training reward, held-out token entropy and held-out Pass@K "
              "over updates (compositions: one line over both stages, dotted boundary; dashed: base model at "
              "step 0; the reward panels have no base line because no base reward is logged). The training reward "
              "gets one panel per measure, named in its title: each run logs the reward of its own rollouts (ES: "
              "responses of the perturbed members at the run's generation temperature, greedy in the paper's "
              "setting; GRPO: samples at its rollout temperature, 1 in the paper), and a greedy reward and a "
              "sampled one are different quantities, so they never share an axis; a composition's two stages "
              "sit in the panels of their own measures. In a reward panel the faint points are single updates "
              "and the line is the mean of the last 5 updates of the same stage.", ""]
    lines += [markdown.image(files["training"].name, "training curves"), ""] if "training" in files else [
        "_No figure._", ""]
    lines += _table_section(parts.change, "7", "Held-out change vs base",
                            "Paper Table tab:rq2-heldout-change: post-training minus base on each held-out task, "
                            "averaged equally over the held-out tasks (percentage points).",
                            tex.get("heldout_change", ""))
    lines += ["## 8. Below base at large K", "",
              "The paper's '15 of 18 comparisons': per trained method, over tasks x large K, how often Pass@K is "
              "below the base model (unrounded values). A description, uncorrected: 'significant' means the "
              "95% paired interval of (method - base) over problems (and training seeds, with several) lies "
              "below 0 for that (task, K) alone; the claim itself is one member of the family (Findings). "
              "'Tasks below at every K' is the paper's per-task criterion (below on both Pass@16 and Pass@32).",
              ""]
    if parts.below is not None:
        lines += [f"Large K: {parts.below.ks}.", "", markdown.simple_markdown(*below_rows(exp, parts.below)), "",
                  "<details><summary>All comparisons (description, uncorrected)</summary>", "",
                  markdown.simple_markdown(*_below_detail(exp, parts.below)), "", "</details>", "",
                  f"LaTeX: [`{tex['below_base']}`]({tex['below_base']})", ""]
    else:
        lines += ["_Not available (needs a base method, a trained method and a K > 1)._", ""]
    lines += budget_md(exp.root)
    from esreason.report.drift import drift_section

    lines += drift_section(parts.drift, files, tex)
    lines += timing_md(exp.root)
    from esreason.report.lengths import lengths_md

    lines += lengths_md(exp.root)
    lines += ["## Notes", ""] + ([f"- {n}" for n in notes] or ["- none"]) + [""]
    return "\n".join(lines)
