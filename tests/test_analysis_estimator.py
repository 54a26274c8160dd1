"""``esreason analyze estimator``: the paper's local perturbation diagnostic (ES–ZO appendix).

Statistics are checked by hand on tiny arrays; the diagnostic runs on the embedded default
with small grids (2 directions, 4 prompts x 2 seeds) so the file stays well under a minute
on one thread.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from esreason.analysis.estimator.diagnostic import EstimatorSettings, parse_sigmas
from esreason.analysis.estimator.stats import pooled_stats
from esreason.analysis.estimator.run import run_diagnostic, weights_digest
from esreason.errors import UserError

pytestmark = pytest.mark.heavy  # the fast subset (`--fast`) leaves this file out: tests/conftest.py

FIXTURES = Path(__file__).parent / "fixtures"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
SMALL = dict(directions=2, reward_prompts=4, reward_seeds=2, rollout_prompts=4, rollout_seeds=2, ce_examples=8,
             max_new_tokens=48)


# --------------------------------------------------------------------------- statistics by hand


def test_pooled_stats_by_hand():
    # Shape [D=2, P=2, S=1]; pooled = the 4 flattened triples.
    xp = np.array([1.0, 2.0, 3.0, 4.0]).reshape(2, 2, 1)
    x0 = np.array([1.0, 2.0, 3.0, 5.0]).reshape(2, 2, 1)
    xm = np.array([2.0, 2.0, 3.0, 3.0]).reshape(2, 2, 1)
    st = pooled_stats(xp, x0, xm)
    assert st.n == 4
    # Var(X+) = 5/3; X+ - X0 = [0,0,0,-1] -> var 1/4; X+ - X- = [-1,0,0,1] -> var 2/3 (ddof 1).
    assert st.kappa_base == pytest.approx(0.25 / (5 / 3))      # 0.15
    assert st.kappa_pair == pytest.approx((2 / 3) / (5 / 3))   # 0.4
    assert st.corr_base == pytest.approx(6.5 / math.sqrt(5 * 8.75))  # 0.98270
    assert st.corr_pair == pytest.approx(2 / math.sqrt(5 * 1))       # 0.89443
    assert st.mean_plus == 2.5 and st.mean_zero == 2.75 and st.mean_minus == 2.5


def test_pooled_stats_pool_not_average_and_identity():
    rng = np.random.default_rng(0)
    xp, x0, xm = (rng.normal(size=(3, 5, 4)) for _ in range(3))
    x0 = xp + 0.3 * x0  # correlated
    st = pooled_stats(xp, x0, xm)
    p, z, m = xp.ravel(), x0.ravel(), xm.ravel()
    cov = np.cov(p, z, ddof=1)
    assert st.kappa_base == pytest.approx((cov[0, 0] + cov[1, 1] - 2 * cov[0, 1]) / cov[0, 0])  # Eq. app-baseline-variance
    assert st.corr_base == pytest.approx(np.corrcoef(p, z)[0, 1])
    assert st.corr_pair == pytest.approx(np.corrcoef(p, m)[0, 1])
    per_direction = np.mean([pooled_stats(xp[d], x0[d], xm[d]).kappa_pair for d in range(3)])
    assert st.kappa_pair != pytest.approx(per_direction)  # pooled, not averaged per direction


def test_pooled_stats_degenerate():
    const = np.ones(6)
    st = pooled_stats(const, np.arange(6.0), np.arange(6.0))
    assert st.kappa_base is None and st.kappa_pair is None and st.corr_base is None
    with pytest.raises(ValueError):
        pooled_stats(np.ones(1), np.ones(1), np.ones(1))
    with pytest.raises(ValueError):
        pooled_stats(np.array([1.0, np.nan]), np.ones(2), np.ones(2))


@pytest.mark.parametrize("text", ["0", "-1e-3", "1e-3,0", "nan", "abc", "1e-3,1e-3", "1e-3,,2e-3"])
def test_parse_sigmas_rejects(text):
    with pytest.raises(UserError, match="--sigmas"):
        parse_sigmas(text)


def test_settings_validation_names_flags():
    with pytest.raises(UserError, match="--table-sigma"):
        EstimatorSettings(table_sigma=5e-3).validate()
    with pytest.raises(UserError, match="--objectives.*'bogus'"):
        EstimatorSettings(objectives=("ce", "bogus")).validate()
    with pytest.raises(UserError, match="--rollout-seeds"):
        EstimatorSettings(rollout_seeds=1).validate()
    with pytest.raises(UserError, match="observation"):
        EstimatorSettings(objectives=("ce",), directions=1, ce_examples=1).validate()


# --------------------------------------------------------------------------- the diagnostic on the embedded default


@pytest.fixture(scope="module")
def demo():
    from esreason.backends.hf import load_model

    return load_model("demo", "float32", "cpu")


@pytest.fixture(scope="module")
def diagnostic(demo):
    model, tok = demo
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    settings = EstimatorSettings(sigmas=tuple(parse_sigmas("1e-4,1e-3")), **SMALL)
    result = run_diagnostic(settings, model=model, tokenizer=tok, progress=False)
    return result, before


def test_centre_bit_identical_after_diagnostic(demo, diagnostic):
    model, _ = demo
    result, before = diagnostic
    for name, p in model.named_parameters():
        assert torch.equal(p.detach(), before[name]), name
    assert result.facts["centre_bit_identical"] is True
    assert result.facts["centre_sha256_after"] == weights_digest(model)


def test_fixed_batch_ce_has_kappa_well_below_one(diagnostic):
    """The paper's control: a fixed-batch supervised CE keeps X+, X0, X- strongly coupled."""
    result, _ = diagnostic
    stats = result.stats()
    small, large = stats[("ce", "fixed batch", "1e-4")], stats[("ce", "fixed batch", "1e-3")]
    assert small.n == 2 * 8
    assert small.kappa_base < 0.05 and small.kappa_pair < 0.05
    assert small.corr_base > 0.95 and small.corr_pair > 0.95
    assert large.kappa_pair < 1.0
    assert small.kappa_pair < large.kappa_pair  # coupling weakens as sigma grows


def test_observation_shapes_and_centre_values(diagnostic):
    result, _ = diagnostic
    obs = result.observations
    assert set(k[:2] for k in obs) == {("reward", "common"), ("reward", "independent"), ("ce", "fixed batch"),
                                       ("logprob", "fixed rollout"), ("seqloss", "fixed rollout"),
                                       ("grpo", "fixed rollout")}
    assert obs[("reward", "common", "1e-3")].plus.shape == (2, 4, 2)  # [D, P, S]
    assert obs[("logprob", "fixed rollout", "1e-3")].zero.shape == (2, 4, 2)
    rew = obs[("reward", "independent", "1e-3")]
    assert set(np.unique(np.concatenate([rew.plus.ravel(), rew.zero.ravel()]))) <= {0.0, 0.1, 1.0}
    # common coupling: X0 is one centre evaluation shared by the directions
    assert np.array_equal(obs[("reward", "common", "1e-3")].zero[0], obs[("reward", "common", "1e-3")].zero[1])
    # GRPO surrogate at the centre is -A_i (ratio 1): zero mean within every prompt's group
    grpo0 = obs[("grpo", "fixed rollout", "1e-3")].zero
    assert np.allclose(grpo0.mean(axis=2), 0.0, atol=1e-12)
    lp0, sl0 = obs[("logprob", "fixed rollout", "1e-3")].zero, obs[("seqloss", "fixed rollout", "1e-3")].zero
    assert (lp0 < 0).all() and (sl0 >= -lp0 - 1e-12).all()  # -sum >= -mean for T_i >= 1
    # X0 does not depend on sigma
    assert np.array_equal(obs[("ce", "fixed batch", "1e-4")].zero, obs[("ce", "fixed batch", "1e-3")].zero)


def test_common_seeds_couple_better_than_independent_at_small_sigma(diagnostic):
    result, _ = diagnostic
    assert result.identical[("common", "1e-4")] > result.identical[("independent", "1e-4")]
    stats = result.stats()
    assert stats[("reward", "common", "1e-4")].kappa_base < stats[("reward", "independent", "1e-4")].kappa_base


def test_supervised_ce_matches_hf_loss(demo):
    from esreason.analysis.estimator.objectives import SupervisedExample, supervised_ce

    model, tok = demo
    prompt = tok("<s>Q:12+34\nA:", add_special_tokens=False)["input_ids"]
    target = tok("2+4=6,1+3=4 \\boxed{46}", add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    ce = supervised_ce(model, [SupervisedExample(tuple(prompt), (tuple(target),))])
    ids = torch.tensor([prompt + target])
    labels = ids.clone()
    labels[0, :len(prompt)] = -100
    with torch.no_grad():
        ref = float(model(input_ids=ids, labels=labels).loss)
    assert ce[0] == pytest.approx(ref, rel=1e-5)


# --------------------------------------------------------------------------- SST-2 control


def test_sst2_loader_fixture(demo):
    from esreason.analysis.estimator.sst2 import VERBALISER, sst2_examples

    _, tok = demo
    ex = sst2_examples(tok, "validation", FIXTURES / "sst2", limit=4)
    assert [e.label for e in ex] == [1, 0, 1, 0]
    assert ex[0].candidates == tuple(tuple(tok(v, add_special_tokens=False)["input_ids"]) for v in VERBALISER)
    text = tok.decode(list(ex[1].prompt_ids), skip_special_tokens=True)
    assert text == "the plot is thin and the jokes fall flat . It was"


def test_sst2_loader_rejects_bad_rows(demo, tmp_path):
    from esreason.analysis.estimator.sst2 import sst2_examples

    _, tok = demo
    bad = tmp_path / "test.jsonl"
    bad.write_text('{"sentence": "fine .", "label": 1}\n{"sentence": "hidden .", "label": -1}\n')
    with pytest.raises(UserError, match="row 2: field 'label'"):
        sst2_examples(tok, "validation", bad)
    missing = tmp_path / "m.jsonl"
    missing.write_text('{"label": 1}\n')
    with pytest.raises(UserError, match="'sentence' is missing"):
        sst2_examples(tok, "validation", missing)


def test_sst2_classification_ce_and_diagnostic(demo):
    from esreason.analysis.estimator.objectives import completion_logprobs, supervised_ce
    from esreason.analysis.estimator.sst2 import sst2_examples

    model, tok = demo
    ex = sst2_examples(tok, "validation", FIXTURES / "sst2")
    ce = supervised_ce(model, ex)
    # by hand for example 0: -log softmax over the two verbaliser log-likelihoods
    lps = completion_logprobs(model, [(ex[0].prompt_ids, c) for c in ex[0].candidates])
    s = np.array([lp.sum() for lp in lps])
    # Tolerance: ce = log(1 + exp(s_other - s_label)) moves by about ce * delta when the two sums s (9 and
    # 6 float32 token log-probs, |s| ~ 40-50) move by delta nats, so its relative error is delta itself.
    # supervised_ce batches all examples and this check only example 0's two candidates: other padding
    # widths, other GEMM blocking, float32 rounding of ~1e-6 nats here (1.2e-6 measured under
    # ATEN_CPU_CAPABILITY=default, the default rel 1e-6 failed there). rel 1e-4 keeps a 10x margin over
    # any kernel path and is still far below what a wrong formula gives (a dropped term: 100 %).
    assert ce[0] == pytest.approx(-(s[ex[0].label] - np.logaddexp(s[0], s[1])), rel=1e-4)
    settings = EstimatorSettings(sigmas=((("1e-4"), 1e-4),), table_sigma=1e-4, objectives=("ce",), directions=2,
                                 ce_examples=6, supervised="sst2", sst2_path=str(FIXTURES / "sst2"))
    result = run_diagnostic(settings, model=model, tokenizer=tok, progress=False)
    st = result.stats()[("ce", "fixed batch", "1e-4")]
    assert st.n == 12 and st.kappa_pair < 0.5


# --------------------------------------------------------------------------- CLI


def _parse(argv: list[str]) -> argparse.Namespace:
    from esreason.analysis.command import register

    parser = argparse.ArgumentParser(prog="esreason")
    register(parser.add_subparsers(dest="command", required=True))
    return parser.parse_args(argv)


def test_cli_writes_tables_json_png(tmp_path, capsys):
    out = tmp_path / "est"
    args = _parse(["analyze", "estimator", "--sigmas", "3e-4,1e-3", "--directions", "2", "--reward-prompts", "2",
                   "--reward-seeds", "2", "--rollout-prompts", "2", "--rollout-seeds", "2", "--ce-examples", "4",
                   "--max-new-tokens", "48", "--out", str(out), "--json", "--no-progress"])
    assert args.func(args) == 0
    payload = json.loads(capsys.readouterr().out)  # --json: one JSON object and nothing else on stdout
    assert payload["analysis"] == "estimator" and payload["table_sigma"] == "1e-3"
    assert payload["facts"]["centre_bit_identical"] is True
    rows = {(r["objective"], r["coupling"], r["sigma"]) for r in payload["results"]}
    assert ("reward", "independent", "3e-4") in rows and ("grpo", "fixed rollout", "1e-3") in rows
    for name in ("estimator.md", "estimator.tex", "estimator.json", "estimator_observations.npz"):
        assert (out / name).is_file(), name
    assert (out / "estimator_kappa.png").read_bytes()[:8] == PNG_MAGIC
    md = (out / "estimator.md").read_text()
    assert "(a) Objective comparison at σ=1e-3" in md and "(b) Perturbation-scale sweep" in md
    assert "| demo-add supervised CE | Fixed batch |" in md
    tex = (out / "estimator.tex").read_text()
    assert "\\begin{tabular}{@{}llrrrr@{}}" in tex and "$\\kappa$\\_base" in tex and "κ" not in tex
    npz = np.load(out / "estimator_observations.npz")
    assert npz["ce|fixed batch|1e-3|plus"].shape == (2, 4, 1)


@pytest.mark.parametrize("argv, message", [
    (["--sigmas", "0,1e-3"], "--sigmas: sigma must be a finite number > 0, got 0"),
    (["--sigmas=-1e-3"], "--sigmas: sigma must be a finite number > 0, got -1e-3"),
    (["--objectives", "ce,reward,entropy"], "--objectives: unknown value 'entropy'"),
    (["--couplings", "shared"], "--couplings: unknown value 'shared'"),
    (["--sigmas", "1e-4", "--table-sigma", "1e-3"], "--table-sigma 0.001 is not one of --sigmas"),
])
def test_cli_bad_input_exits_2(argv, message, capsys):
    from esreason.cli import main

    assert main(["analyze", "estimator", *argv, "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("esreason: error: ") and message in err
    assert "Traceback" not in err
