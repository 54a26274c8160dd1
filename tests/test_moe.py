"""Mixture-of-experts models under ES (HF backend) and their checkpoint layout.

A small randomly initialised Qwen3-MoE (and Qwen2-MoE, with a shared expert) built here: ES runs
through the HF backend with exact restore; transformers holds each layer's experts stacked
(``mlp.experts.gate_up_proj`` [E, 2I, H], ``mlp.experts.down_proj`` [E, H, I]) and ES draws one
direction per stacked tensor, while checkpoints store one tensor per expert
(:mod:`esreason.backends.ckpt_layout` maps the two; the vLLM side is tests/test_tp_worker.py and
tests/test_vllm_tp.py).
"""

from __future__ import annotations

import pytest
import torch

from esreason.backends.ckpt_layout import es_tensors, read_region
from esreason.es.noise import direction
from esreason.es.region import Region


def _moe(path, kind: str = "qwen3_moe"):
    from transformers import Qwen2MoeConfig, Qwen2MoeForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM

    from esreason.embedded import build_tokenizer

    tok = build_tokenizer()
    common = dict(vocab_size=len(tok), hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=16, max_position_embeddings=256, bos_token_id=tok.bos_token_id,
                  eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, tie_word_embeddings=False)
    if kind == "qwen3_moe":
        cfg, cls = Qwen3MoeConfig(intermediate_size=128, moe_intermediate_size=32, num_experts=4,
                                  num_experts_per_tok=2, decoder_sparse_step=1, **common), Qwen3MoeForCausalLM
    else:
        cfg, cls = Qwen2MoeConfig(intermediate_size=128, moe_intermediate_size=32, shared_expert_intermediate_size=64,
                                  num_experts=4, num_experts_per_tok=2, decoder_sparse_step=1, **common), \
            Qwen2MoeForCausalLM
    torch.manual_seed(0)
    cls(cfg).save_pretrained(path)
    tok.save_pretrained(path)
    return path


@pytest.mark.parametrize("kind", ["qwen3_moe", "qwen2_moe"])
def test_hf_policy_perturbs_stacked_experts_and_restores_exactly(kind, tmp_path):
    from esreason.backends.hf import HFPolicy, load_model

    policy = HFPolicy(*load_model(str(_moe(tmp_path / "m", kind)), "bfloat16"))  # fp32 masters
    params = dict(policy.params.params)
    stacked = [n for n in params if n.endswith("mlp.experts.gate_up_proj")]
    assert len(stacked) == 2 and params[stacked[0]].shape == (4, 64, 64)  # [E, 2I, H]
    centre = {n: p.detach().clone() for n, p in params.items()}
    masters = policy.params.master_state()
    for seed in (3, 11):
        policy.perturb(seed, 0.05)
        name = stacked[1]  # the direction of the stacked tensor, drawn once for all its experts
        # round(master + sigma * eps) with the ES core's arithmetic (torch.add with alpha, es/apply.py)
        want = torch.add(masters[name], direction(seed, name, masters[name].shape), alpha=0.05).to(torch.bfloat16)
        assert torch.equal(params[name], want)
        policy.restore()
        assert all(torch.equal(params[n], centre[n]) for n in params)  # bit-exact, experts included
    norm = policy.apply_update([1, 2, 3], [0.5, -1.0, 0.25], 0.01)
    assert norm > 0 and not torch.equal(params[stacked[0]], centre[stacked[0]])
    policy.save(tmp_path / "ckpt")
    again = HFPolicy(*load_model(str(tmp_path / "ckpt"), "bfloat16"))
    assert again.load_masters(tmp_path / "ckpt")  # masters by the stacked names
    assert all(torch.equal(p, params[n]) for n, p in again.params.params)


def test_checkpoint_experts_map_onto_the_stacked_tensors(tmp_path):
    from safetensors import safe_open
    from safetensors.torch import load_file

    from esreason.backends.hf import load_model

    path = _moe(tmp_path / "m")
    model, _ = load_model(str(path))
    params = dict(model.named_parameters())
    with safe_open(str(path / "model.safetensors"), framework="pt") as f:
        shapes = {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}
    assert any(".experts.3.up_proj.weight" in k for k in shapes)  # save_pretrained writes one tensor per expert
    tensors = es_tensors(shapes)
    assert {n: t.shape for n, t in tensors.items()} == {n: tuple(p.shape) for n, p in params.items()}
    for name, t in tensors.items():  # read whole, and read one expert's band of rows / columns
        assert torch.equal(read_region(path / "model.safetensors", t, None).view(t.shape), params[name])
        if name.endswith("experts.gate_up_proj"):
            region = Region(t.numel, 64, (32 + 8, 32 + 24), (0, 64), offset=2 * 64 * 64)  # expert 2, up rows 8..24
            assert torch.equal(read_region(path / "model.safetensors", t, region), params[name][2, 40:56].reshape(-1))
        if name.endswith("experts.down_proj"):
            region = Region(t.numel, 32, (0, 64), (16, 32), offset=64 * 32)  # expert 1, columns 16..32
            assert torch.equal(read_region(path / "model.safetensors", t, region), params[name][1, :, 16:].reshape(-1))
    broken = {k: v for k, v in shapes.items() if ".experts.3.up_proj" not in k}
    with pytest.raises(ValueError, match="incomplete"):
        es_tensors(broken)
    assert load_file(str(path / "model.safetensors"))  # a plain HF checkpoint


def test_es_runs_on_a_moe_model_through_the_hf_backend(tmp_path, monkeypatch):
    """Two ES updates on the MoE model (backend hf, the CLI's run_es; its members restored by the exact
    copy tested above): the experts and the router move, the checkpoint loads with plain transformers. A random model never answers a demo problem, so the reward here is the share of
    digits in the response (members then differ and the update is not zero)."""
    from esreason import verifiers
    from esreason.backends.hf import load_model
    from esreason.config import load_config
    from esreason.es_loop.run import run_es
    from esreason.verifiers.base import Verdict

    def digits(text: str, gold) -> Verdict:
        share = sum(c.isdigit() for c in text) / max(1, len(text))
        return Verdict(reward=share, correct=False, extracted=None, reason="digit share", formatted=False)

    monkeypatch.setattr(verifiers, "get", lambda name, **kw: digits)
    path = _moe(tmp_path / "m")
    start, _ = load_model(str(path))
    cfg = load_config(None, [f"model={path}", "task=demo-add", "es.population_size=4", "es.sigma=0.05",
                             "es.alpha=0.05", "train.batch_size=2", "train.limit=4", "train.max_steps=2",
                             "generation.max_new_tokens=8", "generation.temperature=0", "checkpoint.every=2"])
    result = run_es(cfg, tmp_path / "run", progress=False)
    assert result.steps == 2
    tuned, _ = load_model(str(tmp_path / "run" / "checkpoints" / "step_2"))
    before, after = dict(start.named_parameters()), dict(tuned.named_parameters())
    moved = [n for n in before if not torch.equal(before[n], after[n])]
    assert any(n.endswith("experts.gate_up_proj") for n in moved) and any(n.endswith("mlp.gate.weight") for n in moved)


@pytest.mark.parametrize("rank,size,band", [(1, 2, (32, 32)), (0, 2, (0, 32)), (0, 1, (0, 32))])
def test_a_padded_expert_intermediate_size_is_refused_as_not_fitting(rank, size, band):
    """vLLM's CPU MoE kernel pads each rank's intermediate size to a multiple of 32: an expert layer with
    I = 16 (8 per rank at TP = 2) holds 32 rows of gate, of up and 32 columns of down per rank. ES cannot move
    padding rows (they have no HF counterpart), so the layout refuses with its "do not fit" message, naming the
    sizes -- not with an out-of-bounds region of a tensor that was never going to fit."""
    from esreason.backends.vllm_layout import ShardSpec, plan_slots

    experts, inter, hidden = 4, 16, 64
    hf = {"m.layers.0.mlp.experts.gate_up_proj": (experts, 2 * inter, hidden),
          "m.layers.0.mlp.experts.down_proj": (experts, hidden, inter)}
    vllm = {"m.layers.0.mlp.experts.w13_weight": (experts, 2 * band[1], hidden),
            "m.layers.0.mlp.experts.w2_weight": (experts, hidden, band[1])}
    spec = {"m.layers.0.mlp.experts": ShardSpec("experts", rank, size, band=band)}
    with pytest.raises(ValueError, match=r"do not fit .*intermediate size 32 per rank x 2|do not fit .*intermediate "
                                         r"size 32 per rank x 1") as err:
        plan_slots(hf, vllm, spec)
    assert "16" in str(err.value) and "padded" in str(err.value)
    # the unpadded split of I = 64 over the same ranks fits
    hf = {n: (s[0], s[1] * 4, s[2]) if n.endswith("gate_up_proj") else (s[0], s[1], s[2] * 4) for n, s in hf.items()}
    vllm = {"m.layers.0.mlp.experts.w13_weight": (experts, 2 * 64 // size, hidden),
            "m.layers.0.mlp.experts.w2_weight": (experts, hidden, 64 // size)}
    spec = {"m.layers.0.mlp.experts": ShardSpec("experts", rank if size > 1 else 0, size,
                                                 band=((rank if size > 1 else 0) * 64 // size, 64 // size))}
    assert len(plan_slots(hf, vllm, spec)) == (3 * experts if size > 1 else 2)
