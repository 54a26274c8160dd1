"""Config loading: YAML + --set overrides, strict validation with errors naming the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from esreason.config import ConfigError, RunConfig, load_config, parse_overrides, to_dict

ROOT = Path(__file__).resolve().parent.parent


def test_defaults_follow_the_paper_easy_setting():
    cfg = RunConfig()
    assert (cfg.es.population_size, cfg.es.sigma, cfg.es.alpha) == (32, 1.5e-3, 2.5e-4)
    assert cfg.es.shaping == "zscore" and cfg.es.estimator == "one_point" and cfg.es.restore == "exact"
    assert (cfg.train.batch_size, cfg.train.epochs, cfg.generation.temperature) == (64, 2, 0.0)


def test_overrides_with_dotted_keys_and_yaml_values(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("model: demo\nes:\n  sigma: 0.01\n")
    cfg = load_config(p, ["es.sigma=2e-3", "train.max_steps=5", "es.shaping=rank", "eval.ks=1,4",
                          "eval.samples=4"])
    assert cfg.es.sigma == 2e-3 and cfg.train.max_steps == 5 and cfg.es.shaping == "rank"
    assert cfg.eval.ks == (1, 4)
    assert parse_overrides(["a.b=1", "a.c=x"]) == {"a": {"b": 1, "c": "x"}}
    assert isinstance(to_dict(cfg)["eval"]["ks"], list)


@pytest.mark.parametrize("overrides, needle", [
    (["es.sigmaa=1"], "unknown config key 'es.sigmaa'"),
    (["bogus=1"], "unknown config key 'bogus'"),
    (["es.sigma=abc"], "'es.sigma': expected a number"),
    (["es.sigma=0"], "'es.sigma': must be > 0"),
    (["es.sigma=-1"], "'es.sigma': must be > 0"),
    (["es.population_size=1"], "'es.population_size': must be >= 2"),
    (["es.population_size=2.5"], "'es.population_size': expected an integer"),
    (["es.shaping=softmax"], "allowed values: 'zscore', 'none', 'rank'"),
    (["es.estimator=two_point", "es.population_size=7"], "must be even"),
    (["train.batch_size=0"], "'train.batch_size'"),
    (["generation.top_p=1.5"], "'generation.top_p'"),
    (["eval.ks=1,64", "eval.samples=8"], "'eval.ks'"),
    (["es=3"], "'es': expected a mapping"),
    (["noequals"], "--set expects key=value"),
    (["backend.type=gpu"], "allowed values: 'hf', 'batched', 'ray', 'vllm'"),
    (["backend.engines=2"], "more than one engine needs backend.type=ray"),
    (["backend.type=batched", "backend.engines=4"], "more than one engine needs backend.type=ray"),
    (["backend.type=ray", "backend.engines=0"], "'backend.engines': must be >= 1"),
    (["backend.ray_address=10.0.0.1:6379"], "'backend.ray_address': only used with backend.type=ray"),
    (["backend.type=batched", "backend.population_batch=-1"], "'backend.population_batch'"),
    (["backend.type=ray", "backend.check_every=-1"], "'backend.check_every'"),
    (["es.perturbation=sparse"], "'es.perturbation'"),
    (["es.perturbation=lowrank", "es.rank=0"], "'es.rank': must be >= 1"),
    (["coverage.every=1", "es.restore=subtract"], "needs es.restore=exact"),
])
def test_bad_config_errors_name_the_key(overrides, needle):
    with pytest.raises(ConfigError) as err:
        load_config(None, overrides)
    assert needle in str(err.value)


def test_missing_and_malformed_files(tmp_path):
    with pytest.raises(ConfigError, match="config file not found"):
        load_config(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("es: [unclosed\n")
    with pytest.raises(ConfigError, match="invalid YAML"):
        load_config(bad)


@pytest.mark.parametrize("path", sorted(p for p in (ROOT / "configs").glob("**/es*.yaml") if "sweeps" not in p.parts),
                         ids=lambda p: p.name)  # sweep configs carry a `sweep:` section: tests/test_sweep.py
def test_shipped_es_configs_validate(path):
    cfg = load_config(path)
    assert cfg.es.population_size >= 2


def test_paper_configs_carry_the_paper_settings():
    easy = load_config(ROOT / "configs/easy/es-qwen2.5-1.5b.yaml")
    hard = load_config(ROOT / "configs/hard/es-deepseek-r1-distill-qwen-1.5b.yaml")
    for cfg in (easy, hard):
        assert (cfg.es.population_size, cfg.es.sigma, cfg.es.alpha, cfg.train.batch_size) == (32, 1.5e-3, 2.5e-4, 64)
    assert (easy.train.epochs, easy.generation.temperature, easy.generation.max_new_tokens) == (2, 0.0, 2048)
    assert (hard.train.epochs, hard.generation.temperature, hard.generation.max_new_tokens) == (1, 0.6, 8192)
    assert easy.task == "gsm8k" and hard.task == "deepscaler"


def test_es_and_grpo_configs_share_the_run_level_base():
    import dataclasses

    from esreason.config import RunBase
    from esreason.grpo.config import GRPORunConfig

    base = [(f.name, f.type, f.default) for f in dataclasses.fields(RunBase)]
    assert [b[0] for b in base] == ["model", "task", "data_path", "tasks_dir", "data_dir", "dtype", "device"]
    for cls in (RunConfig, GRPORunConfig):
        assert issubclass(cls, RunBase)
        fields = {f.name: f for f in dataclasses.fields(cls)}
        assert [(f.name, f.type, f.default) for f in dataclasses.fields(cls)][:len(base)] == base
        # the sections both configs have use ES's section types (GRPO's extend them)
        assert fields["train"].type == "TrainConfig" and fields["eval"].type == "EvalConfig"
    from esreason.config import CheckpointConfig, GenerationConfig
    from esreason.grpo.config import GRPOCheckpointConfig, GRPOGenerationConfig

    assert issubclass(GRPOGenerationConfig, GenerationConfig) and issubclass(GRPOCheckpointConfig, CheckpointConfig)
    # the top-level key order (config.yaml, the "known keys" error) keeps the method's section first
    with pytest.raises(ConfigError, match="known keys under top level: model, task, data_path, tasks_dir, data_dir, dtype, "
                                          "device, es, train, generation, checkpoint, eval, backend, coverage"):
        load_config(None, ["bogus=1"])


@pytest.mark.parametrize("override, needle", [
    ("train.max_steps=0", "config key 'train.max_steps': must be >= 1 (got 0)"),
    ("checkpoint.keep_last=0", "config key 'checkpoint.keep_last': must be >= 1 (got 0)"),
    ("eval.ks=1,64", "config key 'eval.ks': each K must be in [1, eval.samples=8] (got [1, 64])"),
    ("generation.top_p=0", "config key 'generation.top_p': must be in (0, 1] (got 0.0)"),
    ("model=''", "config key 'model': must not be empty"),
])
def test_shared_validator_gives_es_and_grpo_the_same_error_naming_the_dotted_key(override, needle):
    from types import SimpleNamespace

    from esreason.config import EvalConfig, validate_run
    from esreason.grpo.config import load_grpo_config

    for loader in (load_config, load_grpo_config):
        with pytest.raises(ConfigError) as err:
            loader(None, [override])
        assert str(err.value) == needle
    # validate_run on its own (any object with the run-level keys)
    cfg = SimpleNamespace(model="demo", train=RunConfig().train, generation=RunConfig().generation,
                          checkpoint=RunConfig().checkpoint, eval=EvalConfig(samples=2, ks=(1, 4)))
    with pytest.raises(ConfigError, match=r"^config key 'eval\.ks': each K must be in \[1, eval\.samples=2\]"):
        validate_run(cfg)


def test_docs_name_the_final_checkpoint_of_the_easy_configs():
    """docs/analysis.md and docs/evaluation.md name the Easy runs' final checkpoints
    (runs/easy-es/checkpoints/step_T, runs/easy-grpo/...) with the configs' T."""
    import re

    from esreason.grpo.config import load_grpo_config

    t_es = load_config(ROOT / "configs/easy/es-qwen2.5-1.5b.yaml").train.max_steps
    t_grpo = load_grpo_config(ROOT / "configs/easy/grpo-qwen2.5-1.5b.yaml").train.max_steps
    assert t_es == t_grpo
    for page in ("docs/analysis.md", "docs/evaluation.md"):
        named = {int(n) for n in re.findall(r"easy-(?:es|grpo)/checkpoints/step_(\d+)", (ROOT / page).read_text())}
        assert named == {t_es}, page
