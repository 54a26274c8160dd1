"""Benchmark: what ``backend: auto`` chooses for a user's own model, beside the old choice, in one run.

Before, ``auto`` chose ``batched`` only for the literal model "demo" and ``hf`` for every other model.
Now it decides from the loaded model (:func:`esreason.es_loop.select.choose_auto`): ``batched`` for a
float32 Llama/Qwen2-layout model on the CPU whose stacked member weights fit the bound, ``hf`` otherwise.

For each size of a randomly initialised Qwen2 directory (the embedded default's tokenizer; nothing about
it says "demo"), the same short ES run (N members, B prompts, greedy, a reward with variance) is trained
twice into fresh directories, alternating which goes first over ``--repeats`` rounds:

- ``old``: ``backend.type: hf`` (what ``auto`` chose for this model before);
- ``auto``: ``backend.type: auto`` (what it chooses now; ``auto_choice`` says which, ``auto_reason`` why);
- ``batched``: ``backend.type: batched``, only where ``auto`` chose hf: what the bound gave up.

Prints ONE JSON object: per size, the parameter count, the median wall time of the ES updates
(sum of the metrics rows' ``time/step``) and of the whole ``ESTrainer.train`` call for each, the
ratios old / auto (and old / batched), and whether every checkpoint of the runs is bit-identical (it
must be: ``auto`` only chooses a path that gives ``hf``'s checkpoints).

Usage: python benchmarks/backend_auto.py [--sizes 64x2,256x4,512x8] [--population 16] [--batch 16]
       [--steps 3] [--tokens 32] [--repeats 3]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import esreason  # before torch: the bounded OpenMP spin (esreason.openmp) must be set when torch loads
from esreason import ESConfig


def variety(completions, **kwargs):
    """Distinct characters of a completion: a random model's responses differ in it."""
    return [len(set(c)) / 10 for c in completions]


def make_model(root: Path, hidden: int, layers: int) -> tuple[Path, int]:
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from esreason.embedded import build_tokenizer

    path = root / f"qwen2-{hidden}x{layers}"
    tok = build_tokenizer()
    torch.manual_seed(0)
    heads = max(2, hidden // 32)
    model = Qwen2ForCausalLM(Qwen2Config(
        vocab_size=len(tok), hidden_size=hidden, intermediate_size=4 * hidden, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=max(1, heads // 2), max_position_embeddings=256,
        tie_word_embeddings=True, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id))
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path, sum(p.numel() for p in model.parameters())


def run(model: Path, out: Path, backend: str, a: argparse.Namespace) -> dict:
    from esreason import ESTrainer

    data = [{"prompt": f"<s>{i}+{i + 7}="} for i in range(a.batch * a.steps)]
    args = ESConfig(output_dir=str(out), task="bench-auto", population_size=a.population, batch_size=a.batch,
                    max_steps=a.steps, max_new_tokens=a.tokens, checkpoint_every=1, sigma=0.05, alpha=0.05,
                    backend=backend)
    t0 = time.perf_counter()
    ESTrainer(str(model), variety, data, args=args).train()
    total = time.perf_counter() - t0
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    chosen = json.loads((out / "backend.json").read_text())
    return {"steps_s": sum(r["time/step"] for r in rows), "run_s": total, "type": chosen["type"],
            "why": chosen.get("auto")}


def hashes(run_dir: Path) -> list[str]:
    return [hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(run_dir.glob("checkpoints/step_*/model.safetensors"))]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="64x2,256x4,512x8", help="hidden x layers of each Qwen2 model")
    ap.add_argument("--population", type=int, default=16)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    import torch

    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    out: dict = {"benchmark": "backend_auto", "esreason": esreason.__version__, "torch": torch.__version__,
                 "threads": torch.get_num_threads(), "machine": platform.machine(), "cpus": os.cpu_count(),
                 "settings": {"population": a.population, "batch": a.batch, "steps": a.steps, "tokens": a.tokens,
                              "repeats": a.repeats}, "sizes": {}}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for size in a.sizes.split(","):
            hidden, layers = (int(x) for x in size.split("x"))
            model, params = make_model(root, hidden, layers)
            from esreason.backends.hf import load_model
            from esreason.es_loop.select import choose_auto

            probe = ESConfig(population_size=a.population).to_run_config(model=str(model))
            will = choose_auto(probe, load_model(str(model), "float32", "cpu")[0])[0]
            backends = {"old": "hf", "auto": "auto", **({"batched": "batched"} if will == "hf" else {})}
            times: dict[str, list[dict]] = {name: [] for name in backends}
            identical = True
            for r in range(a.repeats):
                order = list(backends) if r % 2 == 0 else list(reversed(backends))
                dirs = {}
                for name in order:
                    dirs[name] = root / f"{size}-{name}-{r}"
                    times[name].append(run(model, dirs[name], backends[name], a))
                first = hashes(dirs["old"])
                identical &= len(first) == a.steps and all(hashes(d) == first for d in dirs.values())
            med = {name: {k: statistics.median(t[k] for t in ts) for k in ("steps_s", "run_s")}
                   for name, ts in times.items()}
            out["sizes"][size] = {
                "params": params, "old_choice": times["old"][0]["type"], "auto_choice": times["auto"][0]["type"],
                "auto_reason": times["auto"][0]["why"], **med,
                "steps_ratio_old_over_auto": med["old"]["steps_s"] / med["auto"]["steps_s"],
                "run_ratio_old_over_auto": med["old"]["run_s"] / med["auto"]["run_s"],
                **({"steps_ratio_old_over_batched": med["old"]["steps_s"] / med["batched"]["steps_s"]}
                   if "batched" in med else {}),
                "same_checkpoints": identical}
            print(f"{size}: {out['sizes'][size]}", file=sys.stderr)
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
