"""FLOP accounting (paper appendix "ES-GRPO FLOP Matching")."""

from __future__ import annotations

import pytest

import json
from pathlib import Path

from esreason.accounting.flops import compare, es_flops, estimate, grpo_flops

ROOT = Path(__file__).resolve().parent.parent


def test_paper_matching_holds_at_n_32_g_8():
    T, B, P, L = 234, 64, 1_543_714_304, 2048
    assert es_flops(T, 32, B, P, L) == grpo_flops(T, B, 8, P, L)
    assert es_flops(T, 16, B, P, L) == grpo_flops(T, B, 8, P, L) / 2


def test_easy_es_config_estimate_uses_the_gsm8k_schedule():
    est = estimate(ROOT / "configs/easy/es-qwen2.5-1.5b.yaml", length=512)
    assert (est.method, est.updates, est.prompts, est.samples) == ("es", 232, 64, 32)  # max_steps = GRPO's T
    assert est.flops == 2 * 232 * 32 * 64 * est.params * 512
    assert est.rollouts == 232 * 32 * 64 and est.as_dict()["rollouts"] == est.rollouts  # responses beside FLOPs
    assert compare([est])["matched"] is False  # a single config is never "matched"


def test_demo_config_counts_parameters_of_the_embedded_default():
    est = estimate(ROOT / "configs/demo/es.yaml")
    assert est.params == 867_968 and est.updates == 30 and est.length == 64


def test_cli_json(capsys):
    from esreason.cli import main  # in this process: a subprocess cost 6 s of start-up for a 0.1 s command

    assert main(["flops", "--config", str(ROOT / "configs/demo/es.yaml"), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)  # stdout is the JSON alone
    assert out["configs"][0]["method"] == "es" and "matched" in out


def test_grpo_and_es_paper_configs_per_update_flops_match():
    es = estimate(ROOT / "configs/easy/es-qwen2.5-1.5b.yaml", length=512)
    grpo = estimate(ROOT / "configs/easy/grpo-qwen2.5-1.5b.yaml", length=512)
    assert grpo.method == "grpo" and (grpo.prompts, grpo.samples) == (64, 8)
    # N = 32 = 4G, D = B and T equal (both configs stop at GRPO's 2 * floor(7473/64) = 232 updates)
    assert es.updates == grpo.updates == 2 * (7473 // 64)
    assert compare([es, grpo])["matched"] is True
    # ...by the paper's formula; as spent, the Easy GRPO config runs 7 forward-equivalents per generated token
    # (sampling, loss forward, backward 2, checkpoint recompute, old policy, reference) against ES's 1
    assert (es.forward_equivalents, grpo.forward_equivalents) == (1, 7)
    assert grpo.flops_spent == pytest.approx(7 / 4 * es.flops_spent) and compare([es, grpo])["spent_matched"] is False
    hard = [estimate(ROOT / f"configs/hard/{m}-deepseek-r1-distill-qwen-1.5b.yaml", length=8192) for m in ("es", "grpo")]
    assert compare(hard)["matched"] is True
    other_g = estimate(ROOT / "configs/easy/grpo-qwen2.5-1.5b.yaml", length=512)
    assert compare([es, other_g])["matched"] and not compare([es, estimate(ROOT / "configs/demo/es.yaml")])["matched"]
