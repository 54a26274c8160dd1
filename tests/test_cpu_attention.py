"""The CPU attention implementation (esreason.backends.cpu_attention).

Decode steps (one query per row) compute transformers' eager attention; every other forward is
sdpa. Bit-identity with eager is asserted on this machine only (both paths run here, with the
same kernels, so exactness is a fair demand there); nothing is compared with stored floats.
"""

from __future__ import annotations

import copy
import json

import pytest
import torch

from esreason.backends import cpu_attention
from esreason.backends.hf import load_model
from esreason.embedded import TinyArch, build_model, build_tokenizer


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer()


def _padded_batch(tok, model):
    prompts = ["1+2=", "What is 12 + 345? Think.", "9"]
    enc = tok(prompts, add_special_tokens=False, padding=True, return_tensors="pt")
    mask = enc["attention_mask"]
    pos = (mask.long().cumsum(-1) - 1).clamp(min=0)
    return enc["input_ids"], mask, pos


def _prefill_then_step(model, impl, ids, mask, pos, prefill="sdpa"):
    """Prefill with ``prefill``, then one decode step with ``impl``; returns the step's logits [B, V]."""
    from transformers.cache_utils import DynamicCache

    model.set_attn_implementation(prefill)
    cache = DynamicCache(config=model.config)
    with torch.inference_mode():
        out = model(input_ids=ids, attention_mask=mask, position_ids=pos, past_key_values=cache, use_cache=True)
        nxt = out.logits[:, -1].argmax(-1, keepdim=True)  # [B, 1]
        model.set_attn_implementation(impl)
        step_mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
        step = model(input_ids=nxt, attention_mask=step_mask, position_ids=pos[:, -1:] + 1,
                     past_key_values=cache, use_cache=True)
    return step.logits[:, -1]


@pytest.mark.parametrize("kv_heads", [4, 2])  # plain and grouped-query attention
def test_a_decode_step_is_eager_attention_bit_for_bit(tok, kv_heads):
    cpu_attention.register()
    model = build_model(tok, TinyArch(kv_heads=kv_heads), seed=3)
    ids, mask, pos = _padded_batch(tok, model)
    assert (mask == 0).any(), "the batch must be left-padded so the mask matters"
    eager = _prefill_then_step(copy.deepcopy(model), "eager", ids, mask, pos)
    ours = _prefill_then_step(copy.deepcopy(model), cpu_attention.NAME, ids, mask, pos)
    sdpa = _prefill_then_step(copy.deepcopy(model), "sdpa", ids, mask, pos)
    assert torch.equal(ours, eager)
    # sdpa is another summation order: equal up to float32 rounding, not necessarily in every bit
    torch.testing.assert_close(ours, sdpa, rtol=1e-5, atol=1e-5)


def test_prefill_and_training_forwards_go_to_sdpa_decode_steps_do_not(tok, monkeypatch):
    import transformers.integrations.sdpa_attention as sdpa_module

    cpu_attention.register()
    calls = []
    real = sdpa_module.sdpa_attention_forward

    def spy(module, query, *args, **kwargs):
        calls.append(query.shape[-2])
        return real(module, query, *args, **kwargs)

    monkeypatch.setattr(sdpa_module, "sdpa_attention_forward", spy)
    model = build_model(tok, seed=1)
    model.set_attn_implementation(cpu_attention.NAME)
    ids, mask, pos = _padded_batch(tok, model)
    model.train()
    loss = model(input_ids=ids, attention_mask=mask, position_ids=pos, labels=ids).loss
    loss.backward()  # the training forward (several query positions) differentiates through sdpa
    assert calls and all(q == ids.shape[1] for q in calls)
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)
    calls.clear()
    model.eval()
    _prefill_then_step(model, cpu_attention.NAME, ids, mask, pos, prefill=cpu_attention.NAME)  # prefill + 1 step
    assert calls == [ids.shape[1]] * model.config.num_hidden_layers  # the step itself never reached sdpa


def test_load_model_picks_it_on_the_cpu_only(tmp_path):
    model, _ = load_model("demo")
    assert model.config._attn_implementation == cpu_attention.NAME
    # A model that will run on a GPU keeps sdpa even when it is loaded on the CPU (GRPO under accelerate).
    gpu_bound, _ = load_model("demo", run_device="cuda:0")
    assert gpu_bound.config._attn_implementation == "sdpa"
    assert cpu_attention.attention_for("cuda") is None
    assert cpu_attention.attention_for("cpu") == cpu_attention.NAME
    # The name is not written into a checkpoint: it loads anywhere, registered or not.
    model.save_pretrained(tmp_path)
    assert cpu_attention.NAME not in (tmp_path / "config.json").read_text()
    assert "attn_implementation" not in json.loads((tmp_path / "config.json").read_text())


def test_a_callers_own_choice_is_kept(tok):
    model = build_model(tok, seed=0)
    model.set_attn_implementation("eager")
    cpu_attention.use_on(model, "cpu")
    assert model.config._attn_implementation == cpu_attention.NAME  # eager -> the same math, sdpa prefill
    model.config._attn_implementation = "flex_attention"  # a choice we do not know: left alone
    cpu_attention.use_on(model, "cpu")
    assert model.config._attn_implementation == "flex_attention"
