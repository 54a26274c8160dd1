"""``backend.engines_per_gpu: auto``: the most ES engines per GPU the traced memory allows, chosen in the
plan per GPU type and again at run time, where the chosen K must reach the pool."""

from __future__ import annotations

import pytest

from esreason.config import load_config
from esreason.experiments import memplan_engines as auto
from esreason.experiments.memplan import GPU_MEMORY_GIB

H100, A100_40 = GPU_MEMORY_GIB["h100"][1], GPU_MEMORY_GIB["a100-40"][1]
EASY = "configs/easy/es-qwen2.5-1.5b.yaml"


def _easy(*sets: str):
    return load_config(EASY, ["backend.engines_per_gpu=auto", "backend.update=replicated", *sets])


def test_auto_picks_the_most_engines_that_fit_one_member_each():
    # 32 members on 8 GPUs: at most 4 engines per GPU; an H100 holds 4 (masters on the GPU included) but
    # with 6 % to spare, under the 10 % margin every shipped config keeps, so memory allows 3; and 3 run the
    # 32 members in 2 rounds as 2 do (a third engine would idle in the second round): auto takes 2
    k, why = auto.choose(_easy(), H100)
    assert (k, why) == (2, "memory: 4 engines would leave 6 % of GPU 0: ES engines + trainer free (at least 10 %); 2 per GPU run the 32 members in the same 2 rounds as 3")
    assert auto.misfit(_easy(), 4, H100) == why.split("; ")[0].removeprefix("memory: ") and auto.MARGIN == 0.10
    assert auto.fits(_easy(), 3, H100)
    assert auto.choose(_easy("es.population_size=24"), H100) == (3, "one member per engine (24 members on 8 GPUs)")
    # an A100 40GB: two engines leave too little of GPU 0
    k, why = auto.choose(_easy(), A100_40)
    assert k == 1 and why.startswith("memory: 2 engines would leave")
    # the member's call is the budget, not one sequence: 256 rows of KV cache leave room for 2 on an H100,
    # where the memory plan's one-sequence check alone would let 3 start
    k, why = auto.choose(_easy("train.batch_size=256"), H100)
    assert k == 2 and why == "memory: 3 engines' shares would not hold a member's call of 256 rows"
    assert auto.fits(_easy(), 3, H100) and not auto.fits(_easy("train.batch_size=256"), 3, H100)
    # 16 members on 8 GPUs: two engines per GPU fit, and a third would idle
    assert auto.choose(_easy("es.population_size=16"), H100) == (2, "one member per engine (16 members on 8 GPUs)")
    # fewer members than engines would idle: 8 members on 8 GPUs is one engine each
    assert auto.choose(_easy("es.population_size=8"), H100)[0] == 1
    assert auto.choose(_easy(), None) == (1, "no GPU to size against")


def test_auto_is_one_where_engines_cannot_share_a_gpu():
    k, why = auto.choose(load_config(EASY, ["backend.engines_per_gpu=auto", "backend.update=sharded"]), H100)
    assert k == 1 and "NCCL" in why and "memory allows 2 with backend.update: replicated" in why
    assert auto.choose(_easy("backend.type=vllm", "backend.engines=1"), H100)[0] == 1
    assert auto.choose(_easy("backend.tensor_parallel_size=2"), H100)[0] == 1
    cpu = load_config(None, ["model=demo", "backend.type=ray", "backend.engines=2", "backend.engines_per_gpu=auto"])
    assert auto.choose(cpu, H100) == (1, "only vLLM engines in a Ray pool share GPUs")  # HF engines on the CPU
    seven = load_config("configs/easy/es-qwen2.5-7b.yaml", ["backend.engines_per_gpu=auto", "backend.update=replicated"])
    assert auto.choose(seven, H100)[0] == 1  # 14 GiB of weights: half a reservation cannot hold a member's call


def test_resolve_counts_gpus_and_starts_k_engines_on_each():
    cfg = auto.resolve(_easy(), H100)
    assert (cfg.backend.engines_per_gpu, cfg.backend.engines) == (2, 16)
    fixed = load_config(EASY, ["backend.engines_per_gpu=1"])
    assert auto.resolve(fixed, H100) == fixed  # a number stays as configured
    assert auto.engines_per_gpu(_easy("backend.engines_per_gpu=2", "backend.engines=16"), H100) == 2


def test_plan_resolves_auto_for_each_gpu_type():
    from esreason.experiments.plan import build_plan
    from esreason.experiments.spec import load_spec

    def es(sets: list[str], gpu: str = "h100") -> tuple[dict, dict]:
        plan = build_plan(load_spec("configs/experiments/easy.yaml", ["methods=[es]", *sets]), 8, gpu)
        return next(s for s in plan["stages"] if s["name"] == "train/es"), plan

    stage, plan = es(["configs.es.backend.engines_per_gpu=auto", "configs.es.backend.update=replicated"])
    assert "16 vLLM engines" in stage["runs_on"] and "2 per GPU on 8 GPUs" in stage["runs_on"]
    assert stage["limit"]["engines_per_gpu"] == 2
    assert "ES stages: backend.engines_per_gpu: auto -> 2 on NVIDIA H100 80GB (memory: 4 engines would leave 6 % of GPU 0: ES engines + trainer free (at least 10 %); 2 per GPU run the 32 members in the same 2 rounds as 3)" in plan["notes"]
    fixed, _ = es(["configs.es.backend.engines_per_gpu=2", "configs.es.backend.engines=16",
                   "configs.es.backend.update=replicated"])
    assert stage["terms_s"] == fixed["terms_s"]  # auto is the layout it chose, nothing else
    # the A100 40GB verdict is that of its own choice (1 per GPU), not of the H100's 2
    two, _ = es(["configs.es.backend.engines_per_gpu=1", "configs.es.backend.engines=8",
                 "configs.es.backend.update=replicated"], "a100")
    assert stage["memory"]["verdicts"]["a100-40"] == two["memory"]["verdicts"]["a100-40"]
    assert stage["memory"]["verdicts"]["a100-40"]["fits"]


def test_auto_reaches_the_pool_at_run_time(tmp_path, monkeypatch, capsys):
    """``train es`` resolves auto against the GPU it sizes with (here, without a GPU, the one
    ``experiment run --assume-gpu`` names) and the Ray pool is built with K engines per GPU: the
    pool's engine count, each engine's GPU share and each vLLM engine's memory reservation."""
    from esreason.backends import ray_pool
    from esreason.backends.vllm import VLLMEngineOptions
    from esreason.es_loop.run import run_es

    built = {}

    class Stop(Exception):
        pass

    def capture(kind, options, state, engines, **kw):
        built.update(kind=kind, options=options, engines=engines, gpus=kw.get("gpus_if_declared"))
        raise Stop

    monkeypatch.setattr(ray_pool, "RayEnginePool", capture)
    monkeypatch.setenv(auto.ASSUME_GPU_ENV, "h100")
    cfg = load_config(None, ["model=demo", "backend.type=ray", "backend.engine=vllm", "backend.engines=2",
                             "backend.engines_per_gpu=auto", "es.population_size=8", "train.batch_size=2",
                             "train.max_steps=1", "generation.max_new_tokens=4"])
    with pytest.raises(Stop):
        run_es(cfg, tmp_path / "run", progress=False, resolve_engines=auto.resolve_at_run)  # as `train es` does
    assert built["kind"] == "vllm" and built["engines"] == 8  # 2 GPUs x 4 engines: one member each
    assert built["gpus"] == pytest.approx(0.25)
    assert built["options"].gpu_memory_utilization == pytest.approx(VLLMEngineOptions.gpu_memory_utilization / 4)
    assert "backend.engines_per_gpu: auto -> 4 (one member per engine (8 members on 2 GPUs)); 8 engines" \
        in capsys.readouterr().out
    assert "auto" in (tmp_path / "run" / "config.yaml").read_text()  # the run's config keeps what was asked


def test_run_es_refuses_auto_without_a_resolver_before_writing(tmp_path):
    """The loop sits below the memory plan: ``auto`` arrives resolved through ``resolve_engines`` (the CLI,
    ESTrainer, experiment and sweep runs pass it); without it the run is refused and nothing is written."""
    from esreason.errors import UserError
    from esreason.es_loop.run import run_es

    cfg = load_config(None, ["model=demo", "backend.type=ray", "backend.engine=vllm", "backend.engines_per_gpu=auto",
                             "train.max_steps=1"])
    with pytest.raises(UserError, match="engines_per_gpu: auto is resolved"):
        run_es(cfg, tmp_path / "run", progress=False)
    assert not (tmp_path / "run").exists()


def test_entry_points_pass_the_resolver():
    """Every entry point that starts an ES run hands the loop the memory plan's resolver."""
    import inspect

    from esreason import cli
    from esreason.api import trainer
    from esreason.experiments import es_stage, sweep

    for fn in (cli._cmd_train_es, trainer.ESTrainer.train, es_stage.train_es, sweep.train_point):
        assert "resolve_engines=resolve_at_run" in inspect.getsource(fn), fn


def test_assume_gpu_env_is_checked(monkeypatch):
    from esreason.errors import UserError

    monkeypatch.setattr("esreason.experiments.memplan.local_gpu", lambda: None)
    assert auto.run_gpu_gib({}) is None
    assert auto.run_gpu_gib({auto.ASSUME_GPU_ENV: "a100-40"}) == A100_40
    with pytest.raises(UserError, match=r"ESREASON_ASSUME_GPU='b200': expected one of h100"):
        auto.run_gpu_gib({auto.ASSUME_GPU_ENV: "b200"})


def test_experiment_runs_memory_check_and_its_stages_size_auto_against_the_assumed_gpu(monkeypatch):
    """``experiment run --assume-gpu``: the memory check prices the K that GPU gets, and the ES stages,
    which resolve auto in their own process, are told the GPU through the environment."""
    import argparse
    import os

    from esreason.experiments import memplan
    from esreason.experiments.runner import _memory_check
    from esreason.experiments.spec import load_spec

    monkeypatch.delenv(auto.ASSUME_GPU_ENV, raising=False)
    spec = load_spec("configs/experiments/easy.yaml", ["methods=[es]"])
    checked = []
    monkeypatch.setattr(memplan, "check_fits", lambda s, gpus, name, gib: checked.append((s.es.backend, gib)))
    _memory_check(spec, argparse.Namespace(force=False, assume_gpu="a100-40", assume_gpus=8))
    assert os.environ[auto.ASSUME_GPU_ENV] == "a100-40"
    (backend, gib), = checked
    assert gib == A100_40 and (backend.engines_per_gpu, backend.engines) == (1, 8)  # not the H100's 2
