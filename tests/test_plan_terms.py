"""The plan's per-update terms count the work TRL and vLLM do.

Runs on the CPU from the shipped experiment files. The checks are on the model's structure
(what grows with what, which forwards are counted, which constants are the H100 measurements),
never on wall time.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from esreason.config import ConfigError
from esreason.experiments import plan_table as tab
from esreason.experiments import plan_terms
from esreason.experiments.lengths import LengthModel
from esreason.experiments.plan import _Ctx, build_plan
from esreason.experiments.spec import load_spec
from esreason.grpo.plan import trl_forwards

ROOT = Path(__file__).resolve().parents[1]
EASY = ROOT / "configs" / "experiments" / "easy.yaml"


@pytest.fixture(scope="module")
def easy():
    return load_spec(EASY)


def _grpo(spec, **grpo):
    cfg = spec.grpo
    return dataclasses.replace(spec, grpo=dataclasses.replace(cfg, grpo=dataclasses.replace(cfg.grpo, **grpo)))


def _stage(spec, name, gpus=8):
    return next(s for s in build_plan(spec, gpus)["stages"] if s["name"] == name)


def test_easy_grpo_train_term_is_at_least_4_s_per_update(easy):
    """The padded-token model at the H100 measurement: 64 rows of prompt + the longest of 512
    completions, 6 forward-equivalents (train 3, recompute, old log-probs, reference)."""
    train = _stage(easy, "train/grpo")["terms_s"]["train"] / easy.updates
    assert train >= 4.0
    assert trl_forwards(easy.grpo, 8) == {"train": 3, "recompute": 1, "old_logps": 1, "reference": 1}


def test_grpo_train_grows_with_the_longest_completion_and_the_prompt(easy, monkeypatch):
    base = _stage(easy, "train/grpo")["terms_s"]["train"]
    shorter_cap = dataclasses.replace(easy, grpo=dataclasses.replace(
        easy.grpo, generation=dataclasses.replace(easy.grpo.generation, max_new_tokens=512)))
    assert _stage(shorter_cap, "train/grpo")["terms_s"]["train"] < base  # the longest completion is capped lower
    no_runaways = dataclasses.replace(easy, plan=dataclasses.replace(easy.plan, runaway_share=0.0))
    assert _stage(no_runaways, "train/grpo")["terms_s"]["train"] < base  # a shorter longest at the same cap
    monkeypatch.setitem(tab.PROMPT_TOKENS, "gsm8k", tab.Assumption("prompt_tokens.gsm8k", 600, "tokens", "test"))
    assert _stage(easy, "train/grpo")["terms_s"]["train"] > base
    # the pure term: linear in prompt + longest
    assert plan_terms.grpo_train_s(64, 100, 1000, 6, 1e-5) == pytest.approx(64 * 1100 * 6e-5, rel=1e-12)
    assert plan_terms.grpo_train_s(64, 100, 2000, 6, 1e-5) > plan_terms.grpo_train_s(64, 100, 1000, 6, 1e-5)


@pytest.mark.parametrize("grpo, old, ref", [
    ({}, 1, 1),                                        # Easy: 2 optimizer steps per update, beta 0.001
    ({"beta": 0.0}, 1, 0),
    ({"mini_batch_size": None}, 0, 1),                 # one optimizer step per update: no old forward
    ({"mini_batch_size": None, "beta": 0.0}, 0, 0),
])
def test_forwards_are_counted_exactly_when_trl_runs_them(easy, grpo, old, ref):
    """trl_forwards against TRL 1.16's own condition (GRPOTrainer._generate_and_score_completions)
    evaluated on the arguments esreason passes TRL (build_trl_args), and the train term's ratio."""
    from esreason.grpo.plan import plan_batches
    from esreason.grpo.trainer import build_trl_args

    spec = _grpo(easy, **grpo)
    cfg = spec.grpo
    args = build_trl_args(cfg, plan_batches(cfg, 7473, 8), "/tmp/unused")
    trl_old = (args["gradient_accumulation_steps"] % (args["steps_per_generation"] * args["num_iterations"]) != 0
               or (args["use_vllm"] and args["vllm_importance_sampling_correction"]))
    forwards = trl_forwards(cfg, 8)
    assert forwards["old_logps"] == int(trl_old) == old
    assert forwards["reference"] == int(args["beta"] != 0.0) == ref
    base = _stage(easy, "train/grpo")["terms_s"]["train"]
    assert _stage(spec, "train/grpo")["terms_s"]["train"] == pytest.approx(base * (4 + old + ref) / 6, rel=1e-3)
    no_ckpt = _grpo(spec, gradient_checkpointing=False)
    assert trl_forwards(no_ckpt.grpo, 8)["recompute"] == 0


def test_rollout_waits_for_the_longest_of_all_8_processes_and_pays_sleep_and_reload(easy):
    ctx = _Ctx(easy, 8, "h100")
    terms = _stage(easy, "train/grpo")["terms_s"]
    prompt = tab.prompt_tokens("gsm8k").value
    every = plan_terms.call_s(ctx, 64, prompt, 2048, 512, False)  # 64 rows per process, longest of 8 x 64
    own = plan_terms.call_s(ctx, 64, prompt, 2048, 64, False)     # if a process waited only for its own
    assert (terms["decode"] + terms["tail"]) / easy.updates == pytest.approx(sum(every), rel=1e-3)
    assert sum(every) > sum(own)
    awake = _grpo(easy, vllm_sleep=False)
    wake = _stage(awake, "train/grpo")["terms_s"]["reload"]
    sleep = tab.CONSTANTS["vllm_sleep_wake_s"].value
    assert terms["reload"] == pytest.approx(wake + easy.updates * sleep, abs=0.1)
    assert wake > 0  # the weight push happens before every rollout, asleep or not


def test_decode_step_reads_the_kv_cache_and_the_cap_share_lengthens_the_tail(easy):
    ctx = _Ctx(easy, 8, "h100")
    # above the host floor a longer context costs more per step: the KV cache is read every step
    assert plan_terms.step_s(ctx, 64, 4000, False) > plan_terms.step_s(ctx, 64, 2000, False) \
        > ctx.const("decode_step_floor_s")
    assert plan_terms.step_s(ctx, 64, 1000, True) > plan_terms.step_s(ctx, 64, 1000, False)  # seeded rows
    short, long = plan_terms.call_s(ctx, 64, 150, 2048, 64, False), plan_terms.call_s(ctx, 64, 3000, 2048, 64, False)
    assert sum(long) > sum(short)
    es = _stage(easy, "train/es")["terms_s"]
    none = _stage(dataclasses.replace(easy, plan=dataclasses.replace(easy.plan, runaway_share=0.0)), "train/es")
    assert es["tail"] > none["terms_s"]["tail"]  # runaways at the 2,048-token cap


def test_length_model_matches_a_simulation_with_mass_at_the_cap():
    """LengthModel's mean and expected longest against 20,000 simulated batches (seeded; 2 % is the
    Monte Carlo error of the longest's mean plus the integrals' discretisation)."""
    rng = np.random.default_rng(0)
    for mean, cv, r, n, cap in ((250, 0.6, 0.01, 64, 2048), (250, 0.6, 0.05, 8, 1024), (4000, 0.5, 0.1, 64, 8192)):
        s2 = np.log(1 + cv * cv)
        draws = rng.lognormal(np.log(mean) - s2 / 2, np.sqrt(s2), size=(20_000, n))
        draws[rng.random((20_000, n)) < r] = cap
        draws = np.minimum(draws, cap)
        model = LengthModel(mean, cv, r)
        assert model.longest(n, cap) == pytest.approx(draws.max(axis=1).mean(), rel=0.02), (mean, r, n)
        assert model.mean(cap) == pytest.approx(draws.mean(), rel=0.02), (mean, r, n)
    assert LengthModel(250, 0.6, 0.01).longest(512, 2048) > 0.95 * 2048  # 512 draws: almost surely a runaway
    assert tab.expected_longest(250, 0.6, 64, 2048) < tab.expected_longest(250, 0.6, 64, 2048, runaway=0.01)


def test_runaway_share_key_is_validated(tmp_path):
    assert load_spec(EASY, ["plan.runaway_share=0.05"]).plan.runaway_share == 0.05
    with pytest.raises(ConfigError, match="plan.runaway_share"):
        load_spec(EASY, ["plan.runaway_share=1.5"])


def test_checksum_rate_is_per_core():
    class Ctx:
        def over(self, name):
            return tab.OVERHEADS[name].value

    from esreason.backends.engine import CHECKSUM_THREADS

    assert plan_terms.CHECKSUM_THREADS == CHECKSUM_THREADS
    per_core = tab.OVERHEADS["hash_bytes_per_s_per_core"].value
    assert plan_terms.checksum_rate(Ctx(), 8) == pytest.approx(per_core * CHECKSUM_THREADS)  # 14 cores each
    assert plan_terms.checksum_rate(Ctx(), 56) == pytest.approx(per_core * 2)  # 2 cores each


def test_h100_measurements_are_labelled(easy):
    labels = {a["key"]: a["label"] for a in build_plan(easy, 8)["assumptions"]}
    for key in ("grpo_forward_token_us", "es_member_s", "es_update_s"):
        assert labels[key] == tab.MEASURED_H100, key
    for work in ("hf", "hf_generate"):  # HF decode (gen_cmp.txt)
        assert tab.throughput("h100", "1.5b", work).label == tab.MEASURED_H100
        assert tab.throughput("h100", "7b", work).label == "estimate"
    assert labels["decode_step_floor_s"] == labels["runaway_share.instruct"] == "estimate"
    assert labels["gpu.h100"] == "given"
    # the measured micro-step: 0.305 s over 2 x 2,432 padded tokens for 5 forward-equivalents
    assert tab.CONSTANTS["grpo_forward_token_us"].value == pytest.approx(0.30505 / 4864 / 5 * 1e6, abs=0.01)
