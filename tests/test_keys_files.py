"""Keys of the task file, the experiment file, the sequence file and the sweep section, set to a
non-default value, take effect.

The task-file keys are checked on the task they define (its problems, its scorer, where its data
comes from: a hub dataset is loaded through ``datasets.load_dataset``, here a fake that records
its arguments). The experiment keys are checked where the runner hands them on: to the stage
configs it trains (the ones ``train_method`` receives) and to the evaluation harness (a fake
that records its arguments: tests/test_keys_api.py checks that the harness honours each). The
sweep section's keys are checked on a sweep whose training is replaced by recorded rewards.
tests/documented_keys.py names the existing tests that run the rest.
"""

from __future__ import annotations

import json
import textwrap

import numpy as np
import pytest
import yaml

from test_experiments import ES, GRPO, spec_data
from test_keys_es import user_tasks  # noqa: F401  (a fixture)
from test_task_files import clean_registry, write_task  # noqa: F401  (a fixture)

# --------------------------------------------------------------------------- task files

REWARDS = '''
def right(completions, total, **kwargs):
    return [float(c.strip() == str(t)) for c, t in zip(completions, total)]

def half(completions, **kwargs):
    return [0.5] * len(completions)

def score(text, gold):
    from esreason.verifiers import Verdict
    return Verdict(reward=0.25, correct=text == "yes", extracted=text, reason="scored", formatted=True)
'''


@pytest.fixture
def task_dir_env(monkeypatch):
    """ESREASON_TASKS_DIR as before the test (add_tasks_dir extends it; clean_registry only unsets it)."""
    from esreason.tasks import registry

    monkeypatch.setenv(registry.TASKS_DIR_ENV, "")


def test_task_file_description_and_id(clean_registry, task_dir_env, tmp_path):
    write_task(tmp_path, "described", """
        description: sums of two numbers, by id
        prompt: {template: "{a}+{b}"}
        gold: total
        verifier: math
        id: uid
    """, rows=[{"uid": "first", "a": 1, "b": 2, "total": 3}, {"uid": "second", "a": 4, "b": 5, "total": 9}])
    clean_registry.add_tasks_dir(tmp_path)
    task = clean_registry.get("described")
    assert task.description == "sums of two numbers, by id"
    assert [p.id for p in task.load("test")] == ["first", "second"]


def test_task_file_reward_weights_and_pass_threshold(clean_registry, task_dir_env, tmp_path):
    (tmp_path / "rewards.py").write_text(REWARDS)
    write_task(tmp_path, "weighted", """
        prompt: {template: "{a}+{b}", chat: false}
        reward: [rewards.py:right, rewards.py:half]
        reward_weights: [2.0, 1.0]
        pass_threshold: 2.5
    """)
    clean_registry.add_tasks_dir(tmp_path)
    task = clean_registry.get("weighted")
    gold = task.load("test")[0].gold  # 1+2, total 3
    right, wrong = task.scorer().score_batch(["3", "4"], [gold, gold])
    assert (right.reward, wrong.reward) == (2.5, 0.5)  # 2 * right + 1 * half
    assert right.correct and not wrong.correct  # pass_threshold 2.5, not 1.0


def test_task_file_scorer(clean_registry, task_dir_env, tmp_path):
    (tmp_path / "rewards.py").write_text(REWARDS)
    write_task(tmp_path, "scored", """
        prompt: {template: "{a}+{b}"}
        gold: total
        scorer: rewards.py:score
    """)
    clean_registry.add_tasks_dir(tmp_path)
    task = clean_registry.get("scored")
    verdict = task.scorer()("yes", task.load("test")[0].gold)
    assert (verdict.reward, verdict.correct) == (0.25, True)


def test_task_file_dataset_from_the_hub(clean_registry, task_dir_env, tmp_path, monkeypatch):
    """``dataset: {path, name, splits}`` names what ``datasets.load_dataset`` loads for each of our splits."""
    import datasets

    asked = []

    def load_dataset(path, name=None, split=None):
        asked.append((path, name, split))
        return datasets.Dataset.from_list([{"question": "1+1", "answer": "2"}])

    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    (tmp_path / "hub.yaml").write_text(textwrap.dedent("""
        task: from-hub
        dataset: {path: someone/sums, name: easy, splits: {train: training, test: validation}}
        prompt: {field: question}
        gold: answer
        verifier: math
    """))
    clean_registry.add_tasks_dir(tmp_path)
    task = clean_registry.get("from-hub")
    assert task.load("test")[0].messages[-1]["content"] == "1+1"
    task.load("train")
    assert asked == [("someone/sums", "easy", "validation"), ("someone/sums", "easy", "training")]


# --------------------------------------------------------------------------- experiment file


@pytest.fixture(scope="module")
def experiment(tmp_path_factory, user_tasks, tiny_model_dir):
    """A Base / ES-checkpoint experiment with every evaluation key changed, loaded from its file and run
    with the evaluation harness recorded (nothing is trained or sampled)."""
    from esreason.eval import harness
    from esreason.experiments.runner import run_experiment
    from esreason.experiments.spec import load_spec

    root = tmp_path_factory.mktemp("experiment")
    data = root / "data" / "keys-file"
    data.mkdir(parents=True)
    (data / "test.jsonl").write_text(json.dumps({"a": 1, "b": 1, "total": 2}) + "\n")
    tasks = root / "tasks"
    (tasks / "data").mkdir(parents=True)
    (tasks / "data" / "test.jsonl").write_text(json.dumps({"a": 2, "b": 2, "total": 4}) + "\n")
    (tasks / "exp-task.yaml").write_text('task: keys-exp-task\ndata: {test: data/test.jsonl}\n'
                                         'prompt: {template: "{a}+{b}"}\ngold: total\nverifier: math\n')
    spec = spec_data(name="keys-exp", model=str(tiny_model_dir), methods=["base", "es"],
                     checkpoints={"es": {"path": str(tiny_model_dir), "label": "ES (given)"}},
                     data_dir="data", tasks_dir="tasks", report={"pairs": [["keys-file", "keys-exp-task"]]},
                     eval={"in_domain": ["keys-file"], "held_out": ["keys-exp-task"], "samples": 3, "ks": [1, 3],
                           "temperature": 0.9, "top_p": 0.8, "max_new_tokens": 7, "greedy": True, "limit": 5,
                           "batch_size": 4, "seed": 11, "ci_resamples": 7, "backend": "vllm", "engines": 2,
                           "engines_per_gpu": 2})
    spec["data_dir"] = str(root / "data")  # the experiment's data directory (absolute here)
    (root / "exp.yaml").write_text(yaml.safe_dump(spec))
    calls = []
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(harness, "evaluate", lambda model, tasks, **kw: calls.append((model, tasks, kw)))
        loaded = load_spec(root / "exp.yaml")
        run_experiment(loaded, root / "out", progress=False, report=False, log=lambda *_: None)
    return root, loaded, calls, json.loads((root / "out" / "experiment.json").read_text())


def test_experiment_name(experiment):
    root, spec, _, record = experiment
    assert record["name"] == "keys-exp" and spec.name == "keys-exp"


def test_experiment_methods_and_checkpoints(experiment, tiny_model_dir):
    root, _, calls, record = experiment
    assert list(record["methods"]) == ["base", "es"]
    assert [(c[0], c[2]["output_dir"].name) for c in calls] == [(str(tiny_model_dir), "base"),
                                                                 (str(tiny_model_dir), "es")]
    assert record["methods"]["es"]["label"] == "ES (given)" and not (root / "out" / "runs").exists()  # not trained


def test_experiment_model_is_the_base_evaluated(experiment, tiny_model_dir):
    assert experiment[2][0][0] == str(tiny_model_dir) and experiment[3]["model"] == str(tiny_model_dir)


def test_experiment_tasks_dir_registers_the_files_beside_it(experiment):
    assert experiment[2][0][1] == ["keys-file", "keys-exp-task"]  # keys-exp-task: from tasks/, relative to the file


def test_experiment_data_dir(experiment):
    root = experiment[0]
    assert {c[2]["data_dir"] for c in experiment[2]} == {str(root / "data")}


EVAL_KEYS = {"samples": ("samples", 3), "ks": ("ks", (1, 3)), "temperature": ("temperature", 0.9),
             "top_p": ("top_p", 0.8), "max_new_tokens": ("max_new_tokens", 7), "greedy": ("greedy", True),
             "limit": ("limit", 5), "batch_size": ("batch_size", 4), "seed": ("seed", 11),
             "ci_resamples": ("ci_resamples", 7), "backend": ("backend", "vllm"), "engines": ("engines", 2),
             "engines_per_gpu": ("engines_per_gpu", 2)}


@pytest.mark.parametrize("key", sorted(EVAL_KEYS))
def test_experiment_eval_keys_reach_the_evaluation(experiment, key):
    argument, value = EVAL_KEYS[key]
    assert {tuple(c[2][argument]) if isinstance(value, tuple) else c[2][argument] for c in experiment[2]} == {value}


def test_experiment_eval_in_domain_and_held_out(experiment):
    record = experiment[3]
    assert record["suites"] == {"in_domain": ["keys-file"], "held_out": ["keys-exp-task"]}
    assert experiment[2][0][1] == ["keys-file", "keys-exp-task"]


def test_experiment_eval_tensor_parallel_size(tmp_path, monkeypatch, tiny_model_dir):
    from esreason.eval import harness
    from esreason.experiments.runner import run_experiment
    from esreason.experiments.spec import parse_spec

    calls = []
    monkeypatch.setattr(harness, "evaluate", lambda model, tasks, **kw: calls.append(kw))
    spec = parse_spec(spec_data(model=str(tiny_model_dir), methods=["base"], eval={
        "in_domain": ["demo-add"], "held_out": ["demo-sub"], "samples": 2, "ks": [1, 2], "backend": "vllm",
        "tensor_parallel_size": 2}))
    run_experiment(spec, tmp_path / "out", progress=False, report=False, log=lambda *_: None)
    assert calls[0]["tensor_parallel_size"] == 2


def test_experiment_report_pairs(experiment):
    assert experiment[3]["pairs"] == [["keys-file", "keys-exp-task"]]  # what the report's bar chart draws


def test_experiment_configs_model_task_and_updates_reach_the_stage_configs(tiny_model_dir, user_tasks):
    from esreason.experiments.spec import parse_spec

    es = {**ES, "es": {**ES["es"], "sigma": 0.004}}
    grpo = {**GRPO, "grpo": {**GRPO["grpo"], "beta": 0.0}}
    spec = parse_spec(spec_data(model=str(tiny_model_dir), task="keys-file", updates=6,
                                methods=["base", "es", "grpo", "es_grpo"], configs={"es": es, "grpo": grpo}))
    es_cfg, grpo_cfg = spec.stage_config(spec.method("es"), "es"), spec.stage_config(spec.method("grpo"), "grpo")
    assert es_cfg.es.sigma == 0.004 and grpo_cfg.grpo.beta == 0.0  # configs.es, configs.grpo
    for cfg in (es_cfg, grpo_cfg):
        assert (cfg.model, cfg.task, cfg.train.max_steps) == (str(tiny_model_dir), "keys-file", 6)
    assert spec.method_updates(spec.method("es_grpo")) == 6  # 3 + 3


# --------------------------------------------------------------------------- sequence file


def test_sequence_model_starts_the_first_stage(tiny_model_dir):
    from esreason.experiments.sequence import plan_sequence

    plan = plan_sequence({"stages": ["es", "grpo"], "model": str(tiny_model_dir), "es": ES, "grpo": GRPO})
    assert plan.stages[0].config.model == str(tiny_model_dir)  # stage 2 starts from stage 1's checkpoint
    assert plan_sequence({"stages": ["es", "grpo"], "es": ES, "grpo": GRPO}).stages[0].config.model == "demo"


# --------------------------------------------------------------------------- sweep section


def test_sweep_section_keys(tmp_path, monkeypatch):
    """Every key of the ``sweep:`` section, none given as a flag, on a sweep whose runs are replaced by
    recorded rewards: the points trained, the table's reference, checkpoints and tolerance, the
    smoothing band's window, the held-out suite."""
    from esreason.experiments import sweep
    from esreason.experiments.smoothing import residual_band

    config = tmp_path / "sweep.yaml"
    config.write_text(yaml.safe_dump({**ES, "train": {**ES["train"], "max_steps": 4}, "sweep": {
        "param": "es.sigma", "values": [0.001, 0.003], "reference": 0.001, "checkpoints": [2, 4],
        "heldout_suite": "demo-heldout", "tolerance": 0.5, "band_window": 3, "seeds": [0, 5]}}))
    base, section = sweep.load_sweep_config(config)
    plan = sweep.plan_sweep(base, sweep.make_spec(section), tmp_path / "out")
    assert sorted((p.cfg.es.sigma, p.cfg.train.seed) for p in plan.points) == [
        (0.001, 0), (0.001, 5), (0.003, 0), (0.003, 5)]  # param x values x seeds
    assert plan.reference == "0.001"
    rewards = {0.001: [0.1, 0.2, 0.3, 0.4], 0.003: [0.0, 0.4, 0.1, 0.3]}
    suites = []
    monkeypatch.setattr(sweep, "train_point", lambda point, progress: "trained")
    monkeypatch.setattr(sweep, "load_rewards", lambda run_dir: (np.array(rewards[float(run_dir.parent.name.split(
        "=")[1])]), 1.0))
    monkeypatch.setattr(sweep, "evaluate_endpoint", lambda point, suite, tasks, progress: suites.append(suite))
    monkeypatch.setattr(sweep, "heldout_rows", lambda summaries: [])
    result = sweep.run_sweep(plan, progress=False, log=lambda *_: None)
    assert set(suites) == {"demo-heldout"}
    data = json.loads((tmp_path / "out" / "sweep.json").read_text())
    assert [r["update"] for r in data["table"]["rows"]] == [2, 4]
    cells = {r["update"]: r for r in data["table"]["rows"]}
    assert cells[4]["0.003"]["within"] is True  # |gap| < 0.5; the paper's 0.01 would not mark it
    assert abs(cells[4]["0.003"]["gap"]) > 0.01
    traj = data["trajectories"]["0.003"]
    band = residual_band(np.array(traj["raw"]), np.array(traj["smoothed"]), 3)
    assert traj["band"] == pytest.approx(band.tolist())
    assert traj["band"] != pytest.approx(residual_band(np.array(traj["raw"]), np.array(traj["smoothed"]), 21).tolist())
    assert result.table is not None
