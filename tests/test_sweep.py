"""`esreason experiment sweep` and the paper's debiased smoothing (appendix
"Population-Size Scaling Trajectories", table "rq3-population-checkpoints")."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from esreason.cli import main
from esreason.errors import UserError
from esreason.experiments import sweep
from esreason.experiments.smoothing import checkpoint_table, debiased_ema, residual_band

pytestmark = pytest.mark.heavy  # the fast subset (`--fast`) leaves this file out: tests/conftest.py

REPO = Path(__file__).resolve().parents[1]
DEMO = REPO / "configs" / "demo" / "es.yaml"
TINY = ["train.batch_size=4", "train.max_steps=3", "generation.max_new_tokens=40", "checkpoint.every=2",
        "eval.samples=2", "eval.ks=[1,2]", "eval.limit=2"]


def _sets(items=TINY):
    return [a for s in items for a in ("--set", s)]


# --------------------------------------------------------------------------- smoothing


def test_debiased_ema_hand_worked_beta_half():
    # beta = 0.5, x = 2, 4, 8: m = 1, 2.5, 5.25; 1 - beta^t = 0.5, 0.75, 0.875
    assert debiased_ema([2.0, 4.0, 8.0], beta=0.5).tolist() == pytest.approx([2.0, 2.5 / 0.75, 6.0], abs=1e-12)


def test_debiased_ema_paper_weight_first_values():
    x = [1.0, 0.0, 0.5]
    s = debiased_ema(x)  # beta = 0.99
    # m1 = 0.01 -> s1 = x1; m2 = 0.0099 -> 0.0099 / 0.0199; m3 = 0.009801 + 0.005 -> / (1 - 0.99^3)
    assert s[0] == pytest.approx(1.0, abs=1e-15)
    assert s[1] == pytest.approx(0.0099 / 0.0199, abs=1e-12)
    assert s[2] == pytest.approx(0.014801 / 0.029701, abs=1e-12)
    # the bias correction: a constant sequence is reproduced exactly from t = 1
    assert debiased_ema([0.7] * 50).tolist() == pytest.approx([0.7] * 50, abs=1e-12)


def test_debiased_ema_is_the_normalised_geometric_average():
    rng = np.random.default_rng(0)
    x = rng.random(40)
    s = debiased_ema(x, 0.9)
    for t in (1, 7, 40):
        w = 0.9 ** np.arange(t - 1, -1, -1)
        assert s[t - 1] == pytest.approx(float((w * x[:t]).sum() / w.sum()), rel=1e-12)
    with pytest.raises(ValueError):
        debiased_ema(x, 1.0)


def test_residual_band_local_std_centred_window():
    x = np.array([0.0, 1.0, 0.0, 1.0, 5.0])
    s = np.zeros(5)
    band = residual_band(x, s, window=3)
    expected = [np.std([0, 1]), np.std([0, 1, 0]), np.std([1, 0, 1]), np.std([0, 1, 5]), np.std([1, 5])]
    assert band.tolist() == pytest.approx(expected)
    assert residual_band(x, s, window=1).tolist() == [0.0] * 5


# The paper's own checkpoint table (figures/rq3_population_scaling_checkpoints.tex): smoothed
# rewards of N = 8, 16, 32, 64 at updates 100, 200, 300, per model, and its shading.
PAPER = {
    "0.5B": [[0.4782, 0.5021, 0.5100, 0.5085], [0.4614, 0.4995, 0.5180, 0.5201], [0.4421, 0.4935, 0.5253, 0.5287]],
    "1.5B": [[0.8211, 0.8250, 0.8259, 0.8244], [0.8242, 0.8314, 0.8366, 0.8352], [0.8276, 0.8387, 0.8449, 0.8438]],
    "3B": [[0.8912, 0.8945, 0.8960, 0.8957], [0.8903, 0.8970, 0.8966, 0.8992], [0.8901, 0.9001, 0.9004, 0.9031]],
}
PAPER_SHADED = {  # (update, N) cells with \cellcolor in the paper
    "0.5B": {(100, "16"), (100, "32"), (200, "32"), (300, "32")},
    "1.5B": {(100, "8"), (100, "16"), (100, "32"), (200, "16"), (200, "32"), (300, "16"), (300, "32")},
    "3B": {(u, n) for u in (100, 200) for n in ("8", "16", "32")} | {(300, "16"), (300, "32")},
}


def _paper_trajectories(model):
    out = {}
    for j, n in enumerate(("8", "16", "32", "64")):
        series = np.full(300, np.nan)
        for i, u in enumerate((100, 200, 300)):
            series[u - 1] = PAPER[model][i][j]
        out[n] = series
    return out


@pytest.mark.parametrize("model", sorted(PAPER))
def test_checkpoint_table_reproduces_the_papers_shading(model):
    table = checkpoint_table(_paper_trajectories(model), (100, 200, 300), reference="64", tolerance=0.01)
    shaded = {(u, lab) for u in table.updates for lab in table.within(u)}
    assert shaded == PAPER_SHADED[model]
    assert not any(table.cell(u, "64").within for u in table.updates)  # the reference is never marked


def test_checkpoint_table_gaps_match_the_papers_text():
    # "the N=16-to-N=64 gap falls from 0.0352 to 0.0051 and 0.0030" (update 300)
    gaps = [checkpoint_table(_paper_trajectories(m), (300,), "64").cell(300, "16").gap for m in ("0.5B", "1.5B", "3B")]
    assert gaps == pytest.approx([0.0352, 0.0051, 0.0030], abs=1e-9)


def test_checkpoint_table_short_runs_and_renderings():
    smoothed = {"a": [0.50, 0.52, 0.53], "b": [0.51, 0.50], "ref": [0.50, 0.515, 0.60]}
    table = checkpoint_table(smoothed, (2, 3), reference="ref")
    assert table.cell(2, "a").within and table.cell(2, "b").within is False  # |0.515 - 0.50| > 0.01
    assert table.cell(3, "b").smoothed is None and table.cell(3, "b").gap is None
    assert table.cell(3, "a").gap == pytest.approx(0.07)
    md = sweep.table_markdown(table, "es.population_size")
    assert "ref (ref.)" in md and "**0.5200** ✓ (gap -0.0050)" in md and "n/a" in md
    tex = sweep.table_latex(table, "es.population_size")
    assert tex.count(r"\cellcolor{gray!25}") == 1 and r"\cellcolor{gray!25}{0.5200}" in tex
    with pytest.raises(ValueError):
        checkpoint_table(smoothed, (2,), reference="missing")


# --------------------------------------------------------------------------- planning / validation


def test_spec_flags_override_the_sweep_section():
    section = {"param": "es.shaping", "values": ["zscore", "none"], "reference": "zscore", "checkpoints": [5, 10]}
    spec = sweep.make_spec(section, values="none,rank,zscore", checkpoints="2,4")
    assert spec.param == "es.shaping" and spec.values == ("none", "rank", "zscore")
    assert spec.checkpoints == (2, 4) and spec.reference == "zscore"
    with pytest.raises(UserError, match="sweep.bogus"):
        sweep.make_spec({"param": "es.sigma", "values": [1], "bogus": 1})
    with pytest.raises(UserError, match="--checkpoints"):
        sweep.make_spec(section, checkpoints="10,5")


def test_plan_rejects_bad_values_params_and_checkpoints(tmp_path):
    base, _ = sweep.load_sweep_config(DEMO)
    spec = sweep.make_spec({}, param="es.estimator", values="one_point,two_point", checkpoints="5")
    odd = sweep.load_sweep_config(DEMO, ["es.population_size=15"])[0]
    with pytest.raises(UserError, match=r"es.estimator=two_point.*es.population_size"):
        sweep.plan_sweep(odd, spec, tmp_path)
    with pytest.raises(UserError, match="config section"):
        sweep.plan_sweep(base, sweep.make_spec({}, param="es", values="1", checkpoints="5"), tmp_path)
    with pytest.raises(UserError, match="beyond train.max_steps=30"):
        sweep.plan_sweep(base, sweep.make_spec({}, param="es.sigma", values="1e-3,2e-3"), tmp_path)
    with pytest.raises(UserError, match="given twice"):
        sweep.plan_sweep(base, sweep.make_spec({}, param="es.sigma", values="0.001,1e-3", checkpoints="5"), tmp_path)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("path", sorted((REPO / "configs" / "sweeps").glob("*/*.yaml")), ids=lambda p: p.stem)
def test_shipped_sweep_configs_validate(path, tmp_path):
    base, section = sweep.load_sweep_config(path)
    plan = sweep.plan_sweep(base, sweep.make_spec(section), tmp_path)
    assert len(plan.points) >= 2 and plan.reference in [p.label for p in plan.points]
    if path.parent.name == "gpu":
        assert all(p.cfg.device == "cuda" and p.cfg.model.startswith("Qwen/") for p in plan.points)
    else:
        assert all(p.cfg.device == "cpu" and p.cfg.model == "demo" for p in plan.points)


def test_shipped_sweeps_cover_the_papers_studies():
    specs = {p.stem: sweep.make_spec(sweep.load_sweep_config(p)[1])
             for p in (REPO / "configs" / "sweeps" / "demo").glob("*.yaml")}
    params = {s.param: s for s in specs.values()}
    assert params["es.population_size"].values == (8, 16, 32, 64) and params["es.population_size"].reference == 64
    assert set(params["es.shaping"].values) == {"zscore", "none"}
    assert set(params["es.estimator"].values) == {"one_point", "two_point"}
    assert params["es.estimator"].heldout_suite == "demo-heldout"


# --------------------------------------------------------------------------- the command


def test_bad_value_exits_2_before_training(tmp_path, capsys):
    out = tmp_path / "sweep"
    rc = main(["experiment", "sweep", "--config", str(DEMO), "--param", "es.population_size", "--values", "4,1",
               "--output", str(out), "--checkpoints", "2", "--no-progress", *_sets()])
    assert rc == 2
    err = capsys.readouterr().err
    assert "es.population_size=1" in err and "must be >= 2" in err
    assert not out.exists()


@pytest.fixture(scope="module")
def finished_sweep(tmp_path_factory):
    out = tmp_path_factory.mktemp("sweep") / "pop"
    argv = ["experiment", "sweep", "--config", str(DEMO), "--param", "es.population_size", "--values", "2,4",
            "--reference", "4", "--checkpoints", "1,3", "--heldout-suite", "demo-heldout", "--band-window", "3",
            "--output", str(out), "--no-progress", *_sets()]
    assert main(argv) == 0
    return out, argv


def test_sweep_writes_runs_table_plot_and_json(finished_sweep):
    out, _ = finished_sweep
    data = json.loads((out / "sweep.json").read_text())
    assert data["values"] == ["2", "4"] and data["reference"] == "4"
    for label in ("2", "4"):
        run = out / "runs" / f"es.population_size={label}"
        rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        raw = [r["reward/mean"] for r in rows if "reward/mean" in r]
        assert len(raw) == 3 and data["runs"][label]["status"] == "trained"
        traj = data["trajectories"][label]
        assert traj["raw"] == raw
        assert traj["smoothed"] == pytest.approx(debiased_ema(raw).tolist(), abs=1e-12)
        assert traj["smoothed"][0] == raw[0]
        assert (run / "eval" / "demo-heldout" / "summary.json").is_file()
    cells = {r["update"]: r for r in data["table"]["rows"]}
    assert set(cells) == {1, 3}
    ref3, v3 = cells[3]["4"]["smoothed"], cells[3]["2"]["smoothed"]
    assert cells[3]["2"]["gap"] == pytest.approx(ref3 - v3)
    assert cells[3]["2"]["within"] == (abs(ref3 - v3) <= 0.01)
    assert cells[3]["4"]["within"] is False  # the reference itself is never marked
    assert (out / "trajectories.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "4 (ref.)" in (out / "table.md").read_text()
    assert r"\begin{tabular}" in (out / "table.tex").read_text()
    held = (out / "heldout.md").read_text()
    assert "demo-sub" in held and "demo-sub3" in held and "pass@1" in held
    assert {h["task"] for h in data["heldout"]} >= {"demo-sub", "demo-sub3"}


def test_rerun_skips_finished_and_resumes_partial(finished_sweep):
    out, argv = finished_sweep
    runs = out / "runs"
    before = {p: p.stat().st_mtime_ns for p in runs.glob("*/metrics.jsonl")}
    first = json.loads((out / "sweep.json").read_text())["trajectories"]["4"]["raw"]
    partial = runs / "es.population_size=4"
    # as if killed during update 3: no marker, no step_3 checkpoint -> resumed from step_2
    (partial / sweep.DONE_FILE).unlink()
    shutil.rmtree(partial / "checkpoints" / "step_3")
    assert main(argv) == 0
    assert (partial / "checkpoints" / "step_3" / "COMPLETE").is_file()
    data = json.loads((out / "sweep.json").read_text())
    assert data["runs"]["2"]["status"] == "skipped" and data["runs"]["4"]["status"] == "resumed"
    skipped = runs / "es.population_size=2" / "metrics.jsonl"
    assert skipped.stat().st_mtime_ns == before[skipped]
    assert data["trajectories"]["4"]["raw"] == first  # same seeds => the resumed run ends identical


def test_finished_run_with_another_config_is_refused(finished_sweep, capsys):
    out, argv = finished_sweep
    changed = [a if a != "generation.max_new_tokens=40" else "generation.max_new_tokens=41" for a in argv]
    assert main(changed) == 2
    assert "generation.max_new_tokens" in capsys.readouterr().err
