"""What a new user meets first, each through the face that met it: `tasks_dir` in run configs, in ESConfig
and in evaluate(); a rerun after a failure before the first update; resume checks what it resumes; GRPO's
reward errors in ES's one line; reward-model ids, empty datasets, task-file typos, a batch larger than the
data, `esreason --tasks-dir DIR tasks` and `esreason.register_verifier`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from esreason.errors import UserError

pytestmark = pytest.mark.heavy  # CLI subprocesses and short trained runs (`--fast` leaves this file out)

TASK = "surface-add"
REWARD = '''
import os


def digits(completions, total, **kwargs):
    """1 when the completion contains the total; RW_MODE=raise raises, RW_MODE=str returns strings."""
    mode = os.environ.get("RW_MODE", "")
    if mode == "raise":
        raise RuntimeError("judge unavailable")
    if mode == "str":
        return ["1.0" for _ in completions]
    return [float(str(t) in (c if isinstance(c, str) else c[0]["content"])) for c, t in zip(completions, total)]
'''
SMALL_ES = {"model": "demo", "task": TASK, "es": {"population_size": 2}, "train": {"batch_size": 2, "max_steps": 1},
            "generation": {"max_new_tokens": 8}, "backend": {"type": "batched"}}


def rows(n: int) -> list[dict]:
    """A dataset as the Python API takes it: a prompt column and the reward's columns."""
    return [{"prompt": f"{i}+{i + 1}", "total": 2 * i + 1} for i in range(n)]


@pytest.fixture(scope="module")
def task_dir(tmp_path_factory) -> Path:
    """A task file with a reward module, and ES / GRPO run configs that find it with the `tasks_dir` key
    alone (no --tasks-dir flag), in a directory of their own."""
    import yaml

    root = tmp_path_factory.mktemp("surface")
    tasks = root / "tasks"
    tasks.mkdir()
    for split, n in (("train", 10), ("test", 4)):
        (tasks / f"{split}.jsonl").write_text("".join(json.dumps({"a": i, "b": i + 1, "total": 2 * i + 1}) + "\n"
                                                      for i in range(n)))
    (tasks / "rw.py").write_text(textwrap.dedent(REWARD))
    (tasks / "task.yaml").write_text(f"task: {TASK}\ndata: {{train: train.jsonl, test: test.jsonl}}\n"
                                     'prompt: {template: "{a}+{b}"}\nreward: rw:digits\n')
    configs = root / "configs"
    configs.mkdir()
    (configs / "es.yaml").write_text(yaml.safe_dump({**SMALL_ES, "tasks_dir": str(tasks)}))
    (configs / "grpo.yaml").write_text(yaml.safe_dump({
        "model": "demo", "task": TASK, "tasks_dir": str(tasks), "grpo": {"num_generations": 2, "micro_batch_size": 4},
        "train": {"batch_size": 2, "max_steps": 1}, "generation": {"temperature": 1.0, "max_new_tokens": 8}}))
    return root


def cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if k not in ("ESREASON_TASKS_DIR", "RW_MODE")}
    return subprocess.run([sys.executable, "-m", "esreason.cli", *args], capture_output=True, text=True,
                          env={**clean, **(env or {})}, timeout=900)


def last_line(r: subprocess.CompletedProcess) -> str:
    return r.stderr.strip().splitlines()[-1]


ONE_LINE = "esreason: error: reward function 'digits' raised RuntimeError: judge unavailable (called on "


@pytest.mark.parametrize("method", ["es", "grpo"])
def test_the_tasks_dir_key_finds_the_task_a_reward_error_is_one_line_and_the_same_command_reruns(
        task_dir, tmp_path, method):
    """The run config's `tasks_dir` alone registers the task; a reward function that raises in the first
    update stops the run with ES's one line (under GRPO too: TRL calls the function through our check);
    the same command, rerun once the reward works, starts the run over the headers the failure left."""
    command = ("train", method, "--config", str(task_dir / f"configs/{method}.yaml"), "--output", str(tmp_path / "run"),
               "--no-progress")
    failed = cli(*command, env={"RW_MODE": "raise"})
    assert failed.returncode == 2, failed.stderr[-3000:]
    assert last_line(failed).startswith(ONE_LINE) and "Traceback" not in failed.stderr, failed.stderr[-3000:]
    assert (tmp_path / "run/config.yaml").exists() and not (tmp_path / "run/checkpoints").exists()
    rerun = cli(*command)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert (tmp_path / "run/checkpoints/step_1/COMPLETE").exists()
    assert [json.loads(line)["step"] for line in (tmp_path / "run/metrics.jsonl").read_text().splitlines()] == [1]


def test_esconfig_and_evaluate_take_tasks_dir(task_dir, tmp_path):
    from esreason import ESConfig, ESTrainer, evaluate

    scores = evaluate("demo", task=TASK, tasks_dir=task_dir / "tasks", n=2, k=[1, 2], max_new_tokens=4, limit=2,
                      ci_resamples=0)
    assert scores["num_problems"] == 2 and 0 <= scores["pass@2"] <= 1
    args = ESConfig(output_dir=str(tmp_path / "es"), tasks_dir=str(task_dir / "tasks"), task=TASK, population_size=2,
                    batch_size=2, max_steps=1, max_new_tokens=8)
    assert ESTrainer("demo", args=args).train().steps == 1


def test_a_run_that_failed_before_its_first_update_reruns_as_it_was_started(tmp_path):
    """Chosen rule: a run holds its directory from its first update's row or checkpoint on (no cleanup on
    failure, so a kill leaves a rerunnable directory too); the rerun replaces config, manifest and rows."""
    from esreason import ESConfig, ESTrainer
    from esreason.verifiers.reward_functions import RewardFunctionError

    state = {"broken": True, "calls": 0}

    def judge(completions, **kwargs):
        state["calls"] += 1
        if state["broken"] and state["calls"] > 1:  # call 1 is the step-0 held-out evaluation, then training
            raise ValueError("judge offline")
        return [1.0 for _ in completions]

    args = ESConfig(output_dir=str(tmp_path / "r"), task="surface-rerun", population_size=2, batch_size=2,
                    max_steps=1, max_new_tokens=8, eval_every=1, eval_samples=1, eval_ks=(1,), eval_limit=2,
                    eval_max_new_tokens=4)
    trainer = ESTrainer("demo", judge, rows(4), eval_dataset=rows(2), args=args)
    with pytest.raises(RewardFunctionError, match="reward function 'judge' raised ValueError: judge offline"):
        trainer.train()  # the step-0 held-out evaluation ran, then the first update failed
    assert [json.loads(r)["step"] for r in (tmp_path / "r/metrics.jsonl").read_text().splitlines()] == [0]
    state["broken"] = False
    assert trainer.train().steps == 1
    steps = [json.loads(r)["step"] for r in (tmp_path / "r/metrics.jsonl").read_text().splitlines()]
    assert steps == [0, 1]  # the failed attempt's rows are gone
    with pytest.raises(UserError, match=r"already holds a run \(checkpoint step_1\); pass --resume"):
        trainer.train()  # a run that has trained is still protected


def test_resume_refuses_other_data_and_other_rewards_unless_accepted(tmp_path):
    from esreason import ESConfig, ESTrainer

    def exact(completions, total, **kwargs):
        return [float(str(t) in c) for c, t in zip(completions, total)]

    def lenient(completions, total, **kwargs):
        return [1.0 for _ in completions]

    args = ESConfig(output_dir=str(tmp_path / "r"), task="surface-resume", population_size=2, batch_size=2,
                    max_steps=1, max_new_tokens=8)
    ESTrainer("demo", exact, rows(6), args=args).train()
    longer = args.replace(max_steps=2)
    with pytest.raises(UserError, match=r"--resume of .*: the training data changed \(6 problems, sha256 \w+ -> 7 "
                                        r"problems.* pass --accept-task-change \(accept_task_change=True in Python\)"):
        ESTrainer("demo", exact, rows(7), args=longer).train(resume_from_checkpoint=True)
    with pytest.raises(UserError, match=r"the reward changed \(functions \['exact'\] -> \['lenient'\]\)"):
        ESTrainer("demo", lenient, rows(6), args=longer).train(resume_from_checkpoint=True)
    with pytest.raises(UserError, match=r"the reward changed \(weights \[1.0\] -> \[0.5\]\)"):
        ESTrainer("demo", exact, rows(6), args=longer.replace(reward_weights=[0.5])).train(resume_from_checkpoint=True)
    result = ESTrainer("demo", lenient, rows(6), args=longer).train(resume_from_checkpoint=True,
                                                                    accept_task_change=True)
    assert result.steps == 2
    from esreason.es_loop.fingerprint import CHANGES_KEY, FINGERPRINT_KEY

    manifest = json.loads((tmp_path / "r/manifest.json").read_text())
    (change,) = manifest[CHANGES_KEY]
    assert change["at_step"] == 1 and change["to"] == manifest[FINGERPRINT_KEY]
    assert change["from"]["reward"]["functions"] == ["exact"] and change["to"]["reward"]["functions"] == ["lenient"]
    from esreason.cli import build_parser

    for method in ("es", "grpo"):  # the flag of both commands
        assert build_parser().parse_args(["train", method, "--resume", "--accept-task-change"]).accept_task_change


def test_grpo_comparator_gives_our_line_for_rewards_returned_as_strings(tmp_path):
    from esreason import GRPOComparator
    from esreason.verifiers.reward_functions import RewardFunctionError

    def as_text(completions, **kwargs):
        return ["1.0" for _ in completions]

    overrides = ["grpo.num_generations=2", "grpo.micro_batch_size=4", "train.batch_size=2", "train.max_steps=1",
                 "generation.max_new_tokens=8"]
    grpo = GRPOComparator("demo", as_text, rows(4), output_dir=tmp_path / "g", overrides=overrides,
                          task="surface-grpo-str")
    with pytest.raises(RewardFunctionError, match=r"^reward function 'as_text' returned '1.0' \(str\) for row 0: "
                                                  r"expected a number or None$"):
        grpo.train()


def test_grpo_resume_refuses_other_data_unless_accepted(tmp_path):
    from esreason import GRPOComparator

    overrides = ["grpo.num_generations=2", "grpo.micro_batch_size=4", "train.batch_size=2", "train.max_steps=1",
                 "generation.max_new_tokens=8", "grpo.lr_scheduler=constant"]

    def comparator(n: int, steps: int) -> GRPOComparator:
        return GRPOComparator("demo", zero, rows(n), output_dir=tmp_path / "g", task="surface-grpo-resume",
                              overrides=[*overrides, f"train.max_steps={steps}"])

    assert comparator(4, 1).train().steps == 1
    with pytest.raises(UserError, match=r"--resume of .*: the training data changed \(4 problems, .* -> 5 problems"):
        comparator(5, 2).train(resume_from_checkpoint=True)
    assert comparator(5, 2).train(resume_from_checkpoint=True, accept_task_change=True).steps == 2
    manifest = json.loads((tmp_path / "g/manifest.json").read_text())
    assert manifest["task_changes"][0]["at_step"] == 1 and manifest["fingerprint"]["data"]["problems"] == 5


def test_a_reward_model_id_is_refused_with_what_to_do(tmp_path):
    from esreason import ESTrainer, GRPOComparator

    message = r"reward_funcs: 'org/some-reward-model' is a string; TRL loads a string as a reward model"
    with pytest.raises(UserError, match=message):
        GRPOComparator("demo", "org/some-reward-model", rows(4), output_dir=tmp_path / "m", task="surface-rm")
    with pytest.raises(UserError, match=message):
        ESTrainer("demo", "org/some-reward-model", rows(4))


def zero(completions, **kwargs):
    return [0.0 for _ in completions]


def test_an_empty_dataset_says_so(tmp_path):
    from datasets import Dataset

    from esreason import ESConfig, ESTrainer

    with pytest.raises(UserError, match=r"^train_dataset is empty \(0 rows, no columns\)$"):
        ESTrainer("demo", zero, Dataset.from_list([]), args=ESConfig(output_dir=str(tmp_path / "e")))


def test_a_batch_larger_than_the_data_is_refused_through_the_api_and_the_run(tmp_path):
    """Refused rather than warned: every update would train on fewer prompts than B, which also changes
    the run's FLOPs and its match with GRPO (whose plan refuses the same case)."""
    from esreason import ESConfig, ESTrainer
    from esreason.config import load_config
    from esreason.es_loop.run import run_es

    fn = zero
    with pytest.raises(UserError, match=r"'batch_size' \(train.batch_size\): 8 prompts per update, but the training "
                                        r"split of task 'surface-few' \('train'\) has only 3 problems"):
        ESTrainer("demo", fn, rows(3), args=ESConfig(output_dir=str(tmp_path / "b"), task="surface-few", batch_size=8))
    cfg = load_config(None, ["task=demo-add", "train.limit=3", "train.batch_size=8", "train.max_steps=1"])
    with pytest.raises(UserError, match=r"config key 'train.batch_size': 8 prompts per update, .* only 3 problems"):
        run_es(cfg, tmp_path / "cli", progress=False)
    assert not (tmp_path / "cli/config.yaml").exists()  # refused before anything was written


def test_an_esconfig_in_trls_position_is_named(tmp_path):
    from esreason import ESConfig, ESTrainer

    with pytest.raises(UserError, match="TRL's GRPOTrainer has args third: pass args="):
        ESTrainer("demo", zero, ESConfig(output_dir=str(tmp_path / "o")))


@pytest.fixture
def clean_registry(monkeypatch):
    """The task registry as it was before the test."""
    from esreason.tasks import registry

    registry.names()
    saved = (dict(registry._TASKS), dict(registry._SOURCES), set(registry._DIRS), list(registry._SKIPPED))
    monkeypatch.delenv(registry.TASKS_DIR_ENV, raising=False)
    yield registry
    registry._TASKS.clear(); registry._TASKS.update(saved[0])  # noqa: E702
    registry._SOURCES.clear(); registry._SOURCES.update(saved[1])  # noqa: E702
    registry._DIRS.clear(); registry._DIRS.update(saved[2])  # noqa: E702
    registry._SKIPPED[:] = saved[3]


def test_a_task_file_key_typo_is_an_error_naming_key_and_file(clean_registry, tmp_path, capsys):
    from esreason.cli import main

    (tmp_path / "train.jsonl").write_text('{"q": "1+1", "a": "2"}\n')
    (tmp_path / "typo.yaml").write_text("task: typo-task\ndat: {train: train.jsonl}\nprompt: {field: q}\n"
                                        "gold: a\nverifier: math\n")
    (tmp_path / "es.yaml").write_text("model: demo\ntask: typo-task\n")  # a run config beside it stays skipped
    (tmp_path / "ok.yaml").write_text("task: typo-ok\ndata: {train: train.jsonl}\nprompt: {field: q}\ngold: a\n"
                                      "verifier: math\n")  # beside a good task file the typo was skipped silently
    assert main(["tasks", "--tasks-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (f"esreason: error: task file {tmp_path / 'typo.yaml'}: key 'dat': unknown key (did you mean "
                   "'data'?); known keys: task, description, data, dataset, prompt, gold, verifier, reward, "
                   "reward_weights, pass_threshold, scorer, vote, id, override"), err


def test_tasks_dir_before_the_command(clean_registry, tmp_path, capsys):
    from esreason.cli import main

    (tmp_path / "test.jsonl").write_text('{"q": "1+1", "a": "2"}\n')
    (tmp_path / "t.yaml").write_text("task: surface-global\ndata: {test: test.jsonl}\nprompt: {field: q}\n"
                                     "gold: a\nverifier: math\n")
    assert main(["--tasks-dir", str(tmp_path), "tasks", "--json"]) == 0
    assert "surface-global" in {t["name"] for t in json.loads(capsys.readouterr().out)["tasks"]}


def test_register_verifier_beside_register_task(clean_registry, tmp_path, capsys):
    import esreason
    from esreason import verifiers
    from esreason.cli import main
    from esreason.verifiers.base import Verdict

    def exact_factory(format_reward: float = 0.1):
        def score(response: str, gold: str) -> Verdict:
            ok = response.strip() == gold
            return Verdict(reward=float(ok), correct=ok, extracted=response.strip(), reason="exact")
        return score

    esreason.register_verifier("surface-exact", exact_factory)
    assert esreason.register_verifier is verifiers.register and "surface-exact" in verifiers.names()
    (tmp_path / "test.jsonl").write_text('{"q": "1+1", "a": "2"}\n')
    (tmp_path / "t.yaml").write_text("task: surface-exact-task\ndata: {test: test.jsonl}\nprompt: {field: q}\n"
                                     "gold: a\nverifier: surface-exact\n")
    assert main(["tasks", "--json", "--tasks-dir", str(tmp_path)]) == 0
    listed = {t["name"]: t for t in json.loads(capsys.readouterr().out)["tasks"]}
    assert listed["surface-exact-task"]["verifier"] == "surface-exact"
    task = clean_registry.get("surface-exact-task")
    assert task.scorer()(" 2", task.load("test")[0].gold).correct
