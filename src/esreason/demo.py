"""``esreason demo``: ES on the embedded default, with before/after numbers.

Runs, on CPU in a few minutes:

1. evaluate the embedded default on the in-domain task (``demo-add``) and the held-out
   families (``demo-heldout``): greedy accuracy, sampled Pass@1 and Pass@K, entropy;
2. ES post-training on ``demo-add`` with ``configs/demo/es.yaml`` (shipped inside the
   package as ``esreason/assets/configs/demo-es.yaml``);
3. the same evaluation of the ES checkpoint;
4. a table of what changed, written to ``OUTPUT/demo_summary.{json,md}``.

``--quick`` shrinks every budget to a smoke test (seconds, numbers meaningless).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from esreason.config import load_config

DEMO_CONFIG = Path(__file__).resolve().parent / "assets" / "configs" / "demo-es.yaml"
QUICK_OVERRIDES = ("train.max_steps=2", "es.population_size=4", "train.batch_size=8", "checkpoint.every=0")


def demo_config(quick: bool = False, extra: tuple[str, ...] = ()) -> Any:
    return load_config(DEMO_CONFIG, (QUICK_OVERRIDES if quick else ()) + tuple(extra))


def _evaluate(model_path: str, tasks: list[str], cfg: Any, quick: bool) -> dict[str, Any]:
    from esreason import tasks as task_registry
    from esreason.backends.hf import load_model
    from esreason.backends.sampling import Sampler
    from esreason.eval import evaluate_problems

    model, tok = load_model(model_path)
    sampler = Sampler(model, tok, batch_size=256)
    limit = 8 if quick else 100
    samples = 4 if quick else 16
    ks = (1, 4) if quick else (1, 4, 16)
    problems = []
    for name in tasks:
        problems.extend(task_registry.get(name).load("test", limit=limit))
    return evaluate_problems(sampler, tok, problems, samples=samples, temperature=0.6,
                             max_new_tokens=cfg.generation.max_new_tokens, ks=ks, seed=1234, greedy=True)


SHOWN_METRICS = ("greedy_acc", "pass@1", "pass@4", "pass@16", "maj@16", "entropy")


def _rows(before: dict[str, Any], after: dict[str, Any], tasks: list[str]) -> list[tuple[str, str, float, float]]:
    """(task, metric, base, ES) for the metrics worth printing (evaluate_problems' flat keys)."""
    rows = []
    for task in tasks:
        for name in SHOWN_METRICS:
            b, a = before.get(f"{task}/{name}"), after.get(f"{task}/{name}")
            if isinstance(b, (int, float)) and isinstance(a, (int, float)):
                rows.append((task, name, float(b), float(a)))
    return rows


def run_demo(output: Path, quick: bool = False, progress: bool = True) -> int:
    from esreason.es.run import run_es
    from esreason.embedded import demo_model_dir
    from esreason.tasks import SUITES

    t_start = time.perf_counter()
    output.mkdir(parents=True, exist_ok=True)
    cfg = demo_config(quick)
    tasks = [cfg.task, *SUITES["demo-heldout"]]
    print(f"esreason demo -> {output}  ({'quick' if quick else 'full'}; CPU)")
    print(f"[1/3] evaluating the embedded default on {', '.join(tasks)}")
    before = _evaluate(str(demo_model_dir()), tasks, cfg, quick)
    es_dir = output / "es"
    print(f"[2/3] ES on {cfg.task}: N={cfg.es.population_size}, sigma={cfg.es.sigma}, alpha={cfg.es.alpha}, "
          f"B={cfg.train.batch_size}, {cfg.train.max_steps} updates")
    result = run_es(cfg, es_dir, resume=(es_dir / "metrics.jsonl").exists(), progress=progress)
    print(f"[3/3] evaluating the ES checkpoint {result.final_checkpoint}")
    after = _evaluate(str(result.final_checkpoint), tasks, cfg, quick)
    rows = _rows(before, after, tasks)
    elapsed = time.perf_counter() - t_start

    lines = ["| task | metric | base | ES | change |", "|---|---|---:|---:|---:|"]
    lines += [f"| {t} | {m} | {b:.3f} | {a:.3f} | {a - b:+.3f} |" for t, m, b, a in rows]
    table = "\n".join(lines)
    summary = {"quick": quick, "seconds": elapsed, "config": str(DEMO_CONFIG),
               "es_run": str(es_dir), "final_checkpoint": str(result.final_checkpoint),
               "before": before, "after": after}
    (output / "demo_summary.json").write_text(json.dumps(summary, indent=2, default=str))
    (output / "demo_summary.md").write_text(f"# esreason demo\n\n{table}\n\nTook {elapsed:.0f} s.\n")
    print()
    print(table)
    print()
    print(f"done in {elapsed:.0f} s; summary: {output / 'demo_summary.md'}")
    return 0
