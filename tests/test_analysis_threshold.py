"""Magnitude-thresholded checkpoints (paper §RQ2) and the Pass@1 sweep across taus."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from esreason.analysis.weights.drift import parse_taus
from esreason.analysis.weights.pair import analyze_pair
from esreason.analysis.weights.threshold import EvalSettings, run_sweep, write_thresholded
from esreason.errors import UserError


def write_ckpt(path: Path, tensors: dict[str, torch.Tensor], tie: bool = True) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps({"model_type": "llama", "tie_word_embeddings": tie}))
    (path / "tokenizer_config.json").write_text("{}")
    save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})
    return path


E = "model.embed_tokens.weight"
LN = "model.norm.weight"


def test_thresholded_checkpoint_matches_hand_computation(tmp_path):
    # bf16 LayerNorm: Deltas 2^-7 (kept at tau 5e-3? no: 0.0078 > 5e-3 -> kept), 2^-8 (0.0039 <= 5e-3 -> reset), 0
    base = {E: torch.tensor([[0.0, 1.0], [2.0, 3.0]]), LN: torch.tensor([1.0, 1.0, 1.0], dtype=torch.bfloat16)}
    tuned = {E: torch.tensor([[0.001, 1.0], [2.5, 3.0]]),  # Deltas 0.001 (reset), 0, 0.5 (kept), 0
             LN: torch.tensor([1.0 + 2**-7, 1.0 - 2**-8, 1.0], dtype=torch.bfloat16)}
    b = write_ckpt(tmp_path / "base", base)
    # the tuned checkpoint stores the tied head too: it must be written, thresholded identically, counted once
    t = write_ckpt(tmp_path / "tuned", {**tuned, "lm_head.weight": tuned[E].clone()})
    stats = write_thresholded(b, t, 5e-3, tmp_path / "out", tau_label="5e-3")
    assert (stats.num_coordinates, stats.num_changed, stats.num_reset, stats.num_kept) == (7, 4, 2, 2)
    assert stats.update_sparsity == 0.5
    d01 = float(torch.tensor(0.001) - torch.tensor(0.0))  # fp32 rounding of 0.001
    base_sq = 0 + 1 + 4 + 9 + 3
    assert stats.full_relative_l2 == pytest.approx(math.sqrt(d01**2 + 0.25 + 2**-14 + 2**-16) / math.sqrt(base_sq))
    assert stats.relative_l2 == pytest.approx(math.sqrt(0.25 + 2**-14) / math.sqrt(base_sq))

    out = load_file(str(tmp_path / "out" / "model.safetensors"))
    assert set(out) == {E, LN, "lm_head.weight"}
    assert torch.equal(out[E], torch.tensor([[0.0, 1.0], [2.5, 3.0]]))
    assert torch.equal(out["lm_head.weight"], out[E])
    assert out[LN].dtype == torch.bfloat16
    assert torch.equal(out[LN], torch.tensor([1.0 + 2**-7, 1.0, 1.0], dtype=torch.bfloat16))
    assert (tmp_path / "out" / "tokenizer_config.json").is_file()
    info = json.loads((tmp_path / "out" / "threshold.json").read_text())
    assert info["update_sparsity"] == 0.5 and info["tau"] == 5e-3
    # the drift pass reports the same s_tau and thresholded distance
    dr = analyze_pair(b, t, taus=parse_taus("5e-3")).drift
    assert dr.s_tau["5e-3"] == 0.5
    assert dr.thresholded_relative_l2["5e-3"] == pytest.approx(stats.relative_l2, rel=1e-15)


def perturbed_copy(src: Path, dst: Path, dtype: torch.dtype, scale: float = 2e-3, seed: int = 0) -> tuple[Path, Path]:
    """(base, tuned): src re-saved in ``dtype`` and a randomly perturbed copy (a few coordinates unchanged)."""
    base, tuned = dst / "base", dst / "tuned"
    shutil.copytree(src, base)
    sd = {k: v.to(dtype) for k, v in load_file(str(src / "model.safetensors")).items()}
    save_file(sd, str(base / "model.safetensors"), metadata={"format": "pt"})
    shutil.copytree(base, tuned)
    g = torch.Generator().manual_seed(seed)
    out = {}
    for k, v in sd.items():
        noise = scale * torch.randn(v.shape, generator=g)
        noise[torch.rand(v.shape, generator=g) < 0.2] = 0.0  # zero-change coordinates
        out[k] = (v.double() + noise).to(dtype)
    save_file(out, str(tuned / "model.safetensors"), metadata={"format": "pt"})
    return base, tuned


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_thresholded_model_differs_from_base_exactly_where_update_exceeds_tau(tiny_model_dir, tmp_path, dtype):
    from transformers import AutoModelForCausalLM

    base, tuned = perturbed_copy(tiny_model_dir, tmp_path, dtype)
    tau = 1.5e-3
    write_thresholded(base, tuned, tau, tmp_path / "thr", chunk_elems=100)
    b, t = load_file(str(base / "model.safetensors")), load_file(str(tuned / "model.safetensors"))
    o = load_file(str(tmp_path / "thr" / "model.safetensors"))
    assert set(o) == set(b)
    for k in b:
        big = (t[k].double() - b[k].double()).abs() > tau
        assert torch.equal(o[k] != b[k], big), k
        assert torch.equal(o[k][big], t[k][big]), k
        assert o[k].dtype == dtype
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "thr")
    assert torch.equal(model.model.norm.weight.to(dtype), o["model.norm.weight"])
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()  # still tied


def test_bad_tau_and_output_path(tmp_path):
    b = write_ckpt(tmp_path / "b", {E: torch.zeros(2)})
    t = write_ckpt(tmp_path / "t", {E: torch.ones(2)})
    for bad in (0.0, -1e-3, float("nan"), float("inf")):
        with pytest.raises(UserError, match="tau must be"):
            write_thresholded(b, t, bad, tmp_path / "o")
    with pytest.raises(UserError, match="overwrite an input"):
        write_thresholded(b, t, 1e-3, t)
    other = write_ckpt(tmp_path / "x", {"model.other.weight": torch.ones(2)})
    with pytest.raises(UserError, match="model.embed_tokens.weight"):
        write_thresholded(b, other, 1e-3, tmp_path / "o")
    assert not (tmp_path / "o").exists()


def test_sweep_evaluates_every_threshold(tiny_model_dir, tmp_path):
    base, tuned = perturbed_copy(tiny_model_dir, tmp_path, torch.float32, scale=3e-3)
    taus = parse_taus("1e-3,3e-3")
    settings = EvalSettings(tasks=["demo-add"], samples=2, temperature=0.6, max_new_tokens=8, limit=2,
                            batch_size=8, bootstrap=0)
    rows = run_sweep(base, tuned, taus, settings, tmp_path / "sweep", progress=False)
    assert [r.label for r in rows] == ["Full ES", "1e-3", "3e-3", "Base Model"]
    s = analyze_pair(base, tuned, taus=taus).drift.s_tau
    assert rows[0].sparsity == 0.0 and rows[-1].sparsity == 1.0
    assert [r.sparsity for r in rows[1:3]] == [s["1e-3"], s["3e-3"]]
    assert all(r.pass1 is not None and 0.0 <= r.pass1 <= 1.0 for r in rows)
    for lab in ("full", "tau_1e-3", "tau_3e-3", "base"):
        assert (tmp_path / "sweep" / "eval" / lab / "summary.json").is_file()
    assert not (tmp_path / "sweep" / "checkpoints").exists()  # deleted after evaluation by default
