"""``esreason experiment plan X --calibrate``, ``experiment run --plan`` and the report's planned vs
actual table.

The arithmetic tests use a hand-made calibration or hand-made run records (no run). One heavy test
calibrates a shortened experiment and runs a longer one with the plan, as a user would, and checks
structure only: the plan's shape, that the run records the plan, that the report holds the planned
vs actual table, and that the plan scales the calibration's medians by the run's counts. No
assertion compares seconds with seconds (a test's verdict must not depend on load): that
comparison is benchmarks/plan_vs_run.py.
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
                     "train/grpo_es/stage2_es", "eval/grpo_es", "offtask", "report"]  # the table plan's names, in run order
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
    # several held-out samples (updates 0, 2, 4, 6) of the configured held-out protocol
    assert short.es.eval.every == short.grpo.eval.every == cal.HELDOUT_EVERY == 2
    assert short.es.eval.limit == spec.es.eval.limit and short.es.eval.samples == spec.es.eval.samples
    assert short.es.backend == spec.es.backend and short.es.generation == spec.es.generation
    assert short.eval.batch_size == spec.eval.batch_size and short.eval.max_new_tokens == spec.eval.max_new_tokens
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


def _short_settings() -> list[str]:
    """The shortened demo of benchmarks/plan_vs_run.py --short (one list, so both run the same settings)."""
    import sys

    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import plan_vs_run
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    return list(plan_vs_run.SHORT)


SHORT = _short_settings()


@pytest.mark.heavy
def test_calibrated_plan_of_a_longer_run_as_a_user_runs_it(tmp_path, capfd):
    """``plan --calibrate --json`` then ``experiment run --plan``, the CLI as a user calls it; the plan
    command's stdout is the JSON plan alone (``> plan.json``). Structure only: the suite
    shares the cores with other work, so ``--max-spread`` is lifted (a busy machine would be refused,
    which is the check's job, not this test's) and no seconds are compared with seconds.

    Checked from the plan's own numbers: each constant is the median of MEASURED_UPDATES steady-state
    samples (held-out: 4, evaluation calls: one per evaluated model); the run's 8 updates, 3 held-out
    evaluations (0, 4, 8) and 2 checkpoints per training stage are the calibration's medians times
    those counts (a plan that priced the calibration's 6 updates, 4 held-out evaluations or 1
    checkpoint would fail); the recorded plan is the plan given; the report holds the table."""
    sets = [x for item in SHORT for x in ("--set", item)]
    import contextlib
    import io
    import statistics

    assert main(["experiment", "plan", str(DEMO), "--calibrate", "--json", "--max-spread", "1000", *sets]) == 0
    plan = json.loads(capfd.readouterr().out)  # stdout is the plan alone (logs go to stderr)
    assert plan["calibrated"] and plan["max_spread"] == 1000 and {s["name"] for s in plan["stages"]} == {
        "eval/base", "train/es", "eval/es", "train/grpo", "eval/grpo", "offtask", "report"}
    c = plan["calibration"]
    for kind, other in (("es", "update"), ("grpo", "train")):
        rates, samples = c[kind], c[kind]["samples"]
        assert len(samples["token"]) == len(samples["update"]) == cal.MEASURED_UPDATES
        assert len(samples["heldout"]) == 4 and len(samples["checkpoint"]) == cal.CHECKPOINT_REPEATS
        # generation: the median seconds per token times the calibration's mean tokens per update
        assert rates["token_s"] == statistics.median(samples["token"]) and rates["tokens_per_update"] > 0
        assert rates["decode_s"] == pytest.approx(rates["token_s"] * rates["tokens_per_update"])
        for key, field in (("token", "token"), ("update", "update"), ("heldout", "heldout"),
                           ("checkpoint", "checkpoint")):
            assert rates[f"{field}_s"] == statistics.median(samples[key])
            const = plan["constants"][f"{kind}.{cal._term(kind, key)}"]
            assert const["n"] == len(samples[key]) and const["median"] == pytest.approx(rates[f"{field}_s"], rel=1e-3)
        terms = next(s["terms_s"] for s in plan["stages"] if s["name"] == f"train/{kind}")
        assert set(terms) == {"start", "decode", other, "heldout", "checkpoint"}
        # 2-decimal rounding of the terms: abs 0.01
        assert terms["decode"] == pytest.approx(8 * rates["decode_s"], abs=0.01)
        assert terms[other] == pytest.approx(8 * rates["update_s"], abs=0.01)
        assert terms["heldout"] == pytest.approx(3 * rates["heldout_s"], abs=0.01)
        assert terms["checkpoint"] == pytest.approx(2 * rates["checkpoint_s"], abs=0.01)
        assert terms["start"] == pytest.approx(rates["start_s"], abs=0.01)
    ev = c["eval"]
    assert len(ev["samples"]["token"]) == 3 * 2  # base, ES, GRPO x demo-add, demo-sub
    for task in ("demo-add", "demo-sub"):
        assert ev["call_s"][task] == pytest.approx(statistics.median(ev["samples"]["token"]) * ev["tokens_per_call"][task])
    assert plan["interval"]["low_s"] <= plan["wall_s"] <= plan["interval"]["high_s"]
    assert len(c["load"]["before"]) == 3 and len(c["load"]["after"]) == 3
    base = next(s["terms_s"] for s in plan["stages"] if s["name"] == "eval/base")
    # 32 problems per task in calls of 256 // 8 = 32 problems: one sampled and one greedy call per task
    assert base["decode"] == pytest.approx(2 * (ev["call_s"]["demo-add"] + ev["call_s"]["demo-sub"]), abs=0.01)
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    exp = tmp_path / "exp"
    with contextlib.redirect_stdout(io.StringIO()):
        assert main(["experiment", "run", str(DEMO), "--plan", str(tmp_path / "plan.json"), "--output", str(exp),
                     "--no-progress", *sets]) == 0
    assert json.loads((exp / "plan.json").read_text()) == plan
    from esreason.report import timing

    _, rows, _ = timing.comparison(exp)
    assert [r[0] for r in rows[:-1]] == ["eval/base", "train/es", "eval/es", "train/grpo", "eval/grpo", "offtask",
                                         "report"]
    assert all(r[3] != "—" for r in rows[:-1])  # every stage has a plan and a measured time
    report = (exp / "report" / "report.md").read_text()
    assert "Planned vs actual time" in report
    # the ES run's recorded response lengths (es_loop.lengths), with the run's 32-token cap
    lengths = report.split("## Response lengths during training", 1)[1].split("\n## ", 1)[0]
    assert "| ES | 32 | 512 |" in lengths  # 8 updates x N = 8 x B = 8 responses
    # the run made the counts the plan assumed: 8 timed updates, held-out at 0, 4, 8, checkpoints 4 and 8
    for kind in ("es", "grpo"):
        rows_k = [json.loads(x) for x in (exp / "runs" / kind / "metrics.jsonl").read_text().splitlines() if x]
        assert sum("time/step" in r for r in rows_k) == 8
        assert sorted(p.name for p in (exp / "runs" / kind / "checkpoints").iterdir()
                      if p.name.startswith("step_")) == ["step_4", "step_8"]


def test_checkpoint_term_copies_and_hashes_every_file_and_cleans_up(tmp_path):
    a, b = tmp_path / "step_3", tmp_path / "trl" / "checkpoint-3"
    for d, n in ((a, 3), (b, 2)):
        d.mkdir(parents=True)
        for i in range(n):
            (d / f"x{i}.bin").write_bytes(bytes(range(256)) * 1000)
    work = tmp_path / "work"
    from esreason.experiments.calibrate_read import checkpoint_seconds

    seconds = checkpoint_seconds([a, b], work)
    assert seconds > 0 and not (work / "checkpoint-copy").exists()


def _write_run(run, steps, heldouts, checkpoint_steps=(6,), tokens=None):
    """A hand-made ES run directory: metrics rows of the given (time/step, time/generate) per update
    (and its generated ``tokens``), held-out evaluations {update: seconds}, complete checkpoints."""
    rows = []
    for u in range(len(steps) + 1):
        row = {"step": u}
        if u:
            row.update({"time/step": steps[u - 1][0], "time/generate": steps[u - 1][1]})
            if tokens is not None:
                row["tokens"] = tokens[u - 1]
        if u in heldouts:
            row.update({"heldout/time/generate_s": heldouts[u] - 0.5, "heldout/time/verify_s": 0.25,
                        "heldout/time/aggregate_s": 0.25})
        rows.append(json.dumps(row))
    run.mkdir(parents=True)
    (run / "metrics.jsonl").write_text("\n".join(rows) + "\n")
    for step in checkpoint_steps:
        d = run / "checkpoints" / f"step_{step}"
        d.mkdir(parents=True)
        (d / "model.safetensors").write_bytes(b"x" * 4096)
        (d / "COMPLETE").write_text("")


def _fixed_write(dirs, work):
    return 0.5  # a fixed checkpoint write + hash


def test_train_constants_are_steady_state_medians_and_the_warm_up_goes_to_start(tmp_path):
    """Update 1 is the warm-up (40 s: first use of every shape), update 5 a stall (25 s): neither sets
    the per-update constants (medians of updates 2-6); the warm-up's excess is in ``start``, the stall
    is not (it is an update's time, taken as measured). Without token counts generation is priced per
    update."""
    from esreason.experiments.calibrate_read import train_rates

    steps = [(40.0, 30.0), (4.0, 3.0), (4.2, 3.1), (3.9, 2.9), (25.0, 20.0), (4.1, 3.2)]
    run = tmp_path / "es"
    _write_run(run, steps, {0: 2.0, 2: 1.0, 4: 1.2, 6: 1.1})
    rates = train_rates(run, 100.0, "es", tmp_path / "work", writes=_fixed_write)
    assert rates.samples["decode"] == [3.0, 3.1, 2.9, 20.0, 3.2] and rates.decode_s == 3.1 and "token" not in rates.samples
    assert rates.samples["update"] == pytest.approx([1.0, 1.1, 1.0, 5.0, 0.9])
    assert rates.update_s == pytest.approx(1.0)  # median, not the mean 1.8
    assert rates.heldout_s == pytest.approx(1.15) and len(rates.samples["heldout"]) == 4
    assert rates.checkpoint_s == 0.5 and rates.samples["checkpoint"] == [0.5] * cal.CHECKPOINT_REPEATS
    assert rates.warmup_s == pytest.approx(40.0 - 4.1)
    # 100 s = start + the updates' 81.2 s + the held-out evaluations' 5.3 s + 1 checkpoint, with the
    # warm-up's excess over a steady update (35.9 s) moved into start
    assert rates.start_s == pytest.approx(100.0 - 81.2 - 5.3 - 0.5 + 35.9)
    spec = load_spec(DEMO, [])
    short = cal.calibration_spec(spec)
    terms = cal._train_terms(rates, short.es, "es", cal.CAL_UPDATES, {})
    # priced on the calibration's own counts, the stage gives back its measured time less what the
    # steady updates (the stall above all) took beyond 5 x the median and the held-out evaluations
    # beyond 4 x theirs
    assert sum(terms.values()) == pytest.approx(100.0 - (41.2 - 5 * 4.1) - (5.3 - 4 * 1.15))
    with pytest.raises(UserError, match="has 2 timed updates"):
        _write_run(tmp_path / "short", steps[:2], {})
        train_rates(tmp_path / "short", 10.0, "es", tmp_path / "work2", writes=_fixed_write)


def test_generation_is_seconds_per_token_times_the_calibrations_tokens(tmp_path):
    """Updates that generated different numbers of tokens at the same speed: the samples are the speed
    (all equal), the work per update is the mean over every update, the warm-up's included."""
    from esreason.experiments.calibrate_read import train_rates

    tokens = [600, 400, 800, 500, 700, 600]
    steps = [(t * 0.005 + 0.5, t * 0.005) for t in tokens]  # 5 ms per token, 0.5 s outside generation
    steps[0] = (9.0, 8.0)  # the warm-up
    _write_run(tmp_path / "es", steps, {}, tokens=tokens)
    rates = train_rates(tmp_path / "es", 60.0, "es", tmp_path / "work", writes=_fixed_write)
    assert rates.samples["token"] == pytest.approx([0.005] * 5) and "decode" not in rates.samples
    assert rates.tokens_per_update == pytest.approx(600.0) and rates.decode_s == pytest.approx(3.0)
    used: dict = {}
    cal._train_terms(rates, load_spec(DEMO, []).es, "es", 20, used)
    assert used["es.token"] == pytest.approx(20 * 3.0) and "es.decode" not in used


def test_eval_constants_pool_seconds_per_token_over_models_and_tasks(tmp_path):
    """Three models x two tasks: six samples of seconds per generated token (one a stall, 4x the
    others), each task's calls priced at the pooled median times its own tokens per call."""
    from esreason.experiments.calibrate_read import eval_rates

    record = {"methods": {"base": {}, "es": {}, "grpo": {}}, "timings": {}}
    speed = {"base": 0.008, "es": 0.002, "grpo": 0.0022}  # seconds per token; base's calls stalled
    per_call = {"demo-add": 1000, "demo-sub": 500}  # generated tokens per call
    for name, rate in speed.items():
        d = tmp_path / "eval" / name
        d.mkdir(parents=True)
        timings = {task: {"generate_s": 2 * n * rate, "generate_calls": 2, "tokens": 2 * n, "verify_s": 0.33,
                          "aggregate_s": 0.0, "responses": 33 * 64} for task, n in per_call.items()}
        (d / "summary.json").write_text(json.dumps({"timings": timings, "protocol": {"samples": 32, "greedy": True}}))
        record["timings"][f"eval/{name}"] = sum(t["generate_s"] for t in timings.values()) + 2 * 0.33 + 1.0
    rates = eval_rates(tmp_path, record)
    assert sorted(rates.samples["token"]) == pytest.approx([0.002, 0.002, 0.0022, 0.0022, 0.008, 0.008])
    assert rates.token_s == pytest.approx(0.0022) and rates.tokens_per_call == {"demo-add": 1000, "demo-sub": 500}
    assert rates.call_s["demo-add"] == pytest.approx(2.2) and rates.call_s["demo-sub"] == pytest.approx(1.1)
    assert rates.verify_s["demo-add"] == pytest.approx(0.33 / 64)
    assert rates.start_s == pytest.approx(1.0)


def _noisy_calibration(decode, verify=(0.001, 0.001, 0.001)) -> cal.Calibration:
    base = fake_calibration()
    es = cal.TrainRates(start_s=2.0, decode_s=sorted(decode)[len(decode) // 2], update_s=0.5, heldout_s=1.25,
                        checkpoint_s=0.1, samples={"decode": list(decode), "update": [0.5, 0.5, 0.5]})
    ev = cal.EvalRates(start_s=3.0, call_s=base.eval.call_s, verify_s=base.eval.verify_s,
                       samples={"token": [0.0025, 0.0024, 0.0026], "verify.demo-add": list(verify)})
    return cal.Calibration(es=es, grpo=base.grpo, eval=ev, report_s=2.0, report_methods=3, machine="test", seconds=60.0)


def test_a_plan_whose_constants_spread_over_the_bound_is_refused():
    """ES decode is the largest term of the demo; samples 2.4-9.8 s (a stall on a shared machine) spread by 2.96 over
    its 2.5 s median: refused, naming the constant, its spread and the bound. A spread of the same
    size in verification (under 5 % of the plan) is not material."""
    spec = load_spec(DEMO, [])
    with pytest.raises(UserError, match=r"es\.decode varies by 2\.96 .*bound is 0\.5 .*--max-spread"):
        cal.calibrated_plan(spec, _noisy_calibration([2.5, 2.4, 9.8, 2.6, 2.5]))
    steady = cal.calibrated_plan(spec, _noisy_calibration([2.5, 2.4, 2.7, 2.6, 2.5], verify=(0.001, 0.004, 0.001)))
    const = steady["constants"]
    assert const["es.decode"]["checked"] and const["es.decode"]["spread"] == pytest.approx(0.12, abs=1e-3)
    assert const["eval.verify.demo-add"]["spread"] == 3.0 and not const["eval.verify.demo-add"]["checked"]
    assert const["es.decode"]["plan_s"] == pytest.approx(2.5 * (20 + 10 + 10), abs=0.1)  # ES, ES->GRPO, GRPO->ES
    assert steady["max_spread"] == cal.check.MAX_SPREAD
    # the spread is recorded, not enforced, with no bound; a looser bound accepts the noisy one
    loose = cal.calibrated_plan(spec, _noisy_calibration([2.5, 2.4, 9.8, 2.6, 2.5]), max_spread=None)
    assert loose["constants"]["es.decode"]["spread"] == pytest.approx(2.96) and loose["max_spread"] is None
    assert cal.calibrated_plan(spec, _noisy_calibration([2.5, 2.4, 9.8, 2.6, 2.5]), max_spread=3.0)["wall_s"] > 0
    with pytest.raises(UserError, match="--max-spread: expected a number > 0"):
        cal.calibrated_plan(spec, fake_calibration(), max_spread=0.0)
    assert "es.decode" in cal.render_calibrated(steady)


def test_the_plans_own_interval_follows_the_constants_spread():
    """The bootstrap carries each constant's samples to the total, in proportion to the seconds it prices:
    steady samples give a point, a noisy constant a band around the plan, the wider the more it prices."""
    from esreason.experiments.calibrate_check import interval

    steady = interval({"es.token": [1.0, 1.0, 1.0, 1.0, 1.0]}, {"es.token": 60.0}, 100.0)
    assert steady["low_s"] == steady["high_s"] == 100.0 and steady["half_width"] == 0.0
    noisy = interval({"es.token": [0.8, 0.9, 1.0, 1.1, 1.3]}, {"es.token": 60.0}, 100.0)
    assert noisy["low_s"] < 100.0 < noisy["high_s"] and noisy["level"] == 0.9
    wider = interval({"es.token": [0.8, 0.9, 1.0, 1.1, 1.3]}, {"es.token": 90.0}, 100.0)
    assert wider["half_width"] == pytest.approx(noisy["half_width"] * 1.5, rel=1e-6)
    assert interval({"x": [1.0]}, {"x": 50.0}, 100.0)["half_width"] == 0.0  # one sample: nothing to resample
    assert noisy == interval({"es.token": [0.8, 0.9, 1.0, 1.1, 1.3]}, {"es.token": 60.0}, 100.0)  # fixed seed


def test_a_bad_max_spread_is_refused_before_the_calibration_runs(monkeypatch, capsys):
    """A wrong flag costs nothing: exit 2 and one line naming it, and no calibration run."""
    def must_not_run(*args, **kwargs):
        raise AssertionError("the calibration ran before --max-spread was checked")

    monkeypatch.setattr(cal, "calibrate", must_not_run)
    assert main(["experiment", "plan", str(DEMO), "--calibrate", "--max-spread", "-1"]) == 2
    assert "--max-spread: expected a number > 0, got -1.0" in capsys.readouterr().err
