"""Drift, s_tau, thresholded distance, localisation and rounding statistics against hand-computed values.

The synthetic checkpoints use dyadic changes (0.5, 2^-10, ...) so every expected value
is exact: Delta, its square and the counts are computed here by hand, not by the code
under test.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from esreason.analysis.weights.drift import parse_taus
from esreason.analysis.weights.pair import analyze_pair
from esreason.errors import UserError


def write_ckpt(path: Path, tensors: dict[str, torch.Tensor], tie: bool = True) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps({"model_type": "llama", "tie_word_embeddings": tie}))
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(path / "model.safetensors"),
              metadata={"format": "pt"})
    return path


E = "model.embed_tokens.weight"
LN = "model.layers.0.input_layernorm.weight"
QB = "model.layers.0.self_attn.q_proj.bias"
UP = "model.layers.0.mlp.up_proj.weight"


def base_tensors() -> dict[str, torch.Tensor]:
    return {E: torch.tensor([[1.0, 2.0], [3.0, 4.0]]), LN: torch.tensor([1.0, 1.0]),
            QB: torch.tensor([0.0, 0.0]), UP: torch.tensor([[0.5, -0.5]])}


def tuned_tensors() -> dict[str, torch.Tensor]:
    # Deltas: E [0, .5, 0, 0]; LN [2^-10, 0]; QB [-2^-12, .25]; UP [0, 2^-11]  -> 5 of 10 changed
    return {E: torch.tensor([[1.0, 2.5], [3.0, 4.0]]), LN: torch.tensor([1.0 + 2**-10, 1.0]),
            QB: torch.tensor([-(2**-12), 0.25]), UP: torch.tensor([[0.5, -0.5 + 2**-11]])}


TAUS = "2.5e-4,5e-4,1e-3,0.3,1"
CHANGES = [0.5, 2**-10, 2**-12, 0.25, 2**-11]
BASE_SQ = 1 + 4 + 9 + 16 + 1 + 1 + 0.25 + 0.25


@pytest.fixture
def pair(tmp_path):
    return write_ckpt(tmp_path / "base", base_tensors()), write_ckpt(tmp_path / "tuned", tuned_tensors())


def expected_thresholded(tau: float) -> float:
    return math.sqrt(sum(c * c for c in CHANGES if c > tau)) / math.sqrt(BASE_SQ)


def test_drift_and_s_tau_match_hand_computation(pair):
    base, tuned = pair
    res = analyze_pair(base, tuned, taus=parse_taus(TAUS)).drift
    assert res.numel == 10
    assert res.changed == 5
    assert res.base_l2 == pytest.approx(math.sqrt(BASE_SQ), rel=1e-15)
    assert res.relative_l2 == pytest.approx(math.sqrt(sum(c * c for c in CHANGES)) / math.sqrt(BASE_SQ), rel=1e-15)
    # zero-change coordinates are excluded from the denominator: 5, not 10
    assert res.s_tau == {"2.5e-4": 1 / 5, "5e-4": 2 / 5, "1e-3": 3 / 5, "0.3": 4 / 5, "1": 1.0}
    for lab, v in parse_taus(TAUS):
        assert res.thresholded_relative_l2[lab] == pytest.approx(expected_thresholded(v), rel=1e-15, abs=0)
    assert res.max_abs == 0.5 and res.at_max == 1
    cats = res.by_category()
    assert cats["embedding"]["changed"] == 1 and cats["embedding"]["numel"] == 4
    assert cats["attn_bias"]["changed"] == 2
    assert cats["attn_bias"]["relative_l2"] is None  # base biases are zero
    assert cats["input_layernorm"]["share_of_sq_drift"] == pytest.approx(2**-20 / sum(c * c for c in CHANGES))
    assert sum(res.hist_counts) == 5
    # each changed coordinate lies in the bin [edges[i-1], edges[i]) of the histogram
    expect = [0] * len(res.hist_counts)
    for c in CHANGES:
        expect[sum(1 for e in res.hist_edges if e <= c)] += 1
    assert res.hist_counts == expect


def test_tied_lm_head_is_counted_once(tmp_path):
    b = base_tensors()
    t = tuned_tensors()
    base = write_ckpt(tmp_path / "base", b)                                   # embedding stored once
    tuned = write_ckpt(tmp_path / "tuned", {**t, "lm_head.weight": t[E].clone()})  # both names stored
    res = analyze_pair(base, tuned, taus=parse_taus(TAUS))
    assert res.drift.numel == 10 and res.drift.changed == 5
    assert res.info.tied == {"lm_head.weight": E}
    # without the config flag the two names are two parameters
    untied_b = write_ckpt(tmp_path / "ub", {**b, "lm_head.weight": b[E].clone()}, tie=False)
    untied_t = write_ckpt(tmp_path / "ut", {**t, "lm_head.weight": t[E].clone()}, tie=False)
    res2 = analyze_pair(untied_b, untied_t, taus=parse_taus(TAUS)).drift
    assert res2.numel == 14 and res2.changed == 6


def test_tied_flag_with_different_head_is_an_error(tmp_path):
    t = tuned_tensors()
    write_ckpt(tmp_path / "base", base_tensors())
    bad = write_ckpt(tmp_path / "tuned", {**t, "lm_head.weight": t[E] + 1})
    with pytest.raises(UserError, match="lm_head.weight"):
        analyze_pair(tmp_path / "base", bad, taus=parse_taus(TAUS))


def test_results_do_not_depend_on_chunk_size(pair):
    base, tuned = pair
    ref = analyze_pair(base, tuned, taus=parse_taus(TAUS), topk=3)
    for chunk in (1, 3):
        got = analyze_pair(base, tuned, taus=parse_taus(TAUS), topk=3, chunk_elems=chunk)
        assert got.drift.to_json() == ref.drift.to_json()
        assert got.loc.to_json() == ref.loc.to_json()


def test_localization_top_k_and_maximum(pair):
    base, tuned = pair
    loc = analyze_pair(base, tuned, topk=3).loc
    assert [(e.name, e.index, e.delta) for e in loc.top] == [(E, (0, 1), 0.5), (QB, (1,), 0.25), (LN, (0,), 2**-10)]
    assert loc.top_by_category == {"input_layernorm": 1, "attn_bias": 1, "embedding": 1}
    assert loc.max_abs == 0.5 and loc.at_max == 1 and loc.at_max_by_category == {"embedding": 1}
    # more k than changed coordinates: only changed ones qualify
    assert len(analyze_pair(base, tuned, topk=50).loc.top) == 5


def test_top_k_tie_rule_and_boundary_counts(tmp_path):
    # Equal |Delta| = 0.125 at 3 LayerNorm and 2 attention-bias coordinates, one larger (0.25) in the MLP.
    names = {"model.layers.0.input_layernorm.weight": [0.125, 0, 0.125, 0.125],
             "model.layers.0.self_attn.k_proj.bias": [-0.125, 0.125, 0, 0],
             "model.layers.0.mlp.down_proj.weight": [0, 0.25, 0, 0]}
    base = write_ckpt(tmp_path / "b", {n: torch.zeros(4) for n in names})
    tuned = write_ckpt(tmp_path / "t", {n: torch.tensor(v) for n, v in names.items()})
    loc = analyze_pair(base, tuned, topk=3, chunk_elems=2).loc
    # rule: |Delta| desc, then tensor name asc, then flat index asc
    assert [(e.name, e.flat_index) for e in loc.top] == [
        ("model.layers.0.mlp.down_proj.weight", 1),
        ("model.layers.0.input_layernorm.weight", 0),
        ("model.layers.0.input_layernorm.weight", 2)]
    assert loc.boundary() == {"kth_value": 0.125, "num_ge_kth": 6, "num_eq_kth": 5, "num_eq_kth_in_top": 2}
    assert loc.at_max == 1 and loc.at_max_by_category == {"mlp": 1}
    # the maximum shared by several coordinates across categories
    loc2 = analyze_pair(tuned, base, topk=2).loc  # reversed: same magnitudes
    assert loc2.max_abs == 0.25
    base3 = write_ckpt(tmp_path / "b3", {n: torch.zeros(4) for n in names if "mlp" not in n})
    tuned3 = write_ckpt(tmp_path / "t3", {n: torch.tensor(v) for n, v in names.items() if "mlp" not in n})
    loc3 = analyze_pair(base3, tuned3, topk=2).loc
    assert loc3.max_abs == 0.125 and loc3.at_max == 5
    assert loc3.at_max_by_category == {"input_layernorm": 3, "attn_bias": 2}


def test_max_ratio_between_two_tuned_models(pair, tmp_path):
    from esreason.analysis.weights.localize import max_ratio

    base, tuned = pair
    small = {k: v.clone() for k, v in base_tensors().items()}
    small[UP] = torch.tensor([[0.5, -0.5 + 2**-11]])
    ref = write_ckpt(tmp_path / "ref", small)
    a = analyze_pair(base, tuned, topk=5).loc
    b = analyze_pair(base, ref, topk=5).loc
    assert max_ratio(a, b) == 0.5 / 2**-11 == 1024.0


def test_rounding_ulp_statistics_bf16(tmp_path):
    base = torch.tensor([1.0, 1.0, 0.5, 2.0, -0.0, 3.0], dtype=torch.bfloat16)
    tuned = torch.tensor([1.0 + 2**-7,        # one step up; ulp(1) = 2^-7 -> integer, single
                          1.0 - 2**-8,        # one step down into [0.5, 1): half an ulp of 1, single
                          0.5 + 3 * 2**-8,    # ulp(0.5) = 2^-8 -> 3 ulps, 3 steps
                          2.0, 0.0, 3.0],     # unchanged (-0 -> +0 is no change)
                         dtype=torch.bfloat16)
    b = write_ckpt(tmp_path / "b", {"model.norm.weight": base})
    t = write_ckpt(tmp_path / "t", {"model.norm.weight": tuned})
    r = analyze_pair(b, t, rounding=True).rounding
    assert r.dtypes == ["BF16"]
    assert r.changed == 3
    assert r.integer_ulp_share == pytest.approx(2 / 3)
    assert r.single_ulp_share == pytest.approx(2 / 3)
    assert r.single_ulp_sq_drift_share == pytest.approx((2**-14 + 2**-16) / (2**-14 + 2**-16 + 9 * 2**-16))
    assert r.distance_buckets()["1"] == 2 and r.distance_buckets()["3-4"] == 1


def test_rounding_lattice_steps_across_zero_and_fp16(tmp_path):
    from esreason.analysis.weights.rounding import order_key, ulp

    x = torch.tensor([-(2**-24), 0.0, 2**-24, 2**-14, 1.0], dtype=torch.float16)  # fp16: 2^-24 smallest subnormal
    keys = order_key(x, "F16").tolist()
    assert keys == [-1, 0, 1, 2**10, 15 << 10]
    u = ulp(x.to(torch.float64), "F16").tolist()
    assert u == [2**-24, 2**-24, 2**-24, 2**-24, 2**-10]


def test_parse_taus_rejects_bad_values():
    assert parse_taus("1e-3, 2e-3") == [("1e-3", 1e-3), ("2e-3", 2e-3)]
    for bad, msg in (("0", "> 0"), ("-1e-3", "> 0"), ("abc", "not a number"), ("1e-3,1e-3", "twice"),
                     ("", "at least one"), ("nan", "> 0")):
        with pytest.raises(UserError, match=msg):
            parse_taus(bad)
