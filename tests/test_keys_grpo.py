"""Every key of the GRPO run config, set to a non-default value, does what docs/config.md says.

A few tiny GRPO runs through :class:`esreason.GRPOComparator` (tests/key_runs.py: B = 2 prompts x
G = 2 responses, 6 new tokens on the session's tiny random model, about 2 s each) each change
several independent keys; one test per key checks that key's effect on what the run did (the
rollouts the sampler drew for TRL, the held-out evaluation, the files written). The settings TRL
itself implements (the optimizer, the schedule, the clip, vLLM's rollout engine) are checked
where they reach TRL's ``GRPOConfig``, the object that uses them; tests/documented_keys.py names
the existing tests that check the objective's keys against a reference loss.
"""

from __future__ import annotations

import json
import textwrap

import pytest

from key_runs import ROWS, grpo_run, text_reward
from test_keys_es import FakeWandb, file_prompts, user_tasks  # noqa: F401  (a fixture)

pytestmark = pytest.mark.heavy  # trained GRPO runs: the fast subset (`--fast`) leaves this file out


@pytest.fixture(scope="module")
def runs(tmp_path_factory, tiny_model_dir):
    """``runs(name, **dotted)``: a GRPO run with GRPO_BASE changed by ``dotted``, once per module and name."""
    cache: dict[str, tuple] = {}
    root = tmp_path_factory.mktemp("grpo-keys")

    def get(name: str, *, reward="default", patch=None, api=None, **dotted):
        if name not in cache:
            with pytest.MonkeyPatch.context() as mp:
                if patch:
                    patch(mp)
                kw = {} if reward == "default" else {"reward": reward}
                cache[name] = (dotted, grpo_run(root / name, mp, tiny_model_dir, **kw, settings=dotted, api=api))
        assert cache[name][0] == dotted, f"run {name!r} was trained with other settings"
        return cache[name][1]
    return get


def k(**flat):
    """``train__batch_size=3`` -> ``{"train.batch_size": 3}``."""
    return {key.replace("__", "."): value for key, value in flat.items()}


def rollout_prompts(run) -> set[str]:
    return {p for r in run.rollouts for p in r.prompts}


# --------------------------------------------------------------------------- top level


def test_model(runs):
    run = runs("base")
    assert json.loads((run.result.final_checkpoint / "config.json").read_text())["hidden_size"] == 32
    assert run.update().abs().max() > 0  # it trained the tiny model


@pytest.fixture(scope="module")
def from_file(runs, user_tasks):
    """task + train.split: train on the test split of keys-file, a task-file task (tests/test_keys_es.py)."""
    return runs("from-file", reward=None, **k(task="keys-file", train__split="test"))


def test_task(from_file, user_tasks):
    assert rollout_prompts(from_file) <= file_prompts(user_tasks, "keys-file", "train") | file_prompts(
        user_tasks, "keys-file", "test")
    assert list(json.loads((from_file.out / "manifest.json").read_text())["datasets"]) == ["keys-file"]


def test_split(from_file, user_tasks):
    assert rollout_prompts(from_file) <= file_prompts(user_tasks, "keys-file", "test")


def test_tasks_dir(tmp_path, monkeypatch, tiny_model_dir, user_tasks):
    """The run registers the task files of ``tasks_dir`` before it looks its task up (stopped once the
    task's problems are loaded)."""
    from esreason.grpo import plan

    loaded = []

    def plan_batches(cfg, problems, *args, **kwargs):
        loaded.append(problems)
        raise RuntimeError("stop: problems loaded")

    monkeypatch.setattr(plan, "plan_batches", plan_batches)
    with pytest.raises(RuntimeError, match="stop: problems loaded"):
        grpo_run(tmp_path / "r", monkeypatch, tiny_model_dir, reward=None,
                 settings=k(task="keys-dir", tasks_dir=str(user_tasks / "keys-dir")))
    assert loaded == [6]  # keys-dir's train split


def test_data_path(runs, user_tasks):
    run = runs("data_path", reward=None, **k(task="keys-file", data_path=str(user_tasks / "other.jsonl")))
    assert rollout_prompts(run) <= {"1+9=", "2+9=", "3+9="}


def test_dtype_reaches_the_model_loader(tmp_path, monkeypatch, tiny_model_dir):
    from esreason.backends import hf

    asked = []

    def load_model(spec, dtype="float32", device="cpu", run_device=None):
        asked.append((dtype, device))
        raise RuntimeError("stop: model asked for")

    monkeypatch.setattr(hf, "load_model", load_model)
    with pytest.raises(RuntimeError, match="stop: model asked for"):
        grpo_run(tmp_path / "r", monkeypatch, tiny_model_dir, settings=k(dtype="bfloat16"))
    assert asked == [("bfloat16", "cpu")]


def test_device_reaches_trl(tmp_path, monkeypatch, tiny_model_dir):
    """``device: cuda`` needs a GPU: here CUDA is said to be there, and TRL's arguments place the run on it."""
    import torch

    from esreason.grpo import trainer

    given = []

    def make_grpo_config(kwargs):
        given.append(kwargs)
        raise RuntimeError("stop: no GPU here")

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(trainer, "make_grpo_config", make_grpo_config)
    with pytest.raises(RuntimeError, match="stop: no GPU here"):
        grpo_run(tmp_path / "r", monkeypatch, tiny_model_dir, settings=k(device="cuda"))
    assert given[0]["use_cpu"] is False


# --------------------------------------------------------------------------- train and generation


@pytest.fixture(scope="module")
def trained(runs):
    """Two updates with the train, generation and checkpoint keys changed."""
    return runs("trained", **k(train__batch_size=3, grpo__micro_batch_size=6, train__max_steps=2, train__seed=1,
                               train__limit=7, train__stream_start=1, generation__temperature=0.7,
                               generation__top_p=0.5, generation__max_new_tokens=5, checkpoint__keep_last=1,
                               checkpoint__keep_trainer_states=1))


def test_batch_size(trained):
    assert [len(r.prompts) for r in trained.rollouts] == [3 * 2, 3 * 2]  # B prompts x G responses per update


def test_max_steps(trained):
    assert trained.result.steps == 2 and [m["step"] for m in trained.metrics] == [1, 2]


def test_seed(trained, runs):
    assert trained.rollouts[0].params.seed != runs("base").rollouts[0].params.seed


def test_limit(trained):
    from esreason.es.schedule import stream_items

    assert rollout_prompts(trained) <= {r["prompt"] for r in ROWS[:7]}
    assert max(stream_items(len(ROWS), 1, 1, 2 * 3)) >= 7  # without the limit the stream reaches further


def test_stream_start(trained):
    """A composition stage reads the shared stream from its position, in order (no reshuffle)."""
    from esreason.es.schedule import stream_items

    order = stream_items(7, 1, 1, 2 * 3)  # 7 problems, seed 1, from position 1, two updates of 3
    want = [ROWS[i]["prompt"] for i in order]
    got = [p for r in trained.rollouts for p in r.prompts[::2]]  # G = 2 copies of each prompt
    assert got == want


def test_generation_temperature_top_p_and_max_new_tokens(trained):
    params = {(r.params.temperature, r.params.top_p, r.params.max_new_tokens) for r in trained.rollouts}
    assert params == {(0.7, 0.5, 5)}
    assert max(len(t) for r in trained.rollouts for t in r.token_ids) <= 5


def test_keep_last(trained):
    assert [p.name for p in (trained.out / "checkpoints").iterdir()] == ["step_2"]


def test_keep_trainer_states(trained):
    assert [p.name for p in (trained.out / "trl").iterdir() if p.name.startswith("checkpoint-")] == ["checkpoint-2"]


@pytest.fixture(scope="module")
def fake_wandb():
    return FakeWandb()


@pytest.fixture(scope="module")
def by_epochs(runs, fake_wandb):
    """Epochs instead of max_steps, checkpoints every 3rd update and W&B (a fake: esreason's run and
    table; TRL's own W&B callback is switched off, tests/test_wandb_logging.py runs it)."""
    from esreason.grpo import trainer
    from esreason.io import wandb_log

    def patch(mp):
        args_for_run = trainer.trl_args_for_run
        mp.setattr(wandb_log, "import_wandb", lambda: fake_wandb)
        mp.setattr(trainer, "trl_args_for_run", lambda *a, **kw: {**args_for_run(*a, **kw), "report_to": "none"})

    return runs("by-epochs", patch=patch, **k(
        train__max_steps=None, train__epochs=2, train__limit=4, checkpoint__every=3,
        logging__wandb__project="keys-project", logging__wandb__entity="keys-team", logging__wandb__mode="offline",
        logging__wandb__group="keys-group", logging__wandb__name="keys-name", logging__wandb__table_every=3,
        logging__wandb__table_rows=1))


def test_epochs(by_epochs):
    assert by_epochs.result.steps == 4  # 2 epochs of 4 problems, 2 per update


def test_checkpoint_every(by_epochs):
    assert sorted(p.name for p in (by_epochs.out / "checkpoints").iterdir()) == ["step_3", "step_4"]  # and the last


def test_wandb_keys(by_epochs, fake_wandb):
    (init,) = fake_wandb.inits
    assert {key: init[key] for key in ("project", "entity", "mode", "group", "name")} == {
        "project": "keys-project", "entity": "keys-team", "mode": "offline", "group": "keys-group", "name": "keys-name"}
    assert init["job_type"] == "grpo"
    tables = [data["completions"] for data, _ in fake_wandb.logged if "completions" in data]
    assert len(tables) == 1 and len(tables[0]["data"]) == 1  # update 3 of 4, one row
    assert [data["update"] for data, _ in fake_wandb.logged] == [1, 2, 3, 4]


# --------------------------------------------------------------------------- eval


@pytest.fixture(scope="module")
def evaluated(runs, user_tasks, tmp_path_factory):
    data = tmp_path_factory.mktemp("grpo-data") / "keys-file"
    data.mkdir()
    (data / "train.jsonl").write_text("".join(json.dumps({"a": a, "b": 8, "total": a + 8}) + "\n" for a in (1, 2, 3)))
    return runs("evaluated", **k(eval__every=1, eval__tasks=["keys-file"], eval__samples=3, eval__temperature=1.3,
                                 eval__max_new_tokens=5, eval__ks=[2, 3], eval__limit=2, eval__greedy=False,
                                 eval__split="train", data_dir=str(data.parent), generation__batch_size=1))


def test_eval_every(evaluated):
    rows = evaluated.metrics
    assert [m["step"] for m in rows if "heldout/pass@2" in m] == [0, 1]  # the start and every update


def test_eval_tasks_split_limit_and_data_dir(evaluated):
    assert {p for c in evaluated.calls for p in c.prompts} == {"1+8=", "2+8="}  # data_dir's train file, limit 2
    assert "heldout/keys-file/pass@2" in evaluated.metrics[0]


def test_eval_samples_temperature_and_max_new_tokens(evaluated):
    assert {(len(c.prompts), c.params.temperature, c.params.max_new_tokens) for c in evaluated.calls} == {(2 * 3, 1.3, 5)}


def test_eval_ks_and_greedy(evaluated):
    row = evaluated.metrics[0]
    assert {"heldout/pass@2", "heldout/pass@3"} <= set(row) and "heldout/pass@1" not in row
    assert not any(key.endswith("greedy_acc") for key in row)


def test_generation_batch_size(evaluated):
    assert {r for c in evaluated.calls for r in c.forward_rows} == {1}


# --------------------------------------------------------------------------- grpo


def test_num_generations(runs):
    assert [len(r.prompts) for r in runs("base").rollouts] == [2 * 2]  # G = 2 (default 8) responses per prompt
    assert runs("base").metrics[0]["rollouts"] == 4


def test_format_reward_reaches_the_verifier(tmp_path, monkeypatch, tiny_model_dir):
    """The task's scorer TRL's reward functions wrap pays a formatted wrong answer ``grpo.format_reward``."""
    from esreason.grpo import reward
    from esreason.tasks import registry

    d = tmp_path / "task"
    d.mkdir()
    (d / "data.jsonl").write_text("".join(json.dumps({"a": a, "b": 1, "gold": a + 1}) + "\n" for a in range(4)))
    (d / "boxed.yaml").write_text(textwrap.dedent("""
        task: keys-boxed
        data: {train: data.jsonl}
        prompt: {template: "{a}+{b}", chat: false}
        gold: gold
        verifier: math
    """))
    monkeypatch.setenv(registry.TASKS_DIR_ENV, "")  # restored afterwards (add_tasks_dir extends it)
    registry.add_tasks_dir(d)
    scorers = []

    def trl_rewards(problems, tokenizer, scorer):
        scorers.append(scorer)
        raise RuntimeError("stop: scorer seen")

    monkeypatch.setattr(reward, "trl_rewards", trl_rewards)
    try:
        with pytest.raises(RuntimeError, match="stop: scorer seen"):
            grpo_run(tmp_path / "r", monkeypatch, tiny_model_dir, reward=None,
                     settings=k(task="keys-boxed", grpo__format_reward=0.5))
    finally:
        registry._TASKS.pop("keys-boxed", None)
        registry._SOURCES.pop("keys-boxed", None)
        registry._DIRS.discard(d.resolve())
    verdict = scorers[0]("so \\boxed{7}", "8")
    assert verdict.formatted and not verdict.correct and verdict.reward == 0.5


def _trl(tmp_path, **dotted):
    """TRL's GRPOConfig (and the kwargs it was built from) for the GRPO defaults with ``dotted`` set."""
    from esreason.grpo.config import load_grpo_config
    from esreason.grpo.plan import plan_batches
    from esreason.grpo.trainer import build_trl_args, make_grpo_config

    cfg = load_grpo_config(None, ["train.batch_size=4", "grpo.num_generations=2", "train.max_steps=3",
                                  *[f"{key}={value}" for key, value in dotted.items()]])
    kwargs = build_trl_args(cfg, plan_batches(cfg, 64), tmp_path)
    return kwargs, (None if dotted.get("grpo.bf16") or dotted.get("device") else make_grpo_config(kwargs))


#: key -> (value, check on TRL's GRPOConfig). The optimizer, clipping and schedule are TRL's (transformers').
TRL_KEYS = {
    "grpo.mini_batch_size": (2, lambda a: (a.max_steps, a.gradient_accumulation_steps) == (3 * 2, 2)),
    "grpo.micro_batch_size": (4, lambda a: (a.per_device_train_batch_size, a.gradient_accumulation_steps) == (4, 2)),
    "grpo.weight_decay": (0.5, lambda a: a.weight_decay == 0.5),
    "grpo.adam_beta1": (0.5, lambda a: a.adam_beta1 == 0.5),
    "grpo.adam_beta2": (0.5, lambda a: a.adam_beta2 == 0.5),
    "grpo.adam_epsilon": (1e-3, lambda a: a.adam_epsilon == 1e-3),
    "grpo.max_grad_norm": (0.5, lambda a: a.max_grad_norm == 0.5),
    "grpo.warmup_updates": (2, lambda a: (a.warmup_steps, a.lr_scheduler_type) == (2, "constant_with_warmup")),
    "grpo.lr_scheduler": ("cosine", lambda a: a.lr_scheduler_type == "cosine"),
    "grpo.gradient_checkpointing": ("true", lambda a: a.gradient_checkpointing is True),
    "grpo.vllm_gpu_memory_utilization": (0.6, lambda a: a.vllm_gpu_memory_utilization == 0.6),
}


@pytest.mark.parametrize("key", sorted(TRL_KEYS))
def test_reaches_trls_grpo_config(key, tmp_path):
    value, check = TRL_KEYS[key]
    _, args = _trl(tmp_path, **{key: value})
    assert check(args), key
    _, default = _trl(tmp_path)
    assert not check(default), f"{key}: the default already passes the check"


def test_bf16_reaches_trl(tmp_path):
    """bf16 autocast needs a GPU: the value reaches the arguments TRL's GRPOConfig is built from."""
    kwargs, _ = _trl(tmp_path, **{"device": "cuda", "grpo.bf16": "true"})
    assert kwargs["bf16"] is True and _trl(tmp_path, device="cuda")[0]["bf16"] is False


# --------------------------------------------------------------------------- GRPOComparator's parameters


def test_comparator_model_wins_over_the_config(tiny_model_dir):
    from esreason import GRPOComparator

    grpo = GRPOComparator(str(tiny_model_dir), text_reward, ROWS, overrides=["model=demo"])
    assert grpo.config.model == str(tiny_model_dir)  # the config run_grpo trains (its `model`: test_model)


def test_comparator_reward_funcs_and_train_dataset(runs):
    run = runs("base")
    assert rollout_prompts(run) <= {r["prompt"] for r in ROWS}
    raw = [r for call in run.rewards for r in call]
    assert len(raw) == 4 and run.metrics[0]["rewards/text_reward/mean"] == pytest.approx(sum(raw) / 4, abs=1e-6)


def test_comparator_args(tmp_path):
    from esreason import GRPOComparator
    from esreason.grpo.config import load_grpo_config

    path = tmp_path / "grpo.yaml"
    path.write_text("train: {batch_size: 6}\ngrpo: {beta: 0.0}\n")
    assert GRPOComparator(args=str(path)).config == load_grpo_config(path)
    given = load_grpo_config(None, ["train.max_steps=9"])
    assert GRPOComparator(args=given).config is given


def test_comparator_output_dir_and_overrides(runs):
    run = runs("base")  # GRPO_BASE's keys arrive as overrides
    assert (run.out / "metrics.jsonl").is_file() and run.result.final_checkpoint.parent.parent == run.out
    assert (run.config.train.batch_size, run.config.grpo.num_generations) == (2, 2)
    assert [len(r.prompts) for r in run.rollouts] == [2 * 2]


def test_comparator_reward_weights_and_pass_threshold(runs):
    run = runs("weighted", api={"reward_weights": [2.0], "pass_threshold": 0.5})
    combined = [2 * r for call in run.rewards for r in call]
    m = run.metrics[0]
    assert m["reward/mean"] == pytest.approx(sum(combined) / len(combined), abs=1e-6)
    assert m["accuracy/mean"] == pytest.approx(sum(c >= 0.5 for c in combined) / len(combined))
    assert 0 < m["accuracy/mean"] < 1


def test_comparator_task(runs, user_tasks):
    from esreason import GRPOComparator

    named = runs("named", api={"task": "keys-named"})
    assert list(json.loads((named.out / "manifest.json").read_text())["datasets"]) == ["keys-named"]
    assert GRPOComparator(task="keys-file").config.task == "keys-file"  # without reward_funcs: a registered task


def test_comparator_train_resume_from_checkpoint(monkeypatch):
    from esreason import GRPOComparator
    from esreason.grpo import run

    asked = []
    monkeypatch.setattr(run, "run_grpo", lambda cfg, out, *, resume=False, **kw: asked.append(resume))
    GRPOComparator().train(resume_from_checkpoint=True)
    GRPOComparator().train()
    assert asked == [True, False]
