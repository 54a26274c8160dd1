"""Train the embedded default by SFT on the synthetic families (``esreason pretrain-demo``).

Recipe: a fresh tiny Qwen2 (:class:`~esreason.embedded.model.TinyArch`), AdamW with
linear warmup then cosine decay, next-token loss on the response tokens only (the
rendered prompt is context), a fixed mixture of the three synthetic families. The
model is deliberately under-trained so that it lands in the regime the paper studies:
moderate sampled Pass@1 on the in-domain family with clearly higher Pass@K, and
non-trivial accuracy on the held-out families.

Deterministic: the same config gives bit-identical weights on the same machine
(single-threaded reductions are not required; CPU kernels are deterministic here).
"""

from __future__ import annotations

import argparse
import json
import math
import random
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from esreason.embedded.model import ASSET_DIR, TinyArch, build_model
from esreason.embedded.tokenizer import build_tokenizer


@dataclass(frozen=True)
class PretrainConfig:
    """SFT settings for the embedded default."""

    steps: int = 310
    """Optimizer steps."""
    batch_size: int = 64
    """Sequences per step."""
    lr: float = 3e-3
    """Peak learning rate (AdamW)."""
    warmup: int = 100
    """Linear warmup steps before the cosine decay to 10% of the peak."""
    weight_decay: float = 0.01
    """AdamW weight decay."""
    seed: int = 0
    """Seed of initialisation and data order."""
    mixture: tuple[tuple[str, float], ...] = (("demo-add", 0.5), ("demo-sub", 0.35), ("demo-countdown", 0.15))
    """(family, probability) of each training sequence."""
    arch: TinyArch = field(default_factory=TinyArch)
    """Model shape."""
    threads: int = 2
    """torch CPU threads."""


def _encode(tok: Any, prompt: str, target: str) -> tuple[list[int], int]:
    """Token ids of prompt + target + EOS, and the number of prompt tokens."""
    p = tok(prompt, add_special_tokens=False)["input_ids"]
    t = tok(target, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    return p + t, len(p)


def _batches(cfg: PretrainConfig, tok: Any):
    from esreason.tasks.base import render_prompt
    from esreason.tasks.synthetic import demo_problems, solution_text

    pools = {fam: demo_problems(fam, "train") for fam, _ in cfg.mixture}
    fams = [f for f, _ in cfg.mixture]
    weights = [w for _, w in cfg.mixture]
    rng = random.Random(cfg.seed)
    while True:
        seqs, starts = [], []
        for _ in range(cfg.batch_size):
            fam = rng.choices(fams, weights)[0]
            prob = pools[fam][rng.randrange(len(pools[fam]))]
            ids, start = _encode(tok, render_prompt(tok, prob.messages), solution_text(prob))
            seqs.append(ids)
            starts.append(start)
        width = max(len(s) for s in seqs)
        x = torch.full((len(seqs), width), tok.pad_token_id, dtype=torch.long)
        y = torch.full((len(seqs), width), -100, dtype=torch.long)   # -100 = ignored by the loss
        mask = torch.zeros((len(seqs), width), dtype=torch.long)
        for i, (s, st) in enumerate(zip(seqs, starts)):  # right padding for training
            x[i, :len(s)] = torch.tensor(s)
            mask[i, :len(s)] = 1
            y[i, st:len(s)] = torch.tensor(s[st:])     # labels on response tokens only
        yield x, y, mask


def pretrain(cfg: PretrainConfig, out_dir: str | Path, log_every: int = 100) -> dict[str, Any]:
    """Train and save an HF model directory (model, tokenizer, training.json) to ``out_dir``."""
    from esreason.io.atomic import atomic_directory

    torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    tok = build_tokenizer()
    model = build_model(tok, cfg.arch, seed=cfg.seed)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay, betas=(0.9, 0.98))

    def lr_at(step: int) -> float:
        if step < cfg.warmup:
            return cfg.lr * (step + 1) / cfg.warmup
        frac = (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup)
        return cfg.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))

    t0 = time.perf_counter()
    losses = []
    data = _batches(cfg, tok)
    for step in range(cfg.steps):
        x, y, mask = next(data)
        for group in opt.param_groups:
            group["lr"] = lr_at(step)
        # HF shifts labels internally: logits[t] predicts labels[t+1].
        loss = model(input_ids=x, attention_mask=mask, labels=y).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(float(loss.detach()))
        if log_every and (step + 1) % log_every == 0:
            print(f"step {step + 1}/{cfg.steps}  loss {sum(losses[-log_every:]) / log_every:.4f}  "
                  f"lr {lr_at(step):.2e}  {time.perf_counter() - t0:.0f}s", flush=True)
    model.eval()
    metrics = {"final_loss": sum(losses[-50:]) / min(50, len(losses)), "seconds": time.perf_counter() - t0,
               "parameters": sum(p.numel() for p in model.parameters())}
    record = {"config": asdict(cfg), "metrics": metrics,
              "reproduce": "esreason pretrain-demo --output DIR (same config => identical weights on CPU)"}
    with atomic_directory(out_dir) as tmp:
        model.save_pretrained(tmp, safe_serialization=True)
        tok.save_pretrained(tmp)
        (Path(tmp) / "training.json").write_text(json.dumps(record, indent=2))
    return metrics


def run(args: argparse.Namespace) -> int:
    """Pretrain with parsed :func:`esreason.cli.add_pretrain_arguments` options and print the metrics as JSON."""
    seed = PretrainConfig.seed if args.seed is None else args.seed
    output = str(ASSET_DIR) if args.output is None else args.output
    if args.quick:
        cfg = PretrainConfig(steps=3, batch_size=4, warmup=1, seed=seed,
                             arch=TinyArch(hidden=32, layers=1, heads=2, kv_heads=2, intermediate=64))
    else:
        cfg = PretrainConfig(steps=PretrainConfig.steps if args.steps is None else args.steps, seed=seed)
    metrics = pretrain(cfg, output, log_every=0 if args.quick else 100)
    print(json.dumps({"output": output, **metrics}))
    return 0
