"""Coverage diagnostics (paper Lemmas 1-3, Proposition 1): statistics, the measurement pass, commands."""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from esreason.analysis.coverage.divergence import policy_js
from esreason.cli import main
from esreason.config import load_config
from esreason.errors import UserError
from esreason.es_loop import coverage as cv
from esreason.es_loop.run import run_es
from esreason.io.hashing import hash_directory_safetensors

# --------------------------------------------------------------------------- statistics


def test_identical_members_have_no_diversity():
    p = np.full((3, 5), 0.3)
    assert np.all(cv.js_succ(p) == 0)
    np.testing.assert_allclose(cv.p_pop(p), cv.p_same(p), rtol=0, atol=1e-15)
    assert np.all(cv.gap_local(p) == 0) and np.all(cv.js_succ_local(p) == 0)
    gain, local = cv.oracle_gate(p)
    np.testing.assert_allclose(gain, 0, atol=1e-15)
    np.testing.assert_allclose(local, 0, atol=1e-15)


def test_extreme_members_known_values():
    p = np.array([0.0, 1.0])
    assert cv.p_pop(p) == 1.0 and cv.p_same(p) == 0.75
    assert cv.js_succ(p) == pytest.approx(math.log(2))
    assert cv.binary_entropy(np.array([0.0, 1.0, 0.5])).tolist() == pytest.approx([0, 0, math.log(2)])


def test_population_coverage_bound_and_local_links():
    rng = np.random.default_rng(0)
    p = rng.uniform(0, 1, size=(200, 6))
    assert np.all(cv.p_pop(p) >= cv.p_same(p) - 1e-15)  # AM-GM, eq. rq1-population-coverage-bound
    assert np.all(cv.js_succ(p) >= 0)
    # Small heterogeneity: the second-order links of the appendix become exact.
    xi = np.array([1.0, -1.0, 2.0, -2.0, 0.5, -0.5])
    for scale in (1e-2, 1e-3):
        q = 0.3 + scale * xi
        gap = cv.p_pop(q) - cv.p_same(q)
        assert cv.gap_local(q) == pytest.approx(gap, rel=30 * scale)  # eq. rq1-coverage-js-link
        assert cv.js_succ_local(q) == pytest.approx(cv.js_succ(q), rel=30 * scale)
        gain, local = cv.oracle_gate(q, lam=2.0)  # eq. rq1-selection-js-link
        assert local == pytest.approx(gain, rel=30 * scale)


def test_lemma3_covariance_identity_and_weights():
    rng = np.random.default_rng(1)
    p = rng.uniform(size=(4, 7))
    z = rng.normal(size=7)
    w = cv.selection_weights(z)
    assert w.sum() == pytest.approx(1.0) and np.all(w > 0)
    assert np.all(np.diff(w[np.argsort(z)]) >= 0)  # monotone in fitness
    np.testing.assert_allclose(cv.selection_gain(w, p), 7 * cv.member_cov(w, p), atol=1e-12)
    np.testing.assert_allclose(cv.selection_weights(np.zeros(5)), np.full(5, 0.2))
    with pytest.raises(UserError):
        cv.selection_gain(w[:3], p)


def test_transfer_check_bound_holds_for_exact_probabilities():
    rng = np.random.default_rng(2)
    pw, pc, pu = rng.uniform(0.05, 0.95, size=(3, 50))
    out = cv.transfer_check(pw, pc, pu, ks=(1, 4))
    eps = float(cv.bernoulli_kl(pw, pu).mean())
    assert out["prop1/eps_succ"] == pytest.approx(eps)
    for k in (1, 4):
        pre = f"prop1/K{k}/"
        assert out[pre + "slack"] == pytest.approx(k * math.sqrt(eps / 2))
        # Pinsker + Lipschitz + Jensen: J_K(theta+) >= bound_x >= bound (proof of Proposition 1).
        assert out[pre + "J_updated"] >= out[pre + "bound_x"] - 1e-12 >= out[pre + "bound"] - 2e-12
        assert out[pre + "condition"] == float(out[pre + "margin"] > out[pre + "slack"])
    same = cv.transfer_check(pw, pw, pw, ks=(2,))
    assert same["prop1/eps_succ"] == 0 and same["prop1/K2/condition"] == 0.0
    assert cv.bernoulli_kl(0.0, 0.5) == pytest.approx(math.log(2))
    assert np.isinf(cv.bernoulli_kl(0.5, 0.0))
    smoothed = cv.transfer_check([0.0], [0.0], [0.0], ks=(1,), smooth_n=8)
    assert smoothed["prop1/eps_succ"] == 0.0


def test_between_variance_is_unbiased_and_null_floor():
    rng = np.random.default_rng(3)
    p_true = np.array([0.2, 0.4, 0.5, 0.9])
    v_true = ((p_true - p_true.mean()) ** 2).mean()
    draws = rng.random((20000, 4, 3)) < p_true[None, :, None]  # [reps, N, S=3]
    assert cv.between_variance(draws).mean() == pytest.approx(v_true, rel=0.03)
    raw = ((draws.mean(-1) - draws.mean((-1, -2))[:, None]) ** 2).mean(-1).mean()
    assert raw > 1.2 * v_true  # the plug-in is biased upward; the correction matters
    # Exchangeable members: observed plug-in JS_succ ~ its permutation null ~ (1 - 1/N)/(2S).
    n, s = 8, 16
    same = rng.random((60, n, s)) < 0.5
    null = cv.permutation_null(same, np.random.default_rng(4), permutations=100)
    observed = cv.js_succ(same.mean(-1))
    assert null["js_succ"].mean() == pytest.approx(observed.mean(), rel=0.2)
    assert null["js_succ"].mean() == pytest.approx((1 - 1 / n) / (2 * s), rel=0.2)
    # One member always right, the rest always wrong: far above the null.
    split = np.zeros((1, n, s), dtype=bool)
    split[0, 0] = True
    null = cv.permutation_null(split, np.random.default_rng(5))
    assert cv.js_succ(split.mean(-1))[0] > 5 * null["js_succ"][0]


def test_coverage_metrics_keys_and_consistency():
    rng = np.random.default_rng(6)
    members = rng.random((3, 4, 5)) < np.array([0.1, 0.3, 0.6, 0.8])[None, :, None]
    centre = rng.random((3, 20)) < 0.4
    u = np.array([-1.2, -0.3, 0.4, 1.1])
    m = cv.coverage_metrics(members, centre, centre, u, np.random.default_rng(0), ks=(1, 4))
    ph = members.mean(-1)
    assert m["p_bar"] == pytest.approx(ph.mean())
    assert m["gap"] == pytest.approx(m["P_pop"] - m["P_same"])
    assert m["cov_wp"] == pytest.approx(cv.member_cov(u, ph).mean()) and m["cov_wp"] > 0
    assert m["corr_wp"] > 0.5
    assert m["prop1/K4/gain"] == 0.0  # theta+ sampled identically to theta here
    assert m["p_updated"] == m["p_centre"]


def test_policy_js_matches_exact_sequence_js():
    """Chain-rule estimator: its expectation over y ~ pi_i equals KL(pi_i || pi_bar) exactly
    (two members, two steps, vocabulary 3: every response enumerated)."""
    g = torch.Generator().manual_seed(0)
    n, v = 2, 3
    step0 = torch.log_softmax(torch.randn(n, v, generator=g, dtype=torch.float64), -1)  # [N, V]
    step1 = torch.log_softmax(torch.randn(n, v, v, generator=g, dtype=torch.float64), -1)  # [N, v0, V]
    seqs = list(itertools.product(range(v), repeat=2))
    logp_seq = torch.tensor([[float(step0[j, a] + step1[j, a, b]) for a, b in seqs] for j in range(n)],
                            dtype=torch.float64)  # [N, 9]
    mix = torch.logsumexp(logp_seq, 0) - math.log(n)
    exact = float(sum((logp_seq[i].exp() * (logp_seq[i] - mix)).sum() for i in range(n)) / n)
    # Every (member, response) pair as a row; estimator weighted by pi_i(y).
    rows = [(i, s) for i in range(n) for s in seqs]
    tokens = torch.tensor([list(s) for _, s in rows])  # [R, 2]
    logps = [torch.stack([torch.stack([step0[j], step1[j, a]]) for _, (a, _b) in rows]) for j in range(n)]
    owner = torch.tensor([i for i, _ in rows])
    est = policy_js(logps, tokens, torch.ones_like(tokens, dtype=torch.bool), owner)  # [R]
    weights = torch.tensor([float(logp_seq[i, seqs.index(s)].exp()) for i, s in rows], dtype=torch.float64)
    assert float((weights * est).sum() / n) == pytest.approx(exact, rel=1e-10)
    same = policy_js([logps[0], logps[0]], tokens, torch.ones_like(tokens, dtype=torch.bool), owner)
    assert float(same.abs().max()) < 1e-12


# --------------------------------------------------------------------------- measurement during training


def tiny_cfg(model_dir, *extra):
    return load_config(None, [
        f"model={model_dir}", "task=demo-add", "train.limit=8", "train.batch_size=4", "train.max_steps=2",
        "es.population_size=4", "es.sigma=0.003", "es.alpha=0.002", "generation.max_new_tokens=16",
        "generation.temperature=0.7", "checkpoint.every=0", "coverage.prompts=2", "coverage.samples=2", *extra])


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    from esreason.embedded import demo_model_dir

    root = tmp_path_factory.mktemp("coverage")
    off = run_es(tiny_cfg(demo_model_dir(), "coverage.every=0"), root / "off", progress=False)
    on = run_es(tiny_cfg(demo_model_dir(), "coverage.every=1"), root / "on", progress=False)
    return root, off, on


def _rows(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def test_coverage_does_not_change_the_trajectory(runs):
    root, off, on = runs
    assert hash_directory_safetensors(on.final_checkpoint) == hash_directory_safetensors(off.final_checkpoint)
    a, b = _rows(root / "off"), _rows(root / "on")
    assert [r["reward/mean"] for r in a] == [r["reward/mean"] for r in b]
    assert [r["update_norm"] for r in a] == [r["update_norm"] for r in b]
    assert not any(k.startswith("coverage/") for r in a for k in r)
    for r in b:
        assert r["coverage/samples"] == 2 and r["coverage/prompts"] == 2
        for key in ("P_pop", "P_same", "JS_succ", "JS_succ_null", "cov_wp", "prop1/eps_succ", "prop1/K4/margin"):
            assert f"coverage/{key}" in r
        assert r["coverage/P_pop"] >= r["coverage/P_same"] - 1e-12


def test_probe_restores_the_centre_bit_exactly():
    from esreason.backends.hf import HFPolicy, load_model
    from esreason.backends.sampling import Sampler
    from esreason.es.population import draw_population
    from esreason.tasks import render_prompt
    from esreason import tasks, verifiers
    from esreason.embedded import demo_model_dir

    cfg = tiny_cfg(demo_model_dir(), "coverage.every=1", "generation.max_new_tokens=4")
    model, tok = load_model(str(demo_model_dir()))
    policy = HFPolicy(model, tok)
    before = [p.detach().clone() for p in model.parameters()]
    probs = tasks.get("demo-add").load("train", None, 2)
    prompts = [render_prompt(tok, p.messages) for p in probs]
    pop = draw_population(0, 0, 4, "two_point")
    probe = cv.CoverageProbe(cfg, policy, Sampler(model, tok), verifiers.get("math"), 0)
    sample = probe.measure(pop, 0.05, prompts, [p.gold for p in probs], [0.5, -0.5, -1.0, 1.0])
    assert sample.members.shape == (2, 4, 2) and sample.centre.shape == (2, 8)
    assert sample.offset_weights.tolist() == [0.5, 0.5, -1.0, -1.0]  # z_i = (z_i sign_i) * sign_i
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    assert "coverage/JS_succ" in probe.finish()


# --------------------------------------------------------------------------- commands


def test_analyze_coverage_writes_table_and_plots(runs, tmp_path, capsys):
    root, _, _ = runs
    out = tmp_path / "cov"
    assert main(["analyze", "coverage", str(root / "on"), "--out", str(out)]) == 0
    for name in ("coverage.md", "coverage.tex", "coverage.json", "coverage_diversity.png", "coverage_prop1.png"):
        assert (out / name).stat().st_size > 0, name
    payload = json.loads((out / "coverage.json").read_text())
    assert payload["updates"] == [1, 2]
    assert set(payload["prop1"]) == {f"K{k}" for k in cv.PROP1_KS}
    assert "P_pop" in capsys.readouterr().out


def test_analyze_coverage_without_coverage_metrics_fails(runs, capsys):
    root, _, _ = runs
    assert main(["analyze", "coverage", str(root / "off")]) == 2
    assert "coverage.every" in capsys.readouterr().err


def test_lemma1_command_on_a_tiny_grid(tmp_path):
    out = tmp_path / "l1"
    assert main(["analyze", "lemma1", "--sigmas", "1e-3,1e-2", "--population", "2", "--prompts", "1",
                 "--samples", "2", "--fisher-samples", "2", "--repeats", "1", "--max-new-tokens", "8",
                 "--dtype", "float32", "--no-progress", "--out", str(out)]) == 0
    res = json.loads((out / "lemma1.json").read_text())
    assert [r["sigma"] for r in res["rows"]] == [1e-3, 1e-2]
    assert res["fisher_trace"] > 0
    for r in res["rows"]:
        assert 0 < r["js_pol"] < math.log(2) + 1e-9 and r["pred_lemma1"] > 0
    assert res["rows"][1]["pred_lemma1"] == pytest.approx(100 * res["rows"][0]["pred_lemma1"])
    assert (out / "lemma1.png").stat().st_size > 0 and (out / "lemma1.md").is_file()
    assert main(["analyze", "lemma1", "--sigmas", "0,1e-3", "--out", str(out)]) == 2


def test_coverage_needs_exact_restore():
    with pytest.raises(UserError, match="coverage.every"):
        load_config(None, ["coverage.every=1", "es.restore=subtract"])
    load_config(None, ["coverage.every=0", "es.restore=subtract"])
