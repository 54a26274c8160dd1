"""FLOP accounting for ES vs GRPO (paper appendix "ES-GRPO FLOP Matching"), and the FLOPs as spent beside it.

With P parameters and responses of L tokens, a forward pass costs ~2PL FLOPs and a
backward pass ~4PL. Per update:

    FLOPs_GRPO = 8 T B G P L    (policy forward + reference forward + policy backward)
    FLOPs_ES   = 2 T N D P L    (one forward per member and prompt)

With T_ES = T_GRPO, D = B and N = 4G the two are equal (paper: N = 32, G = 8).
Matching uses one shared L, as the paper does; lengths measured in runs differ (ES
samples at temperature 0, GRPO at 1.0) and are reported separately. What a config's code path
spends per generated token (ES 1 forward-equivalent, GRPO 5-7 by config) is the ``passes / token``
column (:func:`esreason.accounting.budget.passes_spent`, docs/budget.md).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from esreason.config import read_yaml
from esreason.errors import UserError

#: Training-set sizes of the paper's training tasks (used when the data is not local).
KNOWN_TRAIN_SIZES = {"gsm8k": 7473, "deepscaler": 40315}
#: Parameter counts of the paper's models (used when the model is not local).
KNOWN_PARAMS = {
    "Qwen/Qwen2.5-1.5B-Instruct": 1_543_714_304,
    "meta-llama/Llama-3.2-3B-Instruct": 3_212_749_824,
    "Qwen/Qwen2.5-7B-Instruct": 7_615_616_512,
    "Qwen/Qwen2.5-14B-Instruct": 14_770_033_664,
    "Qwen/Qwen2.5-32B-Instruct": 32_763_876_352,
    "deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B": 1_777_088_000,
}


@dataclass(frozen=True)
class FlopEstimate:
    """FLOPs of one training config.

    method: 'es' or 'grpo'. updates: T. prompts: B (GRPO) or D (ES). samples: G or N.
    params: P. length: the shared L. flops: the paper's estimate.
    """

    config: str
    method: str
    updates: int
    prompts: int
    samples: int
    params: int
    length: int
    flops: float
    forward_equivalents: int = 0
    """Forward-equivalents the config's code path runs per generated token (0: not counted); docs/budget.md."""

    @property
    def flops_spent(self) -> float:
        """FLOPs as spent at L: 2 P x forward-equivalents x rollouts x L (docs/budget.md, "Compute as spent")."""
        return 2.0 * self.params * self.forward_equivalents * self.rollouts * self.length

    @property
    def rollouts(self) -> int:
        """Sampled responses over the T updates: T x N x D (ES) or T x B x G (GRPO) (docs/budget.md)."""
        return self.updates * self.prompts * self.samples

    def as_dict(self) -> dict[str, Any]:
        return {**self.__dict__, "rollouts": self.rollouts, "flops_spent": self.flops_spent}


def passes_spent(cfg: Any) -> dict[str, int]:
    """Forward-equivalents (a backward counts 2) a run of ``cfg`` spends per generated token, by part: ES
    ``{"sample": 1}``; GRPO :func:`esreason.grpo.plan.passes_per_token` (docs/budget.md, "Compute as spent")."""
    if hasattr(cfg, "grpo"):
        from esreason.grpo.plan import passes_per_token

        return passes_per_token(cfg)
    return {"sample": 1}


def es_flops(T: int, N: int, D: int, P: int, L: int) -> float:
    """FLOPs_ES = 2 T N D P L."""
    return 2.0 * T * N * D * P * L


def grpo_flops(T: int, B: int, G: int, P: int, L: int) -> float:
    """FLOPs_GRPO = 8 T B G P L."""
    return 8.0 * T * B * G * P * L


def count_parameters(model: str) -> int:
    """P for 'demo', a local HF dir (instantiated on the meta device) or a known hub id."""
    if model in KNOWN_PARAMS:
        return KNOWN_PARAMS[model]
    from esreason.backends.hf import resolve_model_path

    path = resolve_model_path(model)
    if not Path(path).is_dir():
        raise UserError(f"cannot count parameters of {model!r} offline; pass --params")
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(path)
    with torch.device("meta"):
        m = AutoModelForCausalLM.from_config(config)
    seen, total = set(), 0
    for p in m.parameters():  # tied weights once
        if id(p) not in seen:
            seen.add(id(p))
            total += p.numel()
    return total


def train_size(task: str, data_path: str | None, split: str, limit: int | None) -> int:
    if task in KNOWN_TRAIN_SIZES and data_path is None:
        n = KNOWN_TRAIN_SIZES[task]
    else:
        from esreason import tasks

        n = len(tasks.get(task).load(split, data_path))
    return min(n, limit) if limit else n


def estimate(config_path: str | Path, *, length: int | None = None, params: int | None = None) -> FlopEstimate:
    """FLOPs of an ES or GRPO config file (method detected from its `es:` / `grpo:` section)."""
    raw = read_yaml(config_path)
    if "grpo" in raw:
        from esreason.grpo.config import load_grpo_config

        cfg = load_grpo_config(config_path)
    else:
        from esreason.config import load_config

        cfg = load_config(config_path)
    return estimate_config(cfg, str(config_path), length=length, params=params)


def estimate_config(cfg: Any, label: str, *, length: int | None = None, params: int | None = None) -> FlopEstimate:
    """FLOPs of a built ES ``RunConfig`` or ``GRPORunConfig``."""
    if hasattr(cfg, "grpo"):
        method, samples = "grpo", cfg.grpo.num_generations
    else:
        method, samples = "es", cfg.es.population_size
    B = cfg.train.batch_size
    if cfg.train.max_steps:
        T = cfg.train.max_steps
    else:
        n = train_size(cfg.task, cfg.data_path, cfg.train.split, cfg.train.limit)
        if method == "grpo":  # TRL and verl drop the last partial rollout batch
            from esreason.grpo.plan import updates_per_epoch

            T = cfg.train.epochs * updates_per_epoch(n, B)
        else:                 # ES keeps the tail (paper procedure step 1)
            T = cfg.train.epochs * math.ceil(n / B)
    P = params if params is not None else count_parameters(cfg.model)
    L = length if length is not None else cfg.generation.max_new_tokens
    flops = es_flops(T, samples, B, P, L) if method == "es" else grpo_flops(T, B, samples, P, L)
    return FlopEstimate(label, method, T, B, samples, P, L, flops, sum(passes_spent(cfg).values()))


def compare(estimates: list[FlopEstimate], rel_tol: float = 1e-9) -> dict[str, Any]:
    """The estimates plus whether they are matched (equal FLOPs under one shared L)."""
    matched = len(estimates) > 1 and all(
        math.isclose(e.flops, estimates[0].flops, rel_tol=rel_tol) for e in estimates[1:])
    spent = len(estimates) > 1 and all(
        math.isclose(e.flops_spent, estimates[0].flops_spent, rel_tol=rel_tol) for e in estimates[1:])
    return {"configs": [e.as_dict() for e in estimates], "matched": matched, "spent_matched": spent,
            "shared_length": len({e.length for e in estimates}) == 1}


def measured_length(run_dir: str | Path) -> float | None:
    """Mean response length measured in a run's metrics.jsonl (ES: tokens / (N*B); GRPO: TRL's
    completions/mean_length), or None when the run has no such metric."""
    from esreason.io import read_metrics

    run = Path(run_dir)
    rows = read_metrics(run / "metrics.jsonl")
    lengths = [r["completions/mean_length"] for r in rows if "completions/mean_length" in r]
    if lengths:
        return sum(lengths) / len(lengths)
    cfg_path = run / "config.yaml"
    if rows and cfg_path.is_file() and any("tokens" in r for r in rows):
        import yaml

        cfg = yaml.safe_load(cfg_path.read_text())
        n, b = cfg["es"]["population_size"], cfg["train"]["batch_size"]
        per = [r["tokens"] / (n * b) for r in rows if "tokens" in r]
        return sum(per) / len(per)
    return None


def render(result: dict[str, Any]) -> str:
    lines = ["| config | method | T | B/D | G/N | P | L | FLOPs (paper's formula) | rollouts | passes / token | "
             "FLOPs as spent |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for c in result["configs"]:
        lines.append(f"| {c['config']} | {c['method']} | {c['updates']} | {c['prompts']} | {c['samples']} | "
                     f"{c['params']:,} | {c['length']} | {c['flops']:.4g} | {c['rollouts']:,} | "
                     f"{c['forward_equivalents']} | {c['flops_spent']:.4g} |")
    if len(result["configs"]) > 1:
        lines.append("")
        lines.append(f"matched (the paper's formula): {'yes' if result['matched'] else 'no'}; FLOPs as spent "
                     f"equal: {'yes' if result['spent_matched'] else 'no'}")
    return "\n".join(lines)


def run_flops(args: Any) -> int:
    ests = [estimate(c, length=args.length, params=args.params) for c in args.config]
    result = compare(ests)
    if args.run:
        result["measured_length"] = {r: measured_length(r) for r in args.run}
    print(json.dumps(result, indent=2) if args.json else render(result))
    return 0


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("flops", help="FLOP accounting: ES vs GRPO matching (paper appendix)")
    p.add_argument("--config", action="append", required=True, help="ES or GRPO config (repeatable)")
    p.add_argument("--length", type=int, help="shared response length L (default: generation.max_new_tokens)")
    p.add_argument("--params", type=int, help="parameter count P (default: counted from the model)")
    p.add_argument("--run", action="append", help="run directory whose measured mean length to report")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=run_flops)
