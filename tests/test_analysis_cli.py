"""``esreason analyze ...`` end to end on small ES checkpoints: tables, JSON, PNG, bad input.

The checkpoints come from real (tiny) ES runs on the embedded default in bf16 without
master weights, the paper's numeric setting: the restore ablation (exact vs
subtract-to-restore, plus alpha = 0 controls) runs once per module and its endpoints
feed the other commands.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from esreason.analysis.command import register
from esreason.errors import UserError

pytestmark = pytest.mark.heavy  # the fast subset (`--fast`) leaves this file out: tests/conftest.py

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def cli(argv: list[str], capsys) -> tuple[int, str]:
    """Parse with the ``analyze`` parser and dispatch, mapping UserError to exit 2 like esreason.cli."""
    parser = argparse.ArgumentParser(prog="esreason")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    try:
        rc = args.func(args)
    except UserError as exc:
        return 2, str(exc)
    return rc, capsys.readouterr().out


ABLATION_SETTINGS = ["model=demo", "task=demo-add", "train.limit=8", "train.batch_size=4",
                     "es.population_size=4", "generation.max_new_tokens=48", "dtype=bfloat16",
                     "es.master_weights=none"]


@pytest.fixture(scope="module")
def ablation(tmp_path_factory):
    """`analyze restore-ablation --with-null` on the embedded default: 4 tiny ES runs, same seeds."""
    out = tmp_path_factory.mktemp("ablation") / "abl"
    argv = ["analyze", "restore-ablation", "--steps", "2", "--out", str(out), "--with-null", "--topk", "20",
            "--no-progress"]
    for item in ABLATION_SETTINGS:
        argv += ["--set", item]
    parser = argparse.ArgumentParser(prog="esreason")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    assert args.func(args) == 0
    return out


@pytest.fixture(scope="module")
def es_pair(ablation):
    """(base in bf16, ES endpoint with exact restore, ES endpoint with subtract-to-restore)."""
    payload = json.loads((ablation / "restore_ablation.json").read_text())
    v = payload["variants"]
    return Path(payload["base"]), Path(v["exact"]["final_checkpoint"]), Path(v["subtract"]["final_checkpoint"])


def direct_drift(base: Path, tuned: Path) -> tuple[float, int, int]:
    """Relative L2, changed and total coordinates computed straight from the full tensors."""
    b = load_file(str(base / "model.safetensors"))
    t = load_file(str(tuned / "model.safetensors"))
    assert set(b) == set(t)
    sq = sum(float(((t[k].double() - b[k].double()) ** 2).sum()) for k in b)
    sqb = sum(float((b[k].double() ** 2).sum()) for k in b)
    changed = sum(int((t[k] != b[k]).sum()) for k in b)
    return (sq / sqb) ** 0.5, changed, sum(v.numel() for v in b.values())


def assert_outputs(out: Path, name: str, pngs: list[str]) -> dict:
    for ext in ("md", "tex", "json"):
        assert (out / f"{name}.{ext}").stat().st_size > 0
    assert "\\begin{tabular}" in (out / f"{name}.tex").read_text()
    for p in pngs:
        assert (out / p).read_bytes()[:8] == PNG_MAGIC
    return json.loads((out / f"{name}.json").read_text())


def test_restore_ablation(ablation, es_pair):
    payload = assert_outputs(ablation, "restore_ablation", ["restore_ablation_hist.png",
                                                            "restore_ablation_categories.png"])
    res = payload["results"]
    assert set(res) == {"exact", "subtract", "exact-alpha0", "subtract-alpha0"}
    # exact restore with alpha = 0 never moves: bit-identical to the base
    assert res["exact-alpha0"]["drift"]["num_changed"] == 0
    assert res["exact-alpha0"]["drift"]["relative_l2"] == 0.0
    # subtract-to-restore with alpha = 0 moves the weights: pure restore error, all of it lattice steps
    sub0 = res["subtract-alpha0"]
    assert sub0["drift"]["num_changed"] > 0
    assert sub0["rounding"]["single_ulp_share"] > 0.5
    # ... and the largest of those steps sit on normalization gains (values near 1 have the largest ulps)
    loc0 = sub0["localization"]
    assert loc0["num_at_max"] > 0 and loc0["at_max_by_group"]["normalization"] == loc0["num_at_max"]
    # same seeds, both restores: the endpoints differ
    base, exact, subtract = es_pair
    rel, changed, _ = direct_drift(exact, subtract)
    assert changed > 0 and payload["endpoint_distance"]["drift"]["num_changed"] == changed
    assert payload["endpoint_distance"]["drift"]["relative_l2"] == pytest.approx(rel, rel=1e-12)
    assert res["exact"]["drift"]["relative_l2"] == pytest.approx(direct_drift(base, exact)[0], rel=1e-12)
    assert payload["notes"] == []  # bf16 without master weights: the artifact's setting
    md = (ablation / "restore_ablation.md").read_text()
    assert "subtract-alpha0" in md and "Distance between the subtract and exact endpoints" in md


def test_restore_ablation_refuses_a_used_directory_and_restore_override(ablation, capsys):
    rc, msg = cli(["analyze", "restore-ablation", "--steps", "1", "--out", str(ablation)], capsys)
    assert rc == 2 and "not empty" in msg
    rc, msg = cli(["analyze", "restore-ablation", "--steps", "1", "--out", str(ablation.parent / "new"),
                   "--set", "es.restore=exact"], capsys)
    assert rc == 2 and "es.restore" in msg
    rc, msg = cli(["analyze", "restore-ablation", "--steps", "0", "--out", str(ablation.parent / "new2")], capsys)
    assert rc == 2 and "--steps" in msg


def test_drift_command(es_pair, tmp_path, capsys):
    base, a, b = es_pair
    rc, out = cli(["analyze", "drift", "--base", str(base), "--tuned", str(a), "--tuned-ref", str(b),
                   "--label", "ES", "--ref-label", "ES-subtract", "--taus", "2.5e-4,1e-3,1.5e-2",
                   "--out", str(tmp_path / "d"), "--json", "--no-progress"], capsys)
    assert rc == 0
    payload = json.loads(out)
    rel, changed, total = direct_drift(base, a)
    assert payload["relative_l2"] == pytest.approx(rel, rel=1e-12)
    assert payload["num_changed"] == changed and payload["num_coordinates"] == total
    assert set(payload["s_tau"]) == {"2.5e-4", "1e-3", "1.5e-2"}
    assert all(0.0 <= v <= 1.0 for v in payload["s_tau"].values())
    rel_b, _, _ = direct_drift(base, b)
    assert payload["ratio_to_reference"] == pytest.approx(rel / rel_b, rel=1e-12)
    assert payload["tied_weights_counted_once"] == {}  # save_pretrained stores the tied embedding once
    disk = assert_outputs(tmp_path / "d", "drift", ["drift_hist.png"])
    assert disk["relative_l2"] == payload["relative_l2"]
    md = (tmp_path / "d" / "drift.md").read_text()
    assert "ES-subtract" in md and f"({payload['ratio_to_reference']:.3g}×)" in md


def test_localize_command(es_pair, tmp_path, capsys):
    base, a, b = es_pair
    rc, out = cli(["analyze", "localize", "--base", str(base), "--tuned", str(a), "--tuned-ref", str(b),
                   "--topk", "25", "--out", str(tmp_path / "l"), "--no-progress"], capsys)
    assert rc == 0 and "Maximum and top-k updates" in out
    payload = assert_outputs(tmp_path / "l", "localize", ["localize_categories.png"])
    bt, at = load_file(str(base / "model.safetensors")), load_file(str(a / "model.safetensors"))
    mx = max(float((at[k].double() - bt[k].double()).abs().max()) for k in bt)
    n_at_max = sum(int(((at[k].double() - bt[k].double()).abs() == mx).sum()) for k in bt)
    assert payload["max_abs_update"] == mx and payload["num_at_max"] == n_at_max
    assert len(payload["top"]) == 25
    assert payload["top"][0]["abs_delta"] == mx
    assert all("lattice_steps" in e and e["lattice_steps"] >= 1 for e in payload["top"])
    assert payload["max_abs_ratio_to_reference"] == pytest.approx(mx / payload["reference"]["max_abs_update"])


def test_rounding_command(es_pair, tmp_path, capsys):
    base, a, _ = es_pair
    rc, out = cli(["analyze", "rounding", "--base", str(base), "--tuned", str(a), "--out", str(tmp_path / "r"),
                   "--json", "--no-progress"], capsys)
    assert rc == 0
    payload = json.loads(out)
    _, changed, _ = direct_drift(base, a)
    assert payload["dtypes"] == ["BF16"] and payload["changed"] == changed
    assert sum(payload["lattice_distance"].values()) == changed
    assert payload["single_ulp_share"] == payload["lattice_distance"]["1"] / changed
    assert_outputs(tmp_path / "r", "rounding", ["rounding_lattice.png"])


def test_rounding_needs_matching_low_precision_dtypes(es_pair, capsys):
    from esreason.embedded import demo_model_dir

    _, a, _ = es_pair  # fp32 demo vs bf16 tuned
    rc, msg = cli(["analyze", "rounding", "--base", str(demo_model_dir()), "--tuned", str(a), "--no-progress",
                   "--out", "unused"], capsys)
    assert rc == 2 and "same floating dtype" in msg


def test_threshold_command_and_sweep(es_pair, tmp_path, capsys):
    base, a, _ = es_pair
    rc, out = cli(["analyze", "threshold", "--base", str(base), "--tuned", str(a), "--tau", "5e-3",
                   "--out", str(tmp_path / "ck"), "--json"], capsys)
    assert rc == 0
    stats = json.loads(out)
    from transformers import AutoModelForCausalLM

    AutoModelForCausalLM.from_pretrained(tmp_path / "ck")
    assert stats["update_sparsity"] == pytest.approx(
        json.loads((tmp_path / "ck" / "threshold.json").read_text())["update_sparsity"])
    rc, out = cli(["analyze", "threshold", "--base", str(base), "--tuned", str(a), "--sweep", "2.5e-4,5e-3",
                   "--tasks", "demo-add", "--limit", "2", "--samples", "2", "--max-new-tokens", "48",
                   "--bootstrap", "0", "--batch-size", "8", "--out", str(tmp_path / "sw"), "--no-progress"], capsys)
    assert rc == 0 and "Base Model" in out
    payload = assert_outputs(tmp_path / "sw", "threshold_sweep", ["threshold_sweep.png"])
    rows = payload["rows"]
    assert [r["label"] for r in rows] == ["Full ES", "2.5e-4", "5e-3", "Base Model"]
    assert rows[2]["update_sparsity"] == pytest.approx(stats["update_sparsity"])
    assert rows[0]["delta_vs_full_es"] == 0.0 and rows[-1]["delta_vs_full_es"] is None


def test_bad_input_is_a_one_line_error(es_pair, tmp_path, capsys):
    base, a, _ = es_pair
    for taus in ("0", "-1e-3", "1e-3,abc"):
        rc, msg = cli(["analyze", "drift", "--base", str(base), "--tuned", str(a), f"--taus={taus}",
                       "--out", str(tmp_path / "x")], capsys)
        assert rc == 2 and ("> 0" in msg or "not a number" in msg)
    rc, msg = cli(["analyze", "threshold", "--base", str(base), "--tuned", str(a), "--tau=-1e-3",
                   "--out", str(tmp_path / "y")], capsys)
    assert rc == 2 and "> 0" in msg
    rc, msg = cli(["analyze", "threshold", "--base", str(base), "--tuned", str(a), "--out", str(tmp_path / "y")],
                  capsys)
    assert rc == 2 and "exactly one of --tau" in msg
    rc, msg = cli(["analyze", "threshold", "--base", str(base), "--tuned", str(a), "--tau", "1e-3,2e-3",
                   "--out", str(tmp_path / "y")], capsys)
    assert rc == 2 and "use --sweep" in msg
    rc, msg = cli(["analyze", "drift", "--base", str(base), "--tuned", str(a), "--tuned-ref", str(a),
                   "--label", "x", "--ref-label", "x", "--out", str(tmp_path / "y")], capsys)
    assert rc == 2 and "must differ" in msg
    # a checkpoint of another architecture: the error names the first differing tensor
    import shutil

    from safetensors.torch import save_file

    sd = load_file(str(base / "model.safetensors"))
    missing = tmp_path / "missing"
    shutil.copytree(base, missing)
    save_file({k: v for k, v in sd.items() if k != "model.norm.weight"}, str(missing / "model.safetensors"))
    rc, msg = cli(["analyze", "drift", "--base", str(base), "--tuned", str(missing), "--out", str(tmp_path / "z")],
                  capsys)
    assert rc == 2 and "'model.norm.weight' is in base" in msg
    reshaped = tmp_path / "reshaped"
    shutil.copytree(base, reshaped)
    sd["model.norm.weight"] = torch.cat([sd["model.norm.weight"], sd["model.norm.weight"]])
    save_file(sd, str(reshaped / "model.safetensors"))
    rc, msg = cli(["analyze", "localize", "--base", str(base), "--tuned", str(reshaped), "--out",
                   str(tmp_path / "z")], capsys)
    assert rc == 2 and "'model.norm.weight' has shape" in msg


def test_wired_into_the_esreason_cli(es_pair, tmp_path, capsys):
    from esreason.cli import main

    base, a, _ = es_pair
    assert main(["analyze", "drift", "--base", str(base), "--tuned", str(a), "--taus=0", "--out",
                 str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    assert err.strip() == "esreason: error: tau must be a finite number > 0 (got 0)"
    assert main(["analyze", "drift", "--base", str(base), "--tuned", str(a), "--json", "--no-progress",
                 "--out", str(tmp_path / "y")]) == 0
    payload = json.loads(capsys.readouterr().out)
    assert set(payload["s_tau"]) == {"2.5e-4", "5e-4", "1e-3", "1.5e-3", "2e-3"}
