"""Multi-seed experiments: the two-level bootstrap over training seeds and problems against hand
computations on small fixed tables, the probability of improvement, and a two-seed experiment
file end to end on the embedded default (tiny sizes)."""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pytest
import yaml

from esreason.config import ConfigError
from esreason.report.hierarchical import (
    draw_counts,
    grid_means,
    probability_of_improvement,
    replicate_differences,
    two_level_interval,
    variance_text,
)
from esreason.report.stats import bootstrap_task_average

pytestmark = pytest.mark.heavy  # the fast subset (`--fast`) leaves this file out: tests/conftest.py

# Two training seeds x two problems. Seed 0 solves problem 0 only, seed 1 solves both.
X = np.array([[1.0, 0.0],
              [1.0, 1.0]])


def test_one_replicate_is_the_mean_of_the_drawn_seeds_times_drawn_problems():
    x = np.array([[1.0, 0.0, 1.0],
                  [0.0, 0.0, 1.0]])
    w = draw_counts(np.array([[1, 1]]), 2)  # seed 1 drawn twice
    v = draw_counts(np.array([[0, 2, 2]]), 3)  # problem 0 once, problem 2 twice
    assert w.tolist() == [[0.0, 2.0]] and v.tolist() == [[1.0, 0.0, 2.0]]
    # by hand: rows (seed 1, seed 1) x columns (p0, p2, p2) = [[0, 1, 1], [0, 1, 1]] -> 4 / 6
    assert grid_means(x, w, v)[0] == pytest.approx(4 / 6)
    # an unknown cell (NaN) leaves numerator and denominator: seed 0 x (p0, p1 unknown) -> 1 / 1
    x_nan = np.array([[1.0, np.nan]])
    assert grid_means(x_nan, np.ones((1, 1)), np.array([[1.0, 1.0]]))[0] == 1.0


def test_two_level_replicates_follow_the_hand_enumerated_distribution():
    # Seeds drawn: w = (2,0) 1/4, (1,1) 1/2, (0,2) 1/4; problems likewise. The replicate mean
    # w^T X v / 4 is 1 with probability 7/16, 0.75 with 4/16, 0.5 with 4/16 and 0 with 1/16
    # (worked out case by case in docs/report.md's "Intervals over training seeds").
    reps = replicate_differences({"t": X}, None, False, resamples=20000, seed=3)
    freq = Counter(np.round(reps, 6).tolist())
    expected = {1.0: 7 / 16, 0.75: 4 / 16, 0.5: 4 / 16, 0.0: 1 / 16}
    assert set(freq) == set(expected)
    for value, p in expected.items():
        assert freq[value] / reps.size == pytest.approx(p, abs=0.015), value
    assert reps.mean() == pytest.approx(0.75, abs=0.01)  # the point estimate, X.mean()
    # P(0) = 1/16 > 2.5 %: the 95 % interval is [0, 1]; over problems only (seed 0 alone: 1, 0) it is
    # [0, 1] as well, but seed 1 alone (1, 1) gives [1, 1]: only the seed level brings in seed 0.
    assert two_level_interval({"t": X}, resamples=20000, seed=3) == (0.0, 1.0)
    assert two_level_interval({"t": X[1]}, resamples=2000, seed=3) == (1.0, 1.0)


def test_one_seed_is_exactly_the_problem_only_bootstrap():
    # The crossed bootstrap with one seed on both sides resamples problems only (the same draws as a
    # direct problem bootstrap with problem_indices). The report itself uses the chunked resampler of
    # esreason.report.resample there; both estimate the same interval.
    from esreason.report.hierarchical import problem_indices

    rng = np.random.default_rng(0)
    per_task = {"a": rng.random(7), "b": rng.random(5)}
    base = {"a": rng.random(7), "b": rng.random(5)}
    diff = {t: per_task[t] - base[t] for t in per_task}
    reps = replicate_differences(per_task, base, False, 500, 11)
    direct = np.mean([diff[t][problem_indices(11, t, diff[t].size, 500)].mean(1) for t in diff], axis=0)
    assert reps == pytest.approx(direct, abs=1e-12)
    ours = bootstrap_task_average(diff, 0.95, 50_000, 11)
    assert ours == pytest.approx(two_level_interval(per_task, base, resamples=20_000, seed=11), abs=0.01)


def test_pairing_by_seed_uses_one_seed_draw_for_both_methods():
    a = np.array([[0.9, 0.8, 0.7], [0.3, 0.2, 0.1]])  # seed 0 strong, seed 1 weak
    b = a - 0.1  # the same seeds, uniformly 0.1 lower
    paired = replicate_differences({"t": a}, {"t": b}, True, 2000, 0)
    unpaired = replicate_differences({"t": a}, {"t": b}, False, 2000, 0)
    # Paired: the seed effect cancels, every replicate is exactly 0.1.
    assert np.allclose(paired, 0.1)
    # Unpaired: the seed draws differ between the sides, so the seed spread enters the interval.
    assert unpaired.std() > 0.1
    # paired A - B is the two-level bootstrap of the table of differences
    d = replicate_differences({"t": a - b}, None, False, 2000, 0)
    assert np.allclose(paired, d)


def test_probability_of_improvement_by_hand():
    # one seed: p0 1 > 0 (1), p1 tie (1/2) -> 0.75; two seeds of A vs one of B on a second task:
    # (s0,p0) 1 > .5, (s0,p1) tie, (s1,p0) 0 < .5, (s1,p1) tie -> (1 + .5 + 0 + .5) / 4 = 0.5;
    # tasks weigh equally -> 0.625
    a = {"x": np.array([[1.0, 0.0]]), "y": np.array([[1.0, 0.5], [0.0, 0.5]])}
    b = {"x": np.array([[0.0, 0.0]]), "y": np.array([[0.5, 0.5]])}
    value, lo, hi = probability_of_improvement({"x": a["x"]}, {"x": b["x"]}, resamples=0)
    assert (value, lo, hi) == (0.75, None, None)
    b2 = {"x": b["x"], "y": b["y"]}
    a2 = {"x": np.array([[1.0, 0.0], [1.0, 0.0]]), "y": a["y"]}  # x: both seeds as the single one
    value, lo, hi = probability_of_improvement(a2, b2, resamples=2000, seed=1)
    assert value == pytest.approx(0.625)
    assert lo <= value <= hi and 0.0 <= lo and hi <= 1.0
    # equal methods: exactly 0.5 whatever the draw
    value, lo, hi = probability_of_improvement(a2, a2, paired_seeds=True, resamples=200)
    assert value == pytest.approx(0.5) and lo == pytest.approx(0.5) and hi == pytest.approx(0.5)


def test_variance_text_names_the_source():
    assert variance_text(1, [256, 256]) == "1 training seed: evaluation noise only"
    assert variance_text(3, [256, 256, 256]) == "3 training seeds × 256 problems per task"
    assert variance_text(2, [100]) == "2 training seeds × 100 problems"
    assert variance_text(2, [100, 120]) == "2 training seeds × 100–120 problems per task"


@pytest.mark.parametrize("value, needle", [([], "non-empty list"), ([0, 0], "listed twice"), (["a"], "integers"),
                                           ([-1], "integers >= 0"), (True, "integers")])
def test_bad_seeds_are_refused(value, needle):
    from test_experiments import spec_data

    from esreason.experiments.spec import parse_spec

    with pytest.raises(ConfigError, match=needle):
        parse_spec(spec_data(seeds=value))


def test_seeds_set_train_seed_of_every_stage_config():
    from test_experiments import spec_data

    from esreason.experiments.spec import parse_spec

    spec = parse_spec(spec_data(methods=["base", "es", "grpo"], seeds=[3, 5]))
    assert spec.seeds == (3, 5)
    one = spec.with_seed(5)
    assert one.es.train.seed == one.grpo.train.seed == 5 and spec.es.train.seed == 0
    assert parse_spec(spec_data()).seeds is None


# --------------------------------------------------------------------------- sweeps with seeds


def test_a_sweep_with_seeds_plans_one_run_per_value_and_seed_and_averages_rewards(tmp_path):
    from pathlib import Path

    from esreason.errors import UserError
    from esreason.experiments import sweep

    demo = Path(__file__).resolve().parents[1] / "configs" / "demo" / "es.yaml"
    base, _ = sweep.load_sweep_config(demo)
    spec = sweep.make_spec({"seeds": [0, 1]}, param="es.population_size", values="8,16", checkpoints="2")
    plan = sweep.plan_sweep(base, spec, tmp_path)
    assert [(p.key, p.cfg.train.seed) for p in plan.points] == [
        ("8/seed0", 0), ("8/seed1", 1), ("16/seed0", 0), ("16/seed1", 1)]
    assert plan.points[1].run_dir == tmp_path / "runs" / "es.population_size=8" / "seed1"
    assert sweep.make_spec({}, param="es.sigma", values="1e-3", seeds="2,5").seeds == (2, 5)
    _, section = sweep.load_sweep_config(demo, ["sweep.seeds=[4,6]", "train.max_steps=3"])
    assert sweep.make_spec({**section, "param": "es.sigma", "values": [1e-3]}).seeds == (4, 6)
    with pytest.raises(UserError, match="--seeds"):
        sweep.make_spec({}, param="es.sigma", values="1e-3", seeds="1,1")
    raws = {"8/seed0": np.array([0.0, 1.0]), "8/seed1": np.array([1.0, 1.0]),
            "16/seed0": np.array([0.5, 0.5]), "16/seed1": np.array([0.5, 0.5])}
    trajs, per_seed = sweep.seed_mean_trajectories(plan, raws)
    assert trajs["8"].raw.tolist() == [0.5, 1.0] and len(per_seed["8"]) == 2
    with pytest.raises(UserError, match="different numbers of updates"):
        sweep.seed_mean_trajectories(plan, {**raws, "16/seed1": np.array([0.5])})


# --------------------------------------------------------------------------- end to end


@pytest.fixture(scope="module")
def two_seeds(tmp_path_factory):
    """A two-seed experiment file (Base, GRPO, ES; 2 updates; 4 problems x 4 samples per task) run
    through the CLI with ``--set seeds=[0,1]``, report included."""
    from test_experiments import spec_data

    from esreason.cli import main

    from test_experiments import ES

    root = tmp_path_factory.mktemp("seeds")
    es = {**ES, "generation": {"max_new_tokens": 40}}  # long enough to answer: rewards differ, ES moves
    data = spec_data(methods=["base", "grpo", "es"], configs={"es": es, "grpo": spec_data()["configs"]["grpo"]},
                     eval={"in_domain": ["demo-add"], "held_out": ["demo-sub"], "samples": 4, "ks": [1, 2, 4],
                           "max_new_tokens": 40, "limit": 4, "ci_resamples": 200})
    (root / "exp.yaml").write_text(yaml.safe_dump(data))
    out = root / "exp"
    rc = main(["experiment", "run", str(root / "exp.yaml"), "--set", "seeds=[0,1]", "--output", str(out),
               "--no-progress"])
    return out, rc


def test_two_seed_experiment_trains_each_method_per_seed_and_base_once(two_seeds):
    out, rc = two_seeds
    assert rc == 0
    record = json.loads((out / "experiment.json").read_text())
    assert record["seeds"] == [0, 1] and list(record["methods"]) == ["base", "grpo", "es"]
    assert record["methods"]["base"]["eval"] == "eval/base" and "seeds" not in record["methods"]["base"]
    for m in ("grpo", "es"):
        seeds = record["methods"][m]["seeds"]
        assert sorted(seeds) == ["0", "1"]
        for s in ("0", "1"):
            assert seeds[s]["eval"] == f"eval/{m}/seed{s}"
            assert (out / "runs" / m / f"seed{s}" / "done.json").is_file()
            assert (out / seeds[s]["eval"] / "summary.json").is_file()
        assert seeds["0"]["sha256_tensors"] != seeds["1"]["sha256_tensors"]  # another seed, another model
        cfg = yaml.safe_load((out / "runs" / m / "seed1" / "config.yaml").read_text())
        assert cfg["train"]["seed"] == 1
    assert not (out / "runs" / "base").exists()


def test_two_seed_report_pools_seeds_and_names_the_variance_of_every_verdict(two_seeds):
    from esreason.report.load import load_experiment
    from esreason.report.stats import paired_difference

    out, _ = two_seeds
    report = json.loads((out / "report" / "report.json").read_text())
    interval_findings = [f for f in report["findings"] if f["id"] not in ("pareto_added", "entropy")]
    assert interval_findings
    for f in interval_findings:
        if f["verdict"] != "not tested":
            assert f["variance"].startswith("2 training seeds × 4 problems"), f  # (per task): several tasks
    exp = load_experiment(out)
    # the pooled value is the mean of the seeds' values, the per-seed column each seed's own
    f = next(f for f in report["findings"] if f["id"] == "es_improves_pass1")
    per_seed = [p["diff"]["value"] for p in f["per_seed"]]
    assert [p["seed"] for p in f["per_seed"]] == ["0", "1"]
    assert f["values"]["diff"]["value"] == pytest.approx(np.mean(per_seed), abs=1e-12)
    assert f["probability"] is not None and 0.0 <= f["probability"]["value"] <= 1.0
    d = paired_difference(exp, "es", "base", exp.tasks, "pass@1")
    assert d.low <= d.value <= d.high
    md = (out / "report" / "report.md").read_text()
    for needle in ("seed-level t-intervals", "training seeds: GRPO: 0, 1; ES: 0, 1", "Per seed",
                   "P(improvement)", "2 training seeds × 4 problems per task", "never between independently trained",
                   "estimand: ", "Holm", "family-wise", "exact distribution"):
        assert needle in md, needle
    pareto = next(p for p in report["pareto"] if p["key"] == "__average__")
    assert len(pareto["seed_points"]["es"]) == 2 and "base" not in pareto["seed_points"]
    assert (out / "report" / "pareto.png").is_file() and (out / "report" / "passk_profiles.png").is_file()


def test_one_seed_verdicts_say_evaluation_noise_only(tmp_path):
    from test_report import write_experiment

    from esreason.report import build_report

    result = build_report(write_experiment(tmp_path / "exp"), figures=False)
    tested = [f for f in result.findings if f.id not in ("pareto_added", "entropy") and f.verdict != "not tested"]
    assert tested and all(f.variance == "1 training seed: evaluation noise only" for f in tested)
    assert all(not f.per_seed and f.probability is None for f in result.findings)
    assert "evaluation noise only" in result.files["markdown"].read_text()


def test_an_experiment_directory_refuses_to_switch_between_one_run_and_seeds(tmp_path):
    from test_experiments import spec_data

    from esreason.errors import UserError
    from esreason.experiments.runner import SPEC_FILE, _plain, check_same_spec
    from esreason.experiments.spec import parse_spec

    seeded = parse_spec(spec_data(seeds=[0, 1]))
    (tmp_path / SPEC_FILE).write_text(yaml.safe_dump(_plain(seeded.raw)))
    check_same_spec(tmp_path, parse_spec(spec_data(seeds=[0, 1, 2])))  # adding a seed is fine
    with pytest.raises(UserError, match="with the key 'seeds'"):
        check_same_spec(tmp_path, parse_spec(spec_data()))


def test_rerunning_a_two_seed_experiment_trains_nothing(two_seeds, monkeypatch):
    from esreason.experiments import runner, sequence
    from esreason.experiments.spec import load_spec

    out, _ = two_seeds
    stamps = {p: p.stat().st_mtime_ns for p in (out / "runs").rglob("done.json")}
    assert len(stamps) == 4  # (grpo, es) x (seed 0, seed 1)
    monkeypatch.setattr(sequence, "train_method", lambda *a, **k: pytest.fail("trained again"))
    monkeypatch.setattr(runner, "_evaluate", lambda *a, **k: 0.0)
    spec = load_spec(out.parent / "exp.yaml", ["seeds=[0,1]"])
    record = runner.run_experiment(spec, out, progress=False, report=False, log=lambda *_: None).record
    assert {p: p.stat().st_mtime_ns for p in (out / "runs").rglob("done.json")} == stamps
    assert sorted(record["methods"]["es"]["seeds"]) == ["0", "1"]
