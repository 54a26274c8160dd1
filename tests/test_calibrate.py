"""``esreason experiment plan X --calibrate``, ``experiment run --plan`` and the report's planned vs
actual table (issue 24, item 2).

The arithmetic tests use a hand-made calibration (no run). One heavy test calibrates a shortened
experiment and runs a longer one with the plan, as a user would, and holds the two against each
other (its tolerance and why: its docstring).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from esreason.cli import main
from esreason.errors import UserError
from esreason.experiments import calibrate as cal
from esreason.experiments.spec import load_spec

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "configs" / "experiments" / "demo.yaml"
EASY = ROOT / "configs" / "experiments" / "easy.yaml"


def fake_calibration() -> cal.Calibration:
    es = cal.TrainRates(start_s=2.0, decode_s=2.5, update_s=0.5, heldout_s=1.25, checkpoint_s=0.1)
    grpo = cal.TrainRates(start_s=4.0, decode_s=1.5, update_s=0.25, heldout_s=1.0, checkpoint_s=0.2)
    ev = cal.EvalRates(start_s=3.0, call_s={"demo-add": 2.5, "demo-sub": 2.0, "demo-sub3": 1.5},
                       verify_s={"demo-add": 0.001, "demo-sub": 0.002, "demo-sub3": 0.003})
    return cal.Calibration(es=es, grpo=grpo, eval=ev, report_s=2.0, report_methods=3, machine="test",
                           seconds=60.0)


def test_calibrated_plan_prices_each_stage_with_the_runners_structure():
    """The demo: T = 20, ES held out every 5 (updates 0, 5, ..., 20: 5 evaluations), checkpoints every 10
    (2); compositions 10 + 10 (3 evaluations, 1 checkpoint each); evaluation: 256 problems per task in
    calls of 2048 // 32 = 64 problems, and a greedy call each (8 calls per task)."""
    spec = load_spec(DEMO, [])
    plan = cal.calibrated_plan(spec, fake_calibration())
    names = [s["name"] for s in plan["stages"]]
    assert names == ["eval/base", "train/grpo", "eval/grpo", "train/es", "eval/es", "train/es_grpo/stage1_es",
                     "train/es_grpo/stage2_grpo", "eval/es_grpo", "train/grpo_es/stage1_grpo",
                     "train/grpo_es/stage2_es", "eval/grpo_es", "report"]  # the table plan's names, in run order
    st = {s["name"]: s["terms_s"] for s in plan["stages"]}
    assert st["train/es"] == {"start": 2.0, "decode": 50.0, "update": 10.0, "heldout": 6.25, "checkpoint": 0.2}
    assert st["train/grpo"] == {"start": 4.0, "decode": 30.0, "train": 5.0, "heldout": 5.0, "checkpoint": 0.4}
    assert st["train/es_grpo/stage1_es"] == {"start": 2.0, "decode": 25.0, "update": 5.0, "heldout": 3.75,
                                             "checkpoint": 0.1}
    assert st["eval/base"]["decode"] == pytest.approx(8 * (2.5 + 2.0 + 1.5))
    assert st["eval/base"]["verify"] == pytest.approx(256 * (0.001 + 0.002 + 0.003), abs=0.01)
    # the report: 5 evaluated methods against the calibration's 3
    assert st["report"]["report"] == pytest.approx(2.0 * 5 / 3, abs=0.01)
    assert plan["wall_s"] == pytest.approx(sum(s["wall_s"] for s in plan["stages"]), abs=0.5)


def test_seeds_and_the_calibration_spec():
    spec = load_spec(DEMO, ["seeds=[0,1]"])
    names = [s["name"] for s in cal.calibrated_plan(spec, fake_calibration())["stages"]]
    assert "seed1/train/grpo_es/stage2_es" in names and names.count("eval/base") == 1
    short = cal.calibration_spec(spec)
    assert [m.kind for m in short.methods] == ["base", "es", "grpo"] and short.seeds is None
    assert short.updates == cal.CAL_UPDATES == short.es.train.max_steps == short.grpo.train.max_steps
    assert short.es.checkpoint.every == cal.CAL_UPDATES and short.eval.limit == 64  # one call per task
    assert short.eval.tasks == spec.eval.tasks and short.es.es == spec.es.es and short.grpo.grpo == spec.grpo.grpo


def test_calibration_gives_every_evaluation_engine_one_call_per_task(capsys):
    easy = load_spec(EASY, [])  # 8 vLLM engines: calls run side by side, one per engine
    short = cal.calibration_spec(easy)
    assert short.eval.limit == cal.problems_per_call(easy) * easy.eval.engines
    assert short.es.backend == easy.es.backend and short.grpo.grpo.use_vllm  # the experiment's own layout
    assert main(["experiment", "plan", str(DEMO)]) == 2  # neither --gpus nor --calibrate
    assert "--gpus: required" in capsys.readouterr().err


def test_run_plan_file_errors_name_the_file(tmp_path):
    from esreason.experiments.runner import read_plan

    spec = load_spec(DEMO, [])
    with pytest.raises(UserError, match="not found"):
        read_plan(str(tmp_path / "nope.json"), spec)
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(UserError, match="bad.json is not a JSON plan"):
        read_plan(str(bad), spec)
    bad.write_text(json.dumps({"experiment": "demo"}))
    with pytest.raises(UserError, match="no 'stages' list"):
        read_plan(str(bad), spec)
    bad.write_text(json.dumps({"experiment": "easy", "stages": []}))
    with pytest.raises(UserError, match="plans experiment 'easy', not 'demo'"):
        read_plan(str(bad), spec)


def test_planned_vs_actual_groups_composition_stages_and_seeds(tmp_path):
    from esreason.report import timing

    assert timing.runner_key("train/es_grpo/stage2_grpo") == "train/es_grpo"
    assert timing.runner_key("seed1/train/es") == "train/es/seed1"
    assert timing.runner_key("seed1/eval/es_grpo") == "eval/es_grpo/seed1"
    assert timing.runner_key("eval/base") == "eval/base" and timing.runner_key("report") == "report"
    plan = {"experiment": "x", "stages": [{"name": "train/es_grpo/stage1_es", "wall_s": 10.0},
                                          {"name": "train/es_grpo/stage2_grpo", "wall_s": 20.0},
                                          {"name": "eval/es_grpo", "wall_hours": 0.01}]}
    assert timing.planned_seconds(plan) == {"train/es_grpo": 30.0, "eval/es_grpo": 36.0}
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    (tmp_path / "experiment.json").write_text(json.dumps({"timings": {"train/es_grpo": 33.0, "eval/es_grpo": 27.0}}))
    headers, rows, totals = timing.comparison(tmp_path)
    assert rows[0] == ["train/es_grpo", "30.0", "33.0", "1.10"] and rows[1][3] == "0.75"
    assert totals == {"planned_s": 66.0, "actual_s": 60.0}
    md = "\n".join(timing.timing_md(tmp_path))
    assert "Planned vs actual time" in md and "train/es_grpo" in md
    assert "No plan recorded" in "\n".join(timing.timing_md(tmp_path / "elsewhere"))


# A shortened demo: ES N = 8, B = 8; GRPO 8 prompts x 4; 8 updates (the calibration runs 3); held-out
# evaluation every 4 updates; 32 problems of demo-add and demo-sub, 8 samples each (one call per task).
SHORT = ["updates=8", "methods=[base,es,grpo]", "eval.in_domain=[demo-add]", "eval.held_out=[demo-sub]",
         "eval.limit=32", "eval.samples=8", "eval.ks=[1,8]", "eval.batch_size=256", "eval.ci_resamples=50",
         "eval.max_new_tokens=32", "configs.es.es.population_size=8", "configs.es.train.batch_size=8",
         "configs.grpo.grpo.num_generations=4", "configs.grpo.grpo.micro_batch_size=32",
         "configs.grpo.train.batch_size=8", "configs.es.generation.max_new_tokens=32",
         "configs.grpo.generation.max_new_tokens=32", "configs.es.checkpoint.every=4", "configs.grpo.checkpoint.every=4",
         "configs.es.eval.every=4", "configs.es.eval.limit=8", "configs.grpo.eval.every=4", "configs.grpo.eval.limit=8",
         "report.pairs=[[demo-add,demo-sub]]"]


STAGE_SLACK_S = 1.5
"""Seconds a stage may miss its plan by regardless of the ratio (test_calibrated_plan_predicts...)."""


@pytest.mark.heavy
def test_calibrated_plan_predicts_a_longer_run_as_a_user_runs_it(tmp_path, capfd):
    """``plan --calibrate --json`` then ``experiment run --plan``, the CLI as a user calls it; the
    plan command's stdout is the JSON plan alone (``> plan.json``).

    Tolerance: every stage's actual / planned within [0.5, 2.0], or within STAGE_SLACK_S of its plan
    where that is looser, and the total within [0.67, 1.5]. Wider than the issue's idle-machine
    targets (25 % per stage, 15 % in total) because this test shares the 2 cores with another pytest
    worker whose load differs between the calibration and the run; the idle-machine comparison of
    the full demo is benchmarks/plan_vs_run.py (docs/scale.md). The absolute slack is for the
    one-second stages (the report: 1.0 s planned, 2.2 s actual once in CI while the other worker
    started its processes): there a scheduling stall of a second doubles the ratio. Structure is
    still checked: the run trains 8 updates where the calibration trained 3, so a plan that did not
    scale updates, held-out evaluations and checkpoints would miss the training stages (4-6 s) by
    about 2.5x, outside both bounds."""
    sets = [x for item in SHORT for x in ("--set", item)]
    import contextlib
    import io

    assert main(["experiment", "plan", str(DEMO), "--calibrate", "--json", *sets]) == 0
    plan = json.loads(capfd.readouterr().out)  # stdout is the plan alone (logs go to stderr)
    assert plan["calibrated"] and {s["name"] for s in plan["stages"]} == {
        "eval/base", "train/es", "eval/es", "train/grpo", "eval/grpo", "report"}
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    exp = tmp_path / "exp"
    with contextlib.redirect_stdout(io.StringIO()):
        assert main(["experiment", "run", str(DEMO), "--plan", str(tmp_path / "plan.json"), "--output", str(exp),
                     "--no-progress", *sets]) == 0
    assert json.loads((exp / "plan.json").read_text()) == plan
    from esreason.report import timing

    _, rows, totals = timing.comparison(exp)
    ratios = {r[0]: float(r[3]) for r in rows[:-1] if r[3] != "—"}
    seconds = {r[0]: (float(r[1].replace(",", "")), float(r[2].replace(",", ""))) for r in rows[:-1]
               if r[3] != "—"}  # (planned, actual) s
    print(ratios, totals)
    assert set(ratios) == {"eval/base", "train/es", "eval/es", "train/grpo", "eval/grpo", "report"}
    for stage, ratio in ratios.items():
        planned, actual = seconds[stage]
        assert 0.5 <= ratio <= 2.0 or abs(actual - planned) <= STAGE_SLACK_S, (stage, ratio, rows)
    assert 0.67 <= totals["actual_s"] / totals["planned_s"] <= 1.5, totals
    assert "Planned vs actual time" in (exp / "report" / "report.md").read_text()


def test_checkpoint_term_copies_and_hashes_every_file_and_cleans_up(tmp_path):
    a, b = tmp_path / "step_3", tmp_path / "trl" / "checkpoint-3"
    for d, n in ((a, 3), (b, 2)):
        d.mkdir(parents=True)
        for i in range(n):
            (d / f"x{i}.bin").write_bytes(bytes(range(256)) * 1000)
    work = tmp_path / "work"
    seconds = cal._checkpoint_seconds([a, b], work)
    assert seconds > 0 and not (work / "checkpoint-copy").exists()
