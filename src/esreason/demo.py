"""``esreason demo``: the paper in miniature on the embedded default (CPU, minutes).

Runs the experiment shipped as ``esreason/assets/configs/experiment-demo.yaml`` (the same
file as ``configs/experiments/demo.yaml``): Base, GRPO, ES, ES->GRPO and GRPO->ES, all
FLOP-matched at T = 20 updates on ``demo-add``, each evaluated on ``demo-add`` and the
held-out families ``demo-sub`` and ``demo-sub3`` (32 samples per problem, Pass@1/16/32,
Maj@K, entropy, bootstrap CIs); then writes the report (``OUTPUT/report/report.md`` with
every table and figure) and prints a verdict per paper finding
(:mod:`esreason.report.findings`, :mod:`esreason.report.verdicts`: "holds" only when the
claim's test rejects "no difference" in the claimed direction after Holm's correction over the
family of claims, else "borderline", "not significant (point estimate in the claimed
direction)", "inconclusive" or "contradicted").

One training seed by default: the verdicts then say "1 training seed: evaluation noise only".
``--seeds N`` trains every method with seeds 0..N-1 (``runs/<m>/seed<s>/``) and the verdicts
rest on seed-level t-intervals over seeds and problems (:mod:`esreason.report.components`),
each with its per-seed verdicts (a description).

Rerunning with the same ``--output`` resumes (finished methods are not trained again).
``--quick`` shrinks every budget to a smoke test (numbers meaningless). Each kind of demo has
its own default directory (:func:`default_output`: ``runs/demo``, ``runs/demo-quick``,
``runs/demo-seeds3``, ...), so a quick run never blocks the full one.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from esreason.report.findings import Finding

DEMO_EXPERIMENT = Path(__file__).resolve().parent / "assets" / "configs" / "experiment-demo.yaml"
QUICK_OVERRIDES = (
    "updates=2", "eval.limit=4", "eval.samples=4", "eval.ks=[1,2,4]", "eval.max_new_tokens=24",
    "eval.ci_resamples=50",
    "configs.es.es.population_size=4", "configs.es.train.batch_size=4", "configs.es.train.limit=16",
    "configs.grpo.grpo.num_generations=2", "configs.grpo.grpo.micro_batch_size=8",
    "configs.grpo.train.batch_size=4", "configs.grpo.train.limit=16",
    "configs.es.generation.max_new_tokens=24", "configs.grpo.generation.max_new_tokens=24",
    "configs.es.checkpoint.every=1", "configs.grpo.checkpoint.every=1",
    "configs.es.eval.every=1", "configs.es.eval.limit=4", "configs.es.eval.samples=2", "configs.es.eval.ks=[1,2]",
    "configs.grpo.eval.every=1", "configs.grpo.eval.limit=4", "configs.grpo.eval.samples=2",
    "configs.grpo.eval.ks=[1,2]", "analysis.offtask.limit=4", "analysis.offtask.max_tokens=16",
)


def default_output(quick: bool = False, seeds: int = 1) -> Path:
    """The run directory used when ``--output`` is not given: one per kind of demo.

    ``runs/demo`` (the full one-seed demo), ``runs/demo-quick`` (``--quick``), ``runs/demo-seeds3``
    (``--seeds 3``), ``runs/demo-quick-seeds3``. An experiment directory refuses a different spec,
    so a shared default would make the smoke run block the full one.
    """
    name = "demo" + ("-quick" if quick else "") + (f"-seeds{seeds}" if seeds != 1 else "")
    return Path("runs") / name


def seed_overrides(seeds: int) -> tuple[str, ...]:
    """``--seeds N``: no override for N = 1 (the shipped single-seed layout), else ``seeds=[0..N-1]``."""
    from esreason.errors import UserError

    if seeds < 1:
        raise UserError(f"--seeds: expected an integer >= 1, got {seeds}")
    return () if seeds == 1 else (f"seeds=[{','.join(str(s) for s in range(seeds))}]",)


def demo_spec(quick: bool = False, extra: tuple[str, ...] = (), seeds: int = 1):
    from esreason.experiments.spec import load_spec

    return load_spec(DEMO_EXPERIMENT, (QUICK_OVERRIDES if quick else ()) + seed_overrides(seeds) + tuple(extra))


def _verdict(f: Finding) -> str:
    """One line per finding: the verdict word of :mod:`esreason.report.verdicts`, the claim, the evidence,
    what its interval covers, and (several seeds) the verdict on each seed alone."""
    seeds = f"; per seed (description): {f.seeds_line}" if f.seeds_line else ""
    test = (f"; Holm p {f.decision['p_holm']:.2g} ({f.decision['rank']} of {f.decision['family_size']})"
            if f.decision else "")
    return f"{f.verdict}: {f.claim} — {f.evidence} (interval covers: {f.variance}{test}{seeds})"


def run_demo(output: Path, quick: bool = False, progress: bool = True, seeds: int = 1) -> int:
    from esreason.experiments.runner import run_experiment
    from esreason.io.atomic import atomic_write_text
    from esreason.report import build_report

    t0 = time.perf_counter()
    spec = demo_spec(quick, seeds=seeds)
    print(f"esreason demo -> {output}  ({'quick' if quick else 'full'}; CPU)")
    print(f"  {', '.join(m.label for m in spec.methods)} on {spec.task}, {spec.updates} updates each; "
          f"evaluated on {', '.join(spec.eval.tasks)} ({spec.eval.samples} samples per problem, "
          f"first {spec.eval.limit} problems per task)")
    run_experiment(spec, output, progress=progress, report=False, log=lambda s: print("  " + s))
    report = build_report(output)
    elapsed = time.perf_counter() - t0
    lines = [_verdict(f) for f in report.findings]
    covers = (f"{len(spec.seeds)} training seeds: seed-level t-intervals over seeds and problems" if spec.seeds
              else "1 training seed: evaluation noise only; `esreason demo --seeds 3` covers training variance")
    from esreason.report.document import estimand_line, family_line

    header = (f"Intervals: {covers}.\n\n{estimand_line(report.experiment, report.experiment.protocol)[2:]}.\n\n"
              f"F{family_line()[3:]}.")
    verdict_md = output / "verdicts.md"
    atomic_write_text(verdict_md, "# esreason demo: the paper's findings in miniature\n\n"
                      + f"{header}\n\n"
                      + "\n".join(f"{i}. {line}" for i, line in enumerate(lines, start=1))
                      + f"\n\nTook {elapsed:.0f} s on this machine{' (quick)' if quick else ''}.\n")
    print()
    print(f"Paper findings in miniature (0.87M model; 'holds': significant in the claimed direction after Holm "
          f"over the family of claims; {covers}):")
    for i, line in enumerate(lines, start=1):
        print(f"  {i}. {line}")
    print()
    print(f"done in {elapsed:.0f} s")
    print(f"report:   {report.markdown}")
    print(f"verdicts: {verdict_md}")
    return 0
