"""GRPO rollouts on esreason's sampler (TRL's rollout_func): what TRL receives, seeds, engine choice, runs."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from esreason.backends.base import SamplingParams
from esreason.backends.hf import load_model
from esreason.backends.sampling import Sampler
from esreason.config import ConfigError
from esreason.grpo.config import load_grpo_config
from esreason.grpo.rollouts import SamplerRollouts, rollout_seed, uses_sampler
from esreason.tasks import get

pytestmark = pytest.mark.heavy  # two short GRPO runs


@pytest.fixture(scope="module")
def demo():
    return load_model("demo")


def test_sampler_reports_the_stop_id_that_ended_each_row(demo):
    model, tok = demo
    prompts = [tok.apply_chat_template(p.messages, tokenize=False, add_generation_prompt=True)
               for p in get("demo-add").load("test", None, 6)]
    long = Sampler(model, tok).generate(prompts, SamplingParams(max_new_tokens=64, temperature=0.0))
    assert long.stop_ids == [tok.eos_token_id] * 6  # the embedded default answers and stops well within 64
    short = Sampler(model, tok).generate(prompts, SamplingParams(max_new_tokens=3, temperature=0.0))
    assert short.stop_ids == [None] * 6 and all(len(t) == 3 for t in short.token_ids)  # cut at the budget
    assert [t[:3] for t in long.token_ids] == short.token_ids


def test_engine_choice_and_its_config_error():
    assert uses_sampler("auto", use_vllm=False, device="cpu")
    assert not uses_sampler("auto", use_vllm=False, device="cuda")
    assert uses_sampler("sampler", use_vllm=False, device="cuda")
    assert not uses_sampler("generate", use_vllm=False, device="cpu")
    assert not uses_sampler("auto", use_vllm=True, device="cpu")
    with pytest.raises(ConfigError, match="grpo.rollouts"):
        load_grpo_config(None, ["grpo.rollouts=sampler", "grpo.use_vllm=true"])
    with pytest.raises(ConfigError, match="grpo.rollouts"):
        load_grpo_config(None, ["grpo.rollouts=fast"])


def test_rollout_seeds_are_a_function_of_seed_step_and_process():
    seeds = {rollout_seed(s, step, p) for s in (0, 1) for step in range(50) for p in range(4)}
    assert len(seeds) == 2 * 50 * 4 and all(0 <= x < 2 ** 63 for x in seeds)
    assert rollout_seed(0, 7, 1) == rollout_seed(0, 7, 1)


def _fake_trainer(model, tok, step: int, max_len: int = 40):
    """The attributes of a GRPOTrainer the rollout function reads (one CPU process)."""
    def tokenize(prompts):
        return [tok.apply_chat_template(p, tokenize=True, add_generation_prompt=True, return_dict=False)
                for p in prompts], None, {}

    accelerator = SimpleNamespace(unwrap_model=lambda m: m, device=model.device, process_index=0)
    return SimpleNamespace(_tokenize_prompts=tokenize, args=SimpleNamespace(max_completion_length=max_len,
                                                                               temperature=1.0, top_p=1.0),
                           accelerator=accelerator, model_wrapped=model, processing_class=tok,
                           state=SimpleNamespace(global_step=step))


def test_rollouts_give_trl_its_prompt_ids_and_completions_with_the_eos_kept(demo):
    model, tok = demo
    problems = get("demo-add").load("train", None, 4)
    prompts = [[dict(m) for m in p.messages] for p in problems for _ in range(4)]  # G = 4 copies, as TRL's sampler
    rollouts = SamplerRollouts(train_seed=0, batch_size=64)
    out = rollouts(prompts, _fake_trainer(model, tok, step=0))
    assert set(out) == {"prompt_ids", "completion_ids", "logprobs"} and out["logprobs"] is None
    assert out["prompt_ids"] == _fake_trainer(model, tok, 0)._tokenize_prompts(prompts)[0]
    assert len(out["completion_ids"]) == 16
    eos = tok.eos_token_id
    for c in out["completion_ids"]:
        assert 1 <= len(c) <= 40
        assert eos not in c[:-1]  # at most one EOS, at the end, as generate's completion up to the first EOS
    ended = [c[-1] == eos for c in out["completion_ids"]]
    assert any(ended)
    again = rollouts(prompts, _fake_trainer(model, tok, step=0))
    assert again["completion_ids"] == out["completion_ids"]  # a function of (seed, step, process)
    later = rollouts(prompts, _fake_trainer(model, tok, step=1))
    assert later["completion_ids"] != out["completion_ids"]
    # the four copies of a prompt are four samples, not one repeated
    assert len({tuple(c) for c in out["completion_ids"][:4]}) > 1


def _cfg(rollouts: str, *extra: str):
    from esreason.embedded import demo_model_dir

    return load_grpo_config(None, [
        f"model={demo_model_dir()}", "task=demo-add", "train.limit=8", "train.batch_size=4", "train.max_steps=2",
        "grpo.num_generations=4", "grpo.micro_batch_size=16", "grpo.learning_rate=1e-4",
        "generation.max_new_tokens=40", "checkpoint.every=2", "eval.every=0", f"grpo.rollouts={rollouts}", *extra])


@pytest.mark.parametrize("engine,recorded", [("sampler", "esreason-sampler"), ("generate", "hf-generate")])
def test_a_run_trains_on_either_engine_and_records_which(engine, recorded, tmp_path: Path):
    from esreason.grpo.run import run_grpo

    result = run_grpo(_cfg(engine), tmp_path / "run", progress=False)
    assert result.steps == 2 and result.final_checkpoint is not None
    backend = json.loads((tmp_path / "run" / "backend.json").read_text())
    assert [m["rollouts"] for m in backend["members"]] == [recorded]
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    trained = [r for r in rows if "reward/mean" in r]
    assert len(trained) == 2 and all(0 < r["completions/mean_length"] <= 40 for r in trained)
    assert trained[-1]["kl"] > 0  # the policy moved: TRL trained on these rollouts
