"""The sections of the GPU acceptance (benchmarks/gpu_acceptance.py) that are Python calls rather than
``esreason`` command lines. Each runs in a child process of the driver (``python
benchmarks/gpu_acceptance_local.py SECTION ARGS.json OUT.json``), so the driver can stop it at the
deadline and it holds no GPU memory once it has returned.

- ``setup`` (:func:`build_shape_model`, :func:`build_embedded_model`): a random-weight model with
  Qwen2.5-1.5B's shapes (hidden 1536, 28 layers, 12 heads, 2 KV heads, MLP 8960, vocabulary padded to
  151,936 as benchmarks/gpu_check.py does, tied embeddings, q/k/v biases), bf16, saved with the
  embedded character tokenizer as a local HF directory -- the model every 1.5B section is given; and
  the embedded default's pretrained weights (0.87M parameters) saved the same way, in bf16 so that ES
  keeps fp32 masters as it does at 1.5B. A random-weight model scores 0 on every demo-add problem, so
  its ES z-scores are all 0 and every update is skipped; the embedded weights score, so their updates
  move the weights and the resume check compares checkpoints that really changed.

  Both are ``llama`` directories, as the embedded default is (esreason.embedded.model says why): a
  ``qwen2`` ``config.json`` makes transformers 5.23 build a ``Qwen2Tokenizer`` over the character
  vocabulary (it corrects ``qwen2`` hub tokenizers), which drops spaces and newlines, so the GPU run
  would take a tokenizer path the CPU twin never takes. Llama with ``attention_bias`` has the same
  tensors as Qwen2 plus an o_proj bias (28 x 1,536 parameters) and runs the same kernels.
- ``sampler_vs_generate`` (benchmarks/gpu_acceptance_parity.py): greedy token ids of the sampler and
  of ``generate`` on padded prompts, with EOS stopping both and ignored by both, on the embedded
  weights; tokens per second side by side on the shape model.
- ``grpo_plan`` (:func:`grpo_plan_terms`): ``esreason.experiments.plan.build_plan`` (the public
  planner) of a one-method experiment whose GRPO config is the acceptance run's own, on one GPU of
  the type found (``memplan.gpu_type_of``): the ``train (grpo)`` stage's ``terms_s``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gpu_acceptance_parity as parity  # noqa: E402

QWEN_VOCAB = 151_936
#: Qwen2.5-1.5B's shapes (its config.json; benchmarks/gpu_memory.py SHAPES), and the CPU twin's tiny ones
SHAPE_1_5B = dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
                  num_key_value_heads=2)
TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)


def shape_config(tiny: bool, tok: Any) -> Any:
    """The shape model's ``LlamaConfig`` (Qwen2.5-1.5B's shapes, or TINY)."""
    from transformers import LlamaConfig

    return LlamaConfig(vocab_size=len(tok) if tiny else QWEN_VOCAB, tie_word_embeddings=True, attention_bias=True,
                       max_position_embeddings=4096, rms_norm_eps=1e-6,
                       rope_parameters={"rope_type": "default", "rope_theta": 1.0e6},
                       bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
                       **(TINY if tiny else SHAPE_1_5B))


def shape_model(tiny: bool, device: str, seed: int = 0) -> tuple[Any, Any]:
    """Random-init bf16 model of :func:`shape_config`, built on ``device``, with the embedded tokenizer."""
    from transformers import LlamaForCausalLM

    from esreason.embedded import build_tokenizer

    tok = build_tokenizer()
    config = shape_config(tiny, tok)
    torch.manual_seed(seed)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)  # init straight in bf16: no fp32 copy of 1.5B weights
    try:
        with torch.device(device):
            model = LlamaForCausalLM(config)
    finally:
        torch.set_default_dtype(previous)
    return model.eval(), tok


def build_shape_model(directory: Path, tiny: bool, device: str) -> dict[str, Any]:
    """Save the random-weight model (Qwen2.5-1.5B shapes, or TINY) with the embedded tokenizer."""
    model, tok = shape_model(tiny, device)
    model.save_pretrained(directory)
    tok.save_pretrained(directory)
    n = sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
    return {"path": str(directory), "weights": "random, bf16", "parameters": n, "model_type": model.config.model_type,
            "shapes": "tiny" if tiny else "qwen2.5-1.5b (vocabulary 151,936; llama with attention biases)"}


def build_embedded_model(directory: Path) -> dict[str, Any]:
    """The embedded default's pretrained weights, cast to bf16, saved as a local HF directory."""
    from esreason.backends.hf import load_model

    model, tok = load_model("demo")
    model = model.to(torch.bfloat16)
    model.save_pretrained(directory)
    tok.save_pretrained(directory)
    n = sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
    return {"path": str(directory), "weights": "embedded default (pretrained), bf16", "parameters": n}


def setup(work: Path, tiny: bool, device: str) -> dict[str, Any]:
    out: dict[str, Any] = {"embedded": build_embedded_model(work / "embedded")}
    if not tiny:
        out["shape"] = build_shape_model(work / "shape", False, device)
    return {**out, "ok": True}


def sampler_vs_generate(tiny: bool, device: str, shapes: list[tuple[int, int]], embedded_dir: str,
                        repeats: int = 2) -> dict[str, Any]:
    """Token ids (EOS stopping both, EOS ignored by both; every loop on the CPU, the cuda loop on a GPU)
    on the embedded weights, then tokens/s side by side on the shape model (or TINY)."""
    from esreason.backends.hf import load_model

    on_gpu = device.startswith("cuda")
    model, tok = load_model(embedded_dir, dtype="bfloat16" if on_gpu else "float32", device=device)
    prompts = parity.chat_prompts(tok, 16)
    ids = [parity.compare(model, tok, prompts, 64, eos=eos, loop=loop)
           for loop in (("cuda",) if on_gpu else ("cpu", "cuda")) for eos in (True, False)]
    del model
    model, tok = shape_model(tiny, device)
    speed = [parity.throughput(model, tok, parity.padded_prompts(tok, b), length, device, repeats)
             for b, length in shapes]
    del model
    need = parity.GPU_AGREEMENT if on_gpu else 1.0
    ok = (all(r["token_agreement"] >= need for r in ids + speed)
          and all(r["tokens_generated"] == [r["tokens_expected"]] * 2 for r in speed)
          and any(r["rows_ending_at_eos"] for r in ids if r["rows_ending_at_eos"] is not None))
    return {"parity": {"model": "embedded default (pretrained)", "dtype": "bfloat16" if on_gpu else "float32",
                       "agreement_required": need, "runs": ids},
            "speed": {"model": "tiny random" if tiny else "qwen2.5-1.5b shapes, random bf16 weights",
                      "generate_cache": "dynamic (its default)", "greedy": True, "shapes": speed},
            "ok": ok}


def grpo_plan_terms(model_dir: str, grpo_mapping: dict[str, Any], updates: int, gpu: str) -> dict[str, Any]:
    """The planner's ``train (grpo)`` stage for this GRPO config on one GPU of type ``gpu``."""
    from esreason.experiments.plan import build_plan
    from esreason.experiments.spec import parse_spec

    spec = parse_spec({"name": "gpu-acceptance", "model": model_dir, "task": grpo_mapping["task"],
                       "updates": updates, "methods": ["grpo"], "configs": {"grpo": grpo_mapping},
                       # the plan also prices an evaluation stage; only the training stage is read
                       "eval": {"in_domain": ["gsm8k"], "held_out": ["gsm8k"], "limit": 1}})
    plan = build_plan(spec, 1, gpu)
    stage = next(s for s in plan["stages"] if "grpo" in s["name"] and "eval" not in s["name"])
    return {"gpu_type": plan["gpu_type"], "plan_gpu": gpu, "stage": stage["name"], "parameters": plan["parameters"],
            "terms_s": stage["terms_s"], "wall_s": sum(stage["terms_s"].values()),
            "responses": stage["responses"], "tokens": stage["tokens"],
            "note": f"esreason.experiments.plan.build_plan, 1 x {gpu}, this run's GRPO config", "ok": True}


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        raise SystemExit("usage: gpu_acceptance_local.py SECTION ARGS.json OUT.json")
    section, a = argv[0], json.loads(Path(argv[1]).read_text())
    if section == "setup":
        out = setup(Path(a["work"]), a["tiny"], a["device"])
    elif section == "sampler_vs_generate":
        out = sampler_vs_generate(a["tiny"], a["device"], [tuple(s) for s in a["shapes"]], a["embedded"],
                                  a.get("repeats", 2))
    elif section == "grpo_plan":
        out = grpo_plan_terms(a["model"], a["mapping"], a["updates"], a["gpu"])
    else:
        raise SystemExit(f"gpu_acceptance_local.py: unknown section {section!r}")
    Path(argv[2]).write_text(json.dumps(out, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
