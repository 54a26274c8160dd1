"""Claims about the GRPO variants of an experiment (Dr. GRPO, DAPO, ...; ``variant: true`` methods).

For every variant V the report restates the paper's two head-to-head claims with V in GRPO's place:
"V achieves a larger average Pass@1 than ES" and "ES attains a higher average Pass@K than V" (the
large Ks as views of one claim), with the same paired differences and intervals as the GRPO claims
(:func:`esreason.report.findings._views`). A variant whose experiment entry says ``family: true`` adds
both claims to the family decided by Holm's correction (:mod:`esreason.report.family`): the family
grows by two members, which makes every member's correction stricter. Any other variant's claims are
descriptions: their verdict reads the uncorrected 95% intervals and they are not in the family.
"""

from __future__ import annotations

from esreason.report.findings import Finding, _views
from esreason.report.load import Experiment, evaluated
from esreason.report.tables import table_tasks
from esreason.report.verdicts import combine, interval_verdict

PAPER = "RQ1 Test Results, with a GRPO variant as the comparator (not a paper claim)"


def _describe(f: Finding) -> Finding:
    """``f`` as a description: out of the family, its verdict from its uncorrected intervals."""
    if f.test is None:
        return f
    verdicts = [interval_verdict(pt.estimate.value, *pt.estimate.interval(), pt.direction)
                for g in f.test.groups for pt in g]
    f.test, f.verdict = None, combine(verdicts)
    return f


def variant_findings(exp: Experiment) -> list[Finding]:
    """The two claims of every variant against ES (family members only where the experiment says so)."""
    ks = [k for k in exp.ks if k > 1]
    tasks, _ = table_tasks(exp, evaluated(exp))
    es = exp.by_role("es")
    large = [f"pass@{k}" for k in ks]
    kw = "/".join(f"Pass@{k}" for k in ks)
    out: list[Finding] = []
    for key, m in exp.methods.items():
        if not m.variant:
            continue
        claims = [_views(exp, key, es, tasks, ["pass@1"], f"variant_beats_es_pass1:{key}",
                         f"{m.label} achieves a larger average Pass@1 than ES", PAPER)]
        if large:
            claims.append(_views(exp, es, key, tasks, large, f"es_beats_variant_passk:{key}",
                                 f"ES attains a higher average {kw} than {m.label}", PAPER))
        out += claims if m.family else [_describe(f) for f in claims]
    return out


__all__ = ["PAPER", "variant_findings"]
