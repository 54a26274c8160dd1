"""The Python API on a task of our own that no file of the project mentions: ES and GRPO through the API
and through the CLI give the same checkpoints; evaluate() returns the CLI's keys; bad input is one line."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.heavy  # trained runs and CLI subprocesses (`--fast` leaves this file out)

SYSTEM = "Please reason step by step, and put your final answer within \\boxed{}."
REWARD = '''
import os
import re

BOXED = re.compile(r"\\\\boxed\\{([^}]*)\\}")
CALLS = {"n": 0}


def answer(text):
    found = BOXED.findall(text)
    return found[-1].strip() if found else None


def digits(completions, total, **kwargs):
    """Share of the total's digits right (aligned from the right)."""
    CALLS["n"] += 1
    limit = int(os.environ.get("REWARD_FAILS_AFTER", "0"))
    if limit and CALLS["n"] > limit:
        raise RuntimeError("judge unavailable")
    out = []
    for c, t in zip(completions, total):
        text = c if isinstance(c, str) else c[0]["content"]
        a, want = answer(text), str(t)
        out.append(0.0 if a is None else sum(x == y for x, y in zip(a[::-1], want[::-1])) / max(len(a), len(want)))
    return out
'''
ES = {"model": "demo", "task": "sum-all-carry", "es": {"population_size": 8, "sigma": 2e-3, "alpha": 1e-3},
      "train": {"batch_size": 8, "max_steps": 3, "seed": 0}, "generation": {"max_new_tokens": 64},
      "checkpoint": {"every": 1}, "backend": {"type": "batched"}}
GRPO = {"model": "demo", "task": "sum-all-carry", "grpo": {"num_generations": 2, "learning_rate": 1e-5,
                                                          "micro_batch_size": 16},
        "train": {"batch_size": 8, "max_steps": 2, "seed": 0}, "generation": {"temperature": 1.0, "max_new_tokens": 64},
        "checkpoint": {"every": 1}}


def _rows(n: int, rng: random.Random) -> list[dict]:
    out = []
    while len(out) < n:
        a, b = rng.randint(1000, 9999), rng.randint(1000, 9999)
        if all(int(x) + int(y) >= 9 for x, y in zip(str(a), str(b))):
            out.append({"a": a, "b": b, "total": a + b})
    return out


@pytest.fixture(scope="module")
def user_dir(tmp_path_factory) -> Path:
    """A fresh directory with a JSONL, a task file and a reward module in TRL's signature."""
    import yaml

    root = tmp_path_factory.mktemp("user-task")
    rng = random.Random(7)
    for split, n in (("train", 64), ("test", 16)):
        (root / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in _rows(n, rng)))
    (root / "my_reward.py").write_text(textwrap.dedent(REWARD))
    (root / "task.yaml").write_text(textwrap.dedent(f"""
        task: sum-all-carry
        data: {{train: train.jsonl, test: test.jsonl}}
        prompt: {{template: "{{a}}+{{b}}", system: "{SYSTEM.replace(chr(92), chr(92) * 2)}"}}
        reward: my_reward:digits
        vote: my_reward:answer
    """))
    (root / "es.yaml").write_text(yaml.safe_dump(ES))
    (root / "grpo.yaml").write_text(yaml.safe_dump(GRPO))
    return root


def cli(*args: str, env: dict | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "esreason.cli", *args], capture_output=True, text=True, cwd=cwd,
                          env={**os.environ, **(env or {})}, timeout=900)


def dataset(root: Path, split: str):
    from datasets import load_dataset

    ds = load_dataset("json", data_files={split: str(root / f"{split}.jsonl")})[split]
    return ds.map(lambda r: {"prompt": [{"role": "system", "content": SYSTEM},
                                        {"role": "user", "content": f"{r['a']}+{r['b']}"}]})


def reward_module(root: Path):
    sys.path.insert(0, str(root))
    try:
        import my_reward
    finally:
        sys.path.remove(str(root))
    return my_reward


def weights_hash(directory: Path) -> str:
    import hashlib

    return hashlib.sha256((directory / "model.safetensors").read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def cli_runs(user_dir, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("cli")
    for method in ("es", "grpo"):
        r = cli("train", method, "--config", str(user_dir / f"{method}.yaml"), "--tasks-dir", str(user_dir),
                "--output", str(out / method), "--no-progress")
        assert r.returncode == 0, r.stderr[-3000:]
    r = cli("eval", "--tasks-dir", str(user_dir), "--model", str(out / "es/checkpoints/step_3"), "--tasks",
            "sum-all-carry", "--samples", "4", "--k", "1,4", "--max-new-tokens", "64", "--output", str(out / "eval"),
            "--no-progress")
    assert r.returncode == 0, r.stderr[-3000:]
    return out


def test_es_through_the_api_equals_the_cli_run(user_dir, cli_runs, tmp_path):
    from esreason import ESConfig, ESTrainer

    args = ESConfig.from_yaml(user_dir / "es.yaml", output_dir=str(tmp_path / "api"))
    trainer = ESTrainer(model="demo", reward_funcs=reward_module(user_dir).digits,
                        train_dataset=dataset(user_dir, "train"), args=args)
    result = trainer.train()
    assert result.steps == 3
    for step in (1, 3):
        assert weights_hash(tmp_path / f"api/checkpoints/step_{step}") == \
            weights_hash(cli_runs / f"es/checkpoints/step_{step}")
    from esreason.embedded import demo_model_dir

    assert weights_hash(result.final_checkpoint) != weights_hash(demo_model_dir())  # the run moved
    manifest = json.loads((tmp_path / "api/manifest.json").read_text())
    assert manifest["config"]["task"] == "sum-all-carry" and manifest["model"]["sha256_tensors"]


def test_the_flat_config_is_the_yaml_config(user_dir):
    from esreason import ESConfig
    from esreason.api.config import FIELD_KEYS, yaml_keys
    from esreason.config import load_config, to_dict

    assert sorted(FIELD_KEYS.values()) == sorted(yaml_keys())  # every YAML key has one flat field
    flat = ESConfig.from_yaml(user_dir / "es.yaml")
    assert to_dict(flat.to_run_config()) == to_dict(load_config(user_dir / "es.yaml"))
    with pytest.raises(Exception, match=r"config key 'population_size' \(es.population_size\): must be >= 2"):
        ESConfig(population_size=1)


def test_grpo_through_the_api_equals_the_cli_run(user_dir, cli_runs, tmp_path):
    from esreason import GRPOComparator

    grpo = GRPOComparator("demo", reward_module(user_dir).digits, dataset(user_dir, "train"),
                          str(user_dir / "grpo.yaml"), output_dir=tmp_path / "grpo", task="sum-all-carry")
    assert grpo.train().steps == 2
    assert weights_hash(tmp_path / "grpo/checkpoints/step_2") == weights_hash(cli_runs / "grpo/checkpoints/step_2")
    rows = [json.loads(line) for line in (cli_runs / "grpo/metrics.jsonl").read_text().splitlines()]
    assert {"reward/mean", "accuracy/mean", "rewards/digits/mean"} <= set(rows[-1])  # TRL saw our user's function


def test_evaluate_returns_the_cli_summary_keys(user_dir, cli_runs):
    from esreason import evaluate

    module = reward_module(user_dir)
    ckpt = cli_runs / "es/checkpoints/step_3"
    got = evaluate(str(ckpt), dataset(user_dir, "test"), reward_funcs=module.digits, answer_fn=module.answer,
                   n=4, k=[1, 4], max_new_tokens=64, name="sum-all-carry")  # the call seeds hash the name
    summary = json.loads((cli_runs / "eval/summary.json").read_text())["average"]["metrics"]
    for key in ("pass@1", "pass@4", "maj@4", "entropy", "tokens", "formatted"):
        assert got[key] == pytest.approx(summary[key]["value"], abs=1e-12), key  # the same samples and verdicts
    assert got["num_problems"] == 16 and set(got["ci"]) >= {"pass@1", "pass@4"}
    plain = evaluate(str(ckpt), dataset(user_dir, "test"), reward_funcs=module.digits, n=4, k=[1, 4],
                     max_new_tokens=64, ci_resamples=0, name="sum-all-carry")
    assert "maj@4" not in plain and "answer_fn" in plain["notes"]["maj@k"] and plain["pass@4"] == got["pass@4"]


def test_resume_and_save_model_through_the_api(user_dir, cli_runs, tmp_path):
    from transformers import AutoModelForCausalLM

    from esreason import ESConfig, ESTrainer

    module, ds = reward_module(user_dir), dataset(user_dir, "train")
    args = ESConfig.from_yaml(user_dir / "es.yaml", output_dir=str(tmp_path / "r")).replace(max_steps=2)
    ESTrainer("demo", module.digits, ds, args=args).train()
    longer = ESTrainer("demo", module.digits, ds, args=args.replace(max_steps=3))
    with pytest.raises(Exception, match="already holds a run"):
        longer.train()
    assert longer.train(resume_from_checkpoint=tmp_path / "r/checkpoints/step_1").steps == 3
    assert weights_hash(tmp_path / "r/checkpoints/step_3") == weights_hash(cli_runs / "es/checkpoints/step_3")
    saved = longer.save_model(tmp_path / "final")
    model = AutoModelForCausalLM.from_pretrained(saved)
    assert (saved / "tokenizer_config.json").exists() and model.num_parameters() > 0
    assert weights_hash(saved) == weights_hash(tmp_path / "r/checkpoints/step_3")


def test_an_in_memory_model_trains_like_its_directory(user_dir, cli_runs, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from esreason import ESConfig, ESTrainer
    from esreason.embedded import demo_model_dir

    model = AutoModelForCausalLM.from_pretrained(demo_model_dir())
    args = ESConfig.from_yaml(user_dir / "es.yaml", output_dir=str(tmp_path / "m"))
    trainer = ESTrainer(model, reward_module(user_dir).digits, dataset(user_dir, "train"),
                        args=args.replace(backend="hf", max_steps=1), processing_class=AutoTokenizer.from_pretrained(
                            demo_model_dir()))
    trainer.train()
    assert weights_hash(tmp_path / "m/checkpoints/step_1") == weights_hash(cli_runs / "es/checkpoints/step_1")
    assert json.loads((tmp_path / "m/manifest.json").read_text())["model"]["sha256_state_dict"]


def test_a_failing_reward_function_stops_with_one_line_and_keeps_the_last_checkpoint(user_dir, tmp_path):
    # 8 members per update, one call each: the 17th call is in update 3
    r = cli("train", "es", "--config", str(user_dir / "es.yaml"), "--tasks-dir", str(user_dir), "--output",
            str(tmp_path / "f"), "--no-progress", env={"REWARD_FAILS_AFTER": "16"})
    assert r.returncode == 2, r.stderr[-2000:]
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("esreason: error: reward function 'digits' raised RuntimeError: judge unavailable "
                           "(called on 8 completions, first row: prompt [{'role': 'system'"), last
    assert "Traceback" not in r.stderr
    from esreason.io.verify import verify_checkpoint

    ckpts = sorted(p.name for p in (tmp_path / "f/checkpoints").iterdir())
    assert ckpts == ["step_1", "step_2"]
    verify_checkpoint(tmp_path / "f/checkpoints/step_2")
    r = cli("train", "es", "--config", str(user_dir / "es.yaml"), "--tasks-dir", str(user_dir), "--output",
            str(tmp_path / "f"), "--resume", "--no-progress")
    assert r.returncode == 0, r.stderr[-2000:]


def test_bad_datasets_and_arguments_are_one_line(user_dir, tmp_path):
    from esreason import ESConfig, ESTrainer
    from esreason.errors import UserError

    fn = reward_module(user_dir).digits
    with pytest.raises(UserError, match=r"train_dataset has no 'prompt' column; its columns are: a, b, total"):
        ESTrainer("demo", fn, dataset(user_dir, "train").remove_columns("prompt"), args=ESConfig(output_dir=str(tmp_path)))
    with pytest.raises(UserError, match=r"row 0 has no 'prompt'; its columns are: question"):
        ESTrainer("demo", fn, [{"question": "1+1"}], args=ESConfig(output_dir=str(tmp_path)))
    with pytest.raises(UserError, match="column 'completions' is reserved"):
        ESTrainer("demo", fn, [{"prompt": "1+1", "completions": 2}], args=ESConfig(output_dir=str(tmp_path)))
    with pytest.raises(UserError, match="reward_funcs: a train_dataset needs reward functions"):
        ESTrainer("demo", None, [{"prompt": "1+1"}], args=ESConfig(output_dir=str(tmp_path)))
    with pytest.raises(UserError, match="resume_from_checkpoint: .* is not a checkpoint of"):
        ESTrainer("demo", fn, [{"prompt": "1+1", "total": 2}],
                  args=ESConfig(output_dir=str(tmp_path / "x"), batch_size=1)).train(
            resume_from_checkpoint=tmp_path / "elsewhere/step_1")


def test_the_lock_and_wandb_hold_for_api_runs(user_dir, tmp_path):
    from esreason import ESConfig, ESTrainer
    from esreason.io.lock import directory_lock

    args = ESConfig.from_yaml(user_dir / "es.yaml", output_dir=str(tmp_path / "w"), wandb_project="esreason-test",
                              wandb_mode="offline").replace(max_steps=1)
    trainer = ESTrainer("demo", reward_module(user_dir).digits, dataset(user_dir, "train"), args=args)
    lock_holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import sys, time
        from esreason.io.lock import directory_lock
        with directory_lock({str(tmp_path / 'w')!r}):
            print("held", flush=True)
            sys.stdin.readline()
    """)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert lock_holder.stdout.readline().strip() == "held"
        with pytest.raises(Exception, match="is in use"):
            trainer.train()
    finally:
        lock_holder.communicate("\n", timeout=60)
    with directory_lock(tmp_path / "w"):  # re-entrant in this process: the run takes it again
        trainer.train()
    assert list((tmp_path / "w/wandb").glob("offline-run-*"))
