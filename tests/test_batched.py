"""backend.type=batched: same texts, rewards and checkpoints as the sequential reference."""

from __future__ import annotations

import json

import pytest
import torch

from esreason import tasks, verifiers
from esreason.backends.base import SamplingParams
from esreason.backends.batched import BatchedEvaluator
from esreason.backends.hf import HFPolicy, load_model
from esreason.backends.popmodel import PopulationModel, check_supported
from esreason.backends.sampling import Sampler
from esreason.es_loop.select import build_evaluator
from esreason.config import load_config
from esreason.errors import UserError
from esreason.es_loop.evaluate import evaluate_population
from esreason.es.population import draw_population
from esreason.es_loop.run import run_es
from esreason.io.hashing import hash_directory_safetensors

pytestmark = pytest.mark.heavy  # the fast subset (`--fast`) leaves this file out: tests/conftest.py


@pytest.fixture(scope="module")
def demo():
    model, tok = load_model("demo")
    problems = tasks.get("demo-add").load("train", limit=8)
    prompts = [tasks.render_prompt(tok, p.messages) for p in problems]
    return model, tok, prompts, [p.gold for p in problems]


def sequential(policy, sampler, seeds, sigmas, prompts, params):
    out = []
    for seed, sigma, prm in zip(seeds, sigmas, params):
        policy.perturb(seed, sigma)
        try:
            out.append(sampler.generate(prompts, prm))
        finally:
            policy.restore()
    return out


def assert_same(policy, sampler, seeds, sigmas, prompts, params, population_batch=0):
    ev = BatchedEvaluator(policy, sampler, population_batch=population_batch)
    got = ev.generate_population(seeds, sigmas, prompts, params)
    ref = sequential(policy, sampler, seeds, sigmas, prompts, params)
    for i, (g, r) in enumerate(zip(got, ref)):
        assert g.token_ids == r.token_ids, f"member {i}"
        assert g.texts == r.texts, f"member {i}"
    return ev


@pytest.mark.parametrize("n,b", [(4, 4), (8, 8), (6, 5)])
def test_greedy_texts_identical_to_sequential(demo, n, b):
    model, tok, prompts, _ = demo
    policy = HFPolicy(model, tok)
    sampler = Sampler(model, tok, batch_size=64)
    seeds = [1000 + 7 * i for i in range(n)]
    sigmas = [0.02 * (1 if i % 2 else -1) for i in range(n)]  # large sigma: members differ
    params = [SamplingParams(max_new_tokens=40)] * n
    ev = assert_same(policy, sampler, seeds, sigmas, prompts[:b], params)
    assert ev.stats.small_block_forwards > 0  # the exact-row-count path was exercised


def test_sampling_chunks_and_groups_identical(demo):
    """temperature > 0 with top-p, per-member seeds, prompts in chunks of 3, members in groups of 3."""
    model, tok, prompts, _ = demo
    policy = HFPolicy(model, tok)
    sampler = Sampler(model, tok, batch_size=3)
    seeds = [5, 5, 9, 9, 13]
    sigmas = [0.01, -0.01, 0.01, -0.01, 0.03]
    params = [SamplingParams(max_new_tokens=32, temperature=0.9, top_p=0.9, seed=s) for s in (1, 1, 2, 3, 4)]
    assert_same(policy, sampler, seeds, sigmas, prompts[:7], params, population_batch=3)


def test_qwen2_gqa_model_identical(tmp_path):
    """A Qwen2 (q/k/v biases) with grouped-query attention, random weights: long responses."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from esreason.embedded import build_tokenizer

    tok = build_tokenizer()
    torch.manual_seed(1)
    model = Qwen2ForCausalLM(Qwen2Config(
        vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, tie_word_embeddings=True,
        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id))
    model.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    model, tok = load_model(str(tmp_path))
    assert model.config.model_type == "qwen2"
    policy = HFPolicy(model, tok)
    sampler = Sampler(model, tok, batch_size=8)
    prompts = ["<s>1+2=", "<s>12*3=", "<s>7", "<s>100-99=", "<s>5+5"]
    params = [SamplingParams(max_new_tokens=70, temperature=1.0, seed=3)] * 4  # hits the context limit
    assert_same(policy, sampler, [1, 1, 2, 3], [0.05, -0.05, 0.05, 0.05], prompts, params)


def test_two_point_rewards_identical_to_evaluate_population(demo):
    model, tok, prompts, golds = demo
    policy = HFPolicy(model, tok)
    sampler = Sampler(model, tok, batch_size=64)
    pop = draw_population(0, 3, 6, "two_point")
    assert pop.signs == (1, -1) * 3
    scorer = verifiers.get(tasks.get("demo-add").verifier)
    params = [SamplingParams(max_new_tokens=48)] * len(pop)
    ref = evaluate_population(policy, sampler, pop, 0.01, prompts[:6], golds[:6], scorer, params)
    got = BatchedEvaluator(policy, sampler).evaluate(pop, 0.01, prompts[:6], golds[:6], scorer, params)
    assert (got.rewards == ref.rewards).all()
    assert (got.correct == ref.correct).all() and (got.formatted == ref.formatted).all()
    assert got.tokens == ref.tokens
    assert len(set(ref.member_rewards.tolist())) > 1  # members really differ


def test_stacked_weights_equal_perturbed_model(demo):
    model, tok, _, _ = demo
    policy = HFPolicy(model, tok)
    pm = PopulationModel(model)
    stacked = pm.stack_members(policy, [3, 3, 8], [0.01, -0.01, 0.5])
    for i, (seed, sigma) in enumerate([(3, 0.01), (3, -0.01), (8, 0.5)]):
        policy.perturb(seed, sigma)
        try:
            for name, p in pm.params:
                assert torch.equal(stacked[name][i], p.detach()), name
        finally:
            policy.restore()
    # tied embedding / LM head: one stacked tensor serves both
    assert pm.embed == pm.lm_head


def _run_cfg(backend, *extra):
    return load_config(None, [
        "model=demo", "task=demo-add", "train.limit=16", "train.batch_size=5", "train.max_steps=2",
        "es.population_size=6", "es.estimator=two_point", "es.sigma=0.01", "es.alpha=0.005",
        "generation.max_new_tokens=40", "checkpoint.every=0", f"backend.type={backend}", *extra])


def test_es_run_batched_checkpoint_bit_identical_to_hf(tmp_path):
    a = run_es(_run_cfg("hf"), tmp_path / "hf", progress=False)
    b = run_es(_run_cfg("batched", "backend.population_batch=4"), tmp_path / "batched", progress=False)
    ma = [json.loads(x) for x in (tmp_path / "hf" / "metrics.jsonl").read_text().splitlines()]
    mb = [json.loads(x) for x in (tmp_path / "batched" / "metrics.jsonl").read_text().splitlines()]
    for key in ("reward/mean", "reward/std", "accuracy/mean", "update_norm", "tokens", "length/responses",
                "length/member_at_cap"):
        assert [m[key] for m in ma] == [m[key] for m in mb], key
    # every response's length recorded, per member (N = 6 x B = 5), summing to the update's tokens;
    # at a 40-token cap some of the demo's ~30-45-token answers run to it
    assert all(len(m["length/responses"]) == 6 and {len(r) for r in m["length/responses"]} == {5} for m in mb)
    assert all(sum(map(sum, m["length/responses"])) == m["tokens"] for m in mb)
    assert any(m["length/at_cap"] > 0 for m in mb)
    # At least one update moved the weights, so equal checkpoints mean something. (Not every step: with
    # 5 prompts all three antithetic pairs can tie, a zero update; seen at step 2 under ATen's scalar
    # kernels, ATEN_CPU_CAPABILITY=default, on both backends alike.)
    assert any(m["update_norm"] > 0 for m in ma)
    assert hash_directory_safetensors(a.final_checkpoint) == hash_directory_safetensors(b.final_checkpoint)


def test_bad_config_names_the_key(demo):
    model, tok, _, _ = demo
    policy = HFPolicy(model, tok)
    sampler = Sampler(model, tok)
    with pytest.raises(UserError, match="'dtype'"):
        build_evaluator(_run_cfg("batched", "dtype=bfloat16"), policy, sampler, tok)
    with pytest.raises(UserError, match="'backend.population_batch'"):
        build_evaluator(_run_cfg("batched", "backend.population_batch=7"), policy, sampler, tok)
    with pytest.raises(UserError, match="'backend.type'"):
        build_evaluator(_run_cfg("batched"), policy, object(), tok)
    from transformers import GPT2Config, GPT2LMHeadModel

    gpt2 = GPT2LMHeadModel(GPT2Config(n_embd=16, n_layer=1, n_head=2, vocab_size=50, n_positions=32))
    with pytest.raises(UserError, match="'model'.*gpt2"):
        check_supported(gpt2)
    with pytest.raises(UserError, match="'model'"):
        BatchedEvaluator(HFPolicy(gpt2, tok), sampler)
    with pytest.raises(UserError, match="only the seed"):
        BatchedEvaluator(policy, sampler).generate_population(
            [1, 2], [0.1, 0.1], ["<s>1+1="], [SamplingParams(max_new_tokens=4),
                                               SamplingParams(max_new_tokens=5)])
    ev = build_evaluator(_run_cfg("batched"), policy, sampler, tok)
    assert isinstance(ev, BatchedEvaluator)
    empty = ev.generate_population([1], [0.1], ["<s>1+1="], [SamplingParams(max_new_tokens=0)])
    assert empty[0].texts == [""]
