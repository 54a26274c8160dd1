"""Sequential compositions (``esreason train sequence``) and the experiment runner
(``esreason experiment run``) on the embedded default, at toy sizes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from esreason.cli import main
from esreason.config import ConfigError
from esreason.errors import UserError
from esreason.experiments.sequence import load_sequence, plan_sequence, run_sequence, split_budget
from esreason.experiments.spec import load_spec, parse_spec
from esreason.io.hashing import hash_directory_safetensors

pytestmark = pytest.mark.heavy  # the fast subset (`--fast`) leaves this file out: tests/conftest.py

ES = {"model": "demo", "task": "demo-add", "es": {"population_size": 4, "sigma": 2e-3, "alpha": 1e-3},
      "train": {"batch_size": 4, "limit": 8, "max_steps": 3, "seed": 0},
      "generation": {"max_new_tokens": 16}, "checkpoint": {"every": 1}}
GRPO = {"model": "demo", "task": "demo-add",
        "grpo": {"num_generations": 2, "micro_batch_size": 8, "learning_rate": 1e-4},
        "train": {"batch_size": 4, "limit": 8, "max_steps": 3, "seed": 0},
        "generation": {"max_new_tokens": 16}, "checkpoint": {"every": 1}}


def rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


# --------------------------------------------------------------------------- budget split


@pytest.mark.parametrize("total, split", [(2, (1, 1)), (20, (10, 10)), (21, (10, 11)), (629, (314, 315))])
def test_budget_split_is_equal_and_sums_to_the_total(total, split):
    assert split_budget(total) == split and sum(split) == total


@pytest.mark.parametrize("total", [0, 1, True, 2.0, None])
def test_a_budget_that_cannot_be_split_is_refused(total):
    with pytest.raises(ConfigError, match="total_updates"):
        split_budget(total)


@pytest.mark.parametrize("data, needle", [
    ({"stages": ["es", "ppo"], "es": ES, "grpo": GRPO}, "unknown stage 'ppo'"),
    ({"stages": ["es", "es"], "es": ES}, "two different methods"),
    ({"stages": ["es", "grpo", "es"], "es": ES, "grpo": GRPO}, "expected two stages"),
    ({"stages": ["es", "grpo"], "es": ES}, "'grpo': missing"),
    ({"stages": ["es", "grpo"], "es": ES, "grpo": GRPO, "total_updates": 1}, "cannot be split"),
    ({"stages": ["es", "grpo"], "es": ES, "grpo": GRPO, "budget": 4}, "unknown config key 'budget'"),
    ({"stages": ["es", "grpo"], "es": {**ES, "es": {"sigma": -1}}, "grpo": GRPO}, "stage 1 (es)"),
    ({"stages": ["grpo", "es"], "es": ES, "grpo": "no/such.yaml"}, "config file not found"),
])
def test_bad_sequences_are_refused_before_anything_runs(data, needle):
    with pytest.raises(ConfigError, match=needle.replace("(", r"\(").replace(")", r"\)")):
        plan_sequence(data)


def test_sequence_defaults_to_the_stage_configs_common_budget_and_applies_overrides(tmp_path):
    (tmp_path / "es.yaml").write_text(yaml.safe_dump(ES))
    (tmp_path / "seq.yaml").write_text(yaml.safe_dump({"stages": ["grpo", "es"], "es": "es.yaml", "grpo": GRPO}))
    plan = load_sequence(tmp_path / "seq.yaml", ["es.es.sigma=0.004", "total_updates=5"])
    assert [(s.method, s.updates) for s in plan.stages] == [("grpo", 2), ("es", 3)]
    assert plan.stages[1].config.es.sigma == 0.004 and plan.stages[1].config.train.max_steps == 3
    assert load_sequence(tmp_path / "seq.yaml").total_updates == 3  # both configs say max_steps 3


def _prompt_text(messages) -> str:
    return "\n".join(m["content"] for m in messages)


def run_recording_batches(plan, out):
    """Run a sequence and record, per update, the prompts each stage trained on (in order)."""
    from esreason.es_loop.trainer import ESTrainer
    from esreason.grpo.trainer import PaperGRPOTrainer

    seen: list[tuple[str, list[str]]] = []
    es_step, grpo_rollout = ESTrainer.step, PaperGRPOTrainer._generate_and_score_completions

    def recording_step(self, t):
        seen.append(("es", [_prompt_text(self.problems[i].messages) for i in self.schedule.batch(t)]))
        return es_step(self, t)

    def recording_rollout(self, inputs):  # B prompts, each repeated G times in a row
        seen.append(("grpo", [_prompt_text(row["prompt"]) for row in inputs[::self.num_generations]]))
        return grpo_rollout(self, inputs)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(ESTrainer, "step", recording_step)
        mp.setattr(PaperGRPOTrainer, "_generate_and_score_completions", recording_rollout)
        result = run_sequence(plan, out, progress=False)
    return result, seen


def one_run_batches(total: int, batch_size: int = 4) -> list[list[str]]:
    """The prompt batches of one run of ``total`` updates on the stream (ES, train.stream_start=0)."""
    from esreason import tasks
    from esreason.es.schedule import Schedule

    problems = tasks.get("demo-add").load("train", None, ES["train"]["limit"])
    schedule = Schedule(len(problems), batch_size, 1, ES["train"]["seed"], stream_start=0)
    return [[_prompt_text(problems[i].messages) for i in schedule.batch(t)] for t in range(total)]


@pytest.fixture(scope="module")
def es_then_grpo(tmp_path_factory):
    out = tmp_path_factory.mktemp("seq") / "es_grpo"
    plan = plan_sequence({"stages": ["es", "grpo"], "es": ES, "grpo": GRPO})
    result, seen = run_recording_batches(plan, out)
    return out, plan, result, seen


@pytest.mark.parametrize("stages", [("es", "grpo"), ("grpo", "es")])
def test_stage2_continues_stage1_data_stream_as_one_run_of_t_updates(stages, es_then_grpo, tmp_path):
    """Stage 2 takes the batches that follow stage 1's, in the same order (T = 3 over
    8 problems in batches of 4 crosses an epoch boundary: no prompt lost or repeated early)."""
    if stages == ("es", "grpo"):
        out, plan, result, seen = es_then_grpo
    else:
        plan = plan_sequence({"stages": list(stages), "es": ES, "grpo": GRPO})
        result, seen = run_recording_batches(plan, tmp_path / "grpo_es")
    assert [m for m, _ in seen] == [s.method for s in plan.stages for _ in range(s.updates)]
    assert [batch for _, batch in seen] == one_run_batches(plan.total_updates)
    assert [s.config.train.stream_start for s in plan.stages] == [0, plan.stages[0].updates * 4]
    first_epoch = [p for _, batch in seen[:2] for p in batch]
    assert len(set(first_epoch)) == 8  # the first 8 prompts are the whole training set, once


def test_the_stream_continues_across_runs_and_batch_sizes():
    """ES->ES-like: t1 updates then the rest from stream_start equals one run; B may change."""
    from esreason.es.schedule import Schedule, stream_items

    one = Schedule(10, 4, 3, 7, stream_start=0)
    whole = [one.batch(t) for t in range(6)]
    first, rest = Schedule(10, 4, 3, 7, stream_start=0), Schedule(10, 4, 3, 7, stream_start=2 * 4)
    assert [first.batch(t) for t in range(2)] + [rest.batch(t) for t in range(4)] == whole
    assert [i for b in whole for i in b] == stream_items(10, 7, 0, 24)
    assert sorted(stream_items(10, 7, 0, 10)) == list(range(10))  # each epoch is a permutation
    other_b = Schedule(10, 3, 3, 7, stream_start=8)  # stage 2 with B = 3 reads on from prompt 8
    assert [other_b.batch(t) for t in range(2)] == [stream_items(10, 7, 8, 3), stream_items(10, 7, 11, 3)]
    assert Schedule(10, 4, 1, 7).batch(2) != whole[2]  # the keep-tail schedule of a single run differs


def test_stages_of_a_composition_must_share_the_data_stream():
    with pytest.raises(ConfigError, match=r"'grpo.train.seed'.*one data stream"):
        plan_sequence({"stages": ["es", "grpo"], "es": ES,
                       "grpo": {**GRPO, "train": {**GRPO["train"], "seed": 1}}})


def test_composition_takes_the_single_method_budget_and_stage2_starts_from_stage1(es_then_grpo):
    out, plan, result, _ = es_then_grpo
    assert plan.total_updates == ES["train"]["max_steps"]  # the budget of one single-method run
    s1, s2 = result.stages
    assert (s1.method, s1.updates, s2.method, s2.updates) == ("es", 1, "grpo", 2)
    assert s1.updates + s2.updates == 3
    # Stage 2's manifest hashes its starting model: exactly stage 1's final weights.
    manifest = json.loads((s2.run_dir / "manifest.json").read_text())
    assert manifest["model"]["sha256_tensors"] == hash_directory_safetensors(s1.final_checkpoint)
    assert manifest["model"]["sha256_tensors"] != hash_directory_safetensors(s2.final_checkpoint)
    assert [r["step"] for r in rows(s1.run_dir / "metrics.jsonl")] == [1]
    assert [r["step"] for r in rows(s2.run_dir / "metrics.jsonl") if "kl" in r] == [1, 2]
    record = json.loads((out / "sequence.json").read_text())
    assert record["split"] == [1, 2] and record["stage2_start_matches_stage1_final"] is True


def test_rerunning_a_finished_sequence_trains_nothing(es_then_grpo):
    out, plan, result, _ = es_then_grpo
    before = {p: p.read_text() for p in out.glob("stage*/metrics.jsonl")}
    again = run_sequence(plan, out, progress=False)
    assert again.final_checkpoint == result.final_checkpoint
    assert {p: p.read_text() for p in out.glob("stage*/metrics.jsonl")} == before


def test_a_sequence_directory_refuses_another_composition(es_then_grpo):
    out, _, _, _ = es_then_grpo
    other = plan_sequence({"stages": ["grpo", "es"], "es": ES, "grpo": GRPO})
    with pytest.raises(UserError, match="holds a sequence"):
        run_sequence(other, out, progress=False)


def test_cli_sequence_bad_stage_is_a_one_line_error(tmp_path, capsys):
    cfg = tmp_path / "seq.yaml"
    cfg.write_text(yaml.safe_dump({"stages": ["es", "sft"], "es": ES, "grpo": GRPO}))
    assert main(["train", "sequence", "--config", str(cfg), "--output", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "unknown stage 'sft'" in err and "Traceback" not in err
    assert not (tmp_path / "o").exists()


# --------------------------------------------------------------------------- experiment spec


def spec_data(**over):
    data = {"name": "t", "model": "demo", "task": "demo-add", "updates": 2,
            "methods": ["base", "es"], "configs": {"es": ES, "grpo": GRPO},
            "eval": {"in_domain": ["demo-indomain"], "held_out": ["demo-sub"], "samples": 2, "ks": [1, 2],
                     "max_new_tokens": 16, "limit": 2, "ci_resamples": 0}}
    data.update(over)
    return data


@pytest.mark.parametrize("over, needle", [
    ({"methods": ["base", "ppo"]}, "unknown method 'ppo'"),
    ({"model": "/no/such/model"}, "model path not found"),
    ({"checkpoints": {"es": "/no/such/ckpt"}}, "checkpoints.es.path"),
    ({"checkpoints": {"grpo": "demo"}}, "'grpo' is not in 'methods'"),
    ({"methods": ["es_grpo"], "updates": 1}, "'updates'"),
    ({"eval": {"in_domain": ["demo-add"], "held_out": ["no-such-suite"]}}, "neither a suite"),
    ({"eval": {"in_domain": ["demo-add"], "held_out": ["demo-sub"], "samples": 2, "ks": [1, 4]}}, "eval.ks"),
    ({"eval": {"in_domain": ["demo-add"], "held_out": ["demo-sub"], "samples": 2, "ks": [1, 2],
               "backend": "sglang"}}, "eval.backend"),
    ({"eval": {"in_domain": ["demo-add"], "held_out": ["demo-sub"], "samples": 2, "ks": [1, 2],
               "engines": 0}}, "eval.engines"),
    ({"configs": {"es": ES}, "methods": ["grpo"]}, "configs.grpo"),
    ({"configs": {"es": {**ES, "es": {"population_size": 1}}}}, "configs.es"),
    ({"report": {"pairs": [["demo-add", "gsm8k"]]}}, "report.pairs"),
    ({"extra": 1}, "unknown config key 'extra'"),
])
def test_bad_experiments_are_refused_before_anything_runs(over, needle):
    with pytest.raises(ConfigError, match=needle):
        parse_spec(spec_data(**over))


def test_experiment_spec_shares_model_task_and_budget_across_methods():
    spec = parse_spec(spec_data(methods=["base", "grpo", "es", "es_grpo", "grpo_es"], updates=5,
                                checkpoints={"grpo": {"path": "demo", "label": "GRPO (released)"}}))
    assert spec.es.train.max_steps == spec.grpo.train.max_steps == 5
    assert spec.es.task == spec.grpo.task == "demo-add"
    assert [(m.name, m.kind) for m in spec.methods] == [
        ("base", "base"), ("grpo", "checkpoint"), ("es", "es"), ("es_grpo", "es_grpo"), ("grpo_es", "grpo_es")]
    assert spec.method("grpo").label == "GRPO (released)"
    assert spec.eval.in_domain == ("demo-add",) and spec.eval.held_out == ("demo-sub",)


def test_shipped_experiment_configs_validate():
    root = Path(__file__).resolve().parents[1] / "configs" / "experiments"
    demo = load_spec(root / "demo.yaml")
    assert [m.name for m in demo.methods] == ["base", "grpo", "es", "es_grpo", "grpo_es"]
    # FLOP matching as the paper: same T and B, N = 4 G, so 2 N B = 8 B G.
    assert demo.es.train.batch_size == demo.grpo.train.batch_size
    assert demo.es.es.population_size == 4 * demo.grpo.grpo.num_generations
    assert demo.es.train.max_steps == demo.grpo.train.max_steps == demo.updates
    from esreason.accounting.flops import compare, estimate_config

    assert compare([estimate_config(demo.es, "es", length=64), estimate_config(demo.grpo, "grpo", length=64)])[
        "matched"] is True
    easy = load_spec(root / "easy.yaml")
    assert easy.updates == easy.es.train.max_steps == easy.grpo.train.max_steps == 232
    assert easy.eval.in_domain == ("gsm8k",) and "gpqa" in easy.eval.held_out and easy.eval.max_new_tokens == 2048
    packaged = Path(__file__).resolve().parents[1] / "src" / "esreason" / "assets" / "configs" / "experiment-demo.yaml"
    assert yaml.safe_load(packaged.read_text()) == yaml.safe_load((root / "demo.yaml").read_text())


# --------------------------------------------------------------------------- experiment runner


@pytest.fixture(scope="module")
def experiment(tmp_path_factory):
    from esreason.embedded import demo_model_dir
    from esreason.experiments.runner import run_experiment

    out = tmp_path_factory.mktemp("exp") / "exp"
    spec = parse_spec(spec_data(methods=["base", "grpo", "es"],
                                checkpoints={"grpo": {"path": str(demo_model_dir()), "label": "GRPO (ckpt)"}}))
    return out, spec, run_experiment(spec, out, progress=False, report=False, log=lambda *_: None)


def test_experiment_trains_what_is_missing_and_evaluates_everything(experiment):
    out, spec, result = experiment
    record = json.loads((out / "experiment.json").read_text())
    assert record["kind"] == "esreason-experiment" and list(record["methods"]) == ["base", "grpo", "es"]
    assert record["methods"]["grpo"]["kind"] == "checkpoint" and record["methods"]["grpo"]["training"] == []
    assert not (out / "runs" / "grpo").exists()  # a checkpoint method is evaluated, not trained
    es = record["methods"]["es"]
    assert (out / es["checkpoint"]).is_dir() and es["training"][0]["updates"] == 2
    for m in record["methods"].values():
        summary = json.loads((out / m["eval"] / "summary.json").read_text())
        assert set(summary["tasks"]) == {"demo-add", "demo-sub"}
    assert record["suites"] == {"in_domain": ["demo-add"], "held_out": ["demo-sub"]}
    # ES N=4 x B=4 vs GRPO B=4 x G=2: 2*4*4 != 8*4*2, and the record says so.
    assert record["flops"]["matched"] is False and record["flops"]["configs"][0]["method"] == "es"


def test_rerunning_an_experiment_skips_finished_work(experiment):
    from esreason.experiments.runner import run_experiment

    out, spec, _ = experiment
    done = out / "runs" / "es" / "done.json"
    stamp = (done.stat().st_mtime_ns, (out / "runs" / "es" / "metrics.jsonl").read_text())
    responses = (out / "eval" / "es" / "demo-add" / "responses.jsonl").read_text()
    run_experiment(spec, out, progress=False, report=False, log=lambda *_: None)
    assert (done.stat().st_mtime_ns, (out / "runs" / "es" / "metrics.jsonl").read_text()) == stamp
    assert (out / "eval" / "es" / "demo-add" / "responses.jsonl").read_text() == responses


def test_an_experiment_directory_refuses_a_different_training_spec(experiment):
    from esreason.experiments.runner import run_experiment

    out, _, _ = experiment
    other = parse_spec(spec_data(updates=3))
    with pytest.raises(UserError, match="key 'updates'"):
        run_experiment(other, out, progress=False, report=False, log=lambda *_: None)


def test_cli_experiment_unknown_method_exits_2(tmp_path, capsys):
    f = tmp_path / "e.yaml"
    f.write_text(yaml.safe_dump(spec_data(methods=["base", "dpo"])))
    assert main(["experiment", "run", str(f), "--output", str(tmp_path / "o")]) == 2
    assert "unknown method 'dpo'" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_hard_experiment_evaluates_the_released_grpo_checkpoint(monkeypatch):
    root = Path(__file__).resolve().parents[1] / "configs" / "experiments"
    monkeypatch.delenv("ESREASON_HARD_GRPO_CHECKPOINT", raising=False)
    assert load_spec(root / "hard.yaml").method("grpo").kind == "grpo"  # unset: trained (tests/test_first_node.py)
    monkeypatch.setenv("ESREASON_HARD_GRPO_CHECKPOINT", "someorg/soft-grpo-discrete-1.5b")
    hard = load_spec(root / "hard.yaml")
    grpo = hard.method("grpo")
    assert (grpo.kind, grpo.checkpoint) == ("checkpoint", "someorg/soft-grpo-discrete-1.5b")
    assert hard.es.train.max_steps == hard.grpo.train.max_steps == 629  # the compositions' GRPO stages
    assert hard.eval.max_new_tokens == 8192 and "aime24" in hard.eval.in_domain


def test_a_trained_method_refuses_another_run_config_but_new_methods_can_be_added(experiment, monkeypatch):
    from esreason.experiments import runner

    out, spec, _ = experiment
    changed = parse_spec(spec_data(methods=["base", "es"], configs={"es": {**ES, "es": {"population_size": 6}},
                                                                     "grpo": GRPO}))
    with pytest.raises(UserError, match="different es config"):
        runner.run_experiment(changed, out, progress=False, report=False, log=lambda *_: None)
    trained: list[str] = []
    real_train = runner._train
    monkeypatch.setattr(runner, "_train", lambda m, *a, **k: trained.append(m.name) or real_train(m, *a, **k))
    monkeypatch.setattr(runner, "_evaluate", lambda *a, **k: 0.0)
    more = parse_spec(spec_data(methods=["base", "es", "grpo"]))  # grpo now trained instead of a checkpoint
    record = runner.run_experiment(more, out, progress=False, report=False, log=lambda *_: None).record
    assert trained == ["es", "grpo"] and record["methods"]["grpo"]["kind"] == "grpo"
    assert (out / "runs" / "grpo" / "done.json").is_file()
