"""End-to-end GRPO runs on CPU on the embedded default: run directory, checkpoints that feed
ES and the evaluator, held-out tracking, exact resume, CLI, bad input."""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import pytest

from esreason.config import ConfigError
from esreason.errors import UserError
from esreason.grpo.config import load_grpo_config
from esreason.grpo.run import register, run_grpo
from esreason.io.hashing import hash_directory_safetensors

pytestmark = pytest.mark.heavy  # the fast subset (`--fast`) leaves this file out: tests/conftest.py


@pytest.fixture(scope="module")
def demo_dir():
    from esreason.embedded import demo_model_dir

    return demo_model_dir()


def small_cfg(model_dir, *extra):
    """B = 4 prompts x G = 4 responses, 40 tokens; lr large enough to move the 0.87M model."""
    return load_grpo_config(None, [
        f"model={model_dir}", "task=demo-add", "train.limit=8", "train.batch_size=4", "train.max_steps=2",
        "grpo.num_generations=4", "grpo.micro_batch_size=16", "grpo.learning_rate=1e-4",
        "generation.max_new_tokens=40", "checkpoint.every=1", "eval.every=0", *extra])


def metrics(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def demo_run(demo_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("grpo") / "run"
    cfg = small_cfg(demo_dir, "eval.every=2", "eval.samples=4", "eval.ks=1,4", "eval.limit=4")
    return out, run_grpo(cfg, out, progress=False)


def test_run_logs_kl_entropy_clip_and_heldout_per_update(demo_run):
    out, result = demo_run
    assert result.steps == 2 and result.final_checkpoint == out / "checkpoints" / "step_2"
    rows = metrics(out)
    assert [r["step"] for r in rows] == [0, 1, 2]
    for r in rows[1:]:
        for key in ("kl", "entropy", "clip_ratio/region_mean", "loss", "grad_norm", "reward/mean",
                    "accuracy/mean", "format/mean", "completions/mean_length", "optimizer_steps", "time/step"):
            assert math.isfinite(r[key]), key
        assert 0 < r["entropy"] < math.log(100)
    assert rows[1]["kl"] == 0.0 and rows[2]["kl"] > 0  # the policy left the reference after one update
    for r in (rows[0], rows[2]):  # held-out set at update 0 and every eval.every updates
        assert {"heldout/pass@1", "heldout/pass@4", "heldout/entropy"} <= set(r)
        assert r["heldout/pass@1"] <= r["heldout/pass@4"]
    assert "heldout/pass@1" not in rows[1]
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["trainer"]["trl_version"] == "1.16.0"
    assert manifest["trainer"]["trl_args"]["loss_type"] == "grpo"
    assert (out / "trl" / "checkpoint-2" / "optimizer.pt").is_file()
    state = json.loads((out / "checkpoints" / "step_2" / "grpo_state.json").read_text())
    assert state["step"] == 2 and state["trl_checkpoint"] == "trl/checkpoint-2"


def test_heldout_tracking_does_not_change_training(demo_run, demo_dir, tmp_path):
    out, result = demo_run
    plain = run_grpo(small_cfg(demo_dir), tmp_path / "plain", progress=False)  # eval.every=0
    assert hash_directory_safetensors(plain.final_checkpoint) == hash_directory_safetensors(result.final_checkpoint)
    assert [r["loss"] for r in metrics(tmp_path / "plain")] == [r["loss"] for r in metrics(out)[1:]]


def test_checkpoint_is_plain_hf_and_feeds_es_and_the_evaluator(demo_run, demo_dir, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from esreason.config import load_config
    from esreason.es_loop.run import run_es
    from esreason.eval import evaluate

    out, result = demo_run
    ckpt = result.final_checkpoint
    model = AutoModelForCausalLM.from_pretrained(ckpt)
    tok = AutoTokenizer.from_pretrained(ckpt)
    assert tok("1+2")["input_ids"] and model.config.vocab_size == 100
    assert hash_directory_safetensors(ckpt) != hash_directory_safetensors(demo_dir)

    es_cfg = load_config(None, [f"model={ckpt}", "task=demo-add", "train.limit=4", "train.batch_size=2",
                                "train.max_steps=1", "es.population_size=2", "generation.max_new_tokens=40",
                                "checkpoint.every=1"])
    es = run_es(es_cfg, tmp_path / "es", progress=False)
    assert es.steps == 1 and (es.final_checkpoint / "config.json").is_file()
    es_manifest = json.loads((tmp_path / "es" / "manifest.json").read_text())
    assert es_manifest["model"]["sha256_tensors"] == hash_directory_safetensors(ckpt)

    summary = evaluate(str(ckpt), "demo-add", output_dir=tmp_path / "eval", samples=2, limit=4,
                       max_new_tokens=40, ks=[1, 2], ci_resamples=0, progress=False)
    assert summary is not None and (tmp_path / "eval").is_dir()


def test_zero_learning_rate_leaves_weights_bit_identical(demo_dir, tmp_path):
    res = run_grpo(small_cfg(demo_dir, "grpo.learning_rate=0", "train.max_steps=1"), tmp_path / "run",
                   progress=False)
    assert hash_directory_safetensors(res.final_checkpoint) == hash_directory_safetensors(demo_dir)


def test_data_order_is_a_function_of_seed_and_epoch():
    from esreason.grpo.trainer import EpochSeededRepeatSampler

    def sampler(seed=0):
        return EpochSeededRepeatSampler(list(range(10)), mini_repeat_count=2, batch_size=3, seed=seed)

    s = sampler()
    epoch0, again = list(s), list(s)
    s.set_epoch(1)
    epoch1 = list(s)
    fresh = sampler()  # a resumed run builds a new sampler and jumps to epoch 1
    fresh.set_epoch(1)
    assert epoch0 == again and list(fresh) == epoch1 and epoch0 != epoch1
    assert len(epoch0) == 3 * 3 * 2  # 10 // 3 full batches of 3 prompts, each twice; the tail is dropped
    assert epoch0[0::2] == epoch0[1::2]  # a prompt's G copies are adjacent (one group)
    assert list(sampler(seed=1)) != epoch0


def resume_cfg(model_dir):
    """3 updates per epoch (6 prompts, B = 2), 2 optimizer steps per update, 5 updates: a kill
    during update 5 resumes from step 4, in the middle of epoch 1."""
    return small_cfg(model_dir, "train.limit=6", "train.batch_size=2", "grpo.mini_batch_size=1",
                     "grpo.micro_batch_size=4", "train.max_steps=5", "checkpoint.every=2")


def test_resume_after_kill_is_bit_identical(demo_dir, tmp_path, monkeypatch):
    from esreason.grpo.trainer import PaperGRPOTrainer
    from esreason.io import RunDir

    full = run_grpo(resume_cfg(demo_dir), tmp_path / "full", progress=False)
    original = PaperGRPOTrainer._generate_and_score_completions
    calls = []

    def dying(self, inputs):
        calls.append(1)
        if len(calls) == 5:
            raise KeyboardInterrupt  # killed while sampling update 5; step_4 is the last checkpoint
        return original(self, inputs)

    monkeypatch.setattr(PaperGRPOTrainer, "_generate_and_score_completions", dying)
    with pytest.raises(KeyboardInterrupt):
        run_grpo(resume_cfg(demo_dir), tmp_path / "killed", progress=False)
    monkeypatch.setattr(PaperGRPOTrainer, "_generate_and_score_completions", original)
    assert [step for step, _ in RunDir(tmp_path / "killed").list_checkpoints()] == [2, 4]

    resumed = run_grpo(resume_cfg(demo_dir), tmp_path / "killed", resume=True, progress=False)
    assert resumed.steps == 5
    assert hash_directory_safetensors(resumed.final_checkpoint) == hash_directory_safetensors(full.final_checkpoint)
    a, b = metrics(tmp_path / "full"), metrics(tmp_path / "killed")
    assert [r["step"] for r in b] == [1, 2, 3, 4, 5]
    for key in ("reward/mean", "loss", "kl", "entropy", "grad_norm", "epoch"):
        assert [r[key] for r in a] == [r[key] for r in b], key


def test_bad_input_is_a_user_error(demo_dir, demo_run, tmp_path):
    out, _ = demo_run
    with pytest.raises(UserError, match="already holds a run"):
        run_grpo(small_cfg(demo_dir), out, progress=False)
    with pytest.raises(UserError, match="different config"):
        run_grpo(small_cfg(demo_dir, "grpo.beta=0.01", "eval.every=2", "eval.samples=4", "eval.ks=1,4",
                           "eval.limit=4"), out, resume=True, progress=False)
    with pytest.raises(UserError, match="train.batch_size"):
        run_grpo(small_cfg(demo_dir, "train.limit=3"), tmp_path / "few", progress=False)
    with pytest.raises(UserError, match="unknown task|demo-mul"):
        run_grpo(small_cfg(demo_dir, "task=demo-mul"), tmp_path / "task", progress=False)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="esreason")
    train = parser.add_subparsers(dest="command").add_parser("train").add_subparsers(dest="method")
    register(train)
    return parser


def test_cli_registration_runs_a_config_with_overrides(demo_dir, tmp_path, capsys):
    config = Path(__file__).resolve().parents[1] / "configs" / "demo" / "grpo.yaml"
    out = tmp_path / "cli"
    args = _parser().parse_args(["train", "grpo", "--config", str(config), "--output", str(out), "--no-progress",
                                 "--set", f"model={demo_dir}", "--set", "train.max_steps=1",
                                 "--set", "train.batch_size=2", "--set", "grpo.num_generations=2",
                                 "--set", "grpo.micro_batch_size=4", "--set", "eval.every=0",
                                 "--set", "generation.max_new_tokens=40"])
    assert args.func(args) == 0
    assert "GRPO run finished: 1 updates" in capsys.readouterr().out
    assert (out / "checkpoints" / "step_1" / "model.safetensors").is_file()
    bad = _parser().parse_args(["train", "grpo", "--config", str(config), "--set", "grpo.epsilon=2",
                                "--output", str(tmp_path / "bad")])
    with pytest.raises(ConfigError, match="'grpo.epsilon'"):
        bad.func(bad)


@pytest.fixture(scope="module")
def bf16_base(demo_dir, tmp_path_factory):
    """The embedded default stored in bf16: a base model whose config.json declares bfloat16."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = tmp_path_factory.mktemp("bf16") / "base"
    AutoModelForCausalLM.from_pretrained(demo_dir, dtype=torch.bfloat16).save_pretrained(out)
    AutoTokenizer.from_pretrained(demo_dir).save_pretrained(out)
    return out


def _stored_dtypes(ckpt: Path) -> set[str]:
    from safetensors import safe_open

    with safe_open(str(ckpt / "model.safetensors"), "pt") as f:
        return {str(f.get_slice(k).get_dtype()) for k in f.keys()}


def test_checkpoints_are_saved_in_the_base_dtype_by_default(bf16_base, tmp_path):
    """fp32 training (dtype: float32), checkpoints on the bf16 base's lattice."""
    res = run_grpo(small_cfg(bf16_base, "dtype=float32", "train.max_steps=1"), tmp_path / "run", progress=False)
    ckpt = res.final_checkpoint
    assert _stored_dtypes(ckpt) == {"BF16"}
    assert json.loads((ckpt / "config.json").read_text())["dtype"] == "bfloat16"
    assert json.loads((ckpt / "grpo_state.json").read_text())["save_dtype"] == "bfloat16"
    assert hash_directory_safetensors(ckpt) != hash_directory_safetensors(bf16_base)  # it trained
    # fp32 on request; the TRL resume state keeps fp32 either way
    res32 = run_grpo(small_cfg(bf16_base, "dtype=float32", "train.max_steps=1", "checkpoint.save_dtype=float32"),
                     tmp_path / "run32", progress=False)
    assert _stored_dtypes(res32.final_checkpoint) == {"F32"}
    import torch
    from safetensors.torch import load_file

    a = load_file(str(ckpt / "model.safetensors"))
    b = load_file(str(res32.final_checkpoint / "model.safetensors"))
    assert a.keys() == b.keys()  # tied weights stored once in both
    assert all(torch.equal(a[k], b[k].to(torch.bfloat16)) for k in a)  # one round to nearest even


def test_zero_learning_rate_on_a_bf16_base_gives_back_the_base_bit_for_bit(bf16_base, tmp_path):
    res = run_grpo(small_cfg(bf16_base, "dtype=float32", "grpo.learning_rate=0", "train.max_steps=1"),
                   tmp_path / "run", progress=False)
    assert hash_directory_safetensors(res.final_checkpoint) == hash_directory_safetensors(bf16_base)


def test_save_dtype_is_validated(demo_dir):
    with pytest.raises(ConfigError, match="checkpoint.save_dtype"):
        small_cfg(demo_dir, "checkpoint.save_dtype=int8")
